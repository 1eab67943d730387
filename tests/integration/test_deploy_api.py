"""``lmforge.deploy.deploy`` called in-process, as an SDK-style caller would, against the local SageMaker
(the same one the CLI tests deploy to): the function ``lmforge deploy`` wraps creates, updates and
reports the same way, with its progress through the caller's :class:`~lmforge.deploy.Progress`.

The endpoints serve a user's model.py (:func:`~tests.local_sagemaker.handler_model`): none of this is
about the engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lmforge.deploy import (
    Autoscale,
    DeploySettings,
    DeployUsageError,
    Progress,
    deploy,
)
from tests.local_sagemaker import handler_model

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("local-sagemaker")]


@pytest.fixture
def aws_local(local: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process pointed at the local SageMaker, as ``eval "$(lmforge local up --print-env)"`` does."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in local.items():
        if key.startswith(("AWS_", "LMFORGE_")):
            monkeypatch.setenv(key, value)
    return local


class Recorded:
    """A Progress that keeps what it was given: the notes, and each bar's label and units."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.bars: dict[str, int] = {}

    @contextmanager
    def bar(self, label: str, total: int) -> Iterator[Any]:
        self.bars[label.strip()] = 0

        def advance(n: int) -> None:
            self.bars[label.strip()] += n

        yield advance

    @contextmanager
    def bar_to(self, label: str, total: int = 1) -> Iterator[Any]:
        def report(done: int, new_total: int) -> None:
            self.bars[label.strip()] = done

        yield report

    def progress(self) -> Progress:
        return Progress(note=self.notes.append, bar=self.bar, bar_to=self.bar_to)


def test_deploy_creates_then_updates_with_autoscaling(
    aws_local: dict[str, str], tiny_model: Path, tmp_path: Path, clients: dict[str, Any]
) -> None:
    sm, smr = clients["sagemaker"], clients["sagemaker-runtime"]
    model = handler_model(tiny_model, tmp_path / "handler")
    settings = DeploySettings(model_dir=model, endpoint_name="api-llm", instance_type="ml.g5.xlarge")
    first = Recorded()
    created = deploy(settings, first.progress())
    assert created.succeeded and not created.result.updated and created.waited
    assert created.status == "InService" and created.endpoint_name == "api-llm"
    assert created.upload.form == "tar.gz" and created.upload.sent_bytes > 0
    assert created.plan is not None and created.autoscale is None
    assert created.spec.health_check_timeout_s == created.plan.health_check_timeout_s
    steps = [n.split(" ", 1)[0] for n in first.notes if n.startswith("[")]
    assert steps == ["[1/5]", "[2/5]", "[4/5]", "[5/5]"]  # step 3 of a tar.gz is its packing bar's
    assert first.bars["[3/5] packing"] > 0 and first.bars["upload"] == created.upload.sent_bytes
    described = sm.describe_endpoint(EndpointName="api-llm")
    assert described["EndpointConfigName"] == created.result.config_name

    second = Recorded()
    updated = deploy(
        DeploySettings(
            model_dir=model,
            endpoint_name="api-llm",
            instance_type="ml.g5.xlarge",
            artifact_format="prefix",
            environment={"OPTION_MAX_ROLLING_BATCH_SIZE": "4"},
            autoscale=Autoscale(1, 3, target_invocations=20),
        ),
        second.progress(),
    )
    assert updated.succeeded and updated.result.updated
    assert updated.autoscale == Autoscale(1, 3, target_invocations=20)
    assert updated.upload.form == "prefix" and updated.upload.uri.endswith("/")
    assert any(n.startswith("updating endpoint api-llm") for n in second.notes)
    container = sm.describe_model(ModelName=updated.result.model_name)["PrimaryContainer"]
    assert container["Environment"] == {"OPTION_MAX_ROLLING_BATCH_SIZE": "4"}
    reply = smr.invoke_endpoint(
        EndpointName="api-llm",
        Body=json.dumps({"inputs": "a", "parameters": {"max_new_tokens": 3}}),
        ContentType="application/json",
    )
    assert json.loads(reply["Body"].read()) == {"generated_text": "xxx"}

    # the same folder again: its upload is skipped; the autoscaling it had is put back
    again = deploy(settings, Recorded().progress())
    assert again.upload.sent_bytes == 0 and again.upload.uri == created.upload.uri
    assert again.autoscale == updated.autoscale

    from lmforge.deploy import autoscaling
    from lmforge.deploy.endpoints import delete_endpoint, sagemaker_client

    region = aws_local["AWS_DEFAULT_REGION"]
    autoscaling.suspend(autoscaling.client(region), "api-llm", "AllTraffic", echo=lambda m: None)
    delete_endpoint(sagemaker_client(region), "api-llm", echo=lambda m: None)


def test_deploy_without_a_role_stops_before_uploading(
    aws_local: dict[str, str], tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LMFORGE_ROLE_ARN", raising=False)
    model = handler_model(tiny_model, tmp_path / "handler")
    recorded = Recorded()
    with pytest.raises(DeployUsageError, match="no execution role"):
        deploy(
            DeploySettings(model_dir=model, endpoint_name="api-norole", instance_type="ml.g5.xlarge"),
            recorded.progress(),
        )
    assert not any(n.startswith("[3/5]") for n in recorded.notes)
    assert recorded.bars == {}
