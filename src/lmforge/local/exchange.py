"""One request on the local ``sagemaker-runtime``, what both of its invocation paths share (SageMaker's
own in :mod:`lmforge.local.runtime`, the OpenAI-compatible one in :mod:`lmforge.local.openai_path`):
reading the body, finding the container, calling it, relaying its answer as it comes, and refusing in
SageMaker's shape.

Only the request headers SageMaker forwards reach the container.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lmforge.local.provisioner import Provisioner, Route, RouteError

log = logging.getLogger("lmforge.local.runtime")

MAX_BODY = 6 * 1024 * 1024  # 6 MiB, the botocore model's limit for Body (not enforced client-side)
CHUNK = 64 * 1024
"""The most bytes read from a container at a time."""
_REGION_RE = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/")

# Request headers SageMaker passes to the container (everything else is dropped).
_FORWARDED = (
    "Content-Type",
    "X-Amzn-SageMaker-Custom-Attributes",
    "X-Amzn-SageMaker-Inference-Id",
    "X-Amzn-SageMaker-Session-Id",
    "X-Amzn-SageMaker-Target-Model",
    "X-Amzn-SageMaker-Adapter-Identifier",
    "X-Amzn-SageMaker-Adapter-Alias",
    "X-Amzn-SageMaker-Inference-Component",
)


class Reject(Exception):
    """An error answer in SageMaker's shape: status, ``x-amzn-ErrorType`` and message (+ fields)."""

    def __init__(self, status: int, error_type: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.error_type, self.message, self.extra = status, error_type, message, extra


@dataclass(frozen=True)
class StreamBreak:
    """Why a container's streamed body ended before its end."""

    timed_out: bool
    """It ran past its time limit (or a read timed out)."""
    detail: str
    """The read's error, when it was not a time-out."""


class Server(ThreadingHTTPServer):
    """The HTTP server exchanges run in: the provisioner that routes them and their time limits."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        exchange: type[Exchange],
        provisioner: Provisioner,
        *,
        invocation_timeout_s: float = 60.0,
        stream_timeout_s: float = 600.0,
    ) -> None:
        super().__init__(address, exchange)
        self.provisioner = provisioner
        self.invocation_timeout_s = invocation_timeout_s
        self.stream_timeout_s = stream_timeout_s

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="sagemaker-runtime", daemon=True)
        thread.start()
        return thread


class Exchange(BaseHTTPRequestHandler):
    """One client connection's requests: the steps the invocation paths are made of."""

    # one PayloadPart per token: without TCP_NODELAY, Nagle's algorithm holds small frames back until
    # the client's (delayed) ACK, and tokens arrive in bursts on reused connections
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"
    server: Server
    model_started: float | None = None
    """When the current invocation's request to its container was sent (for ``ModelLatency``)."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # ----- request side
    def read_body(self) -> bytes:
        """The request's body (at most :data:`MAX_BODY`, sent with a ``Content-Length``)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise Reject(411, "ValidationError", "send the body with a Content-Length")
        raw = self.headers.get("Content-Length") or "0"
        if not raw.isdigit():
            self.close_connection = True
            raise Reject(400, "ValidationError", f"Content-Length {raw!r} is not a byte count")
        length = int(raw)
        if length > MAX_BODY:
            self.close_connection = True  # the body is not read; the connection cannot be reused
            raise Reject(
                413,
                "ValidationError",
                f"1 validation error detected: Value at 'body' failed to satisfy constraint: Member must "
                f"have length less than or equal to {MAX_BODY} (got {length} bytes)",
            )
        return self.rfile.read(length) if length else b""

    def route(self, name: str, region: str | None = None, component: str | None = None) -> Route:
        """The container for an invocation (region: from the SigV4 credential unless given); the caller
        tells the provisioner when it is :meth:`~lmforge.local.provisioner.Provisioner.finished`."""
        if region is None:
            match = _REGION_RE.search(self.headers.get("Authorization", ""))
            region = match.group(1) if match else None
        try:
            return self.server.provisioner.route(
                region,
                name,
                self.headers.get("X-Amzn-SageMaker-Target-Variant"),
                component or self.headers.get("X-Amzn-SageMaker-Inference-Component"),
                self.headers.get("X-Amzn-SageMaker-Session-Id"),
            )
        except RouteError as exc:
            raise Reject(400, "ValidationError", str(exc)) from None

    def container_request(
        self,
        route: Route,
        body: bytes,
        accept: str | None,
        timeout: float,
        path: str = "/invocations",
        check: bool = True,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """POST ``body`` to the container's ``path``; an error answer is a ModelError unless not
        ``check`` (the caller reads it)."""
        headers = {h: v for h in _FORWARDED if (v := self.headers.get(h)) is not None}
        headers.setdefault("Content-Type", "application/octet-stream")
        if route.adapter is not None:  # an adapter inference component: its base's container serves it
            headers["X-Amzn-SageMaker-Adapter-Identifier"] = route.adapter
        if accept:
            headers["Accept"] = accept
        conn = http.client.HTTPConnection("127.0.0.1", route.port, timeout=timeout)
        self.model_started = time.perf_counter()
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            if isinstance(exc, TimeoutError | socket.timeout):
                raise model_error(
                    route,
                    0,
                    "",
                    f"Your invocation timed out while waiting for a response from container {route.variant}.",
                ) from None
            raise model_error(route, 0, "", f"could not reach the container: {exc}") from None
        if check and not 200 <= response.status < 300:
            text = response.read().decode("utf-8", errors="replace")
            conn.close()
            raise model_error(route, response.status, text)
        return conn, response

    def invoked(self, route: Route, started: float, failure: Reject | None) -> None:
        """Count one invocation that was routed to a container in SageMaker's metrics: its outcome
        (``failure``: how it was refused), its ``ModelLatency`` (from the request to the container to
        the end of its answer) and ``OverheadLatency`` (the rest, since ``started``)."""
        end = time.perf_counter()
        model_started = getattr(self, "model_started", None) or end
        status = None
        if failure is not None:
            status = int(failure.extra.get("OriginalStatusCode", failure.status) or 0)
            if failure.error_type != "ModelError" and status < 400:
                status = 500
        self.server.provisioner.metrics.invocation(
            route.account,
            route.region,
            route.endpoint_name,
            route.variant,
            route.component,
            model_status=status,
            model_us=max(0.0, end - model_started) * 1e6,
            overhead_us=max(0.0, model_started - started) * 1e6,
        )
        self.model_started = None

    # ----- responses
    def relay(
        self,
        conn: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        deadline: float,
        frame: Callable[[bytes], bytes],
        broke: Callable[[StreamBreak], bytes | None],
    ) -> None:
        """Copy the container's body to the client (whose chunked body has begun), each chunk as it
        comes, through ``frame``, until ``deadline``; a body that breaks or runs past it ends with the
        chunk ``broke`` gives (if any). Then the chunked body's end."""
        ended: StreamBreak | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ended = StreamBreak(timed_out=True, detail="")
                break
            if conn.sock is not None:
                conn.sock.settimeout(remaining)
            try:
                chunk = response.read1(CHUNK)
            except (OSError, http.client.HTTPException) as exc:
                ended = StreamBreak(timed_out=isinstance(exc, TimeoutError | socket.timeout), detail=str(exc))
                break
            if not chunk:
                break
            self.send_chunk(frame(chunk))
        if ended is not None and (last := broke(ended)) is not None:
            self.send_chunk(last)
        self.wfile.write(b"0\r\n\r\n")

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def common_headers(self, route: Route, request_id: str, response: http.client.HTTPResponse) -> None:
        """The headers every answer from a container carries (the variant, the request id, the custom
        attributes, the sticky session opened or closed)."""
        self.send_header("x-Amzn-Invoked-Production-Variant", route.variant)
        self.send_header("x-amzn-RequestId", request_id)
        custom = response.getheader("X-Amzn-SageMaker-Custom-Attributes")
        if custom:
            self.send_header("X-Amzn-SageMaker-Custom-Attributes", custom)
        # sticky sessions: the container names a new session (djl-serving: in X-Amzn-SageMaker-Session-Id,
        # AWS's toolkit: in ...-New-Session-Id) and a closed one; the client reads NewSessionId and
        # ClosedSessionId
        opened = response.getheader("X-Amzn-SageMaker-New-Session-Id") or response.getheader(
            "X-Amzn-SageMaker-Session-Id"
        )
        if opened:
            self.send_header("X-Amzn-SageMaker-New-Session-Id", opened)
            # the session's requests go to the instance that opened it
            self.server.provisioner.session_opened(route, opened.split(";")[0].strip())
        closed = response.getheader("X-Amzn-SageMaker-Closed-Session-Id")
        if closed:
            self.send_header("X-Amzn-SageMaker-Closed-Session-Id", closed)
            self.server.provisioner.session_closed(route, closed.strip())

    def refuse(self, rej: Reject, request_id: str, body: bytes | None = None) -> None:
        """``rej`` in SageMaker's JSON (``body``: another shape of the same error)."""
        if body is None:
            body = json.dumps({"message": rej.message, **rej.extra}).encode()
        try:
            self.send_response(rej.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("x-amzn-ErrorType", rej.error_type)
            self.send_header("x-amzn-RequestId", request_id)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def model_error(route: Route, status: int, original: str, detail: str | None = None) -> Reject:
    """SageMaker's ModelError (424) for a container that answered an error (``status``, ``original``
    body) or could not be reached (status 0, ``detail``)."""
    kind = "client" if 400 <= status < 500 else "server"
    log_group = f"/aws/sagemaker/Endpoints/{route.endpoint_name}"
    log_arn = f"arn:aws:logs:{route.region}:{route.account}:log-group:{log_group}"
    message = detail or f'Received {kind} error ({status}) from primary with message "{original}".'
    message += f" See the container log of {route.endpoint_name}/{route.variant} for more information."
    return Reject(
        424,
        "ModelError",
        message,
        OriginalStatusCode=status,
        OriginalMessage=original,
        LogStreamArn=log_arn,
    )
