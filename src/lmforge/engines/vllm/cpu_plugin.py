"""What lmforge's ``vllm.general_plugins`` for vLLM's CPU platform share: vLLM calls each plugin's
``register()`` in every process it starts (server, engine core, workers), before the model loads; a
plugin acts on the CPU platform only and must never stop vLLM from starting, so what it does runs
through :func:`on_cpu`. Cheap to import: vLLM is imported only when a plugin is called."""

from __future__ import annotations

import logging
from collections.abc import Callable


def on_cpu(log: logging.Logger, patch: Callable[[], None], failure: str) -> None:
    """Run ``patch`` when vLLM's current platform is the CPU; an error in it is logged on ``log`` as
    "lmforge: could not ``failure``" and vLLM starts as it would without the plugin."""
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            patch()
    except Exception:
        log.exception("lmforge: could not %s", failure)
