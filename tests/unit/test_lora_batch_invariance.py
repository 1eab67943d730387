"""LMI-Dist's adapter deltas are batch-invariant where the C pass runs (float32 on the CPU): a request's
rows get bit-identical deltas alone, beside requests of its own adapter, and in every form of a step
mixing adapters (fused, batched with padded slots, segmented beside a long prompt, more rows than the
fused form takes). A quantized base depends on it: the next int8 layer quantizes each token by its own
scale, so a float32 rounding of the delta can become a whole quantization step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from lmforge.adapters.spec import LoraAdapter, LoraShape
from lmforge.engines.lmi_dist import lora_kernel
from lmforge.engines.lmi_dist.ipc import AdapterRef
from lmforge.engines.lmi_dist.lora import LoraLayers
from lmforge.engines.lmi_dist.sampler import LORA_KWARG

CPU = torch.device("cpu")
N_IN, N_OUT = 576, 328  # SmolLM2-135M's width in; out: 20 x 16 columns, then 8 (a vector loop's tail)
PROBE = 1  # the request followed through every batch: adapter 1 (rank 8), 5 prompt rows


class Zero(torch.nn.Module):
    """A linear layer whose own output is exactly 0 on every row (whatever the batch), so its output
    with adapters is the adapters' delta, bit for bit."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(N_IN, N_OUT, bias=False)
        torch.nn.init.zeros_(self.proj.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)  # type: ignore[no-any-return]


def _adapter(tmp: Path, int_id: int, rank: int) -> LoraAdapter:
    gen = torch.Generator().manual_seed(int_id)
    folder = tmp / f"ad{int_id}"
    folder.mkdir()
    save_file(
        {
            "base_model.model.proj.lora_A.weight": torch.randn(rank, N_IN, generator=gen) * 0.05,
            "base_model.model.proj.lora_B.weight": torch.randn(N_OUT, rank, generator=gen) * 0.05,
        },
        str(folder / "adapter_model.safetensors"),
    )
    return LoraAdapter(
        name=f"ad{int_id}", path=folder, src=str(folder), int_id=int_id, rank=rank, alpha=2.0 * rank,
        scaling=2.0, target_modules=("proj",), layers=(LoraShape("proj", N_IN, N_OUT),),
    )  # fmt: skip


def _step(runtime: LoraLayers, layout: list[tuple[int, int]]) -> None:
    requests: list[Any] = [
        SimpleNamespace(
            state=SimpleNamespace(logit_processor_kwargs={LORA_KWARG: i} if i else {}), query_length=n
        )
        for i, n in layout
    ]
    runtime.on_batch(requests)


#: batches holding the probe's 5 rows (``PROBE``), by what the step does with them
BATCHES = {
    "alone": [(PROBE, 5)],
    "beside its own adapter": [(PROBE, 2), (PROBE, 5), (PROBE, 9)],
    "paired otherwise": [(PROBE, 1), (PROBE, 5)],  # the pass takes rows two by two
    "decode rows of its adapter before it": [(PROBE, 1), (2, 1), (PROBE, 1), (PROBE, 5), (3, 1)],
    "mixed decode, fused": [(2, 1), (PROBE, 5), (3, 1), (0, 1)],
    "padded slots": [(PROBE, 5), (2, 1), (0, 2), (3, 4), (2, 1)],
    "segmented, beside a long prompt": [(3, 1), (2, 40), (0, 3), (PROBE, 5)],
    "more rows than the fused form takes": [(2, 20), (PROBE, 5), (3, 18)],
}


@pytest.fixture
def runtime(tmp_path: Path) -> tuple[Zero, LoraLayers]:
    model = Zero()
    layers = LoraLayers(model, max_cpu_loras=3)
    if not layers.fused:
        pytest.skip("the C LoRA pass is not built here (PyTorch's products are equal only to rounding)")
    for int_id, rank in ((1, 8), (2, 4), (3, 12)):  # ranks 4 and 12 stack the probe's with zero padding
        layers.install(AdapterRef.of(_adapter(tmp_path, int_id, rank)))
    return model, layers


def test_a_requests_delta_is_bit_identical_in_every_batch(runtime: tuple[Zero, LoraLayers]) -> None:
    model, layers = runtime
    gen = torch.Generator().manual_seed(0)
    probe_x = torch.randn(5, N_IN, generator=gen)
    deltas = {}
    for name, layout in BATCHES.items():
        rows = sum(n for _, n in layout)
        x = torch.randn(1, rows + 2, N_IN, generator=gen)  # 2 rows of padding past the step's tokens
        at = 0
        for adapter_id, n in layout:
            if adapter_id == PROBE and n == 5:
                x[0, at : at + 5] = probe_x
                start = at
            at += n
        _step(layers, layout)
        deltas[name] = model(x)[0, start : start + 5]
    alone = deltas.pop("alone")
    assert alone.abs().sum() > 0
    for name, delta in deltas.items():
        assert torch.equal(delta, alone), f"{name}: {(delta - alone).abs().max().item()} off alone"


@pytest.mark.parametrize("portable", [False, True])
def test_the_pass_sums_each_row_alike_whatever_its_rank_padding_and_neighbours(portable: bool) -> None:
    """The C pass on its own: a row's result is the same with its adapter's own rank or a stack's zero
    padded rank, among 1 or 37 rows, at any place; and its two code paths agree bit for bit."""
    if not lora_kernel.usable(CPU, torch.float32):
        pytest.skip("the C LoRA pass is not built here")
    gen = torch.Generator().manual_seed(1)
    n_in, n_out = 579, 330  # the unrolled inputs' tail, and every column loop's (16, 8, then 1 by 1)
    at, bt = torch.randn(n_in, 6, generator=gen), torch.randn(6, n_out, generator=gen)
    padded_at, padded_bt = torch.zeros(n_in, 16), torch.zeros(16, n_out)
    padded_at[:, :6], padded_bt[:6] = at, bt
    own = lora_kernel.AdapterTable([{1: (at, bt)}], (1,), [(n_in, n_out)])
    padded = lora_kernel.AdapterTable([{1: (padded_at, padded_bt)}], (1,), [(n_in, n_out)])
    x = torch.randn(37, n_in, generator=gen)
    base = torch.randn(37, n_out, generator=gen)

    def run(table: lora_kernel.AdapterTable, rows: list[int]) -> torch.Tensor:
        out = base.clone()
        lora_kernel.add(x, out, table, 0, len(rows), torch.tensor(rows))
        return out[4]

    lora_kernel.force_portable(portable)
    try:
        results = [
            run(own, [4]),
            run(padded, [4]),
            run(own, [9, 4, 30]),
            run(padded, [*range(4, 37), 0, 1, 2, 3]),
        ]
    finally:
        lora_kernel.force_portable(False)
    alone = run(own, [4])  # the vector path, where the CPU has one
    for result in results:
        assert torch.equal(result, alone)
    assert not torch.equal(alone, base[4])
