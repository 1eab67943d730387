"""FAKE tensorrt_llm.executor (tests only)."""

from tensorrt_llm.executor.request import LoRARequest

__all__ = ["LoRARequest"]
