"""SageMaker's invocation metrics, as the local runtime counts them.

The runtime tells the :class:`Recorder` about every invocation that reached a container (its outcome,
its model and overhead latency) and every one refused for want of a copy; once a period the
autoscaler (:mod:`lmforge.local.autoscaler`) takes what was counted (:meth:`Recorder.take`), adds
what is read off the running copies and instances (their number, the requests in flight) and
publishes it to the local CloudWatch in the ``AWS/SageMaker`` namespace with SageMaker's dimension
names:

- ``EndpointName`` + ``VariantName``: ``Invocations``, ``Invocation4XXErrors``,
  ``Invocation5XXErrors``, ``InvocationModelErrors``, ``ModelLatency``, ``OverheadLatency`` (every
  invocation of the endpoint, components' included), and for a variant that serves a model
  ``InvocationsPerInstance`` and ``ConcurrentRequestsPerModel``;
- ``InferenceComponentName``: the same invocation metrics for one component (an adapter component's
  under its own name: the usage of each adapter), ``InvocationsPerCopy``, ``ConcurrentRequestsPerCopy``
  and ``NoCapacityInvocationFailures``;

As SageMaker does, the error metrics are 1 or 0 per invocation (their ``Sum`` counts the errors, their
``Average`` is the rate) and the latencies are in microseconds; idle endpoints and components publish
zeros, so alarms and policies see data while nothing happens.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

NAMESPACE = "AWS/SageMaker"
Dims = tuple[tuple[str, str], ...]
"""A metric's dimensions, as (name, value) pairs in a fixed order."""
Where = tuple[str, str]
"""(account, region)."""


@dataclass
class Stat:
    """The values one metric got in one period (``SampleCount``, ``Sum``, ``Minimum``, ``Maximum``)."""

    count: float = 0.0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, value: float, times: float = 1.0) -> None:
        self.count += times
        self.total += value * times
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def statistic(self, name: str) -> float | None:
        """The value of statistic ``name`` (``Sum``, ``Average``, ...); None without samples."""
        if not self.count:
            return 0.0 if name in ("Sum", "SampleCount") else None
        return {
            "Sum": self.total,
            "SampleCount": self.count,
            "Average": self.total / self.count,
            "Minimum": self.low,
            "Maximum": self.high,
        }.get(name)

    def api(self) -> dict[str, float]:
        """``StatisticValues`` of ``PutMetricData``."""
        if not self.count:
            return {"SampleCount": 0.0, "Sum": 0.0, "Minimum": 0.0, "Maximum": 0.0}
        return {"SampleCount": self.count, "Sum": self.total, "Minimum": self.low, "Maximum": self.high}


#: each metric's CloudWatch unit
UNITS = {
    "ModelLatency": "Microseconds",
    "OverheadLatency": "Microseconds",
    "ConcurrentRequestsPerCopy": "None",
    "ConcurrentRequestsPerModel": "None",
}


def endpoint_dims(endpoint: str, variant: str) -> Dims:
    return (("EndpointName", endpoint), ("VariantName", variant))


def component_dims(component: str) -> Dims:
    return (("InferenceComponentName", component),)


@dataclass
class Period:
    """What one account and region counted in one period: (metric, dimensions) -> values."""

    stats: dict[tuple[str, Dims], Stat] = field(default_factory=dict)

    def add(self, metric: str, dims: Dims, value: float, times: float = 1.0) -> None:
        self.stats.setdefault((metric, tuple(sorted(dims))), Stat()).add(value, times)

    def get(self, metric: str, dims: Dims) -> Stat | None:
        return self.stats.get((metric, tuple(sorted(dims))))

    def ensure(self, metric: str, dims: Dims) -> Stat:
        """The metric's values, none yet when it got none (an idle metric still publishes)."""
        return self.stats.setdefault((metric, tuple(sorted(dims))), Stat())


class Recorder:
    """What the runtime counted since the last :meth:`take`, by account and region (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._periods: dict[Where, Period] = {}

    def _period(self, account: str, region: str) -> Period:
        return self._periods.setdefault((account, region), Period())

    def invocation(
        self,
        account: str,
        region: str,
        endpoint: str,
        variant: str,
        component: str | None,
        *,
        model_status: int | None,
        model_us: float,
        overhead_us: float,
    ) -> None:
        """One invocation that reached a container: ``model_status`` the container's status (None: it
        answered, 0: it could not be reached or timed out, as a 5XX)."""
        client = 1.0 if model_status is not None and 400 <= model_status < 500 else 0.0
        server = 1.0 if model_status is not None and not 400 <= model_status < 500 else 0.0
        groups = [endpoint_dims(endpoint, variant)]
        if component:
            groups.append(component_dims(component))
        with self._lock:
            period = self._period(account, region)
            for dims in groups:
                period.add("Invocations", dims, 1.0)
                period.add("Invocation4XXErrors", dims, client)
                period.add("Invocation5XXErrors", dims, server)
                period.add("InvocationModelErrors", dims, client or server)
                period.add("ModelLatency", dims, model_us)
                period.add("OverheadLatency", dims, overhead_us)

    def no_capacity(self, account: str, region: str, component: str) -> None:
        """An invocation of ``component`` refused because it has no copy."""
        with self._lock:
            self._period(account, region).add("NoCapacityInvocationFailures", component_dims(component), 1.0)

    def concurrency(self, account: str, region: str, metric: str, dims: Dims, value: float) -> None:
        """A sample of the requests in flight per copy (or per instance), taken as one arrives."""
        with self._lock:
            self._period(account, region).add(metric, dims, value)

    def take(self) -> dict[Where, Period]:
        """What was counted since the last call (and nothing is counted twice)."""
        with self._lock:
            taken, self._periods = self._periods, {}
        return taken
