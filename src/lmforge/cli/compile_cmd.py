"""``lmforge compile DIR --output OUT``: TensorRT-LLM's ahead-of-time step (``--dry-run``: the plan).

The installed TensorRT-LLM decides what that is (``--trtllm-version`` plans for another release): from 1.3
on, a ModelOpt quantization into a Hugging Face-style checkpoint (nothing is built at load); up to 1.2,
TensorRT engines."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lmforge.cli.progress import note

if TYPE_CHECKING:
    from lmforge.config import ResolvedConfig
    from lmforge.engines.trtllm.version_gate import PathChoice


@click.command("compile")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--output", "-o", help="Engine folder, or an s3:// prefix to upload it to.")
@click.option(
    "--dry-run", is_flag=True, help="Print the build plan and stop (no GPU or TensorRT-LLM needed)."
)
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON.")
@click.option("--gpu-arch", help="Plan for this GPU architecture (e.g. sm90) instead of the local GPU's.")
@click.option(
    "--trtllm-version",
    help="Plan for this TensorRT-LLM release (e.g. 1.2.1, 1.3.0rc29) instead of the installed one.",
)
def compile_command(
    model_dir: Path,
    output: str | None,
    dry_run: bool,
    as_json: bool,
    gpu_arch: str | None,
    trtllm_version: str | None,
) -> None:
    """Compile MODEL_DIR for TensorRT-LLM ahead of time, by its serving.properties, so that serving the
    output starts without that step. TensorRT-LLM >= 1.3: a ModelOpt-quantized checkpoint (option.quantize,
    option.kv_cache_dtype; calibrated offline); <= 1.2: TensorRT engines. The output holds the result, the
    tokenizer, the recorded plan and a serving.properties for it."""
    from lmforge.config import ConfigError, load_config
    from lmforge.engines.trtllm import plan as trt_plan
    from lmforge.engines.trtllm.version_gate import choose

    try:
        resolved = load_config(model_dir, env={})
        choice = choose(trtllm_version)
    except (ConfigError, ValueError) as exc:
        note(
            f"error: invalid configuration:\n{exc}"
            if isinstance(exc, ConfigError)
            else f"error: --trtllm-version: {exc}"
        )
        raise SystemExit(2) from None
    if (gpu_arch or trtllm_version) and not dry_run:
        raise click.UsageError(
            "--gpu-arch and --trtllm-version only plan (--dry-run); a build is for this machine"
        )
    if choice.path == "pytorch":
        _quantize(resolved, model_dir, output, dry_run, as_json, gpu_arch or trt_plan.gpu_arch(), choice)
        return
    try:
        plan = trt_plan.make_plan(
            resolved.config,
            resolved.extra_options,
            arch=gpu_arch or trt_plan.gpu_arch(),
            trtllm_version=trtllm_version,
        )
    except trt_plan.BuildPlanError as exc:
        note(f"error: {exc}")
        raise SystemExit(2) from None
    note(f"TensorRT engine path: {choice.describe()}")
    if dry_run:
        click.echo(
            json.dumps(plan.to_dict(), indent=2) if as_json else "TensorRT-LLM build plan\n" + plan.render()
        )
        note(f"Next: lmforge compile {model_dir} --output ENGINE_DIR   (on a GPU machine with TensorRT-LLM)")
        return
    from lmforge.engines.trtllm.compile import is_compiled

    _check_output(output, resolved.config.model_path or model_dir, is_compiled, "engine")
    from lmforge.engines.trtllm.api import TrtllmUnavailableError, load_api
    from lmforge.engines.trtllm.compile import CompileError, compile_engine

    try:
        load_api()
    except TrtllmUnavailableError as exc:
        raise click.ClickException(str(exc)) from None
    assert output is not None
    source = _source(resolved)
    timeout = float(resolved.config.model_loading_timeout) * 4  # AOT: nobody waits on a health check

    def build(target: Path) -> None:
        try:
            compile_engine(plan, source, target, timeout_s=timeout, progress=note)
        except CompileError as exc:
            raise click.ClickException(str(exc)) from None
        write_serving_properties(model_dir, target, plan)

    _publish(output, build)


def _check_output(output: str | None, source: Path, is_ours: Callable[[Path], bool], what: str) -> None:
    """--output must be given, must not overlap the model, and may replace only an earlier output."""
    if not output:
        raise click.UsageError(f"give --output {what.upper()}_DIR (or s3://bucket/prefix), or --dry-run")
    if output.startswith("s3://"):
        return
    out, src = Path(output).resolve(), source.resolve()
    if out == src or src.is_relative_to(out) or out.is_relative_to(src):
        raise click.UsageError(f"--output {output} overlaps the model folder {src}; choose another folder")
    if out.exists() and any(out.iterdir()) and not is_ours(out):
        raise click.UsageError(
            f"--output {output} is a non-empty folder that holds no {what}; it would be replaced"
        )


def _source(resolved: ResolvedConfig) -> Path:
    """The model folder to compile: the local one, or option.model_id downloaded."""
    if resolved.config.model_path is not None:
        return resolved.config.model_path
    from lmforge.artifacts.download import DownloadError, fetch_model

    try:
        return fetch_model(str(resolved.config.model_id), revision=resolved.config.revision, progress=note)
    except DownloadError as exc:
        raise click.ClickException(str(exc)) from None


def _publish(output: str, build: Callable[[Path], None]) -> None:
    """Run ``build`` into ``output`` (a folder, or a temporary one uploaded to an s3:// prefix)."""
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "compiled" if output.startswith("s3://") else Path(output)
        build(target)
        if output.startswith("s3://"):
            from lmforge.cli.common import region_or_fail, upload_model

            upload_model(target, output, region_or_fail(None), "prefix")
    click.echo(output)
    note(f"Next: lmforge serve {output}")
    note(f"  or: lmforge deploy {output} --endpoint-name NAME --instance-type TYPE")


def _quantize(
    resolved: ResolvedConfig,
    model_dir: Path,
    output: str | None,
    dry_run: bool,
    as_json: bool,
    arch: str | None,
    choice: PathChoice,
) -> None:
    """TensorRT-LLM >= 1.3: plan (and run) the ModelOpt quantization into a checkpoint."""
    from lmforge.engines.trtllm.buildplan import BuildPlanError
    from lmforge.engines.trtllm.quantplan import make_quant_plan

    try:
        plan = make_quant_plan(
            resolved.config, resolved.extra_options, arch=arch, trtllm_version=choice.version
        )
    except BuildPlanError as exc:
        note(f"error: {exc}")
        raise SystemExit(2) from None
    note(choice.describe())
    if dry_run:
        title = "TensorRT-LLM >= 1.3 quantization plan (ModelOpt checkpoint; nothing is built at load)"
        click.echo(
            json.dumps({"path": "pytorch", **plan.to_dict()}, indent=2)
            if as_json
            else f"{title}\n{plan.render()}"
        )
        if plan.quantizes:
            note(
                f"Next: lmforge compile {model_dir} --output CHECKPOINT_DIR   (needs ModelOpt; a GPU is best)"
            )
        return
    if not plan.quantizes:
        note(
            f"error: nothing to compile for TensorRT-LLM {choice.version}: it loads the model folder as "
            "it is (serve it directly), and no option.quantize / option.kv_cache_dtype asks for a "
            "quantized checkpoint"
        )
        raise SystemExit(2)
    from lmforge.engines.trtllm.quantize import is_checkpoint, quantize_checkpoint

    _check_output(output, resolved.config.model_path or model_dir, is_checkpoint, "checkpoint")
    assert output is not None
    if not choice.installed:
        raise click.ClickException(
            "quantizing for TensorRT-LLM needs it installed (its version is recorded with the checkpoint): "
            "pip install 'lmforge[trtllm]', or run lmforge compile in the lmforge tensorrt-llm image"
        )
    source = _source(resolved)
    timeout = float(resolved.config.model_loading_timeout) * 4
    from lmforge.engines.trtllm.compile import CompileError

    def build(target: Path) -> None:
        try:
            quantize_checkpoint(plan, source, target, timeout_s=timeout, progress=note)
        except CompileError as exc:
            raise click.ClickException(str(exc)) from None
        _write_properties(model_dir, target, {"option.tensor_parallel_degree": str(plan.tensor_parallel)})

    _publish(output, build)


def write_serving_properties(model_dir: Path, engine_dir: Path, plan: object) -> None:
    """The engine folder's serving.properties: the source's, without option.model_id (the engines are
    the model now), with the build shapes spelled out so serving plans exactly what was built."""
    from lmforge.engines.trtllm.plan import BuildPlan

    assert isinstance(plan, BuildPlan)
    pinned = {
        "option.max_input_len": str(plan.max_input_len),
        "option.max_model_len": str(plan.max_seq_len),
        "option.max_rolling_batch_size": str(plan.max_batch_size),
        "option.dtype": {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[plan.dtype],
        "option.tensor_parallel_degree": str(plan.tensor_parallel),
    }
    _write_properties(model_dir, engine_dir, pinned, "lmforge-trtllm-plan.json")


#: build-time only: a compiled folder never needs them (a calibration file may not exist where it serves)
_BUILD_ONLY = ("option.model_id", "option.calib_dataset", "option.calib_size", "option.calib_seq_len")


def _write_properties(
    model_dir: Path, out: Path, pinned: dict[str, str], plan_file: str = "lmforge-trtllm-quant-plan.json"
) -> None:
    """``out``'s serving.properties: the source's without the build-only keys (the output is the model
    now), with ``pinned`` spelled out."""
    source = model_dir / "serving.properties"
    pinned = {"option.rolling_batch": "trtllm", **pinned}
    kept = []
    if source.is_file():
        for line in source.read_text().splitlines():
            key = line.split("=", 1)[0].strip()
            if key in _BUILD_ONLY or key in pinned:
                continue
            kept.append(line)
    lines = [f"# Compiled by `lmforge compile` (plan: {plan_file}).", *kept]
    lines += [f"{k}={v}" for k, v in pinned.items()]
    (out / "serving.properties").write_text("\n".join(lines) + "\n")
