"""Batching: LMI-Dist continuous batching vs static batched ``model.generate``, useful tokens per second.

One queue of requests, all waiting at t=0, served two ways on the same model, greedy, batch size B:

* **static**: what a static-batching server does: take the next B requests, left-pad them, run
  transformers' ``model.generate`` until the longest of them is done, then take the next B;
* **continuous**: LMI-Dist (``lmforge.engines.lmi_dist.engine.LmiDistEngine``, driven directly, no
  HTTP) with ``option.max_rolling_batch_size=B``: all requests submitted at once, a finished
  sequence's slot is refilled at the next step.

Figure: useful tokens per CPU-second of the serving process (all its threads; ``time.process_time``),
which is what wall-clock throughput is on a dedicated core, but does not move with other jobs on a
shared machine; the wall-clock ratio is recorded beside it. Best of ``--repeats`` runs.
Only useful tokens count: each request's own ``max_new_tokens`` (EOS is ignored on both sides, so
every request produces exactly that many; static rows that run past their own length are waste).
Workloads: ``equal`` (every request the same length) and ``varying`` (mostly short, a few long).
Each variant runs in its own process, torch on one thread.

The model is a random-weight Llama larger than the example model (the example model's steps are
all Python overhead), built with the example model's tokenizer and recipe: see MODEL_SHAPE; with
``--model smollm2-135m`` it is the real 135 M model (fp32), result in batching-smollm2-135m.json.

Usage: python -m bench.batching [--model smollm2-135m] [--out bench/results/batching.json].
Target: >= 3x on varying lengths.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import record
from bench.models import SMOLLM2, result_name, write_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS
NAME = "batching"
TARGET = 3.0
BATCH = 16
REQUESTS = 64
PROMPT_TOKENS = 16
#: a ~27 M-parameter Llama (the example model is 0.9 M); same tokenizer, vocabulary 2048
MODEL_SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
ENV = {"OMP_NUM_THREADS": "1", "OPTION_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# ---------------------------------------------------------------------------------- pure pieces


def workload(kind: str, n: int = REQUESTS, seed: int = 0) -> list[int]:
    """Output lengths of the queue: ``equal`` = 64 each; ``varying`` = 7 in 8 short (8-32 tokens),
    1 in 8 long (192-256 tokens), in a seeded random order."""
    rng = random.Random(seed)
    if kind == "equal":
        return [64] * n
    if kind == "varying":
        lengths = [rng.randint(192, 256) if i % 8 == 0 else rng.randint(8, 32) for i in range(n)]
        rng.shuffle(lengths)
        return lengths
    raise ValueError(f"unknown workload {kind!r}: use equal or varying")


def static_slots(lengths: list[int], batch: int) -> int:
    """Token slots a static batcher computes: each batch runs as long as its longest request."""
    return sum(
        max(lengths[i : i + batch]) * len(lengths[i : i + batch]) for i in range(0, len(lengths), batch)
    )


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` distinct prompts of ``length`` token ids (ordinary tokens of the 2048-token vocabulary)."""
    rng = random.Random(seed)
    return [[rng.randrange(10, 2000) for _ in range(length)] for _ in range(n)]


# ---------------------------------------------------------------------------------- model


def serving_properties() -> str:
    return (
        f"option.rolling_batch=lmi-dist\noption.dtype=fp32\noption.max_rolling_batch_size={BATCH}\n"
        "option.max_model_len=512\noption.num_threads=1\n"
    )


def real_model(folder: Path) -> dict[str, Any]:
    """The 135 M model with this scenario's serving.properties; its shape from config.json and its
    parameter count from the safetensors header."""
    from lmforge.hf.safetensors import read_safetensors_header, weight_files

    write_model(SMOLLM2, folder)
    (folder / "serving.properties").write_text(serving_properties())
    config = json.loads((folder / "config.json").read_text())
    params = sum(t.numel for file in weight_files(folder) for t in read_safetensors_header(file))
    return {"params": params, **{k: config[k] for k in MODEL_SHAPE}, "dtype": "fp32", "name": SMOLLM2}


def build_model(folder: Path) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmforge.models.example import INITIALIZER_RANGE, write_example_model

    write_example_model(folder)
    cfg = LlamaConfig.from_pretrained(folder)
    for key, value in MODEL_SHAPE.items():
        setattr(cfg, key, value)
    cfg.initializer_range = INITIALIZER_RANGE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(folder)
    (folder / "serving.properties").write_text(serving_properties())
    return {"params": sum(p.numel() for p in model.parameters()), **MODEL_SHAPE, "dtype": "fp32"}


# ---------------------------------------------------------------------------------- variants


def run_static(folder: Path, lengths: list[int], repeats: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # ignore EOS, as the continuous side does
    pad = model.config.pad_token_id or 0
    queue = prompts(len(lengths), PROMPT_TOKENS)

    def once() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, len(queue), BATCH):
            batch = queue[i : i + BATCH]
            # equal-length prompts: no padding needed; the mask is all ones
            ids = torch.tensor(batch)
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max(lengths[i : i + BATCH]),
                    do_sample=False,
                    pad_token_id=pad,
                )
            assert out.shape[1] == ids.shape[1] + max(lengths[i : i + BATCH])
        return time.process_time() - c0, time.perf_counter() - t0

    with torch.inference_mode():  # warm-up
        model.generate(torch.tensor(queue[:2]), max_new_tokens=4, do_sample=False, pad_token_id=pad)
    cpu, wall = min(once() for _ in range(repeats))
    return {
        "cpu_seconds": cpu,
        "seconds": wall,
        "useful_tokens": sum(lengths),
        "slot_tokens": static_slots(lengths, BATCH),
    }


def run_continuous(folder: Path, lengths: list[int], repeats: int) -> dict[str, Any]:
    from lmforge.config import load_config
    from lmforge.engines.lmi_dist.engine import LmiDistEngine
    from lmforge.engines.protocol import GenerationRequest, SamplingParams

    queue = prompts(len(lengths), PROMPT_TOKENS)

    async def main() -> tuple[tuple[float, float], int]:
        engine = LmiDistEngine(load_config(folder, env={}).config)
        await engine.start()

        async def one(rid: str, prompt: list[int], n: int) -> int:
            req = GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=n, ignore_eos=True))
            count = 0
            async for event in engine.generate(req):
                count += event.token is not None
                if event.finished and event.finish_reason != "length":
                    raise RuntimeError(f"request {rid} ended with {event.finish_reason}: {event.error}")
            if count != n:
                raise RuntimeError(f"request {rid} produced {count} tokens, expected {n}")
            return count

        try:
            await asyncio.gather(*[one(f"w{i}", p, 4) for i, p in enumerate(queue[:2])])  # warm-up
            best, tokens = (float("inf"), float("inf")), 0
            for r in range(repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                counts = await asyncio.gather(
                    *[one(f"r{r}-{i}", p, n) for i, (p, n) in enumerate(zip(queue, lengths, strict=True))]
                )
                best = min(best, (time.process_time() - c0, time.perf_counter() - t0))
                tokens = sum(counts)
            return best, tokens
        finally:
            await engine.shutdown()

    (cpu, wall), tokens = asyncio.run(main())
    return {"cpu_seconds": cpu, "seconds": wall, "useful_tokens": tokens}


def child(variant: str, kind: str, folder: Path, repeats: int) -> None:
    lengths = workload(kind)
    run = run_static if variant == "static" else run_continuous
    result = run(folder, lengths, repeats)
    print("RESULT " + json.dumps(result), flush=True)


def run_child(variant: str, kind: str, folder: Path, repeats: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "bench.batching",
        "--child",
        variant,
        kind,
        str(folder),
        "--repeats",
        str(repeats),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **ENV})
    if proc.returncode != 0:
        raise RuntimeError(f"{variant}/{kind} failed:\n{proc.stderr[-4000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out: dict[str, Any] = json.loads(line[len("RESULT ") :])
    out["tokens_per_s"] = out["useful_tokens"] / out["seconds"]
    out["tokens_per_cpu_s"] = out["useful_tokens"] / out["cpu_seconds"]
    return out


def main() -> None:
    from lmforge.bench.results import machine, versions

    parser = argparse.ArgumentParser(description="continuous vs static batching, useful tokens/s")
    parser.add_argument(
        "--model",
        choices=("random-27m", SMOLLM2),
        default="random-27m",
        help="random-27m: a random Llama of MODEL_SHAPE; smollm2-135m: the real 135 M model",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workloads", default="equal,varying", help="comma-separated: equal, varying")
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "WORKLOAD", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, kind, folder = args.child
        child(variant, kind, Path(folder), args.repeats)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        model = build_model(folder) if args.model == "random-27m" else real_model(folder)
        print(f"model: {model['params'] / 1e6:.1f} M parameters", flush=True)
        for kind in args.workloads.split(","):
            lengths = workload(kind)
            static = run_child("static", kind, folder, args.repeats)
            continuous = run_child("continuous", kind, folder, args.repeats)
            row = {
                "workload": kind,
                "requests": len(lengths),
                "batch": BATCH,
                "output_tokens": {"min": min(lengths), "max": max(lengths), "total": sum(lengths)},
                "static": static,
                "continuous": continuous,
                "static_slot_use": sum(lengths) / static_slots(lengths, BATCH),
                "ratio": continuous["tokens_per_cpu_s"] / static["tokens_per_cpu_s"],
                "ratio_wall": continuous["tokens_per_s"] / static["tokens_per_s"],
            }
            rows.append(row)
            print(
                f"{kind:8s}: static {static['tokens_per_cpu_s']:6.0f} tok/CPU-s, continuous "
                f"{continuous['tokens_per_cpu_s']:6.0f} tok/CPU-s, ratio {row['ratio']:.2f}x "
                f"(wall clock {row['ratio_wall']:.2f}x; static slot use {row['static_slot_use']:.0%})",
                flush=True,
            )
    varying = next((r for r in rows if r["workload"] == "varying"), rows[-1])
    name = result_name(NAME, args.model if args.model == SMOLLM2 else "tiny")
    out = args.out or RESULTS / f"{name}.json"
    result = {
        "name": name,
        "machine": machine(),
        "versions": versions(),
        "command": "python -m bench.batching" + (f" --model {args.model}" if args.model == SMOLLM2 else ""),
        "model": model,
        "settings": {
            "batch": BATCH,
            "requests": REQUESTS,
            "prompt_tokens": PROMPT_TOKENS,
            "greedy": True,
            "ignore_eos": True,
            "torch_threads": 1,
            "repeats": args.repeats,
        },
        "rows": rows,
        "target": TARGET,
        "ratio": varying["ratio"],
    }
    record.write(out, result, section)
    met = "met" if result["ratio"] >= TARGET else "MISSED"
    print(f"varying lengths: {result['ratio']:.2f}x (target {TARGET:.0f}x: {met}); wrote {out}")


def report(r: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    m, s = r["model"], r["settings"]
    head = (
        "| workload | output tokens (min-max, total) | static tok/CPU-s | continuous tok/CPU-s | ratio "
        "| wall-clock ratio | static slot use |\n| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = [
        f"| {x['workload']} | {x['output_tokens']['min']}-{x['output_tokens']['max']}, "
        f"{x['output_tokens']['total']} | {x['static']['tokens_per_cpu_s']:.0f} "
        f"| {x['continuous']['tokens_per_cpu_s']:.0f} | **{x['ratio']:.2f}x** | {x['ratio_wall']:.2f}x "
        f"| {x['static_slot_use']:.0%} |"
        for x in r["rows"]
    ]
    real = m.get("name") == "smollm2-135m"
    title = ", SmolLM2-135M" if real else ""
    model_text = (
        f"SmolLM2-135M-Instruct ({m['params'] / 1e6:.0f} M parameters, real weights, hidden "
        f"{m['hidden_size']}, {m['num_hidden_layers']} layers, fp32)"
        if real
        else f"""a {m["params"] / 1e6:.0f} M-parameter random Llama (hidden
{m["hidden_size"]}, {m["num_hidden_layers"]} layers, fp32; the example model's tokenizer and recipe: the
0.9 M example model's steps are all Python overhead)"""
    )
    return f"""## Batching: continuous vs static{title} (`bench/batching.py`)

One queue of {s["requests"]} requests ({s["prompt_tokens"]}-token prompts, greedy, EOS ignored so every
request produces exactly its own `max_new_tokens`), all waiting at t=0, batch size {s["batch"]}:
**static** = transformers' `model.generate` on the next {s["batch"]} requests until the longest is done,
then the next {s["batch"]} (what a static-batching server does); **continuous** = LMI-Dist
(`LmiDistEngine` driven directly, `max_rolling_batch_size={s["batch"]}`). Only useful tokens count
(each request's own length). Model: {model_text}, torch on 1 thread, each variant in its own
process, best of {s["repeats"]}. Figure: useful tokens per CPU-second of the process (all threads, so
LMI-Dist's event-loop thread counts too): on a dedicated core that is its throughput, and unlike
wall-clock time it does not move with other jobs on this shared 2-core machine (the wall-clock
ratio of the same runs is beside it). Target >= {r["target"]:.0f}x on varying lengths. Result:
`bench/results/{r.get("name", "batching")}.json`.

{head}{chr(10).join(rows)}

With equal lengths both do the same useful work per step, so the ratio is LMI-Dist's per-step cost
against `generate`'s (paged KV cache, per-request sampler and attention vs one dense padded batch).
With varying lengths a static batch runs as long as its longest request: "static slot use" is the
share of its computed token slots that were useful.
"""


def section(r: dict[str, Any]) -> dict[str, Any]:
    real = r["model"].get("name") == SMOLLM2
    label = ", SmolLM2-135M" if real else ""
    summary = {
        "scenario": f"Batching (varying lengths{label})",
        "figure": f"{r['ratio']:.2f}x",
        "target": f">= {r['target']:.0f}x",
        "ratio": r["ratio"] / r["target"],
    }
    compare = {
        "model": "real" if real else "tiny",
        "rows": [
            [
                f"Batching ({row['workload']} lengths): continuous / static useful tok per CPU-s",
                f"{row['continuous']['tokens_per_cpu_s']:.0f} / {row['static']['tokens_per_cpu_s']:.0f}"
                f" = **{row['ratio']:.2f}x**",
            ]
            for row in r["rows"]
        ],
    }
    return record.section(record.ORDER["batching"] + real, report(r), [summary], compare)


if __name__ == "__main__":
    main()
