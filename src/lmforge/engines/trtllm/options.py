"""TensorRT-LLM build options outside lmforge's general schema (``option.<name>``, LMI's names)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrtllmOptions:
    """TensorRT-LLM options that are not in lmforge's general schema (``option.<name>``), with LMI's
    names and defaults."""

    max_num_tokens: int = 16384
    max_beam_width: int = 1
    smoothquant_alpha: float = 0.8
    smoothquant_per_token: bool = False
    smoothquant_per_channel: bool = False
    awq_block_size: int = 128
    kv_cache_dtype: str = "auto"
    use_paged_context_fmha: bool = True
    enable_context_fmha: bool = True
    enable_kv_cache_reuse: bool = False
    kv_cache_free_gpu_mem_fraction: float = 0.9
    calib_size: int = 512
    use_custom_all_reduce: bool = True


_IGNORED = frozenset({"entryPoint", "model_dir"})

#: options of the TensorRT-LLM >= 1.3 path (:mod:`.pt_options`), refused here with the reason
PYTORCH_PATH_ONLY = frozenset(
    {"calib_dataset", "calib_seq_len", "cuda_graph", "cuda_graph_max_batch_size", "cuda_graph_padding",
     "torch_compile", "trtllm_async_llm"}
)  # fmt: skip


def _typed(name: str, text: str, default: Any) -> Any:
    if isinstance(default, bool):
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError("expected true or false")
    if isinstance(default, int):
        value = int(text)
        if value < 1:
            raise ValueError("expected a positive integer")
        return value
    if isinstance(default, float):
        return float(text)
    return text.strip()


def parse_options(extra: Mapping[str, str]) -> tuple[TrtllmOptions, list[str]]:
    """The TensorRT-LLM options among ``extra`` (``option.*`` keys outside lmforge's schema) and the
    problems with them (unknown names get the closest valid one)."""
    defaults = TrtllmOptions()
    known = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(TrtllmOptions)}
    values: dict[str, Any] = {}
    problems = []
    for name, text in sorted(extra.items()):
        if name in _IGNORED:
            continue
        key = name.replace("-", "_")
        if key in PYTORCH_PATH_ONLY:
            problems.append(
                f"option.{name} is for TensorRT-LLM >= 1.3 (the PyTorch backend: CUDA graphs, torch.compile, "
                "ModelOpt calibration); this TensorRT-LLM builds TensorRT engines, which do not take it"
            )
            continue
        if key not in known:
            problems.append(_unknown(name, key, known))
            continue
        try:
            values[key] = _typed(key, text, known[key])
        except ValueError as exc:
            problems.append(f"option.{name} = {text!r}: {exc}")
    return TrtllmOptions(**values), problems


def _unknown(name: str, key: str, known: Mapping[str, Any]) -> str:
    """The problem line for ``option.<name>`` that no TensorRT-LLM path knows, with the closest key."""
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean option.{close[0]}?" if close else ""
    return f"option.{name} is not a TensorRT-LLM option lmforge knows{hint}"
