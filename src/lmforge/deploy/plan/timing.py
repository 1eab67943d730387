"""Start-up timing: how long the model data takes to download and load and the engine to start (and
TensorRT-LLM to compile), and SageMaker's two start-up timeouts suggested from that."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.config.schema import ServingConfig
from lmforge.deploy.plan.model import Notes

#: Assumed S3 -> instance download throughput, bytes/s. Conservative: aws-cli/boto3 class speed
#: (s5cmd reaches GB/s, a single boto3 stream often much less).
DOWNLOAD_BYTES_PER_S = 150e6
#: Assumed weight load throughput from local disk into GPU memory, bytes/s (plain safetensors loaders
#: measure ~1 GB/s; halved for EBS-backed volumes and sharded loads).
LOAD_BYTES_PER_S = 500e6
#: Fixed start-up cost per backend: container start, Python imports, engine processes, KV-cache
#: profiling. vLLM captures CUDA graphs unless enforce_eager (its eager start on 2 CPU cores measured
#: 40-70 s); ``auto`` is costed as vLLM, which it picks when installed.
STARTUP_FIXED_S = 30.0
ENGINE_START_S = {"lmi-dist": 30.0, "vllm": 90.0, "auto": 90.0, "trtllm": 60.0}
VLLM_EAGER_START_S = 60.0
#: vLLM on a CPU instance (the vllm-cpu image): torch.compile at every start unless the folder carries
#: ``lmforge compile``'s artifact. Measured on SmolLM2-135M, 2 cores, empty caches: 87-118 s
#: uncompiled, 27 s from the artifact (docs/vllm-compile.md); doubled for larger models and slower disks.
VLLM_CPU_START_S = 240.0
VLLM_CPU_COMPILED_START_S = 60.0
#: TensorRT-LLM just-in-time engine build: a base cost plus a cost per billion parameters; anchored on
#: LMI's note that a 70B model takes about 7 minutes or more (120 + 4 x 70 = 400 s).
TRT_COMPILE_BASE_S = 120.0
TRT_COMPILE_S_PER_BILLION_PARAMS = 4.0
#: LMI-Dist's int8 quantization at load (``option.quantize=w8a8`` on an unquantized folder: round to
#: nearest, then prepack), float bytes per second: 426-611 MB/s measured on SmolLM2-135M's shapes (538 MB
#: of fp32 linear weights in 0.9-1.3 s, one AMD EPYC thread, ``quantize_int8`` + ``prepack``); rounded
#: down.
JIT_QUANT_BYTES_PER_S = 400e6
#: Margin applied to the estimated times before rounding.
TIMEOUT_MARGIN = 1.25
#: SageMaker's accepted range for ContainerStartupHealthCheckTimeoutInSeconds and
#: ModelDataDownloadTimeoutInSeconds.
TIMEOUT_MIN_S = 60
TIMEOUT_MAX_S = 3600


def round_timeout(seconds: float) -> int:
    rounded = math.ceil(seconds * TIMEOUT_MARGIN / 60) * 60
    return min(TIMEOUT_MAX_S, max(TIMEOUT_MIN_S, rounded))


def is_compiled_trt(folder: Path | None, config_json: dict[str, Any]) -> bool:
    """A TensorRT-LLM engine folder (the backend's own test), or LMI's older Triton model repository."""
    from lmforge.engines.trtllm.compile import is_compiled

    if "build_config" in config_json:
        return True
    if folder is None or not folder.is_dir():
        return False
    return is_compiled(folder) or any(folder.glob("*/config.pbtxt"))


@dataclass(frozen=True)
class Timings:
    download_s: float
    load_s: float
    start_s: float
    compile_s: float
    quantize_s: float
    """LMI-Dist quantizing the weights at every start (``option.quantize`` on an unquantized folder)."""
    health_check_timeout_s: int
    download_timeout_s: int


def timings(
    config: ServingConfig,
    *,
    download_bytes: int,
    weights_bytes: int,
    parameters: int,
    config_json: dict[str, Any],
    notes: Notes,
    cpu_instance: bool = False,
    quantize_at_load: str | None = None,
) -> Timings:
    """The start-up times and the timeouts suggested from them (TIMEOUT_MARGIN added, rounded up to
    minutes, within SageMaker's range). ``quantize_at_load``: the method of an ``option.quantize`` on an
    unquantized folder, whose float checkpoint is what is loaded (and, on LMI-Dist, quantized then)."""
    rolling_batch = config.rolling_batch
    weights_folder = config.model_path
    download_s = download_bytes / DOWNLOAD_BYTES_PER_S
    # quantized at load: the float checkpoint is read, not the quantized bytes it becomes
    load_s = (download_bytes if quantize_at_load else weights_bytes) / LOAD_BYTES_PER_S
    quantize_s = 0.0
    if quantize_at_load and rolling_batch == "lmi-dist":
        quantize_s = download_bytes / JIT_QUANT_BYTES_PER_S
        notes.warnings.append(
            f"option.quantize={quantize_at_load} quantizes the weights at every start of every instance "
            f"(estimated {quantize_s:.0f} s): `lmforge compile DIR --quantize {quantize_at_load} -o OUT` "
            f"(or `lmforge deploy --compile --quantize {quantize_at_load}`) ships them quantized"
        )
    start_s = ENGINE_START_S.get(rolling_batch, STARTUP_FIXED_S)
    if rolling_batch in ("vllm", "auto") and config.enforce_eager:
        start_s = VLLM_EAGER_START_S
    elif rolling_batch == "vllm" and cpu_instance:
        start_s = _vllm_cpu_start(config, notes)
    compile_s = 0.0
    if rolling_batch == "trtllm" and not is_compiled_trt(weights_folder, config_json):
        compile_s = TRT_COMPILE_BASE_S + TRT_COMPILE_S_PER_BILLION_PARAMS * parameters / 1e9
        notes.warnings.append(
            f"TensorRT-LLM will compile the model at start-up (estimated {compile_s:.0f} s); compile ahead "
            "of time and deploy the engine to skip it"
        )
    total_s = download_s + load_s + compile_s + quantize_s + start_s
    health = round_timeout(total_s)
    if total_s * TIMEOUT_MARGIN > TIMEOUT_MAX_S:
        notes.warnings.append(
            f"start-up may take longer than SageMaker's {TIMEOUT_MAX_S} s limit: use faster storage "
            "(uncompressed S3 prefix, s5cmd) or an ahead-of-time compiled model"
        )
    if load_s + quantize_s + start_s > config.model_loading_timeout:
        notes.warnings.append(
            f"option.model_loading_timeout ({config.model_loading_timeout} s) may be too short for loading "
            f"(estimated {load_s + quantize_s + start_s:.0f} s)"
        )

    return Timings(download_s, load_s, start_s, compile_s, quantize_s, health, round_timeout(download_s))


def _vllm_cpu_start(config: ServingConfig, notes: Notes) -> float:
    """vLLM's start on a CPU instance: from the folder's compiled artifact, or compiling at every start
    of every instance (said, with how to avoid it)."""
    from lmforge.engines.vllm.compile_cache import compiled_folder
    from lmforge.engines.vllm.compile_manifest import MANIFEST_NAME

    if config.model_dir is not None and (compiled_folder(config.model_dir) / MANIFEST_NAME).is_file():
        return VLLM_CPU_COMPILED_START_S
    notes.warnings.append(
        "vLLM compiles the model (torch.compile) at every start of every instance, scale-out included: "
        "`lmforge compile DIR` (or `lmforge deploy --compile`) ships it compiled"
    )
    return VLLM_CPU_START_S
