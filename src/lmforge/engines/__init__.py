"""Engines: the backends that run generation (LMI-Dist, vLLM, TensorRT-LLM) behind one protocol."""

from lmforge.engines.protocol import (
    Engine,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    Token,
)

__all__ = ["Engine", "FinishReason", "GenerationEvent", "GenerationRequest", "SamplingParams", "Token"]
