"""Quantization methods lmforge knows by name, and what a quantized model folder says about itself.

One table (:data:`METHODS`) names every method ``lmforge compile --quantize`` and
``option.quantize`` take, for every engine that is not TensorRT-LLM (whose ModelOpt path keeps its own
names, :mod:`lmforge.engines.trtllm.quantplan`): what it does, whether it needs calibration, and where
it runs. :func:`method` turns a name into a :class:`Method` or an error naming the option and the
choices; :func:`checkpoint_scheme` reads a folder's ``quantization_config`` (compressed-tensors) and
says which of the methods it is. The checkpoint writer is :mod:`.w8a8` (it imports PyTorch; GPTQ's
search is :mod:`.gptq`); what a start checks against the manifest is :mod:`.start_check`.

A compiled folder records what made it in ``lmforge-compiled/quantize/manifest.json``
(:data:`MANIFEST`): method, scheme, format, the source weights' digest, the calibration set's (none
for W8A8: its weights are rounded to nearest and its activations quantized at run time; lmforge's
offline prompt set for GPTQ), the quantized weight files with their digests and the library versions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError

#: where a compiled folder's manifest lives (beside ``lmforge-compiled/vllm/``)
MANIFEST = Path("lmforge-compiled") / "quantize" / "manifest.json"


class QuantizeError(LmforgeError):
    """A quantization method asked for that cannot be had here; the message names the option."""


@dataclass(frozen=True)
class Method:
    name: str
    scheme: str
    """compressed-tensors' preset scheme name"""
    description: str
    cpu: bool
    """whether a CPU-only machine can serve it"""
    built: bool
    """whether ``lmforge compile`` writes it today"""
    needs_calibration: bool = False


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "w8a8",
            "W8A8",
            "int8 weights (per output channel, symmetric, rounded to nearest) and int8 activations "
            "(per token, dynamic): ~0.26x the fp32 weight bytes",
            cpu=True,
            built=True,
        ),
        Method(
            "gptq",
            "W4A16",
            "int4 weights (groups of 128/64/32 input channels, symmetric, chosen by GPTQ on lmforge's "
            "offline calibration set), float activations: ~0.16x the fp32 weight bytes",
            cpu=True,
            built=True,
            needs_calibration=True,
        ),
        Method(
            "fp8",
            "FP8_DYNAMIC",
            "fp8 e4m3 weights (per channel) and activations (per token, dynamic)",
            cpu=False,
            built=False,
        ),
    )
}


def choices() -> str:
    """The methods, one phrase each, for error messages and ``--help``."""
    return "; ".join(
        f"{m.name} ({'CPU and GPU' if m.cpu else 'GPUs only'}{'' if m.built else ', planned'})"
        for m in METHODS.values()
    )


def method(name: str, *, option: str = "option.quantize", cpu_only: bool = False) -> Method:
    """The method ``name`` names; QuantizeError naming ``option`` when it is unknown, not built yet,
    or needs hardware this machine lacks (``cpu_only``)."""
    key = name.strip().lower()
    found = METHODS.get(key)
    if found is None:
        raise QuantizeError(f"{option}={name}: unknown quantization method; choose one of: {choices()}")
    if cpu_only and not found.cpu:
        raise QuantizeError(
            f"{option}={name}: {found.description} needs a GPU with fp8 matrix units (CUDA compute "
            "capability 8.9+); this target is CPU-only, whose matrix kernels take no fp8 inputs. On a "
            "CPU use w8a8 or gptq"
        )
    if not found.built:
        raise QuantizeError(
            f"{option}={name}: {found.description} is planned but not built yet; choose one of: "
            f"{', '.join(m.name for m in METHODS.values() if m.built)}"
        )
    return found


def quantization_config(model_dir: Path) -> dict[str, Any] | None:
    """The ``quantization_config`` of ``model_dir/config.json`` (None: unquantized or no config)."""
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = data.get("quantization_config") if isinstance(data, dict) else None
    return found if isinstance(found, dict) else None


#: a W8A8 checkpoint's config group for an input embedding tied to its int8 LM head (compressed-tensors'
#: own ``Embedding`` target, weights only: a lookup has no float input to quantize)
EMBEDDING_TARGETS = ["Embedding"]
_W8_CHANNEL = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}


def config_groups(qc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None, int]:
    """(the group for the linear layers, the group for the input embedding or None, how many groups
    there are) of a compressed-tensors ``quantization_config``; the linear group is None unless there is
    exactly one group that does not target ``Embedding``."""
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        return None, None, 0
    found = [g for g in groups.values() if isinstance(g, dict)]
    embedding = [g for g in found if g.get("targets") == EMBEDDING_TARGETS]
    linear = [g for g in found if g.get("targets") != EMBEDDING_TARGETS]
    return (
        linear[0] if len(linear) == 1 else None,
        embedding[0] if len(embedding) == 1 else None,
        len(groups),
    )


def quantized_embedding(qc: dict[str, Any]) -> bool:
    """Whether a compressed-tensors ``quantization_config`` quantizes the input embedding (the tied
    int8 matrix of a W8A8 checkpoint :mod:`.w8a8` writes)."""
    return config_groups(qc)[1] is not None


def checkpoint_scheme(qc: dict[str, Any]) -> str:
    """The method of :data:`METHODS` a ``quantization_config`` is, or QuantizeError saying what in it
    lmforge's engines do not serve (named as the config names it)."""
    method_name = qc.get("quant_method")
    if method_name != "compressed-tensors":
        raise QuantizeError(
            f"quantization_config.quant_method={method_name!r}: LMI-Dist serves compressed-tensors "
            "checkpoints only (lmforge compile --quantize writes them)"
        )
    fmt = qc.get("format")
    group, embedding, count = config_groups(qc)
    if (
        fmt not in ("int-quantized", "pack-quantized")
        or group is None
        or count != 1 + (embedding is not None)
    ):
        raise QuantizeError(
            f"quantization_config: format {fmt!r} with {count} config group(s); lmforge serves one "
            "int-quantized group (W8A8, and one more for the tied input embedding, targets "
            f"{EMBEDDING_TARGETS}) or one pack-quantized group (W4A16, GPTQ)"
        )
    weights, acts = group.get("weights") or {}, group.get("input_activations") or {}
    if fmt == "pack-quantized":
        if embedding is not None:
            raise QuantizeError(
                f"quantization_config: a pack-quantized (W4A16) checkpoint with an {EMBEDDING_TARGETS} "
                "group; lmforge's int4 checkpoints keep the input embedding in float"
            )
        want_w = {"num_bits": 4, "type": "int", "strategy": "group", "symmetric": True}
        wrong = {k: weights.get(k) for k, v in want_w.items() if weights.get(k) != v}
        if acts:
            wrong["input_activations"] = acts
        if weights.get("group_size") not in (32, 64, 128, 256):
            wrong["group_size"] = weights.get("group_size")
        if wrong:
            raise QuantizeError(
                f"quantization_config weights: {wrong} where lmforge's int4 kernels need {want_w}, "
                "group_size 32/64/128/256 and no input_activations"
            )
        return "gptq"
    want_a = {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True}
    for label, got, want in (("weights", weights, _W8_CHANNEL), ("input_activations", acts, want_a)):
        wrong = {k: got.get(k) for k, v in want.items() if got.get(k) != v}
        if wrong:
            raise QuantizeError(
                f"quantization_config {label}: {wrong} where LMI-Dist's int8 kernels need {want}"
            )
    if embedding is not None:
        got = embedding.get("weights") or {}
        wrong = {k: got.get(k) for k, v in _W8_CHANNEL.items() if got.get(k) != v}
        if embedding.get("input_activations"):
            wrong["input_activations"] = embedding["input_activations"]
        if wrong:
            raise QuantizeError(
                f"quantization_config {EMBEDDING_TARGETS} group: {wrong} where LMI-Dist's int8 embedding "
                f"needs weights {_W8_CHANNEL} (one scale per row) and no input_activations"
            )
    return "w8a8"


def read_manifest(model_dir: Path) -> dict[str, Any] | None:
    """The folder's quantization manifest, None when it has none (or it is unreadable)."""
    try:
        data = json.loads((model_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
