"""LMI-Dist engine throughput with transformers' stock dense CB attention vs lmforge's per-request attention.

Usage: python -m bench.lmi_dist_attention MODEL_DIR. Runs each variant in its own process (the
attention override is process-wide) and writes bench/results/lmi-dist-attention.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import record

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(32, 50, 64), (16, 500, 32), (32, 500, 32)]  # (concurrency, prompt tokens, new tokens)


async def measure(model: Path, varlen: bool) -> list[dict[str, float]]:
    import torch

    from lmforge.config import load_config
    from lmforge.engines.lmi_dist import engine as engine_mod
    from lmforge.engines.protocol import GenerationRequest, SamplingParams

    torch.set_num_threads(1)
    if not varlen:  # keep transformers' own attention: make install() a no-op for this process
        from lmforge.engines.lmi_dist import attention

        attention._INSTALLED = True
    cfg = load_config(model, env={"OPTION_MAX_ROLLING_BATCH_SIZE": "64", "OPTION_NUM_THREADS": "1"}).config
    eng = engine_mod.LmiDistEngine(cfg)
    await eng.start()
    base = eng.tokenizer.encode(Path(os.__file__).read_text(), add_special_tokens=False)
    out = []

    async def one(i: int, plen: int, n: int) -> list[int]:
        ids = base[i * 7 : i * 7 + plen]
        req = GenerationRequest(f"r{i}-{plen}", ids, SamplingParams(max_new_tokens=n, ignore_eos=True))
        return [e.token.id async for e in eng.generate(req) if e.token]

    for conc, plen, n in SHAPES:
        best = 0.0
        for _ in range(2):
            t0 = time.perf_counter()
            results = await asyncio.gather(*[one(i, plen, n) for i in range(conc)])
            best = max(best, conc * n / (time.perf_counter() - t0))
        out.append({"concurrency": conc, "prompt_tokens": plen, "new_tokens": n, "tokens_per_s": best,
                    "outputs": hash(tuple(map(tuple, results)))})  # fmt: skip
    await eng.shutdown()
    return out


def main() -> None:
    model = Path(sys.argv[1])
    if len(sys.argv) > 2:
        print(json.dumps(asyncio.run(measure(model, sys.argv[2] == "varlen"))))
        return
    runs = {}
    for variant in ("stock", "varlen"):
        proc = subprocess.run(
            [sys.executable, "-m", "bench.lmi_dist_attention", str(model), variant],
            capture_output=True, text=True, check=True, cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        runs[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = []
    for stock, varlen in zip(runs["stock"], runs["varlen"], strict=True):
        row = {key: stock[key] for key in ("concurrency", "prompt_tokens", "new_tokens")}
        row["stock_tokens_per_s"] = stock["tokens_per_s"]
        row["varlen_tokens_per_s"] = varlen["tokens_per_s"]
        row["ratio"] = varlen["tokens_per_s"] / stock["tokens_per_s"]
        row["same_tokens"] = stock["outputs"] == varlen["outputs"]
        rows.append(row)
        print(
            f"attention c={row['concurrency']} prompt={row['prompt_tokens']}: "
            f"stock {row['stock_tokens_per_s']:.0f} tok/s, varlen {row['varlen_tokens_per_s']:.0f} tok/s "
            f"({row['ratio']:.2f}x, same tokens: {row['same_tokens']})"
        )
    result = {"name": "lmi-dist-attention", "torch_threads": 1, "rows": rows}
    record.write(record.RESULTS / "lmi-dist-attention.json", result, section)


def report(a: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    head = (
        "| concurrency | prompt tokens | new tokens | stock tok/s | lmforge tok/s | ratio | same tokens |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = [
        f"| {r['concurrency']} | {r['prompt_tokens']} | {r['new_tokens']} | {r['stock_tokens_per_s']:.0f} "
        f"| {r['varlen_tokens_per_s']:.0f} | {r['ratio']:.2f}x | {'yes' if r['same_tokens'] else 'NO'} |"
        for r in a["rows"]
    ]
    notes = f"\n{a['notes']}\n" if a.get("notes") else ""
    return f"""## Per-request attention in LMI-Dist (`bench/lmi_dist_attention.py`)

transformers' continuous batching runs one dense attention of all query tokens against the keys of
all requests on CPU; LMI-Dist attends each request to its own keys
(`lmforge.engines.lmi_dist.attention`) whenever the dense call would waste more than
`WASTE_PER_CALL` products per request, and keeps the single dense call otherwise. Engine only (no
HTTP), greedy, best of 2 runs, each variant in its own process. Result:
`bench/results/lmi-dist-attention.json`.

{head}{chr(10).join(rows)}
{notes}"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    return record.section(record.ORDER["lmi_dist_attention"], report(result))


if __name__ == "__main__":
    main()
