"""SageMaker stateful ("sticky") sessions, as the container side of the contract defines them.

With ``option.enable_stateful_sessions=true`` (LMI's ``OPTION_ENABLE_STATEFUL_SESSIONS``):

* a body ``{"requestType": "NEW_SESSION"}`` opens a session: 200, ``Session <id> created``, and the
  id with its expiry in ``X-Amzn-SageMaker-Session-Id: <id>; Expires=<UTC time>`` (djl-serving's
  name) and ``X-Amzn-SageMaker-New-Session-Id`` (the name AWS's container toolkit and the
  ``InvokeEndpoint`` response use);
* a request with ``X-Amzn-SageMaker-Session-Id: <id>`` belongs to that session: an unknown or
  expired id is a 400. SageMaker routes a session's requests to one instance, where the engine's
  prefix cache keeps the conversation's KV blocks warm;
* ``{"requestType": "CLOSE"}`` with the header closes it: 200, ``X-Amzn-SageMaker-Closed-Session-Id``.

Sessions live in memory for ``option.sessions_expiration`` seconds (default 1200, as LMI's).
Without the option, a session request is a 400 that says how to turn sessions on.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lmforge.errors import BadRequestError

SESSION_HEADER = "x-amzn-sagemaker-session-id"
NEW_SESSION = "NEW_SESSION"
CLOSE = "CLOSE"
MAX_SESSIONS = 100_000


@dataclass
class SessionReply:
    """The answer to a session request (no model call)."""

    text: str
    headers: dict[str, str]


@dataclass
class SessionStore:
    expiration_s: int = 1200
    _expires: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        self._sweep()
        return len(self._expires)

    def _sweep(self) -> None:
        now = time.time()
        for sid in [s for s, t in self._expires.items() if t <= now]:
            del self._expires[sid]

    def check(self, session_id: str) -> None:
        """A request in a session: the session must exist and be open."""
        expires = self._expires.get(session_id)
        if expires is None or expires <= time.time():
            self._expires.pop(session_id, None)
            raise BadRequestError(
                f"session {session_id!r} does not exist or has expired; open one with "
                '{"requestType": "NEW_SESSION"}',
                param="X-Amzn-SageMaker-Session-Id",
            )

    def open(self) -> SessionReply:
        self._sweep()
        if len(self._expires) >= MAX_SESSIONS:
            raise BadRequestError(
                f'too many open sessions ({MAX_SESSIONS}); close some with {{"requestType": "CLOSE"}}',
                param="requestType",
            )
        sid = str(uuid.uuid4())
        expires = time.time() + self.expiration_s
        self._expires[sid] = expires
        stamp = datetime.fromtimestamp(expires, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        value = f"{sid}; Expires={stamp}"
        return SessionReply(
            f"Session {sid} created",
            {"X-Amzn-SageMaker-Session-Id": value, "X-Amzn-SageMaker-New-Session-Id": value},
        )

    def close(self, session_id: str | None) -> SessionReply:
        if not session_id:
            raise BadRequestError(
                "closing a session needs its id in the X-Amzn-SageMaker-Session-Id header "
                "(boto3: SessionId=...)",
                param="X-Amzn-SageMaker-Session-Id",
            )
        self.check(session_id)
        del self._expires[session_id]
        closed = {"X-Amzn-SageMaker-Closed-Session-Id": session_id}
        return SessionReply(f"Session {session_id} closed", closed)


def session_request(body: bytes) -> str | None:
    """The ``requestType`` of a session request body (None for any other body). A body naming
    ``requestType`` must be exactly a session request."""
    if b"requestType" not in body:  # the common case costs one substring search
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or "requestType" not in data:
        return None
    kind = data["requestType"]
    if kind not in (NEW_SESSION, CLOSE) or len(data) != 1:
        raise BadRequestError(
            'a session request is exactly {"requestType": "NEW_SESSION"} or {"requestType": "CLOSE"}',
            param="requestType",
        )
    return str(kind)


def answer(store: SessionStore | None, body: bytes, headers: dict[str, str]) -> SessionReply | None:
    """The reply to a session request, None for a model request (checked against its session)."""
    kind = session_request(body)
    session_id = headers.get(SESSION_HEADER)
    if store is None:
        if kind is not None:
            raise BadRequestError(
                "stateful sessions are not enabled on this endpoint: set "
                "option.enable_stateful_sessions=true (OPTION_ENABLE_STATEFUL_SESSIONS)",
                param="requestType",
            )
        return None  # without sessions the header means nothing, as on SageMaker's own containers
    if kind == NEW_SESSION:
        return store.open()
    if kind == CLOSE:
        return store.close(session_id)
    if session_id and session_id != NEW_SESSION:
        store.check(session_id)
    return None
