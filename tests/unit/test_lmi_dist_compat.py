"""LMI-Dist's start-time check of what it reaches for inside transformers (lmi_dist.compat)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from lmforge.engines.lmi_dist import compat
from lmforge.errors import LmforgeError


def test_the_pinned_transformers_has_everything() -> None:
    compat.check_classes()


def test_a_missing_private_method_stops_the_start_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.generation.continuous_batching.model_runner import ModelRunner

    monkeypatch.delattr(ModelRunner, "_sample")
    with pytest.raises(
        LmforgeError, match=r"lacks [\w.]*ModelRunner\._sample.*tested against transformers 5\.19"
    ):
        compat.check_classes()


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        ("requests:FutureRequestState", "query_length"),
        ("continuous_api:OutputRouter", "deliver_batch"),
        ("cb_logits_processors:ContinuousBatchingLogitsProcessorList", "prepare_tensor_args"),
    ],
)
def test_each_reach_in_fails_the_start_naming_it_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, owner: str, name: str
) -> None:
    """An upstream rename of what LMI-Dist overrides or reads stops the start (it would hang requests)."""
    from lmforge.reachins import resolve

    cls = resolve(f"transformers.generation.continuous_batching.{owner}")
    monkeypatch.delattr(cls, name)
    with pytest.raises(LmforgeError) as caught:
        compat.check_classes()
    text = str(caught.value)
    assert f"{owner.split(':')[1]}.{name}" in text
    assert "transformers 5.19" in text and "tested against transformers 5.19.x" in text
    reason = next(r.why for r in compat.REACHES if r.owner.endswith(owner) and name in r.names)
    assert reason and reason in text


def test_every_entry_resolves_on_the_installed_transformers_and_torch() -> None:
    from lmforge.reachins import missing

    assert missing(compat.REACHES) == []
    assert missing(compat.TORCH_OPTIONAL) == []


def test_the_managers_attributes_are_checked_once_it_exists() -> None:
    runner = types.SimpleNamespace(_sample=None, do_sample=False, return_logprobs=False)
    status = types.SimpleNamespace(fatal_error=None)
    complete = types.SimpleNamespace(
        background_thread_status=status,
        output_router=None,
        _generation_thread=None,
        logit_processor=None,
        batch_processor=types.SimpleNamespace(
            model_runner=runner,
            output_router=None,
            cache=None,
            scheduler=None,
            inputs_and_outputs=None,
            max_batch_tokens=0,
            use_async_batching=False,
        ),
    )
    compat.check_manager(complete)
    del complete.output_router
    del runner.return_logprobs
    with pytest.raises(LmforgeError, match=r"output_router.*ModelRunner\.return_logprobs"):
        compat.check_manager(complete)


def test_the_forward_gate_keeps_the_signature_transformers_reads() -> None:
    """transformers passes ``logits_to_keep`` (the LM head only on the rows that pick a token) when the
    model's ``forward`` names it: LMI-Dist's gate must not hide it behind ``(*args, **kwargs)``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmforge.engines.lmi_dist.prompt_scores import ForwardGate

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval()
    assert model._supports_logits_to_keep()
    gate = ForwardGate(model)
    assert model._supports_logits_to_keep()
    held: list[bool] = []
    model.model.register_forward_hook(lambda *_: held.append(gate.lock._is_owned()))
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([[1, 2, 3, 4]]), logits_to_keep=1)
    assert out.logits.shape[1] == 1
    assert held == [True]
    assert not gate.lock._is_owned()


def test_the_engine_core_s_start_fails_naming_a_planted_missing_attribute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """loading.build (the engine core's and each rank's start) checks the table before it loads."""
    from transformers.generation.continuous_batching.requests import FutureRequestState

    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist.loading import build

    monkeypatch.delattr(FutureRequestState, "query_length")
    with pytest.raises(LmforgeError, match=r"FutureRequestState\.query_length \(lora\.LoraLayers\.on_batch"):
        build(ServingConfig(model_dir=tmp_path))  # type: ignore[arg-type]
