"""Check an adapter folder before any engine sees it: PEFT LoRA config, safetensors only, and every
weight matching a linear layer of the base model with the right shape.

Nothing here imports torch; the weights' shapes come from the safetensors header.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lmforge.adapters.spec import CONFIG_FILE, WEIGHTS_FILE, LoraShape, lora_scaling
from lmforge.errors import BadRequestError

#: Files an adapter folder may never hold: pickles (arbitrary code on load) and code.
FORBIDDEN_SUFFIXES = frozenset(
    {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".py", ".pyc", ".so", ".sh"}
)
FORBIDDEN_NAMES = frozenset({"requirements.txt", "model.py"})
_PEFT_PREFIX = "base_model.model."
_MAX_FILES = 64


class AdapterError(BadRequestError):
    """An adapter that cannot be registered; the message names the file and field at fault."""


def check_files(folder: Path, root: Path) -> None:
    """Refuse pickles, code and links that leave ``root``; require the two PEFT files."""
    count = 0
    root_real = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            real = os.path.realpath(path)
            if os.path.commonpath([root_real, real]) != root_real:
                raise AdapterError(f"{path.relative_to(folder)} links outside the adapter root", param="src")
        for name in filenames:
            count += 1
            rel = (Path(dirpath) / name).relative_to(folder)
            suffix = Path(name).suffix.lower()
            if suffix in FORBIDDEN_SUFFIXES or name in FORBIDDEN_NAMES:
                hint = " (pickled weights can run code when loaded; save with safetensors)" if suffix in {
                    ".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"} else ""  # fmt: skip
                raise AdapterError(f"adapter file {rel} is not allowed: adapters hold safetensors weights "
                                   f"and JSON only{hint}", param="src")  # fmt: skip
        if count > _MAX_FILES:
            raise AdapterError(f"the adapter folder holds more than {_MAX_FILES} files", param="src")
    for required in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / required).is_file():
            raise AdapterError(
                f"the adapter folder has no {required} (PEFT's save_pretrained writes {CONFIG_FILE} and "
                f"{WEIGHTS_FILE})",
                param="src",
            )


def read_config(folder: Path, max_rank: int) -> dict[str, Any]:
    try:
        data = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{CONFIG_FILE} is not valid JSON: {exc}", param="src") from None
    if not isinstance(data, dict):
        raise AdapterError(f"{CONFIG_FILE} must hold a JSON object", param="src")

    def bad(field: str, why: str) -> AdapterError:
        return AdapterError(f"{CONFIG_FILE}: {field} {why}", param="src")

    if str(data.get("peft_type", "")).upper() != "LORA":
        raise bad("peft_type", f"is {data.get('peft_type')!r}; only LORA adapters are supported")
    rank = data.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise bad("r", f"must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise bad("r", f"is {rank}, more than option.max_lora_rank={max_rank}")
    alpha = data.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < float("inf"):
        raise bad("lora_alpha", f"must be a positive number, got {alpha!r}")
    for field, neutral in (("use_dora", False), ("fan_in_fan_out", False)):
        if data.get(field) not in (None, neutral):
            raise bad(field, f"must be {str(neutral).lower()}: not supported")
    if data.get("bias", "none") not in (None, "none"):
        raise bad("bias", f"is {data.get('bias')!r}; only 'none' is supported")
    for field in (
        "modules_to_save",
        "rank_pattern",
        "alpha_pattern",
        "layer_replication",
        "layers_to_transform",
        "layers_pattern",
    ):
        if data.get(field):
            raise bad(field, "is set: not supported (whole-module copies, per-layer ranks or alphas, "
                      "layer subsets and layer replication are refused)")  # fmt: skip
    if not isinstance(data.get("use_rslora", False), bool):
        raise bad("use_rslora", "must be true or false")
    targets = data.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise bad("target_modules", f"must be a non-empty list of module names, got {targets!r}")
    data["target_modules"] = targets  # a string is PEFT's regular-expression form: one pattern
    return data


def check_weights(
    folder: Path, config: dict[str, Any], base_layers: dict[str, tuple[int, int]]
) -> tuple[list[LoraShape], int]:
    """Every tensor must be ``<layer>.lora_A.weight`` [r, in] or ``<layer>.lora_B.weight`` [out, r] of a
    linear layer of the base model, both present for each layer. Returns the layers and the file size."""
    from lmforge.hf import ModelFileError, read_safetensors_header

    path = folder / WEIGHTS_FILE
    try:
        tensors = read_safetensors_header(path)
    except ModelFileError as exc:
        raise AdapterError(str(exc).replace(str(folder) + os.sep, ""), param="src") from None
    rank = int(config["r"])
    factors: dict[str, dict[str, tuple[int, ...]]] = {}
    for tensor in tensors:
        name = tensor.name.removeprefix(_PEFT_PREFIX)
        for kind in ("lora_A", "lora_B"):
            suffix = f".{kind}.weight"
            if name.endswith(suffix):
                factors.setdefault(name[: -len(suffix)], {})[kind] = tensor.shape
                break
        else:
            raise AdapterError(
                f"{WEIGHTS_FILE}: tensor {tensor.name!r} is not a LoRA factor (lora_A / lora_B weight)",
                param="src",
            )
        if not tensor.dtype.startswith(("F", "BF")):
            raise AdapterError(
                f"{WEIGHTS_FILE}: tensor {tensor.name!r} has dtype {tensor.dtype}", param="src"
            )
    if not factors:
        raise AdapterError(f"{WEIGHTS_FILE} holds no LoRA weights", param="src")
    short_names = {m.rsplit(".", 1)[-1] for m in base_layers}
    targets = config["target_modules"]
    if len(targets) == 1 and any(ch in targets[0] for ch in "*.[(|"):
        pass  # a regular expression over full names (PEFT's string form): the weights say what it matched
    else:
        missing = sorted(t for t in targets if t not in short_names and t not in base_layers)
        if missing:
            raise AdapterError(
                f"{CONFIG_FILE}: target_modules {missing} do not exist in the base model (its linear layers: "
                f"{', '.join(sorted(short_names))})",
                param="src",
            )
    layers: list[LoraShape] = []
    for module, pair in sorted(factors.items()):
        if module not in base_layers:
            raise AdapterError(
                f"{WEIGHTS_FILE}: layer {module!r} is not a linear layer of the base model "
                "(is the adapter for another model?)",
                param="src",
            )
        if set(pair) != {"lora_A", "lora_B"}:
            raise AdapterError(f"{WEIGHTS_FILE}: layer {module!r} lacks lora_A or lora_B", param="src")
        in_f, out_f = base_layers[module]
        if pair["lora_A"] != (rank, in_f) or pair["lora_B"] != (out_f, rank):
            raise AdapterError(
                f"{WEIGHTS_FILE}: layer {module!r} has lora_A {list(pair['lora_A'])} and lora_B "
                f"{list(pair['lora_B'])}; the base model and r={rank} need [{rank}, {in_f}] and "
                f"[{out_f}, {rank}]",
                param="src",
            )
        layers.append(LoraShape(module, in_f, out_f))
    _check_finite(path)
    return layers, path.stat().st_size


def _check_finite(path: Path) -> None:
    """NaN or infinite factors would poison every request batched with the adapter: refuse them."""
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
            if not bool(torch.isfinite(f.get_tensor(name)).all()):
                raise AdapterError(
                    f"{WEIGHTS_FILE}: tensor {name!r} holds NaN or infinite values", param="src"
                )


def scaling_of(config: dict[str, Any]) -> float:
    return lora_scaling(
        int(config["r"]), float(config.get("lora_alpha", config["r"])), bool(config.get("use_rslora"))
    )


def linear_layers_of(module: Any) -> dict[str, tuple[int, int]]:
    """The linear layers of a loaded torch model (lm_head and embeddings excluded)."""
    import torch

    out: dict[str, tuple[int, int]] = {}
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.Linear) and not name.endswith("lm_head"):
            out[name] = (sub.in_features, sub.out_features)
    return out


def linear_layers_from_folder(model_dir: Path, trust_remote_code: bool = False) -> dict[str, tuple[int, int]]:
    """The same, from a model folder's ``config.json`` only: the model is built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return linear_layers_of(model)
