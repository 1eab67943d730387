"""Server lifecycle state shared by the routes and the launcher."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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

    def count(self, status: int) -> None:
        self.responses[status] = self.responses.get(status, 0) + 1
