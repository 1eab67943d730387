"""lmforge.reachins: one record of what lmforge reaches for in a library, and one start-time check."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from lmforge.errors import LmforgeError
from lmforge.reachins import Library, Reach, ReachError, check, missing


@pytest.fixture
def lib() -> Iterator[str]:
    """A module standing in for a library's module."""

    class Engine:
        def __init__(self) -> None:
            self.queue: list[int] = []

        def step(self) -> None:
            pass

    @dataclasses.dataclass
    class State:
        kwargs: dict[str, Any]

    module = types.ModuleType(f"fake_lib_{uuid.uuid4().hex}")
    module.Engine = Engine  # type: ignore[attr-defined]
    module.State = State  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        yield module.__name__
    finally:
        del sys.modules[module.__name__]


def _library(reaches: tuple[Reach, ...]) -> Library:
    return Library("fakelib", "1.2.x", "the fake engine", reaches, fix="pip install fakelib==1.2")


def test_what_is_there_passes(lib: str) -> None:
    reaches = (
        Reach(f"{lib}:Engine", ("step",)),
        Reach(f"{lib}:Engine", ("queue",), set_in="__init__"),
        Reach(f"{lib}:State", ("kwargs",)),  # a dataclass field without a default
    )
    assert missing(reaches) == []
    check(_library(reaches))


def test_a_missing_attribute_is_named_with_its_reason_and_both_versions(lib: str) -> None:
    reaches = (
        Reach(f"{lib}:Engine", ("step", "stop"), "the loop's end"),
        Reach(f"{lib}:Engine", ("queue", "_pending"), "the batch hook", set_in="__init__"),
        Reach(f"{lib}:Gone", ("anything",), "a class renamed"),
    )
    with pytest.raises(ReachError) as caught:
        check(_library(reaches))
    assert isinstance(caught.value, LmforgeError) and isinstance(caught.value, RuntimeError)
    text = str(caught.value)
    assert f"{lib}.Engine.stop (the loop's end)" in text
    assert f"{lib}.Engine._pending (set in __init__) (the batch hook)" in text
    assert f"{lib}.Gone (a class renamed)" in text
    assert "Engine.step" not in text and "Engine.queue" not in text
    assert "the fake engine cannot start on fakelib (not installed)" in text
    assert "tested against fakelib 1.2.x. pip install fakelib==1.2" in text


def test_a_method_wrapped_by_a_patch_is_read_through_its_wrapper(lib: str) -> None:
    engine = sys.modules[lib].Engine
    init = engine.__init__

    @functools.wraps(init)
    def wrapped(self: Any) -> None:
        init(self)

    engine.__init__ = wrapped
    assert missing([Reach(f"{lib}:Engine", ("queue",), set_in="__init__")]) == []


def test_importing_it_imports_no_library() -> None:
    libraries = "{'torch', 'vllm', 'transformers', 'moto'}"
    code = f"import sys, lmforge.reachins; print(sorted({libraries} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_suite_s_pytest_and_xdist_table_resolves_and_a_missing_entry_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from _pytest.nodeid import NodeId

    from tests.conftest import PYTEST_XDIST

    assert missing(PYTEST_XDIST.reaches) == []
    monkeypatch.delattr(NodeId, "parse")
    with pytest.raises(
        ReachError, match=r"_pytest\.nodeid\.NodeId\.parse \(the fix builds the suffixed id\)"
    ):
        check(PYTEST_XDIST)


def test_xdist_s_loadgroup_suffix_is_what_the_suite_s_fix_writes() -> None:
    """The fix copies xdist's suffix format (``@`` + sorted names joined by ``_``): xdist's own source."""
    import inspect

    import xdist.remote

    source = inspect.getsource(xdist.remote.WorkerInteractor.pytest_collection_modifyitems)
    assert "f\"{item.nodeid}@{'_'.join(sorted(gnames))}\"" in source


def test_the_model_server_s_uvicorn_table_resolves_and_an_override_gone_upstream_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn

    from lmforge.reachins import UVICORN

    assert missing(UVICORN.reaches) == []
    monkeypatch.delattr(uvicorn.Server, "capture_signals")
    with pytest.raises(ReachError, match=r"uvicorn\.Server\.capture_signals \(overridden by the draining"):
        check(UVICORN)
