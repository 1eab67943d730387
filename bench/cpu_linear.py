"""The linear layers of one decode step on a CPU: ``F.linear`` vs prepacked oneDNN weights.

Every linear layer of SmolLM2-135M's shape (30 layers of q, k, v, o, gate, up, down, then the tied
49 k-row LM head), random fp32 weights, one torch thread, run in model order for 1, 8 and 32 rows, as
LMI-Dist's decode step runs them (weights read from memory, not from cache, as in a real step). Three
ways: ``F.linear`` for all, prepacked for all, and prepacked from ``MIN_ELEMENTS`` up (what
:mod:`lmforge.engines.lmi_dist.cpu_linear` does). Writes bench/results/cpu-linear.json.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.cpu_linear
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import record

ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS
#: (in, out) of one decoder layer's linears, SmolLM2-135M
LAYER = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
LAYERS = 30
LM_HEAD = (576, 49152)
ROWS = (1, 8, 32)


def main() -> int:
    import torch
    import torch.nn.functional as F

    from lmforge.bench.results import machine, versions
    from lmforge.engines.lmi_dist.cpu_linear import MIN_ELEMENTS

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shapes = [*LAYER * LAYERS, LM_HEAD]
    weights = [torch.randn(n, k) for k, n in shapes]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in weights]
    ways = {"F.linear": float("inf"), "prepacked": 0, "prepacked from MIN_ELEMENTS": MIN_ELEMENTS}
    rows_out: list[dict[str, Any]] = []
    for m in ROWS:
        inputs = {k: torch.randn(m, k) for k in (576, 1536)}
        row: dict[str, Any] = {"rows": m}
        for way, threshold in ways.items():
            use = [w.numel() >= threshold for w in weights]

            def step(use: list[bool] = use, inputs: dict[int, Any] = inputs) -> None:
                for i, w in enumerate(weights):
                    x = inputs[w.shape[1]]
                    if use[i]:
                        torch.ops.mkldnn._linear_pointwise(x, packed[i], None, "none", [], "")
                    else:
                        F.linear(x, w)

            step()
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            row[way] = statistics.median(times) * 1000
        row["speedup"] = row["F.linear"] / row["prepacked from MIN_ELEMENTS"]
        rows_out.append(row)
        print(
            f"{m:>2} rows: F.linear {row['F.linear']:.1f} ms, prepacked {row['prepacked']:.1f} ms, "
            f"from MIN_ELEMENTS {row['prepacked from MIN_ELEMENTS']:.1f} ms ({row['speedup']:.2f}x)",
            flush=True,
        )
    result = {
        "name": "cpu-linear",
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.cpu_linear",
        "settings": {"shape": "SmolLM2-135M linears (30 layers + tied LM head), fp32", "torch_threads": 1},
        "rows": rows_out,
        "machine": machine(),
        "versions": versions(),
    }
    out = RESULTS / "cpu-linear.json"
    record.write(out, result, section)
    return 0


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    lines = "\n".join(
        f"| {r['rows']} | {r['F.linear']:.1f} | {r['prepacked']:.1f} "
        f"| {r['prepacked from MIN_ELEMENTS']:.1f} | {r['speedup']:.2f}x |"
        for r in result["rows"]
    )
    return f"""## CPU linear layers: F.linear vs prepacked oneDNN weights (`bench/cpu_linear.py`)

All linear layers of one decode step of SmolLM2-135M's shape (fp32, one thread, model order), ms.
LMI-Dist prepacks from 256 k elements up (`lmforge.engines.lmi_dist.cpu_linear`). Result:
`bench/results/cpu-linear.json`.

| rows | F.linear | prepacked, all | prepacked from 256 k elements | speed-up |
| --- | --- | --- | --- | --- |
{lines}
"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    return record.section(record.ORDER["cpu_linear"], report(result))


if __name__ == "__main__":
    sys.exit(main())
