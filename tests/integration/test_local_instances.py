"""An endpoint with more than one instance on the local SageMaker, through boto3 and the real CLI:
requests spread as the variant's routing strategy says, sticky sessions stay on the instance that
opened them, ``UpdateEndpointWeightsAndCapacities`` starts and stops instances, and
``lmforge deploy --autoscale`` registers Application Auto Scaling that the control plane lists back.

Where each request went is read from the local runtime's ``GET /lmforge/instances`` (lmforge's, not
an AWS operation) and checked against each instance's own ``/metrics``.

What the instances serve does not matter here, so they serve a user's ``model.py`` (LMI's custom
handler: a streamed or a JSON reply, no model) rather than the tiny model: this module starts five
instances, and an LMI-Dist engine core is ~3.5 CPU-s of imports apiece that no check here reads.
The engine through the local SageMaker is test_local_sagemaker.py's, on the tiny model.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.local_sagemaker import boto3_clients, handler_model, lmforge

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("local-sagemaker")]

NAME = "two-instances"
VARIANT = "AllTraffic"
BODY = json.dumps({"inputs": "def f(x):", "parameters": {"max_new_tokens": 2}})


def instances(local: dict[str, str], endpoint: str = NAME) -> list[dict[str, Any]]:
    url = local["AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME"] + "/lmforge/instances"
    with urllib.request.urlopen(url, timeout=10) as resp:
        report = json.loads(resp.read())["instances"]
    return [i for i in report if i["endpoint"] == endpoint]


def served_by_container(port: int) -> int:
    """The 200 answers an instance's own server counted (its /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    match = re.search(r'^lmforge_responses_total\{code="200"\} (\d+)', text, re.M)
    return int(match.group(1)) if match else 0


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return handler_model(tiny_model, tmp_path_factory.mktemp("handler") / "model")


def deploy_two(local: dict[str, str], model: Path, name: str) -> str:
    """``name``: two instances, least-outstanding-requests routing, autoscaling 2 to 4."""
    out = lmforge(
        *("deploy", str(model), "--endpoint-name", name, "--instance-type", "ml.g5.xlarge"),
        *("--instance-count", "2", "--routing-strategy", "LEAST_OUTSTANDING_REQUESTS"),
        *("--autoscale", "2:4", "--autoscale-target", "25"),
        *("--env", "OPTION_ENABLE_STATEFUL_SESSIONS=true", "--artifact-format", "prefix"),
        env=local,
    )
    assert f"{name}: InService (created)" in out.stdout
    assert f"autoscaling endpoint/{name}/variant/AllTraffic: 2 to 4 instances" in out.stderr
    return name


@pytest.fixture(scope="module")
def endpoint(local: dict[str, str], model: Path) -> Iterator[str]:
    """The module's endpoint, deleted after its last test; a test that changes it puts it back."""
    yield deploy_two(local, model, NAME)
    lmforge("delete", NAME, env=local)


def test_least_outstanding_requests_spreads_concurrent_streams(
    endpoint: str, local: dict[str, str], clients: dict[str, Any]
) -> None:
    """Four streams held open together: each routing decision sees the others in flight, so the least
    outstanding strategy puts exactly two on each instance."""
    smr = clients["sagemaker-runtime"]
    before = {i["port"]: i["invocations"] for i in instances(local)}
    assert len(before) == 2 and {i["routing_strategy"] for i in instances(local)} == {
        "LEAST_OUTSTANDING_REQUESTS"
    }
    all_open = threading.Barrier(4, timeout=120)
    errors: list[BaseException] = []
    # long enough to still be generating when the last of the four is routed
    parameters = {"max_new_tokens": 400, "ignore_eos_token": True}
    body = json.dumps({"inputs": "def f(x):", "parameters": parameters, "stream": True})

    def stream() -> None:
        try:
            resp = smr.invoke_endpoint_with_response_stream(
                EndpointName=endpoint, Body=body, ContentType="application/json"
            )
            events = iter(resp["Body"])
            next(events)  # routed, and in flight
            all_open.wait()
            for _ in events:
                pass
        except BaseException as exc:
            errors.append(exc)
            all_open.abort()

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    after = instances(local)
    assert sorted(i["invocations"] - before[i["port"]] for i in after) == [2, 2]
    # the runtime counts a stream as outstanding until its relay has sent the last bytes, which the
    # client may read first: every count must be back to 0 within moments, not at this very instant
    deadline = time.monotonic() + 10
    while any(i["outstanding"] for i in after):
        assert time.monotonic() < deadline, f"outstanding requests never drained: {after}"
        time.sleep(0.05)
        after = instances(local)
    # each instance's own server counted what the router says it sent
    assert sum(served_by_container(i["port"]) for i in after) >= sum(i["invocations"] for i in after) - 1


def test_sticky_session_stays_on_its_instance(
    endpoint: str, local: dict[str, str], clients: dict[str, Any]
) -> None:
    """A session lives in one instance's memory: every request of it must reach that instance (the
    other would answer 400), whatever the routing strategy would pick."""
    smr = clients["sagemaker-runtime"]
    opened = smr.invoke_endpoint(
        EndpointName=endpoint,
        Body=json.dumps({"requestType": "NEW_SESSION"}),
        ContentType="application/json",
        SessionId="NEW_SESSION",
    )
    session = opened["NewSessionId"].split(";")[0]
    holder = [i for i in instances(local) if i["sessions"] == 1]
    assert len(holder) == 1
    before = holder[0]["invocations"]
    for _ in range(8):  # without affinity, half of these would land on the other instance
        resp = smr.invoke_endpoint(
            EndpointName=endpoint, Body=BODY, ContentType="application/json", SessionId=session
        )
        assert "generated_text" in json.loads(resp["Body"].read())
    now = {i["port"]: i for i in instances(local)}
    assert now[holder[0]["port"]]["invocations"] - before == 8
    closed = smr.invoke_endpoint(
        EndpointName=endpoint,
        Body=json.dumps({"requestType": "CLOSE"}),
        ContentType="application/json",
        SessionId=session,
    )
    assert closed["ClosedSessionId"] == session
    assert all(i["sessions"] == 0 for i in instances(local))


def test_autoscaling_is_registered_and_capacity_changes_start_instances(
    endpoint: str, local: dict[str, str], clients: dict[str, Any]
) -> None:
    aas = boto3_clients(local, "application-autoscaling")["application-autoscaling"]
    sm = clients["sagemaker"]
    rid = f"endpoint/{endpoint}/variant/{VARIANT}"
    targets = aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[rid])[
        "ScalableTargets"
    ]
    assert [(t["MinCapacity"], t["MaxCapacity"], t["ScalableDimension"]) for t in targets] == [
        (2, 4, "sagemaker:variant:DesiredInstanceCount")
    ]
    (policy,) = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=rid)["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 25.0
    assert (
        tracking["PredefinedMetricSpecification"]["PredefinedMetricType"]
        == "SageMakerVariantInvocationsPerInstance"
    )

    # what Application Auto Scaling calls when the policy fires: one more instance, then back to two
    for count in (3, 2):
        sm.update_endpoint_weights_and_capacities(
            EndpointName=endpoint,
            DesiredWeightsAndCapacities=[{"VariantName": VARIANT, "DesiredInstanceCount": count}],
        )
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName=endpoint, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
        )
        (variant,) = sm.describe_endpoint(EndpointName=endpoint)["ProductionVariants"]
        assert variant["CurrentInstanceCount"] == variant["DesiredInstanceCount"] == count
        assert len(instances(local)) == count
    with pytest.raises(sm.exceptions.ClientError, match="at least one instance"):
        sm.update_endpoint_weights_and_capacities(
            EndpointName=endpoint,
            DesiredWeightsAndCapacities=[{"VariantName": VARIANT, "DesiredInstanceCount": 0}],
        )


def test_redeploy_keeps_autoscaling_and_random_routing_reaches_both(
    model: Path, local: dict[str, str], clients: dict[str, Any]
) -> None:
    """A redeploy takes the scalable target off for the update and puts it back; RANDOM routing sends
    sequential requests to both instances. On an endpoint of its own, which it deletes: the module's
    keeps its routing strategy whatever order the tests run in."""
    endpoint = deploy_two(local, model, "two-redeployed")
    out = lmforge(
        *("deploy", str(model), "--endpoint-name", endpoint, "--instance-type", "ml.g5.xlarge"),
        *("--instance-count", "2", "--routing-strategy", "RANDOM", "--artifact-format", "prefix"),
        env=local,
    )
    assert f"{endpoint}: InService (updated)" in out.stdout
    assert "deregistered" in out.stderr and "2 to 4 instances" in out.stderr
    aas = boto3_clients(local, "application-autoscaling")["application-autoscaling"]
    rid = f"endpoint/{endpoint}/variant/{VARIANT}"
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[rid])["ScalableTargets"]
    smr = clients["sagemaker-runtime"]
    for _ in range(24):  # all on one instance: 2 ** -23
        smr.invoke_endpoint(EndpointName=endpoint, Body=BODY, ContentType="application/json")
    report = instances(local, endpoint)
    assert {i["routing_strategy"] for i in report} == {"RANDOM"}
    assert len(report) == 2 and all(i["invocations"] > 0 for i in report), report

    lmforge("delete", endpoint, env=local)
    assert not aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[rid])[
        "ScalableTargets"
    ]
    assert instances(local, endpoint) == []
