"""`make bench`: streaming throughput and latency of `lmforge serve` (LMI-Dist) on the tiny model.

Starts a real server process on loopback, sends streaming requests at several concurrencies and
writes bench/results/serving-lmi-dist.json (TTFT, ITL, end-to-end latency, output tokens/s) plus the
attention comparison bench/results/lmi-dist-attention.json. The load and the figures come from
`lmforge.bench` (`lmforge bench`); metric definitions as vLLM's benchmark (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import record
from lmforge.testing.server import RemoteServer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS


LEVELS = [(1, 8), (8, 32), (32, 64)]  # (concurrency, requests)
INPUT_LEN = 16
OUTPUT_LEN = 64


def _seconds(figure: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else v / 1000 for k, v in figure.items()}


def run_levels(url: str, model: Path) -> list[dict[str, Any]]:
    """One `lmforge.bench` run per level, in this file's result schema (seconds for TTFT and E2E)."""
    from lmforge.bench import BenchConfig, Load, benchmark

    levels = []
    for conc, reqs in LEVELS:
        config = BenchConfig(
            target=url,
            api="lmforge",
            num_requests=reqs,
            input_len=INPUT_LEN,
            output_len=OUTPUT_LEN,
            seed=0,
            warmup=1,
            tokenizer=str(model),
        )
        rec = benchmark(config, [Load(concurrency=conc)])[0]
        if rec["failed"]:
            raise RuntimeError(f"{rec['failed']} requests failed at concurrency {conc}: {rec['errors']}")
        levels.append(
            {
                "concurrency": conc,
                "requests": reqs,
                "output_tokens": rec["total_output_tokens"],
                "duration_s": rec["duration_s"],
                "output_tokens_per_s": rec["output_throughput"],
                "requests_per_s": rec["request_throughput"],
                "ttft_s": _seconds(rec["ttft_ms"]),
                "itl_ms": rec["itl_ms"],
                "tpot_ms": rec["tpot_ms"],
                "e2e_s": _seconds(rec["e2el_ms"]),
            }
        )
        ttft, itl = rec["ttft_ms"], rec["itl_ms"]
        print(
            f"concurrency {conc:>3}: {rec['output_throughput']:.0f} tok/s, "
            f"TTFT p50 {ttft['p50']:.1f} ms, ITL p50 {itl['p50']:.2f} ms"
        )
    return levels


def main() -> None:
    from lmforge.bench.results import machine, versions
    from lmforge.models.example import write_example_model

    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_example_model(Path(tmp) / "tiny")
        with RemoteServer(model) as srv:
            levels = run_levels(srv.url, model)
        attention = subprocess.run(
            [sys.executable, "-m", "bench.lmi_dist_attention", str(model)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        print(attention.stdout.strip())
    result = {
        "name": "serving-lmi-dist",
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.serving_throughput",
        "machine": machine(),
        "versions": versions(),
        "model": "lmforge example-model (0.9 M-parameter random Llama, fp32)",
        "settings": {
            "max_new_tokens": OUTPUT_LEN,
            "prompt_tokens": INPUT_LEN,
            "torch_threads": 1,
            "framing": "jsonlines",
            "client": "lmforge.bench",
        },
        "levels": levels,
    }
    record.write(RESULTS / "serving-lmi-dist.json", result, section)


def report(s: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    st = s.get("settings", {})
    prompt = f"{st['prompt_tokens']}-token prompts" if "prompt_tokens" in st else "short prompts"
    client = f"the `{st['client']}` load generator" if "client" in st else "one pooled HTTP client"
    head = (
        "| concurrency | requests | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | TPOT p50 (ms) "
        "| e2e p50 (s) |\n| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = [
        f"| {lv['concurrency']} | {lv['requests']} | {lv['output_tokens_per_s']:.0f} "
        f"| {lv['ttft_s']['p50'] * 1000:.1f} / {lv['ttft_s']['p99'] * 1000:.1f} "
        f"| {lv['itl_ms']['p50']:.2f} / {lv['itl_ms']['p99']:.2f} | {lv['tpot_ms']['p50']:.2f} "
        f"| {lv['e2e_s']['p50']:.2f} |"
        for lv in s["levels"]
    ]
    notes = f"\n{s['notes']}\n" if s.get("notes") else ""
    return f"""## Serving throughput and latency (`bench/serving_throughput.py`)

`lmforge serve` with the LMI-Dist engine and {s.get("model", "the example model")},
streaming LMI jsonlines over HTTP/1.1 (uvicorn + httptools), {st.get("max_new_tokens", 64)} new tokens per
request (`ignore_eos_token`), {prompt}, {client}. Result: `bench/results/serving-lmi-dist.json`.

{head}{chr(10).join(rows)}
{notes}"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    return record.section(record.ORDER["serving_throughput"], report(result))


if __name__ == "__main__":
    main()
