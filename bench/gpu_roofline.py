"""LMI-Dist decode throughput on one CUDA GPU vs the memory-bandwidth roofline, batch 1-64.

Decoding one step reads every weight once (the input embedding only for the batch's rows) plus, for
each sequence in the batch, the K and V of its whole context. With the device's copy bandwidth
``BW`` (measured here: a large device-to-device ``copy_``, read + write bytes / time), a step cannot
take less than ``bytes_per_step / BW``, so

    roofline tokens/s = batch * BW / (weight_bytes + batch * context_tokens * kv_bytes_per_token)

where ``context_tokens`` is the average context over the decode (prompt + half the new tokens).
Measured: ``batch`` concurrent requests (``PROMPT`` prompt tokens, ``NEW`` new tokens, EOS ignored)
driven straight into ``LmiDistEngine``; decode tokens/s = tokens after each request's first / the
time from the last first token to the last token. The model is a random-weight Llama with
TinyLlama-1.1B's shape in bf16 (the example model's tokenizer), built on the GPU.

Usage (GPU machine): python bench/gpu_roofline.py [--out bench/results/gpu-roofline.json]
Without a CUDA GPU it says so and exits without measuring or writing anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NAME = "gpu-roofline"
BATCHES = (1, 2, 4, 8, 16, 32, 64)
PROMPT = 128
NEW = 128
#: TinyLlama-1.1B's shape (vocabulary from the example model's tokenizer)
MODEL_SHAPE = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
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


def build_model(folder: Path) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmforge.models.example import write_example_model

    write_example_model(folder)
    cfg = LlamaConfig.from_pretrained(folder)
    for key, value in MODEL_SHAPE.items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder)
    # every weight is read once per step, except the input embedding (only the batch's rows)
    embed = model.get_input_embeddings().weight
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
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
        **MODEL_SHAPE,
        "dtype": "bf16",
    }


async def measure(folder: Path) -> tuple[list[dict[str, Any]], float]:
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
        for batch in BATCHES:
            out = await asyncio.gather(*[one(f"b{batch}-{i}", NEW) for i in range(batch)])
            firsts, lasts, counts = zip(*out, strict=True)
            rate = decode_rate(list(firsts), list(lasts), list(counts))
            rows.append({"batch": batch, "tokens": sum(counts), "decode_tokens_per_s": rate})
            print(f"batch {batch:>3}: {rate:8.0f} decode tok/s", flush=True)
    finally:
        await engine.shutdown()
    return rows, load_s


def main() -> int:
    parser = argparse.ArgumentParser(description="LMI-Dist decode tokens/s vs the memory-bandwidth roofline")
    parser.add_argument("--out", type=Path, default=RESULTS / f"{NAME}.json")
    args = parser.parse_args()
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
        model = build_model(Path(tmp) / "model")
        print(
            f"model: {model['params'] / 1e9:.2f} B parameters, {model['weight_bytes'] / 2**30:.2f} GiB",
            flush=True,
        )
        rows, load_s = asyncio.run(measure(Path(tmp) / "model"))
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
        "name": NAME,
        "device": torch.cuda.get_device_name(0),
        "machine": machine(),
        "versions": versions(),
        "command": "python bench/gpu_roofline.py",
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
