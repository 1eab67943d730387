"""The fused LoRA pass (lora_kernel.c through lmforge.engines.lmi_dist.lora_kernel) against PyTorch's
products, on both of its code paths (AVX2+FMA where the CPU has it, and the portable loop)."""

from __future__ import annotations

import platform
import shutil
from collections.abc import Iterator

import pytest
import torch

from lmforge.engines.lmi_dist import lora_kernel

CPU = torch.device("cpu")


def built() -> bool:
    return lora_kernel.usable(CPU, torch.float32)


def test_it_is_built_wherever_a_c_compiler_is() -> None:
    """setup.py builds it with the package; a missing library here means the package was installed
    before a C compiler was on PATH."""
    if not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler here: LMI-Dist keeps PyTorch's batched products")
    assert built(), "the fused LoRA pass was not built: rm .venv/.installed-stamp && make install"
    assert not lora_kernel.usable(CPU, torch.bfloat16)
    with open("/proc/cpuinfo") as info:  # the run-time dispatch picks the vector path where it can
        flags = {f for line in info if line.startswith("flags") for f in line.split()}
    if platform.machine() == "x86_64" and {"avx2", "fma"} <= flags:
        assert lora_kernel.isa() == "AVX2+FMA"


@pytest.fixture(params=["best", "portable"])
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    if not built():
        pytest.skip("the fused LoRA pass is not built here")
    lora_kernel.force_portable(request.param == "portable")
    yield request.param
    lora_kernel.force_portable(False)


def factors(gen: torch.Generator, n_in: int, n_out: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One adapter's factors of one layer as its host copy keeps them: A^T [in, r], (s B)^T [r, out]."""
    return torch.randn(n_in, rank, generator=gen) * 0.1, torch.randn(rank, n_out, generator=gen) * 0.1


@pytest.mark.parametrize(
    ("ranks", "slots", "n_in", "n_out"),
    [
        ((8,) * 8, 1, 576, 576),  # SmolLM2-135M decode, 8 adapters
        ((8,) * 8, 1, 576, 1536),
        ((16, 8), 1, 1536, 576),
        ((24, 8, 16), 2, 37, 20),  # odd widths: the vector loops' tails
        ((4, 12), 3, 16, 12),  # 4 lanes only, then 8 lanes and 4
        ((8, 8), 2, 3, 5),  # fewer inputs than one unrolled step, fewer outputs than one vector
        ((8,), 10, 64, 72),  # more rows than one chunk of 8
        ((6, 1, 8), 1, 16, 12),  # ranks that are not a multiple of 4: the portable loop
        ((8, 0, 4), 2, 16, 12),  # the middle adapter leaves this layer alone
    ],
)
@pytest.mark.parametrize("gather", [False, True])
def test_equals_the_products_row_by_row(
    isa: str, ranks: tuple[int, ...], slots: int, n_in: int, n_out: int, gather: bool
) -> None:
    gen = torch.Generator().manual_seed(sum(ranks) * 100 + slots)
    k = len(ranks)
    key = tuple(range(1, k + 1))
    layer = {i: factors(gen, n_in, n_out, r) for i, r in zip(key, ranks, strict=True) if r}
    table = lora_kernel.AdapterTable([layer], key, [(n_in, n_out)])
    total = k * slots + 3  # rows no slot names stay as they are
    wide_x = torch.randn(total, n_in + 5, generator=gen)  # rows further apart than their width
    x = wide_x[:, :n_in]
    out = torch.randn(total, n_out, generator=gen)
    rows = torch.arange(k * slots)
    if gather:  # rows in any order, and one padded slot
        rows = torch.randperm(total, generator=gen)[: k * slots].contiguous()
        rows[-1] = -1
    want = out.clone()
    for a, adapter_id in enumerate(key):
        for s in range(slots):
            row = int(rows[a * slots + s])
            if row >= 0 and adapter_id in layer:
                at, bt = layer[adapter_id]
                want[row] += (x[row].double() @ at.double() @ bt.double()).float()
    lora_kernel.add(x, out, table, 0, slots, rows if gather else None)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)


def test_tables_point_at_the_host_copies_and_refuse_factors_that_do_not_fit() -> None:
    gen = torch.Generator().manual_seed(0)
    at, bt = factors(gen, 16, 12, 8)
    table = lora_kernel.AdapterTable([{3: (at, bt)}, {}], (3, 5), [(16, 12), (16, 12)])
    assert table.table.tolist() == [[[at.data_ptr(), bt.data_ptr(), 8], [0, 0, 0]], [[0, 0, 0]] * 2]
    assert table.factors == [(at, bt)]  # kept alive while the table is
    for bad in ((at, bt[:, :8]), (at.t(), bt), (at.double(), bt.double()), (at[:, ::2], bt[::2])):
        with pytest.raises(ValueError, match="do not fit"):
            lora_kernel.AdapterTable([{3: bad}], (3,), [(16, 12)])


def test_bad_calls_are_refused_before_anything_is_written(isa: str) -> None:
    gen = torch.Generator().manual_seed(1)
    table = lora_kernel.AdapterTable(
        [{1: factors(gen, 16, 12, 8), 2: factors(gen, 16, 12, 8)}], (1, 2), [(16, 12)]
    )
    x, out = torch.randn(4, 16), torch.zeros(4, 12)
    with pytest.raises(ValueError, match="rows outside"):
        lora_kernel.add(x, out, table, 0, 1, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="rows outside"):
        lora_kernel.add(x, out, table, 0, 3, None)  # 2 adapters x 3 slots > 4 rows
    with pytest.raises(ValueError, match="do not fit"):
        lora_kernel.add(x[:, :8], out, table, 0, 1, None)
    with pytest.raises(ValueError, match="do not fit"):
        lora_kernel.add(x, out, table, 1, 1, None)  # no such layer
    with pytest.raises(ValueError, match="float32"):
        lora_kernel.add(x.double(), out, table, 0, 1, None)
    with pytest.raises(ValueError, match="int64"):
        lora_kernel.add(x, out, table, 0, 1, torch.tensor([0, 1], dtype=torch.int32))
    assert torch.equal(out, torch.zeros(4, 12))


def test_it_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lora_kernel, "_loaded", False)
    monkeypatch.setattr(lora_kernel, "_lib", None)
    monkeypatch.setenv(lora_kernel.ENV, "0")
    assert not lora_kernel.usable(CPU, torch.float32)
