"""LMI-Dist's per-row choice (lmforge.engines.lmi_dist.sampler) on hand-made logits: OpenAI's and vLLM's
sampling extras do what their definitions say, and the settings survive the trip through the batch."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.engines.lmi_dist import ipc
from lmforge.engines.lmi_dist.sampler import PARAMS_KWARG, RequestSampler, _reshapes, _Row, request_kwargs
from lmforge.engines.protocol import SamplingParams, StructuredOutput

EOS = [0]


def pick(logits: list[float], p: SamplingParams, *, draw: int = 5, generated: list[int] | None = None) -> int:
    sampling = ipc.Sampling.of(p)
    row = _Row(key=1, params=sampling, draw=draw, history=None, generated=generated)
    return int(RequestSampler._pick(torch.tensor(logits), sampling, row, EOS))


def test_logit_bias_is_added_before_the_choice() -> None:
    p = SamplingParams(max_new_tokens=4, logit_bias=((3, 5.0),))
    assert pick([1.0, 4.0, 2.0, 0.0], p) == 3
    assert pick([1.0, 6.0, 2.0, 0.0], p) == 1  # +5 is not enough to pass 6


def test_presence_and_frequency_penalties_follow_openais_definition() -> None:
    logits = [0.0, 3.0, 2.5, 1.0]
    # token 1 appeared once: presence 1.0 takes it to 2.0, under token 2
    assert pick(logits, SamplingParams(max_new_tokens=4, presence_penalty=1.0), generated=[1]) == 2
    # frequency counts: two earlier 1s at 0.3 each take 3.0 to 2.4 < 2.5
    assert pick(logits, SamplingParams(max_new_tokens=4, frequency_penalty=0.3), generated=[1, 1]) == 2
    assert pick(logits, SamplingParams(max_new_tokens=4, frequency_penalty=0.3), generated=[1]) == 1
    # a negative penalty encourages repeats
    assert pick(logits, SamplingParams(max_new_tokens=4, presence_penalty=-2.5), generated=[3]) == 3


def test_min_tokens_holds_end_of_sequence_back() -> None:
    logits = [9.0, 1.0, 2.0]
    p = SamplingParams(max_new_tokens=8, min_new_tokens=3)
    assert [pick(logits, p, draw=d) for d in range(5)] == [2, 2, 2, 0, 0]
    assert not _reshapes(ipc.Sampling.of(p), 3) and _reshapes(ipc.Sampling.of(p), 2)


def test_min_p_drops_unlikely_tokens_when_sampling() -> None:
    # probabilities ~ [0.64, 0.24, 0.09, 0.03]: min_p 0.2 keeps tokens 0 and 1 only
    logits = [math.log(0.64), math.log(0.24), math.log(0.09), math.log(0.03)]
    seen = {
        pick(logits, SamplingParams(max_new_tokens=4, do_sample=True, min_p=0.2, seed=s), draw=0)
        for s in range(200)
    }
    assert seen == {0, 1}


def test_settings_survive_the_wire_and_the_batch_kwargs() -> None:
    """The core decodes a request's settings once, off the wire, and the sampler reads that object."""
    p = SamplingParams(
        max_new_tokens=9,
        do_sample=True,
        stop=("x",),
        logit_bias=((5, -2.5), (7, 100.0)),
        min_new_tokens=2,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        min_p=0.1,
        structured=StructuredOutput("json_schema", '{"type":"object"}'),
    )
    add = ipc.decode_to_core(ipc.encode(ipc.Add("r", [1], ipc.Sampling.of(p))))
    assert isinstance(add, ipc.Add)
    sampling = request_kwargs(3, add.sampling)[PARAMS_KWARG]
    assert sampling == ipc.Sampling.of(p) and sampling is add.sampling
    for name in ipc.Sampling.__struct_fields__:
        assert getattr(sampling, name) == getattr(p, name), name


@pytest.mark.parametrize("p", [SamplingParams(max_new_tokens=1), SamplingParams(max_new_tokens=1, min_p=0.5)])
def test_plain_greedy_rows_take_the_argmax_path(p: SamplingParams) -> None:
    assert not _reshapes(ipc.Sampling.of(p), 0)


def test_the_batch_manager_accepts_the_request_kwargs() -> None:
    """transformers checks each request's logits-processor kwargs against the processors' types."""
    from lmforge.engines.lmi_dist.sampler import LORA_KWARG, _Processors

    processors = _Processors(RequestSampler(), None)
    kwargs = request_kwargs(1, ipc.Sampling.of(SamplingParams(max_new_tokens=2)))
    processors.check_kwargs({**kwargs, LORA_KWARG: 3})
    with pytest.raises(TypeError, match="expected Sampling"):
        processors.check_kwargs({**kwargs, PARAMS_KWARG: "{}"})
