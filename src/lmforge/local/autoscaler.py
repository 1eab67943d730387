"""The local SageMaker's CloudWatch metrics and Application Auto Scaling, run once a period.

Every ``period_s`` seconds (``LMFORGE_LOCAL_METRICS_PERIOD_S``, default 60: CloudWatch's one-minute
period of SageMaker's invocation metrics) the :class:`Autoscaler`

1. takes what the runtime counted (:class:`lmforge.local.metrics.Recorder`), adds what it reads off
   the running copies and instances (``InvocationsPerCopy``, ``InvocationsPerInstance``, requests in
   flight, zeros for idle ones) and publishes it with ``PutMetricData`` to the local CloudWatch;
2. judges every metric alarm of the ``AWS/SageMaker`` namespace on those periods (``Statistic``,
   ``EvaluationPeriods``, ``DatapointsToAlarm``, ``ComparisonOperator``, ``TreatMissingData``) as
   CloudWatch would, and sets its state with ``SetAlarmState``;
3. runs the step-scaling policies that an alarm in ``ALARM`` names in its ``AlarmActions``
   (``StepAdjustments`` on the breach, ``AdjustmentType``, ``Cooldown``);
4. runs each target-tracking policy on its own two alarms, the ones Application Auto Scaling created
   with it (``TargetTracking-<ResourceId>-AlarmHigh-<uuid>`` and ``-AlarmLow-<uuid>``, named in the
   policy's ``Alarms``: :mod:`lmforge.local.target_tracking`): while the high one is in ``ALARM`` a
   scale-out, while the low one is a scale-in, to ``ceil(capacity * metric / target)`` within the
   target's ``MinCapacity`` and ``MaxCapacity`` and the policy's cooldowns. A policy never scales from
   zero (the metric per copy has no value then), which is what the step policy on
   ``NoCapacityInvocationFailures`` is for.

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
from lmforge.local.target_tracking import alarm_role

log = logging.getLogger("lmforge.local.autoscaler")

ENV_PERIOD = "LMFORGE_LOCAL_METRICS_PERIOD_S"
DEFAULT_PERIOD_S = 60.0
VARIANT_COUNT = "sagemaker:variant:DesiredInstanceCount"
#: the periods of metrics kept for evaluation
KEPT_PERIODS = 64

Judged = dict[str, tuple[dict[str, Any], float | None]]
"""The alarms judged in one period: name -> (the alarm, as ``DescribeAlarms`` gives it with its new
``StateValue``; its latest datapoint)."""

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
        judged = self._judge(where)
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
            self._steps(where, step, by_resource, judged)
        for policy in policies:
            if policy.get("PolicyType") == "TargetTrackingScaling":
                target = by_resource[(policy["ResourceId"], policy["ScalableDimension"])]
                self._track(where, policy, target, judged)

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

    def _metric_alarms(self, where: Where) -> list[dict[str, Any]]:
        """The metric alarms of the local CloudWatch in ``where``'s region."""
        cloudwatch = self._client("cloudwatch", where)
        pages = cloudwatch.get_paginator("describe_alarms").paginate(AlarmTypes=["MetricAlarm"])
        return [alarm for page in pages for alarm in page.get("MetricAlarms", [])]

    def _set_state(self, where: Where, alarm: dict[str, Any], state: str, value: float | None) -> None:
        self._client("cloudwatch", where).set_alarm_state(
            AlarmName=alarm["AlarmName"],
            StateValue=state,
            StateReason=f"Threshold Crossed: the latest datapoint was {value} "
            f"({alarm.get('ComparisonOperator')} {alarm.get('Threshold')})"
            if value is not None
            else "Insufficient Data",
        )

    def _judge(self, where: Where) -> Judged:
        """Every ``AWS/SageMaker`` metric alarm judged on the periods kept, its state set where it
        changed."""
        judged: Judged = {}
        for alarm in self._metric_alarms(where):
            if alarm.get("Namespace") != NAMESPACE or not alarm.get("MetricName"):
                continue
            state, value = self._alarm_state(where, alarm)
            if state is not None and state != alarm.get("StateValue"):
                self._set_state(where, alarm, state, value)
                alarm["StateValue"] = state
            judged[alarm["AlarmName"]] = (alarm, value)
        return judged

    @staticmethod
    def _firing(alarm: dict[str, Any], value: float | None) -> bool:
        """Whether the alarm's actions run this period (in ``ALARM``, actions enabled, a datapoint)."""
        return alarm.get("StateValue") == "ALARM" and alarm.get("ActionsEnabled", True) and value is not None

    def _steps(
        self,
        where: Where,
        step: dict[str, dict[str, Any]],
        targets: dict[Any, dict[str, Any]],
        judged: Judged,
    ) -> None:
        """The step policies the alarms in ``ALARM`` name in their ``AlarmActions``."""
        for alarm, value in judged.values():
            if value is None or not self._firing(alarm, value):
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

    def _track(self, where: Where, policy: dict[str, Any], target: dict[str, Any], judged: Judged) -> None:
        """A target-tracking policy on its alarms: out while its high alarm is in ``ALARM``, in while
        its low one is."""
        config = policy.get("TargetTrackingScalingPolicyConfiguration") or {}
        rid, dim = policy["ResourceId"], policy["ScalableDimension"]
        goal = float(config.get("TargetValue") or 0)
        firing: dict[str, tuple[dict[str, Any], float]] = {}
        for ref in policy.get("Alarms") or []:
            found = judged.get(str(ref.get("AlarmName")))
            role = alarm_role(str(ref.get("AlarmName")), rid)
            if found is not None and role is not None and found[1] is not None and self._firing(*found):
                firing[role] = (found[0], found[1])
        if goal <= 0 or not firing:
            return
        capacity = self._capacity(where, rid, dim)
        if capacity is None or capacity == 0:
            return
        out = "High" in firing
        alarm, value = firing["High" if out else "Low"]
        wanted = min(
            max(math.ceil(capacity * value / goal - 1e-9), int(target["MinCapacity"])),
            int(target["MaxCapacity"]),
        )
        last = self._last.get((where[1], rid, dim), {})
        now = time.monotonic()
        cause = f"monitor alarm {alarm['AlarmName']} in state ALARM triggered policy {policy['PolicyName']}"
        if out:
            if wanted <= capacity or now - last.get("out", -math.inf) < float(
                config.get("ScaleOutCooldown") or 0
            ):
                return
        else:
            cooldown = float(config.get("ScaleInCooldown") or 0)
            if wanted >= capacity or config.get("DisableScaleIn"):
                return
            if now - max(last.get("in", -math.inf), last.get("out", -math.inf)) < cooldown:
                return
        if not self._suspended(target, out):
            self._scale(where, rid, dim, capacity, wanted, cause)

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
