"""LMI-Dist's LoRA layers on a bare linear model (every row gets exactly its own adapter's delta) and
the frontend's adapter slots (waiting, eviction, removal) over those layers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lmforge.adapters.spec import LoraAdapter, LoraShape
from lmforge.engines.lmi_dist.ipc import AdapterRef
from lmforge.engines.lmi_dist.lora import LORA_KWARG, LoraLayers
from lmforge.engines.lmi_dist.lora_slots import LoraSlots
from lmforge.errors import NotFoundError


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)  # type: ignore[no-any-return]


def adapter(tmp: Path, int_id: int, rank: int, seed: int) -> tuple[LoraAdapter, torch.Tensor, torch.Tensor]:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(rank, 16, generator=gen), torch.randn(12, rank, generator=gen)
    folder = tmp / f"ad{int_id}"
    folder.mkdir()
    save_file(
        {"base_model.model.proj.lora_A.weight": a, "base_model.model.proj.lora_B.weight": b},
        str(folder / "adapter_model.safetensors"),
    )
    spec = LoraAdapter(
        name=f"ad{int_id}", path=folder, src=str(folder), int_id=int_id, rank=rank, alpha=2.0 * rank,
        scaling=2.0, target_modules=("proj",), layers=(LoraShape("proj", 16, 12),),
    )  # fmt: skip
    return spec, a, b


class LocalInstaller:
    """The engine core's calls, made directly on the layers (no core process)."""

    def __init__(self, layers: LoraLayers) -> None:
        self.layers = layers

    async def install(self, adapter: LoraAdapter) -> None:
        self.layers.install(AdapterRef.of(adapter))

    async def preload(self, adapter: LoraAdapter) -> None:
        self.layers.host_weights(AdapterRef.of(adapter))

    async def uninstall(self, adapter_id: int) -> None:
        self.layers.uninstall(adapter_id)

    async def forget(self, adapter_id: int) -> None:
        self.layers.forget(adapter_id)


def step(runtime: LoraLayers, ids_and_lengths: list[tuple[int, int]]) -> None:
    requests: list[Any] = [
        SimpleNamespace(
            state=SimpleNamespace(logit_processor_kwargs={LORA_KWARG: i} if i else {}), query_length=n
        )
        for i, n in ids_and_lengths
    ]
    runtime.on_batch(requests)


def test_mixed_steps_single_steps_and_the_per_adapter_path(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Tiny()
    runtime = LoraLayers(model, max_cpu_loras=2)
    ads = [adapter(tmp_path, 1, 4, 1), adapter(tmp_path, 2, 8, 2)]
    for spec, _, _ in ads:
        runtime.install(AdapterRef.of(spec))
    layout = [(1, 3), (0, 2), (2, 1), (1, 1)]  # (adapter id, rows): 7 token rows
    x = torch.randn(1, 7, 16)
    base = torch.nn.functional.linear(x, model.proj.weight, model.proj.bias)[0]
    expected = base.clone()
    row = 0
    for adapter_id, n in layout:
        if adapter_id:
            _, a, b = ads[adapter_id - 1]
            expected[row : row + n] += (x[0, row : row + n] @ a.t()) @ b.t() * 2.0
        row += n
    step(runtime, layout)
    assert torch.allclose(model(x)[0], expected, atol=1e-5)  # stacked path
    runtime.tokens = -1  # e.g. padded rows: the per-adapter path
    assert torch.allclose(model(x)[0], expected, atol=1e-5)
    step(runtime, [(2, 7)])  # one adapter for every row
    _, a, b = ads[1]
    assert torch.allclose(model(x)[0], base + (x[0] @ a.t()) @ b.t() * 2.0, atol=1e-5)
    step(runtime, [(0, 7)])  # base only: untouched
    assert torch.equal(model(x)[0], base)


def test_slots_wait_evict_and_removed_adapters_are_refused(tmp_path: Path) -> None:
    model = Tiny()
    runtime = LoraSlots(LocalInstaller(LoraLayers(model, max_cpu_loras=1)), max_loras=1)
    first, _, _ = adapter(tmp_path, 1, 4, 1)
    second, _, _ = adapter(tmp_path, 2, 4, 2)

    async def scenario() -> None:
        await runtime.acquire(first)
        waiter = asyncio.ensure_future(runtime.acquire(second))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # the only slot is busy
        runtime.release(first)
        await asyncio.wait_for(waiter, 5)  # first evicted, second installed
        assert runtime.stats()["lora_evictions_total"] == 1
        await runtime.remove(second)  # still in use: its weights stay until released
        assert 2 in model.proj._lmforge_lora  # type: ignore[operator]
        runtime.release(second)
        await asyncio.sleep(0.01)  # the uninstall runs as a task
        assert 2 not in model.proj._lmforge_lora  # type: ignore[operator]
        with pytest.raises(NotFoundError):
            await runtime.acquire(second)

    asyncio.run(scenario())
