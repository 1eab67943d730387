"""The local ``sagemaker-runtime``: the real wire protocol in front of each endpoint's container.

Routes (path-style, what botocore sends when given ``endpoint_url``):

- ``POST /endpoints/{name}/invocations``: the container's ``/invocations`` answer, with
  ``Content-Type`` and ``x-Amzn-Invoked-Production-Variant``;
- ``POST /endpoints/{name}/invocations-response-stream``: ``200`` with
  ``Content-Type: application/vnd.amazon.eventstream`` and ``X-Amzn-SageMaker-Content-Type``, then
  one CRC-checked ``PayloadPart`` frame per chunk the container flushes, sent with chunked transfer
  encoding as it arrives (without chunking, botocore would buffer the whole body).

- ``POST /endpoints/{name}[/inference-components/{component}]/openai/v1/chat/completions``: the
  OpenAI-compatible path, for OpenAI clients with a bearer token (:mod:`lmforge.local.openai_path`).

Errors take SageMaker's shapes, which boto3 maps to its exception classes: ``ValidationError`` (400)
for an unknown or not-yet-InService endpoint, a bad name or a body over 6 MiB; ``ModelError`` (424,
with ``OriginalStatusCode``, ``OriginalMessage`` and ``LogStreamArn``) when the container answers an
error or cannot be reached; ``ModelStreamError`` frames when the stream breaks or runs past its limit.
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
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from lmforge.aws.eventstream import model_stream_error, payload_part
from lmforge.aws.names import name_problem
from lmforge.local import openai_path
from lmforge.local.provisioner import Provisioner, Route, RouteError

log = logging.getLogger("lmforge.local.runtime")

MAX_BODY = 6 * 1024 * 1024  # 6 MiB, the botocore model's limit for Body (not enforced client-side)
_PATH_RE = re.compile(r"^/endpoints/([^/]+)/(invocations|invocations-response-stream)$")
_REGION_RE = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/")
_CHUNK = 64 * 1024
#: not an AWS operation: lmforge's view of each endpoint instance (port, outstanding and total
#: invocations, sticky sessions), for load tests and ``lmforge local status``
INSTANCES_PATH = "/lmforge/instances"

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


class RuntimeServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        provisioner: Provisioner,
        *,
        invocation_timeout_s: float = 60.0,
        stream_timeout_s: float = 600.0,
    ) -> None:
        super().__init__(address, _Handler)
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


class _Handler(BaseHTTPRequestHandler):
    # one PayloadPart per token: without TCP_NODELAY, Nagle's algorithm holds small frames back until
    # the client's (delayed) ACK, and tokens arrive in bursts on reused connections
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"
    server: RuntimeServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # ----- entry points
    def _not_found(self) -> None:
        self._send_error(Reject(404, "UnknownOperationException", f"No operation at {self.path}"), "")

    def do_POST(self) -> None:
        request_id = str(uuid.uuid4())
        openai = openai_path.PATH_RE.match(urlsplit(self.path).path)
        if openai is not None:
            openai_path.serve(self, openai, request_id)
            return
        try:
            match = _PATH_RE.match(urlsplit(self.path).path)
            if match is None:
                raise Reject(404, "UnknownOperationException", f"No operation at {self.path}")
            name, operation = unquote(match.group(1)), match.group(2)
            body = self._read_body()
            if problem := name_problem("endpointName", name):
                raise Reject(400, "ValidationError", problem)
            route = self._route(name)
            try:
                if operation == "invocations":
                    self._invoke(route, body, request_id)
                else:
                    self._invoke_stream(route, body, request_id)
            finally:
                self.server.provisioner.finished(route)
        except Reject as rej:
            self._send_error(rej, request_id)

    def do_GET(self) -> None:
        if urlsplit(self.path).path == INSTANCES_PATH:  # lmforge's own: where each endpoint's requests went
            data = json.dumps({"instances": self.server.provisioner.instances_report()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self._not_found()

    do_PUT = do_DELETE = do_PATCH = _not_found

    def do_HEAD(self) -> None:
        self.send_response(404)
        self.send_header("x-amzn-ErrorType", "UnknownOperationException")
        self.send_header("Content-Length", "0")
        self.end_headers()

    # ----- request side
    def _read_body(self) -> bytes:
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

    def _route(self, name: str, region: str | None = None, component: str | None = None) -> Route:
        """The container for an invocation (region: from the SigV4 credential unless given)."""
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

    def _container_request(
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
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            if isinstance(exc, TimeoutError | socket.timeout):
                raise self._model_error(
                    route,
                    0,
                    "",
                    f"Your invocation timed out while waiting for a response from container {route.variant}.",
                ) from None
            raise self._model_error(route, 0, "", f"could not reach the container: {exc}") from None
        if check and not 200 <= response.status < 300:
            text = response.read().decode("utf-8", errors="replace")
            conn.close()
            raise self._model_error(route, response.status, text)
        return conn, response

    def _model_error(self, route: Route, status: int, original: str, detail: str | None = None) -> Reject:
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

    # ----- responses
    def _invoke(self, route: Route, body: bytes, request_id: str) -> None:
        timeout = self.server.invocation_timeout_s
        deadline = time.monotonic() + timeout
        conn, response = self._container_request(route, body, self.headers.get("Accept"), timeout)
        try:
            chunks = []
            while chunk := response.read1(_CHUNK):
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError
        except (OSError, http.client.HTTPException):
            raise self._model_error(
                route,
                0,
                "",
                f"Your invocation timed out while waiting for a response from container {route.variant}.",
            ) from None
        finally:
            conn.close()
        data = b"".join(chunks)
        self.send_response(200)
        self.send_header("Content-Type", response.getheader("Content-Type", "application/octet-stream"))
        self.send_header("Content-Length", str(len(data)))
        self._common_headers(route, request_id, response)
        self.end_headers()
        self.wfile.write(data)

    def _invoke_stream(self, route: Route, body: bytes, request_id: str) -> None:
        deadline = time.monotonic() + self.server.stream_timeout_s
        conn, response = self._container_request(
            route, body, self.headers.get("X-Amzn-SageMaker-Accept"), self.server.invocation_timeout_s
        )
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.amazon.eventstream")
            self.send_header(
                "X-Amzn-SageMaker-Content-Type",
                response.getheader("Content-Type", "application/octet-stream"),
            )
            self.send_header("Transfer-Encoding", "chunked")
            self._common_headers(route, request_id, response)
            self.end_headers()
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._send_chunk(
                        model_stream_error(
                            f"Your model {route.variant} did not complete sending the inference response "
                            "in the allotted time.",
                            "ModelInvocationTimeExceeded",
                        )
                    )
                    break
                if conn.sock is not None:
                    conn.sock.settimeout(remaining)
                try:
                    chunk = response.read1(_CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    timed_out = isinstance(exc, TimeoutError | socket.timeout)
                    self._send_chunk(
                        model_stream_error(
                            f"Your model {route.variant} did not complete sending the inference response "
                            "in the allotted time."
                            if timed_out
                            else f"The stream from container {route.variant} broke: {exc}",
                            "ModelInvocationTimeExceeded" if timed_out else "StreamBroken",
                        )
                    )
                    break
                if not chunk:
                    break
                self._send_chunk(payload_part(chunk))
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away; closing ours makes the container abort
        finally:
            conn.close()

    def _send_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _common_headers(self, route: Route, request_id: str, response: http.client.HTTPResponse) -> None:
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

    def _send_error(self, rej: Reject, request_id: str, body: bytes | None = None) -> None:
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
