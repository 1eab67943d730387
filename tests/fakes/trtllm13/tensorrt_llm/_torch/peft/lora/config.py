"""FAKE tensorrt_llm._torch.peft.lora.config (tests only): LoraConfig's home in 1.3+ (a strict model)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class LoraConfig:
    lora_dir: list[str] = field(default_factory=list)
    lora_ckpt_source: str = "hf"
    max_lora_rank: int = 64
    lora_target_modules: list[str] = field(default_factory=list)
    max_loras: int | None = None
    max_cpu_loras: int | None = None
