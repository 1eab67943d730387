from __future__ import annotations

from pathlib import Path

import pytest

from lmforge.config import ConfigError, ServingConfig, load_config
from lmforge.config.schema import properties_keys
from lmforge.config.show import render_reference_markdown

ROOT = Path(__file__).resolve().parents[2]


def model(tmp_path: Path, text: str) -> Path:
    (tmp_path / "serving.properties").write_text(text)
    return tmp_path


def test_defaults_without_file(tmp_path: Path) -> None:
    r = load_config(tmp_path, env={})
    c = r.config
    assert (c.rolling_batch, c.max_rolling_batch_size, c.tensor_parallel_degree, c.job_queue_size) == (
        "auto",
        32,
        1,
        1000,
    )
    assert c.model_path == tmp_path
    assert all(s.kind == "default" for s in r.provenance.values())
    assert r.warnings == []


def test_file_values_types_and_provenance(tmp_path: Path) -> None:
    d = model(
        tmp_path,
        "engine=MPI\noption.tensor_parallel_degree=max\noption.trust_remote_code=TRUE\noption.dtype=bfloat16\n"
        'option.rope_scaling={"rope_type": "linear", "factor": 2.0}\noption.model_loading_timeout = 7200\n'
        "option.rolling_batch=lmi_dist\n",
    )
    r = load_config(d, env={})
    c = r.config
    assert c.engine == "MPI"
    assert c.tensor_parallel_degree == "max"
    assert c.trust_remote_code is True
    assert c.dtype == "bf16"
    assert c.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert c.model_loading_timeout == 7200
    assert c.rolling_batch == "lmi-dist"
    assert str(r.provenance["option.model_loading_timeout"]) == "serving.properties:6"
    assert r.provenance["option.dtype"].kind == "file"


def test_env_mapping(tmp_path: Path) -> None:
    env = {
        "OPTION_MAX_ROLLING_BATCH_SIZE": "8",
        "OPTION_ENTRYPOINT": "handler.py",
        "OPTION_ENGINE": "Python",
        "SERVING_JOB_QUEUE_SIZE": "5",
        "SERVING_MAX_REQUEST_SIZE": "1000",
        "SERVING_UNRELATED_THING": "ignored",
        "HF_MODEL_ID": "org/model",
        "TENSOR_PARALLEL_DEGREE": "4",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "2",
    }
    r = load_config(tmp_path, env=env)
    c = r.config
    assert c.max_rolling_batch_size == 8
    assert c.entry_point == "handler.py"
    assert c.engine == "Python"
    assert c.job_queue_size == 5
    assert c.max_request_size == 2 * 2**20  # SageMaker's setting beats SERVING_MAX_REQUEST_SIZE
    assert c.model_id == "org/model"
    assert c.model_path is None  # a hub id is not local
    assert c.tensor_parallel_degree == 4
    assert str(r.provenance["option.entryPoint"]) == "OPTION_ENTRYPOINT"
    assert str(r.provenance["option.model_id"]) == "HF_MODEL_ID"
    assert r.warnings == []


def test_precedence_file_over_env_over_alias(tmp_path: Path) -> None:
    d = model(tmp_path, "option.max_rolling_batch_size=16\noption.model_loading_timeout=100\n")
    env = {
        "OPTION_MAX_ROLLING_BATCH_SIZE": "8",
        "MAX_BATCH_SIZE": "4",
        "OPTION_TENSOR_PARALLEL_DEGREE": "2",
        "TENSOR_PARALLEL_DEGREE": "8",
        "SAGEMAKER_STARTUP_TIMEOUT": "900",
    }
    r = load_config(d, env=env)
    assert r.config.max_rolling_batch_size == 16
    assert r.config.tensor_parallel_degree == 2
    assert r.config.model_loading_timeout == 900  # SAGEMAKER_* overrides the file
    assert str(r.provenance["option.model_loading_timeout"]) == "SAGEMAKER_STARTUP_TIMEOUT"


def test_mixed_case_option_env_keeps_case(tmp_path: Path) -> None:
    r = load_config(tmp_path, env={"OPTION_entryPoint": "x.py"})
    assert r.config.entry_point == "x.py"


def test_unknown_keys_warn_with_suggestion_and_pass_through(tmp_path: Path) -> None:
    d = model(tmp_path, "option.max_rolling_batchsize=4\noption.enable_prefix_caching=true\nfoo=bar\n")
    r = load_config(d, env={"OPTION_SWAP_SPACE": "4"})
    assert (
        "Unknown key 'option.max_rolling_batchsize' (serving.properties:1); "
        "did you mean 'option.max_rolling_batch_size'?" in r.warnings
    )
    assert any(w.startswith("Unknown key 'foo' (serving.properties:3)") for w in r.warnings)
    assert r.extra_options == {
        "max_rolling_batchsize": "4",
        "enable_prefix_caching": "true",
        "swap_space": "4",
    }


def test_duplicate_keys_later_wins_with_warning(tmp_path: Path) -> None:
    r = load_config(model(tmp_path, "option.max_loras=2\noption.max_loras=3\n"), env={})
    assert r.config.max_loras == 3
    assert any("serving.properties:1" in w and "serving.properties:2" in w for w in r.warnings)


def test_errors_name_file_line_key_value_and_expectation(tmp_path: Path) -> None:
    d = model(tmp_path, "engine=Python\noption.max_rolling_batch_size=abc\noption.dtype=fp8\n")
    with pytest.raises(ConfigError) as err:
        load_config(d, env={"OPTION_MAX_LORAS": "0"})
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("serving.properties:2: option.max_rolling_batch_size = 'abc': ")
    assert "integer" in lines[0]
    assert any(
        ln.startswith("serving.properties:3: option.dtype = 'fp8': ") and "'fp32'" in ln for ln in lines
    )
    assert any(
        ln.startswith("OPTION_MAX_LORAS: option.max_loras = '0': ") and "greater than or equal to 1" in ln
        for ln in lines
    )


def test_tensor_parallel_degree_and_rope_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"option.tensor_parallel_degree = 'all'"):
        load_config(model(tmp_path, "option.tensor_parallel_degree=all\n"), env={})
    with pytest.raises(ConfigError, match=r"option.rope_scaling = '\{bad': expected a JSON object"):
        load_config(model(tmp_path, "option.rope_scaling={bad\n"), env={})


def test_cross_field_lengths(tmp_path: Path) -> None:
    d = model(tmp_path, "option.max_model_len=100\noption.max_input_len=80\noption.max_output_len=40\n")
    with pytest.raises(ConfigError, match=r"max_input_len \(80\) \+ option.max_output_len \(40\) = 120"):
        load_config(d, env={})


def test_unreadable_file(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_bytes(b"a=\xff\xfe\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path, env={})


def test_model_path_resolution(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    assert (
        load_config(model(tmp_path, "option.model_id=weights\n"), env={}).config.model_path
        == tmp_path / "weights"
    )
    assert load_config(model(tmp_path, "option.model_id=s3://b/p/\n"), env={}).config.model_path is None


def test_every_field_has_key_default_and_description() -> None:
    keys = properties_keys()
    assert len(keys) == len(ServingConfig.model_fields) - 1  # all but model_dir
    for name, info in ServingConfig.model_fields.items():
        assert info.description, name
        assert not info.is_required(), name


def test_docs_reference_is_generated_from_the_schema() -> None:
    assert (ROOT / "docs" / "configuration.md").read_text() == render_reference_markdown()
