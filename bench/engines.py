"""Engines: LMI-Dist vs vLLM, both through `lmforge serve`, same model, concurrency 1, 8 and 32.

Both servers run at once (LMI-Dist with the tiny example model's serving.properties, vLLM with the
settings of bench/frontend_overhead.py, both fp32 and 32+ sequences per batch) on the tiny model or,
with ``--model smollm2-135m``, on the real 135 M model (engines-smollm2-135m.json); the same client
(`lmforge.bench`, LMI jsonlines) loads them alternately, round by round and concurrency by
concurrency, after one unmeasured pass over every concurrency (the servers have served before a
measured run, as a long-lived endpoint has), and the figures are medians over the rounds. Writes
bench/results/engines.json with a row per concurrency and ``ratio`` = LMI-Dist output tokens/s /
vLLM output tokens/s at concurrency 32 (goal >= 1.0, floor 0.9 at every concurrency; TTFT p50 at 32
no higher than vLLM's).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.engines [--rounds 3] [--model tiny|smollm2-135m]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import record
from bench.frontend_overhead import (
    INPUT_LEN,
    OUTPUT_LEN,
    lmforge_server,
    properties,
    server_env,
    vllm_model,
)
from bench.models import DESCRIPTIONS, MODELS, TINY, result_name

ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS
NAME = "engines"


CONCURRENCIES = (1, 8, 32)
#: requests per run at each concurrency (4 per client at 32, fewer alone: a run takes seconds)
REQUESTS = {1: 16, 8: 48, 32: 128}
TARGET = 1.0
FLOOR = 0.9


def measure(url: str, model: Path, concurrency: int) -> dict[str, Any]:
    from lmforge.bench import BenchConfig, Load, benchmark

    config = BenchConfig(
        target=url,
        api="lmforge",
        num_requests=REQUESTS[concurrency],
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
        seed=0,
        warmup=8,
        tokenizer=str(model),
    )
    return benchmark(config, [Load(concurrency=concurrency)])[0]


def summarize(concurrency: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over the rounds of one concurrency, both engines."""
    tput = {k: statistics.median(r["output_throughput"] for r in v) for k, v in runs.items()}
    return {
        "concurrency": concurrency,
        "output_throughput": tput,
        "output_throughput_rounds": {k: [r["output_throughput"] for r in v] for k, v in runs.items()},
        "tpot_ms_p50": {k: statistics.median(r["tpot_ms"]["p50"] for r in v) for k, v in runs.items()},
        "ttft_ms_p50": {k: statistics.median(r["ttft_ms"]["p50"] for r in v) for k, v in runs.items()},
        "failed": {k: sum(r["failed"] for r in v) for k, v in runs.items()},
        "ratio": tput["lmi-dist"] / tput["vllm"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", choices=MODELS, default=TINY, help="the model both engines serve")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = result_name(NAME, args.model)
    out = args.out or RESULTS / f"{name}.json"
    started = time.monotonic()
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {
        c: {"lmi-dist": [], "vllm": []} for c in CONCURRENCIES
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        vllm_dir = vllm_model(tmp / "vllm", args.model)
        lmi_dir = tmp / "lmi-dist"
        shutil.copytree(vllm_dir, lmi_dir)
        # the tiny example model's LMI-Dist settings fit any model (fp32, 32 sequences, 1024 tokens)
        from lmforge.models.example import SERVING_PROPERTIES

        (lmi_dir / "serving.properties").write_text(SERVING_PROPERTIES)
        lmi_properties = SERVING_PROPERTIES
        env = server_env(tmp / "vllm-cache")
        with lmforge_server(vllm_dir, env) as vllm, lmforge_server(lmi_dir, env) as lmi:
            print(f"servers up after {time.monotonic() - started:.0f} s", flush=True)
            urls = {"lmi-dist": lmi.url, "vllm": vllm.url}
            # servers that have served every concurrency before a measured run, as a user's long-lived
            # endpoint has: a frontend that slows as it serves shows in the rounds, not only in a soak
            for concurrency in CONCURRENCIES:
                for label in urls:
                    measure(urls[label], lmi_dir, concurrency)
            print(f"servers warmed (a run a concurrency, unmeasured): {time.monotonic() - started:.0f} s")
            for r in range(args.rounds):
                for concurrency in CONCURRENCIES:
                    order = list(urls) if r % 2 == 0 else list(reversed(urls))
                    for label in order:
                        rec = measure(urls[label], lmi_dir, concurrency)
                        runs[concurrency][label].append(rec)
                        tpot, ttft = rec["tpot_ms"]["p50"], rec["ttft_ms"]["p50"]
                        print(
                            f"round {r + 1} c={concurrency:<3} {label:<8} "
                            f"{rec['output_throughput']:7.0f} tok/s  TPOT p50 {tpot:.2f} ms  "
                            f"TTFT p50 {ttft:.1f} ms  failed {rec['failed']}",
                            flush=True,
                        )
    rows = [summarize(c, runs[c]) for c in CONCURRENCIES]
    top = rows[-1]
    notes = RESULTS / f"{name}-profile.md"  # the before/after profile, kept beside the result
    sample = runs[CONCURRENCIES[-1]]["vllm"][0]
    result = {
        "name": name,
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.engines"
        + (f" --model {args.model}" if args.model != TINY else ""),
        "ratio": top["ratio"],
        "target": TARGET,
        "floor": FLOOR,
        "rows": rows,
        # the concurrency-32 figures at the top level, as the report's tiny-vs-real table reads them
        "output_throughput": top["output_throughput"],
        "tpot_ms_p50": top["tpot_ms_p50"],
        "ttft_ms_p50": top["ttft_ms_p50"],
        "failed": {k: sum(row["failed"][k] for row in rows) for k in ("lmi-dist", "vllm")},
        "settings": {
            "model": DESCRIPTIONS[args.model],
            "model_key": args.model,
            "concurrency": list(CONCURRENCIES),
            "requests": REQUESTS,
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "rounds": args.rounds,
            "lmi_dist_properties": [
                line for line in lmi_properties.splitlines() if line and not line.startswith("#")
            ],
            "vllm_properties": properties(args.model).strip().splitlines(),
        },
        "versions": sample["versions"],
        "machine": sample["machine"],
        "wall_s": round(time.monotonic() - started, 1),
        "runs": {str(c): v for c, v in runs.items()},
    }
    if notes.exists():
        result["profile"] = notes.read_text().strip()
    record.write(out, result, section)
    print(report(result))


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    s = result["settings"]
    lines = []
    for row in result.get("rows") or [_legacy_row(result)]:
        tput, tpot, ttft = row["output_throughput"], row["tpot_ms_p50"], row["ttft_ms_p50"]
        lines.append(
            f"| {row['concurrency']} | {tput['lmi-dist']:.0f} / {tput['vllm']:.0f} | **{row['ratio']:.2f}x** "
            f"| {tpot['lmi-dist']:.1f} / {tpot['vllm']:.1f} | {ttft['lmi-dist']:.0f} / {ttft['vllm']:.0f} |"
        )
    target = result["target"]
    floor = result.get("floor", target)
    worst = min(row["ratio"] for row in result.get("rows") or [_legacy_row(result)])
    met = "met" if result["ratio"] >= target else ("floor met" if result["ratio"] >= floor else "MISSED")
    key = s.get("model_key", TINY)
    model = "the example model in fp32" if key == TINY else DESCRIPTIONS[key]
    title = "" if key == TINY else f", {key}"
    requests = s["requests"]
    requests_text = (
        ", ".join(f"{n} at {c}" for c, n in requests.items()) if isinstance(requests, dict) else str(requests)
    )
    profile = f"\n{result['profile']}\n" if result.get("profile") else ""
    return f"""## Engines: LMI-Dist vs vLLM{title} (`bench/engines.py`)

Both through `lmforge serve` (LMI jsonlines), {model}, requests per run {requests_text},
{s["input_len"]} prompt tokens, {s["output_len"]} output tokens (EOS ignored); both servers up at
once, loaded alternately for {s["rounds"]} rounds; medians over the rounds. Result:
`bench/results/{result["name"]}.json`.

| concurrency | out tok/s LMI-Dist / vLLM | ratio | TPOT p50 ms (LMI-Dist / vLLM) | TTFT p50 ms |
| --- | --- | --- | --- | --- |
{chr(10).join(lines)}

Ratio at concurrency 32: **{result["ratio"]:.2f}x** (goal >= {target}x, floor {floor}x: {met}); lowest
ratio over the concurrencies {worst:.2f}x.
{profile}"""


def _legacy_row(result: dict[str, Any]) -> dict[str, Any]:
    """A result written before the per-concurrency rows: its one concurrency-32 row."""
    return {
        "concurrency": 32,
        "output_throughput": result["output_throughput"],
        "tpot_ms_p50": result["tpot_ms_p50"],
        "ttft_ms_p50": result["ttft_ms_p50"],
        "ratio": result["ratio"],
    }


def section(result: dict[str, Any]) -> dict[str, Any]:
    key = result["settings"].get("model_key", TINY)
    what = "LMI-Dist / vLLM output tok/s at concurrency 32" + ("" if key == TINY else ", SmolLM2-135M")
    summary = [record.summary_row(f"Engines ({what})", result["ratio"], float(result.get("target", 0.8)))]
    rows = result.get("rows") or [_legacy_row(result)]
    at32 = next((r for r in rows if r["concurrency"] == 32), rows[-1])
    t, tpot, ttft = at32["output_throughput"], at32["tpot_ms_p50"], at32["ttft_ms_p50"]
    compare = {
        "model": "tiny" if key == TINY else "real",
        "rows": [
            [
                "Engines c=32: LMI-Dist / vLLM output tok/s",
                f"{t['lmi-dist']:.0f} / {t['vllm']:.0f} = **{at32['ratio']:.2f}x**",
            ],
            ["Engines c=32: TPOT p50 LMI-Dist / vLLM (ms)", f"{tpot['lmi-dist']:.1f} / {tpot['vllm']:.1f}"],
            ["Engines c=32: TTFT p50 LMI-Dist / vLLM (ms)", f"{ttft['lmi-dist']:.0f} / {ttft['vllm']:.0f}"],
        ],
    }
    return record.section(record.ORDER["engines"] + (key != TINY), report(result), summary, compare)


if __name__ == "__main__":
    main()
