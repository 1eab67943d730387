"""Options of the TensorRT-LLM >= 1.3 path (``option.<name>`` outside lmforge's general schema).

Shared with the engine path: ``max_num_tokens``, ``kv_cache_dtype``, ``enable_kv_cache_reuse``,
``kv_cache_free_gpu_mem_fraction``, ``calib_size``. Only here: CUDA graphs, ``torch.compile``, the ModelOpt
calibration set and ``AsyncLLM``. The engine path's build settings (plugins, FMHA, beam width,
SmoothQuant scaling, AWQ block size) are refused with the reason, as the engine path refuses these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmforge.engines.trtllm.options import _IGNORED, TrtllmOptions, _typed, _unknown


@dataclass(frozen=True)
class PtOptions:
    max_num_tokens: int = 8192
    kv_cache_dtype: str = "auto"
    enable_kv_cache_reuse: bool = True
    kv_cache_free_gpu_mem_fraction: float = 0.9
    calib_size: int = 512
    calib_seq_len: int = 512
    calib_dataset: str = ""
    cuda_graph: bool = True
    cuda_graph_max_batch_size: int = 0
    """0: the server's ``option.max_rolling_batch_size``."""
    cuda_graph_padding: bool = True
    torch_compile: bool = False
    trtllm_async_llm: bool = False


_ZERO_OK = frozenset({"cuda_graph_max_batch_size"})

#: the engine path's options (:class:`.options.TrtllmOptions`) that have no meaning without an engine build
ENGINE_ONLY = {f.name for f in dataclasses.fields(TrtllmOptions)} - {
    f.name for f in dataclasses.fields(PtOptions)
}


def parse_pt_options(extra: Mapping[str, str]) -> tuple[PtOptions, list[str]]:
    """The >= 1.3 options among ``extra`` and the problems with them (engine-only names get the reason,
    unknown names the closest valid one)."""
    defaults = PtOptions()
    known = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(PtOptions)}
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name, text in sorted(extra.items()):
        if name in _IGNORED:
            continue
        key = name.replace("-", "_")
        if key in ENGINE_ONLY:
            problems.append(
                f"option.{name} is a TensorRT engine build setting; TensorRT-LLM >= 1.3 builds no engines "
                "(its PyTorch backend loads the checkpoint): remove it, or serve engines with the "
                "tensorrt-llm-1.2 image"
            )
            continue
        if key not in known:
            problems.append(_unknown(name, key, known))
            continue
        if key in _ZERO_OK and text.strip() == "0":
            values[key] = 0
            continue
        try:
            values[key] = _typed(key, text, known[key])
        except ValueError as exc:
            problems.append(f"option.{name} = {text!r}: {exc}")
    return PtOptions(**values), problems
