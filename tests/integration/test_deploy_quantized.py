"""``lmforge deploy --compile --quantize w8a8`` end to end on the local SageMaker (process mode): the
folder is quantized by ``lmforge compile --quantize`` before it is packed, the quantized folder is what
is uploaded and served, and the endpoint streams an answer through boto3's
``invoke_endpoint_with_response_stream``. The source folder is only read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmforge.local.control import ENV_STATE_DIR
from tests.local_sagemaker import lmforge

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("local-sagemaker")]


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def test_deploy_compile_quantize_w8a8_streams_an_answer(
    local: dict[str, str], clients: dict[str, Any], tiny_model: Path
) -> None:
    from lmforge.client import iter_stream_objects

    name = "tiny-w8a8"
    before = _tree(tiny_model)
    out = lmforge(
        *("deploy", str(tiny_model), "--endpoint-name", name, "--instance-type", "ml.m5.xlarge"),
        *("--compile", "--quantize", "w8a8"),
        env=local,
        timeout=900,
    )
    try:
        assert f"{name}: InService (created)" in out.stdout, out.stderr
        assert "--quantize w8a8: quantizing on this machine (the local SageMaker runs in process mode)" in (
            out.stderr
        )
        assert "quantized (w8a8) in" in out.stderr  # lmforge compile's own line
        assert _tree(tiny_model) == before  # the source is only read

        # what the endpoint serves is the quantized folder, and its start check found it as compiled
        logs = [p.read_text(errors="replace") for p in Path(local[ENV_STATE_DIR]).rglob("container.log")]
        served = [text for text in logs if "quantized checkpoint:" in text]
        assert served, "no container log has the quantized checkpoint's start line"
        assert any("quantized checkpoint: hit (w8a8" in text for text in served), served[-1][-4000:]

        smr = clients["sagemaker-runtime"]
        body = {"inputs": "def fibonacci(n):", "parameters": {"max_new_tokens": 12}, "stream": True}
        resp = smr.invoke_endpoint_with_response_stream(
            EndpointName=name, Body=json.dumps(body), ContentType="application/json"
        )
        objs = list(iter_stream_objects(resp["Body"]))
        tokens = [o["token"] for o in objs if "token" in o]
        assert len(tokens) == 12, objs
        text = "".join(t["text"] for t in tokens)
        assert text, objs
        whole = json.loads(
            smr.invoke_endpoint(
                EndpointName=name,
                Body=json.dumps({"inputs": body["inputs"], "parameters": body["parameters"]}),
                ContentType="application/json",
            )["Body"].read()
        )
        assert whole["generated_text"] == text  # greedy: the stream is the whole answer
    finally:
        lmforge("delete", name, env=local)
