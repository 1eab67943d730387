"""The TensorRT-LLM build plan as data: its cache key, the settings it hands to TensorRT-LLM, its
rendering, and the copy recorded in a compiled engine folder (:data:`PLAN_FILE`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError

PLAN_FILE = "lmforge-trtllm-plan.json"


class BuildPlanError(LmforgeError):
    """A build plan TensorRT-LLM cannot compile; the message lists every problem."""

    kind = "model_error"


@dataclass(frozen=True)
class BuildPlan:
    """Everything that decides the compiled engine (and nothing that does not)."""

    model_id: str
    revision: str | None
    model_fingerprint: str | None
    """Hash of the source folder's config.json and weight files (names, sizes, mtimes): a folder
    re-exported at the same path (every SageMaker model is /opt/ml/model) never reuses an engine."""
    trust_remote_code: bool
    architecture: str
    dtype: str
    tensor_parallel: int
    pipeline_parallel: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    max_beam_width: int
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    smoothquant_alpha: float | None
    awq_block_size: int | None
    calib_size: int | None
    paged_kv_cache: bool
    context_fmha: bool
    paged_context_fmha: bool
    use_custom_all_reduce: bool
    lora: bool
    max_lora_rank: int | None
    max_loras: int | None
    gpu_arch: str | None
    trtllm_version: str
    runtime: dict[str, Any] = field(default_factory=dict, compare=False)
    """Runtime-only settings (KV-cache memory fraction, block reuse): not part of the cache key."""

    def build_fields(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("runtime")
        return out

    def cache_key(self) -> str:
        """Hash of every build-affecting field (model, revision, options, GPU arch, TRT-LLM version)."""
        canonical = json.dumps(self.build_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:24]

    def to_dict(self) -> dict[str, Any]:
        return {**self.build_fields(), "runtime": dict(self.runtime), "cache_key": self.cache_key()}

    def build_config(self) -> dict[str, Any]:
        """Keyword arguments for TensorRT-LLM's ``BuildConfig``."""
        return {
            "max_input_len": self.max_input_len,
            "max_seq_len": self.max_seq_len,
            "max_batch_size": self.max_batch_size,
            "max_num_tokens": self.max_num_tokens,
            "max_beam_width": self.max_beam_width,
        }

    def plugin_config(self) -> dict[str, Any]:
        """Plugin settings (``BuildConfig.plugin_config``)."""
        plugins: dict[str, Any] = {
            "paged_kv_cache": self.paged_kv_cache,
            "context_fmha": self.context_fmha,
            "use_paged_context_fmha": self.paged_context_fmha,
            "use_custom_all_reduce": self.use_custom_all_reduce,
        }
        if self.lora:
            plugins["lora_plugin"] = self.dtype
        return plugins

    def quant_config(self) -> dict[str, Any]:
        """Keyword arguments for TensorRT-LLM's ``QuantConfig`` (empty without quantization)."""
        out: dict[str, Any] = {}
        if self.quant_algo:
            out["quant_algo"] = self.quant_algo
        if self.kv_cache_quant_algo:
            out["kv_cache_quant_algo"] = self.kv_cache_quant_algo
        if self.smoothquant_alpha is not None:
            out["smoothquant_val"] = self.smoothquant_alpha
        if self.awq_block_size is not None:
            out["group_size"] = self.awq_block_size
        return out

    def render(self) -> str:
        rows = [
            ("model", f"{self.model_id}" + (f" @ {self.revision}" if self.revision else "")),
            ("architecture", self.architecture),
            ("dtype", self.dtype),
            ("parallel", f"tensor {self.tensor_parallel} x pipeline {self.pipeline_parallel}"),
            (
                "shapes",
                f"batch {self.max_batch_size}, input {self.max_input_len}, seq {self.max_seq_len}, "
                f"tokens/step {self.max_num_tokens}, beams {self.max_beam_width}",
            ),
            ("quantization", self.quant_algo or "none"),
            ("KV cache", f"paged, {self.kv_cache_quant_algo or self.dtype}"),
            (
                "attention",
                f"context FMHA {'on' if self.context_fmha else 'off'}, paged context FMHA "
                f"{'on' if self.paged_context_fmha else 'off'}",
            ),
            ("LoRA", f"rank <= {self.max_lora_rank}, {self.max_loras} adapters" if self.lora else "off"),
            ("GPU arch", self.gpu_arch or "the build machine's"),
            ("TensorRT-LLM", self.trtllm_version),
            ("cache key", self.cache_key()),
        ]
        if self.smoothquant_alpha is not None:
            rows.insert(6, ("smoothquant", f"alpha {self.smoothquant_alpha}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows) + "\n"


def read_plan(folder: Path) -> dict[str, Any] | None:
    """The plan recorded in a compiled engine folder, or None."""
    path = folder / PLAN_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
