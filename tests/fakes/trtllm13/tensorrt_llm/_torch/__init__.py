"""FAKE tensorrt_llm._torch (tests only)."""
