"""The local SageMaker's metrics and scaling evaluator, piece by piece: what one period publishes,
how an alarm is judged on the periods, what a step or a target-tracking policy asks for. The
control plane's side (the capacity read, the change made) is a recording stand-in here; the whole
loop against the real local SageMaker is tests/integration/test_local_scaling.py's."""

from __future__ import annotations

import collections
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from lmforge.local.autoscaler import (
    Autoscaler,
    adjusted,
    complete,
    metric_data,
    period_from_env,
    step_adjustment,
)
from lmforge.local.metrics import Period, Recorder, component_dims, endpoint_dims
from lmforge.local.routing import Gauge
from lmforge.local.target_tracking import HIGH_PERIODS, LOW_PERIODS, alarm_requests, alarm_role

WHERE = ("123456789012", "us-west-2")


def test_one_period_counts_invocations_by_endpoint_and_component() -> None:
    rec = Recorder()
    for status in (None, None, 404, 0):
        rec.invocation(*WHERE, "e", "AllTraffic", "c", model_status=status, model_us=100.0, overhead_us=5.0)
    rec.invocation(*WHERE, "e", "AllTraffic", "adapter", model_status=None, model_us=1.0, overhead_us=1.0)
    rec.no_capacity(*WHERE, "idle")
    gauges = [
        Gauge(*WHERE, "e", "AllTraffic", "c", 2, 1),
        Gauge(*WHERE, "e", "AllTraffic", "adapter", 2, 0),
        Gauge(*WHERE, "e", "AllTraffic", "idle", 0, 0),
        Gauge(*WHERE, "e", "AllTraffic", None, 1, 0, False),
    ]
    period = complete(rec.take(), gauges)[WHERE]
    c, ep = component_dims("c"), endpoint_dims("e", "AllTraffic")

    def stat(metric: str, dims: Any, name: str = "Sum") -> float | None:
        found = period.get(metric, dims)
        return found.statistic(name) if found is not None else None

    assert stat("Invocations", c) == 4
    assert stat("Invocation4XXErrors", c) == 1 and stat("Invocation5XXErrors", c) == 1
    assert stat("Invocation4XXErrors", c, "Average") == 0.25  # 1 or 0 per invocation, as SageMaker sends
    assert stat("InvocationModelErrors", c) == 2
    assert stat("InvocationsPerCopy", c) == 2  # 4 over 2 copies
    assert stat("ConcurrentRequestsPerCopy", c) == 0.5
    assert stat("Invocations", component_dims("adapter")) == 1  # each adapter's usage under its name
    assert stat("Invocations", ep) == 5
    assert stat("ModelLatency", c, "SampleCount") == 4 and stat("ModelLatency", c, "Maximum") == 100
    assert stat("NoCapacityInvocationFailures", component_dims("idle")) == 1
    assert stat("NoCapacityInvocationFailures", c) == 0  # idle metrics publish zeros
    assert stat("Invocations", component_dims("idle")) == 0
    assert period.get("InvocationsPerCopy", component_dims("idle")) is None  # no copy: no value
    assert period.get("InvocationsPerInstance", ep) is None  # the variant holds components
    assert rec.take() == {}  # nothing is counted twice
    rows = metric_data(period, datetime(2026, 1, 1, tzinfo=UTC))
    data = {(d["MetricName"], tuple((x["Name"], x["Value"]) for x in d["Dimensions"])): d for d in rows}
    assert data[("ModelLatency", c)]["Unit"] == "Microseconds"
    assert data[("Invocations", c)]["StatisticValues"] == {
        "SampleCount": 4.0,
        "Sum": 4.0,
        "Minimum": 1.0,
        "Maximum": 1.0,
    }


def test_step_adjustments_and_adjustment_types() -> None:
    steps = {
        "StepAdjustments": [
            {"MetricIntervalUpperBound": 0, "ScalingAdjustment": -1},
            {"MetricIntervalLowerBound": 0, "MetricIntervalUpperBound": 10, "ScalingAdjustment": 1},
            {"MetricIntervalLowerBound": 10, "ScalingAdjustment": 3},
        ]
    }
    assert step_adjustment(steps, 0) == 1
    assert step_adjustment(steps, 12) == 3
    assert step_adjustment(steps, -0.5) == -1
    assert step_adjustment({"StepAdjustments": []}, 1) is None
    assert adjusted({"AdjustmentType": "ChangeInCapacity"}, 0, 1) == 1
    assert adjusted({"AdjustmentType": "ExactCapacity"}, 3, 1) == 1
    assert adjusted({"AdjustmentType": "PercentChangeInCapacity"}, 4, 50) == 6
    assert adjusted({"AdjustmentType": "PercentChangeInCapacity"}, 1, 10) == 2  # at least one
    assert adjusted({"AdjustmentType": "PercentChangeInCapacity", "MinAdjustmentMagnitude": 2}, 4, 10) == 6


def test_the_period_setting_is_checked() -> None:
    assert period_from_env({}) == 60.0
    assert period_from_env({"LMFORGE_LOCAL_METRICS_PERIOD_S": "0.5"}) == 0.5
    for bad in ("0", "-1", "soon", "inf"):
        with pytest.raises(ValueError, match="LMFORGE_LOCAL_METRICS_PERIOD_S"):
            period_from_env({"LMFORGE_LOCAL_METRICS_PERIOD_S": bad})


class RecordingAutoscaler(Autoscaler):
    """The evaluator with the control plane's side replaced by a recording stand-in: a resource's
    capacity is ``self.capacity``, each change is appended to ``self.changes``, and the alarms are
    ``self.alarms`` (each set to the state the evaluator judges)."""

    def __init__(self) -> None:
        super().__init__(provisioner=None, control_url="http://unused")
        self.capacity = 1
        self.changes: list[tuple[int, int, str]] = []
        self.alarms: list[dict[str, Any]] = []

    def _metric_alarms(self, where: Any) -> list[dict[str, Any]]:
        return self.alarms

    def _set_state(self, where: Any, alarm: dict[str, Any], state: str, value: float | None) -> None:
        alarm["StateValue"] = state

    def track(self, policy: dict[str, Any], target: dict[str, Any]) -> None:
        """One period's evaluation of target-tracking ``policy``, with the two alarms the control plane
        creates with it (made on its first period)."""
        if "Alarms" not in policy:
            config = policy["TargetTrackingScalingPolicyConfiguration"]
            made = alarm_requests(policy["PolicyARN"], policy["ResourceId"], config)
            self.alarms.extend(made)
            policy["Alarms"] = [{"AlarmName": a["AlarmName"]} for a in made]
        self._track(WHERE, policy, target, self._judge(WHERE))

    def _capacity(self, where: Any, rid: str, dim: str) -> int | None:
        return self.capacity

    def _scale(self, where: Any, rid: str, dim: str, capacity: int, wanted: int, cause: str) -> bool:
        self.changes.append((capacity, wanted, cause))
        self.capacity = wanted
        self._last.setdefault((where[1], rid, dim), {})["out" if wanted > capacity else "in"] = (
            time.monotonic()
        )
        return True

    def period(self, **per_copy: float) -> None:
        p = Period()
        for name, value in per_copy.items():
            p.add("InvocationsPerCopy", component_dims(name), value)
        self._history.setdefault(WHERE, collections.deque(maxlen=64)).append(p)


TRACKING = {
    "PolicyARN": "arn:tracking",
    "PolicyName": "per-copy",
    "ResourceId": "inference-component/c",
    "ScalableDimension": "sagemaker:inference-component:DesiredCopyCount",
    "TargetTrackingScalingPolicyConfiguration": {
        "TargetValue": 10.0,
        "PredefinedMetricSpecification": {
            "PredefinedMetricType": "SageMakerInferenceComponentInvocationsPerCopy"
        },
    },
}
TARGET = {"MinCapacity": 0, "MaxCapacity": 4}


def _states(scaler: RecordingAutoscaler) -> list[tuple[str | None, str | None]]:
    return [(alarm_role(a["AlarmName"], "inference-component/c"), a.get("StateValue")) for a in scaler.alarms]


def test_target_tracking_scales_out_after_high_periods_and_in_after_low_ones() -> None:
    scaler = RecordingAutoscaler()
    policy = dict(TRACKING)
    for _ in range(HIGH_PERIODS - 1):
        scaler.period(c=25.0)
        scaler.track(policy, TARGET)
    assert scaler.changes == []  # not yet: the metric must stay high for HIGH_PERIODS periods
    assert _states(scaler) == [("High", "OK"), ("Low", "OK")]
    scaler.period(c=25.0)
    scaler.track(policy, TARGET)
    assert scaler.changes[-1][:2] == (1, 3)  # ceil(1 * 25 / 10)
    high = scaler.alarms[0]["AlarmName"]
    assert high.startswith("TargetTracking-inference-component/c-AlarmHigh-")
    assert scaler.changes[-1][2].startswith(f"monitor alarm {high} in state ALARM triggered policy per-copy")
    for _ in range(LOW_PERIODS - 1):
        scaler.period(c=0.0)
        scaler.track(policy, TARGET)
    assert len(scaler.changes) == 1
    assert _states(scaler) == [("High", "OK"), ("Low", "OK")]  # 14 low periods of the 15 it needs
    scaler.period(c=0.0)
    scaler.track(policy, TARGET)
    assert scaler.changes[-1][:2] == (3, 0)  # to the minimum, 0
    assert "-AlarmLow-" in scaler.changes[-1][2]
    scaler.period()  # no copy: no value per copy, and target tracking never scales from zero
    scaler.track(policy, TARGET)
    assert len(scaler.changes) == 2


def test_target_tracking_runs_on_its_own_alarms_only() -> None:
    """A policy whose alarms are gone (deleted with it) does nothing; without scale-in it has no low
    alarm."""
    scaler = RecordingAutoscaler()
    policy = {**TRACKING, "Alarms": []}
    for _ in range(HIGH_PERIODS + 1):
        scaler.period(c=25.0)
        scaler.track(policy, TARGET)
    assert scaler.changes == []
    config = {**TRACKING["TargetTrackingScalingPolicyConfiguration"], "DisableScaleIn": True}  # type: ignore[dict-item]
    made = alarm_requests("arn:tracking", "inference-component/c", config)
    assert [a["ComparisonOperator"] for a in made] == ["GreaterThanThreshold"]
    assert made[0]["AlarmActions"] == ["arn:tracking"] and made[0]["Threshold"] == 10.0


def test_target_tracking_keeps_its_cooldown_and_the_maximum() -> None:
    scaler = RecordingAutoscaler()
    config = {**TRACKING["TargetTrackingScalingPolicyConfiguration"], "ScaleOutCooldown": 3600}  # type: ignore[dict-item]
    policy = {**TRACKING, "TargetTrackingScalingPolicyConfiguration": config}
    for _ in range(HIGH_PERIODS):
        scaler.period(c=100.0)
        scaler.track(policy, TARGET)
    assert scaler.changes[-1][:2] == (1, 4)  # ceil(10) capped at the maximum
    for _ in range(HIGH_PERIODS * 2):
        scaler.period(c=100.0)
        scaler.track(policy, {"MinCapacity": 0, "MaxCapacity": 8})
    assert len(scaler.changes) == 1  # within the scale-out cooldown


def test_an_alarm_is_judged_on_its_evaluation_periods() -> None:
    scaler = RecordingAutoscaler()
    alarm = {
        "MetricName": "InvocationsPerCopy",
        "Dimensions": [{"Name": "InferenceComponentName", "Value": "c"}],
        "Statistic": "Maximum",
        "EvaluationPeriods": 2,
        "DatapointsToAlarm": 2,
        "Threshold": 1.0,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
    }
    assert scaler._alarm_state(WHERE, alarm) == ("INSUFFICIENT_DATA", None)
    scaler.period(c=1.0)
    assert scaler._alarm_state(WHERE, alarm) == ("OK", 1.0)  # one breach of the two it needs
    scaler.period(c=2.0)
    assert scaler._alarm_state(WHERE, alarm) == ("ALARM", 2.0)
    scaler.period()
    assert scaler._alarm_state(WHERE, alarm) == ("OK", 2.0)  # missing data is not counted
    assert scaler._alarm_state(WHERE, {**alarm, "TreatMissingData": "breaching"}) == ("ALARM", 2.0)
