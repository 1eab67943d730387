"""LMI-Dist decode throughput on one CUDA GPU vs the memory-bandwidth roofline, batch 1-64.

Decoding one step reads every weight once (the input embedding only for the batch's rows) plus, for
each sequence in the batch, the K and V of its whole context. With the device's copy bandwidth
``BW`` (measured here: a large device-to-device ``copy_``, read + write bytes / time), a step cannot
take less than ``bytes_per_step / BW``, so

    roofline tokens/s = batch * BW / (weight_bytes + batch * context_tokens * kv_bytes_per_token)

where ``context_tokens`` is the average context over the decode (prompt + half the new tokens).
Measured: ``batch`` concurrent requests (``PROMPT`` prompt tokens, ``NEW`` new tokens, EOS ignored)
driven straight into ``LmiDistEngine``; decode tokens/s = tokens after each request's first / the
time from the last first token to the last token. The model is a random-weight Llama in bf16 (the
example model's tokenizer), built on the GPU, with the shape of SmolLM2-135M (``--shape
smollm2-135m``, the default: the real example model's architecture; the weights' values do not change
the bytes a step reads) or TinyLlama-1.1B (``--shape tinyllama-1.1b``).

``--profile DIR`` also runs a few decode steps at batch 1 and 32 under the engine core's PyTorch
profiler (:mod:`lmforge.engines.lmi_dist.profiling`: the model runs in that process) and
writes, per batch, the operators by host time and by device time, and the device-busy share of the
wall time (how much of a step the GPU spends computing, the rest being host work it waits for).

Usage (GPU machine): python -m bench.gpu_roofline [--shape S] [--out bench/results/gpu-roofline.json]
[--profile DIR]
Without a CUDA GPU it says so and exits without measuring or writing anything.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import record

ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS
#: issue 17's goal: decode at batch 1 reaches this fraction of the roofline
GOAL_BATCH_1 = 0.60
NAME = "gpu-roofline"
BATCHES = (1, 2, 4, 8, 16, 32, 64)
PROMPT = 128
NEW = 128
#: model shapes (vocabulary from the example model's tokenizer unless given)
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
    },
    "tinyllama-1.1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
    },
}
DTYPE_BYTES = 2  # bf16


# ---------------------------------------------------------------------------------- pure pieces


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V of one token over all layers."""
    from lmforge.engines.lmi_dist.sizing import kv_bytes_per_token as sizing_kv

    return sizing_kv(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, dtype_bytes=dtype_bytes)


def mean_context(prompt: int, new: int) -> float:
    """Average context length over the decode steps (the i-th of ``new`` steps attends prompt + i tokens)."""
    return prompt + (new - 1) / 2


def bytes_per_step(weight_bytes: int, kv_per_token: int, batch: int, context: float) -> float:
    return weight_bytes + batch * context * kv_per_token


def roofline_tokens_per_s(
    weight_bytes: int, kv_per_token: int, batch: int, context: float, bw: float
) -> float:
    """Decode tokens/s if every step were limited by reading its bytes at ``bw`` bytes/s."""
    return batch * bw / bytes_per_step(weight_bytes, kv_per_token, batch, context)


def decode_rate(first: list[float], last: list[float], tokens: list[int]) -> float:
    """Decode tokens/s of a batch: tokens after each request's first, over (last token - last first token)."""
    span = max(last) - max(first)
    decoded = sum(n - 1 for n in tokens)
    return decoded / span if span > 0 else float("nan")


# ---------------------------------------------------------------------------------- GPU


def copy_bandwidth(torch: Any, size_bytes: int = 2**30, repeats: int = 20) -> float:
    """Device copy bandwidth in bytes/s: (read + write) bytes of ``dst.copy_(src)`` / time, best run."""
    src = torch.empty(size_bytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * size_bytes / best


def shape_source(folder: Path, shape: str, config_from: Path | None) -> None:
    """Put the shape's config and tokenizer in ``folder``: SmolLM2-135M's own (from ``config_from``, a
    folder holding its config.json and tokenizer, else the real example model), or the tiny example
    model's tokenizer for the other shapes."""
    if shape != "smollm2-135m":
        from lmforge.models.example import write_example_model

        write_example_model(folder)
        return
    if config_from is None:
        from lmforge.models.smollm2 import write_smollm2_model

        config_from = folder.parent / "smollm2"
        write_smollm2_model(config_from)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (config_from / name).exists():
            shutil.copy(config_from / name, folder / name)


def build_model(folder: Path, shape: str, config_from: Path | None) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape_source(folder, shape, config_from)
    cfg = LlamaConfig.from_pretrained(folder)
    for key, value in SHAPES[shape].items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder)
    # every weight is read once per step, except the input embedding (only the batch's rows) unless
    # it is tied to the output projection, which reads all of it
    embed = model.get_input_embeddings().weight
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if not cfg.tie_word_embeddings:
        weight_bytes -= embed.numel() * embed.element_size()
    params = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    (folder / "serving.properties").write_text(
        f"option.dtype=bf16\noption.max_rolling_batch_size={max(BATCHES)}\noption.max_model_len=1024\n"
    )
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return {
        "params": params,
        "weight_bytes": weight_bytes,
        "kv_bytes_per_token": kv_bytes_per_token(
            cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, DTYPE_BYTES
        ),
        "shape": shape,
        **SHAPES[shape],
        "dtype": "bf16",
    }


async def measure(
    folder: Path, profile: Path | None, batches: tuple[int, ...] = BATCHES
) -> tuple[list[dict[str, Any]], float]:
    from lmforge.config import load_config
    from lmforge.engines.lmi_dist.engine import LmiDistEngine
    from lmforge.engines.protocol import GenerationRequest, SamplingParams

    engine = LmiDistEngine(load_config(folder, env={}).config)
    t0 = time.perf_counter()
    await engine.start()
    load_s = time.perf_counter() - t0
    prompt = [10 + (i % 1900) for i in range(PROMPT)]

    async def one(rid: str, n: int) -> tuple[float, float, int]:
        req = GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=n, ignore_eos=True))
        first = last = 0.0
        count = 0
        async for event in engine.generate(req):
            if event.token is not None:
                count += 1
                last = time.perf_counter()
                first = first or last
        return first, last, count

    rows = []
    try:
        await asyncio.gather(*[one(f"w{i}", 8) for i in range(4)])  # warm-up
        for batch in batches:
            out = await asyncio.gather(*[one(f"b{batch}-{i}", NEW) for i in range(batch)])
            firsts, lasts, counts = zip(*out, strict=True)
            rate = decode_rate(list(firsts), list(lasts), list(counts))
            rows.append({"batch": batch, "tokens": sum(counts), "decode_tokens_per_s": rate})
            print(f"batch {batch:>3}: {rate:8.0f} decode tok/s", flush=True)
        if profile is not None:
            for batch in (1, 32):
                await profiled(
                    engine,
                    lambda b=batch: asyncio.gather(*[one(f"p{b}-{i}", 48) for i in range(b)]),
                    batch,
                    profile,
                )
    finally:
        await engine.shutdown()
    return rows, load_s


async def profiled(engine: Any, run: Any, batch: int, out: Path) -> None:
    """One batch under the engine core's profiler (:mod:`lmforge.engines.lmi_dist.profiling`):
    operator tables and the device-busy share of the wall time."""
    out.mkdir(parents=True, exist_ok=True)
    await engine.start_profile()
    await run()
    summary = await engine.stop_profile(out / f"profile-b{batch}.txt")
    print(
        f"profile batch {batch}: wall {summary['wall_s']:.2f} s, device busy "
        f"{summary['device_busy_s']:.3f} s ({summary['busy_share']:.1%}), "
        f"{summary['kernel_launches']} kernel launches",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="LMI-Dist decode tokens/s vs the memory-bandwidth roofline")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument(
        "--out", type=Path, default=None, help="default bench/results/gpu-roofline-SHAPE.json"
    )
    parser.add_argument("--profile", type=Path, default=None, help="write profiler tables to this folder")
    parser.add_argument(
        "--config-from",
        type=Path,
        default=None,
        help="a folder with SmolLM2-135M's config.json and tokenizer (default: lmforge example-model)",
    )
    parser.add_argument(
        "--batches",
        default=",".join(map(str, BATCHES)),
        help=f"decode batch sizes to measure, comma-separated (at most {max(BATCHES)})",
    )
    args = parser.parse_args()
    batches = tuple(int(b) for b in args.batches.split(","))
    if not batches or min(batches) < 1 or max(batches) > max(BATCHES):
        parser.error(f"--batches: sizes from 1 to {max(BATCHES)}")
    try:
        import torch
    except ImportError:
        print("gpu_roofline: PyTorch is not installed; nothing measured, nothing written", file=sys.stderr)
        return 0
    if not torch.cuda.is_available():
        print("gpu_roofline: no CUDA GPU on this machine; nothing measured, nothing written", file=sys.stderr)
        return 0
    from lmforge.bench.results import machine, versions

    bw = copy_bandwidth(torch)
    print(f"device copy bandwidth: {bw / 1e9:.0f} GB/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", args.shape, args.config_from)
        print(
            f"model: {model['params'] / 1e9:.2f} B parameters, {model['weight_bytes'] / 2**30:.2f} GiB",
            flush=True,
        )
        rows, load_s = asyncio.run(measure(Path(tmp) / "model", args.profile, batches))
    context = mean_context(PROMPT, NEW)
    for row in rows:
        roof = roofline_tokens_per_s(
            model["weight_bytes"], model["kv_bytes_per_token"], row["batch"], context, bw
        )
        row["bytes_per_step"] = bytes_per_step(
            model["weight_bytes"], model["kv_bytes_per_token"], row["batch"], context
        )
        row["roofline_tokens_per_s"] = roof
        row["fraction_of_roofline"] = row["decode_tokens_per_s"] / roof
        print(
            f"batch {row['batch']:>3}: {row['fraction_of_roofline']:.1%} of the roofline ({roof:.0f} tok/s)"
        )
    result = {
        "name": f"{NAME}-{args.shape}",
        "device": torch.cuda.get_device_name(0),
        "machine": machine(),
        "versions": versions(),
        "command": f"python -m bench.gpu_roofline --shape {args.shape}",
        "copy_bandwidth_bytes_per_s": bw,
        "model": model,
        "settings": {
            "prompt_tokens": PROMPT,
            "new_tokens": NEW,
            "mean_context": context,
            "engine_load_s": load_s,
        },
        "rows": rows,
    }
    out = args.out or RESULTS / f"{NAME}-{args.shape}.json"
    record.write(out, result, section)
    return 0


def report(r: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    m = r["model"]
    before = {row["batch"]: row for row in (r.get("before") or {}).get("rows", [])}
    head = (
        "| batch | decode tok/s | roofline tok/s | fraction | bytes/step (MB) | before: tok/s (fraction) |\n"
        "| --- | --- | --- | --- | --- | --- |\n"
    )
    rows = []
    for x in r["rows"]:
        was = before.get(x["batch"])
        then = f"{was['decode_tokens_per_s']:.0f} ({was['fraction_of_roofline']:.1%})" if was else "-"
        rows.append(
            f"| {x['batch']} | {x['decode_tokens_per_s']:.0f} | {x['roofline_tokens_per_s']:.0f} "
            f"| {x['fraction_of_roofline']:.1%} | {x['bytes_per_step'] / 1e6:.0f} | {then} |"
        )
    shape = m.get("shape", "tinyllama-1.1b")
    history = ""
    if r.get("before"):
        history = f"\nBefore: commit {r['before']['commit']}; {r['before']['profile_batch_1']}.\n"
    notes = f"\n{r['notes']}\n" if r.get("notes") else ""
    at1 = next((x["fraction_of_roofline"] for x in r["rows"] if x["batch"] == 1), None)
    verdict = "not measured" if at1 is None else ("met" if at1 >= GOAL_BATCH_1 else "**missed**")
    return f"""## LMI-Dist decode vs the memory-bandwidth roofline (`bench/gpu_roofline.py`)

{r["device"]}, measured copy bandwidth {r["copy_bandwidth_bytes_per_s"] / 1e9:.0f} GB/s; a
{m["params"] / 1e9:.2f} B-parameter random Llama with {shape}'s shape in bf16,
{r["settings"]["prompt_tokens"]}-token prompts, {r["settings"]["new_tokens"]} new tokens. Roofline =
batch x bandwidth / (weight bytes + batch x mean context x KV bytes per token). Result:
`bench/results/{r["name"]}.json`. Goal: >= {GOAL_BATCH_1:.0%} at batch 1 (issue 17): {verdict}.

{head}{chr(10).join(rows)}
{history}{notes}"""


def section(r: dict[str, Any]) -> dict[str, Any]:
    return record.section(record.ORDER["gpu_roofline"], report(r))


if __name__ == "__main__":
    sys.exit(main())
