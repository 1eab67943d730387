"""``ServingConfig``: every key lmforge reads from ``serving.properties`` and LMI's environment.

This model is the single source of truth: each field carries its properties key (``key`` in
``json_schema_extra``), type, default and a one-line description. The docs table
(docs/configuration.md), ``lmforge config show``, the "did you mean" hints and the "expected ..."
part of error messages are all generated from it.

Values usually arrive as strings and are parsed strictly (as Java's ``Integer.parseInt`` would):
integers are plain decimal digits, booleans are ``true/false/1/0/yes/no`` (any case), and an empty
value of an optional key means "unset".
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from lmforge.config.speculative import Speculation
from lmforge.config.speculative import resolve as resolve_speculation

DType = Literal["auto", "fp32", "fp16", "bf16"]
RollingBatch = Literal["auto", "vllm", "trtllm", "lmi-dist", "disable"]
OutputFormatter = Literal["json", "jsonlines", "sse"]
ReasoningParser = Literal["deepseek_r1", "qwen3"]
#: tool-call syntaxes lmforge reads on every engine (vLLM's engine takes any of its own parsers' names)
BUILTIN_TOOL_PARSERS = ("hermes", "llama3_json")
#: the LMI ``engine`` key: how DJL Serving runs the worker (not an lmforge engine, see lmforge.engines)
WorkerMode = Literal["Python", "MPI"]
CompileCacheMode = Literal["auto", "required", "off"]

#: Accepted spellings (lower-cased) -> canonical value, per field. Shown in error messages.
ALIASES: dict[str, dict[str, str]] = {
    "dtype": {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"},
    "rolling_batch": {"lmi_dist": "lmi-dist"},
}

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def _type_error(what: str) -> PydanticCustomError:
    # The loader replaces this text with the field's full expectation ("expected an integer >= 1").
    return PydanticCustomError("lmforge_type", "expected {what}", {"what": what})


def _parse_int(value: Any) -> Any:
    if isinstance(value, bool):
        raise _type_error("an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        return int(value.strip())
    raise _type_error("an integer")


def _parse_float(value: Any) -> Any:
    if isinstance(value, bool):
        raise _type_error("a number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        return float(value.strip())
    raise _type_error("a number")


def _parse_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise _type_error("a boolean")


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "array" if isinstance(value, list) else "string"


PositiveInt = Annotated[int, BeforeValidator(_parse_int), Field(ge=1)]
Bool = Annotated[bool, BeforeValidator(_parse_bool)]
Fraction = Annotated[float, BeforeValidator(_parse_float), Field(gt=0.0, le=1.0)]


def _key(key: str) -> dict[str, Any]:
    return {"key": key}


class ServingConfig(BaseModel):
    """The resolved configuration of one model (see :func:`lmforge.config.load_config`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    engine: WorkerMode | None = Field(
        default=None,
        description="LMI engine name: Python (one process) or MPI (one process per device, for "
        "tensor parallelism); unset = inferred",
        json_schema_extra=_key("engine"),
    )
    model_id: str | None = Field(
        default=None,
        description="Hugging Face hub id, s3:// prefix or local folder (relative to the model folder); "
        "unset = the model folder itself",
        json_schema_extra=_key("option.model_id"),
    )
    revision: str | None = Field(
        default=None,
        description="hub revision of option.model_id (branch, tag or commit)",
        json_schema_extra=_key("option.revision"),
    )
    trust_remote_code: Bool = Field(
        default=False,
        description="allow the model's own Python code (modeling files) to run",
        json_schema_extra=_key("option.trust_remote_code"),
    )
    dtype: DType = Field(
        default="auto",
        description="weights and activations type: auto (the checkpoint's), fp32, fp16 or bf16; "
        "float32, float16, half and bfloat16 are accepted too",
        json_schema_extra=_key("option.dtype"),
    )
    tensor_parallel_degree: PositiveInt | Literal["max"] = Field(
        default=1,
        description="devices one model copy is split over; max = all visible devices",
        json_schema_extra=_key("option.tensor_parallel_degree"),
    )
    pipeline_parallel_degree: PositiveInt = Field(
        default=1,
        description="pipeline stages one model copy is split into",
        json_schema_extra=_key("option.pipeline_parallel_degree"),
    )
    rolling_batch: RollingBatch = Field(
        default="auto",
        description="backend: auto (best installed), vllm, trtllm, lmi-dist (or lmi_dist), "
        "or disable (custom handler)",
        json_schema_extra=_key("option.rolling_batch"),
    )
    max_rolling_batch_size: PositiveInt = Field(
        default=32,
        description="most sequences decoded together in the running batch; more requests wait",
        json_schema_extra=_key("option.max_rolling_batch_size"),
    )
    max_rolling_batch_prefill_tokens: PositiveInt | None = Field(
        default=None,
        description="most tokens per engine step (prefill chunk size); unset = the engine decides",
        json_schema_extra=_key("option.max_rolling_batch_prefill_tokens"),
    )
    max_input_len: PositiveInt | None = Field(
        default=None,
        description="longest prompt in tokens; unset = limited by option.max_model_len only",
        json_schema_extra=_key("option.max_input_len"),
    )
    max_output_len: PositiveInt | None = Field(
        default=None,
        description="most new tokens one request may ask for; unset = limited by option.max_model_len only",
        json_schema_extra=_key("option.max_output_len"),
    )
    max_model_len: PositiveInt | None = Field(
        default=None,
        description="longest prompt + output in tokens; unset = from the model's config",
        json_schema_extra=_key("option.max_model_len"),
    )
    model_loading_timeout: PositiveInt = Field(
        default=1800,
        description="seconds allowed to load the model before the server gives up",
        json_schema_extra=_key("option.model_loading_timeout"),
    )
    output_formatter: OutputFormatter | None = Field(
        default=None,
        description="response format: json, jsonlines or sse; unset = json, or jsonlines when the "
        "request has stream=true",
        json_schema_extra=_key("option.output_formatter"),
    )
    enable_auto_tool_choice: Bool = Field(
        default=False,
        description="let the model decide when to call a tool (OpenAI tool_choice auto, the default "
        "when a request has tools); needs option.tool_call_parser",
        json_schema_extra=_key("option.enable_auto_tool_choice"),
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="the model family's tool-call syntax: hermes (<tool_call> JSON blocks: Hermes, "
        "Qwen 2.5/3, SmolLM3) or llama3_json (JSON objects with name and parameters: Llama 3.1+) on "
        "every engine; with option.rolling_batch=vllm, any parser vLLM has (mistral, pythonic, "
        "granite, ...), read by vLLM's own parser classes",
        json_schema_extra=_key("option.tool_call_parser"),
    )
    reasoning_parser: ReasoningParser | None = Field(
        default=None,
        description="split the model's reasoning (<think>...</think>) into reasoning_content: "
        "deepseek_r1 (the reply starts inside it) or qwen3 (when the reply opens with <think>)",
        json_schema_extra=_key("option.reasoning_parser"),
    )
    enable_stateful_sessions: Bool = Field(
        default=False,
        description='SageMaker sticky sessions: {"requestType": "NEW_SESSION"} opens one, requests '
        'carry X-Amzn-SageMaker-Session-Id, {"requestType": "CLOSE"} ends it',
        json_schema_extra=_key("option.enable_stateful_sessions"),
    )
    sessions_expiration: PositiveInt = Field(
        default=1200,
        description="seconds a stateful session stays open",
        json_schema_extra=_key("option.sessions_expiration"),
    )
    entry_point: str | None = Field(
        default=None,
        description="custom handler: a .py file in the model folder or a dotted module name; "
        "unset = model.py when present, else the built-in handler",
        json_schema_extra=_key("option.entryPoint"),
    )
    quantize: str | None = Field(
        default=None,
        description="quantization: w8a8 (int8, LMI-Dist and vLLM; quantized at load on an unquantized "
        "folder) or gptq (int4 weights, calibrated: lmforge compile --quantize gptq makes the checkpoint), "
        "both read by lmforge compile --quantize; other names pass to vLLM or TensorRT-LLM",
        json_schema_extra=_key("option.quantize"),
    )
    enable_lora: Bool = Field(
        default=False,
        description="serve LoRA adapters",
        json_schema_extra=_key("option.enable_lora"),
    )
    max_loras: PositiveInt = Field(
        default=4,
        description="most distinct LoRA adapters in one running batch",
        json_schema_extra=_key("option.max_loras"),
    )
    max_lora_rank: PositiveInt = Field(
        default=16,
        description="highest LoRA adapter rank accepted",
        json_schema_extra=_key("option.max_lora_rank"),
    )
    max_cpu_loras: PositiveInt | None = Field(
        default=None,
        description="LoRA adapters kept loaded in host memory (least recently used leave first); "
        "unset = max_loras",
        json_schema_extra=_key("option.max_cpu_loras"),
    )
    adapter_roots: str | None = Field(
        default=None,
        description="comma-separated folders adapters may be registered from, besides the model "
        "folder's adapters/",
        json_schema_extra=_key("option.adapter_roots"),
    )
    adapter_s3_prefixes: str | None = Field(
        default=None,
        description="comma-separated s3://bucket/prefix/ values adapters may be downloaded from; "
        "unset = none",
        json_schema_extra=_key("option.adapter_s3_prefixes"),
    )
    rope_scaling: dict[str, Any] | None = Field(
        default=None,
        description='RoPE scaling as a JSON object, e.g. {"rope_type":"linear","factor":2.0}; '
        "unset = the model's config",
        json_schema_extra=_key("option.rope_scaling"),
    )
    enforce_eager: Bool = Field(
        default=False,
        description="disable CUDA graphs (vLLM); no effect on CPU",
        json_schema_extra=_key("option.enforce_eager"),
    )
    compile_cache: CompileCacheMode = Field(
        default="auto",
        description="the model folder's compiled artifacts (lmforge compile: vLLM's graphs, and a "
        "quantized checkpoint's manifest on either engine): auto = use them when they match this machine, "
        "configuration and libraries, else compile (or serve the checkpoint) anyway, logging the miss; "
        "required = refuse to start unless they match (and refuse quantization at load); off = ignore "
        "them",
        json_schema_extra=_key("option.compile_cache"),
    )
    gpu_memory_utilization: Fraction = Field(
        default=0.9,
        description="share of GPU memory a GPU backend may use",
        json_schema_extra=_key("option.gpu_memory_utilization"),
    )
    num_threads: PositiveInt | None = Field(
        default=None,
        description="torch intra-op threads for CPU engines; unset = the engine's default",
        json_schema_extra=_key("option.num_threads"),
    )
    kv_cache_memory_mb: PositiveInt | None = Field(
        default=None,
        description="KV-cache budget of the LMI-Dist engine in MiB; unset = sized from "
        "option.max_rolling_batch_size x option.max_model_len",
        json_schema_extra=_key("option.kv_cache_memory_mb"),
    )
    speculative_config: str | None = Field(
        default=None,
        description="speculative decoding, vLLM's JSON object: method (ngram or draft_model), "
        "num_speculative_tokens (1-16), prompt_lookup_min/max, model, disable_by_batch_size; "
        "LMI-Dist and GPU vLLM serve it; unset = off",
        json_schema_extra=_key("option.speculative_config"),
    )
    speculative_draft_model: str | None = Field(
        default=None,
        description="LMI's legacy draft model folder for speculative decoding (the same as "
        'option.speculative_config={"method": "draft_model", "model": ...})',
        json_schema_extra=_key("option.speculative_draft_model"),
    )
    speculative_length: PositiveInt | None = Field(
        default=None,
        description="LMI's legacy tokens proposed per step with option.speculative_draft_model (unset = 5)",
        json_schema_extra=_key("option.speculative_length"),
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
        default=6 * 1024 * 1024,
        description="largest request body in bytes; larger ones get 413 (SageMaker's real-time "
        "limit is 6 MB)",
        json_schema_extra=_key("max_request_size"),
    )
    shutdown_timeout: int = Field(
        default=25,
        ge=6,
        le=3600,
        description="seconds from SIGTERM to exit: requests in flight may finish until 5 s before, "
        "then end with an error line (SageMaker sends SIGKILL 30 s after SIGTERM; raise it where "
        "the platform waits longer, e.g. Kubernetes' terminationGracePeriodSeconds)",
        json_schema_extra=_key("shutdown_timeout"),
    )
    model_dir: Path | None = Field(
        default=None,
        description="the model folder given to lmforge (not a properties key)",
    )

    @field_validator(
        "dtype",
        "rolling_batch",
        "output_formatter",
        "tool_call_parser",
        "reasoning_parser",
        "compile_cache",
        mode="before",
    )
    @classmethod
    def _lower_and_alias(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            word = value.strip().lower()
            return ALIASES.get(info.field_name or "", {}).get(word, word)
        return value

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_case(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"python": "Python", "mpi": "MPI"}.get(value.strip().lower(), value)
        return value

    @field_validator("tensor_parallel_degree", mode="before")
    @classmethod
    def _tp(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "max":
            return "max"
        return value

    @field_validator("rope_scaling", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise PydanticCustomError(
                    "lmforge_detail",
                    "{detail}",
                    {"detail": f"invalid JSON: {exc.msg} at column {exc.colno}"},
                ) from None
            if not isinstance(value, dict):
                raise PydanticCustomError(
                    "lmforge_detail", "{detail}", {"detail": f"got a JSON {_json_kind(value)}"}
                )
        return value

    @field_validator(
        "engine",
        "model_id",
        "revision",
        "max_rolling_batch_prefill_tokens",
        "max_input_len",
        "max_output_len",
        "max_model_len",
        "output_formatter",
        "entry_point",
        "quantize",
        "rope_scaling",
        "num_threads",
        "kv_cache_memory_mb",
        "speculative_config",
        "speculative_draft_model",
        "speculative_length",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # defined after the other "before" validators so that pydantic runs it first
        if isinstance(value, str):
            return value.strip() or None
        return value

    @model_validator(mode="after")
    def _auto_tools(self) -> ServingConfig:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError(
                "option.enable_auto_tool_choice=true needs option.tool_call_parser (hermes or llama3_json)"
            )
        parser = self.tool_call_parser
        if parser is not None and parser not in BUILTIN_TOOL_PARSERS and self.rolling_batch != "vllm":
            raise ValueError(
                f"option.tool_call_parser={parser!r}: lmforge reads hermes and llama3_json on every "
                "engine; other names are vLLM's parsers and need option.rolling_batch=vllm"
            )
        return self

    @model_validator(mode="after")
    def _speculation(self) -> ServingConfig:
        self.speculation  # noqa: B018 (resolving it checks it: a ValueError naming the option)
        return self

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
                    f"option.max_output_len ({self.max_output_len}) = {total} "
                    f"is more than option.max_model_len ({self.max_model_len})"
                )
        return self

    @property
    def speculation(self) -> Speculation | None:
        """The resolved speculative decoding settings (:mod:`.speculative`), None when it is off."""
        return resolve_speculation(
            self.speculative_config, self.speculative_draft_model, self.speculative_length
        )

    @property
    def model_path(self) -> Path | None:
        """The local folder holding the weights, or None when they must be downloaded first.

        ``model_id`` when it names an existing local folder (a relative path is taken relative to
        ``model_dir``), ``model_dir`` when ``model_id`` is unset, else None (hub id or ``s3://``).
        """
        if self.model_id is None:
            return self.model_dir
        if "://" in self.model_id:
            return None
        candidate = Path(self.model_id).expanduser()
        if not candidate.is_absolute() and self.model_dir is not None:
            candidate = self.model_dir / candidate
        return candidate if candidate.is_dir() else None
