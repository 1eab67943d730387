"""The models a scenario runs on: ``--model tiny`` (the default) or ``--model smollm2-135m``.

``tiny`` is `lmforge example-model` (a 0.9 M-parameter random Llama: every step is per-operation
Python overhead); ``smollm2-135m`` is SmolLM2-135M-Instruct as `lmforge example-model --model
smollm2-135m` writes it (fp32, real weights: the arithmetic and memory traffic of a real model).
A scenario's result on the 135 M model goes to ``bench/results/<name>-smollm2-135m.json`` beside the
tiny one, and docs/performance.md puts the two side by side.
"""

from __future__ import annotations

from pathlib import Path

TINY = "tiny"
SMOLLM2 = "smollm2-135m"
MODELS = (TINY, SMOLLM2)

#: how the report and the result files name each model
DESCRIPTIONS = {
    TINY: "lmforge example-model (0.9 M-parameter random Llama, fp32)",
    SMOLLM2: "SmolLM2-135M-Instruct (lmforge example-model --model smollm2-135m, fp32)",
}
SHORT = {TINY: "tiny (0.9 M, random)", SMOLLM2: "SmolLM2-135M (real)"}


def result_name(base: str, model: str) -> str:
    """The result file's name (without .json) of scenario ``base`` on ``model``."""
    return base if model == TINY else f"{base}-{model}"


def write_model(model: str, folder: Path) -> Path:
    """Write ``model``'s weights, config and tokenizer to ``folder`` (the 135 M model comes from
    lmforge's cache after its first conversion). The caller writes its own serving.properties."""
    if model == TINY:
        from lmforge.models.example import write_example_model

        return write_example_model(folder)
    if model == SMOLLM2:
        from lmforge.models.smollm2 import write_smollm2_model

        return write_smollm2_model(folder, dtype="fp32", progress=lambda line: print(line, flush=True))
    raise ValueError(f"unknown model {model!r}: use one of {', '.join(MODELS)}")
