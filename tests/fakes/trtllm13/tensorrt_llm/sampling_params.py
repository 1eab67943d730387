"""FAKE tensorrt_llm.sampling_params (tests only): a subset of the 1.3 fields, same names and defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    max_tokens: int = 32
    stop_token_ids: list[int] | None = None
    n: int = 1
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    detokenize: bool = True
