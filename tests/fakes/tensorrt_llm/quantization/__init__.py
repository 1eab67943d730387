"""FAKE tensorrt_llm.quantization (tests only)."""
