"""FAKE TensorRT-LLM 1.3 (tests only): the PyTorch-backend names lmforge's TensorRT-LLM >= 1.3 path calls,
with the parameters recorded from the 1.3/1.4 sources in tests/fakes/trtllm_api_1.3.json (the test
tests/unit/test_trtllm13_fake_api.py keeps the fake within them). There is no ``_tensorrt_engine`` here:
1.3 removed the TensorRT engine flow. ``LLM`` "loads" a Hugging Face folder (its config.json and, for a
ModelOpt checkpoint, hf_quant_config.json) and "generates" deterministic token ids, so lmforge's control
flow (version gate, start-up arguments, streaming, abort, LoRA, finish reasons) runs without a GPU.

Its version comes from the distribution metadata beside it (tests/fakes/trtllm13, 1.3.0rc29); putting
tests/fakes/trtllm14 first on the path makes the same package report 1.4.0rc1.

Knobs (environment): FAKE_TRTLLM_EOS_AFTER=N ends every reply with EOS after N tokens;
FAKE_TRTLLM_LOADS=PATH appends one line per LLM() to PATH.
"""

from importlib.metadata import version as _version

from tensorrt_llm.llmapi import LLM, AsyncLLM, SamplingParams

__version__ = _version("tensorrt-llm")
__all__ = ["LLM", "AsyncLLM", "SamplingParams"]
