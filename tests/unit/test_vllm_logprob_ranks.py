"""lmforge.engines.vllm.logprob_ranks: the same rank counts as vLLM's compiled function, with at most
a block of comparisons held at once; put in place where vLLM's sampler reads it."""

from __future__ import annotations

import sys
import types
from importlib.metadata import entry_points

import pytest

from lmforge.engines.vllm import logprob_ranks


def _reference(x: object, values: object) -> object:
    return (x >= values).sum(-1)  # type: ignore[operator]  # vLLM's function body, uncompiled


@pytest.mark.parametrize("rows", [1, 3, 7, 64])
def test_the_counts_are_the_comparisons_count_in_blocks_or_not(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1000, generator=gen).log_softmax(-1)
    x[0, :10] = float("-inf")  # masked entries
    values = x.gather(-1, torch.randint(0, 1000, (rows, 1), generator=gen))
    values[-1, 0] = float("-inf")  # every entry counts
    expected = _reference(x, values)
    got = logprob_ranks.count_at_least(x, values)
    assert got.dtype == torch.int64 and torch.equal(got, expected)
    monkeypatch.setattr(logprob_ranks, "BLOCK_ELEMENTS", 2500)  # two rows a block: the blocked path
    got = logprob_ranks.count_at_least(x, values)
    assert got.dtype == torch.int64 and torch.equal(got, expected)
    assert int(got[-1]) == 1000


def test_it_replaces_the_function_where_the_sampler_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake of vLLM's two modules (the boundary: importing vLLM is seconds): the ops module's name
    for a sampler imported later, the sampler's own for one imported already."""
    ops = types.ModuleType(logprob_ranks.MODULE)
    ops.batched_count_greater_than = _reference  # type: ignore[attr-defined]
    sampler = types.ModuleType("vllm.v1.sample.sampler")
    sampler.batched_count_greater_than = _reference  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, logprob_ranks.MODULE, ops)
    monkeypatch.setitem(sys.modules, "vllm.v1.sample.sampler", sampler)
    assert logprob_ranks.apply()
    assert ops.batched_count_greater_than is logprob_ranks.count_at_least  # type: ignore[attr-defined]
    assert sampler.batched_count_greater_than is logprob_ranks.count_at_least  # type: ignore[attr-defined]

    del ops.batched_count_greater_than  # another vLLM: nothing patched
    assert not logprob_ranks.apply()


def test_the_plugin_is_registered_for_vllm() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get(logprob_ranks.PLUGIN_NAME) == "lmforge.engines.vllm.logprob_ranks:register"
