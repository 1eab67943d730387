"""Per-request timings and the figures computed from them, defined as vLLM's serving benchmark
(``vllm/benchmarks/serve.py``, formerly ``benchmarks/benchmark_serving.py``) defines them.

A request's clock starts just before the request is sent. A *chunk* is one streamed message that
carries generated text (an LMI jsonlines line or SSE event with a token, an OpenAI completion chunk
with ``choices``); usage-only messages and ``[DONE]`` are not chunks.

* TTFT: first chunk received - request sent.
* ITL: the gaps between consecutive chunks of one request, pooled over all requests.
* E2E latency: last chunk received - request sent.
* TPOT: (E2E - TTFT) / (output tokens - 1), per request with more than one output token.
* output tokens/s: output tokens of the successful requests / the run's duration; requests/s:
  successful requests / duration. The duration runs from the first request sent to the last
  request finished (warm-up requests excluded).
* Percentiles interpolate linearly between the two nearest ranks (numpy's default); a figure over no
  values is ``None``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: the percentiles every latency figure reports (besides the mean)
PERCENTILES = (50, 90, 99)
#: how many error messages a result keeps (the count covers all of them)
KEEP_ERRORS = 5


@dataclass
class RequestResult:
    """What the client saw of one request (times in seconds, ``time.perf_counter`` based)."""

    start: float = 0.0
    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    output_tokens: int = 0
    prompt_len: int | None = None
    text: str = ""
    error: str = ""

    def chunk(self, now: float, last: float) -> float:
        """Record a chunk that arrived at ``now`` (the previous one at ``last``); returns ``now``."""
        if self.chunks == 0:
            self.ttft = now - self.start
        else:
            self.itl.append(now - last)
        self.chunks += 1
        self.latency = now - self.start
        return now

    def fail(self, message: str) -> RequestResult:
        self.success = False
        self.error = message or "unknown error"
        return self


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation between ranks; None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def summary(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """``mean``, ``p50``, ``p90``, ``p99`` of ``values`` times ``scale`` (None when empty)."""
    out: dict[str, float | None] = {"mean": statistics.fmean(values) * scale if values else None}
    for q in PERCENTILES:
        p = percentile(values, q)
        out[f"p{q}"] = None if p is None else p * scale
    return out


def tpot(result: RequestResult) -> float | None:
    """Time per output token after the first, or None with fewer than two output tokens."""
    if result.output_tokens <= 1:
        return None
    return (result.latency - result.ttft) / (result.output_tokens - 1)


@dataclass(frozen=True)
class Metrics:
    """The figures of one run (one concurrency or request rate)."""

    duration_s: float
    completed: int
    failed: int
    errors: list[str]
    total_input_tokens: int | None
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2el_ms: dict[str, float | None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "duration_s": self.duration_s,
            "completed": self.completed,
            "failed": self.failed,
            "errors": self.errors,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "itl_ms": self.itl_ms,
            "e2el_ms": self.e2el_ms,
        }


def compute(results: Sequence[RequestResult], duration_s: float) -> Metrics:
    """The run's figures from its requests (warm-up excluded) and its wall time."""
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    ok = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_lens = [r.prompt_len for r in ok]
    total_input = None if any(p is None for p in prompt_lens) else sum(p or 0 for p in prompt_lens)
    tpots = [t for t in (tpot(r) for r in ok) if t is not None]
    return Metrics(
        duration_s=duration_s,
        completed=len(ok),
        failed=len(failed),
        errors=[r.error for r in failed[:KEEP_ERRORS]],
        total_input_tokens=total_input if ok else 0,
        total_output_tokens=output_tokens,
        request_throughput=len(ok) / duration_s,
        output_throughput=output_tokens / duration_s,
        ttft_ms=summary([r.ttft for r in ok], 1000.0),
        tpot_ms=summary(tpots, 1000.0),
        itl_ms=summary([gap for r in ok for gap in r.itl], 1000.0),
        e2el_ms=summary([r.latency for r in ok], 1000.0),
    )
