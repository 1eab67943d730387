"""``lmforge plan``: will this model and configuration fit this SageMaker instance, and how long to wait.

The plan reads the model's Hugging Face ``config.json`` (never the tensors) and sizes, per GPU:

* **weights**: the exact sum of tensor sizes from the ``*.safetensors`` headers when the weight files
  are local (re-priced for ``option.dtype`` / an on-the-fly ``option.quantize``), else the parameter
  count derived from the architecture x bytes per parameter; split over tensor x pipeline parallel.
* **KV cache**: ``2 x layers x kv_heads x head_dim x bytes`` per token (``bytes``: the compute dtype's,
  or one for an fp8 / int8 ``option.kv_cache_dtype``, by the values the backend takes:
  :mod:`lmforge.deploy.plan.kv_cache`), with the KV heads split over
  the tensor-parallel ranks (at least one per GPU: fewer heads than ranks are replicated) and the
  layers over the pipeline stages, for ``max_rolling_batch_size x max_model_len`` tokens.
* **runtime overhead**: :data:`OVERHEAD_FIXED_BYTES` (CUDA context, NCCL buffers, CUDA graphs) plus
  :data:`OVERHEAD_WEIGHT_SHARE` of the GPU's weights (activations and temporary buffers).

The sum is compared with ``memory per GPU x option.gpu_memory_utilization``. CPU instances are planned
against host memory (:data:`CPU_HOST_USABLE_FRACTION` of it), as one pool.

It also suggests SageMaker's two start-up timeouts from assumed transfer rates (constants below).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmforge.config.schema import ServingConfig
from lmforge.deploy.instances import InstanceType, get_instance
from lmforge.deploy.plan.checks import parallelism
from lmforge.deploy.plan.kv_cache import KvCache, kv_cache
from lmforge.deploy.plan.memory import (
    CPU_HOST_USABLE_FRACTION,
    DEFAULT_MAX_MODEL_LEN,
    DTYPE_BYTES,
    OVERHEAD_FIXED_BYTES,
    OVERHEAD_WEIGHT_SHARE,
    RUNTIME_QUANT_BITS,
    Memory,
    Precision,
    Weights,
    kv_budget,
    memory,
    precision,
    sequence_length,
    size_weights,
)
from lmforge.deploy.plan.model import GIB, MIB, DeployPlan, Notes, PlanError
from lmforge.deploy.plan.render import render_plan
from lmforge.deploy.plan.search import suggest
from lmforge.deploy.plan.timing import (
    DOWNLOAD_BYTES_PER_S,
    LOAD_BYTES_PER_S,
    TIMEOUT_MARGIN,
    TIMEOUT_MAX_S,
    TIMEOUT_MIN_S,
    Timings,
    timings,
)
from lmforge.engines.memory import kv_bytes_per_token
from lmforge.hf import (
    QUANT_SCALE_OVERHEAD_BITS,
    ModelFileError,
    ModelShape,
    TensorInfo,
    read_safetensors_header,
    weight_files,
)

__all__ = [
    "CPU_HOST_USABLE_FRACTION",
    "DEFAULT_MAX_MODEL_LEN",
    "DOWNLOAD_BYTES_PER_S",
    "DTYPE_BYTES",
    "GIB",
    "LOAD_BYTES_PER_S",
    "MIB",
    "OVERHEAD_FIXED_BYTES",
    "OVERHEAD_WEIGHT_SHARE",
    "QUANT_SCALE_OVERHEAD_BITS",
    "RUNTIME_QUANT_BITS",
    "TIMEOUT_MARGIN",
    "TIMEOUT_MAX_S",
    "TIMEOUT_MIN_S",
    "DeployPlan",
    "ModelShape",
    "PlanError",
    "TensorInfo",
    "make_plan",
    "read_safetensors_header",
    "render_plan",
    "weight_files",
]


def make_plan(
    model_dir: Path,
    config: ServingConfig,
    instance_type: str,
    *,
    model_config_path: Path | None = None,
    extra_options: Mapping[str, str] | None = None,
) -> DeployPlan:
    """Plan ``config`` (the model in ``model_dir``) on ``instance_type``.

    ``extra_options``: the configuration's ``option.*`` keys outside the schema (``kv_cache_dtype``);
    by default those of ``model_dir``'s serving.properties.

    ``config.json`` comes from ``model_config_path`` when given, else the local weights folder
    (``config.model_path``), else ``model_dir``. Raises ``ValueError`` for an unknown instance type and
    :class:`PlanError` when no usable ``config.json`` is found.
    """
    instance = get_instance(instance_type)
    config_path = _find_model_config(Path(model_dir), config, model_config_path)
    config_json = _load_json(config_path)
    try:
        shape = ModelShape.from_config(config_json)
    except ModelFileError as exc:
        raise PlanError(str(exc)) from None
    notes = Notes()
    prec = precision(config, shape, instance, notes)
    extras = _extra_options(model_dir) if extra_options is None else extra_options
    kv = kv_cache(config, extras, instance, prec.act_bytes, notes)
    weights = size_weights(config, shape, prec, notes)
    max_len, len_source = sequence_length(config, shape, notes)
    tp, pp = parallelism(config, instance, shape, prec.dtype, prec.quantization, notes)
    if shape.latent_attention:
        notes.warnings.append(
            "multi-head latent attention: the KV-cache estimate is approximate (an upper bound)"
        )
    budget = kv_budget(config, notes)
    utilization = CPU_HOST_USABLE_FRACTION if instance.is_cpu else config.gpu_memory_utilization
    batch = config.max_rolling_batch_size
    mem = memory(
        shape,
        instance,
        weights_bytes=weights.bytes,
        kv_bytes=kv.bytes,
        tp=tp,
        pp=pp,
        batch=batch,
        max_len=max_len,
        utilization=utilization,
        kv_budget=budget,
    )
    if budget is not None and budget < mem.kv_per_token * batch * max_len:
        notes.warnings.append(
            f"option.kv_cache_memory_mb holds {budget // mem.kv_per_token} tokens, fewer than "
            f"{batch} x {max_len}: long requests will wait for room"
        )
    fits = mem.fits and not notes.problems
    suggested = None
    if not fits:
        suggested = suggest(
            mem,
            shape=shape,
            instance=instance,
            config=config,
            dtype=prec.dtype,
            weights_bytes=weights.bytes,
            kv_bytes=kv.bytes,
            tp=tp,
            pp=pp,
            max_len=max_len,
            kv_budget=budget,
            notes=notes,
        )
    times = timings(
        config,
        download_bytes=weights.download_bytes,
        weights_bytes=weights.bytes,
        parameters=weights.parameters,
        config_json=config_json,
        notes=notes,
        cpu_instance=instance.is_cpu,
        quantize_at_load=prec.quantization if prec.runtime_bits is not None else None,
    )
    return _assemble(
        model_dir,
        config_path,
        config,
        instance,
        shape,
        prec,
        kv,
        weights,
        (max_len, len_source),
        (tp, pp),
        utilization,
        budget,
        mem,
        times,
        notes,
        fits,
        suggested,
    )


def _assemble(
    model_dir: Path,
    config_path: Path,
    config: ServingConfig,
    instance: InstanceType,
    shape: ModelShape,
    prec: Precision,
    kv: KvCache,
    weights: Weights,
    length: tuple[int, str],
    degrees: tuple[int, int],
    utilization: float,
    budget: int | None,
    mem: Memory,
    times: Timings,
    notes: Notes,
    fits: bool,
    suggested: str | None,
) -> DeployPlan:
    """The plan record, from what the steps of :func:`make_plan` found."""
    max_len, len_source = length
    tp, pp = degrees
    batch = config.max_rolling_batch_size
    return DeployPlan(
        model_dir=str(model_dir),
        model_config_path=str(config_path),
        instance_type=instance.name,
        instance=instance.describe(),
        accelerator=instance.accelerator,
        gpu_count=instance.gpu_count,
        memory_per_gpu_gib=instance.host_memory_gib if instance.is_cpu else instance.memory_per_gpu_gib,
        on_host_memory=instance.is_cpu,
        rolling_batch=config.rolling_batch,
        dtype=prec.dtype,
        quantization=prec.quantization,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=pp,
        max_rolling_batch_size=batch,
        max_model_len=max_len,
        max_model_len_source=len_source,
        memory_utilization=utilization,
        architecture=shape.architecture,
        parameters=weights.parameters,
        weights_bytes=weights.bytes,
        weights_source=weights.source,
        download_bytes=weights.download_bytes,
        kv_bytes_per_token=kv_bytes_per_token(
            num_layers=shape.num_layers,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype_bytes=kv.bytes,
        ),
        kv_cache_dtype=kv.dtype,
        kv_cache_bytes_per_element=kv.bytes,
        kv_bytes_per_token_per_gpu=mem.kv_per_token,
        kv_tokens=batch * max_len if budget is None else budget // mem.kv_per_token,
        weights_per_gpu_bytes=mem.weights,
        kv_per_gpu_bytes=mem.kv,
        overhead_per_gpu_bytes=mem.overhead,
        total_per_gpu_bytes=mem.total,
        available_per_gpu_bytes=mem.available,
        max_rolling_batch_size_that_fits=mem.max_batch,
        max_model_len_that_fits=mem.max_len,
        download_s=round(times.download_s, 1),
        load_s=round(times.load_s, 1),
        start_s=round(times.start_s, 1),
        compile_s=round(times.compile_s, 1),
        quantize_s=round(times.quantize_s, 1),
        health_check_timeout_s=times.health_check_timeout_s,
        download_timeout_s=times.download_timeout_s,
        fits=fits,
        problems=notes.problems,
        warnings=notes.warnings,
        suggestions=notes.suggestions,
        suggested_instance=suggested,
    )


def _find_model_config(model_dir: Path, config: ServingConfig, explicit: Path | None) -> Path:
    candidates: list[Path] = []
    if explicit is not None:
        candidates.append(explicit)
    if config.model_path is not None:
        candidates.append(config.model_path / "config.json")
    candidates.append(model_dir / "config.json")
    for path in candidates:
        if path.is_file():
            return path
    if explicit is not None:
        raise PlanError(f"--model-config {explicit}: no such file")
    where = f"option.model_id={config.model_id}" if config.model_id else str(model_dir)
    raise PlanError(
        f"no config.json found for {where}: the weights are not local, so pass the model's Hugging Face "
        "config.json with --model-config PATH"
    )


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a JSON object")
    return data


def _extra_options(model_dir: Path) -> dict[str, str]:
    """The ``option.*`` keys outside the schema in ``model_dir``'s serving.properties ({} when it has
    none or is invalid: its configuration is the caller's to check)."""
    from lmforge.config import ConfigError, load_config

    try:
        return load_config(model_dir, env={}).extra_options
    except ConfigError:
        return {}
