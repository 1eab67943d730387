"""FAKE tensorrt_llm.models (tests only)."""
