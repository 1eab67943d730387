"""What a registered LoRA adapter is, once its folder has been found and checked.

An adapter is a folder in PEFT's layout: ``adapter_config.json`` (``peft_type: LORA``, ``r``,
``lora_alpha``, ``target_modules``, ...) and ``adapter_model.safetensors`` holding, for every adapted
linear layer ``<module>``, ``<prefix>.<module>.lora_A.weight`` (shape ``[r, in]``) and
``<prefix>.<module>.lora_B.weight`` (shape ``[out, r]``). Its effect on the layer is
``y = W x + scaling * B (A x)`` with ``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` for rsLoRA).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass(frozen=True, slots=True)
class LoraShape:
    """One adapted linear layer: its full module name in the base model and its LoRA factor shapes."""

    module: str
    in_features: int
    out_features: int


@dataclass(frozen=True)
class LoraAdapter:
    """A checked adapter, ready for an engine to load."""

    name: str
    path: Path
    """The local folder (resolved, inside an allowed root or the adapter download cache)."""
    src: str
    """The source the adapter was registered from (a folder or an ``s3://`` prefix), as given."""
    int_id: int
    """Unique for the server's lifetime (never reused), >= 1; engines key their slots by it."""
    rank: int
    alpha: float
    scaling: float
    target_modules: tuple[str, ...]
    """Short module names (``q_proj``, ...) the adapter touches."""
    layers: tuple[LoraShape, ...]
    """Every adapted layer with its shapes, checked against the base model."""
    base_model: str | None = None
    """``base_model_name_or_path`` from the adapter's config (informational)."""
    size_bytes: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    """Registration extras (``preload``, ``pin``, the SageMaker alias, ...)."""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "src": self.src,
            "rank": self.rank,
            "alpha": self.alpha,
            "target_modules": list(self.target_modules),
            "base_model": self.base_model,
            "size_bytes": self.size_bytes,
            **self.options,
        }


def lora_scaling(rank: int, alpha: float, use_rslora: bool) -> float:
    return alpha / math.sqrt(rank) if use_rslora else alpha / rank
