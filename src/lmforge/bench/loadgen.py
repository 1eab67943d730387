"""The load generator: one run = a number of requests at a fixed concurrency, or arriving at a
request rate (a Poisson process, optionally capped by a maximum concurrency), as vLLM's benchmark
sends them: with a fixed concurrency every request is due at once and at most N are in flight; with
a rate, the gaps between arrivals are drawn from an exponential distribution (seeded) and scaled so
that the last request is due at ``num_requests / rate`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lmforge.bench.metrics import Metrics, RequestResult, compute
from lmforge.bench.prompts import Prompt
from lmforge.bench.targets import Target


@dataclass(frozen=True)
class Load:
    """How requests are sent: ``concurrency`` alone, or ``request_rate`` (+ ``max_concurrency``)."""

    concurrency: int | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("give either a concurrency or a request rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"request rate must be positive, got {self.request_rate}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max concurrency must be at least 1, got {self.max_concurrency}")

    @property
    def limit(self) -> int | None:
        return self.concurrency if self.concurrency is not None else self.max_concurrency

    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        cap = f", at most {self.max_concurrency} in flight" if self.max_concurrency else ""
        return f"{self.request_rate:g} req/s{cap}"


def arrival_times(count: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each of ``count`` requests is due (Poisson arrivals)."""
    if count < 1:
        return []
    rng = random.Random(seed)
    times: list[float] = []
    total = 0.0
    for _ in range(count):
        total += rng.expovariate(rate)
        times.append(total)
    scale = (count / rate) / times[-1]
    return [t * scale for t in times]


@dataclass(frozen=True)
class RunResult:
    load: Load
    metrics: Metrics
    requests: list[RequestResult]


async def _gather_limited(
    target: Target,
    prompts: Sequence[Prompt],
    output_len: int,
    limit: int | None,
    due: Sequence[float] | None,
    on_done: Callable[[RequestResult], None] | None,
) -> list[RequestResult]:
    semaphore: asyncio.Semaphore | contextlib.nullcontext[None]
    semaphore = asyncio.Semaphore(limit) if limit else contextlib.nullcontext()

    async def one(prompt: Prompt) -> RequestResult:
        async with semaphore:
            result = await target.send(prompt, output_len)
        if on_done is not None:
            on_done(result)
        return result

    if due is None:
        return list(await asyncio.gather(*(one(p) for p in prompts)))
    start = time.perf_counter()
    tasks = []
    for prompt, at in zip(prompts, due, strict=True):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(prompt)))
    return list(await asyncio.gather(*tasks))


async def run(
    target: Target,
    prompts: Sequence[Prompt],
    output_len: int,
    load: Load,
    *,
    seed: int = 0,
    warmup: Sequence[Prompt] = (),
    on_done: Callable[[RequestResult], None] | None = None,
) -> RunResult:
    """Send ``warmup`` (not measured, at the run's concurrency), then ``prompts``; return the figures."""
    if output_len < 1:
        raise ValueError(f"the output length must be at least 1 token, got {output_len}")
    if warmup:
        await _gather_limited(target, warmup, output_len, load.limit or len(warmup), None, None)
    due = None if load.request_rate is None else arrival_times(len(prompts), load.request_rate, seed)
    start = time.perf_counter()
    results = await _gather_limited(target, prompts, output_len, load.limit, due, on_done)
    duration = time.perf_counter() - start
    return RunResult(load, compute(results, duration), results)
