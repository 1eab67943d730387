"""FAKE tensorrt_llm._torch.peft.lora (tests only)."""
