"""What LMI-Dist reaches for inside transformers, checked when the engine starts.

LMI-Dist drives transformers' continuous batching through more than its public API: it replaces the
model runner's ``_sample`` (:mod:`.sampler`), makes the batch processor early with
``manager._create_batch_processor()`` (:mod:`.loading`), swaps the manager's ``OutputRouter`` for its
own (:mod:`.core`), reads ``background_thread_status`` (``HARD_STOP``, ``local_status``,
``fatal_error``) and the manager's ``_generation_thread``, and reads each request's
``logit_processor_kwargs`` and ``query_length`` in the LoRA batch hook (:mod:`.lora`). These are
private and may change in any release; the version pin in pyproject.toml is the first guard, and this
check the second: a transformers that lacks one of them stops the engine at start with a message
naming what is missing and the release lmforge was tested with, instead of failing (or quietly doing
something else) at the first request.
"""

from __future__ import annotations

import logging
from typing import Any

from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge.engines.lmi_dist")

#: the transformers release LMI-Dist is written and tested against (pyproject.toml pins it)
TESTED = "5.19"


def _missing(owner: Any, names: tuple[str, ...], label: str) -> list[str]:
    return [f"{label}.{name}" for name in names if not hasattr(owner, name)]


def check_classes() -> None:
    """Before the model loads: the classes and class attributes LMI-Dist reaches for."""
    import transformers

    missing: list[str] = []
    try:
        from transformers.generation.continuous_batching import continuous_api, model_runner, requests
    except ImportError as exc:
        _fail(transformers.__version__, [f"transformers.generation.continuous_batching ({exc})"])
    manager = getattr(continuous_api, "ContinuousBatchingManager", None)
    classes = ("ContinuousBatchingManager", "OutputRouter", "BackgroundThreadStatus")
    missing += _missing(continuous_api, classes, "continuous_api")
    if manager is not None:
        missing += _missing(
            manager, ("_create_batch_processor", "warmup", "start"), "ContinuousBatchingManager"
        )
    status = getattr(continuous_api, "BackgroundThreadStatus", None)
    if status is not None:
        missing += _missing(status, ("HARD_STOP", "local_status"), "BackgroundThreadStatus")
    runner = getattr(model_runner, "ModelRunner", None)
    if runner is None:
        missing.append("model_runner.ModelRunner")
    else:
        missing += _missing(runner, ("_sample",), "ModelRunner")
    state = getattr(requests, "RequestState", None)
    if state is None or "logit_processor_kwargs" not in getattr(state, "__dataclass_fields__", {}):
        missing.append("requests.RequestState.logit_processor_kwargs")
    if missing:
        _fail(transformers.__version__, missing)
    if not transformers.__version__.startswith(TESTED + "."):
        log.warning(
            "lmi-dist: transformers %s; lmforge is tested with %s.x (what it reaches for is there)",
            transformers.__version__,
            TESTED,
        )


def check_manager(manager: Any) -> None:
    """Once the batch processor exists: the instance attributes LMI-Dist reads and replaces."""
    import transformers

    read = ("background_thread_status", "output_router", "_generation_thread", "batch_processor")
    missing = _missing(manager, read, "ContinuousBatchingManager")
    processor = getattr(manager, "batch_processor", None)
    runner = getattr(processor, "model_runner", None)
    if runner is None:
        missing.append("ContinuousBatchProcessor.model_runner")
    else:
        missing += _missing(runner, ("_sample", "do_sample", "return_logprobs"), "ModelRunner")
    status = getattr(manager, "background_thread_status", None)
    if status is not None:
        missing += _missing(status, ("fatal_error",), "BackgroundThreadStatus")
    if missing:
        _fail(transformers.__version__, missing)


def _fail(version: str, missing: list[str]) -> None:
    raise LmforgeError(
        f"lmi-dist cannot run on transformers {version}: it lacks {', '.join(missing)}, which LMI-Dist "
        f"uses (tested with transformers {TESTED}.x). Install the version lmforge pins "
        f"(pip install 'transformers=={TESTED}.*'), or use option.rolling_batch=vllm"
    )
