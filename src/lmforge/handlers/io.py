"""djl-python compatible ``Input`` and ``Output``.

A ``model.py`` written for LMI (``def handle(inputs: Input) -> Output``) runs unchanged: the same
method names exist with the same meaning. ``from djl_python import Input, Output`` also works, because
:mod:`lmforge.handlers.custom` registers these classes under that name when it loads a user handler.

The model server builds one ``Input`` per HTTP request: properties are the request headers (names
lower-cased); content holds the body under the key ``data`` and, as in DJL Serving, each query
parameter under its own name (never ``data``). Headers and query parameters are separate namespaces:
``?content-type=text/plain`` is a query parameter, and never changes how the body is parsed.
``query`` (an lmforge addition) holds the query parameters as text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmforge.handlers.request_common import Api


class Input:
    def __init__(
        self,
        properties: dict[str, str] | None = None,
        content: dict[str, bytes] | None = None,
        route: str = "/invocations",
        query: dict[str, str] | None = None,
        api: Api | None = None,
    ) -> None:
        self.properties: dict[str, str] = dict(properties or {})
        self.content: dict[str, bytes] = dict(content or {})
        self.route = route
        """The path the request came in on (``/invocations``, ``/v1/chat/completions``, ...); an
        lmforge addition to djl-python's Input."""
        self.query: dict[str, str] = dict(query or {})
        """The query parameters (an lmforge addition; also in ``content`` as DJL Serving has them)."""
        self.api = api
        """The body schema of the route it came on (an lmforge addition, from the server's route table,
        :mod:`lmforge.serving.routes`): ``chat`` or ``completion`` on OpenAI's routes, None on
        ``/invocations`` (any schema, read from the body)."""
        for key, value in self.query.items():
            if key != "data":
                self.content.setdefault(key, value.encode("utf-8"))

    # --- properties
    def get_properties(self) -> dict[str, str]:
        return self.properties

    def get_property(self, key: str) -> str | None:
        if key in self.properties:
            return self.properties[key]
        return self.properties.get(key.lower())

    def get_query(self, key: str) -> str | None:
        """A query parameter's value (never a header's)."""
        return self.query.get(key)

    def contains_key(self, key: str) -> bool:
        return key in self.content

    def is_empty(self) -> bool:
        return not self.content

    def get_batch_size(self) -> int:
        return 1

    def get_batches(self) -> list[Input]:
        return [self]

    # --- content
    def get_content(self) -> dict[str, bytes]:
        return self.content

    def get_as_bytes(self, key: str | None = None) -> bytes:
        if key is None:
            if "data" in self.content:
                return self.content["data"]
            return next(iter(self.content.values()), b"")
        if key not in self.content:
            raise KeyError(f"no content named {key!r}")
        return self.content[key]

    def get_as_string(self, key: str | None = None) -> str:
        return self.get_as_bytes(key).decode("utf-8")

    def get_as_json(self, key: str | None = None) -> Any:
        return json.loads(self.get_as_bytes(key))

    def get_data(self, key: str | None = None) -> Any:
        """The body decoded by its Content-Type: JSON, text, or bytes."""
        content_type = (self.get_property("content-type") or "").lower()
        if "json" in content_type:
            return self.get_as_json(key)
        if content_type.startswith("text/"):
            return self.get_as_string(key)
        return self.get_as_bytes(key)


StreamSource = Iterable[Any] | AsyncIterable[Any]


class LastChunk(bytes):
    """A stream's last item, marked as such by the stream that yields it: the server sends it together
    with the end of the body, in one write (a streamed reply's last token, its usage chunk and
    ``[DONE]`` and the chunked encoding's end were three ``send()`` system calls and three wake-ups of
    the client). The bytes are the same; a consumer that does not know the mark reads plain bytes."""

    __slots__ = ()


class Output:
    def __init__(self, code: int = 200, message: str = "OK") -> None:
        self.code = code
        self.message = message
        self.properties: dict[str, str] = {}
        self.content: list[bytes] = []
        self.stream: StreamSource | None = None

    def set_code(self, code: int) -> Output:
        self.code = code
        return self

    def set_message(self, message: str) -> Output:
        self.message = message
        return self

    def error(self, error: str, code: int = 424, message: str = "prediction failure") -> Output:
        self.code = code
        self.message = message
        body = {"code": code, "message": message, "error": error}
        return self.add_as_json(body)

    def add_property(self, key: str, value: str) -> Output:
        self.properties[key] = value
        return self

    def add(self, value: Any, key: str | None = None, batch_index: int | None = None) -> Output:
        if isinstance(value, bytes | bytearray):
            data = bytes(value)
        elif isinstance(value, str):
            data = value.encode("utf-8")
        else:
            return self.add_as_json(value, key=key, batch_index=batch_index)
        self.content.append(data)
        return self

    def add_as_json(self, val: Any, key: str | None = None, batch_index: int | None = None) -> Output:
        """``val`` as JSON, ended by a newline: a reply read through SageMaker's response stream
        (``invoke_endpoint_with_response_stream``) by a line iterator then ends its last line."""
        self.content.append(json.dumps(val, ensure_ascii=False).encode("utf-8") + b"\n")
        self.properties.setdefault("Content-Type", "application/json")
        return self

    def add_stream_content(self, stream: StreamSource, output_formatter: Any = None) -> Output:
        """Stream ``stream``'s items (str or bytes) as the response body, each sent as it comes (a
        :class:`LastChunk` ends the body)."""
        self.stream = stream
        return self

    def body(self) -> bytes:
        return b"".join(self.content)
