"""The FAKE TensorRT-LLM 1.3 (tests/fakes/trtllm13) and the FAKE ModelOpt (tests/fakes/modelopt) may accept
only what the real 1.3 / 1.4 and ModelOpt 0.46 APIs accept: every parameter of the fakes is among the names
recorded from the sources (tests/fakes/trtllm_api_1.3.json, tests/fakes/modelopt_api.json), and every
name lmforge's >= 1.3 path passes is accepted by the fakes, so it is recorded too."""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FAKES = Path(__file__).resolve().parents[1] / "fakes"
RECORDED: dict[str, list[str]] = json.loads((FAKES / "trtllm_api_1.3.json").read_text())
MODELOPT: dict[str, list[str]] = json.loads((FAKES / "modelopt_api.json").read_text())


def _drop() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in ("tensorrt_llm", "modelopt")]:
        del sys.modules[name]


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.syspath_prepend(str(FAKES / "trtllm13"))
    _drop()
    from lmforge.engines.trtllm.pt_api import load_pt_api

    yield load_pt_api()
    _drop()  # later tests must not find the fakes installed


def _names(obj: Any) -> set[str]:
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}
    params = inspect.signature(obj).parameters.values()
    return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}


def test_the_sources_are_named() -> None:
    about = RECORDED["about"]
    for fact in (
        "1.3.0rc29",
        "1.4.0rc1",
        "tensorrt_llm/llmapi/llm_args.py",
        "62e51e522c151e9ec8631eae540c32cbeb925362",
    ):
        assert fact in about
    assert "0.46.0" in MODELOPT["about"] and "43fd41a58d52c4e6e5dec1d1ff5989ecc737ae1a" in MODELOPT["about"]


def test_fake_accepts_only_recorded_names(api: Any) -> None:
    from tensorrt_llm.llmapi import llm as fake_llm

    checks = {
        "tensorrt_llm.LLM.generate_async": api.LLM.generate_async,
        "tensorrt_llm.sampling_params.SamplingParams": api.SamplingParams,
        "tensorrt_llm.llmapi.KvCacheConfig": api.KvCacheConfig,
        "tensorrt_llm.llmapi.CudaGraphConfig": api.CudaGraphConfig,
        "tensorrt_llm.llmapi.TorchCompileConfig": api.TorchCompileConfig,
        "tensorrt_llm._torch.peft.lora.config.LoraConfig": api.LoraConfig,
        "tensorrt_llm.executor.request.LoRARequest": api.LoRARequest,
        "tensorrt_llm.llmapi.AsyncLLM": api.AsyncLLM.__init__,
        "tensorrt_llm.llmapi.CompletionOutput": fake_llm.CompletionOutput,
        "tensorrt_llm.executor.result.Logprob": fake_llm.Logprob,
        "tensorrt_llm.llmapi.NGramDecodingConfig": api.NGramDecodingConfig,
        "tensorrt_llm.llmapi.DraftTargetDecodingConfig": api.DraftTargetDecodingConfig,
    }
    for key, obj in checks.items():
        extra = _names(obj) - set(RECORDED[key])
        assert not extra, f"the fake {key} accepts {sorted(extra)}, which the real API does not"
    accepted = _names(api.LLM.__init__) | set(fake_llm._ARGS)
    assert accepted <= set(RECORDED["tensorrt_llm.LLM"])
    result = fake_llm.RequestOutput(None, 1, [1], api.SamplingParams(), 0)  # type: ignore[arg-type]
    public = {n for n in [*vars(result), *vars(fake_llm.RequestOutput)] if not n.startswith("_")}
    assert public <= set(RECORDED["tensorrt_llm.llmapi.RequestOutput"])
    assert {"setup_async", "generate_async", "shutdown"} <= set(
        RECORDED["tensorrt_llm.llmapi.AsyncLLM methods"]
    )
    assert not hasattr(sys.modules["tensorrt_llm"], "_tensorrt_engine")  # 1.3 removed the engine flow


def test_lmforge_passes_recorded_names_only(api: Any, tmp_path: Path) -> None:
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import SamplingParams
    from lmforge.engines.trtllm.pytorch_backend import TrtllmPytorchEngine, llm_kwargs
    from lmforge.engines.trtllm.quantplan import make_quant_plan

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "vocab_size": 100}))
    variants: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({}, {}),
        ({"enable_lora": True, "max_model_len": 256, "max_input_len": 128}, {"cuda_graph": "false"}),
        ({"quantize": "fp8"}, {"torch_compile": "true", "trtllm_async_llm": "true", "kv_cache_dtype": "fp8"}),
        ({"speculative_config": '{"method": "ngram", "num_speculative_tokens": 3}'}, {}),
        ({"speculative_draft_model": str(tmp_path), "speculative_length": 4}, {}),
    ]
    for fields, extra in variants:
        config = ServingConfig(model_dir=tmp_path, **fields)
        plan = make_quant_plan(config, extra, arch="sm90", trtllm_version=api.version)
        kwargs = llm_kwargs(api, plan, tmp_path, config)  # the fake config classes refuse other names
        assert set(kwargs) <= set(RECORDED["tensorrt_llm.LLM"])
        api.LLM(**kwargs)  # and the fake LLM refuses any name outside TorchLlmArgs
    engine = TrtllmPytorchEngine(ServingConfig(model_dir=tmp_path), api=api)
    asked = SamplingParams(
        max_new_tokens=4, do_sample=True, min_new_tokens=2, presence_penalty=0.5, frequency_penalty=0.5,
        min_p=0.1, stop_token_ids=(7,), top_n=2, top_k=5,
    )  # fmt: skip
    made = engine._sampling_params(asked)
    assert (made.min_tokens, made.stop_token_ids, made.min_p, made.logprobs) == (2, [7], 0.1, 2)


def test_the_14_metadata_makes_the_same_fake_report_14(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FAKES / "trtllm13"))
    monkeypatch.syspath_prepend(str(FAKES / "trtllm14"))
    _drop()
    try:
        from lmforge.engines.trtllm.pt_api import load_pt_api
        from lmforge.engines.trtllm.version_gate import choose

        assert load_pt_api().version == "1.4.0rc1"
        assert (choose().path, choose().version) == ("pytorch", "1.4.0rc1")
    finally:
        _drop()


def test_fake_modelopt_accepts_only_recorded_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from lmforge.engines.trtllm.quantplan import KV_METHODS, QUANT_METHODS

    monkeypatch.syspath_prepend(str(FAKES))
    _drop()
    try:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint

        assert _names(mtq.quantize) <= set(MODELOPT["modelopt.torch.quantization.quantize"])
        kv_update = MODELOPT["modelopt.torch.quantization.update_quant_cfg_with_kv_cache_quant"]
        assert _names(mtq.update_quant_cfg_with_kv_cache_quant) <= set(kv_update)
        assert _names(export_hf_checkpoint) <= set(MODELOPT["modelopt.torch.export.export_hf_checkpoint"])
        presets = {n for n in dir(mtq) if n.endswith("_CFG")}
        assert presets <= set(MODELOPT["modelopt.torch.quantization configs"])
        used = {p for p, *_ in QUANT_METHODS.values()} | {p for p, *_ in KV_METHODS.values()}
        assert used <= presets
        assert {a for _, a, *_ in QUANT_METHODS.values()} <= set(
            MODELOPT["hf_quant_config.json quantization.quant_algo"]
        )
        kv_algos = set(MODELOPT["hf_quant_config.json quantization.kv_cache_quant_algo"])
        assert {a for _, a, _ in KV_METHODS.values()} <= kv_algos
    finally:
        _drop()


def test_speculative_config_becomes_tensorrt_llms_own(api: Any, tiny_model: Path, tmp_path: Path) -> None:
    """vLLM's words in, TensorRT-LLM's classes out: n-gram prompt lookup is NGramDecodingConfig (k ->
    max_draft_len, prompt_lookup_max -> max_matching_ngram_size, the latest match as LMI-Dist's),
    draft_model is DraftTargetDecodingConfig (the folder, a relative one taken in the model folder),
    disable_by_batch_size is max_concurrency; the engine starts and its LLM gets it as speculative_config."""
    import asyncio
    import shutil

    from lmforge.config import ServingConfig
    from lmforge.engines.trtllm.pytorch_backend import TrtllmPytorchEngine

    folder = Path(shutil.copytree(tiny_model, tmp_path / "m"))
    (folder / "draft").mkdir()
    ngram = (
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, "disable_by_batch_size": 6}'
    )
    legacy = {"speculative_draft_model": "draft", "speculative_length": 2}
    made = []
    for fields in ({"speculative_config": ngram}, legacy):
        engine = TrtllmPytorchEngine(ServingConfig(model_dir=folder, max_model_len=256, **fields), api=api)
        asyncio.run(engine.start())
        try:
            made.append(engine._llm.args["speculative_config"])
        finally:
            asyncio.run(engine.shutdown())
    ngram_made, draft_made = made
    assert isinstance(ngram_made, api.NGramDecodingConfig)
    assert (ngram_made.max_draft_len, ngram_made.max_matching_ngram_size, ngram_made.max_concurrency) == (
        3,
        5,
        6,
    )
    assert ngram_made.is_use_oldest is False
    assert isinstance(draft_made, api.DraftTargetDecodingConfig)
    assert (draft_made.max_draft_len, draft_made.max_concurrency) == (2, None)
    assert draft_made.speculative_model == str(folder / "draft")


def test_a_release_without_the_class_is_refused_naming_the_option(api: Any, tmp_path: Path) -> None:
    import dataclasses as dc

    from lmforge.config import ServingConfig
    from lmforge.engines.trtllm.pytorch_backend import llm_kwargs
    from lmforge.engines.trtllm.quantplan import make_quant_plan
    from lmforge.errors import LmforgeError

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "vocab_size": 100}))
    older = dc.replace(api, NGramDecodingConfig=None)
    config = ServingConfig(
        model_dir=tmp_path, speculative_config='{"method": "ngram", "num_speculative_tokens": 3}'
    )
    plan = make_quant_plan(config, {}, arch="sm90", trtllm_version=older.version)
    with pytest.raises(
        LmforgeError, match=r"option\.speculative_config \(ngram\).*NGramDecodingConfig.*LMI-Dist"
    ):
        llm_kwargs(older, plan, tmp_path, config)
