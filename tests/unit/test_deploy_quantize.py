"""``lmforge deploy --compile --quantize METHOD``: what is refused before anything runs or is sent (no
AWS needed), which method a deployment takes, and the command that quantizes inside the endpoint's image.
The deployment itself, on the local SageMaker, is tests/integration/test_deploy_quantized.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lmforge.cli import main
from lmforge.config import load_config
from lmforge.container.engine import ContainerEngine
from lmforge.deploy import BadSetting, DeploySettings, DeployUsageError, deploy
from lmforge.deploy.precompile import QUANT_MOUNT, quantize_in_image_command, quantize_method
from lmforge.quantize import METHODS


def _deploy_args(model: Path, *extra: str, instance_type: str = "ml.m5.xlarge") -> list[str]:
    return ["deploy", str(model), "--endpoint-name", "q-test", "--instance-type", instance_type, *extra]


def _settings(model: Path, **fields: Any) -> DeploySettings:
    base: dict[str, Any] = {"endpoint_name": "q-test", "instance_type": "ml.m5.xlarge", "compile_first": True}
    return DeploySettings(model_dir=model, **{**base, **fields})


def _with_properties(tiny_model: Path, tmp_path: Path, **options: str) -> Path:
    model = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    props = model / "serving.properties"
    props.write_text(props.read_text() + "".join(f"option.{k}={v}\n" for k, v in options.items()))
    return model


def test_quantize_without_compile_is_a_usage_error(tiny_model: Path) -> None:
    result = CliRunner().invoke(main, _deploy_args(tiny_model, "--quantize", "w8a8"))
    assert result.exit_code == 2, result.output
    assert "--quantize goes with --compile" in result.output
    with pytest.raises(DeployUsageError, match="--quantize goes with --compile"):
        deploy(_settings(tiny_model, compile_first=False, quantize="w8a8"))


@pytest.mark.parametrize(
    ("method", "instance_type", "says"),
    [
        ("int3", "ml.m5.xlarge", "--quantize=int3: unknown quantization method; choose one of: w8a8 "),
        ("fp8", "ml.m5.xlarge", "this target is CPU-only"),
        (
            "fp8",
            "ml.g5.xlarge",
            "--quantize=fp8: fp8 e4m3 weights (per channel) and activations (per token, dynamic) is "
            "planned but not built yet",
        ),
    ],
)
def test_a_method_that_cannot_be_had_is_refused_naming_the_option(
    tiny_model: Path, method: str, instance_type: str, says: str
) -> None:
    result = CliRunner().invoke(
        main, _deploy_args(tiny_model, "--compile", "--quantize", method, instance_type=instance_type)
    )
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.replace("│", " ").split())
    assert "Invalid value for --quantize:" in flat and " ".join(says.split()) in flat
    assert "[1/5]" not in result.output  # refused before the region, the image or an upload
    assert f"instance type {instance_type}" in flat
    # every method name the error offers is one compile knows: one table
    if method == "int3":
        assert all(name in flat for name in METHODS)


def test_a_tensorrt_llm_folder_and_an_already_quantized_one_are_refused(
    tiny_model: Path, tmp_path: Path
) -> None:
    trt = _with_properties(tiny_model, tmp_path / "trt", rolling_batch="trtllm")
    with pytest.raises(BadSetting, match="a TensorRT-LLM folder quantizes with ModelOpt") as caught:
        deploy(_settings(trt, instance_type="ml.g5.xlarge", quantize="w8a8"))
    assert caught.value.option == "--quantize"

    done = Path(shutil.copytree(tiny_model, tmp_path / "done"))
    config = json.loads((done / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors"}
    (done / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadSetting, match="is already quantized"):
        deploy(_settings(done, quantize="gptq"))


def test_the_method_is_the_flag_else_an_lmi_dist_folders_option_with_compile(
    tiny_model: Path, tmp_path: Path
) -> None:
    plain = load_config(tiny_model, env={}).config
    assert quantize_method(_settings(tiny_model), plain) is None
    chosen = quantize_method(_settings(tiny_model, quantize="GPTQ"), plain)
    assert chosen is not None and chosen.name == "gptq" and chosen.needs_calibration

    folder = _with_properties(tiny_model, tmp_path, quantize="w8a8")
    config = load_config(folder, env={}).config
    found = quantize_method(_settings(folder), config)
    assert found is not None and found.name == "w8a8"
    assert quantize_method(_settings(folder, compile_first=False), config) is None  # quantized at load
    assert quantize_method(_settings(folder, quantize="gptq"), config).name == "gptq"  # type: ignore[union-attr]

    done = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**done, "quantization_config": {"quant_method": "x"}}))
    assert quantize_method(_settings(folder), config) is None  # already quantized: its start checks

    bad = _with_properties(tiny_model, tmp_path / "bad", quantize="awq")
    with pytest.raises(BadSetting, match=r"option\.quantize=awq: unknown quantization method"):
        quantize_method(_settings(bad), load_config(bad, env={}).config)


def test_in_the_image_the_checkpoint_is_written_to_a_mounted_folder_of_its_own(tmp_path: Path) -> None:
    engine = ContainerEngine("podman", "/x/podman")
    model, out = tmp_path / "model", tmp_path / "q" / "model"
    argv = quantize_in_image_command(
        engine, "lmforge/cpu:0.1.0", model, METHODS["w8a8"], out, {"OPTION_DTYPE": "fp32"}
    )
    image = argv.index("lmforge/cpu:0.1.0")
    assert argv[image + 1 :] == [
        "compile", "/opt/ml/model", "--quantize", "w8a8", "--output", f"{QUANT_MOUNT}/model"
    ]  # fmt: skip
    engine_args = argv[:image]
    assert f"{out.parent.resolve()}:{QUANT_MOUNT}:rw" in engine_args
    assert f"{model.resolve()}:/opt/ml/model:rw" in engine_args
    assert "OPTION_DTYPE=fp32" in engine_args and "none" in engine_args  # the endpoint's env, no network


FAKE_ENGINE = """#!/bin/sh
# a container engine: `image exists` answers $IMAGE_RC; `run` records its arguments, writes a checkpoint
# into the folder mounted at the quantized mount and exits $RUN_RC
if [ "$1 $2" = "image exists" ]; then exit "${IMAGE_RC:-0}"; fi
printf '%s\\n' "$@" > "$RECORD"
for arg in "$@"; do
  case "$arg" in *:/opt/lmforge-quantized:rw) out="${arg%%:*}";; esac
done
mkdir -p "$out/model" && echo '{}' > "$out/model/config.json"
exit "${RUN_RC:-0}"
"""


def _fake_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from lmforge.container import engine as engines

    script = tmp_path / "bin" / "podman"
    script.parent.mkdir()
    script.write_text(FAKE_ENGINE)
    script.chmod(0o755)
    monkeypatch.setattr(engines, "detect", lambda _name=None: ContainerEngine("podman", str(script)))
    record = tmp_path / "argv"
    monkeypatch.setenv("RECORD", str(record))
    return record


def test_with_lmforges_image_the_image_quantizes(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the local SageMaker's process mode: the image the endpoint runs writes the checkpoint."""
    from lmforge.deploy.precompile import quantize_before_packing
    from lmforge.deploy.progress import Progress

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SAGEMAKER", "LMFORGE_LOCAL_DIR"):
        monkeypatch.delenv(name, raising=False)
    record = _fake_engine(tmp_path, monkeypatch)
    notes: list[str] = []
    settings = _settings(tiny_model, environment={"OPTION_DTYPE": "fp32"})
    out = tmp_path / "q" / "model"
    uri = "123456789012.dkr.ecr.us-west-2.amazonaws.com/lmforge-cpu:0.1.0"
    quantize_before_packing(settings, uri, METHODS["w8a8"], out, Progress(note=notes.append))
    assert (out / "config.json").is_file()
    argv = record.read_text().splitlines()
    assert argv[argv.index("lmforge/cpu:0.1.0") + 1 :] == [
        "compile", "/opt/ml/model", "--quantize", "w8a8", "--output", f"{QUANT_MOUNT}/model"
    ]  # fmt: skip
    assert "OPTION_DTYPE=fp32" in argv
    assert any("--quantize w8a8: quantizing inside lmforge/cpu:0.1.0" in n for n in notes)

    from lmforge.deploy import DeployError

    monkeypatch.setenv("RUN_RC", "3")
    with pytest.raises(DeployError, match=r"lmforge compile inside lmforge/cpu:0.1.0 exited 3"):
        quantize_before_packing(settings, uri, METHODS["w8a8"], out, Progress(note=notes.append))
    monkeypatch.setenv("IMAGE_RC", "1")
    with pytest.raises(
        DeployError, match=r"lmforge/cpu:0.1.0 is not in podman's image store; build it first"
    ):
        quantize_before_packing(settings, uri, METHODS["w8a8"], out, Progress(note=notes.append))
