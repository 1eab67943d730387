"""LMI-Dist's LoRA layers on a bare linear model (every row gets exactly its own adapter's delta) and
the frontend's adapter slots (waiting, eviction, removal) over those layers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from lmforge.adapters.spec import LoraAdapter, LoraShape
from lmforge.engines.lmi_dist.ipc import AdapterRef
from lmforge.engines.lmi_dist.lora import LoraLayers
from lmforge.engines.lmi_dist.lora_mixed import plan, step_key
from lmforge.engines.lmi_dist.lora_slots import LoraSlots
from lmforge.engines.lmi_dist.sampler import LORA_KWARG
from lmforge.errors import NotFoundError


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 12)
        self.side = torch.nn.Linear(16, 12)  # only adapters made with targets=("proj", "side") touch it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)  # type: ignore[no-any-return]


def adapter(
    tmp: Path, int_id: int, rank: int, seed: int, targets: tuple[str, ...] = ("proj",)
) -> tuple[LoraAdapter, torch.Tensor, torch.Tensor]:
    """An adapter of ``rank`` on ``targets`` (scaling 2); returns it and its ``proj`` factors."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for target in targets:
        tensors[f"base_model.model.{target}.lora_A.weight"] = torch.randn(rank, 16, generator=gen)
        tensors[f"base_model.model.{target}.lora_B.weight"] = torch.randn(12, rank, generator=gen)
    folder = tmp / f"ad{int_id}"
    folder.mkdir()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    spec = LoraAdapter(
        name=f"ad{int_id}", path=folder, src=str(folder), int_id=int_id, rank=rank, alpha=2.0 * rank,
        scaling=2.0, target_modules=targets, layers=tuple(LoraShape(t, 16, 12) for t in targets),
    )  # fmt: skip
    a = tensors["base_model.model.proj.lora_A.weight"]
    b = tensors["base_model.model.proj.lora_B.weight"]
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


def expected_output(
    linear: torch.nn.Linear, x: torch.Tensor, layout: list[tuple[int, int]], factors: dict[int, Any]
) -> torch.Tensor:
    """Row by row: the base output plus, on each row with an adapter, ``(x A^T)(2 B)^T`` of its own."""
    want = torch.nn.functional.linear(x, linear.weight, linear.bias)[0]
    row = 0
    for adapter_id, n in layout:
        if adapter_id in factors:
            a, b = (t.to(x.device) for t in factors[adapter_id])
            want[row : row + n] += (x[0, row : row + n] @ a.t()) @ b.t() * 2.0
        row += n
    return want


LAYOUTS = {
    # (adapter id, token rows) per request in batch order, and the form of the step
    "decode, distinct adapters": ([(2, 1), (1, 1), (3, 1)], "batched, no gather"),
    "prefills of equal length": ([(3, 3), (1, 3)], "batched, no gather"),
    "one adapter twice, apart": ([(1, 1), (2, 1), (1, 1)], "batched, padded"),
    "base rows between": ([(1, 3), (0, 2), (2, 1), (1, 1)], "batched, padded"),
    "long prefill, in order": ([(1, 12), (2, 1), (3, 1)], "segmented, no gather"),
    "long prefill, base rows": ([(2, 1), (1, 12), (0, 1), (3, 1)], "segmented"),
}
FORMS = {  # (batched, no gather, padded slots)
    "batched, no gather": (True, True, False),
    "batched, padded": (True, False, True),
    "segmented, no gather": (False, True, False),
    "segmented": (False, False, False),
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def on(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    return torch.device(device)


def layers(model: torch.nn.Module, max_cpu_loras: int, path: str = "fused") -> LoraLayers:
    """LoRA layers on ``model`` whose decode steps take ``path``: the fused pass (where it is built:
    the CPU) or PyTorch's batched products."""
    runtime = LoraLayers(model, max_cpu_loras)
    if path == "batched":
        runtime.fused = False
    return runtime


PATHS = ["fused", "batched"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_row_gets_exactly_its_own_adapter(tmp_path: Path, name: str, device: str, path: str) -> None:
    """Each form of a mixed step (ranks 4 and 8 stacked together; adapter 3 also on ``side``, which
    the others leave alone), on the fused pass and on the batched products, equals the row-by-row
    reference; rows past the step's tokens (padding) get nothing."""
    layout, form = LAYOUTS[name]
    torch.manual_seed(0)
    model = Tiny().to(on(device))
    runtime = layers(model, 3, path)
    if path == "fused" and not runtime.fused:
        pytest.skip("the fused LoRA pass is for the CPU" if device != "cpu" else "not built here")
    specs = [
        adapter(tmp_path, 1, 4, 1),
        adapter(tmp_path, 2, 8, 2),
        adapter(tmp_path, 3, 8, 3, ("proj", "side")),
    ]
    for spec, _, _ in specs:
        runtime.install(AdapterRef.of(spec))
    proj = {spec.int_id: (a, b) for spec, a, b in specs}
    side_raw = load_file(str(specs[2][0].path / "adapter_model.safetensors"))
    side = {
        3: (side_raw["base_model.model.side.lora_A.weight"], side_raw["base_model.model.side.lora_B.weight"])
    }
    tokens = sum(n for _, n in layout)
    step(runtime, layout)
    assert runtime.step is not None
    plan = runtime.step
    batched, in_order, padded = FORMS[form]
    assert plan.fused == (batched and runtime.fused)
    if plan.fused:
        assert plan.index is None and plan.keep is None and (plan.rows is None) == in_order
        assert plan.rows is None or (plan.rows.tolist().count(-1) > 0) == padded
    else:
        assert (plan.slots > 0, plan.index is None, plan.keep is not None) == FORMS[form]
    x = torch.randn(1, tokens + 2, 16, device=device)  # 2 rows of padding past the step's tokens
    for linear, factors in ((model.proj, proj), (model.side, side)):
        want = expected_output(linear, x, [*layout, (0, 2)], factors)
        assert torch.allclose(linear(x)[0], want, atol=1e-5), linear


@pytest.mark.parametrize("device", DEVICES)
def test_small_ranks_in_the_segmented_form(tmp_path: Path, device: str) -> None:
    """Ranks 1 and 2 are padded to 16 bytes in the stack (grouped_mm refuses narrower strides)."""
    model = Tiny().to(on(device))
    runtime = LoraLayers(model, max_cpu_loras=3)
    specs = [adapter(tmp_path, 1, 1, 1), adapter(tmp_path, 2, 2, 2), adapter(tmp_path, 3, 1, 3)]
    for spec, _, _ in specs:
        runtime.install(AdapterRef.of(spec))
    layout = [(0, 1), (2, 9), (1, 1), (3, 1)]
    step(runtime, layout)
    assert runtime.step is not None and runtime.step.slots == 0
    x = torch.randn(1, 12, 16, device=device)
    want = expected_output(model.proj, x, layout, {spec.int_id: (a, b) for spec, a, b in specs})
    assert torch.allclose(model(x)[0], want, atol=1e-5)


def test_single_adapter_steps_and_base_steps(tmp_path: Path) -> None:
    model = Tiny()
    runtime = LoraLayers(model, max_cpu_loras=2)
    spec, a, b = adapter(tmp_path, 2, 8, 2)
    runtime.install(AdapterRef.of(spec))
    x = torch.randn(1, 7, 16)
    base = torch.nn.functional.linear(x, model.proj.weight, model.proj.bias)[0]
    step(runtime, [(2, 7)])  # one adapter for every row
    assert runtime.single == 2 and runtime.step is None
    assert torch.allclose(model(x)[0], base + (x[0] @ a.t()) @ b.t() * 2.0, atol=1e-5)
    step(runtime, [(0, 7)])  # base only: untouched
    assert torch.equal(model(x)[0], base)


def test_a_reinstalled_adapter_is_never_served_from_a_stale_stack(tmp_path: Path) -> None:
    """A late step naming an evicted adapter adds nothing for its rows; once that adapter is back,
    the same set of adapters is stacked again with its weights (not the stale stack without them)."""
    model = Tiny()
    runtime = LoraLayers(model, max_cpu_loras=2)
    specs = [adapter(tmp_path, 1, 4, 1), adapter(tmp_path, 2, 8, 2)]
    for spec, _, _ in specs:
        runtime.install(AdapterRef.of(spec))
    factors = {spec.int_id: (a, b) for spec, a, b in specs}
    layout = [(1, 1), (2, 1)]
    x = torch.randn(1, 2, 16)
    step(runtime, layout)
    assert torch.allclose(model(x)[0], expected_output(model.proj, x, layout, factors), atol=1e-5)
    runtime.uninstall(2)
    step(runtime, layout)  # a cancelled request's last step
    assert torch.allclose(model(x)[0], expected_output(model.proj, x, layout, {1: factors[1]}), atol=1e-5)
    runtime.install(AdapterRef.of(specs[1][0]))
    step(runtime, layout)
    assert torch.allclose(model(x)[0], expected_output(model.proj, x, layout, factors), atol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_sets_of_adapters_coming_and_going_copy_little_and_stay_exact(tmp_path: Path, path: str) -> None:
    """As requests join and leave, the step's set of adapters changes. On the batched products each
    new set is stacked in the buffer of the oldest one dropped (no fresh allocation per change); on
    the fused pass nothing is stacked: the step reads the adapters' host copies where they are. Either
    way every step still gives each row exactly its own adapter's delta."""
    model = Tiny()
    runtime = layers(model, 4, path)
    if path == "fused" and not runtime.fused:
        pytest.skip("the fused LoRA pass is not built here")
    specs = [adapter(tmp_path, i, 4 * i, i, ("proj", "side")) for i in (1, 2, 3)]
    for spec, _, _ in specs:
        runtime.install(AdapterRef.of(spec))
    factors = {spec.int_id: (a, b) for spec, a, b in specs}
    host = {
        t.data_ptr()
        for spec, _, _ in specs
        for pair in runtime.host_weights(AdapterRef.of(spec)).values()
        for t in pair
    }
    buffers = set()
    for layout in ([(1, 1), (2, 1)], [(2, 1), (3, 1)], [(3, 2), (1, 1)], [(1, 1), (2, 1)], [(1, 1), (3, 1)]):
        step(runtime, layout)
        if path == "batched":
            buffers.add(runtime._stacks[next(reversed(runtime._stacks))][2].data_ptr())  # type: ignore[union-attr]
        else:
            assert runtime.adapters is not None and not runtime._stacks
            assert {t.data_ptr() for pair in runtime.adapters.factors for t in pair} <= host
        x = torch.randn(1, sum(n for _, n in layout), 16)
        assert torch.allclose(model(x)[0], expected_output(model.proj, x, layout, factors), atol=1e-5)
    assert len(buffers) <= 3  # five sets in at most STACKS_KEPT + 1 buffers


def test_the_step_plan() -> None:
    """Rows per adapter in order of first appearance; padded slots repeat a row of their adapter and
    are masked; a skewed step takes the segmented form with int32 segment ends."""
    cpu = torch.device("cpu")
    decode = plan([5, 0, 3, 5], [1, 1, 1, 1], 7, cpu)
    assert (decode.key, decode.stack_id, decode.tokens, decode.slots) == ((5, 3), 7, 4, 2)
    assert decode.index is not None and decode.keep is not None
    assert decode.index.tolist() == [0, 3, 2, 2]
    assert decode.keep.view(-1).tolist() == [1.0, 1.0, 1.0, 0.0]
    skewed = plan([4, 9, 6], [20, 1, 1], 1, cpu)
    assert skewed.slots == 0 and skewed.index is None
    assert skewed.offsets is not None and skewed.offsets.dtype == torch.int32
    assert skewed.offsets.tolist() == [20, 21, 22]
    assert step_key([0, 4, 2, 4, 0, 7]) == (4, 2, 7)


def test_slots_wait_evict_and_removed_adapters_are_refused(tmp_path: Path) -> None:
    model = Tiny()
    runtime = LoraSlots(LocalInstaller(LoraLayers(model, max_cpu_loras=1)), max_loras=1)
    first, _, _ = adapter(tmp_path, 1, 4, 1)
    second, _, _ = adapter(tmp_path, 2, 4, 2)

    async def scenario() -> None:
        await runtime.acquire(first)
        waiter = asyncio.ensure_future(runtime.acquire(second))
        for _ in range(5):  # loop turns, not time: the waiter runs up to its wait on the slot
            await asyncio.sleep(0)
        assert not waiter.done()  # the only slot is busy
        runtime.release(first)
        await asyncio.wait_for(waiter, 5)  # first evicted, second installed
        assert runtime.stats()["lora_evictions_total"] == 1
        await runtime.remove(second)  # still in use: its weights stay until released
        assert 2 in model.proj._lmforge_lora  # type: ignore[operator]
        runtime.release(second)
        for _ in range(100):  # the uninstall runs as a task: loop turns until it has
            if 2 not in model.proj._lmforge_lora:  # type: ignore[operator]
                break
            await asyncio.sleep(0)
        assert 2 not in model.proj._lmforge_lora  # type: ignore[operator]
        with pytest.raises(NotFoundError):
            await runtime.acquire(second)

    asyncio.run(scenario())


def test_evict_idle_and_drop_host_copy(tmp_path: Path) -> None:
    """The helpers bench/lora.py uses: idle unpinned adapters leave their slots, busy and pinned ones
    stay; a dropped host copy is read from disk at the next install."""
    model = Tiny()
    layers = LoraLayers(model, max_cpu_loras=3)
    slots = LoraSlots(LocalInstaller(layers), max_loras=3)
    busy, idle, pinned = (adapter(tmp_path, i, 4, i)[0] for i in (1, 2, 3))

    async def scenario() -> None:
        await slots.add(pinned, preload=False, pin=True)
        await slots.acquire(busy)
        await slots.acquire(idle)
        slots.release(idle)
        assert await slots.evict_idle() == 1
        assert set(model.proj._lmforge_lora) == {1, 3}  # type: ignore[arg-type]
        assert slots.stats()["lora_evictions_total"] == 1
        await slots.drop_host_copy(idle)
        assert layers.stats()["lora_host_cached"] == 2
        await slots.acquire(idle)  # back from disk
        assert set(model.proj._lmforge_lora) == {1, 2, 3}  # type: ignore[arg-type]

    asyncio.run(scenario())
