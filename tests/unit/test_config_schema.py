"""ServingConfig and load_config: types, LMI's environment variables, precedence, provenance, errors."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from lmforge.cli.config_cmd import reference_markdown as render_reference_markdown
from lmforge.config import ConfigError, ResolvedConfig, ServingConfig, Source, load_config
from lmforge.config.describe import expectation, properties_keys
from lmforge.config.show import render_config
from lmforge.config.sources import ALIAS_ENV, SAGEMAKER_ENV, env_key

ROOT = Path(__file__).resolve().parents[2]

#: The brief's key table: properties key -> (attribute, default). Changing the schema means changing this.
EXPECTED_KEYS: dict[str, tuple[str, object]] = {
    "engine": ("engine", None),
    "option.model_id": ("model_id", None),
    "option.revision": ("revision", None),
    "option.trust_remote_code": ("trust_remote_code", False),
    "option.dtype": ("dtype", "auto"),
    "option.tensor_parallel_degree": ("tensor_parallel_degree", 1),
    "option.pipeline_parallel_degree": ("pipeline_parallel_degree", 1),
    "option.rolling_batch": ("rolling_batch", "auto"),
    "option.max_rolling_batch_size": ("max_rolling_batch_size", 32),
    "option.max_rolling_batch_prefill_tokens": ("max_rolling_batch_prefill_tokens", None),
    "option.max_input_len": ("max_input_len", None),
    "option.max_output_len": ("max_output_len", None),
    "option.max_model_len": ("max_model_len", None),
    "option.model_loading_timeout": ("model_loading_timeout", 1800),
    "option.output_formatter": ("output_formatter", None),
    "option.enable_auto_tool_choice": ("enable_auto_tool_choice", False),
    "option.tool_call_parser": ("tool_call_parser", None),
    "option.reasoning_parser": ("reasoning_parser", None),
    "option.enable_stateful_sessions": ("enable_stateful_sessions", False),
    "option.sessions_expiration": ("sessions_expiration", 1200),
    "option.entryPoint": ("entry_point", None),
    "option.quantize": ("quantize", None),
    "option.enable_lora": ("enable_lora", False),
    "option.max_loras": ("max_loras", 4),
    "option.max_lora_rank": ("max_lora_rank", 16),
    "option.max_cpu_loras": ("max_cpu_loras", None),
    "option.adapter_roots": ("adapter_roots", None),
    "option.adapter_s3_prefixes": ("adapter_s3_prefixes", None),
    "option.rope_scaling": ("rope_scaling", None),
    "option.enforce_eager": ("enforce_eager", False),
    "option.compile_cache": ("compile_cache", "auto"),
    "option.gpu_memory_utilization": ("gpu_memory_utilization", 0.9),
    "option.num_threads": ("num_threads", None),
    "option.kv_cache_memory_mb": ("kv_cache_memory_mb", None),
    "option.speculative_config": ("speculative_config", None),
    "option.speculative_draft_model": ("speculative_draft_model", None),
    "option.speculative_length": ("speculative_length", None),
    "option.default_max_new_tokens": ("default_max_new_tokens", 30),
    "job_queue_size": ("job_queue_size", 1000),
    "max_request_size": ("max_request_size", 6291456),
    "shutdown_timeout": ("shutdown_timeout", 25),
}


def model(tmp_path: Path, text: str) -> Path:
    (tmp_path / "serving.properties").write_text(text, encoding="utf-8")
    return tmp_path


def load(tmp_path: Path, text: str | None = None, **env: str) -> ResolvedConfig:
    if text is not None:
        model(tmp_path, text)
    return load_config(tmp_path, env=env)


def errors(tmp_path: Path, text: str | None = None, **env: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text, **env)
    assert err.value.problems == str(err.value).splitlines()
    return str(err.value).splitlines()


# --- schema ---------------------------------------------------------------------------------------


def test_schema_keys_attributes_and_defaults_are_the_documented_ones() -> None:
    keys = properties_keys()
    assert list(keys) == list(EXPECTED_KEYS)
    defaults = ServingConfig()
    for key, (attr, default) in EXPECTED_KEYS.items():
        assert keys[key] == attr
        assert getattr(defaults, attr) == default, key
    assert defaults.model_dir is None


def test_every_field_has_a_description_and_a_default() -> None:
    for name, info in ServingConfig.model_fields.items():
        assert info.description and len(info.description) > 10, name
        assert not info.is_required(), name
        assert "\n" not in info.description, name


def test_every_key_has_an_expectation() -> None:
    for name in properties_keys().values():
        assert expectation(name)


def test_serving_config_is_frozen() -> None:
    config = ServingConfig()
    with pytest.raises(ValidationError):
        config.max_loras = 3  # type: ignore[misc]


def test_serving_config_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        ServingConfig(max_rolling_batchsize=3)  # type: ignore[call-arg]


def test_cross_field_check_raises_value_error_naming_keys_and_values() -> None:
    with pytest.raises(ValueError, match=r"option.max_input_len \(80\).*option.max_output_len \(40\)"):
        ServingConfig(max_model_len=100, max_input_len=80, max_output_len=40)
    ServingConfig(max_model_len=120, max_input_len=80, max_output_len=40)  # equal is fine
    ServingConfig(max_input_len=8000, max_output_len=4000)  # no max_model_len: nothing to check


def test_rolling_batch_size_may_exceed_job_queue_size(tmp_path: Path) -> None:
    c = load(tmp_path, "option.max_rolling_batch_size=64\njob_queue_size=2\n").config
    assert (c.max_rolling_batch_size, c.job_queue_size) == (64, 2)


# --- types ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("Yes", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("NO", False),
    ],
)
def test_booleans(tmp_path: Path, text: str, expected: bool) -> None:
    c = load(tmp_path, f"option.trust_remote_code={text}\noption.enable_lora={text}\n").config
    assert c.trust_remote_code is expected
    assert c.enable_lora is expected


@pytest.mark.parametrize("text", ["on", "2", "y", "tru", ""])
def test_bad_booleans(tmp_path: Path, text: str) -> None:
    lines = errors(tmp_path, f"option.enforce_eager={text}\n")
    assert lines == [
        f"serving.properties:1: option.enforce_eager = {text!r}: expected a boolean (true/false, 1/0, yes/no)"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fp16", "fp16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("FP16", "fp16"),
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("fp32", "fp32"),
        ("float32", "fp32"),
        ("auto", "auto"),
    ],
)
def test_dtype_aliases_are_normalized(tmp_path: Path, text: str, expected: str) -> None:
    assert load(tmp_path, f"option.dtype={text}\n").config.dtype == expected


def test_bad_dtype_lists_choices_and_aliases(tmp_path: Path) -> None:
    (line,) = errors(tmp_path, "option.dtype=int8\n")
    assert line.startswith(
        "serving.properties:1: option.dtype = 'int8': expected one of auto, fp32, fp16, bf16"
    )
    assert "bfloat16" in line


@pytest.mark.parametrize(("text", "expected"), [("4", 4), (" 2 ", 2), ("max", "max"), ("MAX", "max")])
def test_tensor_parallel_degree_int_or_max(tmp_path: Path, text: str, expected: object) -> None:
    assert load(tmp_path, f"option.tensor_parallel_degree={text}\n").config.tensor_parallel_degree == expected


@pytest.mark.parametrize("text", ["0", "-1", "all", "1.5", "2.0"])
def test_bad_tensor_parallel_degree(tmp_path: Path, text: str) -> None:
    assert errors(tmp_path, f"option.tensor_parallel_degree={text}\n") == [
        f"serving.properties:1: option.tensor_parallel_degree = {text!r}: expected an integer >= 1 or 'max'"
    ]


@pytest.mark.parametrize("text", ["lmi-dist", "lmi_dist", "LMI-DIST"])
def test_rolling_batch_lmi_dist_alias(tmp_path: Path, text: str) -> None:
    assert load(tmp_path, f"option.rolling_batch={text}\n").config.rolling_batch == "lmi-dist"


@pytest.mark.parametrize("text", ["vllm", "trtllm", "disable", "auto"])
def test_rolling_batch_values(tmp_path: Path, text: str) -> None:
    assert load(tmp_path, f"option.rolling_batch={text}\n").config.rolling_batch == text


@pytest.mark.parametrize("text", ["scheduler", "tgi"])
def test_bad_rolling_batch(tmp_path: Path, text: str) -> None:
    (line,) = errors(tmp_path, f"option.rolling_batch={text}\n")
    assert f"option.rolling_batch = {text!r}: expected one of auto, vllm, trtllm, lmi-dist, disable" in line


@pytest.mark.parametrize(("text", "expected"), [("auto", "auto"), ("required", "required"), ("OFF", "off")])
def test_compile_cache_values(tmp_path: Path, text: str, expected: str) -> None:
    assert load(tmp_path, f"option.compile_cache={text}\n").config.compile_cache == expected
    assert load(tmp_path, OPTION_COMPILE_CACHE=text).config.compile_cache == expected


def test_bad_compile_cache_names_the_key_and_the_choices(tmp_path: Path) -> None:
    (line,) = errors(tmp_path, "option.compile_cache=always\n")
    assert "option.compile_cache = 'always': expected one of auto, required, off" in line


@pytest.mark.parametrize(("text", "expected"), [("Python", "Python"), ("MPI", "MPI"), ("python", "Python")])
def test_engine(tmp_path: Path, text: str, expected: str) -> None:
    assert load(tmp_path, f"engine={text}\n").config.engine == expected


def test_bad_engine(tmp_path: Path) -> None:
    assert errors(tmp_path, "engine=DeepSpeed\n") == [
        "serving.properties:1: engine = 'DeepSpeed': expected one of Python, MPI"
    ]


@pytest.mark.parametrize("text", ["abc", "8.0", "1_000", "0x10", "1e3", "0", "-3"])
def test_integers_are_strict(tmp_path: Path, text: str) -> None:
    assert errors(tmp_path, f"option.max_rolling_batch_size={text}\n") == [
        f"serving.properties:1: option.max_rolling_batch_size = {text!r}: expected an integer >= 1"
    ]


def test_integer_with_sign_and_spaces(tmp_path: Path) -> None:
    assert load(tmp_path, "option.max_loras=+8  \n").config.max_loras == 8


@pytest.mark.parametrize(("text", "expected"), [("0.5", 0.5), ("1", 1.0), (".25", 0.25), ("1e-1", 0.1)])
def test_gpu_memory_utilization(tmp_path: Path, text: str, expected: float) -> None:
    assert load(tmp_path, f"option.gpu_memory_utilization={text}\n").config.gpu_memory_utilization == expected


@pytest.mark.parametrize("text", ["0", "1.01", "-0.5", "nan", "inf", "most"])
def test_bad_gpu_memory_utilization(tmp_path: Path, text: str) -> None:
    assert errors(tmp_path, f"option.gpu_memory_utilization={text}\n") == [
        f"serving.properties:1: option.gpu_memory_utilization = {text!r}: expected a number > 0 and <= 1"
    ]


def test_output_formatter(tmp_path: Path) -> None:
    assert load(tmp_path, "option.output_formatter=SSE\n").config.output_formatter == "sse"
    tools = load(tmp_path, "option.enable_auto_tool_choice=true\noption.tool_call_parser=Hermes\n").config
    assert (tools.enable_auto_tool_choice, tools.tool_call_parser) == (True, "hermes")
    (line,) = errors(tmp_path, "option.enable_auto_tool_choice=true\n")
    assert "option.tool_call_parser" in line
    # other names are vLLM's own parsers: the vLLM engine only (its start checks the name)
    vllm = load(tmp_path, "option.rolling_batch=vllm\noption.tool_call_parser=Pythonic\n").config
    assert vllm.tool_call_parser == "pythonic"
    (line,) = errors(tmp_path, "option.rolling_batch=lmi-dist\noption.tool_call_parser=pythonic\n")
    assert "option.tool_call_parser='pythonic'" in line and "option.rolling_batch=vllm" in line, line
    (line,) = errors(tmp_path, "option.reasoning_parser=o1\n")
    assert line.endswith("option.reasoning_parser = 'o1': expected one of deepseek_r1, qwen3")
    (line,) = errors(tmp_path, "option.output_formatter=xml\n")
    assert line.endswith("option.output_formatter = 'xml': expected one of json, jsonlines, sse")


def test_rope_scaling_json(tmp_path: Path) -> None:
    c = load(tmp_path, 'option.rope_scaling={"rope_type":"linear","factor":2.0}\n').config
    assert c.rope_scaling == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("{bad", "invalid JSON: Expecting property name enclosed in double quotes at column 2"),
        ("[1, 2]", "got a JSON array"),
        ("2.0", "got a JSON number"),
        ("null", "got a JSON null"),
    ],
)
def test_bad_rope_scaling(tmp_path: Path, text: str, detail: str) -> None:
    assert errors(tmp_path, f"option.rope_scaling={text}\n") == [
        f"serving.properties:1: option.rope_scaling = {text!r}: expected a JSON object ({detail})"
    ]


def test_empty_value_of_an_optional_key_is_unset(tmp_path: Path) -> None:
    r = load(tmp_path, "option.quantize=\noption.max_model_len=\noption.rope_scaling=  \n", OPTION_ENGINE="")
    c = r.config
    assert (c.quantize, c.max_model_len, c.rope_scaling, c.engine) == (None, None, None, None)
    assert str(r.provenance["option.quantize"]) == "serving.properties:1"
    assert str(r.provenance["engine"]) == "OPTION_ENGINE"


def test_empty_value_of_a_required_key_is_an_error(tmp_path: Path) -> None:
    assert errors(tmp_path, "option.max_loras=\n") == [
        "serving.properties:1: option.max_loras = '': expected an integer >= 1"
    ]


def test_string_values_are_stripped(tmp_path: Path) -> None:
    assert load(tmp_path, "option.model_id = org/model   \n").config.model_id == "org/model"


# --- defaults and provenance ----------------------------------------------------------------------


def test_defaults_without_file(tmp_path: Path) -> None:
    r = load(tmp_path)
    assert r.config == ServingConfig(model_dir=tmp_path)
    assert r.config.model_dir == tmp_path
    assert set(r.provenance) == set(EXPECTED_KEYS)
    assert all(s == Source("default", "default") for s in r.provenance.values())
    assert (r.warnings, r.extra_options) == ([], {})


def test_no_model_dir(tmp_path: Path) -> None:
    r = load_config(None, env={"HF_MODEL_ID": "org/model"})
    assert r.config.model_dir is None
    assert r.config.model_id == "org/model"


def test_model_dir_as_string(tmp_path: Path) -> None:
    model(tmp_path, "option.max_loras=2\n")
    assert load_config(str(tmp_path), env={}).config.max_loras == 2


def test_env_none_reads_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if env_key(name) is not None:
            monkeypatch.delenv(name)
    monkeypatch.setenv("OPTION_MAX_LORAS", "7")
    r = load_config(tmp_path)
    assert r.config.max_loras == 7
    assert r.provenance["option.max_loras"] == Source("env", "OPTION_MAX_LORAS")


def test_file_values_and_provenance(tmp_path: Path) -> None:
    text = (
        "# LMI example\n"
        "engine=MPI\n"
        "option.tensor_parallel_degree=max\n"
        "option.trust_remote_code=TRUE\n"
        "option.dtype=bfloat16\n"
        'option.rope_scaling={"rope_type": "linear", "factor": 2.0}\n'
        "option.model_loading_timeout = 7200\n"
        "option.rolling_batch=lmi_dist\n"
        "option.entryPoint=handler.py\n"
        "job_queue_size: 10\n"
        "max_request_size 1024\n"
    )
    r = load(tmp_path, text)
    c = r.config
    assert (c.engine, c.tensor_parallel_degree, c.trust_remote_code, c.dtype) == ("MPI", "max", True, "bf16")
    assert c.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert (c.model_loading_timeout, c.rolling_batch, c.entry_point) == (7200, "lmi-dist", "handler.py")
    assert (c.job_queue_size, c.max_request_size) == (10, 1024)
    assert r.provenance["engine"] == Source("file", "serving.properties:2")
    assert r.provenance["option.model_loading_timeout"] == Source("file", "serving.properties:7")
    assert r.provenance["max_request_size"] == Source("file", "serving.properties:11")
    assert r.provenance["option.max_loras"] == Source("default", "default")
    assert r.warnings == []


def test_duplicate_keys_later_wins_with_warning(tmp_path: Path) -> None:
    r = load(tmp_path, "option.max_loras=2\n# x\noption.max_loras=3\n")
    assert r.config.max_loras == 3
    assert r.provenance["option.max_loras"] == Source("file", "serving.properties:3")
    assert r.warnings == [
        "'option.max_loras' is set twice (serving.properties:1 and serving.properties:3); "
        "using serving.properties:3"
    ]


def test_duplicate_with_a_bad_earlier_value_is_not_an_error(tmp_path: Path) -> None:
    assert load(tmp_path, "option.max_loras=abc\noption.max_loras=3\n").config.max_loras == 3


# --- environment ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("OPTION_MAX_ROLLING_BATCH_SIZE", "option.max_rolling_batch_size"),
        ("OPTION_DTYPE", "option.dtype"),
        ("OPTION_ENTRYPOINT", "option.entryPoint"),
        ("OPTION_entryPoint", "option.entryPoint"),
        ("OPTION_ENGINE", "engine"),
        ("OPTION_Some_Key", "option.Some_Key"),
        ("OPTION_SWAP_SPACE2", "option.swap_space2"),
        ("SERVING_JOB_QUEUE_SIZE", "job_queue_size"),
        ("SERVING_MAX_REQUEST_SIZE", "max_request_size"),
        ("HF_MODEL_ID", "option.model_id"),
        ("HF_REVISION", "option.revision"),
        ("TENSOR_PARALLEL_DEGREE", "option.tensor_parallel_degree"),
        ("PIPELINE_PARALLEL_DEGREE", "option.pipeline_parallel_degree"),
        ("HF_MODEL_TRUST_REMOTE_CODE", "option.trust_remote_code"),
        ("HF_MODEL_QUANTIZE", "option.quantize"),
        ("MAX_BATCH_SIZE", "option.max_rolling_batch_size"),
        ("MAX_CONCURRENT_REQUESTS", "job_queue_size"),
        ("SAGEMAKER_STARTUP_TIMEOUT", "option.model_loading_timeout"),
        ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "max_request_size"),
    ],
)
def test_env_key_mapping(name: str, key: str) -> None:
    mapped = env_key(name)
    assert mapped is not None
    assert mapped[0] == key


@pytest.mark.parametrize(
    "name", ["SERVING_LOAD_MODELS", "SERVING_ENGINE", "SERVING_OPTION_DTYPE", "OPTION_", "PATH", "HF_TOKEN"]
)
def test_env_vars_that_are_not_ours(name: str) -> None:
    assert env_key(name) is None


def test_each_env_kind_sets_its_key_with_provenance(tmp_path: Path) -> None:
    env = {
        "OPTION_MAX_ROLLING_BATCH_SIZE": "8",
        "OPTION_ENTRYPOINT": "handler.py",
        "OPTION_ENGINE": "Python",
        "OPTION_ROPE_SCALING": '{"factor": 4}',
        "SERVING_JOB_QUEUE_SIZE": "5",
        "SERVING_LOAD_MODELS": "test::MPI=/opt/ml/model",
        "SERVING_FEATURES": "vllm",
        "HF_MODEL_ID": "org/model",
        "HF_REVISION": "main",
        "TENSOR_PARALLEL_DEGREE": "max",
        "PIPELINE_PARALLEL_DEGREE": "2",
        "HF_MODEL_TRUST_REMOTE_CODE": "true",
        "HF_MODEL_QUANTIZE": "awq",
        "SAGEMAKER_STARTUP_TIMEOUT": "600",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "2",
        "HOME": "/root",
    }
    r = load_config(tmp_path, env=env)
    c = r.config
    assert (c.max_rolling_batch_size, c.entry_point, c.engine, c.rope_scaling) == (
        8,
        "handler.py",
        "Python",
        {"factor": 4},
    )
    assert (c.job_queue_size, c.model_id, c.revision, c.tensor_parallel_degree) == (
        5,
        "org/model",
        "main",
        "max",
    )
    assert (c.pipeline_parallel_degree, c.trust_remote_code, c.quantize) == (2, True, "awq")
    assert (c.model_loading_timeout, c.max_request_size) == (600, 2 * 1024 * 1024)
    expected_sources = {
        "option.max_rolling_batch_size": "OPTION_MAX_ROLLING_BATCH_SIZE",
        "option.entryPoint": "OPTION_ENTRYPOINT",
        "engine": "OPTION_ENGINE",
        "job_queue_size": "SERVING_JOB_QUEUE_SIZE",
        "option.model_id": "HF_MODEL_ID",
        "option.revision": "HF_REVISION",
        "option.tensor_parallel_degree": "TENSOR_PARALLEL_DEGREE",
        "option.pipeline_parallel_degree": "PIPELINE_PARALLEL_DEGREE",
        "option.trust_remote_code": "HF_MODEL_TRUST_REMOTE_CODE",
        "option.quantize": "HF_MODEL_QUANTIZE",
        "option.model_loading_timeout": "SAGEMAKER_STARTUP_TIMEOUT",
        "max_request_size": "SAGEMAKER_MAX_PAYLOAD_IN_MB",
    }
    for key, name in expected_sources.items():
        assert r.provenance[key] == Source("env", name), key
    assert r.provenance["option.dtype"] == Source("default", "default")
    assert (r.warnings, r.extra_options) == ([], {})  # SERVING_LOAD_MODELS etc. are ignored silently


def test_tgi_batch_aliases(tmp_path: Path) -> None:
    r = load(tmp_path, MAX_BATCH_SIZE="16", MAX_CONCURRENT_REQUESTS="50")
    assert (r.config.max_rolling_batch_size, r.config.job_queue_size) == (16, 50)
    assert r.provenance["job_queue_size"] == Source("env", "MAX_CONCURRENT_REQUESTS")


def test_mixed_case_option_env_keeps_case(tmp_path: Path) -> None:
    r = load(tmp_path, OPTION_entryPoint="x.py")
    assert r.config.entry_point == "x.py"
    assert r.provenance["option.entryPoint"] == Source("env", "OPTION_entryPoint")


def test_mixed_case_option_env_of_an_unknown_key(tmp_path: Path) -> None:
    r = load(tmp_path, OPTION_Max_Loras="3")
    assert r.config.max_loras == 4  # keys are case-sensitive, as in LMI
    assert r.extra_options == {"Max_Loras": "3"}
    assert r.warnings == [
        "Unknown key 'option.Max_Loras' (OPTION_Max_Loras); did you mean 'option.max_loras'?"
    ]


@pytest.mark.parametrize("mb", ["1", "0.5", "6", "100"])
def test_sagemaker_payload_megabytes(tmp_path: Path, mb: str) -> None:
    assert load(tmp_path, SAGEMAKER_MAX_PAYLOAD_IN_MB=mb).config.max_request_size == int(float(mb) * 2**20)


@pytest.mark.parametrize("mb", ["0", "-1", "inf", "nan", "six", "", "1e400"])
def test_bad_sagemaker_payload(tmp_path: Path, mb: str) -> None:
    assert errors(tmp_path, SAGEMAKER_MAX_PAYLOAD_IN_MB=mb) == [
        f"SAGEMAKER_MAX_PAYLOAD_IN_MB: max_request_size = {mb!r}: expected a number of megabytes > 0"
    ]


# --- precedence -----------------------------------------------------------------------------------


def test_precedence_file_over_env_over_alias_over_default(tmp_path: Path) -> None:
    text = "option.max_rolling_batch_size=16\njob_queue_size=7\n"
    env = {
        "OPTION_MAX_ROLLING_BATCH_SIZE": "8",  # below the file
        "MAX_BATCH_SIZE": "4",  # below both
        "SERVING_JOB_QUEUE_SIZE": "6",  # below the file
        "MAX_CONCURRENT_REQUESTS": "5",
        "OPTION_TENSOR_PARALLEL_DEGREE": "2",  # no file value: env beats the alias
        "TENSOR_PARALLEL_DEGREE": "8",
        "HF_MODEL_QUANTIZE": "awq",  # only the alias: it beats the default
    }
    r = load(tmp_path, text, **env)
    c = r.config
    assert (c.max_rolling_batch_size, c.job_queue_size) == (16, 7)
    assert r.provenance["option.max_rolling_batch_size"] == Source("file", "serving.properties:1")
    assert c.tensor_parallel_degree == 2
    assert r.provenance["option.tensor_parallel_degree"] == Source("env", "OPTION_TENSOR_PARALLEL_DEGREE")
    assert c.quantize == "awq"
    assert r.warnings == []


def test_option_env_beats_alias_whatever_the_names_sort_order(tmp_path: Path) -> None:
    # HF_MODEL_ID sorts before OPTION_MODEL_ID and MAX_CONCURRENT_REQUESTS before SERVING_*
    r = load(
        tmp_path,
        HF_MODEL_ID="alias/model",
        OPTION_MODEL_ID="option/model",
        MAX_CONCURRENT_REQUESTS="9",
        SERVING_JOB_QUEUE_SIZE="3",
    )
    assert (r.config.model_id, r.config.job_queue_size) == ("option/model", 3)
    assert r.provenance["option.model_id"] == Source("env", "OPTION_MODEL_ID")


def test_sagemaker_vars_override_the_file(tmp_path: Path) -> None:
    text = "option.model_loading_timeout=100\nmax_request_size=10\n"
    r = load(
        tmp_path,
        text,
        SAGEMAKER_STARTUP_TIMEOUT="900",
        OPTION_MODEL_LOADING_TIMEOUT="50",
        SAGEMAKER_MAX_PAYLOAD_IN_MB="2",
        SERVING_MAX_REQUEST_SIZE="20",
    )
    assert r.config.model_loading_timeout == 900
    assert r.config.max_request_size == 2 * 1024 * 1024
    assert r.provenance["option.model_loading_timeout"] == Source("env", "SAGEMAKER_STARTUP_TIMEOUT")
    assert r.provenance["max_request_size"] == Source("env", "SAGEMAKER_MAX_PAYLOAD_IN_MB")


def test_overridden_bad_values_are_not_errors(tmp_path: Path) -> None:
    r = load(tmp_path, "option.max_loras=3\n", OPTION_MAX_LORAS="junk", TENSOR_PARALLEL_DEGREE="x",
             OPTION_TENSOR_PARALLEL_DEGREE="2")  # fmt: skip
    assert (r.config.max_loras, r.config.tensor_parallel_degree) == (3, 2)


def test_same_key_from_two_option_vars_warns(tmp_path: Path) -> None:
    r = load(tmp_path, OPTION_ENTRYPOINT="a.py", OPTION_entrypoint="b.py")
    assert r.config.entry_point == "b.py"
    assert r.warnings == [
        "'option.entryPoint' is set twice (OPTION_ENTRYPOINT and OPTION_entrypoint); using OPTION_entrypoint"
    ]


# --- unknown keys ---------------------------------------------------------------------------------


def test_unknown_keys_warn_with_suggestion_and_pass_through(tmp_path: Path) -> None:
    text = "option.max_rolling_batchsize=4\noption.enable_prefix_caching=true\nfoo=bar\njob_queue=3\n"
    r = load(tmp_path, text, OPTION_SWAP_SPACE="4")
    assert r.warnings == [
        "Unknown key 'option.max_rolling_batchsize' (serving.properties:1); "
        "did you mean 'option.max_rolling_batch_size'?",
        "Unknown key 'option.enable_prefix_caching' (serving.properties:2)",
        "Unknown key 'foo' (serving.properties:3)",
        "Unknown key 'job_queue' (serving.properties:4); did you mean 'job_queue_size'?",
        "Unknown key 'option.swap_space' (OPTION_SWAP_SPACE)",
    ]
    assert r.extra_options == {
        "max_rolling_batchsize": "4",
        "enable_prefix_caching": "true",
        "swap_space": "4",
    }
    assert r.config.max_rolling_batch_size == 32
    assert r.provenance["option.swap_space"] == Source("env", "OPTION_SWAP_SPACE")
    assert r.provenance["option.enable_prefix_caching"] == Source("file", "serving.properties:2")
    assert "foo" not in r.provenance


def test_keys_are_case_sensitive(tmp_path: Path) -> None:
    r = load(tmp_path, "option.entrypoint=x.py\nOption.dtype=fp16\n")
    assert (r.config.entry_point, r.config.dtype) == (None, "auto")
    assert r.warnings == [
        "Unknown key 'option.entrypoint' (serving.properties:1); did you mean 'option.entryPoint'?",
        "Unknown key 'Option.dtype' (serving.properties:2); did you mean 'option.dtype'?",
    ]


def test_unknown_option_keys_follow_precedence(tmp_path: Path) -> None:
    r = load(tmp_path, "option.swap_space=4\n", OPTION_SWAP_SPACE="8")
    assert r.extra_options == {"swap_space": "4"}
    assert r.provenance["option.swap_space"] == Source("file", "serving.properties:1")


# --- errors ---------------------------------------------------------------------------------------


def test_error_names_file_line_key_value_and_expectation(tmp_path: Path) -> None:
    text = "engine=Python\n\noption.max_rolling_batch_size=abc\n"
    assert errors(tmp_path, text) == [
        "serving.properties:3: option.max_rolling_batch_size = 'abc': expected an integer >= 1"
    ]


def test_all_errors_are_listed_file_lines_first(tmp_path: Path) -> None:
    text = "option.dtype=fp8\nengine=Python\noption.max_rolling_batch_size=abc\noption.enable_lora=maybe\n"
    lines = errors(tmp_path, text, OPTION_MAX_LORAS="0", HF_MODEL_TRUST_REMOTE_CODE="sure")
    assert len(lines) == 5
    assert lines[0].startswith("serving.properties:1: option.dtype = 'fp8': expected one of auto, fp32")
    assert lines[1:] == [
        "serving.properties:3: option.max_rolling_batch_size = 'abc': expected an integer >= 1",
        "serving.properties:4: option.enable_lora = 'maybe': expected a boolean (true/false, 1/0, yes/no)",
        "HF_MODEL_TRUST_REMOTE_CODE: option.trust_remote_code = 'sure': "
        "expected a boolean (true/false, 1/0, yes/no)",
        "OPTION_MAX_LORAS: option.max_loras = '0': expected an integer >= 1",
    ]


def test_error_from_env_names_the_variable(tmp_path: Path) -> None:
    assert errors(tmp_path, TENSOR_PARALLEL_DEGREE="all") == [
        "TENSOR_PARALLEL_DEGREE: option.tensor_parallel_degree = 'all': expected an integer >= 1 or 'max'"
    ]


def test_cross_field_error_names_keys_values_and_sources(tmp_path: Path) -> None:
    text = "option.max_model_len=100\noption.max_input_len=80\n"
    assert errors(tmp_path, text, OPTION_MAX_OUTPUT_LEN="40") == [
        "serving.properties:1, serving.properties:2, OPTION_MAX_OUTPUT_LEN: option.max_input_len (80) + "
        "option.max_output_len (40) = 120 is more than option.max_model_len (100)"
    ]


def test_cross_field_check_is_skipped_when_a_field_is_invalid(tmp_path: Path) -> None:
    text = "option.max_model_len=100\noption.max_input_len=80\noption.max_output_len=x\n"
    assert errors(tmp_path, text) == [
        "serving.properties:3: option.max_output_len = 'x': expected an integer >= 1"
    ]


def test_value_with_quotes_is_shown_unambiguously(tmp_path: Path) -> None:
    (line,) = errors(tmp_path, "option.max_loras='3'\n")
    assert line == "serving.properties:1: option.max_loras = \"'3'\": expected an integer >= 1"


def test_not_utf8_file(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_bytes(b"engine=Python\na=\xff\xfe\n")
    (line,) = errors(tmp_path)
    assert re.fullmatch(r"serving\.properties:2: cannot read .*serving\.properties: not UTF-8 text .*", line)


def test_serving_properties_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").mkdir()
    (line,) = errors(tmp_path)
    assert "serving.properties: cannot read serving.properties" in line


def test_model_dir_is_a_file(tmp_path: Path) -> None:
    path = model(tmp_path, "engine=Python\n") / "serving.properties"
    with pytest.raises(ConfigError, match="not a folder"):
        load_config(path, env={})


def test_missing_model_dir_gives_defaults(tmp_path: Path) -> None:
    assert load_config(tmp_path / "absent", env={"HF_MODEL_ID": "org/m"}).config.model_id == "org/m"


def test_malformed_escape_is_a_config_error(tmp_path: Path) -> None:
    assert errors(tmp_path, "a=1\noption.model_id=\\u12\n") == [
        "serving.properties:2: malformed \\uXXXX escape: \\u12"
    ]


def test_config_error_is_an_exception_with_problems() -> None:
    assert issubclass(ConfigError, Exception)
    assert ConfigError("a\nb").problems == ["a", "b"]


# --- model_path -----------------------------------------------------------------------------------


def test_model_path_is_the_model_dir_without_model_id(tmp_path: Path) -> None:
    assert load(tmp_path).config.model_path == tmp_path


def test_model_path_relative_local_folder(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    assert load(tmp_path, "option.model_id=weights\n").config.model_path == tmp_path / "weights"


def test_model_path_absolute_local_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "m").mkdir()
    assert load_config(tmp_path / "m", env={"HF_MODEL_ID": str(elsewhere)}).config.model_path == elsewhere


@pytest.mark.parametrize("model_id", ["s3://bucket/prefix/", "org/model", "gpt2", "djl://ai.djl/x"])
def test_model_path_is_none_for_remote_ids(tmp_path: Path, model_id: str) -> None:
    assert load(tmp_path, f"option.model_id={model_id}\n").config.model_path is None


def test_model_path_hub_id_that_is_also_a_local_folder(tmp_path: Path) -> None:
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert load(tmp_path, "option.model_id=org/model\n").config.model_path == tmp_path / "org" / "model"


def test_model_path_without_model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "w").mkdir()
    monkeypatch.chdir(tmp_path)
    assert ServingConfig(model_id="w").model_path == Path("w")
    assert ServingConfig().model_path is None


# --- renderings -----------------------------------------------------------------------------------


def test_render_config_lists_every_key_extras_and_warnings(tmp_path: Path) -> None:
    r = load(tmp_path, "option.max_loras=2\noption.swap_space=4\n", HF_MODEL_ID="org/m")
    text = render_config(r)
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line and " " in line}
    for key in EXPECTED_KEYS:
        assert key in rows, key
    assert rows["option.max_loras"] == ["2", "serving.properties:1"]
    assert rows["option.model_id"] == ["org/m", "HF_MODEL_ID"]
    assert rows["option.rope_scaling"] == ["-", "default"]
    assert rows["option.trust_remote_code"] == ["false", "default"]
    assert rows["max_request_size"] == ["6291456", "default"]
    assert rows["option.swap_space"][:2] == ["4", "serving.properties:2,"]
    lines = text.splitlines()
    assert lines.index("warning: Unknown key 'option.swap_space' (serving.properties:2)") > max(
        i for i, line in enumerate(lines) if line.startswith("option.swap_space")
    )
    assert "warning" not in render_config(r, include_warnings=False)


def test_docs_reference_is_generated_from_the_schema() -> None:
    assert (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8") == render_reference_markdown()


def test_docs_reference_has_every_key_type_default_and_precedence() -> None:
    text = render_reference_markdown()
    for key, (attr, default) in EXPECTED_KEYS.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert len(cells) == 4, row
        shown = (
            "unset"
            if default is None
            else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        )
        assert cells[2] == shown, key
        assert cells[3] == ServingConfig.model_fields[attr].description
    assert "| `option.tensor_parallel_degree` | int >= 1 \\| max | `1` |" in text
    assert "## Precedence" in text
    for name in [*ALIAS_ENV, *SAGEMAKER_ENV]:
        assert f"`{name}`" in text
