"""Engines: LMI-Dist vs vLLM, both through `lmforge serve`, same model, concurrency 32.

Both servers run at once (LMI-Dist with the tiny example model's serving.properties, vLLM with the
settings of bench/frontend_overhead.py, both fp32 and 32+ sequences per batch) on the tiny model or,
with ``--model smollm2-135m``, on the real 135 M model (engines-smollm2-135m.json); the same client
(`lmforge.bench`, LMI jsonlines) loads them alternately, round by round, and the figures are
medians over the rounds. Writes bench/results/engines.json with ``ratio`` = LMI-Dist output
tokens/s / vLLM output tokens/s (target >= 0.8).

    OMP_NUM_THREADS=1 .venv/bin/python bench/engines.py [--rounds 3] [--model tiny|smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
NAME = "engines"

from bench.frontend_overhead import (  # noqa: E402
    INPUT_LEN,
    OUTPUT_LEN,
    lmforge_server,
    properties,
    server_env,
    vllm_model,
)
from bench.models import DESCRIPTIONS, MODELS, TINY, result_name  # noqa: E402

CONCURRENCY = 32
REQUESTS = 128
TARGET = 0.8


def measure(url: str, model: Path) -> dict[str, Any]:
    from lmforge.bench import BenchConfig, Load, benchmark

    config = BenchConfig(
        target=url,
        api="lmforge",
        num_requests=REQUESTS,
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
        seed=0,
        warmup=8,
        tokenizer=str(model),
    )
    return benchmark(config, [Load(concurrency=CONCURRENCY)])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", choices=MODELS, default=TINY, help="the model both engines serve")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = result_name(NAME, args.model)
    out = args.out or RESULTS / f"{name}.json"
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {"lmi-dist": [], "vllm": []}
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
            for r in range(args.rounds):
                order = list(urls) if r % 2 == 0 else list(reversed(urls))
                for label in order:
                    rec = measure(urls[label], lmi_dir)
                    runs[label].append(rec)
                    print(
                        f"round {r + 1} {label:<8} {rec['output_throughput']:7.0f} tok/s  "
                        f"TPOT p50 {rec['tpot_ms']['p50']:.2f} ms  failed {rec['failed']}",
                        flush=True,
                    )
    medians = {k: statistics.median(r["output_throughput"] for r in v) for k, v in runs.items()}
    sample = runs["vllm"][0]
    result = {
        "name": name,
        "command": "OMP_NUM_THREADS=1 .venv/bin/python bench/engines.py"
        + (f" --model {args.model}" if args.model != TINY else ""),
        "ratio": medians["lmi-dist"] / medians["vllm"],
        "target": TARGET,
        "output_throughput": medians,
        "output_throughput_rounds": {k: [r["output_throughput"] for r in v] for k, v in runs.items()},
        "tpot_ms_p50": {k: statistics.median(r["tpot_ms"]["p50"] for r in v) for k, v in runs.items()},
        "ttft_ms_p50": {k: statistics.median(r["ttft_ms"]["p50"] for r in v) for k, v in runs.items()},
        "failed": {k: sum(r["failed"] for r in v) for k, v in runs.items()},
        "settings": {
            "model": DESCRIPTIONS[args.model],
            "model_key": args.model,
            "concurrency": CONCURRENCY,
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
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    print(f"wrote {out}")


#: Where LMI-Dist's time goes at this load (py-spy, 200 Hz, 12 s of `lmforge bench --concurrency 32`
#: against an LMI-Dist `lmforge serve`, 2026-11-23), kept with the scenario while the target is missed.
PROFILE = """
Profile of the LMI-Dist server at concurrency 32 (py-spy, 12 s): the generation thread is busy 90 %
of the time, and it shares one interpreter (one GIL) with the HTTP event loop (21 % of a core), where
vLLM runs its engine core in a process of its own. Of the generation thread: attention 21 % (one
masked SDPA over the packed batch; padded-batch and per-request variants measured no faster at this
size), linear layers 17 %, transformers' per-step batch preparation ~20 % (of which clearing and
rebuilding its static attention mask ~10 %), the per-request sampler 5 %. Tried and reverted: skipping
transformers' static mask and building a small one per step (wrong key lengths in mixed prefill/decode
steps). What would close the gap: the engine loop in its own process (as vLLM does), or a mask-free
decode path.
"""


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    s = result["settings"]
    tput, tpot, ttft = result["output_throughput"], result["tpot_ms_p50"], result["ttft_ms_p50"]
    rounds = {k: ", ".join(f"{x:.0f}" for x in v) for k, v in result["output_throughput_rounds"].items()}
    rows = "\n".join(
        f"| {name} | {tput[name]:.0f} | {rounds[name]} | {tpot[name]:.2f} | {ttft[name]:.1f} |"
        for name in ("lmi-dist", "vllm")
    )
    met = "met" if result["ratio"] >= result["target"] else "MISSED"
    key = s.get("model_key", TINY)
    model = "the example model in fp32" if key == TINY else DESCRIPTIONS[key]
    title = "" if key == TINY else f", {key}"
    profile = PROFILE if result["ratio"] < result["target"] and key == TINY else ""
    return f"""## Engines: LMI-Dist vs vLLM{title} (`bench/engines.py`)

Both through `lmforge serve` (LMI jsonlines), {model}, concurrency
{s["concurrency"]}, {s["requests"]} requests per run, {s["input_len"]} prompt tokens,
{s["output_len"]} output tokens (EOS ignored); both servers up at once, loaded alternately for
{s["rounds"]} rounds; medians over the rounds. Result: `bench/results/{result["name"]}.json`.

| engine | output tok/s (median) | rounds | TPOT p50 (ms) | TTFT p50 (ms) |
| --- | --- | --- | --- | --- |
{rows}

Ratio LMI-Dist / vLLM: **{result["ratio"]:.2f}x** (target >= {result["target"]}x: {met}).
{profile}"""


if __name__ == "__main__":
    main()
