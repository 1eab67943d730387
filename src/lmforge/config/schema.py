"""``ServingConfig``: every key lmforge reads from ``serving.properties`` and LMI's environment.

This model is the single source of truth: each field carries its properties key (``key``), type,
default and a one-line description; the docs table (docs/configuration.md), ``lmforge config show``
and the "did you mean" hints are all generated from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DType = Literal["auto", "fp32", "fp16", "bf16"]
RollingBatch = Literal["auto", "vllm", "trtllm", "lmi-dist", "disable"]
OutputFormatter = Literal["json", "jsonlines", "sse"]

_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
_ROLLING_ALIASES = {
    "lmi_dist": "lmi-dist",
    "lmidist": "lmi-dist",
    "tensorrt-llm": "trtllm",
    "tensorrt_llm": "trtllm",
}


def _key(key: str) -> dict[str, Any]:
    return {"key": key}


PositiveInt = Annotated[int, Field(ge=1)]


class ServingConfig(BaseModel):
    """The resolved configuration of one model (see :func:`lmforge.config.load_config`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    engine: Literal["Python", "MPI"] | None = Field(
        default=None,
        description="LMI engine name: Python (one process) or MPI (one process per GPU); None = inferred",
        json_schema_extra=_key("engine"),
    )
    model_id: str | None = Field(
        default=None,
        description="Hugging Face hub id, s3:// prefix or local folder; unset = the model folder itself",
        json_schema_extra=_key("option.model_id"),
    )
    revision: str | None = Field(
        default=None,
        description="hub revision (branch, tag or commit)",
        json_schema_extra=_key("option.revision"),
    )
    trust_remote_code: bool = Field(
        default=False,
        description="allow the model's own Python code (modeling files) to run",
        json_schema_extra=_key("option.trust_remote_code"),
    )
    dtype: DType = Field(
        default="auto",
        description="weights and activations type: auto (the checkpoint's), fp32, fp16 or bf16",
        json_schema_extra=_key("option.dtype"),
    )
    tensor_parallel_degree: PositiveInt | Literal["max"] = Field(
        default=1,
        description="devices one model copy is split over; max = all visible devices",
        json_schema_extra=_key("option.tensor_parallel_degree"),
    )
    pipeline_parallel_degree: PositiveInt = Field(
        default=1, description="pipeline stages", json_schema_extra=_key("option.pipeline_parallel_degree")
    )
    rolling_batch: RollingBatch = Field(
        default="auto",
        description="backend: auto (best installed), vllm, trtllm, lmi-dist, or disable (custom handler)",
        json_schema_extra=_key("option.rolling_batch"),
    )
    max_rolling_batch_size: PositiveInt = Field(
        default=32,
        description="sequences decoded together in the running batch; more requests wait",
        json_schema_extra=_key("option.max_rolling_batch_size"),
    )
    max_rolling_batch_prefill_tokens: PositiveInt | None = Field(
        default=None,
        description="tokens per engine step (prefill chunk size); unset = engine default",
        json_schema_extra=_key("option.max_rolling_batch_prefill_tokens"),
    )
    max_input_len: PositiveInt | None = Field(
        default=None, description="longest prompt in tokens", json_schema_extra=_key("option.max_input_len")
    )
    max_output_len: PositiveInt | None = Field(
        default=None,
        description="most new tokens one request may ask for",
        json_schema_extra=_key("option.max_output_len"),
    )
    max_model_len: PositiveInt | None = Field(
        default=None,
        description="longest prompt + output in tokens; unset = the model's max_position_embeddings",
        json_schema_extra=_key("option.max_model_len"),
    )
    model_loading_timeout: PositiveInt = Field(
        default=1800,
        description="seconds allowed to load the model before the server gives up",
        json_schema_extra=_key("option.model_loading_timeout"),
    )
    output_formatter: OutputFormatter | None = Field(
        default=None,
        description="response format: json, jsonlines or sse; unset = json, or jsonlines when stream=true",
        json_schema_extra=_key("option.output_formatter"),
    )
    entry_point: str | None = Field(
        default=None,
        description="custom handler: a .py file in the model folder or a module; model.py is found alone",
        json_schema_extra=_key("option.entryPoint"),
    )
    quantize: str | None = Field(
        default=None,
        description="quantization method for backends that support one (awq, gptq, fp8, ...)",
        json_schema_extra=_key("option.quantize"),
    )
    enable_lora: bool = Field(
        default=False, description="serve LoRA adapters", json_schema_extra=_key("option.enable_lora")
    )
    max_loras: PositiveInt = Field(
        default=4, description="adapters in one running batch", json_schema_extra=_key("option.max_loras")
    )
    max_lora_rank: PositiveInt = Field(
        default=16,
        description="highest adapter rank accepted",
        json_schema_extra=_key("option.max_lora_rank"),
    )
    rope_scaling: dict[str, Any] | None = Field(
        default=None,
        description='RoPE scaling as a JSON object, e.g. {"rope_type":"linear","factor":2.0}',
        json_schema_extra=_key("option.rope_scaling"),
    )
    enforce_eager: bool = Field(
        default=False,
        description="disable CUDA graphs (vLLM); no effect on CPU",
        json_schema_extra=_key("option.enforce_eager"),
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        default=0.9,
        description="share of GPU memory a GPU backend may use",
        json_schema_extra=_key("option.gpu_memory_utilization"),
    )
    num_threads: PositiveInt | None = Field(
        default=None,
        description="torch intra-op threads for CPU engines; unset = all cores but one",
        json_schema_extra=_key("option.num_threads"),
    )
    kv_cache_memory_mb: PositiveInt | None = Field(
        default=None,
        description="KV-cache budget of lmi-dist in MiB; unset = batch size x max_model_len, capped by RAM",
        json_schema_extra=_key("option.kv_cache_memory_mb"),
    )
    default_max_new_tokens: PositiveInt = Field(
        default=30,
        description="max_new_tokens of a request that gives none (LMI's default)",
        json_schema_extra=_key("option.default_max_new_tokens"),
    )
    job_queue_size: PositiveInt = Field(
        default=1000,
        description="requests that may wait beyond the running batch; more get 503",
        json_schema_extra=_key("job_queue_size"),
    )
    max_request_size: PositiveInt = Field(
        default=6 * 2**20,
        description="largest request body in bytes; larger ones get 413 (SageMaker real-time allows 6 MB)",
        json_schema_extra=_key("max_request_size"),
    )
    model_dir: Path | None = Field(
        default=None,
        description="the model folder (not a properties key: the folder lmforge serves)",
        json_schema_extra=_key("model_dir"),
        exclude=False,
    )

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_alias(cls, value: Any) -> Any:
        return _DTYPE_ALIASES.get(value.lower(), value.lower()) if isinstance(value, str) else value

    @field_validator("rolling_batch", mode="before")
    @classmethod
    def _rolling_alias(cls, value: Any) -> Any:
        return _ROLLING_ALIASES.get(value.lower(), value.lower()) if isinstance(value, str) else value

    @field_validator("tensor_parallel_degree", mode="before")
    @classmethod
    def _tp(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "max":
            return "max"
        return value

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"python": "Python", "mpi": "MPI"}.get(value.lower(), value)
        return value

    @field_validator("rope_scaling", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"expected a JSON object ({exc.msg} at column {exc.colno})") from None
            if not isinstance(value, dict):
                raise ValueError("expected a JSON object")
        return value

    @model_validator(mode="after")
    def _lengths(self) -> ServingConfig:
        if (
            self.max_model_len is not None
            and self.max_input_len is not None
            and self.max_output_len is not None
        ):
            total = self.max_input_len + self.max_output_len
            if total > self.max_model_len:
                raise ValueError(
                    f"option.max_input_len ({self.max_input_len}) + "
                    f"option.max_output_len ({self.max_output_len}) "
                    f"= {total} is more than option.max_model_len ({self.max_model_len})"
                )
        return self

    @property
    def model_path(self) -> Path | None:
        """The local folder holding the weights: ``model_id`` when it is a local folder (relative to the
        model folder), the model folder when ``model_id`` is unset, else None (hub id or s3://)."""
        if self.model_id is None:
            return self.model_dir
        if "://" in self.model_id:
            return None
        candidate = Path(self.model_id).expanduser()
        if not candidate.is_absolute() and self.model_dir is not None:
            candidate = self.model_dir / candidate
        return candidate if candidate.is_dir() else None


def properties_keys() -> dict[str, str]:
    """properties key -> field name, for every field that has one in serving.properties or env."""
    out = {}
    for name, info in ServingConfig.model_fields.items():
        extra = info.json_schema_extra
        key = extra["key"] if isinstance(extra, dict) else name
        if name != "model_dir":
            out[str(key)] = name
    return out
