"""`make bench`: streaming throughput and latency of `lmforge serve` (LMI-Dist) on the tiny model.

Starts a real server process on loopback, sends streaming requests at several concurrencies and
writes bench/results/serving-lmi-dist.json (TTFT, ITL, end-to-end latency, output tokens/s) plus the
attention comparison bench/results/lmi-dist-attention.json. Metric definitions follow vLLM's
benchmark: TTFT = request sent -> first token; ITL = gap between consecutive tokens; TPOT = (e2e -
TTFT) / (tokens - 1).
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"

from tests.utils import RemoteServer  # noqa: E402


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values) if values else float("nan"),
        "p50": pct(values, 0.5),
        "p90": pct(values, 0.9),
        "p99": pct(values, 0.99),
    }


def one_request(client: httpx.Client, url: str, prompt: str, max_new: int) -> dict[str, object]:
    body = {
        "inputs": prompt,
        "parameters": {"max_new_tokens": max_new, "ignore_eos_token": True},
        "stream": True,
    }
    start = time.perf_counter()
    stamps: list[float] = []
    with client.stream("POST", url + "/invocations", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line:
                stamps.append(time.perf_counter())
    end = time.perf_counter()
    return {
        "ttft": stamps[0] - start,
        "itl": [b - a for a, b in itertools.pairwise(stamps)],
        "e2e": end - start,
        "tokens": len(stamps),
    }


def run_level(url: str, concurrency: int, requests: int, max_new: int) -> dict[str, object]:
    prompts = [f"def function_{i}(x):\n    return " for i in range(requests)]
    # One pooled client: a new httpx client per request builds an SSL context (tens of ms of CPU),
    # which on a 2-core machine would be measured as server latency.
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(timeout=300, limits=limits) as client, ThreadPoolExecutor(concurrency) as pool:
        t0 = time.perf_counter()
        results = list(pool.map(lambda p: one_request(client, url, p, max_new), prompts))
        wall = time.perf_counter() - t0
    tokens = sum(int(r["tokens"]) for r in results)
    itl = [x for r in results for x in r["itl"]]  # type: ignore[attr-defined]
    tpot = [(float(r["e2e"]) - float(r["ttft"])) / max(1, int(r["tokens"]) - 1) for r in results]
    return {
        "concurrency": concurrency,
        "requests": requests,
        "output_tokens": tokens,
        "duration_s": wall,
        "output_tokens_per_s": tokens / wall,
        "requests_per_s": requests / wall,
        "ttft_s": summary([float(r["ttft"]) for r in results]),
        "itl_ms": {k: v * 1000 for k, v in summary(itl).items()},
        "tpot_ms": {k: v * 1000 for k, v in summary(tpot).items()},
        "e2e_s": summary([float(r["e2e"]) for r in results]),
    }


def main() -> None:
    from lmforge.models.example import write_example_model

    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_example_model(Path(tmp) / "tiny")
        levels = []
        with RemoteServer(model) as srv:
            with httpx.Client() as client:
                one_request(client, srv.url, "warm up", 8)
            for conc, reqs in [(1, 8), (8, 32), (32, 64)]:
                level = run_level(srv.url, conc, reqs, 64)
                levels.append(level)
                ttft, itl = level["ttft_s"], level["itl_ms"]
                print(
                    f"concurrency {conc:>3}: {level['output_tokens_per_s']:.0f} tok/s, "
                    f"TTFT p50 {ttft['p50'] * 1000:.1f} ms, ITL p50 {itl['p50']:.2f} ms"  # type: ignore[index]
                )
        attention = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "lmi_dist_attention.py"), str(model)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        print(attention.stdout.strip())
    result = {
        "name": "serving-lmi-dist",
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "model": "lmforge example-model (0.9 M-parameter random Llama, fp32)",
        "settings": {"max_new_tokens": 64, "torch_threads": 1, "framing": "jsonlines"},
        "levels": levels,
    }
    (RESULTS / "serving-lmi-dist.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS / 'serving-lmi-dist.json'}")


if __name__ == "__main__":
    main()
