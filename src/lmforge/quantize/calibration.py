"""The offline calibration set for ModelOpt quantization: lmforge's own prompts, or a local file.

Nothing is downloaded at build time. The built-in set (``calib_prompts.txt`` beside this module, about
300 short prompts written for lmforge: explanations, instructions, chat, translation, arithmetic and code)
serves when ``option.calib_dataset`` is unset; otherwise the option names a local file:

- ``.jsonl``: one JSON value per line, a string or an object with a ``text``, ``prompt``, ``input`` or
  ``question`` string;
- ``.txt``: one prompt per non-empty line (``\\n`` in a line stands for a newline).

The set's SHA-256 is part of the quantization plan, so a changed set never reuses a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lmforge.errors import LmforgeError

BUILTIN = Path(__file__).with_name("calib_prompts.txt")
_FIELDS = ("text", "prompt", "input", "question")


class CalibrationError(LmforgeError):
    kind = "model_error"


def _lines(text: str) -> list[str]:
    return [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]


def _jsonl(path: Path, text: str) -> list[str]:
    prompts: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise CalibrationError(
                f"option.calib_dataset: {path} line {number} is not JSON ({exc})"
            ) from None
        if isinstance(value, dict):
            value = next((value[k] for k in _FIELDS if isinstance(value.get(k), str)), None)
        if not isinstance(value, str) or not value.strip():
            raise CalibrationError(
                f"option.calib_dataset: {path} line {number} has no prompt (a string, or an object with "
                f"one of {', '.join(_FIELDS)})"
            )
        prompts.append(value)
    return prompts


def load_prompts(source: str = "") -> list[str]:
    """The calibration prompts of ``source`` ("": the built-in set); CalibrationError names the option."""
    if not source:
        return _lines(BUILTIN.read_text())
    if "://" in source:
        raise CalibrationError(
            f"option.calib_dataset={source!r} must be a local .jsonl or .txt file: lmforge never downloads "
            "calibration data at build time"
        )
    path = Path(source).expanduser()
    if path.suffix not in (".jsonl", ".txt"):
        raise CalibrationError(f"option.calib_dataset={source!r} must be a .jsonl or .txt file")
    try:
        text = path.read_text()
    except OSError as exc:
        raise CalibrationError(f"option.calib_dataset={source!r} cannot be read: {exc.strerror}") from None
    prompts = _jsonl(path, text) if path.suffix == ".jsonl" else _lines(text)
    if not prompts:
        raise CalibrationError(f"option.calib_dataset={source!r} holds no prompts")
    return prompts


def fingerprint(source: str = "") -> tuple[str, int, str]:
    """(label, number of prompts, SHA-256 of the prompts) of ``source``."""
    prompts = load_prompts(source)
    digest = hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:16]
    label = f"lmforge built-in set ({BUILTIN.name})" if not source else str(Path(source).expanduser())
    return label, len(prompts), digest
