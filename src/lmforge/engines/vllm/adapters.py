"""LoRA adapters on vLLM: its refusals as client errors, and the CPU platform's fix allowed to load."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lmforge.errors import BadRequestError, LmforgeError, OverloadedError

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter

log = logging.getLogger("lmforge.engines.vllm")


def adapter_error(adapter: LoraAdapter, exc: Exception, max_loras: int) -> LmforgeError:
    """vLLM's refusal to load an adapter, as a client error that names the adapter and the option."""
    text = str(exc)
    lowered = text.lower()
    if "no free" in lowered or "slots" in lowered:
        return OverloadedError(
            f"vLLM has no free LoRA slot for adapter {adapter.name!r} (option.max_loras={max_loras}): {text}",
            retry_after=1,
        )
    if "rank" in lowered:
        return BadRequestError(
            f"vLLM refuses adapter {adapter.name!r} (rank {adapter.rank}): {text}; "
            "raise option.max_lora_rank or use a smaller adapter",
            param="src",
        )
    return BadRequestError(f"vLLM could not load adapter {adapter.name!r}: {text}", param="src")


def allow_lora_fix() -> None:
    """Where vLLM's CPU LoRA ops give base-model rows an adapter's delta (:mod:`.lora_fix`), patch this
    process and make sure vLLM loads the same patch (lmforge's ``vllm.general_plugins`` entry point) in
    its engine-core and worker processes. Elsewhere (GPU, a fixed vLLM) nothing is done."""
    import os
    from importlib.metadata import entry_points

    from vllm.platforms import current_platform

    from lmforge.engines.vllm import lora_fix

    if not current_platform.is_cpu() or not lora_fix.apply():
        return
    plugins = {ep.name: ep.value for ep in entry_points(group=lora_fix.PLUGIN_GROUP)}
    if not plugins.get(lora_fix.PLUGIN_NAME, "").startswith("lmforge."):
        from lmforge.engines.vllm.options import VllmOptionError

        raise VllmOptionError(
            "option.enable_lora=true on vLLM's CPU platform needs lmforge's vLLM plugin "
            f"({lora_fix.PLUGIN_GROUP}: {lora_fix.PLUGIN_NAME}), which this installation lacks: without it "
            "base-model requests batched with adapter requests get an adapter's weights "
            "(vllm-project/vllm#49656). Install lmforge as a package (pip install .)"
        )
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and lora_fix.PLUGIN_NAME not in allowed.split(","):
        os.environ["VLLM_PLUGINS"] = ",".join([p for p in allowed.split(",") if p] + [lora_fix.PLUGIN_NAME])
        log.info("VLLM_PLUGINS extended with %s (vLLM-CPU LoRA fix)", lora_fix.PLUGIN_NAME)
