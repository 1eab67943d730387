"""``lmforge compile DIR``: compile a model folder ahead of time for the backend that serves it.

The backend decides what that is (one function per backend in :data:`_BACKENDS`):

* **vLLM** (``option.rolling_batch=vllm``, or ``auto`` choosing vLLM): start the engine once with the
  folder's serving configuration and keep the compiled graphs in ``DIR/lmforge-compiled/vllm/`` (in
  place; ``--output OUT`` compiles a copy of the folder), with a manifest that every later start checks
  (``compile cache: hit|miss|none``).
* **TensorRT-LLM** (``option.rolling_batch=trtllm``, or ``--gpu-arch``/``--trtllm-version``): the
  installed release decides (``--trtllm-version`` plans for another): from 1.3 on, a ModelOpt
  quantization into a Hugging Face-style checkpoint (nothing is built at load); up to 1.2, TensorRT
  engines. ``--output`` is required.

* **Quantization** (``--quantize METHOD``, or ``option.quantize`` in an LMI-Dist folder's
  serving.properties; not TensorRT-LLM, whose ModelOpt path reads option.quantize itself): a quantized
  checkpoint in compressed-tensors' format at ``--output`` (:mod:`lmforge.quantize.w8a8`; GPTQ's
  search in :mod:`lmforge.quantize.gptq`), with its manifest in ``lmforge-compiled/quantize/``, which
  every ``lmforge serve`` checks at start (:mod:`lmforge.quantize.start_check`); LMI-Dist and vLLM
  load it.

``--dry-run`` prints the plan."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lmforge.cli.progress import note

if TYPE_CHECKING:
    from lmforge.config import ResolvedConfig
    from lmforge.engines.trtllm.version_gate import PathChoice


@dataclass(frozen=True)
class CompileRequest:
    model_dir: Path
    output: str | None
    dry_run: bool
    as_json: bool
    gpu_arch: str | None
    trtllm_version: str | None
    image: str | None = None
    engine: str = "auto"
    quantize: str | None = None


@click.command("compile")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--output",
    "-o",
    help="vLLM: compile a copy of the folder there (default: in place). TensorRT-LLM: the engine or "
    "checkpoint folder (required). An s3:// prefix uploads the result.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and stop (nothing is compiled).")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON.")
@click.option(
    "--gpu-arch", help="TensorRT-LLM: plan for this GPU architecture (e.g. sm90) instead of the local GPU's."
)
@click.option(
    "--trtllm-version",
    help="TensorRT-LLM: plan for this release (e.g. 1.2.1, 1.3.0rc29) instead of the installed one.",
)
@click.option(
    "--image",
    help="vLLM: compile inside this lmforge image (the one the endpoint runs), by the container engine, "
    "so that the graphs match its vLLM, torch and Python exactly; default: compile on this machine.",
)
@click.option(
    "--engine", type=click.Choice(["auto", "podman", "docker"]), default="auto", help="For --image."
)
@click.option(
    "--quantize",
    "quantize",
    metavar="METHOD",
    help="LMI-Dist / vLLM: write a quantized checkpoint (compressed-tensors) to --output: w8a8 (int8 "
    "weights per channel, int8 activations per token) or gptq (int4 weights in groups, calibrated on "
    "lmforge's offline prompt set; float activations); CPU and GPU. Default: option.quantize of an "
    "LMI-Dist folder.",
)
def compile_command(
    model_dir: Path,
    output: str | None,
    dry_run: bool,
    as_json: bool,
    gpu_arch: str | None,
    trtllm_version: str | None,
    image: str | None,
    engine: str,
    quantize: str | None,
) -> None:
    """Compile MODEL_DIR ahead of time, by its serving.properties, for the backend that serves it, so
    that serving it starts without compiling.

    vLLM: starts the engine once with the serving configuration and keeps the compiled graphs in
    MODEL_DIR/lmforge-compiled/vllm/ with a manifest (what was compiled, for which vLLM, torch and
    machine); `lmforge serve` checks it at every start. TensorRT-LLM >= 1.3: a ModelOpt-quantized
    checkpoint; <= 1.2: TensorRT engines (--output required)."""
    request = CompileRequest(
        model_dir, output, dry_run, as_json, gpu_arch, trtllm_version, image, engine, quantize
    )
    if quantize is not None or _quantize_option(model_dir):
        _compile_quantized(request)
        return
    backend = "trtllm" if (gpu_arch or trtllm_version) else _backend_of(model_dir)
    _BACKENDS[backend](request)


def _quantize_option(model_dir: Path) -> bool:
    """Whether the folder asks LMI-Dist for a quantization (option.quantize) that compile can write."""
    from lmforge.config import ConfigError, load_config

    try:
        config = load_config(model_dir).config
    except ConfigError:
        return False  # the backend's own step reports it
    return bool(config.quantize) and config.rolling_batch == "lmi-dist"


def _backend_of_quiet(rolling_batch: str) -> str:
    """The backend option.rolling_batch picks here (``auto``: vLLM when installed, else LMI-Dist)."""
    if rolling_batch != "auto":
        return rolling_batch
    from lmforge.engines.registry import BackendUnavailableError, select_backend

    try:
        return select_backend("auto").name
    except BackendUnavailableError:
        return "lmi-dist"


def _configuration(model_dir: Path) -> ResolvedConfig:
    """``model_dir``'s resolved configuration; an invalid one is printed and exits with status 2."""
    from lmforge.config import ConfigError, load_config

    try:
        return load_config(model_dir)
    except ConfigError as exc:
        note(f"error: invalid configuration:\n{exc}")
        raise SystemExit(2) from None


def _compile_quantized(request: CompileRequest) -> None:
    """--quantize (or an LMI-Dist folder's option.quantize): the quantized checkpoint at --output."""
    from lmforge.quantize import QuantizeError, method

    model_dir = request.model_dir
    resolved = _configuration(model_dir)
    config = resolved.config
    if request.gpu_arch or request.trtllm_version or config.rolling_batch == "trtllm":
        raise click.UsageError(
            "--quantize is for LMI-Dist and vLLM folders; a TensorRT-LLM folder quantizes with ModelOpt "
            "through its own option.quantize (lmforge compile DIR --output OUT, without --quantize)"
        )
    if request.image is not None:
        raise click.UsageError(
            "--quantize runs on this machine (the checkpoint does not depend on the image)"
        )
    option = "--quantize" if request.quantize is not None else "option.quantize"
    name = request.quantize if request.quantize is not None else str(config.quantize)
    try:
        import torch

        chosen = method(name, option=option, cpu_only=not torch.cuda.is_available())
    except QuantizeError as exc:
        raise click.ClickException(exc.message) from None
    from lmforge.quantize import MANIFEST

    _check_output(
        request.output, config.model_path or model_dir, lambda p: (p / MANIFEST).is_file(), "quantized model"
    )
    assert request.output is not None
    if request.dry_run:
        from lmforge.quantize.w8a8 import FORMATS

        calibration = None
        if chosen.needs_calibration:
            from lmforge.quantize.calibration import fingerprint

            label, count, digest = fingerprint("")
            calibration = f"{label}: {count} prompts, sha256 {digest}"
        plan = {"method": chosen.name, "scheme": chosen.scheme, "what": chosen.description,
                "source": str(config.model_path or model_dir), "output": request.output,
                "calibration": calibration,
                "format": f"compressed-tensors {FORMATS[chosen.name]}"}  # fmt: skip
        click.echo(
            json.dumps(plan, indent=2) if request.as_json else "\n".join(f"{k}: {v}" for k, v in plan.items())
        )
        return
    source = _source(resolved)
    from lmforge.quantize.w8a8 import quantize_folder

    # vLLM 0.32 reads compressed-tensors int8 for linear layers only: its LM head (ParallelLMHead) has
    # no weight_scale and refuses a quantized one, so a folder vLLM serves keeps the head in float
    lm_head = _backend_of_quiet(config.rolling_batch) != "vllm" and chosen.name != "gptq"
    if chosen.name == "gptq":
        # the int4 kernel's output is bfloat16 (bench/quant_kernels_int4.py): logits in bfloat16 would
        # tie and reorder the top log-probs; the float head stays tied to the embedding (no extra bytes)
        note("the LM head stays float32 for gptq: the int4 kernel's bfloat16 output is too coarse for logits")
    elif not lm_head:
        note("the LM head stays float32: vLLM 0.32 loads no quantized LM head (LMI-Dist would serve one)")
    if chosen.needs_calibration:
        note(f"{chosen.name} is calibrated on lmforge's offline prompt set (nothing is downloaded)")

    def build(target: Path) -> None:
        try:
            manifest = quantize_folder(
                source, target, method_name=chosen.name, lm_head=lm_head, progress=note
            )
        except QuantizeError as exc:
            raise click.ClickException(exc.message) from None
        note(f"quantized ({chosen.name}) in {manifest['seconds']:.1f} s; manifest: {target / MANIFEST}")

    _publish(request.output, build)


def _backend_of(model_dir: Path) -> str:
    """The backend whose compile step applies: vLLM when option.rolling_batch names it (or ``auto``
    chooses it here), else TensorRT-LLM's (which also plans for machines other than this one)."""
    from lmforge.config import ConfigError, load_config
    from lmforge.engines.registry import BackendUnavailableError, select_backend

    try:
        rolling_batch = load_config(model_dir).config.rolling_batch
    except ConfigError as exc:
        note(f"error: invalid configuration:\n{exc}")
        raise SystemExit(2) from None
    if rolling_batch in ("lmi-dist", "disable"):
        note(
            f"error: option.rolling_batch={rolling_batch}: nothing to compile ahead of time (LMI-Dist runs "
            "the model eagerly and starts in seconds); lmforge compile is for vllm and trtllm, or "
            "--quantize w8a8|gptq -o OUT for a quantized checkpoint"
        )
        raise SystemExit(2)
    if rolling_batch == "auto":
        try:
            return "vllm" if select_backend("auto").name == "vllm" else "trtllm"
        except BackendUnavailableError:
            return "trtllm"
    return rolling_batch


def _compile_vllm(request: CompileRequest) -> None:
    """vLLM: start the engine once, keep its compiled graphs in the folder (or in a copy at --output)."""
    from lmforge import __version__
    from lmforge.config import load_config
    from lmforge.engines.vllm import compile_run
    from lmforge.errors import LmforgeError

    model_dir = request.model_dir
    resolved = _configuration(model_dir)
    for warning in resolved.warnings:
        note(f"warning: {warning}")
    output = request.output
    local_out = Path(output) if output and not output.startswith("s3://") else None
    if local_out is not None and local_out.resolve() != model_dir.resolve():
        from lmforge.engines.vllm.compile_cache import compiled_folder

        # replaced only when it is an earlier compiled copy
        _check_output(
            output, model_dir, lambda p: (compiled_folder(p) / "manifest.json").is_file(), "compiled model"
        )
    try:
        if request.dry_run:
            target = local_out or model_dir
            plan = compile_run.plan(resolved.config, resolved.extra_options, target)
            click.echo(json.dumps(plan.to_dict(), indent=2) if request.as_json else plan.render())
            note(f"Next: lmforge compile {model_dir}" + (f" --output {output}" if output else ""))
            return
        _log_to_stderr()

        def build(target: Path) -> None:
            if target.resolve() != model_dir.resolve():
                note(f"copying {model_dir} to {target}")
                _copy_model(model_dir, target)
            if request.image is not None:
                _compile_in_image(request.image, request.engine, target)
                return
            here = load_config(target)  # the copy's own view (a relative option.model_id follows it)
            config = here.config
            if config.model_path is None:  # a hub id or s3:// prefix: download it as serving would
                config = config.model_copy(update={"model_id": str(_source(here))})
            compile_run.compile_folder(
                config, here.extra_options, target, progress=note, created_by=f"lmforge {__version__}"
            )

        if output is None:
            build(model_dir)
            click.echo(str(model_dir))
            note(f"Next: lmforge serve {model_dir}   (its start log says `compile cache: hit`)")
            note(f"  or: lmforge deploy {model_dir} --endpoint-name NAME --instance-type TYPE")
            return
        _publish(output, build)
    except LmforgeError as exc:
        raise click.ClickException(exc.message) from None


def _compile_in_image(image: str, engine_name: str, target: Path) -> None:
    """``--image``: the image's own ``lmforge compile`` on ``target``, with this shell's ``OPTION_*`` /
    ``SERVING_*`` settings (what the endpoint's environment would hold)."""
    import os

    from lmforge.container.compile_in_image import compile_in_image
    from lmforge.container.engine import EngineError, detect

    env = {k: v for k, v in os.environ.items() if k.startswith(("OPTION_", "SERVING_", "HF_MODEL_ID"))}
    try:
        compile_in_image(detect(engine_name), image, target, env=env, progress=note)
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None


def _log_to_stderr() -> None:
    """lmforge's own log lines (``compile cache: ...``) beside vLLM's, as ``lmforge serve`` shows them."""
    import logging
    import sys

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def _copy_model(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` without an earlier compiled vLLM artifact (replaced below); a
    quantized folder's manifest (``lmforge-compiled/quantize/``) goes with its weights."""
    from lmforge.engines.vllm.compile_cache import BACKEND_DIR, COMPILED_DIR

    if target.exists():
        shutil.rmtree(target)
    compiled = (source / COMPILED_DIR).resolve()
    shutil.copytree(
        source, target, ignore=lambda d, _names: {BACKEND_DIR} if Path(d).resolve() == compiled else set()
    )


def _compile_trtllm(request: CompileRequest) -> None:
    """TensorRT-LLM: the quantized checkpoint (>= 1.3) or the TensorRT engines (<= 1.2)."""
    from lmforge.config import ConfigError, load_config
    from lmforge.engines.trtllm import plan as trt_plan
    from lmforge.engines.trtllm.version_gate import choose

    model_dir, output, dry_run, as_json = request.model_dir, request.output, request.dry_run, request.as_json
    gpu_arch, trtllm_version = request.gpu_arch, request.trtllm_version
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


#: backend -> its compile step
_BACKENDS: dict[str, Callable[[CompileRequest], None]] = {"vllm": _compile_vllm, "trtllm": _compile_trtllm}


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
