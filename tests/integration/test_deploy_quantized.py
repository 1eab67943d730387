"""``lmforge deploy --compile --quantize w8a8`` end to end on the local SageMaker (process mode): the
folder is quantized by ``lmforge compile --quantize`` before it is packed, the quantized folder is what
is uploaded and served, and the endpoint streams an answer through boto3's
``invoke_endpoint_with_response_stream``. The source folder is only read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.local_sagemaker import lmforge, serves_quantized

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("local-sagemaker")]


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def test_deploy_compile_quantize_w8a8_streams_an_answer(
    local: dict[str, str], clients: dict[str, Any], tiny_model: Path
) -> None:
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
        serves_quantized(local, clients["sagemaker-runtime"], name)
    finally:
        lmforge("delete", name, env=local)
