"""LMI-Dist's frontend (lmi_dist.engine) against a stand-in for the engine core process: the orders of
events a real core produces only by chance."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lmforge.config import load_config
from lmforge.engines.lmi_dist import ipc
from lmforge.engines.lmi_dist.engine import LmiDistEngine
from lmforge.engines.protocol import FinishReason, GenerationEvent, GenerationRequest, SamplingParams


def _engine(tiny_model: Path) -> tuple[LmiDistEngine, list[Any]]:
    """An engine whose core is a stand-in: what the engine sends it is recorded, nothing answers."""
    from lmforge.engines.text import load_tokenizer

    engine = LmiDistEngine(load_config(tiny_model, env={}).config)
    sent: list[Any] = []
    engine._core = SimpleNamespace(  # type: ignore[assignment]
        send=sent.append, dead=None, ready=SimpleNamespace(world=1)
    )
    engine._tokenizer = load_tokenizer(str(tiny_model))
    engine._slots = asyncio.Semaphore(4)
    engine.max_model_len = 256
    return engine, sent


def test_a_request_the_core_fails_at_shutdown_ends_with_the_shutdown(tiny_model: Path) -> None:
    """At shutdown the frontend ends its requests ("the server is shutting down", 503), then tells the
    core to stop; the core's hard stop fails what it was running. When that failure reaches a stream
    before the stream saw its end (a busy event loop), the stream still ends with the shutdown, not
    with the core's failure as a model error (424). Found by tests/integration/test_load.py's SIGTERM
    test on a fresh clone."""
    engine, sent = _engine(tiny_model)

    async def scenario() -> list[GenerationEvent]:
        ids = engine.tokenizer.encode("def ")
        request = GenerationRequest("r1", ids, SamplingParams(max_new_tokens=50, ignore_eos=True))
        stream = engine.generate(request)
        first = asyncio.ensure_future(anext(stream))
        while not sent and not first.done():  # submitted: the stream now waits for the core
            await asyncio.sleep(0)
        [add] = sent
        engine._on_outputs([ipc.Out(add.rid, [7], [-0.5], None, ipc.RUNNING)])
        events = [await first]
        # the shutdown, then the core's failure of the request, before the stream runs again
        engine._end_all("the server is shutting down")
        engine._on_outputs([ipc.Out(add.rid, [], [], None, ipc.FAILED, "stopped by a hard stop")])
        events += [e async for e in stream]
        return events

    events = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [e.token.id for e in events if e.token is not None] == [7]
    last = events[-1]
    assert last.finish_reason == FinishReason.ERROR
    assert last.error_status == 503 and "shutting down" in (last.error or "")
    assert not any(isinstance(m, ipc.Cancel) for m in sent), "the core ended it: nothing to cancel"
