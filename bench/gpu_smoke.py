"""LMI-Dist on one GPU: decode throughput of a ~150 M-parameter random Llama (bf16), varlen attention on.

Usage (on a GPU machine): python -m bench.gpu_smoke [OUT.json] (default:
bench/results/lmi-dist-gpu-smoke.json). Prints and writes tokens/s at several
concurrencies. A smoke test of the engine's GPU path, not the roofline study of the benchmarks issue.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import record


async def main(out_path: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmforge.config import load_config
    from lmforge.engines.lmi_dist.engine import LmiDistEngine
    from lmforge.engines.protocol import GenerationRequest, SamplingParams
    from lmforge.models.example import write_example_model

    tmp = Path(tempfile.mkdtemp())
    model_dir = write_example_model(tmp / "m")
    cfg = LlamaConfig.from_pretrained(model_dir)
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = 1024, 4096, 12
    cfg.num_attention_heads, cfg.num_key_value_heads = 16, 8
    torch.manual_seed(0)
    big = LlamaForCausalLM(cfg).to(torch.bfloat16)
    big.save_pretrained(model_dir)
    params = sum(p.numel() for p in big.parameters())
    (model_dir / "serving.properties").write_text(
        "option.dtype=bf16\noption.max_rolling_batch_size=128\noption.max_model_len=1024\n"
    )
    print(f"built a {params / 1e6:.0f} M-parameter model", flush=True)
    engine = LmiDistEngine(load_config(model_dir, env={}).config)
    t0 = time.perf_counter()
    await engine.start()
    load_s = time.perf_counter() - t0
    print(f"engine started in {load_s:.1f} s", flush=True)
    prompt = list(range(10, 138))  # 128 prompt tokens

    async def one(i: int, n: int) -> int:
        req = GenerationRequest(f"r{i}", prompt, SamplingParams(max_new_tokens=n, ignore_eos=True))
        count = 0
        async for event in engine.generate(req):
            count += event.token is not None
        return count

    rows = []
    await one(-1, 8)
    for conc in (1, 8, 32, 64, 128):
        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*[one(i, 128) for i in range(conc)]))
        dt = time.perf_counter() - t0
        rows.append(
            {"concurrency": conc, "output_tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt}
        )
        print(f"c={conc:>3}: {tokens / dt:8.0f} tok/s ({dt:.2f} s)", flush=True)
    await engine.shutdown()
    result = {
        "name": "lmi-dist-gpu-smoke",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "params": params,
        "dtype": "bf16",
        "prompt_tokens": 128,
        "new_tokens": 128,
        "load_s": load_s,
        "rows": rows,
    }
    record.write(out_path, result, section)


def report(g: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    rows = [f"| {r['concurrency']} | {r['tokens_per_s']:.0f} |" for r in g["rows"]]
    notes = f"\n{g['notes']}\n" if g.get("notes") else ""
    return f"""## LMI-Dist on one GPU (smoke, `bench/gpu_smoke.py`)

One run on a lent {g["device"]} (torch {g["torch"]}): a
{g["params"] / 1e6:.0f} M-parameter random Llama in bf16, {g["prompt_tokens"]}-token prompts,
{g["new_tokens"]} new tokens, engine only. Result: `bench/results/lmi-dist-gpu-smoke.json`.

| concurrency | output tok/s |
| --- | --- |
{chr(10).join(rows)}
{notes}"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    return record.section(record.ORDER["gpu_smoke"], report(result))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else record.RESULTS / "lmi-dist-gpu-smoke.json"))
