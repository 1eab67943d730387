"""The FAKE TensorRT-LLM (tests/fakes/tensorrt_llm) may accept only what the real 1.2 API accepts:
every parameter and member of the fake is in the names recorded from TensorRT-LLM's source
(tests/fakes/trtllm_api.json), and lmforge's own calls use only those names."""

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
RECORDED: dict[str, list[str]] = json.loads((FAKES / "trtllm_api.json").read_text())


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(FAKES))
    from lmforge.engines.trtllm.api import load_api

    yield load_api()
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]  # later tests must not find the fake installed


def _names(obj: Any) -> set[str]:
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}
    params = inspect.signature(obj).parameters.values()
    return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}


def test_fake_accepts_only_recorded_names(api: Any) -> None:
    import tensorrt_llm.builder as builder

    checks = {
        "tensorrt_llm._tensorrt_engine.LLM": api.LLM.__init__,
        "tensorrt_llm._tensorrt_engine.LLM.generate_async": api.LLM.generate_async,
        "tensorrt_llm.sampling_params.SamplingParams": api.SamplingParams,
        "tensorrt_llm.builder.BuildConfig": api.BuildConfig,
        "PluginConfig (tensorrt_llm.plugin; fields UNVERIFIED)": builder.PluginConfig,
        "tensorrt_llm.models.modeling_utils.QuantConfig": api.QuantConfig,
        "tensorrt_llm.llmapi.KvCacheConfig": api.KvCacheConfig,
        "tensorrt_llm.lora_helper.LoraConfig": api.LoraConfig,
        "tensorrt_llm.executor.request.LoRARequest": api.LoRARequest,
    }
    for key, obj in checks.items():
        extra = _names(obj) - set(RECORDED[key])
        assert not extra, f"the fake {key} accepts {sorted(extra)}, which the real API does not"
    assert {m.name for m in api.QuantAlgo} <= set(RECORDED["tensorrt_llm.quantization.mode.QuantAlgo"])


def test_lmforge_builds_with_recorded_names_only(api: Any, tmp_path: Path) -> None:
    from lmforge.config import ServingConfig
    from lmforge.engines.trtllm.build import llm_kwargs
    from lmforge.engines.trtllm.plan import QUANT_ALGOS, make_plan

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "num_hidden_layers": 2}))
    recorded_algos = set(RECORDED["tensorrt_llm.quantization.mode.QuantAlgo"])
    for quantize in [None, *QUANT_ALGOS]:
        for extra in (
            {},
            {"kv_cache_dtype": "fp8"},
            {"smoothquant_per_token": "1", "smoothquant_per_channel": "1"},
        ):
            if "smoothquant_per_token" in extra and quantize != "smoothquant":
                continue
            cfg = ServingConfig(
                model_dir=tmp_path, quantize=quantize, dtype="fp16", enable_lora=quantize is None
            )
            plan = make_plan(cfg, extra, arch="sm90", trtllm_version="1.2.1", device_count=1).to_dict()
            kwargs = llm_kwargs(api, plan, str(tmp_path))
            assert set(kwargs) <= set(RECORDED["tensorrt_llm._tensorrt_engine.LLM"])
            for algo in (plan["quant_algo"], plan["kv_cache_quant_algo"]):
                assert algo is None or algo in recorded_algos
