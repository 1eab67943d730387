"""Speculative decoding settings: vLLM's ``speculative_config`` JSON and LMI's legacy keys, resolved once.

Two ways to ask for it, as LMI documents them:

* ``option.speculative_config`` (env ``OPTION_SPECULATIVE_CONFIG``): vLLM's JSON object, ``method``
  (``ngram`` or ``draft_model``), ``num_speculative_tokens``, ``prompt_lookup_min`` /
  ``prompt_lookup_max`` (n-gram), ``model`` (draft model), ``disable_by_batch_size``;
* LMI's legacy ``option.speculative_draft_model`` (a draft model folder) with
  ``option.speculative_length`` (tokens proposed per step), mapped onto the same settings.

:func:`resolve` checks everything at start and raises :class:`ValueError` naming the option; the
engines read the one :class:`Speculation` it returns (``ServingConfig.speculation``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16
"""The most tokens one step may propose per request: beyond it a verify pass costs more than it can win."""
DEFAULT_SPECULATIVE_LENGTH = 5
"""LMI's default ``option.speculative_length``."""
_KNOWN = frozenset(
    {
        "method",
        "num_speculative_tokens",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "model",
        "disable_by_batch_size",
    }
)
_OPTION = "option.speculative_config"


@dataclass(frozen=True)
class Speculation:
    """Resolved speculative decoding settings (vLLM's field names)."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None
    disable_by_batch_size: int | None = None
    """Steps with more running requests than this do not speculate (None: LMI-Dist's own default)."""

    def to_vllm(self, model_dir: Path | None) -> dict[str, Any]:
        """vLLM's ``speculative_config`` dict: the fields that apply to the method, a draft ``model``
        as :func:`draft_source` gives it (a relative folder taken relative to ``model_dir``)."""
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == "ngram":
            out["prompt_lookup_min"] = self.prompt_lookup_min
            out["prompt_lookup_max"] = self.prompt_lookup_max
        else:
            assert self.model is not None
            out["model"] = draft_source(self.model, model_dir)
        if self.disable_by_batch_size is not None:
            out["disable_by_batch_size"] = self.disable_by_batch_size
        return out

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _int(data: dict[str, Any], key: str, default: int | None, low: int, high: int | None) -> int | None:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{_OPTION}: {key} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{_OPTION}: {key}={value} must be {bound}")
    return value


def parse(text: str) -> dict[str, Any]:
    """``option.speculative_config``'s JSON object, or a ValueError naming the option."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{_OPTION} is not JSON ({err.msg} at character {err.pos}): {text!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f'{_OPTION} must be a JSON object like {{"method": "ngram", ...}}, got {text!r}')
    return data


def resolve(config_json: str | None, draft_model: str | None, length: int | None) -> Speculation | None:
    """The speculative settings asked for, None when speculation is off; ValueError naming the option."""
    if config_json is None:
        if draft_model is None:
            if length is not None:
                raise ValueError(
                    "option.speculative_length needs option.speculative_draft_model (or use "
                    f'{_OPTION}={{"method": "ngram", "num_speculative_tokens": {length}}})'
                )
            return None
        data: dict[str, Any] = {
            "method": "draft_model",
            "model": draft_model,
            "num_speculative_tokens": length if length is not None else DEFAULT_SPECULATIVE_LENGTH,
        }
        where = "option.speculative_length"
    else:
        if draft_model is not None or length is not None:
            raise ValueError(
                f"{_OPTION} and option.speculative_draft_model / option.speculative_length ask for the "
                "same thing: set one of them"
            )
        data = parse(config_json)
        where = f"{_OPTION}: num_speculative_tokens"
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise ValueError(f"{_OPTION}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_KNOWN))})")
    method = data.get("method")
    if method is None:
        method = "draft_model" if data.get("model") else None
    if method not in METHODS:
        raise ValueError(f"{_OPTION}: method={method!r} is not one of {', '.join(METHODS)}")
    k = data.get("num_speculative_tokens")
    if k is None:
        raise ValueError(f"{_OPTION}: num_speculative_tokens is required (1 to {MAX_SPECULATIVE_TOKENS})")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"{where}={k!r} must be an integer from 1 to {MAX_SPECULATIVE_TOKENS}")
    low = _int(data, "prompt_lookup_min", 1, 1, None)
    high = _int(data, "prompt_lookup_max", max(4, low or 1), 1, 64)
    assert low is not None and high is not None
    if low > high:
        raise ValueError(f"{_OPTION}: prompt_lookup_min={low} is more than prompt_lookup_max={high}")
    model = data.get("model")
    if method == "draft_model":
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{_OPTION}: method=draft_model needs model (a draft model folder)")
        model = model.strip()
    elif model is not None:
        raise ValueError(f"{_OPTION}: model is for method=draft_model, not {method}")
    batch = _int(data, "disable_by_batch_size", None, 1, None)
    return Speculation(method, k, low, high, model, batch)


def draft_folder(model: str, model_dir: Path | None) -> Path:
    """The draft model's folder: ``model`` as a path, a relative one taken relative to the model
    folder ``model_dir`` (as ``option.model_id`` is; without one, to the working directory)."""
    candidate = Path(model).expanduser()
    if not candidate.is_absolute() and model_dir is not None:
        candidate = model_dir / candidate
    return candidate.absolute()


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""A Hugging Face hub id (``owner/name``), which vLLM downloads itself."""


def draft_source(model: str, model_dir: Path | None) -> str:
    """The draft model as an engine that can download one (vLLM) takes it: the folder
    :func:`draft_folder` resolves, as LMI-Dist reads it, unless that folder does not exist and
    ``model`` is a hub id (``owner/name``), which is passed as it is."""
    folder = draft_folder(model, model_dir)
    if folder.is_dir() or not is_hub_id(model):
        return str(folder)
    return model


def is_hub_id(model: str) -> bool:
    """``model`` reads as a Hugging Face hub id (``owner/name``, no ``./``, ``~`` or leading ``/``)."""
    return bool(_HUB_ID.match(model))


def describe_draft(folder: Path) -> str:
    """One line on a draft model folder for ``lmforge config show``: its architecture, layers and
    vocabulary from its config.json (no weights read), or why it is not a model folder."""
    config = folder / "config.json"
    if not config.is_file():
        return f"{folder} (not a model folder: no config.json; the engine refuses it at start)"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as err:
        return f"{folder} (config.json unreadable: {err})"
    text = data.get("text_config", data) if isinstance(data, dict) else {}
    arch = ", ".join(data.get("architectures") or ["?"]) if isinstance(data, dict) else "?"
    return (
        f"{folder} ({arch}, {text.get('num_hidden_layers', '?')} layers, vocabulary "
        f"{text.get('vocab_size', '?')})"
    )
