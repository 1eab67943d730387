"""The user's main job against the local SageMaker, with the real boto3 client and the real CLI:
package -> upload -> deploy -> InService -> streamed tokens; failures, updates, deletes, wire errors.

One local SageMaker (``lmforge local up``, a separate process) serves the whole module.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmforge.engines.lmi_dist import ipc
from tests.local_sagemaker import REGION, base_env, handler_model, lmforge, parse_exports
from tests.polling import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("local-sagemaker")]

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def endpoint(local: dict[str, str], tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model deployed with ``lmforge deploy`` (validate, plan, package, upload, create, wait)."""
    name = "tiny-llm"
    out = lmforge(
        "deploy", str(tiny_model), "--endpoint-name", name, "--instance-type", "ml.g5.2xlarge", env=local
    )
    assert f"{name}: InService (created)" in out.stdout
    assert "[3/5] packing" in out.stderr or "upload" in out.stderr
    assert "Next:" in out.stderr
    return name


def _stream(smr: Any, name: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The objects of a streamed answer, and how many ``PayloadPart`` events carried them."""
    from lmforge.client import iter_stream_objects

    resp = smr.invoke_endpoint_with_response_stream(
        EndpointName=name, Body=json.dumps(body), ContentType="application/json"
    )
    assert resp["ContentType"] == "application/jsonlines"
    assert resp["InvokedProductionVariant"] == "AllTraffic"
    parts = 0

    def counted(events: Any) -> Iterator[Any]:
        nonlocal parts
        for event in events:
            parts += "PayloadPart" in event
            yield event

    objs = list(iter_stream_objects(counted(resp["Body"])))
    return objs, parts


def test_deploy_then_stream_equals_non_streamed(endpoint: str, clients: dict[str, Any]) -> None:
    sm, smr = clients["sagemaker"], clients["sagemaker-runtime"]
    desc = sm.describe_endpoint(EndpointName=endpoint)
    assert desc["EndpointStatus"] == "InService"
    config = sm.describe_endpoint_config(EndpointConfigName=desc["EndpointConfigName"])
    variant = config["ProductionVariants"][0]
    assert variant["InstanceType"] == "ml.g5.2xlarge"  # moto alone refuses g5
    assert 60 <= variant["ContainerStartupHealthCheckTimeoutInSeconds"] <= 3600

    params = {"max_new_tokens": 40, "details": True}
    objs, parts = _stream(smr, endpoint, {"inputs": PROMPT, "parameters": params, "stream": True})
    assert len(objs) == 40 and all("token" in o for o in objs)
    final = objs[-1]
    assert final["details"]["finish_reason"] == "length"
    assert final["details"]["generated_tokens"] == 40
    streamed = "".join(o["token"]["text"] for o in objs)
    assert streamed == final["generated_text"]
    # relayed as produced, not held to the end: the container writes each token as an HTTP chunk of
    # its own (test_http_contract's), and the runtime frames each chunk it reads as a PayloadPart
    assert parts >= len(objs), (parts, len(objs))

    resp = smr.invoke_endpoint(
        EndpointName=endpoint,
        Body=json.dumps({"inputs": PROMPT, "parameters": {"max_new_tokens": 40}}),
        ContentType="application/json",
    )
    assert json.loads(resp["Body"].read())["generated_text"] == streamed


def test_cli_invoke_streams_the_same_text(
    endpoint: str, local: dict[str, str], clients: dict[str, Any]
) -> None:
    out = lmforge("invoke", endpoint, PROMPT, "--stream", "--max-new-tokens", "12", "--details", env=local)
    resp = clients["sagemaker-runtime"].invoke_endpoint(
        EndpointName=endpoint,
        Body=json.dumps({"inputs": PROMPT, "parameters": {"max_new_tokens": 12}}),
        ContentType="application/json",
    )
    assert out.stdout.rstrip("\n") == json.loads(resp["Body"].read())["generated_text"]
    assert json.loads(out.stderr[out.stderr.index("{") :])["finish_reason"] == "length"


def _openai_client(local: dict[str, str], path: str, token: str | None = None) -> Any:
    """The official ``openai`` client on SageMaker's OpenAI-compatible path of the local runtime,
    with a SageMaker bearer token made from the local SageMaker's credentials."""
    import openai
    from botocore.credentials import Credentials

    from lmforge.aws.bearer import bearer_token

    if token is None:
        creds = Credentials(local["AWS_ACCESS_KEY_ID"], local["AWS_SECRET_ACCESS_KEY"])
        token = bearer_token(REGION, credentials=creds, expires_s=300)
    base = local["AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME"].rstrip("/")
    return openai.OpenAI(base_url=f"{base}{path}/openai/v1", api_key=token, max_retries=0, timeout=60)


def test_the_official_openai_client_on_sagemakers_openai_path(endpoint: str, local: dict[str, str]) -> None:
    """``base_url=<runtime>/endpoints/<name>/openai/v1`` with a bearer token: chat streamed and not,
    as SageMaker's own example sends it (``model=""``), the container's 400 with its param, the
    container's 404 for a model it does not serve, and the runtime's own refusals (no token, an
    expired one, a route it does not forward, an unknown endpoint) in OpenAI's error shape."""
    import openai

    client = _openai_client(local, f"/endpoints/{endpoint}")
    messages: Any = [{"role": "user", "content": "Say hello"}]
    whole = client.chat.completions.create(model="", messages=messages, max_tokens=8, temperature=0)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    chunks = list(
        client.chat.completions.create(
            model="",
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="", messages=messages, max_tokens=2, extra_body={"min_tokens": 5}
        )
    assert bad.value.param == "min_tokens" and 'from primary with message "' in bad.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model=endpoint, messages=messages, max_tokens=2, stream=True)
    assert (
        unknown.value.param == "model" and f"The model `{endpoint}` does not exist" in unknown.value.message
    )
    from botocore.credentials import Credentials

    from lmforge.aws.bearer import bearer_token

    brief = bearer_token(REGION, credentials=Credentials("testing", "testing"), expires_s=1)
    with pytest.raises(openai.AuthenticationError, match="sagemaker-api-key-"):
        _openai_client(local, f"/endpoints/{endpoint}", token="not-a-token").chat.completions.create(
            model="", messages=messages, max_tokens=2
        )
    deadline = time.monotonic() + 60  # a hang guard: the token lasts a second
    refused: openai.AuthenticationError | None = None
    while refused is None:  # accepted until it expires, then refused as expired
        try:
            _openai_client(local, f"/endpoints/{endpoint}", token=brief).chat.completions.create(
                model="", messages=messages, max_tokens=2
            )
        except openai.AuthenticationError as exc:
            refused = exc
            continue
        assert time.monotonic() < deadline, "a one-second token is still accepted"
        time.sleep(0.2)
    assert "expired" in refused.message, refused.message
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="", prompt=PROMPT, max_tokens=2)  # only chat is forwarded
    with pytest.raises(openai.BadRequestError) as missing:
        _openai_client(local, "/endpoints/no-such-endpoint").chat.completions.create(
            model="", messages=messages, max_tokens=2
        )
    assert missing.value.type == "ValidationError" and "no-such-endpoint" in missing.value.message
    example = Path(__file__).resolve().parents[2] / "examples" / "openai_sagemaker.py"
    proc = subprocess.run(
        [sys.executable, str(example), endpoint, "Say hello", "--max-tokens", "8"],
        env=local,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == f"user: Say hello\nassistant: {text}"
    assert f"[{whole.usage.completion_tokens} tokens]" in proc.stderr


def test_a_long_stream_comes_a_payload_part_a_token(endpoint: str, clients: dict[str, Any]) -> None:
    """300 tokens in 300 or more events: the runtime passes on each chunk as the container flushes it
    (an answer buffered to its end would come as one event); judged by framing, not by arrival times."""
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 300, "ignore_eos_token": True}, "stream": True}
    objs, parts = _stream(clients["sagemaker-runtime"], endpoint, body)
    assert len(objs) == 300 and parts >= 300, (len(objs), parts)


def test_wire_errors_have_sagemakers_shapes(endpoint: str, clients: dict[str, Any]) -> None:
    smr = clients["sagemaker-runtime"]
    with pytest.raises(smr.exceptions.ValidationError, match="not found"):
        smr.invoke_endpoint(EndpointName="no-such-endpoint", Body=b"{}", ContentType="application/json")
    with pytest.raises(smr.exceptions.ValidationError, match="6291456"):
        smr.invoke_endpoint(
            EndpointName=endpoint, Body=b"x" * (6 * 2**20 + 1), ContentType="application/json"
        )
    with pytest.raises(smr.exceptions.ModelError) as info:
        smr.invoke_endpoint_with_response_stream(
            EndpointName=endpoint,
            Body=json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 0}}),
            ContentType="application/json",
        )
    assert info.value.response["OriginalStatusCode"] == 400
    assert "parameters.max_new_tokens" in info.value.response["OriginalMessage"]
    # the server is still fine afterwards
    out = smr.invoke_endpoint(
        EndpointName=endpoint,
        Body=json.dumps({"inputs": "a", "parameters": {"max_new_tokens": 2}}),
        ContentType="application/json",
    )
    assert "generated_text" in json.loads(out["Body"].read())


def _container_pid(local: dict[str, str], name: str) -> int:
    """The host process of the endpoint's newest instance (process mode), from its container.json."""
    infos = sorted(Path(local["LMFORGE_LOCAL_DIR"], "endpoints", name).glob("*/container.json"))
    info = json.loads(infos[-1].read_text())
    assert info["mode"] == "process"
    return int(info["pid"])


def _engine_core(server_pid: int) -> tuple[int, Path]:
    """The pid of the LMI-Dist engine core under a server process, and its sockets' folder."""
    import psutil

    from lmforge.engines.lmi_dist.ipc import REQUESTS_ENV

    for child in psutil.Process(server_pid).children(recursive=True):
        if "lmforge.engines.lmi_dist.core" in child.cmdline():
            return child.pid, Path(ipc.folder_of(child.environ()[REQUESTS_ENV]))
    raise LookupError(f"no engine core under process {server_pid}")


def test_a_non_streamed_reply_through_the_response_stream_ends_the_sdks_line_iterator(
    endpoint: str, clients: dict[str, Any]
) -> None:
    """A request without ``stream`` sent through ``invoke_endpoint_with_response_stream`` gets one JSON
    body; it ends with a newline, so the SageMaker SDK's LineIterator (which loops forever on a last
    line without one) yields it and stops. Read in a thread, so a regression fails instead of hanging."""
    from sagemaker.iterators import LineIterator

    smr = clients["sagemaker-runtime"]
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 8}}
    resp = smr.invoke_endpoint_with_response_stream(
        EndpointName=endpoint, Body=json.dumps(body), ContentType="application/json"
    )
    assert resp["ContentType"] == "application/json"
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(LineIterator(resp["Body"])), daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "LineIterator never ended: the body's last line has no newline"
    assert len(lines) == 1
    reply = json.loads(lines[0])
    expected = smr.invoke_endpoint(
        EndpointName=endpoint, Body=json.dumps(body), ContentType="application/json"
    )
    assert reply == json.loads(expected["Body"].read())
    assert isinstance(reply["generated_text"], str) and reply["generated_text"]


def test_container_death_mid_stream_is_a_model_stream_error(
    local: dict[str, str], tiny_model: Path, clients: dict[str, Any]
) -> None:
    from botocore.exceptions import EventStreamError

    name = "dies-mid-stream"
    lmforge("deploy", str(tiny_model), "--endpoint-name", name, "--instance-type", "ml.m5.xlarge", env=local)
    smr = clients["sagemaker-runtime"]
    resp = smr.invoke_endpoint_with_response_stream(
        EndpointName=name,
        Body=json.dumps({"inputs": PROMPT, "parameters": {"max_new_tokens": 900}, "stream": True}),
        ContentType="application/json",
    )
    events = iter(resp["Body"])
    assert "PayloadPart" in next(events)
    server_pid = _container_pid(local, name)
    core_pid, sockets = _engine_core(server_pid)
    os.kill(server_pid, signal.SIGKILL)
    with pytest.raises(EventStreamError) as info:
        for _ in events:
            pass
    assert info.value.response["Error"]["Code"] == "ModelStreamError"
    # the killed server's engine core sees it gone, exits and removes the folder of their sockets
    _wait_gone(core_pid)
    assert sockets.name.startswith(ipc.SOCKET_FOLDER_PREFIX) and not sockets.exists()
    # SageMaker replaces a failed instance: the container comes back; meanwhile calls are ModelErrors
    body = json.dumps({"inputs": "a", "parameters": {"max_new_tokens": 2}})
    deadline = time.monotonic() + 120
    while True:
        try:
            smr.invoke_endpoint(EndpointName=name, Body=body, ContentType="application/json")
            break
        except smr.exceptions.ModelError:
            assert time.monotonic() < deadline, "the container was not restarted"
            time.sleep(0.5)
    assert clients["sagemaker"].describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService"
    lmforge("delete", name, env=local)


def _boto3_endpoint(clients: dict[str, Any], role: str, name: str, archive: Path, instance_type: str) -> None:
    """Upload ``archive`` and create model, endpoint config and endpoint ``name`` with plain boto3."""
    s3, sm = clients["s3"], clients["sagemaker"]
    s3.create_bucket(Bucket=f"{name}-models", CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.upload_file(str(archive), f"{name}-models", "model.tar.gz")
    sm.create_model(
        ModelName=f"{name}-model",
        ExecutionRoleArn=role,
        PrimaryContainer={"Image": "lmforge:cpu", "ModelDataUrl": f"s3://{name}-models/model.tar.gz"},
    )
    variant = {
        "VariantName": "AllTraffic",
        "ModelName": f"{name}-model",
        "InstanceType": instance_type,
        "InitialInstanceCount": 1,
    }
    sm.create_endpoint_config(EndpointConfigName=f"{name}-config", ProductionVariants=[variant])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-config")


def test_invalid_model_ends_failed_with_a_reason(
    clients: dict[str, Any], local: dict[str, str], tiny_model: Path, tmp_path: Path
) -> None:
    """Plain boto3 all the way: a tarball whose serving.properties is invalid (packed unvalidated)."""
    from lmforge.artifacts import package_model

    bad = tmp_path / "bad"
    shutil.copytree(tiny_model, bad)
    (bad / "serving.properties").write_text("option.max_rolling_batch_size=lots\n")
    archive = package_model(bad, tmp_path / "model.tar.gz", validate=False)
    sm = clients["sagemaker"]
    _boto3_endpoint(clients, local["LMFORGE_ROLE_ARN"], "bad-endpoint", archive.output, "ml.g6.xlarge")
    assert sm.describe_endpoint(EndpointName="bad-endpoint")["EndpointStatus"] == "Creating"
    with pytest.raises(Exception, match="Failed"):
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName="bad-endpoint", WaiterConfig={"Delay": 1, "MaxAttempts": 120}
        )
    desc = sm.describe_endpoint(EndpointName="bad-endpoint")
    assert desc["EndpointStatus"] == "Failed"
    assert "option.max_rolling_batch_size" in desc["FailureReason"]
    with pytest.raises(clients["sagemaker-runtime"].exceptions.ValidationError):
        clients["sagemaker-runtime"].invoke_endpoint(
            EndpointName="bad-endpoint", Body=b"{}", ContentType="application/json"
        )
    refused = lmforge(
        *("deploy", str(tiny_model), "--endpoint-name", "bad-endpoint", "--instance-type", "ml.g6.xlarge"),
        env=local,
        check=False,
    )
    assert refused.returncode == 1 and "--replace" in refused.stderr
    assert "[3/5]" not in refused.stderr  # refused before packing or uploading anything
    # what replaces it serves a user's model.py: the check is the replacement, not the engine
    handler = handler_model(tiny_model, tmp_path / "handler")
    replaced = lmforge(
        *("deploy", str(handler), "--endpoint-name", "bad-endpoint", "--instance-type", "ml.g6.xlarge"),
        "--replace",
        env=local,
    )
    assert "bad-endpoint: InService (created)" in replaced.stdout
    lmforge("delete", "bad-endpoint", env=local)


def test_update_then_delete(
    local: dict[str, str], tiny_model: Path, clients: dict[str, Any], tmp_path: Path
) -> None:
    """Re-deploying updates in place (new config, new container) and its upload skips known content;
    the prefix (uncompressed) form serves too; delete stops the container. The endpoint serves a
    user's model.py (:func:`~tests.local_sagemaker.handler_model`): none of this is about the engine."""
    sm, smr = clients["sagemaker"], clients["sagemaker-runtime"]
    name = "updated-llm"
    model = handler_model(tiny_model, tmp_path / "handler")
    deploy = ("deploy", str(model), "--endpoint-name", name, "--instance-type", "ml.g5.xlarge")
    lmforge(*deploy, "--artifact-format", "prefix", env=local)
    first = sm.describe_endpoint(EndpointName=name)
    first_pid = _container_pid(local, name)

    out = lmforge(
        *deploy,
        *("--artifact-format", "prefix", "--env", "OPTION_MAX_ROLLING_BATCH_SIZE=4"),
        *("--env", "OPTION_ENABLE_STATEFUL_SESSIONS=true"),
        env=local,
    )
    assert f"{name}: InService (updated)" in out.stdout
    assert "nothing sent" in out.stderr, "the same folder was uploaded again"
    second = sm.describe_endpoint(EndpointName=name)
    assert second["EndpointConfigName"] != first["EndpointConfigName"]
    model = sm.describe_model(ModelName=second["EndpointConfigName"])
    source = model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]
    assert source["CompressionType"] == "None" and source["S3Uri"].endswith("/")
    assert model["PrimaryContainer"]["Environment"] == {
        "OPTION_MAX_ROLLING_BATCH_SIZE": "4",
        "OPTION_ENABLE_STATEFUL_SESSIONS": "true",
    }
    new_pid = _container_pid(local, name)
    assert new_pid != first_pid
    _wait_gone(first_pid)
    resp = smr.invoke_endpoint(
        EndpointName=name,
        Body=json.dumps({"inputs": "a", "parameters": {"max_new_tokens": 3}}),
        ContentType="application/json",
    )
    assert "generated_text" in json.loads(resp["Body"].read())
    _sticky_session_round_trip(smr, name)

    serving = _container_pid(local, name)  # before the delete: a stopped instance drops its container.json
    lmforge("delete", name, env=local)
    _wait_gone(serving)
    with pytest.raises(sm.exceptions.ClientError):
        sm.describe_endpoint(EndpointName=name)


def _sticky_session_round_trip(smr: Any, name: str) -> None:
    """boto3's SessionId against an endpoint with OPTION_ENABLE_STATEFUL_SESSIONS=true: open, use, close."""
    import re

    opened = smr.invoke_endpoint(
        EndpointName=name,
        Body=json.dumps({"requestType": "NEW_SESSION"}),
        ContentType="application/json",
        SessionId="NEW_SESSION",
    )
    assert re.fullmatch(r"[0-9a-f-]+; Expires=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", opened["NewSessionId"])
    session = opened["NewSessionId"].split(";")[0]
    body = json.dumps({"inputs": "a", "parameters": {"max_new_tokens": 3}})
    turn = smr.invoke_endpoint(
        EndpointName=name, Body=body, ContentType="application/json", SessionId=session
    )
    assert "generated_text" in json.loads(turn["Body"].read())
    streamed = smr.invoke_endpoint_with_response_stream(
        EndpointName=name, Body=body, ContentType="application/json", SessionId=session
    )
    assert list(streamed["Body"])
    closed = smr.invoke_endpoint(
        EndpointName=name,
        Body=json.dumps({"requestType": "CLOSE"}),
        ContentType="application/json",
        SessionId=session,
    )
    assert closed["ClosedSessionId"] == session
    with pytest.raises(smr.exceptions.ModelError) as err:  # closed: SageMaker relays the container's 400
        smr.invoke_endpoint(EndpointName=name, Body=body, ContentType="application/json", SessionId=session)
    assert err.value.response["OriginalStatusCode"] == 400


def _wait_gone(pid: int, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return
        except (ProcessLookupError, FileNotFoundError):
            return
        time.sleep(0.2)
    raise AssertionError(f"process {pid} still runs")


def test_deploy_refuses_a_plan_that_does_not_fit(
    local: dict[str, str], tiny_model: Path, tmp_path: Path
) -> None:
    model = tmp_path / "too-big"
    shutil.copytree(tiny_model, model)
    props = (model / "serving.properties").read_text()
    (model / "serving.properties").write_text(props + "option.max_rolling_batch_size=100000\n")
    out = lmforge(
        "deploy",
        str(model),
        "--endpoint-name",
        "too-big",
        "--instance-type",
        "ml.g5.xlarge",
        env=local,
        check=False,
    )
    assert out.returncode == 1, out.stderr
    assert "--force" in out.stderr


def test_malicious_model_data_is_refused_by_the_runtime(
    clients: dict[str, Any], local: dict[str, str], tmp_path: Path
) -> None:
    """A tarball with a path that climbs out of /opt/ml/model never gets extracted: the endpoint fails."""
    import io
    import tarfile

    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../../../escaped.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    sm = clients["sagemaker"]
    _boto3_endpoint(clients, local["LMFORGE_ROLE_ARN"], "evil-endpoint", archive, "ml.g5.xlarge")
    deadline = time.monotonic() + 60
    while (desc := sm.describe_endpoint(EndpointName="evil-endpoint"))["EndpointStatus"] == "Creating":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert desc["EndpointStatus"] == "Failed"
    assert "escapes" in desc["FailureReason"]
    assert not list(Path(local["LMFORGE_LOCAL_DIR"]).parent.rglob("escaped.txt"))
    sm.delete_endpoint(EndpointName="evil-endpoint")


def test_sagemaker_sdk_v2_deploys_and_streams(
    local: dict[str, str], tiny_model: Path, clients: dict[str, Any]
) -> None:
    """examples/sagemaker_sdk_v2.py: Model(image_uri, model_data, role).deploy(...), then
    predict_stream(..., iterator=LineIterator)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "sagemaker_sdk_v2.py"
    proc = subprocess.run(
        [
            sys.executable,
            str(example),
            str(tiny_model),
            "--endpoint-name",
            "sdk-llm",
            "--instance-type",
            "ml.g5.2xlarge",
        ],
        env=local,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "non-streamed generated_text matches the stream: True" in proc.stderr
    assert proc.stdout.strip()  # the streamed tokens
    with pytest.raises(clients["sagemaker"].exceptions.ClientError):
        clients["sagemaker"].describe_endpoint(EndpointName="sdk-llm")


def test_inference_components(
    clients: dict[str, Any], local: dict[str, str], tiny_model: Path, tmp_path: Path
) -> None:
    """An endpoint for inference components (variants without a model), one component on it,
    invoked with InferenceComponentName; list, describe, scale, delete."""
    from lmforge.artifacts import package_model

    s3, sm, smr = clients["s3"], clients["sagemaker"], clients["sagemaker-runtime"]
    archive = package_model(tiny_model, tmp_path / "model.tar.gz")
    s3.create_bucket(Bucket="ic-models", CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.upload_file(str(archive.output), "ic-models", "base/model.tar.gz")
    role = local["LMFORGE_ROLE_ARN"]
    sm.create_model(
        ModelName="ic-base",
        ExecutionRoleArn=role,
        PrimaryContainer={"Image": "lmforge:cpu", "ModelDataUrl": "s3://ic-models/base/model.tar.gz"},
    )
    sm.create_endpoint_config(
        EndpointConfigName="ic-config",
        ExecutionRoleArn=role,
        ProductionVariants=[
            {"VariantName": "AllTraffic", "InstanceType": "ml.g5.12xlarge", "InitialInstanceCount": 1}
        ],
    )
    sm.create_endpoint(EndpointName="ic-endpoint", EndpointConfigName="ic-config")
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName="ic-endpoint", WaiterConfig={"Delay": 1, "MaxAttempts": 60}
    )
    sm.create_inference_component(
        InferenceComponentName="ic-llm",
        EndpointName="ic-endpoint",
        VariantName="AllTraffic",
        Specification={
            "ModelName": "ic-base",
            "StartupParameters": {"ContainerStartupHealthCheckTimeoutInSeconds": 300},
            "ComputeResourceRequirements": {
                "NumberOfAcceleratorDevicesRequired": 1,
                "MinMemoryRequiredInMb": 1024,
            },
        },
        RuntimeConfig={"CopyCount": 1},
    )
    deadline = time.monotonic() + 120
    while (desc := sm.describe_inference_component(InferenceComponentName="ic-llm"))[
        "InferenceComponentStatus"
    ] == "Creating":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert desc["InferenceComponentStatus"] == "InService", desc.get("FailureReason")
    assert desc["Specification"]["ModelName"] == "ic-base"
    assert desc["RuntimeConfig"] == {"DesiredCopyCount": 1, "CurrentCopyCount": 1}
    listed = sm.list_inference_components(EndpointNameEquals="ic-endpoint")["InferenceComponents"]
    assert [c["InferenceComponentName"] for c in listed] == ["ic-llm"]

    body = json.dumps({"inputs": PROMPT, "parameters": {"max_new_tokens": 6}})
    with pytest.raises(smr.exceptions.ValidationError, match="Inference Component Name header is required"):
        smr.invoke_endpoint(EndpointName="ic-endpoint", Body=body, ContentType="application/json")
    answer = smr.invoke_endpoint(
        EndpointName="ic-endpoint", InferenceComponentName="ic-llm", Body=body, ContentType="application/json"
    )
    text = json.loads(answer["Body"].read())["generated_text"]
    from lmforge.client import invoke_stream

    streamed = list(invoke_stream("ic-endpoint", json.loads(body), client=smr, inference_component="ic-llm"))
    assert "".join(o["token"]["text"] for o in streamed) == text
    # SageMaker's OpenAI-compatible path names the component in the URL (the header is refused)
    import openai

    chat: Any = {
        "model": "",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    on_ic = _openai_client(local, "/endpoints/ic-endpoint/inference-components/ic-llm")
    pieces = [
        c.choices[0].delta.content or ""
        for c in on_ic.chat.completions.create(**chat, stream=True)
        if c.choices
    ]
    assert "".join(pieces) == on_ic.chat.completions.create(**chat).choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="inference-components"):
        _openai_client(local, "/endpoints/ic-endpoint").chat.completions.create(
            **chat, extra_headers={"X-Amzn-SageMaker-Inference-Component": "ic-llm"}
        )

    sm.update_inference_component_runtime_config(
        InferenceComponentName="ic-llm", DesiredRuntimeConfig={"CopyCount": 2}
    )

    def second_copy() -> dict[str, Any] | None:
        runtime = sm.describe_inference_component(InferenceComponentName="ic-llm")["RuntimeConfig"]
        return dict(runtime) if runtime["CurrentCopyCount"] == 2 else None

    # the second copy is a second container (the g5.12xlarge has 4 GPUs)
    runtime = eventually(second_copy, timeout=120, interval=0.3)
    assert runtime["DesiredCopyCount"] == 2
    pid = _container_pid(local, "ic-endpoint")
    sm.delete_inference_component(InferenceComponentName="ic-llm")
    _wait_gone(pid)
    with pytest.raises(smr.exceptions.ValidationError, match="not in service"):
        smr.invoke_endpoint(
            EndpointName="ic-endpoint",
            InferenceComponentName="ic-llm",
            Body=body,
            ContentType="application/json",
        )
    with pytest.raises(sm.exceptions.ClientError, match="Could not find inference component"):
        sm.describe_inference_component(InferenceComponentName="ic-llm")
    sm.delete_endpoint(EndpointName="ic-endpoint")


def test_upload_prints_model_data_and_skips_known_content(local: dict[str, str], tiny_model: Path) -> None:
    first = lmforge("upload", str(tiny_model), "s3://uploads-test/models", env=local)
    data = json.loads(first.stdout)
    assert data["ModelDataUrl"].startswith("s3://uploads-test/models/") and data["ModelDataUrl"].endswith(
        ".tar.gz"
    )
    assert "created bucket s3://uploads-test" in first.stderr
    again = lmforge("upload", str(tiny_model), "s3://uploads-test/models", env=local)
    assert json.loads(again.stdout) == data and "nothing sent" in again.stderr
    prefix = json.loads(
        lmforge(
            "upload", str(tiny_model), "s3://uploads-test/m", "--artifact-format", "prefix", env=local
        ).stdout
    )
    assert prefix["ModelDataSource"]["S3DataSource"]["CompressionType"] == "None"


def test_names_sagemaker_refuses_are_refused(
    clients: dict[str, Any], local: dict[str, str], tiny_model: Path
) -> None:
    sm = clients["sagemaker"]
    with pytest.raises(sm.exceptions.ClientError, match="regular expression"):
        sm.create_endpoint(EndpointName="../../escape", EndpointConfigName="whatever")
    with pytest.raises(sm.exceptions.ClientError, match="variantName"):
        sm.create_endpoint_config(
            EndpointConfigName="ok-name",
            ProductionVariants=[{"VariantName": "../x", "ModelName": "m", "InstanceType": "ml.g5.xlarge"}],
        )
    out = lmforge(
        "deploy",
        str(tiny_model),
        "--endpoint-name",
        "under_score",
        "--instance-type",
        "ml.g5.xlarge",
        env=local,
        check=False,
    )
    assert out.returncode == 2 and "--endpoint-name" in out.stderr


def test_runtime_refuses_malformed_requests(
    endpoint: str, local: dict[str, str], clients: dict[str, Any]
) -> None:
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(local["AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME"])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.putrequest("POST", f"/endpoints/{endpoint}/invocations")
    conn.putheader("Content-Length", "abc")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 400 and resp.getheader("x-amzn-ErrorType") == "ValidationError"
    conn.close()
    smr = clients["sagemaker-runtime"]
    with pytest.raises(smr.exceptions.ValidationError, match="no production variant 'Nope'"):
        smr.invoke_endpoint(
            EndpointName=endpoint, Body=b"{}", ContentType="application/json", TargetVariant="Nope"
        )


def test_local_lifecycle_edges(tmp_path: Path, tiny_model: Path) -> None:
    """A busy port fails fast; two `up` at once share one server; a crashed server's containers are
    stopped by the next `up` (the container serves a user's model.py: the engine plays no part)."""
    import socket

    base = base_env(LMFORGE_LOCAL_MODE="process")
    state = tmp_path / "state"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # fails at once rather than retrying: the helper's timeout is the hang guard
        out = lmforge(
            "local", "up", "--state-dir", str(state), "--port", str(port), env=base, check=False, timeout=60
        )
        assert out.returncode == 1 and "in use" in out.stderr, out.stderr

    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "lmforge", "local", "up", "--state-dir", str(state), "--print-env"],
            env=base,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    envs = [parse_exports(o) for o in outs]
    assert envs[0]["AWS_ENDPOINT_URL"] == envs[1]["AWS_ENDPOINT_URL"]
    env = {**base, **envs[0]}
    model = handler_model(tiny_model, tmp_path / "handler")
    lmforge("deploy", str(model), "--endpoint-name", "orphan", "--instance-type", "ml.g5.xlarge", env=env)
    server_pid = json.loads((state / "state.json").read_text())["pid"]
    container_pid = _container_pid(env, "orphan")
    os.kill(server_pid, signal.SIGKILL)
    _wait_gone(server_pid)
    again = parse_exports(lmforge("local", "up", "--state-dir", str(state), "--print-env", env=base).stdout)
    _wait_gone(container_pid, timeout=10)
    assert not (state / "endpoints" / "orphan").exists()
    lmforge("local", "down", "--state-dir", str(state), env={**base, **again})
