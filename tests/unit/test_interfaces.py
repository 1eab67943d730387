"""The server uses a handler only through :mod:`lmforge.handlers`' protocols, and the handler layer uses
an engine only through :class:`lmforge.engines.protocol.Engine` (and its capability protocols).

A ``getattr``/``hasattr`` on a handler or an engine is a probe for something no protocol declares:
this check reads the server's and the handler layer's sources and fails on one. Capabilities are asked
with ``isinstance`` against a declared ``runtime_checkable`` protocol instead.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

import lmforge
from lmforge.handlers import ListsModels, ServesAdapters, ServesTokenizer
from lmforge.handlers.custom import CustomHandler
from lmforge.handlers.default import DefaultHandler
from lmforge.serving.app import App
from lmforge.serving.state import ServerState

SRC = Path(lmforge.__file__).parent
#: where a handler or an engine is used by the layer above it
USERS = ("serving", "handlers")
#: names an expression may carry that make it a handler or an engine
SUBJECTS = ("handler", "engine")


def probes(source: str) -> list[str]:
    """Each ``getattr(x, ...)``/``hasattr(x, ...)`` in ``source`` whose ``x`` names a handler or an
    engine, as ``line: call``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        if node.func.id not in ("getattr", "hasattr"):
            continue
        subject = ast.unparse(node.args[0]).lower()
        if any(word in subject for word in SUBJECTS):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_layer_probes_a_handler_or_an_engine() -> None:
    found = {
        str(path.relative_to(SRC)): hits
        for user in USERS
        for path in sorted((SRC / user).rglob("*.py"))
        if (hits := probes(path.read_text()))
    }
    assert not found, f"probes of a handler or an engine (declare it on a protocol instead): {found}"


@pytest.mark.parametrize(
    "source",
    [
        "models = getattr(self.handler, 'models', None)",
        "x = hasattr(self._engine, 'max_model_len')",
        "getattr(handler.engine, 'tool_call_syntax')",
    ],
)
def test_the_check_sees_a_planted_probe(source: str) -> None:
    assert probes(source)


def test_the_check_leaves_other_getattrs_alone() -> None:
    assert not probes("close = getattr(source, 'aclose', None)\nd = getattr(tokenizer, 'decoder', None)")


def test_the_default_handler_has_every_capability_route(tmp_path: Path) -> None:
    from lmforge.config import load_config
    from lmforge.testing.scripted import ScriptedEngine

    config = load_config(tmp_path, env={}).config
    handler = DefaultHandler(config, ScriptedEngine(config))
    assert all(isinstance(handler, p) for p in (ListsModels, ServesTokenizer, ServesAdapters))
    paths = {route.path for route in App(handler, ServerState()).router.routes}
    assert {"/v1/models", "/tokenize", "/detokenize", "/tokenizer_info", "/adapters"} <= paths


def _user_handler(tmp_path: Path) -> CustomHandler:
    (tmp_path / "model.py").write_text("def handle(inputs):\n    return None\n")
    from lmforge.handlers.custom import load_module

    return CustomHandler(load_module(tmp_path, "model.py"), {}, "model.py")


def test_routes_follow_the_handler_capabilities(tmp_path: Path) -> None:
    """A user ``model.py`` handler has no model list, tokenizer or adapters: the server has no such routes
    for it (a 404 in each API's shape), while the invocation routes are there for every handler."""
    app = App(_user_handler(tmp_path), ServerState())
    paths = {route.path for route in app.router.routes}
    assert {"/invocations", "/v1/chat/completions", "/v1/completions", "/ping"} <= paths
    assert not paths & {"/v1/models", "/tokenize", "/detokenize", "/tokenizer_info", "/adapters"}
    assert app.router.find("/models/model/adapters") is None

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": [], "query_string": b""}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 404
    assert b'"error"' in sent[-1]["body"]  # OpenAI's shape under /v1/
