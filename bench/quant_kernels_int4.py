"""Candidate 4-bit weight-only linear kernels on this CPU, before one is chosen for LMI-Dist's GPTQ path.

The same shapes, rows, rounds and weight streaming as :mod:`bench.quant_kernels` (SmolLM2-135M's
linear layers at 1 and 32 rows, one torch thread, fastest of the interleaved rounds). The weights are
int4, symmetric, one scale per group of 64 input channels (compressed-tensors' W4A16 with the group
size that divides SmolLM2's 576 and 1536 input widths), activations float32. The ways:

* ``fp32`` / ``fp32 prepacked``: the float32 baselines (``F.linear``; oneDNN's prepacked weight, what
  LMI-Dist runs on an unquantized model);
* ``int8 W8A8 (served)``: LMI-Dist's W8A8 kernel (fbgemm, per-token by the fixed-range trick), for
  reference;
* ``int4pack fp32``: ``torch.ops.aten._weight_int4pack_mm_for_cpu`` on the weight packed once by
  ``_convert_weight_to_int4pack_for_cpu`` (values 0..15 with 8 subtracted, one (scale, 0) pair per
  group and output channel), float32 activations;
* ``int4pack bf16``: the same kernel with the activations cast to bfloat16 and back (its bf16 path
  uses AVX512-BF16 / AMX where the CPU has them);
* ``int4 lmforge``: lmforge's own W4A16 kernel (``engines/lmi_dist/int4_kernel.c``: the same packed
  int4 values unpacked in registers, bfloat16 input, vdpbf16ps products, float32 sums and output),
  where the CPU has AVX-512 BF16;
* ``int4 unpack + F.linear``: the int4 values unpacked and scaled to float32 at each call, then
  ``F.linear`` (what a loader without an int4 kernel would do per step).

Per way: microseconds per call, speed-up over fp32 and over fp32 prepacked, error (max |y - y_fp32|
over max |y_fp32|, against the float32 product with the dequantized weight, so it measures the kernel,
not the 4-bit rounding) and whether row 0 alone equals row 0 of the batch bit for bit. Writes
bench/results/quant-kernels-int4.json.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.quant_kernels_int4 [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import record
from bench.quant_kernels import ROWS, STREAM_BYTES, table
from bench.quant_kernels import measure as measure_ways

NAME = "quant-kernels-int4"
GROUP = 64
WAYS = (
    "fp32",
    "fp32 prepacked",
    "int8 W8A8 (served)",
    "int4pack fp32",
    "int4pack bf16",
    "int4 lmforge",
    "int4 unpack + F.linear",
)
#: the ways LMI-Dist's GPTQ layers use (lmforge.engines.lmi_dist.cpu_linear.Int4Weight): its own
#: kernel where it runs, else PyTorch's with bfloat16 activations
CHOSEN, FALLBACK = "int4 lmforge", "int4pack bf16"


def _ways(torch: Any, w: Any, rows: int) -> tuple[dict[str, Callable[[Any], Any]], dict[str, Any]]:
    """Each way's call for weight ``w`` (out x in); the int4 ways are checked against the dequantized
    int4 weight (the kernel's error, not the 4-bit rounding's)."""
    import torch.nn.functional as F

    from lmforge.engines.lmi_dist.cpu_linear import Int4Weight, Int8Weight
    from lmforge.quantize.w8a8 import rtn_int8

    n, k = w.shape
    groups = w.view(n, k // GROUP, GROUP)
    scale = groups.abs().amax(-1) / 7.5
    q = torch.round(groups / scale[..., None]).clamp_(-8, 7).view(n, k).to(torch.int8)
    deq = (q.view(n, k // GROUP, GROUP).float() * scale[..., None]).view(n, k)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
    int8 = Int8Weight(*rtn_int8(w))
    int4 = Int4Weight(q, scale, GROUP, dtype=torch.float32)
    int4_bf16 = Int4Weight(q, scale, GROUP, dtype=torch.bfloat16, own_kernel=False)
    int4_own = Int4Weight(q, scale, GROUP)
    nibbles = (q + 8).to(torch.uint8).view(n, k // 2, 2)
    nibbles = (nibbles[..., 0] | (nibbles[..., 1] << 4)).contiguous()

    def unpack(x: Any) -> Any:
        low, high = (nibbles & 15).to(torch.int8), (nibbles >> 4).to(torch.int8)
        values = torch.stack((low, high), -1).view(n, k // GROUP, GROUP).float().sub_(8)
        return F.linear(x, values.mul_(scale[..., None]).view(n, k))

    return {
        "fp32": lambda x: F.linear(x, w),
        "fp32 prepacked": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        "int8 W8A8 (served)": int8,
        "int4pack fp32": int4,
        "int4pack bf16": int4_bf16,
        "int4 lmforge": int4_own,
        "int4 unpack + F.linear": unpack,
    }, {way: deq for way in WAYS if way.startswith("int4")}


def measure(rounds: int) -> list[dict[str, Any]]:
    import torch

    from lmforge.engines.lmi_dist import int4_kernel

    torch.backends.quantized.engine = "x86"  # the W8A8 reference way's fbgemm
    return measure_ways(rounds, _present(int4_kernel.kernel() is not None), _ways)


def _present(own: bool) -> tuple[str, ...]:
    """The ways measured: lmforge's int4 kernel only where it runs."""
    return WAYS if own else tuple(w for w in WAYS if w != "int4 lmforge")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from lmforge.bench.results import machine, versions
    from lmforge.engines.lmi_dist import int4_kernel

    started = time.monotonic()
    rows = measure(args.rounds)
    result = {
        "name": NAME,
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.quant_kernels_int4",
        "settings": {
            "shapes": "SmolLM2-135M's linear layers, random weights (std 0.02)",
            "rows": list(ROWS),
            "group_size": GROUP,
            "torch_threads": 1,
            "rounds": args.rounds,
            "stream_bytes": STREAM_BYTES,
        },
        "chosen": CHOSEN if int4_kernel.kernel() is not None else FALLBACK,
        "rows": rows,
        "machine": machine(),
        "versions": versions(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    record.write(record.RESULTS / f"{NAME}.json", result, section)
    return 0


def report(result: dict[str, Any]) -> str:
    rows_table, error_text = table(result, _present("int4 lmforge" in result["rows"][0]), ".1e")
    notes = f"\n{result['notes']}\n" if result.get("notes") else ""
    return f"""## Int4 weight-only linear kernels on this CPU (`bench/quant_kernels_int4.py`)

SmolLM2-135M's matrix shapes, random weights, int4 in groups of {result["settings"]["group_size"]}, one
thread; microseconds per call (speed-up over fp32 `F.linear`), fastest of {result["settings"]["rounds"]}
interleaved rounds. † = row 0 alone is not bit-equal to row 0 in the batch. Largest error (int4 ways:
against the float32 product with the dequantized weight; the others against fp32): {error_text}.
Chosen for LMI-Dist's GPTQ layers: **{result["chosen"]}** (lmforge's own where the CPU has AVX-512
BF16, else PyTorch's int4 kernel with bfloat16 activations; the latter's float32 path is a slow
fallback). Result: `bench/results/{result["name"]}.json`.

{rows_table}
{notes}"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    return record.section(record.ORDER["quant_kernels"] + 1, report(result))


if __name__ == "__main__":
    sys.exit(main())
