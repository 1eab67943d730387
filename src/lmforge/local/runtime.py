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
The steps both paths share (the body, the route, the container call, the relay) are
:mod:`lmforge.local.exchange`'s.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import uuid
from urllib.parse import unquote, urlsplit

from lmforge.aws.eventstream import model_stream_error, payload_part
from lmforge.aws.names import name_problem
from lmforge.local import openai_path
from lmforge.local.exchange import CHUNK, Exchange, Reject, Server, StreamBreak, model_error
from lmforge.local.provisioner import Provisioner, Route

_PATH_RE = re.compile(r"^/endpoints/([^/]+)/(invocations|invocations-response-stream)$")
#: not an AWS operation: lmforge's view of each endpoint instance (port, outstanding and total
#: invocations, sticky sessions), for load tests and ``lmforge local status``
INSTANCES_PATH = "/lmforge/instances"


class RuntimeServer(Server):
    """The local ``sagemaker-runtime``'s HTTP server."""

    def __init__(
        self,
        address: tuple[str, int],
        provisioner: Provisioner,
        *,
        invocation_timeout_s: float = 60.0,
        stream_timeout_s: float = 600.0,
    ) -> None:
        super().__init__(
            address,
            _Handler,
            provisioner,
            invocation_timeout_s=invocation_timeout_s,
            stream_timeout_s=stream_timeout_s,
        )


class _Handler(Exchange):
    # ----- entry points
    def _not_found(self) -> None:
        self.refuse(Reject(404, "UnknownOperationException", f"No operation at {self.path}"), "")

    def do_POST(self) -> None:
        started = time.perf_counter()
        self.model_started = None
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
            body = self.read_body()
            if problem := name_problem("endpointName", name):
                raise Reject(400, "ValidationError", problem)
            route = self.route(name)
            failure: Reject | None = None
            try:
                if operation == "invocations":
                    self._invoke(route, body, request_id)
                else:
                    self._invoke_stream(route, body, request_id)
            except Reject as rej:
                failure = rej
                raise
            finally:
                self.server.provisioner.finished(route)
                self.invoked(route, started, failure)
        except Reject as rej:
            self.refuse(rej, request_id)

    def do_GET(self) -> None:
        if urlsplit(self.path).path == INSTANCES_PATH:  # lmforge's own: where each endpoint's requests went
            provisioner = self.server.provisioner
            data = json.dumps(
                {"instances": provisioner.instances_report(), "components": provisioner.components_report()}
            ).encode()
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

    # ----- responses
    def _invoke(self, route: Route, body: bytes, request_id: str) -> None:
        timeout = self.server.invocation_timeout_s
        deadline = time.monotonic() + timeout
        conn, response = self.container_request(route, body, self.headers.get("Accept"), timeout)
        try:
            chunks = []
            while chunk := response.read1(CHUNK):
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError
        except (OSError, http.client.HTTPException):
            raise model_error(
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
        self.common_headers(route, request_id, response)
        self.end_headers()
        self.wfile.write(data)

    def _invoke_stream(self, route: Route, body: bytes, request_id: str) -> None:
        deadline = time.monotonic() + self.server.stream_timeout_s
        conn, response = self.container_request(
            route, body, self.headers.get("X-Amzn-SageMaker-Accept"), self.server.invocation_timeout_s
        )

        def broke(end: StreamBreak) -> bytes:
            if end.timed_out:
                return model_stream_error(
                    f"Your model {route.variant} did not complete sending the inference response "
                    "in the allotted time.",
                    "ModelInvocationTimeExceeded",
                )
            detail = f"The stream from container {route.variant} broke: {end.detail}"
            return model_stream_error(detail, "StreamBroken")

        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.amazon.eventstream")
            self.send_header(
                "X-Amzn-SageMaker-Content-Type",
                response.getheader("Content-Type", "application/octet-stream"),
            )
            self.send_header("Transfer-Encoding", "chunked")
            self.common_headers(route, request_id, response)
            self.end_headers()
            self.relay(conn, response, deadline, payload_part, broke)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away; closing ours makes the container abort
        finally:
            conn.close()
