"""``lmforge.deploy.deploy`` called as an SDK-style caller would, where no AWS is needed: what it refuses
before anything is read or sent, how it reports, what importing it costs. The deployments themselves,
against the local SageMaker, are in tests/integration/test_deploy_api.py."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lmforge.config import load_config
from lmforge.deploy import (
    Autoscale,
    BadSetting,
    DeployError,
    DeploySettings,
    DeployUsageError,
    InvalidConfiguration,
    PlanDoesNotFit,
    Progress,
    deploy,
)
from lmforge.deploy.workflow import endpoint_spec, plan_deployment


def _settings(model_dir: Path, **fields: Any) -> DeploySettings:
    base: dict[str, Any] = {"endpoint_name": "api-test", "instance_type": "ml.g5.xlarge"}
    return DeploySettings(model_dir=model_dir, **{**base, **fields})


def test_importing_the_api_imports_neither_boto3_nor_click() -> None:
    code = (
        "import sys, lmforge.deploy\n"
        "print(sorted(m for m in ('boto3', 'botocore', 'click') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("fields", "error", "option", "says"),
    [
        ({"endpoint_name": "under_score"}, BadSetting, "--endpoint-name", "regular expression"),
        ({"autoscale": Autoscale(1, 4), "wait": False}, DeployUsageError, None, "drop --no-wait"),
        ({"autoscale": Autoscale(2, 4)}, BadSetting, "--autoscale", "--instance-count 1 is outside 2:4"),
        ({"autoscale": Autoscale(1, 2), "instance_count": 3}, BadSetting, "--autoscale", "3 is outside 1:2"),
    ],
)
def test_settings_are_refused_before_the_folder_is_read(
    tmp_path: Path, fields: dict[str, object], error: type[DeployError], option: str | None, says: str
) -> None:
    notes: list[str] = []
    settings = _settings(tmp_path / "nothing-here", **fields)
    with pytest.raises(error) as refused:
        deploy(settings, Progress(note=notes.append))
    assert says in str(refused.value)
    assert getattr(refused.value, "option", None) == option
    assert notes == []


def test_an_invalid_configuration_is_refused_before_aws_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)  # a region lookup would fail differently
    (tmp_path / "serving.properties").write_text("option.max_rolling_batch_size=lots\n")
    with pytest.raises(InvalidConfiguration) as refused:
        deploy(_settings(tmp_path))
    assert "option.max_rolling_batch_size" in str(refused.value.error)


def test_progress_goes_to_the_deploy_logger_by_default(caplog: pytest.LogCaptureFixture) -> None:
    progress = Progress()
    with caplog.at_level(logging.INFO, logger="lmforge.deploy"):
        progress.note("[1/5] configuration OK")
        with progress.bar("upload", 10) as advance:
            advance(10)
        with progress.bar_to("packing", 10) as report:
            report(5, 10)
    assert [r.getMessage() for r in caplog.records] == ["[1/5] configuration OK"]


def test_the_plan_refuses_what_does_not_fit_unless_forced(tiny_model: Path, tmp_path: Path) -> None:
    model = Path(shutil.copytree(tiny_model, tmp_path / "too-big"))
    props = (model / "serving.properties").read_text()
    (model / "serving.properties").write_text(props + "option.max_rolling_batch_size=100000\n")
    config = load_config(model, env={}).config
    notes: list[str] = []
    with pytest.raises(PlanDoesNotFit) as refused:
        plan_deployment(_settings(model), config, Progress(note=notes.append))
    assert not refused.value.plan.fits
    assert notes[0] == "[2/5] plan" and len(notes) > 1
    notes.clear()
    plan = plan_deployment(_settings(model, force=True), config, Progress(note=notes.append))
    assert plan is not None and not plan.fits
    assert notes[-1] == "warning: deploying although the plan does not fit (--force)"
    # the plan's timeouts stand in for unset ones; set ones win
    spec = endpoint_spec(_settings(model, health_check_timeout_s=900), "img", "role", {}, plan)
    assert spec.health_check_timeout_s == 900
    assert spec.download_timeout_s == plan.download_timeout_s
    with pytest.raises(DeployUsageError, match=r"ml\.nope"):
        plan_deployment(_settings(model, instance_type="ml.nope.xlarge"), config, Progress())
