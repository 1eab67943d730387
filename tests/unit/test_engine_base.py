"""EngineBase.generate, the frame every engine's requests run in: prepare, the engine's own _generate,
and the counters behind /metrics (here on the scripted engine, whose _generate is the part it writes)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from lmforge.config import load_config
from lmforge.engines.protocol import (
    EngineStats,
    FieldError,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    RequestField,
    SamplingParams,
)
from lmforge.testing.scripted import MAX_MODEL_LEN, ScriptedEngine

pytestmark = pytest.mark.xdist_group("engine-base")


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> ScriptedEngine:
    engine = ScriptedEngine(load_config(tiny_model, env={}).config)
    asyncio.run(engine.start())
    return engine


def _counts(engine: ScriptedEngine) -> tuple[int, int, int]:
    stats: EngineStats = engine.stats()
    return stats.requests_total, stats.tokens_total, stats.aborted_total


def _since(engine: ScriptedEngine, before: tuple[int, int, int]) -> tuple[int, ...]:
    return tuple(now - then for now, then in zip(_counts(engine), before, strict=True))


async def _read(engine: ScriptedEngine, n: int, stop_after: int | None = None) -> list[GenerationEvent]:
    request = GenerationRequest("r", engine.tokenizer.encode("def "), SamplingParams(max_new_tokens=n))
    got: list[GenerationEvent] = []
    async with contextlib.aclosing(engine.generate(request)) as events:
        async for event in events:
            got.append(event)
            if stop_after is not None and len(got) == stop_after:
                break
    return got


def test_a_finished_request_counts_its_tokens_and_no_abort(engine: ScriptedEngine) -> None:
    before = _counts(engine)
    events = asyncio.run(_read(engine, 5))
    assert events[-1].finish_reason is FinishReason.LENGTH
    assert _since(engine, before) == (1, 5, 0)


def test_a_stream_closed_before_its_final_event_is_one_abort(engine: ScriptedEngine) -> None:
    before = _counts(engine)
    events = asyncio.run(_read(engine, 50, stop_after=2))
    assert not any(e.finished for e in events)
    assert _since(engine, before) == (1, 2, 1)
    assert engine.stats().running == 0  # the engine's own part was closed too: its finally ran


def test_an_engine_side_abort_ends_the_stream_and_is_not_a_client_abort(engine: ScriptedEngine) -> None:
    before = _counts(engine)
    engine.cancel_after = 3
    try:
        events = asyncio.run(_read(engine, 50))
    finally:
        engine.cancel_after = None
    assert events[-1].finish_reason is FinishReason.ABORT
    assert _since(engine, before) == (1, 3, 0)


def test_a_refusal_is_raised_before_any_event_and_counts_no_request(engine: ScriptedEngine) -> None:
    before = _counts(engine)
    with pytest.raises(FieldError) as refused:
        asyncio.run(_read(engine, MAX_MODEL_LEN + 1))
    assert refused.value.field in (RequestField.MAX_NEW_TOKENS, RequestField.PROMPT)
    assert _since(engine, before) == (0, 0, 0)
