"""FAKE tensorrt_llm._torch.peft (tests only)."""
