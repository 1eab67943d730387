"""What LMI-Dist reaches for inside transformers (and torch), in one table, checked when the engine starts.

LMI-Dist drives transformers' continuous batching through more than its public API: it replaces the
model runner's ``_sample`` (:mod:`.sampler`), makes the batch processor early with
``manager._create_batch_processor()`` (:mod:`.loading`), subclasses ``OutputRouter`` and overrides its
``deliver``/``deliver_batch`` (:mod:`.core`), subclasses the logits-processor list and overrides its
``prepare_tensor_args`` (:mod:`.sampler`), reads ``background_thread_status`` and the manager's
``_generation_thread``, reads each request's ``logit_processor_kwargs`` and ``query_length`` in the
LoRA batch hook (:mod:`.lora`), and reads the paged cache's per-layer views in its attention
(:mod:`.attention`), and, with speculative decoding on, wraps the step's scheduling, tensors and
update (:mod:`.speculative`). These are private and may change in any release; the version pin in
pyproject.toml is the first guard, and :data:`TRANSFORMERS` the second: every one of them is an entry
there, and :func:`check_classes` (the engine core's start, before the model loads) stops the start with
a message naming what is missing, the installed and tested releases and why LMI-Dist needs it, instead
of a request that hangs (an override transformers no longer calls) or fails later.
"""

from __future__ import annotations

import logging
from typing import Any

from lmforge.reachins import Library, Reach, ReachError, check

log = logging.getLogger("lmforge.engines.lmi_dist")

#: the transformers release LMI-Dist is written and tested against (pyproject.toml pins it)
TESTED = "5.19"

_CB = "transformers.generation.continuous_batching"
_API = f"{_CB}.continuous_api"
_HANG = "overridden by LMI-Dist: renamed upstream, the override is never called and requests hang"

#: every attribute of transformers LMI-Dist relies on
REACHES: tuple[Reach, ...] = (
    Reach(_API, ("ContinuousBatchingManager", "OutputRouter", "BackgroundThreadStatus"), "the engine loop"),
    Reach(
        f"{_API}:ContinuousBatchingManager",
        ("_create_batch_processor", "warmup", "start"),
        "loading.py makes the batch processor before the warm-up, to size the KV cache",
    ),
    Reach(
        f"{_API}:ContinuousBatchingManager",
        ("background_thread_status", "output_router", "_generation_thread", "batch_processor"),
        "core.py and follower.py read the loop's state and swap the router",
        set_in="__init__",
    ),
    Reach(
        f"{_API}:ContinuousBatchingManager",
        ("logit_processor",),
        "sampler.install replaces the manager's logits processors with LMI-Dist's sampler",
        set_in="__init__",
    ),
    Reach(f"{_API}:OutputRouter", ("deliver", "deliver_batch"), f"core.CoreRouter: {_HANG}"),
    Reach(f"{_API}:BackgroundThreadStatus", ("HARD_STOP", "local_status"), "core.py: has the loop died"),
    Reach(f"{_API}:BackgroundThreadStatus", ("fatal_error",), "the loop's error", set_in="__init__"),
    Reach(
        f"{_API}:ContinuousBatchProcessor",
        ("model_runner", "output_router", "cache"),
        "loading.py and core.py reach the runner, the router and the cache",
        set_in="__init__",
    ),
    Reach(f"{_CB}.model_runner:ModelRunner", ("_sample",), "sampler.take_choices replaces it"),
    Reach(
        f"{_CB}.model_runner:ModelRunner",
        ("do_sample", "return_logprobs"),
        "sampler.take_choices reads them",
        set_in="__init__",
    ),
    Reach(f"{_CB}.model_runner", ("infer_max_single_request_tokens",), "loading.py sizes requests"),
    Reach(
        f"{_CB}.cb_logits_processors:ContinuousBatchingLogitsProcessorList",
        ("prepare_tensor_args",),
        f"sampler._Processors (the LoRA batch hook): {_HANG}",
    ),
    Reach(
        f"{_CB}.cb_logits_processors:ContinuousBatchingLogitsProcessorList",
        ("tensors_required",),
        "sampler.install sets it",
        set_in="__init__",
    ),
    Reach(f"{_CB}.requests:RequestState", ("logit_processor_kwargs",), "per-request sampling and LoRA"),
    Reach(
        f"{_CB}.requests:FutureRequestState",
        ("state", "query_length"),
        "lora.LoraLayers.on_batch: the step's rows per adapter",
    ),
    Reach(f"{_CB}.requests:RequestStatus", ("FINISHED", "FAILED"), "core.CoreRouter"),
    Reach(f"{_CB}.cache:PagedAttentionCache", ("layer_to_allocator",), "attention.py", set_in="__init__"),
    Reach(
        f"{_CB}.cache_allocators.full_attention:FullAttentionCacheAllocator",
        ("_kv_token_views",),
        "attention.py writes and reads the cache through the per-layer views",
        set_in="register_cache_tensor",
    ),
    # speculative.py (option.speculative_config): drafts as extra query tokens, verified and rolled back
    Reach(
        f"{_API}:ContinuousBatchProcessor",
        ("update_batch",),
        f"speculative.Speculator.update_batch verifies drafts: {_HANG}",
    ),
    Reach(
        f"{_API}:ContinuousBatchProcessor",
        ("scheduler", "inputs_and_outputs", "max_batch_tokens", "use_async_batching"),
        "speculative.py wraps the step's scheduling, tensors and update",
        set_in="__init__",
    ),
    Reach(f"{_CB}.scheduler:Scheduler", ("schedule_batch", "finish_request"), "speculative.py adds drafts"),
    Reach(
        f"{_CB}.scheduler:Scheduler",
        ("active_requests", "block_new_requests"),
        "speculative.Speculator.update_batch finishes requests as the stock update does",
        set_in="reset",
    ),
    Reach(
        f"{_CB}.input_outputs:ContinuousBatchingIOs",
        ("prepare_batch_tensors", "get_model_kwargs"),
        "speculative.py: a logits row per verified position",
    ),
    Reach(
        f"{_CB}.input_outputs:ContinuousBatchingIOs",
        ("requests_in_batch", "device"),
        "speculative.py reads the step's requests",
        set_in="__init__",
    ),
    Reach(
        f"{_CB}.input_outputs:ContinuousBatchingIOs",
        ("output_ids",),
        "speculative.py reads every row's choice",
        set_in="_setup_static_tensors",
    ),
    Reach(
        f"{_CB}.requests:RequestState",
        (
            "tokens_to_process",
            "position_offset",
            "generated_tokens",
            "initial_tokens",
            "_new_tokens_limit",
            "update_and_check_completion",
            "generated_len",
            "to_generation_output",
        ),
        "speculative.py: drafts as query tokens, the position rolled back past rejected ones",
    ),
    Reach(f"{_CB}.requests:FutureRequestState", ("has_new_token", "complete_blocks"), "speculative.py"),
    Reach(f"{_CB}.requests:RequestStatus", ("DECODING", "PREFILLING", "PENDING"), "speculative.py"),
    Reach(
        f"{_CB}.cache:PagedAttentionCache",
        ("can_store_request_tokens", "mark_complete_blocks"),
        "speculative.py: room for drafts; prefix-cache hashes of the kept positions only",
    ),
    Reach(
        f"{_CB}.cache:PagedAttentionCache",
        ("use_prefix_sharing", "cache_allocators"),
        "speculative.py",
        set_in="__init__",
    ),
    Reach(
        f"{_CB}.cache_allocators.full_attention:FullAttentionCacheAllocator",
        ("tokens_per_page",),
        "speculative.py counts the blocks kept positions complete",
        set_in="_before_cache_tensor_init",
    ),
    Reach("transformers.modeling_utils", ("ALL_ATTENTION_FUNCTIONS", "AttentionInterface"), "lean_layers.py"),
    Reach("transformers.modeling_utils:AttentionInterface", ("get_interface",), "lean_layers._attention"),
    Reach(
        "transformers.configuration_utils:PretrainedConfig",
        ("_attn_implementation",),
        "lean_layers._attention picks the layer's attention function as its forward does",
        set_in="__init__",
    ),
)

#: transformers, as LMI-Dist uses it
TRANSFORMERS = Library(
    name="transformers",
    tested=f"{TESTED}.x",
    user="lmi-dist",
    reaches=REACHES,
    fix=f"Install the version lmforge pins (pip install 'transformers=={TESTED}.*'), or use "
    "option.rolling_batch=vllm",
    version_module="transformers",
)

#: torch's oneDNN ops the prepacked CPU linears call (cpu_linear.py checks them before it prepacks, and
#: serves unpacked without them): listed here so that the table is complete
TORCH_OPTIONAL: tuple[Reach, ...] = (
    Reach("torch:ops.mkldnn", ("_reorder_linear_weight", "_linear_pointwise"), "cpu_linear.py (optional)"),
)


def check_classes() -> None:
    """Before the model loads: everything in :data:`TRANSFORMERS`."""
    check(TRANSFORMERS)
    installed = TRANSFORMERS.installed()
    if not installed.startswith(TESTED + "."):
        log.warning(
            "lmi-dist: transformers %s; lmforge is tested with %s.x (what it reaches for is there)",
            installed,
            TESTED,
        )


def check_manager(manager: Any) -> None:
    """Once the batch processor exists: the instance attributes of :data:`REACHES` on the objects
    themselves (the table's ``set_in`` check reads the methods' code; this reads what they made)."""
    lacking: list[tuple[str, Reach]] = []
    processor = getattr(manager, "batch_processor", None)
    objects = {
        f"{_API}:ContinuousBatchingManager": manager,
        f"{_API}:BackgroundThreadStatus": getattr(manager, "background_thread_status", None),
        f"{_API}:ContinuousBatchProcessor": processor,
        f"{_CB}.model_runner:ModelRunner": getattr(processor, "model_runner", None),
    }
    for reach in REACHES:
        if reach.owner in objects and reach.methods:
            target = objects[reach.owner]
            lacking += [
                (f"{reach.label.rsplit('.', 1)[-1]}.{name}", reach)
                for name in reach.names
                if target is None or not hasattr(target, name)
            ]
    if lacking:
        from lmforge.reachins import message

        raise ReachError(message(TRANSFORMERS, lacking))
