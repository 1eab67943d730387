"""Server lifecycle state shared by the routes and the launcher."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.serving.sessions import SessionStore


class Phase(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DRAINING = "draining"


@dataclass
class ServerState:
    phase: Phase = Phase.LOADING
    detail: str = "the model is loading"
    in_flight: int = 0
    max_in_flight: int = 1
    max_request_size: int = 6 * 2**20
    drain_deadline: float | None = None
    """``time.monotonic()`` at which a draining server ends the requests still in flight (set on SIGTERM)."""
    responses: dict[int, int] = field(default_factory=dict)
    sessions: SessionStore | None = None
    """Open stateful sessions (``option.enable_stateful_sessions``), None when sessions are off."""

    @classmethod
    def for_config(cls, config: ServingConfig) -> ServerState:
        """The state of a server with ``config``: admission limits, body size, sessions."""
        from lmforge.serving.sessions import SessionStore

        return cls(
            max_in_flight=config.max_rolling_batch_size + config.job_queue_size,
            max_request_size=config.max_request_size,
            sessions=SessionStore(config.sessions_expiration) if config.enable_stateful_sessions else None,
        )

    def count(self, status: int) -> None:
        self.responses[status] = self.responses.get(status, 0) + 1
