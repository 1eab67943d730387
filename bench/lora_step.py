"""One LMI-Dist decode step with LoRA adapters, without the engine around it: where the mixed-LoRA
cost of ``bench/lora.py`` goes.

The model as LMI-Dist's engine core sets it up on a CPU with LoRA on: lean decoder layers (q/k/v and
gate/up left separate), prepacked oneDNN weights, and :class:`lmforge.engines.lmi_dist.lora.LoraLayers`
with ``--adapters`` rank-8 adapters (made as ``bench/lora.py`` makes them) installed. One forward of
``--rows`` decode rows over a ``--context``-token static cache is timed for four batches: no adapter
(base), one adapter on every row, and a different adapter on each row (mixed, the adapters' factors
stacked as a real step stacks them), the last once on the fused LoRA pass (``mixed``, what the engine
runs where the pass is built) and once on PyTorch's batched products (``mixed-bmm``, its fallback).
They run in interleaved rounds, order reversed every other round; an overhead is the median over
rounds of (scenario - base of the same round). Then one mixed step runs under ``torch.profiler``, and
the operators' self CPU time per step is kept. Like the engine core, the process asks PyTorch for
transparent huge pages (``THP_MEM_ALLOC_ENABLE=1``).

Attention here is transformers' own over a ``StaticCache`` (the engine's paged attention needs its
scheduler), so the base step is not the engine's TPOT; the LoRA layers and the linear layers are the
engine's own code. Writes bench/results/lora-step-<model>.json.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.lora_step [--model smollm2-135m|tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from bench import record
from bench.lora import write_adapters
from bench.models import DESCRIPTIONS, MODELS, SMOLLM2, result_name, write_model

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as lmi_dist.client starts the engine core
ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS


SCENARIOS = ("base", "one", "mixed", "mixed-bmm")
STEPS_PER_ROUND = 4


def _request(adapter_id: int, lora_kwarg: str) -> Any:
    """What :meth:`LoraLayers.on_batch` reads of a scheduled request: its adapter and its token rows."""
    return types.SimpleNamespace(
        state=types.SimpleNamespace(logit_processor_kwargs={lora_kwarg: adapter_id}), query_length=1
    )


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, StaticCache

    from lmforge.adapters.validate import check_weights, read_config, scaling_of
    from lmforge.bench.results import machine, versions
    from lmforge.engines.lmi_dist import lean_layers
    from lmforge.engines.lmi_dist.cpu_linear import prepack
    from lmforge.engines.lmi_dist.ipc import AdapterRef
    from lmforge.engines.lmi_dist.lora import LORA_KWARG, LoraLayers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default=SMOLLM2)
    parser.add_argument("--adapters", type=int, default=8, help="distinct adapters in the mixed batch")
    parser.add_argument("--rows", type=int, default=8, help="decode rows per step (at least --adapters)")
    parser.add_argument("--context", type=int, default=64, help="tokens already in each row's cache")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.rows < args.adapters or args.adapters < 2:
        parser.error("--adapters must be at least 2 and at most --rows")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_model(args.model, Path(tmp) / "model")
        adapter_dirs = write_adapters(folder, Path(tmp) / "adapters", args.adapters)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        lean_layers.install(model, fuse=False)  # as the engine core does with LoRA on
        prepack(model, 32)
        lora = LoraLayers(model, args.adapters)
        for i, path in enumerate(adapter_dirs, 1):  # read as the adapter registry reads them
            config = read_config(path, max_rank=64)
            layers, _ = check_weights(path, config, lora.layers())
            modules = tuple(layer.module for layer in layers)
            lora.install(AdapterRef(i, path.name, str(path), scaling_of(config), modules))
    batches = {
        "base": [_request(0, LORA_KWARG)] * args.rows,
        "one": [_request(1, LORA_KWARG)] * args.rows,
        "mixed": [_request(1 + i % args.adapters, LORA_KWARG) for i in range(args.rows)],
    }
    batches["mixed-bmm"] = batches["mixed"]
    fused = lora.fused
    tokens = torch.randint(0, 1000, (args.rows, args.context))
    step_tokens = torch.randint(0, 1000, (args.rows, 1))
    # a static cache: every step writes the same slot after the context, so steps stay alike
    cache = StaticCache(config=model.config, max_cache_len=args.context + 1)
    position = torch.tensor([args.context])
    with torch.no_grad():
        lora.on_batch(batches["base"])
        model(tokens, past_key_values=cache, use_cache=True, cache_position=torch.arange(args.context))

        def step(name: str) -> None:
            lora.fused = fused and name != "mixed-bmm"
            lora.on_batch(batches[name])
            model(step_tokens, past_key_values=cache, use_cache=True, cache_position=position)
            for layer in cache.layers:  # the next step writes the same slot again
                layer.cumulative_length.fill_(args.context)

        ms: dict[str, list[float]] = {name: [] for name in SCENARIOS}
        for r in range(args.rounds):
            for name in SCENARIOS if r % 2 == 0 else SCENARIOS[::-1]:
                step(name)
                started = time.perf_counter()
                for _ in range(STEPS_PER_ROUND):
                    step(name)
                ms[name].append((time.perf_counter() - started) / STEPS_PER_ROUND * 1000)
        step("mixed")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(STEPS_PER_ROUND):
                step("mixed")
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
    base = statistics.median(ms["base"])
    overhead = {
        name: statistics.median(x - b for x, b in zip(ms[name], ms["base"], strict=True))
        for name in SCENARIOS[1:]
    }
    for name in SCENARIOS:
        extra = "" if name == "base" else f"  {overhead[name]:+.2f} ms ({overhead[name] / base:+.1%})"
        print(f"{name:>5}: {statistics.median(ms[name]):7.2f} ms per step{extra}")
    result = {
        "name": result_name("lora-step", args.model),
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.lora_step"
        + ("" if args.model == SMOLLM2 else f" --model {args.model}"),
        "machine": machine(),
        "versions": versions(),
        "model": f"{DESCRIPTIONS[args.model]}, rank-8 adapters on 7 projections",
        "settings": {
            "adapters": args.adapters,
            "rows": args.rows,
            "context": args.context,
            "rounds": args.rounds,
            "steps_per_round": STEPS_PER_ROUND,
            "torch_threads": 1,
            "fused_lora_pass": fused,
        },
        "step_ms": {name: statistics.median(values) for name, values in ms.items()},
        "step_ms_rounds": {name: [round(v, 3) for v in values] for name, values in ms.items()},
        "overhead_ms": overhead,
        "overhead_fraction_of_base": {name: value / base for name, value in overhead.items()},
        "mixed_step_operators_self_cpu_ms": {
            e.key: round(e.self_cpu_time_total / 1000 / STEPS_PER_ROUND, 3) for e in ops
        },
    }
    out = args.out or RESULTS / f"{result['name']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
