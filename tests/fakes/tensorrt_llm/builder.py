"""FAKE tensorrt_llm.builder (tests only)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PluginConfig:
    paged_kv_cache: bool = True
    context_fmha: bool = True
    use_paged_context_fmha: bool = False
    use_custom_all_reduce: bool = True
    lora_plugin: str | None = None


@dataclass
class BuildConfig:
    max_input_len: int = 1024
    max_seq_len: int | None = None
    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    max_beam_width: int = 1
    plugin_config: PluginConfig = field(default_factory=PluginConfig)
