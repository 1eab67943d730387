"""LMI-Dist with n-gram speculation, in-process on the tiny model: the same events as without it (tokens,
log-probs, top-n, finish), whatever the request's settings, alone and together (the draft-model proposer
and bad drafts: test_lmi_dist_speculative_draft.py; bad settings: tests/unit/test_speculative_config.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmforge.engines.lmi_dist.engine import LmiDistEngine
from lmforge.engines.protocol import GenerationEvent, SamplingParams, StructuredOutput
from tests.unit.test_lmi_dist_engine import collect, make_engine

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("lmi-dist-engine")]

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 64})

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
)

#: settings the verify pass must honour position by position
PARAMS = {
    "greedy": SamplingParams(max_new_tokens=40, ignore_eos=True),
    "top-n": SamplingParams(max_new_tokens=24, top_n=3, ignore_eos=True),
    "min-tokens": SamplingParams(max_new_tokens=20, min_new_tokens=12),
    "repetition": SamplingParams(max_new_tokens=24, repetition_penalty=1.2, ignore_eos=True),
    "penalties": SamplingParams(
        max_new_tokens=24, presence_penalty=0.5, frequency_penalty=0.3, ignore_eos=True
    ),
    "short": SamplingParams(max_new_tokens=3, ignore_eos=True),
    "stop-string": SamplingParams(max_new_tokens=40, stop=("e",), ignore_eos=True),
    "sampled": SamplingParams(max_new_tokens=16, do_sample=True, temperature=0.8, seed=7, ignore_eos=True),
    "structured": SamplingParams(
        max_new_tokens=24, top_n=2, structured=StructuredOutput("json_schema", SCHEMA)
    ),
}
PROMPTS = (
    "def f(x):\n    return x + x + x",
    "a b c a b c a b",
    '{"name": "ab", "n": 1} {"name": "ab", "n": ',
)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _key(events: list[GenerationEvent]) -> list[tuple[object, ...]]:
    return [
        (
            e.token.id if e.token else None,
            e.token.log_prob if e.token else None,
            tuple(e.token.top_logprobs or []) if e.token else None,
            e.finish_reason,
        )
        for e in events
    ]


def _differences(want: dict, got: dict, tol: float = 1e-4) -> list[str]:
    """Where two runs' events differ: ids and finish exactly, log-probs within ``tol``."""
    out = []
    for rid, events in want.items():
        other = got[rid]
        if [(e[0], e[3], [t for t, _ in e[2] or ()]) for e in events] != [
            (e[0], e[3], [t for t, _ in e[2] or ()]) for e in other
        ]:
            out.append(f"{rid}: tokens {[e[0] for e in events]} != {[e[0] for e in other]}")
            continue
        for i, (a, b) in enumerate(zip(events, other, strict=True)):
            values = [(a[1], b[1])] + [(x[1], y[1]) for x, y in zip(a[2] or (), b[2] or (), strict=True)]
            if any(x is not None and abs(x - y) > tol for x, y in values):
                out.append(f"{rid}: log-probs of token {i}: {a} != {b}")
    return out


def _served(tiny_model: Path, loop: asyncio.AbstractEventLoop, **env: str) -> tuple[dict, dict, dict]:
    """Every case alone and in a crowd on a new engine with ``env``, and its metrics after them."""
    engine = make_engine(tiny_model, loop, **env)
    try:
        alone, crowd = _run_all(engine, loop)
        return alone, crowd, engine.stats().metrics()
    finally:
        loop.run_until_complete(engine.shutdown())


def _same_events(want: dict, want_crowd: dict, got: dict, got_crowd: dict, tol: float = 1e-4) -> list[str]:
    """What differs from ``want`` (without speculation, alone) in the three other runs."""
    return [d for other in (got, want_crowd, got_crowd) for d in _differences(want, other, tol)]


def _run_all(engine: LmiDistEngine, loop: asyncio.AbstractEventLoop) -> tuple[dict, dict]:
    cases = [(f"{name}-{i}", params, p) for name, params in PARAMS.items() for i, p in enumerate(PROMPTS)]

    async def alone() -> dict:
        return {rid: _key(await collect(engine, rid, params, p)) for rid, params, p in cases}

    async def together() -> dict:
        got = await asyncio.gather(*(collect(engine, rid + "-c", params, p) for rid, params, p in cases))
        return {rid: _key(events) for (rid, _, _), events in zip(cases, got, strict=True)}

    return loop.run_until_complete(alone()), loop.run_until_complete(together())


def test_speculation_gives_the_same_events_as_without(
    tiny_model: Path, loop: asyncio.AbstractEventLoop
) -> None:
    want, want_crowd, _ = _served(tiny_model, loop)
    got, got_crowd, metrics = _served(tiny_model, loop, OPTION_SPECULATIVE_CONFIG=SPEC)
    problems = _same_events(want, want_crowd, got, got_crowd)
    assert not problems, "\n".join(problems[:20])
    # the tiny model's random weights rarely repeat themselves: drafts are proposed (and rejected);
    # accepted ones are tested on SmolLM2 (tests/integration/test_same_answer.py)
    assert metrics["speculative_proposed_tokens_total"] > 0
    assert metrics["speculative_proposed_tokens_total"] >= metrics["speculative_accepted_tokens_total"]
    assert metrics["speculative_mean_accepted_length"] >= 1.0


def test_speculation_on_a_w8a8_model_gives_the_same_events_as_without(
    tiny_model: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """On int8 layers, whose per-token quantization turns a last-bit difference of an activation into
    another int8 value, the verify rows' attention must have the bits of one-at-a-time decoding (the
    SDPA block it had before did not: SmolLM2 W8A8 answered otherwise on 4 of 4 prompts)."""
    want, want_crowd, _ = _served(tiny_model, loop, OPTION_QUANTIZE="w8a8")
    got, got_crowd, metrics = _served(
        tiny_model, loop, OPTION_QUANTIZE="w8a8", OPTION_SPECULATIVE_CONFIG=SPEC
    )
    # exact, bit for bit: each row's int8 products, attention and norms are its own, alone or in a
    # crowd (float32's prepacked products are not: their rounding follows the number of rows)
    problems = _same_events(want, want_crowd, got, got_crowd, tol=0.0)
    assert not problems, "\n".join(problems[:20])
    assert metrics["speculative_proposed_tokens_total"] > 0
