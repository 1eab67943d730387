"""Candidate int8 linear kernels on this CPU, before one is chosen for LMI-Dist's W8A8 path.

SmolLM2-135M's matrix shapes (in x out: the fused q/k/v 576x960 and gate/up 576x3072 LMI-Dist runs,
o 576x576, the k/v 576x192 alone, down 1536x576, gate/up 576x1536 alone, the 49152-row LM head) at
1 and 32 rows, one torch thread. Each way runs over enough copies of the weight that its int8 bytes
exceed twice the last-level cache (a decode step streams its weights from memory; one weight called
again and again would sit in cache), the ways interleaved round by round; the figure is the fastest
round's mean per call (the machine is shared: the least-disturbed round is the best estimate).

The ways:

* ``fp32``: ``F.linear`` on the float32 weight;
* ``fp32 prepacked``: LMI-Dist's float32 path, oneDNN's prepacked weight (``torch.ops.mkldnn``);
* ``bf16``: ``F.linear`` in bfloat16 (input and output cast);
* ``int8 dynamic per-tensor``: ``torch.ops.quantized.linear_dynamic`` on x86/fbgemm-prepacked
  per-channel int8 weights: one activation scale for the whole batch (so a row's answer depends on
  the other rows: refused for serving, which must give the same answer alone and in a crowd);
* ``int8 per-token oneDNN``: activations quantized per row (symmetric int8, shifted to uint8 with
  zero point 128), ``torch.ops.onednn.qlinear_pointwise`` on a oneDNN-prepacked int8 weight with the
  per-channel weight scales, float32 out, times the row's scale. The integer sums are exact, so a row
  gets the same bits alone or in a batch;
* ``int8 per-token fbgemm, fixed range``: each row divided by its largest magnitude, one constant
  row (-1, 1, 0, ...) appended, then fbgemm's dynamic linear: its per-tensor range is then always
  [-1, 1], so every row is quantized with the same parameters (per-token in effect), and the output
  rows are multiplied back by their magnitudes;
* ``int8 per-token _int_mm``: the same activations (int8), ``torch._int_mm`` on the plain int8 weight
  (no prepacking; it needs more than 16 rows, so one row is padded);
* ``int8 weight-only``: ``torch.ops.aten._weight_int8pack_mm`` (float32 activations);
* ``int8 per-token lmforge``: lmforge's own kernel (``engines/lmi_dist/int8_kernel.c``): the weight
  packed once in the order its loop reads it, each row quantized by its own scale in C, exact int32
  sums with AVX-512 VNNI (its portable C loop on a CPU without VNNI: slow, left out of the choice there).

Per way: microseconds per call, speed-up over fp32 and over fp32 prepacked, error (max |y - y_fp32|
over max |y_fp32|, random weights of a real model's scale) and whether row 0 alone equals row 0 of
the batch bit for bit. Writes bench/results/quant-kernels.json.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.quant_kernels [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import record

NAME = "quant-kernels"
#: (in, out, what)
SHAPES = [
    (576, 960, "q/k/v fused"),
    (576, 576, "o (and q alone)"),
    (576, 192, "k or v alone"),
    (576, 1536, "gate or up alone"),
    (576, 3072, "gate/up fused"),
    (1536, 576, "down"),
    (576, 49152, "LM head"),
]
ROWS = (1, 32)
#: int8 bytes each way streams per round (2x the 32 MiB L3 of this machine kind)
STREAM_BYTES = 64 << 20
WAYS = (
    "fp32",
    "fp32 prepacked",
    "bf16",
    "int8 dynamic per-tensor",
    "int8 per-token oneDNN",
    "int8 per-token fbgemm, fixed range",
    "int8 per-token _int_mm",
    "int8 weight-only",
    "int8 per-token lmforge",
)
#: the way LMI-Dist's W8A8 layers use on one thread with AVX-512 VNNI
#: (lmforge.engines.lmi_dist.cpu_linear.Int8Weight; fbgemm's fixed-range way elsewhere)
CHOSEN = "int8 per-token lmforge"


#: a scenario's kernels for one weight ``w`` (out x in) at ``rows``: each way's call, and for the ways not
#: checked against ``w`` itself the weight their error is measured against
Ways = Callable[[Any, Any, int], tuple[dict[str, Callable[[Any], Any]], dict[str, Any]]]


def _ways(torch: Any, w: Any, rows: int) -> tuple[dict[str, Callable[[Any], Any]], dict[str, Any]]:
    """Each way's call for weight ``w`` (out x in), as a function of the float32 input."""
    import torch.nn.functional as F

    n, k = w.shape
    scale = w.abs().amax(1).clamp(min=1e-12) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
    w16 = w.bfloat16()
    torch.backends.quantized.engine = "x86"
    qw = torch.quantize_per_channel(w, scale.double(), torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    dyn = torch.ops.quantized.linear_prepack(qw, None)
    onednn = torch.ops.onednn.qlinear_prepack(q, [rows, k])
    zeros = torch.zeros(n, dtype=torch.long)
    qt = q.t()
    pack8 = q.contiguous()
    own = _own_kernel().pack(q, scale.float())

    def per_token(x: Any) -> tuple[Any, Any]:
        s = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
        return torch.round(x / s).clamp_(-127, 127), s

    def onednn_call(x: Any) -> Any:
        xq, s = per_token(x)
        y = torch.ops.onednn.qlinear_pointwise(
            xq.add_(128).to(torch.uint8), 1.0, 128, onednn, scale, zeros, None, 1.0, 0,
            torch.float32, "none", [], "",
        )  # fmt: skip
        return y.mul_(s)

    sentinel = torch.zeros(1, k)
    sentinel[0, 0], sentinel[0, 1] = -1.0, 1.0

    def fixed_range(x: Any) -> Any:
        s = x.abs().amax(-1, keepdim=True).clamp(min=1e-12)
        y = torch.ops.quantized.linear_dynamic(torch.cat((x / s, sentinel)), dyn, False)
        return y[: x.shape[0]].mul_(s)

    def int_mm(x: Any) -> Any:
        xq, s = per_token(x)
        x8 = xq.to(torch.int8)
        m = x8.shape[0]
        if m <= 16:
            x8 = F.pad(x8, (0, 0, 0, 17 - m))
        return torch._int_mm(x8, qt)[:m].float().mul_(s).mul_(scale)

    return {
        "fp32": lambda x: F.linear(x, w),
        "fp32 prepacked": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        "bf16": lambda x: F.linear(x.bfloat16(), w16).float(),
        "int8 dynamic per-tensor": lambda x: torch.ops.quantized.linear_dynamic(x, dyn, False),
        "int8 per-token oneDNN": onednn_call,
        "int8 per-token fbgemm, fixed range": fixed_range,
        "int8 per-token _int_mm": int_mm,
        "int8 weight-only": lambda x: torch.ops.aten._weight_int8pack_mm(x, pack8, scale),
        "int8 per-token lmforge": lambda x: own(x, None),
    }, {}


def _own_kernel() -> Any:
    from lmforge.engines.lmi_dist import int8_kernel, lora_kernel

    lib, why = lora_kernel.library()
    if lib is None:
        raise SystemExit(f"lmforge's C library: {why} (make install builds it)")
    return int8_kernel.Kernel(lib)


def measure(rounds: int, ways: tuple[str, ...] = WAYS, make: Ways = _ways) -> list[dict[str, Any]]:
    """Each way of ``make`` on every shape and row count: microseconds per call (fastest of the
    interleaved rounds, weights streamed from memory), speed-ups, error and row invariance."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(0)
    out = []
    for k, n, what in SHAPES:
        copies = max(1, -(-STREAM_BYTES // (k * n)))
        for rows in ROWS:
            weights = [torch.randn(n, k) * 0.02 for _ in range(copies)]
            made = [make(torch, w, rows) for w in weights]
            calls = [m[0] for m in made]
            x = torch.randn(rows, k)
            best = {way: float("inf") for way in ways}
            for _ in range(rounds + 1):  # the first round warms up
                for way in ways:
                    t0 = time.perf_counter()
                    for c in calls:
                        c[way](x)
                    best[way] = min(best[way], (time.perf_counter() - t0) / copies)
            ref = calls[0]["fp32"](x)
            refs = {way: F.linear(x, weight) for way, weight in made[0][1].items()}
            row: dict[str, Any] = {"in": k, "out": n, "what": what, "rows": rows, "copies": copies}
            for way in ways:
                y = calls[0][way](x)
                alone = calls[0][way](x[:1])
                against = refs.get(way, ref)
                row[way] = {
                    "us": round(best[way] * 1e6, 1),
                    "vs_fp32": round(best["fp32"] / best[way], 2),
                    "vs_prepacked": round(best["fp32 prepacked"] / best[way], 2),
                    "error": float(((y - against).abs().max() / against.abs().max()).item()),
                    "row_invariant": bool(torch.equal(alone[0], y[0])),
                }
            out.append(row)
            print(
                f"{k}x{n} ({what}) rows {rows}: " + ", ".join(f"{w} {row[w]['us']:.0f}us" for w in ways),
                flush=True,
            )
            del weights, calls, made
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from lmforge.bench.results import machine, versions

    started = time.monotonic()
    rows = measure(args.rounds)
    result = {
        "name": NAME,
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.quant_kernels",
        "settings": {
            "shapes": "SmolLM2-135M's linear layers, random weights (std 0.02)",
            "rows": list(ROWS),
            "torch_threads": 1,
            "rounds": args.rounds,
            "stream_bytes": STREAM_BYTES,
        },
        "chosen": CHOSEN,
        "rows": rows,
        "machine": machine(),
        "versions": versions(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    record.write(record.RESULTS / f"{NAME}.json", result, section)
    return 0


def table(result: dict[str, Any], ways: tuple[str, ...], error_format: str) -> tuple[str, str]:
    """The markdown table of a kernels result (microseconds, speed-up over fp32, † where a row is not
    the same alone and in the batch) and each way's largest error as text."""
    head = ["shape (in x out)", "rows", *ways]
    lines = []
    for r in result["rows"]:
        cells = [f"{r['in']}x{r['out']} ({r['what']})", str(r["rows"])]
        for way in ways:
            f = r[way]
            mark = "" if f["row_invariant"] else " †"
            cells.append(f"{f['us']:.0f} ({f['vs_fp32']:.2f}x){mark}")
        lines.append(cells)
    errors = {way: max(r[way]["error"] for r in result["rows"]) for way in ways}
    error_text = ", ".join(f"{way} {e:{error_format}}" for way, e in errors.items())
    return record.table(head, lines), error_text


def report(result: dict[str, Any]) -> str:
    rows_table, error_text = table(result, WAYS, ".3f")
    notes = f"\n{result['notes']}\n" if result.get("notes") else ""
    return f"""## Int8 linear kernels on this CPU (`bench/quant_kernels.py`)

SmolLM2-135M's matrix shapes, random weights, one thread; microseconds per call (speed-up over fp32
`F.linear`), each way streaming its weights from memory (copies worth 2x the last-level cache), the
fastest of {result["settings"]["rounds"]} interleaved rounds. † = row 0 alone is not bit-equal to row 0 in
the batch: float rounding (~1e-7) for the float ways, a different quantization of the row (~1e-2, a
request's tokens would depend on its neighbours) for per-tensor int8. Largest error vs fp32 (max abs
over max abs of the fp32 output): {error_text}.
Chosen for LMI-Dist's W8A8 layers: **{result["chosen"]}** (the fastest way that gives a row
the same bits alone and in a batch, and the per-token scheme compressed-tensors' W8A8 checkpoints
declare), where the CPU has AVX-512 VNNI and the engine one thread; fbgemm's fixed-range way
elsewhere. Result: `bench/results/{result["name"]}.json`.

{rows_table}
{notes}"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    return record.section(record.ORDER["quant_kernels"], report(result))


if __name__ == "__main__":
    sys.exit(main())
