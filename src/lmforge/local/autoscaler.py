"""The local SageMaker's CloudWatch metrics and Application Auto Scaling, run once a period.

Every ``period_s`` seconds (``LMFORGE_LOCAL_METRICS_PERIOD_S``, default 60: CloudWatch's one-minute
period of SageMaker's invocation metrics) the :class:`Autoscaler`

1. takes what the runtime counted (:class:`lmforge.local.metrics.Recorder`), adds what it reads off
   the running copies and instances (``InvocationsPerCopy``, ``InvocationsPerInstance``, requests in
   flight, zeros for idle ones) and publishes it with ``PutMetricData`` to the local CloudWatch;
2. evaluates the metric alarms of the ``AWS/SageMaker`` namespace on those periods (``Statistic``,
   ``EvaluationPeriods``, ``DatapointsToAlarm``, ``ComparisonOperator``, ``TreatMissingData``), sets
   their state with ``SetAlarmState`` and, while one is in ``ALARM``, runs the step-scaling policies
   its ``AlarmActions`` name (``StepAdjustments`` on the breach, ``AdjustmentType``, ``Cooldown``);
3. evaluates the target-tracking policies as Application Auto Scaling's own alarms would: a
   scale-out when the metric is above the target for :data:`HIGH_PERIODS` periods in a row, a
   scale-in when it is below 90 % of it for :data:`LOW_PERIODS` (AWS: 3 and 15 one-minute
   datapoints), to ``ceil(capacity * metric / target)`` within the target's ``MinCapacity`` and
   ``MaxCapacity`` and the policy's cooldowns; a policy never scales from zero (the metric per copy
   has no value then), which is what the step policy on ``NoCapacityInvocationFailures`` is for.

Each change is made through the SageMaker API as Application Auto Scaling makes it
(``UpdateInferenceComponentRuntimeConfig`` for ``sagemaker:inference-component:DesiredCopyCount``,
``UpdateEndpointWeightsAndCapacities`` for ``sagemaker:variant:DesiredInstanceCount``) and recorded as
a scaling activity (``DescribeScalingActivities``, :mod:`lmforge.local.autoscaling_ext`). Policies,
targets and alarms are read from the local control plane through its public API.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from lmforge.local import ACCOUNT_ID
from lmforge.local.autoscaling_ext import COMPONENT_PREFIX, COPY_COUNT, record_activity
from lmforge.local.metrics import NAMESPACE, UNITS, Dims, Period, Where, component_dims, endpoint_dims
from lmforge.local.routing import Gauge

log = logging.getLogger("lmforge.local.autoscaler")

ENV_PERIOD = "LMFORGE_LOCAL_METRICS_PERIOD_S"
DEFAULT_PERIOD_S = 60.0
VARIANT_COUNT = "sagemaker:variant:DesiredInstanceCount"
#: periods in a row above the target before a target-tracking policy scales out (AWS: 3 datapoints)
HIGH_PERIODS = 3
#: periods in a row below 90 % of the target before it scales in (AWS: 15 datapoints)
LOW_PERIODS = 15
#: the periods of metrics kept for evaluation
KEPT_PERIODS = 64

#: predefined target-tracking metrics: type -> (metric name, statistic, dimensions of the resource)
PREDEFINED: dict[str, tuple[str, str, Callable[[list[str]], Dims]]] = {
    "SageMakerInferenceComponentInvocationsPerCopy": (
        "InvocationsPerCopy",
        "Sum",
        lambda parts: component_dims(parts[1]),
    ),
    "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution": (
        "ConcurrentRequestsPerCopy",
        "Average",
        lambda parts: component_dims(parts[1]),
    ),
    "SageMakerVariantInvocationsPerInstance": (
        "InvocationsPerInstance",
        "Sum",
        lambda parts: endpoint_dims(parts[1], parts[3]),
    ),
    "SageMakerVariantConcurrentRequestsPerModelHighResolution": (
        "ConcurrentRequestsPerModel",
        "Average",
        lambda parts: endpoint_dims(parts[1], parts[3]),
    ),
}

#: the invocation metrics an idle endpoint or component publishes as 0
ZERO_WHEN_IDLE = ("Invocations", "Invocation4XXErrors", "Invocation5XXErrors", "InvocationModelErrors")

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "GreaterThanThreshold": lambda v, t: v > t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}


def period_from_env(environ: dict[str, str] | None = None) -> float:
    """The evaluation period ``LMFORGE_LOCAL_METRICS_PERIOD_S`` sets (seconds > 0), else 60."""
    raw = (os.environ if environ is None else environ).get(ENV_PERIOD, "").strip()
    if not raw:
        return DEFAULT_PERIOD_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{ENV_PERIOD}={raw!r} is not a number of seconds above 0")
    return value


def complete(taken: dict[Where, Period], gauges: list[Gauge]) -> dict[Where, Period]:
    """The periods to publish: what was counted, plus the metrics read off what runs (per copy, per
    instance, requests in flight) and zeros for what was idle."""
    out = dict(taken)
    for g in gauges:
        period = out.setdefault((g.account, g.region), Period())
        ep = endpoint_dims(g.endpoint, g.variant)
        for dims in (ep, component_dims(g.component)) if g.component else (ep,):
            for name in ZERO_WHEN_IDLE:
                stat = period.ensure(name, dims)
                if not stat.count:
                    stat.add(0.0)
        if g.component:
            dims = component_dims(g.component)
            failures = period.ensure("NoCapacityInvocationFailures", dims)
            if not failures.count:
                failures.add(0.0)
            if g.size:
                invocations = period.ensure("Invocations", dims).total
                period.add("InvocationsPerCopy", dims, invocations / g.size)
                concurrent = period.ensure("ConcurrentRequestsPerCopy", dims)
                concurrent.add(g.outstanding / g.size)
        elif g.serves_model and g.size:
            invocations = period.ensure("Invocations", ep).total
            period.add("InvocationsPerInstance", ep, invocations / g.size)
            period.ensure("ConcurrentRequestsPerModel", ep).add(g.outstanding / g.size)
    for period in out.values():  # a metric that got no sample has nothing to say
        for key in [k for k, stat in period.stats.items() if not stat.count]:
            del period.stats[key]
    return out


def metric_data(period: Period, when: datetime) -> list[dict[str, Any]]:
    """``PutMetricData``'s ``MetricData`` for one period."""
    return [
        {
            "MetricName": name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in dims],
            "Timestamp": when,
            "StatisticValues": stat.api(),
            "Unit": UNITS.get(name, "Count"),
        }
        for (name, dims), stat in sorted(period.stats.items())
    ]


def step_adjustment(config: dict[str, Any], breach: float) -> float | None:
    """The ``ScalingAdjustment`` of the step whose bounds (relative to the threshold) hold ``breach``."""
    for step in config.get("StepAdjustments") or []:
        low = step.get("MetricIntervalLowerBound")
        high = step.get("MetricIntervalUpperBound")
        if (low is None or breach >= float(low)) and (high is None or breach < float(high)):
            return float(step["ScalingAdjustment"])
    return None


def adjusted(config: dict[str, Any], capacity: int, adjustment: float) -> int:
    """The capacity a step policy asks for (``AdjustmentType``, ``MinAdjustmentMagnitude``)."""
    kind = config.get("AdjustmentType") or "ChangeInCapacity"
    if kind == "ExactCapacity":
        return int(adjustment)
    if kind == "PercentChangeInCapacity":
        change = capacity * adjustment / 100
        change = math.floor(change) if change > 0 else math.ceil(change)
        least = int(config.get("MinAdjustmentMagnitude") or 0)
        if adjustment and abs(change) < least:
            change = least if adjustment > 0 else -least
        if adjustment and change == 0:
            change = 1 if adjustment > 0 else -1
        return capacity + int(change)
    return capacity + int(adjustment)


class Autoscaler:
    """Publishes the runtime's metrics and runs the scaling policies, every ``period_s`` seconds."""

    def __init__(self, provisioner: Any, control_url: str, period_s: float = DEFAULT_PERIOD_S) -> None:
        self.provisioner = provisioner
        self.control_url = control_url
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clients: dict[tuple[str, str], Any] = {}
        self._history: dict[Where, deque[Period]] = {}
        self._streaks: dict[str, tuple[int, int]] = {}
        """Target-tracking policy ARN -> (periods in a row above the target, below 90 % of it)."""
        self._last: dict[tuple[str, str, str], dict[str, float]] = {}
        """(region, resource, dimension) -> when it last scaled "out" and "in" (monotonic)."""
        self._policy_last: dict[str, float] = {}
        """Step policy ARN -> when it last changed the capacity (its ``Cooldown``)."""

    # ----- running
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lmforge-autoscaler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.tick()
            except Exception:  # a bad policy or a busy control plane: the next period tries again
                log.exception("metrics and scaling: this period failed")

    def tick(self) -> None:
        """One period: publish the metrics, then evaluate alarms and policies."""
        periods = complete(self.provisioner.metrics.take(), self.provisioner.metric_gauges())
        when = datetime.now(UTC)
        for where, period in periods.items():
            self._history.setdefault(where, deque(maxlen=KEPT_PERIODS)).append(period)
            data = metric_data(period, when)
            cloudwatch = self._client("cloudwatch", where)
            for i in range(0, len(data), 500):
                cloudwatch.put_metric_data(Namespace=NAMESPACE, MetricData=data[i : i + 500])
        for where in periods:
            if where[0] == ACCOUNT_ID:
                self._evaluate(where)

    def _client(self, service: str, where: Where) -> Any:
        key = (service, where[1])
        found = self._clients.get(key)
        if found is None:
            import boto3
            from botocore.config import Config

            found = self._clients[key] = boto3.session.Session().client(
                service,
                endpoint_url=self.control_url,
                region_name=where[1],
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                config=Config(retries={"max_attempts": 2}),
            )
        return found

    # ----- reading the periods
    def _values(
        self, where: Where, metric: str, dims: Dims, statistic: str, count: int
    ) -> list[float | None]:
        """The metric's ``statistic`` in each of the last ``count`` periods, oldest first (None: no
        datapoint in that period)."""
        history = list(self._history.get(where, ()))[-count:]
        out: list[float | None] = []
        for period in history:
            stat = period.get(metric, dims)
            out.append(stat.statistic(statistic) if stat is not None and stat.count else None)
        return out

    # ----- evaluating
    def _evaluate(self, where: Where) -> None:
        aas = self._client("application-autoscaling", where)
        targets = aas.describe_scalable_targets(ServiceNamespace="sagemaker").get("ScalableTargets", [])
        if not targets:
            return
        by_resource = {(t["ResourceId"], t["ScalableDimension"]): t for t in targets}
        policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker").get("ScalingPolicies", [])
        policies = [p for p in policies if (p["ResourceId"], p["ScalableDimension"]) in by_resource]
        for target in targets:
            self._within_bounds(where, target)
        step = {p["PolicyARN"]: p for p in policies if p.get("PolicyType") == "StepScaling"}
        if step:
            self._alarms(where, step, by_resource)
        for policy in policies:
            if policy.get("PolicyType") == "TargetTrackingScaling":
                self._track(where, policy, by_resource[(policy["ResourceId"], policy["ScalableDimension"])])

    def _within_bounds(self, where: Where, target: dict[str, Any]) -> None:
        """A capacity outside the target's ``MinCapacity``..``MaxCapacity`` is brought into it."""
        rid, dim = target["ResourceId"], target["ScalableDimension"]
        capacity = self._capacity(where, rid, dim)
        if capacity is None:
            return
        low, high = int(target["MinCapacity"]), int(target["MaxCapacity"])
        wanted = min(max(capacity, low), high)
        if wanted != capacity:
            bound = "minimum" if wanted == low else "maximum"
            self._scale(
                where, rid, dim, capacity, wanted, f"{bound} capacity of the scalable target is {wanted}"
            )

    def _alarms(
        self, where: Where, step: dict[str, dict[str, Any]], targets: dict[Any, dict[str, Any]]
    ) -> None:
        cloudwatch = self._client("cloudwatch", where)
        alarms = cloudwatch.describe_alarms(AlarmTypes=["MetricAlarm"]).get("MetricAlarms", [])
        for alarm in alarms:
            if alarm.get("Namespace") != NAMESPACE or not alarm.get("MetricName"):
                continue
            state, value = self._alarm_state(where, alarm)
            if state is not None and state != alarm.get("StateValue"):
                cloudwatch.set_alarm_state(
                    AlarmName=alarm["AlarmName"],
                    StateValue=state,
                    StateReason=f"Threshold Crossed: the latest datapoint was {value} "
                    f"({alarm.get('ComparisonOperator')} {alarm.get('Threshold')})"
                    if value is not None
                    else "Insufficient Data",
                )
                alarm["StateValue"] = state
            if alarm.get("StateValue") != "ALARM" or not alarm.get("ActionsEnabled", True) or value is None:
                continue
            for arn in alarm.get("AlarmActions") or []:
                policy = step.get(arn)
                if policy is not None:
                    target = targets[(policy["ResourceId"], policy["ScalableDimension"])]
                    self._step(where, policy, target, alarm, value)

    def _alarm_state(self, where: Where, alarm: dict[str, Any]) -> tuple[str | None, float | None]:
        """The alarm's state on the last ``EvaluationPeriods`` periods, and the latest datapoint."""
        dims = tuple((d["Name"], d["Value"]) for d in alarm.get("Dimensions") or [])
        count = max(1, int(alarm.get("EvaluationPeriods") or 1))
        values = self._values(where, alarm["MetricName"], dims, alarm.get("Statistic") or "Average", count)
        compare = _COMPARE.get(str(alarm.get("ComparisonOperator")))
        if compare is None:
            return None, None
        threshold = float(alarm.get("Threshold") or 0)
        missing = alarm.get("TreatMissingData") or "missing"
        breaches: list[bool] = []
        for v in values:
            if v is not None:
                breaches.append(compare(v, threshold))
            elif missing == "breaching":
                breaches.append(True)
            elif missing == "notBreaching":
                breaches.append(False)
        latest = next((v for v in reversed(values) if v is not None), None)
        if not breaches:
            return (None if missing == "ignore" else "INSUFFICIENT_DATA"), latest
        needed = int(alarm.get("DatapointsToAlarm") or count)
        return ("ALARM" if sum(breaches) >= needed else "OK"), latest

    def _step(
        self,
        where: Where,
        policy: dict[str, Any],
        target: dict[str, Any],
        alarm: dict[str, Any],
        value: float,
    ) -> None:
        config = policy.get("StepScalingPolicyConfiguration") or {}
        adjustment = step_adjustment(config, value - float(alarm.get("Threshold") or 0))
        rid, dim = policy["ResourceId"], policy["ScalableDimension"]
        capacity = self._capacity(where, rid, dim)
        if adjustment is None or capacity is None:
            return
        cooldown = float(config.get("Cooldown") or 0)
        last = self._policy_last.get(policy["PolicyARN"])
        if last is not None and time.monotonic() - last < cooldown:
            return
        wanted = adjusted(config, capacity, adjustment)
        wanted = min(max(wanted, int(target["MinCapacity"])), int(target["MaxCapacity"]))
        if wanted == capacity or self._suspended(target, wanted > capacity):
            return
        cause = f"monitor alarm {alarm['AlarmName']} in state ALARM triggered policy {policy['PolicyName']}"
        if self._scale(where, rid, dim, capacity, wanted, cause):
            self._policy_last[policy["PolicyARN"]] = time.monotonic()

    def _track(self, where: Where, policy: dict[str, Any], target: dict[str, Any]) -> None:
        config = policy.get("TargetTrackingScalingPolicyConfiguration") or {}
        rid, dim = policy["ResourceId"], policy["ScalableDimension"]
        metric = self._tracked_metric(config, rid)
        goal = float(config.get("TargetValue") or 0)
        if metric is None or goal <= 0:
            return
        name, statistic, dims = metric
        values = self._values(where, name, dims, statistic, 1)
        value = values[-1] if values else None
        arn = policy["PolicyARN"]
        high, low = self._streaks.get(arn, (0, 0))
        if value is None:
            high = low = 0
        elif value > goal:
            high, low = high + 1, 0
        elif value < 0.9 * goal:
            high, low = 0, low + 1
        else:
            high = low = 0
        self._streaks[arn] = (high, low)
        capacity = self._capacity(where, rid, dim)
        if value is None or capacity is None or capacity == 0:
            return
        wanted = min(
            max(math.ceil(capacity * value / goal - 1e-9), int(target["MinCapacity"])),
            int(target["MaxCapacity"]),
        )
        last = self._last.get((where[1], rid, dim), {})
        now = time.monotonic()
        alarm = f"TargetTracking-{rid}-Alarm{'High' if high >= HIGH_PERIODS else 'Low'}"
        cause = f"monitor alarm {alarm} in state ALARM triggered policy {policy['PolicyName']}"
        if high >= HIGH_PERIODS and wanted > capacity:
            if now - last.get("out", -math.inf) < float(config.get("ScaleOutCooldown") or 0):
                return
            if not self._suspended(target, True) and self._scale(where, rid, dim, capacity, wanted, cause):
                self._streaks[arn] = (0, 0)
        elif low >= LOW_PERIODS and wanted < capacity and not config.get("DisableScaleIn"):
            cooldown = float(config.get("ScaleInCooldown") or 0)
            if now - max(last.get("in", -math.inf), last.get("out", -math.inf)) < cooldown:
                return
            if not self._suspended(target, False) and self._scale(where, rid, dim, capacity, wanted, cause):
                self._streaks[arn] = (0, 0)

    @staticmethod
    def _tracked_metric(config: dict[str, Any], rid: str) -> tuple[str, str, Dims] | None:
        predefined = (config.get("PredefinedMetricSpecification") or {}).get("PredefinedMetricType")
        parts = rid.split("/")
        if predefined in PREDEFINED:
            name, statistic, dims = PREDEFINED[predefined]
            wants_component = predefined.startswith("SageMakerInferenceComponent")
            if wants_component != rid.startswith(COMPONENT_PREFIX) or len(parts) < (
                2 if wants_component else 4
            ):
                return None
            return name, statistic, dims(parts)
        custom = config.get("CustomizedMetricSpecification") or {}
        if custom.get("Namespace") == NAMESPACE and custom.get("MetricName"):
            dims_list = tuple((d["Name"], d["Value"]) for d in custom.get("Dimensions") or [])
            return str(custom["MetricName"]), str(custom.get("Statistic") or "Average"), dims_list
        return None

    @staticmethod
    def _suspended(target: dict[str, Any], out: bool) -> bool:
        state = target.get("SuspendedState") or {}
        return bool(state.get("DynamicScalingOutSuspended" if out else "DynamicScalingInSuspended"))

    # ----- the SageMaker side
    def _capacity(self, where: Where, rid: str, dim: str) -> int | None:
        """The resource's desired capacity, or None while it cannot be scaled (absent, not
        ``InService``)."""
        from botocore.exceptions import ClientError

        sm = self._client("sagemaker", where)
        parts = rid.split("/")
        try:
            if dim == COPY_COUNT and rid.startswith(COMPONENT_PREFIX):
                desc = sm.describe_inference_component(InferenceComponentName=rid[len(COMPONENT_PREFIX) :])
                if desc["InferenceComponentStatus"] != "InService":
                    return None
                return int(desc["RuntimeConfig"]["DesiredCopyCount"])
            if dim == VARIANT_COUNT and len(parts) == 4 and parts[0] == "endpoint":
                desc = sm.describe_endpoint(EndpointName=parts[1])
                if desc["EndpointStatus"] != "InService":
                    return None
                for variant in desc.get("ProductionVariants") or []:
                    if variant["VariantName"] == parts[3] and "DesiredInstanceCount" in variant:
                        return int(variant["DesiredInstanceCount"])
        except ClientError:
            return None
        return None

    def _scale(self, where: Where, rid: str, dim: str, capacity: int, wanted: int, cause: str) -> bool:
        """Set the resource's capacity through SageMaker's API and record the activity."""
        sm = self._client("sagemaker", where)
        what = "copy" if dim == COPY_COUNT else "instance"
        started = time.time()
        status, message = "Successful", None
        try:
            if dim == COPY_COUNT:
                sm.update_inference_component_runtime_config(
                    InferenceComponentName=rid[len(COMPONENT_PREFIX) :],
                    DesiredRuntimeConfig={"CopyCount": wanted},
                )
            else:
                parts = rid.split("/")
                sm.update_endpoint_weights_and_capacities(
                    EndpointName=parts[1],
                    DesiredWeightsAndCapacities=[{"VariantName": parts[3], "DesiredInstanceCount": wanted}],
                )
        except Exception as exc:  # recorded as the activity's failure, as Application Auto Scaling does
            status, message = "Failed", f"{type(exc).__name__}: {exc}"
        record_activity(
            where[0],
            where[1],
            resource_id=rid,
            dimension=dim,
            description=f"Setting desired {what} count to {wanted}.",
            cause=f"{cause}: changing the desired capacity from {capacity} to {wanted}",
            status=status,
            message=message,
            started=started,
            ended=time.time(),
        )
        direction = "out" if wanted > capacity else "in"
        if status == "Successful":
            self._last.setdefault((where[1], rid, dim), {})[direction] = time.monotonic()
            log.info("scaling %s: %s count %d -> %d (%s)", rid, what, capacity, wanted, cause)
        else:
            log.warning("scaling %s to %d failed: %s", rid, wanted, message)
        return status == "Successful"
