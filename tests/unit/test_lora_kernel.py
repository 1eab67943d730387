"""The fused LoRA pass (lora_kernel.c through lmforge.engines.lmi_dist.lora_kernel) against PyTorch's
products, on both of its code paths (AVX2+FMA where the CPU has it, and the portable loop)."""

from __future__ import annotations

import shutil

import pytest
import torch

from lmforge.engines.lmi_dist import lora_kernel

CPU = torch.device("cpu")


def built() -> bool:
    return lora_kernel.usable(CPU, torch.float32)


def test_it_is_built_wherever_a_c_compiler_is() -> None:
    """setup.py builds it with the package; a missing library here would mean `make install` ran
    without the compiler that is now on PATH (run it again)."""
    if not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler here: LMI-Dist keeps PyTorch's batched products")
    assert built(), "the fused LoRA pass was not built; run `make install` again"
    assert not lora_kernel.usable(CPU, torch.bfloat16)


@pytest.fixture(params=["best", "portable"])
def isa(request: pytest.FixtureRequest) -> str:
    if not built():
        pytest.skip("the fused LoRA pass is not built here")
    lora_kernel.force_portable(request.param == "portable")
    yield request.param
    lora_kernel.force_portable(False)


def reference(x, out, at3, bt3, slots, rows):  # type: ignore[no-untyped-def]
    want = out.clone()
    for a in range(at3.shape[0]):
        for s in range(slots):
            row = a * slots + s if rows is None else int(rows[a * slots + s])
            if row >= 0:
                want[row] += (x[row].double() @ at3[a].double() @ bt3[a].double()).float()
    return want


@pytest.mark.parametrize(
    ("k", "slots", "n_in", "n_out", "rank"),
    [
        (8, 1, 576, 576, 8),  # SmolLM2-135M decode, 8 adapters
        (8, 1, 576, 1536, 8),
        (8, 1, 1536, 576, 16),
        (3, 2, 37, 20, 24),  # odd widths: the vector loops' tails
        (2, 3, 16, 12, 4),  # a rank the AVX2 path leaves to the portable loop
        (1, 10, 64, 72, 8),  # more rows than one chunk of 8
    ],
)
@pytest.mark.parametrize("gather", [False, True])
def test_equals_the_products_row_by_row(
    isa: str, k: int, slots: int, n_in: int, n_out: int, rank: int, gather: bool
) -> None:
    gen = torch.Generator().manual_seed(k * 1000 + slots * 100 + rank)
    total = k * slots + 3  # rows no slot names stay as they are
    wide_x = torch.randn(total, n_in + 5, generator=gen)  # rows further apart than their width
    x = wide_x[:, :n_in]
    out = torch.randn(total, n_out, generator=gen)
    at3 = torch.randn(k, n_in, rank, generator=gen) * 0.1
    bt3 = torch.randn(k, rank, n_out, generator=gen) * 0.1
    rows = None
    if gather:  # rows in any order, and one padded slot
        order = torch.randperm(total, generator=gen)[: k * slots]
        order[-1] = -1
        rows = order.to(torch.int64).contiguous()
    want = reference(x, out, at3, bt3, slots, rows)
    lora_kernel.add(x, out, (at3, bt3), slots, rows)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)


def test_rows_outside_the_tensors_are_refused_before_anything_is_written(isa: str) -> None:
    x, out = torch.randn(4, 16), torch.zeros(4, 12)
    factors = (torch.randn(2, 16, 8), torch.randn(2, 8, 12))
    with pytest.raises(ValueError, match="rows outside"):
        lora_kernel.add(x, out, factors, 1, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="rows outside"):
        lora_kernel.add(x, out, factors, 3, None)  # 2 adapters x 3 slots > 4 rows
    assert torch.equal(out, torch.zeros(4, 12))
    with pytest.raises(ValueError, match="shapes disagree"):
        lora_kernel.add(x[:, :8], out, factors, 1, None)
    with pytest.raises(ValueError, match="ranks up to"):
        lora_kernel.add(x, out, (torch.randn(1, 16, 520), torch.randn(1, 520, 12)), 1, None)


def test_it_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lora_kernel, "_loaded", False)
    monkeypatch.setattr(lora_kernel, "_lib", None)
    monkeypatch.setenv(lora_kernel.ENV, "0")
    assert not lora_kernel.usable(CPU, torch.float32)
