"""LMI-Dist's lean decoder layers (lmforge.engines.lmi_dist.lean_layers) and the sampler's fast argmax
compute what transformers and PyTorch compute; engine-level greedy equality with transformers'
``generate`` is in test_lmi_dist_engine.py and tests/integration/test_real_model.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from lmforge.engines.lmi_dist import lean_layers
from lmforge.engines.lmi_dist.cpu_linear import prepack
from lmforge.engines.lmi_dist.sampler import RequestSampler, argmax_rows, take_choices

pytestmark = pytest.mark.xdist_group("lean-layers")


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> Any:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype="float32").eval()


@pytest.mark.parametrize("fuse", [False, True])
def test_lean_layers_give_transformers_logits(model: Any, fuse: bool) -> None:
    lean = copy.deepcopy(model)
    assert lean_layers.install(lean, fuse=fuse) == model.config.num_hidden_layers
    prepack(lean, 8)
    ids = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 7, 300, 11]])
    with torch.no_grad():
        want = model(ids).logits
        got = lean(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    if fuse:  # the fused copy replaced the separate weights
        assert lean.model.layers[0].self_attn.q_proj.weight.numel() == 0


def test_fused_projections_keep_their_biases() -> None:
    """Qwen2-style q/k/v biases (and MLP biases) survive fusing: same logits as transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_()  # zeros would hide a dropped bias
    lean = copy.deepcopy(model)
    assert lean_layers.install(lean, fuse=True) == 2
    ids = torch.tensor([[1, 5, 9, 33, 2, 60]])
    with torch.no_grad():
        torch.testing.assert_close(lean(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_only_llama_shaped_layers_change(model: Any) -> None:
    other = copy.deepcopy(model)
    layer = other.model.layers[0]
    layer.self_attn.sliding_window = 64  # a windowed layer keeps transformers' forward (and its mask)
    assert not lean_layers.supported(layer)
    assert lean_layers.install(other) == model.config.num_hidden_layers - 1
    assert "forward" not in vars(layer)
    assert lean_layers.install(other) == 0  # idempotent


@pytest.mark.parametrize("width", [49152, 50257, 32000, 3000])
def test_argmax_rows_is_torch_argmax_with_first_of_equal_maxima(width: int) -> None:
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(7, width, generator=gen)
    x[1, 5] = x[1, width - 1] = 50.0  # ties: the first one wins
    x[2, width - 1] = 60.0  # in the tail past the last whole block
    x[3, 1024] = x[3, 1023] = 70.0  # on both sides of a block edge
    x[4] = 1.0  # all equal
    assert torch.equal(argmax_rows(x), torch.argmax(x, dim=-1))


def test_take_choices_hands_the_sampler_choices_to_the_runner() -> None:
    class Runner:
        do_sample = False
        return_logprobs = False

        def _sample(self, scores: torch.Tensor, output_ids: torch.Tensor) -> None:
            output_ids[0, : scores.shape[1]] = scores[0].argmax(-1)

    runner, sampler = Runner(), RequestSampler()
    take_choices(runner, sampler)
    assert sampler.direct
    scores = torch.randn(3, 64)
    scores[:, 7] = 99.0  # the argmax of what the sampler returns is not what it chose
    out = torch.zeros(2, 3, dtype=torch.long)
    sampler.chosen = torch.tensor([1, 2, 3])
    runner._sample(scores.unsqueeze(0), out)
    assert out[0].tolist() == [1, 2, 3]
    assert sampler.chosen is None
    runner._sample(scores.unsqueeze(0), out)  # a step the sampler did not see: the runner's own argmax
    assert out[0].tolist() == [7, 7, 7]
