"""FAKE tensorrt_llm.executor (tests only)."""
