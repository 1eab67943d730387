"""``lmforge compile DIR --output OUT``: TensorRT-LLM engines ahead of time (``--dry-run``: the plan)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click

from lmforge.cli.progress import note


@click.command("compile")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--output", "-o", help="Engine folder, or an s3:// prefix to upload it to.")
@click.option(
    "--dry-run", is_flag=True, help="Print the build plan and stop (no GPU or TensorRT-LLM needed)."
)
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON.")
@click.option("--gpu-arch", help="Plan for this GPU architecture (e.g. sm90) instead of the local GPU's.")
def compile_command(
    model_dir: Path, output: str | None, dry_run: bool, as_json: bool, gpu_arch: str | None
) -> None:
    """Compile MODEL_DIR into TensorRT-LLM engines for its serving.properties (AOT), so that serving the
    output starts without compiling. The output holds the engines, the tokenizer, the recorded plan and
    a serving.properties that points at them."""
    from lmforge.config import ConfigError, load_config
    from lmforge.engines.trtllm import plan as trt_plan

    try:
        resolved = load_config(model_dir, env={})
    except ConfigError as exc:
        note(f"error: invalid configuration:\n{exc}")
        raise SystemExit(2) from None
    try:
        plan = trt_plan.make_plan(
            resolved.config, resolved.extra_options, arch=gpu_arch or trt_plan.gpu_arch()
        )
    except trt_plan.BuildPlanError as exc:
        note(f"error: {exc}")
        raise SystemExit(2) from None
    if dry_run:
        click.echo(
            json.dumps(plan.to_dict(), indent=2) if as_json else "TensorRT-LLM build plan\n" + plan.render()
        )
        note(f"Next: lmforge compile {model_dir} --output ENGINE_DIR   (on a GPU machine with TensorRT-LLM)")
        return
    if not output:
        raise click.UsageError("give --output ENGINE_DIR (or s3://bucket/prefix), or --dry-run")
    if gpu_arch:
        raise click.UsageError("--gpu-arch only plans (--dry-run); a build is for the GPU it runs on")
    if not output.startswith("s3://"):
        out = Path(output).resolve()
        src = (resolved.config.model_path or model_dir).resolve()
        from lmforge.engines.trtllm.compile import is_compiled as _is_engine

        if out == src or src.is_relative_to(out) or out.is_relative_to(src):
            raise click.UsageError(
                f"--output {output} overlaps the model folder {src}; choose another folder"
            )
        if out.exists() and any(out.iterdir()) and not _is_engine(out):
            raise click.UsageError(
                f"--output {output} is a non-empty folder that holds no engine; it would be replaced"
            )
    from lmforge.engines.trtllm.api import TrtllmUnavailableError, load_api
    from lmforge.engines.trtllm.compile import CompileError, compile_engine

    try:
        load_api()
    except TrtllmUnavailableError as exc:
        raise click.ClickException(str(exc)) from None
    source = resolved.config.model_path
    if source is None:
        from lmforge.artifacts.download import DownloadError, fetch_model

        try:
            source = fetch_model(
                str(resolved.config.model_id), revision=resolved.config.revision, progress=note
            )
        except DownloadError as exc:
            raise click.ClickException(str(exc)) from None
    timeout = float(resolved.config.model_loading_timeout) * 4  # AOT: nobody waits on a health check
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "engine" if output.startswith("s3://") else Path(output)
        try:
            compile_engine(plan, source, target, timeout_s=timeout, progress=note)
        except CompileError as exc:
            raise click.ClickException(str(exc)) from None
        write_serving_properties(model_dir, target, plan)
        if output.startswith("s3://"):
            from lmforge.cli.common import region_or_fail, upload_model

            upload_model(target, output, region_or_fail(None), "prefix")
    click.echo(output)
    note(f"Next: lmforge serve {output}")
    note(f"  or: lmforge deploy {output} --endpoint-name NAME --instance-type TYPE")


def write_serving_properties(model_dir: Path, engine_dir: Path, plan: object) -> None:
    """The engine folder's serving.properties: the source's, without option.model_id (the engines are
    the model now), with the build shapes spelled out so serving plans exactly what was built."""
    from lmforge.engines.trtllm.plan import BuildPlan

    assert isinstance(plan, BuildPlan)
    source = model_dir / "serving.properties"
    kept = []
    pinned = {
        "option.rolling_batch": "trtllm",
        "option.max_input_len": str(plan.max_input_len),
        "option.max_model_len": str(plan.max_seq_len),
        "option.max_rolling_batch_size": str(plan.max_batch_size),
        "option.dtype": {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[plan.dtype],
        "option.tensor_parallel_degree": str(plan.tensor_parallel),
    }
    if source.is_file():
        for line in source.read_text().splitlines():
            key = line.split("=", 1)[0].strip()
            if key == "option.model_id" or key in pinned:
                continue
            kept.append(line)
    lines = ["# Compiled by `lmforge compile` (plan: lmforge-trtllm-plan.json).", *kept]
    lines += [f"{k}={v}" for k, v in pinned.items()]
    (engine_dir / "serving.properties").write_text("\n".join(lines) + "\n")
