"""FAKE tensorrt_llm.sampling_params (tests only)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingParams:
    max_tokens: int = 32
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    detokenize: bool = True
    end_id: int | None = None
