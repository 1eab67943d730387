"""SageMaker's OpenAI-compatible invocation path on the local ``sagemaker-runtime``.

What is public (AWS's developer guide "Invoke endpoints with OpenAI-compatible APIs", its example
notebook in aws-samples/sagemaker-genai-hosting-examples, May 2026): an OpenAI client is pointed at
``https://runtime.sagemaker.<region>.amazonaws.com/endpoints/<endpoint>/openai/v1`` (an inference
component: ``.../endpoints/<endpoint>/inference-components/<component>/openai/v1``) with a SageMaker
bearer token as its API key (:mod:`lmforge.aws.bearer`); SageMaker routes by the names in the URL,
accepts Chat Completions requests (``/chat/completions``, no other OpenAI route), passes the body to
the container unchanged (``model`` included: the examples send ``""``) and returns the container's
answer as it is, streamed or not. A third-party client that measured it reports that this path
refuses the ``X-Amzn-SageMaker-Inference-Component`` header (the component goes in the path) and
answers its own refusals in OpenAI's ``{"error": {...}}`` shape, quoting a container's error body in
the message the way ``InvokeEndpoint``'s ``ModelError`` does.

Not public, so chosen here and labelled as such: **the container receives the request at
``POST /v1/chat/completions``** (the OpenAI route after ``/openai``, which lmforge, vLLM, LMI and
SGLang containers serve with OpenAI's semantics: SSE streams, OpenAI error bodies) rather than at
``/invocations``; a container error keeps its status and becomes an OpenAI error object whose
message quotes the container's body and whose ``type``/``param`` are the container's own; a token
that is missing, malformed or expired is a 401; the signature is not checked (the local SageMaker
does not check SigV4 signatures either). An unknown endpoint is the same 400 ``ValidationError`` as
``InvokeEndpoint``'s, in the OpenAI shape.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import unquote

from lmforge.aws.bearer import BearerTokenError, read_bearer_token
from lmforge.aws.names import name_problem
from lmforge.local.exchange import Exchange, Reject, StreamBreak, model_error
from lmforge.local.provisioner import Route

#: the path a client's ``base_url`` + ``/chat/completions`` gives
PATH_RE = re.compile(r"^/endpoints/([^/]+)(?:/inference-components/([^/]+))?/openai/v1/(.*)$")
#: the OpenAI routes SageMaker forwards, and the container path each reaches (see the module doc)
CONTAINER_PATHS = {"chat/completions": "/v1/chat/completions"}


def serve(handler: Exchange, match: re.Match[str], request_id: str) -> None:
    """Answer one request on the OpenAI path: route it, relay the container's answer, or refuse it
    in OpenAI's error shape."""
    started = time.perf_counter()
    handler.model_started = None
    try:
        name, component = unquote(match.group(1)), match.group(2) and unquote(match.group(2))
        container_path = CONTAINER_PATHS.get(match.group(3).rstrip("/"))
        if container_path is None:
            raise Reject(
                404,
                "UnknownOperationException",
                f"No operation at {handler.path}: SageMaker's OpenAI-compatible path serves "
                "/openai/v1/chat/completions only",
            )
        body = handler.read_body()
        region = _region(handler)
        for field, value in (("endpointName", name), ("inferenceComponentName", component)):
            if value and (problem := name_problem(field, value)):
                raise Reject(400, "ValidationError", problem)
        if handler.headers.get("X-Amzn-SageMaker-Inference-Component"):
            raise Reject(
                400,
                "ValidationError",
                "the X-Amzn-SageMaker-Inference-Component header is not accepted on the OpenAI-compatible "
                "path; name the inference component in the URL: "
                "/endpoints/{endpoint}/inference-components/{component}/openai/v1",
            )
        route = handler.route(name, region=region, component=component)
        failure: Reject | None = None
        try:
            _relay(handler, route, body, container_path, request_id)
        except Reject as rej:
            failure = rej
            raise
        finally:
            handler.server.provisioner.finished(route)
            handler.invoked(route, started, failure)
    except Reject as rej:
        handler.refuse(rej, request_id, openai_error_body(rej))


def _region(handler: Exchange) -> str:
    auth = handler.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Reject(
            401,
            "UnauthorizedException",
            "the OpenAI-compatible path needs Authorization: Bearer <SageMaker bearer token> "
            "(lmforge.aws.bearer.bearer_token, or the SageMaker SDK's generate_token)",
        )
    try:
        return read_bearer_token(token.strip()).region
    except BearerTokenError as exc:
        raise Reject(401, "UnauthorizedException", str(exc)) from None


def openai_error_body(rej: Reject) -> bytes:
    """A refusal in OpenAI's error shape (``type``: SageMaker's error type, unless the container's)."""
    error = {
        "message": rej.message,
        "type": rej.extra.get("type", rej.error_type),
        "param": rej.extra.get("param"),
        "code": rej.status,
    }
    return json.dumps({"error": error}).encode()


def _container_error(route: Route, status: int, text: str) -> Reject:
    """A container's error answer: its status, its body quoted as SageMaker's ModelError quotes it,
    and its own OpenAI ``type`` and ``param`` when it sent OpenAI's shape."""
    rej = model_error(route, status, text.strip())
    try:
        inner = json.loads(text)
    except ValueError:
        inner = None
    own = inner.get("error") if isinstance(inner, dict) else None
    extra: dict[str, Any] = {"type": "ModelError"}
    if isinstance(own, dict):
        extra = {"type": own.get("type") or "ModelError", "param": own.get("param")}
    rej.status, rej.extra = status, extra
    return rej


def _relay(handler: Exchange, route: Route, body: bytes, path: str, request_id: str) -> None:
    """The container's answer as it is (its status, Content-Type and bytes, chunk by chunk as they
    come), within the stream's time limit."""
    server = handler.server
    deadline = time.monotonic() + server.stream_timeout_s
    accept = handler.headers.get("Accept")
    conn, response = handler.container_request(
        route, body, accept, server.invocation_timeout_s, path=path, check=False
    )
    try:
        if not 200 <= response.status < 300:
            text = response.read().decode("utf-8", errors="replace")
            raise _container_error(route, response.status, text)
        content_type = response.getheader("Content-Type", "application/json")
        handler.send_response(response.status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.common_headers(route, request_id, response)
        handler.end_headers()
        sse = content_type.startswith("text/event-stream")
        handler.relay(conn, response, deadline, _as_is, _error_event if sse else _nothing)
    except (BrokenPipeError, ConnectionResetError):
        handler.close_connection = True  # the client went away; closing ours makes the container abort
    finally:
        conn.close()


def _as_is(chunk: bytes) -> bytes:
    return chunk


def _error_event(end: StreamBreak) -> bytes:
    """An SSE stream that broke or ran past its limit ends with an OpenAI error event."""
    problem = end.detail
    if end.timed_out:
        problem = "the container did not finish the response in the allotted time"
    error = {"message": f"The stream from the container broke: {problem}", "type": "ModelStreamError"}
    event = json.dumps({"error": {**error, "param": None, "code": 424}})
    return f"data: {event}\n\n".encode()


def _nothing(end: StreamBreak) -> None:
    """Another body that broke just ends."""
    return
