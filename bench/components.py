"""Two models as inference components of one endpoint on the local SageMaker: scale from zero, scale
out under load, and the requests lost to a scale-in and to a rolling update.

The local SageMaker (``lmforge local up``, process mode by default: each copy is an ``lmforge serve``
process; its metrics period ``LMFORGE_LOCAL_METRICS_PERIOD_S``, 1 s here, so each second stands for
CloudWatch's minute) gets one ``ml.m5.xlarge`` endpoint created for components by ``lmforge deploy
--inference-component``, with SmolLM2-135M (LMI-Dist, fp32) and the tiny model as two components,
each with ``--autoscale 0:2`` (target tracking on invocations per copy, and the step policy + alarm on
``NoCapacityInvocationFailures`` that scale from zero). Then, timed by polling:

* **scale from zero**, per component: at 0 copies, the first invocation is refused (SageMaker's
  no-capacity error); the client retries every 0.2 s; the figure is the time from the refused request
  to the first answer (the alarm's period, the step policy, the copy's start);
* **1 -> 2 copies under load** (SmolLM2): the component at 1 copy with a minimum of 1 for this step
  (so that neither the low alarm of its idle periods nor the step policy from zero can move it), and
  its high alarm and the step policy's alarm out of ``ALARM``; then four clients invoke without
  pause; the figure is the time from the start of the load to ``CurrentCopyCount`` 2, and to the
  scaling activity that asked for it, which must be the target-tracking policy's (its cause names
  the policy's ``TargetTracking-...-AlarmHigh-...`` alarm; another cause fails the run rather than
  record a figure that is not this one);
* **requests lost during a scale-in** (SmolLM2, scaling deregistered so nothing fights it): two
  clients invoke while ``UpdateInferenceComponentRuntimeConfig`` takes 2 copies to 1; failed
  requests counted (goal 0);
* **requests lost during a rolling update** (SmolLM2, 2 copies, ``RollingUpdatePolicy`` one copy per
  batch): two clients invoke while ``UpdateInferenceComponent`` replaces both copies; failed
  requests counted (goal 0).

Usage: python -m bench.components [--mode process|image] [--period S] [--models smollm2,tiny]
[--clients N] [--out FILE]. ``--models``: the components deployed, the first of them the one scaled
out, in and rolled (``--models tiny`` is a quick check of the bench itself); default FILE:
bench/results/components-smollm2-135m.json for the default models, else /tmp/components-<models>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import record
from bench.models import DESCRIPTIONS, SMOLLM2, TINY, write_model
from bench.scale_out import lmforge

RESULTS = record.RESULTS
INSTANCE_TYPE = "ml.m5.xlarge"
ENDPOINT = "bench-components"
PROPERTIES = """\
option.rolling_batch=lmi-dist
option.dtype=fp32
option.max_rolling_batch_size=8
option.max_model_len=1024
"""
BODY = json.dumps({"inputs": "def fibonacci(n):", "parameters": {"max_new_tokens": 8}})
#: what each component reserves per copy (an ml.m5.xlarge has 4 vCPUs and 16 GiB)
COMPONENTS = {"smollm2": (SMOLLM2, "1", "3072"), "tiny": (TINY, "1", "1024")}


def wait_copies(sm: Any, name: str, count: int, timeout: float = 600) -> float:
    """Seconds until ``name`` is InService with ``count`` current (and desired) copies."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        desc = sm.describe_inference_component(InferenceComponentName=name)
        runtime = desc["RuntimeConfig"]
        if (
            desc["InferenceComponentStatus"] == "InService"
            and runtime["CurrentCopyCount"] == count == runtime["DesiredCopyCount"]
        ):
            return time.monotonic() - started
        time.sleep(0.2)
    raise TimeoutError(f"{name} did not reach {count} copies within {timeout} s")


class Load:
    """``clients`` threads invoking ``component`` without pause until stopped; answers and failures
    counted."""

    def __init__(self, rt: Any, component: str, clients: int) -> None:
        self.rt, self.component = rt, component
        self.answers = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                reply = self.rt.invoke_endpoint(
                    EndpointName=ENDPOINT,
                    InferenceComponentName=self.component,
                    Body=BODY,
                    ContentType="application/json",
                )
                reply["Body"].read()
                with self._lock:
                    self.answers += 1
            except Exception as exc:  # each one is a lost request
                with self._lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}"[:300])

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        for t in self._threads:
            t.join(120)

    def more(self, count: int, timeout: float = 300) -> None:
        """Wait for ``count`` more answers (the copies that are left serve)."""
        target = self.answers + count
        started = time.monotonic()
        while self.answers < target and time.monotonic() - started < timeout:
            time.sleep(0.1)


def tracking_alarm(aas: Any, component: str) -> str:
    """The name of the high alarm of ``component``'s target-tracking policy (what a scale-out by that
    policy names as its cause)."""
    from lmforge.deploy import autoscaling

    rid = autoscaling.component_resource_id(component)
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=rid)["ScalingPolicies"]
    for policy in policies:
        if policy["PolicyType"] == "TargetTrackingScaling":
            for alarm in policy.get("Alarms") or []:
                if alarm["AlarmName"].startswith(f"TargetTracking-{rid}-AlarmHigh-"):
                    return str(alarm["AlarmName"])
    raise RuntimeError(f"{rid} has no target-tracking policy with a high alarm: {policies}")


def wait_not_alarming(cw: Any, names: list[str], timeout: float = 300) -> None:
    """Until none of the alarms ``names`` is in ``ALARM`` (the evaluator judges them each period)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        alarms = cw.describe_alarms(AlarmNames=names)["MetricAlarms"]
        if all(a["StateValue"] != "ALARM" for a in alarms):
            return
        time.sleep(0.2)
    raise TimeoutError(f"alarms {names} still in ALARM after {timeout} s")


def scale_out(sm: Any, rt: Any, aas: Any, cw: Any, component: str, clients: int) -> dict[str, Any]:
    """1 -> 2 copies under load, by the target-tracking policy (see the module's docstring)."""
    from lmforge.deploy import autoscaling

    rid = autoscaling.component_resource_id(component)
    high = tracking_alarm(aas, component)
    aas.register_scalable_target(  # a minimum of 1 for this step: nothing but a scale-out can move it
        ServiceNamespace="sagemaker",
        ResourceId=rid,
        ScalableDimension=autoscaling.COMPONENT_DIMENSION,
        MinCapacity=1,
        MaxCapacity=2,
    )
    sm.update_inference_component_runtime_config(
        InferenceComponentName=component, DesiredRuntimeConfig={"CopyCount": 1}
    )
    wait_copies(sm, component, 1)
    wait_not_alarming(cw, [high, autoscaling.component_names(component)[2]])

    def activities() -> list[dict[str, Any]]:
        return list(
            aas.describe_scaling_activities(
                ServiceNamespace="sagemaker",
                ResourceId=rid,
                ScalableDimension=autoscaling.COMPONENT_DIMENSION,
            )["ScalingActivities"]
        )

    before = {a["ActivityId"] for a in activities()}
    wall, started = time.time(), time.monotonic()
    with Load(rt, component, clients) as load:
        wait_copies(sm, component, 2)
        out_s = time.monotonic() - started
        load.more(10)
    new = [a for a in activities() if a["ActivityId"] not in before]
    asked = [a for a in new if a["Description"] == "Setting desired copy count to 2."]
    if not asked or high not in asked[-1]["Cause"]:
        raise RuntimeError(f"{component} reached 2 copies, but not by its target-tracking policy: {new}")
    start = asked[-1]["StartTime"]
    policy_s = (start.timestamp() if hasattr(start, "timestamp") else float(start)) - wall
    print(
        f"{component}: 1 -> 2 copies under load in {out_s:.1f} s (the policy asked after {policy_s:.1f} s; "
        f"{len(load.failures)} failed)",
        flush=True,
    )
    return {
        "seconds": round(out_s, 2),
        "policy_s": round(policy_s, 2),
        "cause": asked[-1]["Cause"],
        "clients": clients,
        "answers": load.answers,
        "failed": len(load.failures),
        "failures": load.failures[:5],
    }


def scale_from_zero(sm: Any, rt: Any, component: str) -> dict[str, Any]:
    sm.update_inference_component_runtime_config(
        InferenceComponentName=component, DesiredRuntimeConfig={"CopyCount": 0}
    )
    wait_copies(sm, component, 0)
    refused = 0
    first = None
    started = time.monotonic()
    while time.monotonic() - started < 900:
        try:
            reply = rt.invoke_endpoint(
                EndpointName=ENDPOINT,
                InferenceComponentName=component,
                Body=BODY,
                ContentType="application/json",
            )
            reply["Body"].read()
            break
        except rt.exceptions.ValidationError:
            refused += 1
            if first is None:
                first = time.monotonic()
            time.sleep(0.2)
    else:
        raise TimeoutError(f"{component} was not scaled from zero")
    seconds = time.monotonic() - (first or started)
    # with no Cooldown the step policy adds a copy each period the refusals go on: count what it reached
    desired = sm.describe_inference_component(InferenceComponentName=component)["RuntimeConfig"][
        "DesiredCopyCount"
    ]
    print(
        f"{component}: refused at 0 copies -> first answer {seconds:.1f} s ({refused} refusals)", flush=True
    )
    return {"refused_to_first_answer_s": round(seconds, 2), "refusals": refused, "copies_then": desired}


def main() -> None:
    import boto3

    from lmforge.bench.results import machine, versions
    from lmforge.deploy import autoscaling
    from lmforge.testing.server import TEST_ENV

    parser = argparse.ArgumentParser(description="inference components: scale from zero, out, in, rolling")
    parser.add_argument("--mode", choices=("image", "process"), default="process")
    parser.add_argument("--period", type=float, default=1.0, help="LMFORGE_LOCAL_METRICS_PERIOD_S")
    parser.add_argument(
        "--models",
        default=",".join(COMPONENTS),
        help="the components to deploy, comma-separated (of: %(default)s); the first is scaled and rolled",
    )
    parser.add_argument("--clients", type=int, default=4, help="clients of the 1 -> 2 load")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in COMPONENTS]
    if not names or unknown or len(set(names)) != len(names):
        parser.error(f"--models {args.models!r}: name each of {', '.join(COMPONENTS)} at most once")
    if args.clients < 1:
        parser.error(f"--clients {args.clients}: at least 1")
    components = {n: COMPONENTS[n] for n in names}
    scaled = names[0]
    default = names == list(COMPONENTS)
    out = args.out or (
        RESULTS / f"components-{SMOLLM2}.json" if default else Path(f"/tmp/components-{'-'.join(names)}.json")
    )
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "local"
        base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        base.update({**TEST_ENV, "AWS_DEFAULT_REGION": "us-west-2"})
        base["LMFORGE_LOCAL_METRICS_PERIOD_S"] = str(args.period)
        up = lmforge("local", "up", "--state-dir", str(state), "--mode", args.mode, "--print-env", env=base)
        env = dict(base)
        for line in up.splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export ") :].partition("=")
                env[key] = shlex.split(value)[0]
        try:
            keys = {
                "region_name": env["AWS_DEFAULT_REGION"],
                "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
                "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
            }
            sm = boto3.client("sagemaker", endpoint_url=env["AWS_ENDPOINT_URL"], **keys)
            rt = boto3.client(
                "sagemaker-runtime", endpoint_url=env["AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME"], **keys
            )
            aas = boto3.client("application-autoscaling", endpoint_url=env["AWS_ENDPOINT_URL"], **keys)
            cw = boto3.client("cloudwatch", endpoint_url=env["AWS_ENDPOINT_URL"], **keys)
            deploy_s = {}
            for name, (model, cpus, memory) in components.items():
                folder = write_model(model, root / name)
                (folder / "serving.properties").write_text(PROPERTIES)
                started = time.monotonic()
                lmforge(
                    *("deploy", str(folder), "--endpoint-name", ENDPOINT, "--instance-type", INSTANCE_TYPE),
                    *("--inference-component", name, "--cpus", cpus, "--memory-mb", memory),
                    *("--max-instances", "2", "--artifact-format", "prefix"),
                    env=env,
                )
                deploy_s[name] = round(time.monotonic() - started, 2)
                # scaling as `--autoscale 0:2` registers it, with no cooldowns (the bench times them)
                autoscaling.register_component(
                    aas,
                    cw,
                    name,
                    autoscaling.Autoscale(0, 2, 4.0, 0, 0),
                    lambda line: print(line, flush=True),
                )
                print(f"{name}: deployed in {deploy_s[name]:.1f} s", flush=True)
            figures["deploy_s"] = deploy_s
            figures["scale_from_zero"] = {name: scale_from_zero(sm, rt, name) for name in components}

            figures["scale_out_1_to_2"] = scale_out(sm, rt, aas, cw, scaled, args.clients)

            autoscaling.deregister_component(aas, cw, scaled, lambda line: print(line, flush=True))
            with Load(rt, scaled, 2) as load:
                load.more(5)
                sm.update_inference_component_runtime_config(
                    InferenceComponentName=scaled, DesiredRuntimeConfig={"CopyCount": 1}
                )
                wait_copies(sm, scaled, 1)
                load.more(20)
            print(f"{scaled}: scale-in 2 -> 1: {len(load.failures)} of {load.answers} lost", flush=True)
            figures["scale_in_2_to_1"] = {
                "answers": load.answers,
                "lost": len(load.failures),
                "failures": load.failures[:5],
            }

            sm.update_inference_component_runtime_config(
                InferenceComponentName=scaled, DesiredRuntimeConfig={"CopyCount": 2}
            )
            wait_copies(sm, scaled, 2)
            spec = sm.describe_inference_component(InferenceComponentName=scaled)["Specification"]
            new_spec = {
                "ModelName": spec["ModelName"],
                "ComputeResourceRequirements": spec["ComputeResourceRequirements"],
                "Container": {"Environment": {"BENCH_ROLL": "1"}},
            }
            with Load(rt, scaled, 2) as load:
                load.more(5)
                started = time.monotonic()
                sm.update_inference_component(
                    InferenceComponentName=scaled,
                    Specification=new_spec,
                    DeploymentConfig={
                        "RollingUpdatePolicy": {
                            "MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1},
                            "WaitIntervalInSeconds": 0,
                        }
                    },
                )
                while True:
                    desc = sm.describe_inference_component(InferenceComponentName=scaled)
                    env_now = (desc["Specification"].get("Container") or {}).get("Environment")
                    if desc["InferenceComponentStatus"] == "InService" and env_now == {"BENCH_ROLL": "1"}:
                        break
                    if desc.get("FailureReason"):
                        raise RuntimeError(f"the rolling update failed: {desc['FailureReason']}")
                    time.sleep(0.2)
                roll_s = time.monotonic() - started
                load.more(20)
            print(
                f"{scaled}: rolling update in {roll_s:.1f} s: {len(load.failures)} of {load.answers} lost",
                flush=True,
            )
            figures["rolling_update"] = {
                "seconds": round(roll_s, 2),
                "batch": 1,
                "copies": 2,
                "answers": load.answers,
                "lost": len(load.failures),
                "failures": load.failures[:5],
            }
            lmforge("delete", ENDPOINT, env=env)
        finally:
            lmforge("local", "down", "--state-dir", str(state), env=base)
    result = {
        "name": out.stem,
        "machine": machine(),
        "versions": versions(),
        "command": "python -m bench.components"
        + ("" if args.mode == "process" else f" --mode {args.mode}")
        + ("" if args.period == 1.0 else f" --period {args.period:g}")
        + ("" if default else f" --models {','.join(names)}")
        + ("" if args.clients == 4 else f" --clients {args.clients}"),
        "models": {name: DESCRIPTIONS[model] for name, (model, _, _) in components.items()},
        "settings": {
            "mode": args.mode,
            "instance_type": INSTANCE_TYPE,
            "metrics_period_s": args.period,
            "properties": PROPERTIES,
            "requirements": {name: {"cpus": c, "memory_mb": m} for name, (_, c, m) in components.items()},
            "scaled": scaled,
            "autoscale": "0:2, target 4 invocations per copy per period, no cooldowns",
        },
        **figures,
    }
    record.write(out, result, section)


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    zero = result["scale_from_zero"]
    rows = [
        [name, f"{z['refused_to_first_answer_s']:.1f}", str(z["refusals"]), str(z.get("copies_then", "?"))]
        for name, z in zero.items()
    ]
    scale_out, scale_in, roll = (
        result["scale_out_1_to_2"],
        result["scale_in_2_to_1"],
        result["rolling_update"],
    )
    settings = result["settings"]
    scaled = settings.get("scaled", "smollm2")
    zero_table = record.table(
        [
            "component",
            "refused request at 0 copies -> first answer (s)",
            "refusals before it (retried every 0.2 s)",
            "copies by then",
        ],
        rows,
    )
    figures = record.table(
        ["figure", "value"],
        [
            [
                f"{scaled} 1 -> 2 copies under load ({scale_out['clients']} clients): load start -> the "
                "target-tracking policy's scale-out (s)",
                f"{scale_out['policy_s']:.1f}" if "policy_s" in scale_out else "?",
            ],
            [
                f"{scaled} 1 -> 2 copies under load: load start -> 2 copies serving (s)",
                f"{scale_out['seconds']:.1f}",
            ],
            [
                "requests failed during the scale-out (goal 0)",
                f"{scale_out['failed']} of {scale_out['answers'] + scale_out['failed']}",
            ],
            [
                "requests lost during a scale-in 2 -> 1 (goal 0)",
                f"{scale_in['lost']} of {scale_in['answers'] + scale_in['lost']}",
            ],
            [
                "requests lost during a rolling update of 2 copies, batch 1 (goal 0)",
                f"{roll['lost']} of {roll['answers'] + roll['lost']}",
            ],
            [
                "rolling update, UpdateInferenceComponent -> InService on the new specification (s)",
                f"{roll['seconds']:.1f}",
            ],
        ],
    )
    models = " and ".join(f"`{name}` ({text.split(' (')[0]})" for name, text in result["models"].items())
    return f"""## Inference components: scale from zero, out, in and rolling (`bench/components.py`)

Components on one {settings["instance_type"]} endpoint of the local SageMaker ({settings["mode"]}
mode, metrics and scaling every {settings["metrics_period_s"]:g} s): {models}
(LMI-Dist, fp32), each `lmforge deploy --inference-component` with scaling as `--autoscale 0:2`
registers it (target tracking on invocations per copy, step policy on `NoCapacityInvocationFailures`
from zero; no cooldowns). The 1 -> 2 scale-out starts at 1 copy with a minimum of 1 and is the
target-tracking policy's (its high alarm is the scaling activity's cause).

{zero_table}

{figures}

Result: `bench/results/{result["name"]}.json`.
"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    lost = result["scale_in_2_to_1"]["lost"] + result["rolling_update"]["lost"]
    summary = [
        {
            "scenario": "components: requests lost to scale-in and rolling update",
            "figure": str(lost),
            "target": "0",
            "ratio": 1.0 if lost == 0 else 0.0,
        }
    ]
    return record.section(record.ORDER.get("components", 2200), report(result), summary)


if __name__ == "__main__":
    main()
