"""The stat loggers lmforge hands to vLLM's ``AsyncLLM``: :func:`no_prometheus`."""

from __future__ import annotations

from typing import Any


def no_prometheus() -> list[Any]:
    """Stat loggers for ``AsyncLLM`` that keep vLLM's periodic log line but not its Prometheus metrics.

    vLLM adds a ``PrometheusStatLogger`` unless one of the given loggers is one; its ``record`` runs on
    every engine step (counters, gauges and histograms per token: ~10 % of this process's CPU per
    streamed token at concurrency 1, bench/vllm_bench_parity.py) for a registry nothing reads here
    (lmforge's ``/metrics`` is its own). This stands in for it and does nothing. Where vLLM's class
    is not the one this knows, nothing is replaced. It skips ``PrometheusStatLogger.__init__`` (that is
    the point); :mod:`.compat` checks at the start that vLLM's stat-logger interface has no method this
    does not override (``STAT_LOGGER_METHODS``), so none of vLLM's runs on the uninitialized object."""
    try:
        from vllm.v1.metrics.loggers import PrometheusStatLogger
    except ImportError:
        return []

    class NoPrometheus(PrometheusStatLogger):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
            self.engine_indexes = engine_indexes or [0]

        def record(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_admission_rejection(self, *args: Any, **kwargs: Any) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

        def log(self) -> None:
            pass

    return [NoPrometheus]
