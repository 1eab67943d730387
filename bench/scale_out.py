"""Endpoint start and scale-out on the local SageMaker, with and without ``lmforge compile``'s artifact.

The local SageMaker (``lmforge local up``, by default ``--mode image``: each endpoint instance is
lmforge's image run by the container engine, as on SageMaker) serves one model as three endpoints on
``ml.m6i.xlarge``:

* **vllm-uncompiled**: ``option.rolling_batch=vllm`` (the vllm-cpu image), torch.compile at every start
  of every instance (an instance's caches are its own);
* **vllm-compiled**: the same folder after ``lmforge compile --image`` with the vllm-cpu image (the
  compile runs in the image the endpoint runs; the artifact travels in model.tar.gz; each container
  checks its manifest and loads the graph);
* **lmi-dist**: ``option.rolling_batch=lmi-dist`` (the cpu image), which compiles nothing.

For each: ``lmforge deploy --no-wait --build-image`` (validate, package, upload, CreateEndpoint; the
image is built and pushed to the local ECR first when it is not there), then CreateEndpoint ->
``InService`` timed by polling ``DescribeEndpoint`` every 0.2 s; then
``UpdateEndpointWeightsAndCapacities`` to 2 instances -> ``InService`` with 2 running (the scale-out),
then one invocation; then the endpoint is deleted. The instances' logs give each start's
``compile cache`` line, kept in the result.

Usage: python -m bench.scale_out [--model tiny|smollm2-135m] [--mode image|process] [--out FILE]
(default FILE: bench/results/scale-out[-smollm2-135m].json)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import record
from bench.models import DESCRIPTIONS, MODELS, TINY, result_name, write_model
from lmforge import __version__

ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS


PROPERTIES = """\
option.rolling_batch={backend}
option.dtype=fp32
option.max_rolling_batch_size=16
option.max_model_len=2048
"""
INSTANCE_TYPE = "ml.m6i.xlarge"
VLLM_IMAGE = f"lmforge/vllm-cpu:{__version__}"


def lmforge(*args: str, env: dict[str, str], timeout: float = 1800) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "lmforge", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"lmforge {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def wait_in_service(sm: Any, name: str, instances: int, timeout: float = 1800) -> float:
    """Seconds until ``name`` is InService with ``instances`` running instances."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        desc = sm.describe_endpoint(EndpointName=name)
        status = desc["EndpointStatus"]
        variants = desc.get("ProductionVariants") or [{}]
        running = variants[0].get("CurrentInstanceCount", 0)
        if status == "InService" and running == instances:
            return time.monotonic() - started
        if status == "Failed":
            raise RuntimeError(f"{name} failed: {desc.get('FailureReason')}")
        time.sleep(0.2)
    raise TimeoutError(f"{name} not InService with {instances} instances within {timeout} s")


def compile_lines(state: Path, name: str) -> list[str]:
    """Each instance's ``compile cache:`` line (its container.log), in start order."""
    lines = []
    for log in sorted((state / "endpoints" / name).glob("*/container.log"), key=lambda p: p.stat().st_mtime):
        found = [line for line in log.read_text(errors="replace").splitlines() if "compile cache:" in line]
        lines.append(found[0].split("compile cache:", 1)[1].strip() if found else "(no line)")
    return lines


def endpoint(folder: Path, name: str, env: dict[str, str], sm: Any, rt: Any, state: Path) -> dict[str, Any]:
    started = time.monotonic()
    lmforge(
        *("deploy", str(folder), "--endpoint-name", name, "--instance-type", INSTANCE_TYPE, "--no-wait"),
        "--build-image",
        env=env,
    )
    deploy_s = time.monotonic() - started
    create_s = wait_in_service(sm, name, 1)
    print(
        f"{name}: deploy (package, upload, CreateEndpoint) {deploy_s:.1f} s; InService {create_s:.1f} s later"
    )
    variant = sm.describe_endpoint(EndpointName=name)["ProductionVariants"][0]["VariantName"]
    sm.update_endpoint_weights_and_capacities(
        EndpointName=name, DesiredWeightsAndCapacities=[{"VariantName": variant, "DesiredInstanceCount": 2}]
    )
    scale_s = wait_in_service(sm, name, 2)
    print(f"{name}: scaled out to 2 instances in {scale_s:.1f} s")
    body = json.dumps({"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8}})
    reply = rt.invoke_endpoint(EndpointName=name, Body=body, ContentType="application/json")
    text = json.loads(reply["Body"].read())["generated_text"]
    lines = compile_lines(state, name)
    print(f"{name}: compile cache per instance: {lines}; reply {text!r}")
    lmforge("delete", name, env=env)
    return {
        "deploy_s": round(deploy_s, 2),
        "create_to_in_service_s": round(create_s, 2),
        "scale_out_to_2_s": round(scale_s, 2),
        "compile_cache": lines,
        "reply": text,
    }


def main() -> None:
    import boto3

    from lmforge.bench.results import machine, versions
    from lmforge.testing.server import TEST_ENV, VLLM_ENV

    parser = argparse.ArgumentParser(description="endpoint start and scale-out, compiled vs not")
    parser.add_argument("--model", choices=MODELS, default=TINY)
    parser.add_argument("--mode", choices=("image", "process"), default="image")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or RESULTS / f"{result_name('scale-out', args.model)}.json"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "local"
        base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        base.update({**TEST_ENV, **VLLM_ENV, "AWS_DEFAULT_REGION": "us-west-2"})
        up = lmforge("local", "up", "--state-dir", str(state), "--mode", args.mode, "--print-env", env=base)
        env = dict(base)
        for line in up.splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export ") :].partition("=")
                env[key] = shlex.split(value)[0]
        try:
            model = write_model(args.model, root / "model")
            folders = {}
            for name, backend in (
                ("vllm-uncompiled", "vllm"),
                ("vllm-compiled", "vllm"),
                ("lmi-dist", "lmi-dist"),
            ):
                folders[name] = root / name
                subprocess.run(["cp", "-r", str(model), str(folders[name])], check=True)
                (folders[name] / "serving.properties").write_text(PROPERTIES.format(backend=backend))
            # the images the endpoints will run, built now from this tree: `deploy --build-image` then
            # pushes these same images, and the compile below runs in the vllm-cpu one
            for flavour in ("vllm-cpu", "cpu"):
                lmforge("container", "build", flavour, env=base)
            started = time.monotonic()
            # inside the image the endpoint runs: its vLLM, torch and exact Python (compile_in_image)
            lmforge("compile", str(folders["vllm-compiled"]), "--image", VLLM_IMAGE, env=base)
            compile_s = time.monotonic() - started
            print(f"lmforge compile: {compile_s:.1f} s")
            keys = {
                "endpoint_url": env["AWS_ENDPOINT_URL"],
                "region_name": env["AWS_DEFAULT_REGION"],
                "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
                "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
            }
            sm = boto3.client("sagemaker", **keys)
            rt = boto3.client(
                "sagemaker-runtime",
                **{
                    **keys,
                    "endpoint_url": env.get("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", keys["endpoint_url"]),
                },
            )
            runs = {name: endpoint(folder, name, env, sm, rt, state) for name, folder in folders.items()}
        finally:
            lmforge("local", "down", "--state-dir", str(state), env=base)
    uncompiled, compiled = runs["vllm-uncompiled"], runs["vllm-compiled"]
    result = {
        "name": result_name("scale-out", args.model),
        "machine": machine(),
        "versions": versions(),
        "command": "python -m bench.scale_out"
        + ("" if args.model == TINY else f" --model {args.model}")
        + ("" if args.mode == "image" else f" --mode {args.mode}"),
        "model": DESCRIPTIONS[args.model],
        "settings": {"mode": args.mode, "instance_type": INSTANCE_TYPE, "properties": PROPERTIES},
        "compile": f"lmforge compile DIR --image {VLLM_IMAGE}",
        "compile_s": round(compile_s, 2),
        "runs": runs,
        "compiled_over_uncompiled": {
            "create_to_in_service": round(
                compiled["create_to_in_service_s"] / uncompiled["create_to_in_service_s"], 3
            ),
            "scale_out_to_2": round(compiled["scale_out_to_2_s"] / uncompiled["scale_out_to_2_s"], 3),
        },
    }
    record.write(out, result, section)


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    runs = result["runs"]
    rows = "\n".join(
        f"| {name} | {r['create_to_in_service_s']:.1f} | {r['scale_out_to_2_s']:.1f} | "
        f"{', '.join(r['compile_cache'])} | {r['deploy_s']:.1f} |"
        for name, r in runs.items()
    )
    ratio = result["compiled_over_uncompiled"]
    settings = result["settings"]
    header = (
        "| endpoint | CreateEndpoint -> InService (s) | 1 -> 2 instances (s) | compile cache per instance "
        "| deploy: package, upload, create (s) |\n| --- | --- | --- | --- | --- |"
    )
    return f"""## Endpoint start and scale-out, compiled vs not (`bench/scale_out.py`)

The local SageMaker in {settings["mode"]} mode ({result["model"]}, {settings["instance_type"]}, lmforge's
vllm-cpu and cpu images run by the container engine on this machine): `lmforge deploy --no-wait` then
CreateEndpoint -> InService, then `UpdateEndpointWeightsAndCapacities` 1 -> 2 instances -> InService with
2 running, timed by polling DescribeEndpoint. The compiled folder was made by `{result["compile"]}`
({result["compile_s"]:.0f} s). Each instance's start log says whether it used the artifact
(`compile cache:`).

{header}
{rows}

Compiled / uncompiled: {ratio["create_to_in_service"]:.2f} of the time to InService and
{ratio["scale_out_to_2"]:.2f} of the scale-out. Result: `bench/results/{result["name"]}.json`.
"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    return record.section(record.ORDER["scale_out"], report(result))


if __name__ == "__main__":
    main()
