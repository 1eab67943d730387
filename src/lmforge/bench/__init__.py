"""``lmforge bench``: a load generator for lmforge, OpenAI-compatible peers and SageMaker endpoints.

::

    from lmforge.bench import BenchConfig, Load, benchmark, make_target

    config = BenchConfig(target="http://127.0.0.1:8080", api="lmforge", num_requests=64,
                         input_len=32, output_len=64, seed=0, warmup=1)
    records = benchmark(config, [Load(concurrency=16)])

Metric definitions: :mod:`lmforge.bench.metrics` and docs/benchmarks.md. This is the shipped tool;
lmforge's own benchmark scenarios and their results are the repository's ``bench/`` package, which
uses it (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from lmforge.bench.loadgen import Load, RunResult, run
from lmforge.bench.metrics import Metrics, RequestResult, compute, percentile, summary
from lmforge.bench.prompts import Prompt, load_tokenizer, make_prompts
from lmforge.bench.results import BenchConfig, record
from lmforge.bench.targets import APIS, HTTP_APIS, HttpTarget, SageMakerTarget, Target

__all__ = [
    "APIS",
    "HTTP_APIS",
    "BenchConfig",
    "HttpTarget",
    "Load",
    "Metrics",
    "Prompt",
    "RequestResult",
    "RunResult",
    "SageMakerTarget",
    "Target",
    "benchmark",
    "compute",
    "loop_factory",
    "make_target",
    "percentile",
    "run",
    "summary",
]


def make_target(
    config: BenchConfig,
    *,
    connections: int,
    timeout: float = 600.0,
    region: str | None = None,
    inference_component: str | None = None,
    tokenizer: Any = None,
) -> Target:
    """The target ``config`` names (an HTTP URL, or an endpoint name for ``sagemaker``)."""
    if config.api == "sagemaker":
        return SageMakerTarget(
            config.target,
            region=region,
            inference_component=inference_component,
            workers=connections,
            timeout=timeout,
        )
    count = None
    if tokenizer is not None:

        def count(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))

    return HttpTarget(
        config.target,
        config.api,
        model=config.model,
        timeout=timeout,
        count_tokens=count,
    )


def benchmark(
    config: BenchConfig,
    loads: Sequence[Load],
    *,
    target: Target | None = None,
    tokenizer: Any = None,
    on_start: Callable[[Load], None] | None = None,
    on_done: Callable[[RequestResult], None] | None = None,
    on_finish: Callable[[RunResult], None] | None = None,
    **target_options: Any,
) -> list[dict[str, Any]]:
    """Run ``loads`` one after the other against one target; one record (a JSON object) per load.

    Every run sends the same ``config.num_requests`` prompts (from ``config.seed``), after
    ``config.warmup`` warm-up requests that the figures leave out.
    """
    if tokenizer is None and config.tokenizer:
        tokenizer = load_tokenizer(config.tokenizer)
    prompts = make_prompts(config.num_requests, config.input_len, config.seed, tokenizer)
    warmup = (
        make_prompts(config.warmup, config.input_len, config.seed + 1, tokenizer) if config.warmup else []
    )
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(
            _benchmark(
                config,
                loads,
                prompts,
                warmup,
                target,
                tokenizer,
                on_start,
                on_done,
                on_finish,
                target_options,
            )
        )


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where installed (the server extra): it halves the client's CPU per token."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _benchmark(
    config: BenchConfig,
    loads: Sequence[Load],
    prompts: list[Prompt],
    warmup: list[Prompt],
    target: Target | None,
    tokenizer: Any,
    on_start: Callable[[Load], None] | None,
    on_done: Callable[[RequestResult], None] | None,
    on_finish: Callable[[RunResult], None] | None,
    target_options: dict[str, Any],
) -> list[dict[str, Any]]:
    own = target is None
    if target is None:
        widest = max((load.limit or config.num_requests) for load in loads)
        target = make_target(config, connections=widest, tokenizer=tokenizer, **target_options)
    records = []
    try:
        for load in loads:
            if on_start is not None:
                on_start(load)
            result = await run(
                target, prompts, config.output_len, load, seed=config.seed, warmup=warmup, on_done=on_done
            )
            if on_finish is not None:
                on_finish(result)
            records.append(record(config, result))
    finally:
        if own:
            await target.aclose()
    return records
