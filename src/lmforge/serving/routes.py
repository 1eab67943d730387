"""The model server's routes in one table: path -> methods, endpoint, API (starlette's ``Route``, kept small).

A route's API is decided here, once, and everything downstream reads it from the route:

* the shape of its error bodies: OpenAI's (``{"error": {...}}``) on OpenAI's paths and vLLM's peer
  routes (as vLLM sends them), LMI's on SageMaker's and LMI's paths;
* for an invocation route, the body schema it takes, bound into its endpoint and handed to the handler
  on :attr:`lmforge.handlers.io.Input.api`: ``chat`` or ``completion`` on OpenAI's routes; None on
  ``/invocations``, which takes any schema and is read by its body.

A path that no route matches is answered 404, in OpenAI's shape under ``/v1/`` and on vLLM's tokenizer
paths (a handler without a tokenizer lacks them, as vLLM would answer), LMI's elsewhere.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmforge.serving import asgi

    Endpoint = Callable[[asgi.Scope, asgi.Receive, asgi.Send], Awaitable[None]]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
INVOCATIONS_PATH = "/invocations"
MODELS_PATH = "/v1/models"
#: vLLM's tokenizer routes (a handler with a tokenizer answers them)
TOKENIZE_PATH, DETOKENIZE_PATH, TOKENIZER_INFO_PATH = "/tokenize", "/detokenize", "/tokenizer_info"
#: unmatched paths under it answer errors in OpenAI's shape
OPENAI_PREFIX = "/v1/"


class Errors(enum.Enum):
    """The body shape of a route's error answers."""

    LMI = "lmi"
    OPENAI = "openai"


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    """The exact path; with ``prefixed``, the first segment of every path the route answers."""
    methods: tuple[str, ...]
    endpoint: Endpoint
    errors: Errors
    match: Callable[[str], bool] | None = None
    """Paths beyond ``path`` that the route answers (the adapters API's); its endpoint checks methods."""


class Router:
    """The routes, looked up by path: exact paths first, then the routes that match a family of paths."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes = tuple(routes)
        self._exact = {r.path: r for r in self.routes if r.match is None}
        self._families = [r for r in self.routes if r.match is not None]

    def find(self, path: str) -> Route | None:
        """The route for ``path`` (its trailing ``/`` ignored), or None."""
        found = self._exact.get(path)
        if found is not None:
            return found
        return next((r for r in self._families if r.match and r.match(path)), None)

    @staticmethod
    def unmatched_errors(path: str) -> Errors:
        """The error shape of a 404 for ``path``, which no route answers."""
        openai = path.startswith(OPENAI_PREFIX) or path in (
            TOKENIZE_PATH,
            DETOKENIZE_PATH,
            TOKENIZER_INFO_PATH,
        )
        return Errors.OPENAI if openai else Errors.LMI
