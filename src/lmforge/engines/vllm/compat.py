"""What lmforge reaches for inside vLLM (and torch, for vLLM's compile cache), in one table, checked
when the vLLM engine starts.

lmforge's vLLM plugins (:mod:`.inspect_here`, :mod:`.logprob_ranks`, :mod:`.idle_wait`,
:mod:`.lora_fix`, :mod:`.compile_plugin`), the engine-core fork (:mod:`.process_start`), the options
table (:mod:`.options`) and the stand-in for vLLM's Prometheus logger (``stat_loggers.no_prometheus``)
replace or read vLLM's private names. Each is an entry of :data:`VLLM` (or :data:`TORCH`) with the reason,
and :func:`check_at_start` (the start of :class:`~lmforge.engines.vllm.engine.VllmEngine`, in the server
process) stops the start with a message naming what a vLLM upgrade removed, the installed and tested
releases and why lmforge needs it. The plugins themselves still leave vLLM as it is where a name is
gone (they run inside vLLM's processes, where they must never stop vLLM): the start check is what says so.

Cheap to import (the plugins import it in every vLLM process): vLLM and torch are imported only by
:func:`check_at_start`.
"""

from __future__ import annotations

from typing import Any

from lmforge.reachins import Library, Reach, ReachError, check

#: the vLLM release lmforge's vLLM integration is written and tested against (pyproject.toml pins it)
TESTED = "0.32"
#: the torch release the compile-cache fixes were tested with
TESTED_TORCH = "2.13"

#: the methods of vLLM's stat-logger interface (``StatLoggerBase``, ``AggregateStatLoggerBase``) that
#: vLLM calls on each logger; ``stat_loggers.no_prometheus``'s stand-in overrides every one of them
STAT_LOGGER_METHODS = (
    "record",
    "record_sleep_state",
    "record_admission_rejection",
    "log_engine_initialized",
    "log",
)
_LOGGERS = "vllm.v1.metrics.loggers"

REACHES: tuple[Reach, ...] = (
    Reach(
        "vllm.model_executor.models.registry",
        ("_run_in_subprocess",),
        "inspect_here: vLLM-CPU inspects a model class in-process, not in a new interpreter (8-9 CPU-s)",
    ),
    Reach(
        "vllm.v1.sample.ops.logprobs",
        ("batched_count_greater_than",),
        "logprob_ranks: log-prob ranks counted eagerly, no inductor kernel built mid-request (10 CPU-s)",
    ),
    Reach(
        "vllm.distributed.device_communicators.shm_broadcast:SpinCondition",
        ("wait",),
        "idle_wait: vLLM-CPU's message queues poll 10 ms, not 1 s, before they sleep",
    ),
    Reach(
        "vllm.distributed.device_communicators.shm_broadcast:SpinCondition",
        ("is_reader", "busy_loop_s", "last_read"),
        "idle_wait caps the poll and naps within vLLM's own window since the last read",
        set_in="__init__",
    ),
    Reach(
        "vllm.lora.ops.torch_ops.lora_ops",
        ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"),
        "lora_fix: vLLM-CPU gives base-model rows the last adapter's delta (vllm-project/vllm#49656)",
    ),
    Reach(
        "vllm.lora.punica_wrapper.punica_cpu:PunicaWrapperCPU",
        ("add_lora_logits", "sampler_indices"),
        "lora_fix: prompt log-probs with LoRA kill vLLM-CPU's engine (vllm-project/vllm#29955)",
    ),
    Reach(
        "vllm.compilation.caching",
        ("aot_compile_hash_factors",),
        "compile_plugin: the AOT compile key names the model's config.json, not its folder",
    ),
    Reach(
        "vllm.v1.engine.utils",
        ("get_mp_context",),
        "process_start: vLLM-CPU's engine core forked from the server, not spawned (~7 CPU-s a start)",
    ),
    Reach(
        f"{_LOGGERS}:PrometheusStatLogger",
        STAT_LOGGER_METHODS,
        "stat_loggers.no_prometheus: a stand-in that skips PrometheusStatLogger.__init__ (its per-token "
        "metrics, ~10 % of the server's CPU) must override every method vLLM calls",
    ),
    Reach(
        "argparse:ArgumentParser",
        ("_actions",),
        "options.py reads vLLM's engine arguments from its argument parser",
        set_in="__init__",
    ),
)

#: vLLM, as lmforge uses it
VLLM = Library(
    name="vllm",
    tested=f"{TESTED}.x",
    user="lmforge's vLLM engine",
    reaches=REACHES,
    fix=f"Install the vLLM lmforge pins (pip install -e '.[vllm]': vllm {TESTED}), or use "
    "option.rolling_batch=lmi-dist",
    version_module="vllm",
)

#: torch's private names vLLM's compile cache needs from lmforge (:mod:`.compile_plugin`)
TORCH = Library(
    name="torch",
    tested=f"{TESTED_TORCH}.x",
    user="lmforge's vLLM engine",
    reaches=(
        Reach(
            "torch._dynamo.aot_compile_types",
            ("BundledAOTAutogradSerializableCallable",),
            "compile_plugin: vLLM-CPU's loader calls finalize_loading on torch's bundled AOT artifact",
        ),
    ),
    fix="Install the torch vLLM pins",
    version_module="torch",
)


def stat_logger_methods() -> set[str]:
    """The public methods of vLLM's stat-logger interface (its base classes), as installed."""
    from vllm.v1.metrics import loggers

    found: set[str] = set()
    for base in (loggers.StatLoggerBase, getattr(loggers, "AggregateStatLoggerBase", None)):
        if base is not None:
            found |= {n for n, v in vars(base).items() if callable(v) and not n.startswith("_")}
    return found


def check_at_start() -> None:
    """Everything in :data:`VLLM` and :data:`TORCH`, and that vLLM's stat-logger interface has no
    method ``stat_loggers.no_prometheus``'s stand-in lacks (it would run on an object whose ``__init__``
    never ran: an AttributeError at every engine step)."""
    check(VLLM)
    check(TORCH)
    if extra := sorted(stat_logger_methods() - set(STAT_LOGGER_METHODS)):
        reach = Reach(f"{_LOGGERS}:StatLoggerBase", tuple(extra), REACHES[-2].why)
        raise ReachError(
            f"{VLLM.user} cannot start on vllm {VLLM.installed()}: its stat-logger interface has "
            f"{', '.join(f'{reach.label}.{n}' for n in extra)}, which lmforge's stand-in for "
            f"PrometheusStatLogger does not override ({reach.why}). It was written and tested against "
            f"vllm {VLLM.tested}. {VLLM.fix}"
        )


def overrides_every_stat_method(cls: Any) -> bool:
    """Whether ``cls`` (the stand-in) defines every method of :data:`STAT_LOGGER_METHODS` itself."""
    return all(name in vars(cls) for name in STAT_LOGGER_METHODS)
