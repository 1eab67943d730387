"""The one table that maps every lmforge failure to an HTTP status and an error type.

Engines, handlers and the server raise the exceptions below; only ``lmforge.serving`` turns them
into responses, through :func:`classify`. A message is always written for the client: it names the
field or limit at fault and never carries a traceback.

Two body shapes come from the same table: LMI's ``{"code", "type", "message", "param"}``
(:meth:`LmforgeError.to_dict`, on ``/invocations`` and the server's own routes) and OpenAI's
``{"error": {"message", "type", "param", "code"}}`` as vLLM's OpenAI server sends it
(:meth:`LmforgeError.to_openai_dict`, on every ``/v1/...`` route and as the in-band error event of
an OpenAI stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class ErrorKind:
    status: int
    type: str
    description: str
    openai_type: str
    """``error.type`` of the OpenAI body (vLLM's names: ``BadRequestError``, ``NotFoundError``, ...)."""


#: Error kind -> HTTP status. This is the single source of truth; docs/errors.md is generated from it
#: (``python -m lmforge.errors``; a test keeps them equal).
ERROR_TABLE: dict[str, ErrorKind] = {
    "bad_request": ErrorKind(
        400, "bad_request", "the body or a parameter is invalid; `param` names it", "BadRequestError"
    ),
    "not_found": ErrorKind(
        404, "not_found", "no such route or resource (or, on `/v1`, no such `model`)", "NotFoundError"
    ),
    "method_not_allowed": ErrorKind(
        405, "method_not_allowed", "wrong HTTP method for the route", "MethodNotAllowedError"
    ),
    "conflict": ErrorKind(
        409, "conflict", "the resource already exists (e.g. an adapter name)", "ConflictError"
    ),
    "payload_too_large": ErrorKind(
        413, "payload_too_large", "the body is larger than `max_request_size`", "PayloadTooLargeError"
    ),
    "unsupported_media_type": ErrorKind(
        415, "unsupported_media_type", "the body is not JSON or plain text", "UnsupportedMediaTypeError"
    ),
    "model_error": ErrorKind(
        424, "model_error", "the model or the user handler failed on this request", "InternalServerError"
    ),
    "overloaded": ErrorKind(
        503,
        "overloaded",
        "running batch and `job_queue_size` are full; retry after `Retry-After`",
        "ServiceUnavailableError",
    ),
    "not_ready": ErrorKind(
        503,
        "not_ready",
        "the model is still loading or the server is shutting down",
        "ServiceUnavailableError",
    ),
    "engine_dead": ErrorKind(
        503,
        "engine_dead",
        "the engine loop died; the instance should be replaced",
        "ServiceUnavailableError",
    ),
    "out_of_memory": ErrorKind(
        507,
        "out_of_memory",
        "the engine ran out of (device) memory for this request",
        "InsufficientStorageError",
    ),
}


class LmforgeError(Exception):
    """Base class of errors with a client-facing message and an entry in :data:`ERROR_TABLE`."""

    kind: ClassVar[str] = "model_error"

    def __init__(self, message: str, *, param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return ERROR_TABLE[self.kind].status

    @property
    def type(self) -> str:
        return ERROR_TABLE[self.kind].type

    def to_dict(self) -> dict[str, object]:
        """LMI's error body (``/invocations`` and the server's own routes)."""
        body: dict[str, object] = {"code": self.status, "type": self.type, "message": self.message}
        if self.param is not None:
            body["param"] = self.param
        return body

    def to_openai_dict(self) -> dict[str, object]:
        """OpenAI's error body, as vLLM's OpenAI server sends it (``code``: the HTTP status); the
        official client reads it as ``err.body``, ``err.code``, ``err.param`` and ``err.type``."""
        kind = ERROR_TABLE[self.kind]
        error = {"message": self.message, "type": kind.openai_type, "param": self.param, "code": kind.status}
        return {"error": error}


class BadRequestError(LmforgeError):
    kind = "bad_request"


class NotFoundError(LmforgeError):
    kind = "not_found"


class MethodNotAllowedError(LmforgeError):
    kind = "method_not_allowed"


class ConflictError(LmforgeError):
    kind = "conflict"


class PayloadTooLargeError(LmforgeError):
    kind = "payload_too_large"


class UnsupportedMediaTypeError(LmforgeError):
    kind = "unsupported_media_type"


class ModelError(LmforgeError):
    kind = "model_error"


class OverloadedError(LmforgeError):
    kind = "overloaded"


class NotReadyError(LmforgeError):
    kind = "not_ready"


class EngineDeadError(LmforgeError):
    kind = "engine_dead"


class OutOfMemoryError(LmforgeError):
    kind = "out_of_memory"


_OOM_NAMES = frozenset({"OutOfMemoryError", "MemoryError"})
_OOM_MESSAGES = ("out of memory", "no available memory for the cache blocks")


def classify(exc: BaseException) -> LmforgeError:
    """Turn any exception into an :class:`LmforgeError` with a safe message.

    Known errors pass through. Out-of-memory errors (``MemoryError``, ``torch.OutOfMemoryError``, CUDA
    "out of memory" messages) become 507. Anything else raised by a model or handler becomes 424 with
    the exception's class and message only (no traceback, no object addresses).
    """
    if isinstance(exc, LmforgeError):
        return exc
    text = str(exc)
    if type(exc).__name__ in _OOM_NAMES or any(m in text.lower() for m in _OOM_MESSAGES):
        return OutOfMemoryError(f"out of memory: {_short(text) or type(exc).__name__}")
    detail = _short(text)
    return ModelError(f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__)


def _short(text: str, limit: int = 500) -> str:
    import re

    text = re.sub(r"0x[0-9a-fA-F]{6,}", "0x…", text.strip().splitlines()[0] if text.strip() else "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_for_status(status: int | None, message: str) -> LmforgeError:
    """The error class whose table entry has ``status`` (424 when unknown), carrying ``message``."""
    for cls in (BadRequestError, PayloadTooLargeError, ModelError, EngineDeadError, OutOfMemoryError):
        if ERROR_TABLE[cls.kind].status == status:
            return cls(message)
    return ModelError(message)


def _error_classes() -> dict[str, list[str]]:
    """Error kind -> the names of the exception classes that carry it."""
    out: dict[str, list[str]] = {kind: [] for kind in ERROR_TABLE}
    pending: list[type[LmforgeError]] = [LmforgeError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ == __name__ and cls is not LmforgeError:
            out[cls.kind].append(cls.__name__)
    return out


def render_errors_markdown() -> str:
    """docs/errors.md: every error kind with its status, type, meaning and exception classes."""
    classes = _error_classes()
    lines = [
        "# Errors",
        "",
        "<!-- Generated from lmforge.errors.ERROR_TABLE by `python -m lmforge.errors`; do not edit by hand.",
        "     tests/unit/test_errors.py fails when this file differs from the table. -->",
        "",
        'Every failure leaves the server as JSON `{"code", "type", "message", "param"}` with the status',
        "below; `param` names the field at fault where there is one. On the OpenAI routes (every path",
        "under `/v1/`) the same error takes OpenAI's shape, as vLLM's OpenAI server sends it:",
        '`{"error": {"message", "type", "param", "code"}}`, with `type` from the OpenAI column and `code`',
        "the HTTP status; the official `openai` client raises the exception class of the status",
        "(`BadRequestError`, `NotFoundError`, ...) with that object as `.body`, `.code`, `.param`.",
        "",
        "A failure after a stream has started cannot change the status line any more. In LMI's streams",
        '(`/invocations` with LMI bodies) it is the last line (`finish_reason: "error"`, `error`, `code`).',
        'An OpenAI stream instead gets one event `{"error": {...}}` in the shape above (an SSE `data:`',
        "event on `/v1`, a line in jsonlines), then `data: [DONE]`: its `finish_reason` only ever takes",
        "OpenAI's values (`stop`, `length`, `tool_calls`, or null mid-stream). A 503 for `overloaded`",
        "carries `Retry-After`. Behind SageMaker, a status other than 200 reaches a boto3 client as a",
        "`ModelError` (424) with the container's status in `OriginalStatusCode`.",
        "",
        "| status | type | OpenAI `type` | meaning | raised as |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind, entry in ERROR_TABLE.items():
        raised = ", ".join(f"`{name}`" for name in sorted(classes[kind])) or "-"
        lines.append(
            f"| {entry.status} | `{entry.type}` | `{entry.openai_type}` | {entry.description} | {raised} |"
        )
    lines += [
        "",
        "Anything else a model or handler raises becomes `model_error` (424) with the exception's class",
        "and first line only, no traceback; out-of-memory errors (`MemoryError`, `torch.OutOfMemoryError`,",
        '"out of memory" messages) become `out_of_memory` (507).',
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    from pathlib import Path

    Path("docs/errors.md").write_text(render_errors_markdown(), encoding="utf-8")
    print("wrote docs/errors.md")
