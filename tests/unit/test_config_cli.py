"""``lmforge config show DIR``."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from lmforge.cli.config_cmd import config_group
from lmforge.config.sources import env_key


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No LMI variables from the machine running the tests."""
    for name in list(os.environ):
        if env_key(name) is not None:
            monkeypatch.delenv(name)


def show(model_dir: Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(config_group, ["show", str(model_dir)], env=env)


def rows(stdout: str) -> dict[str, list[str]]:
    return {
        line.split()[0]: line.split()[1:]
        for line in stdout.splitlines()
        if line.startswith(("option.", "engine ", "job_queue_size ", "max_request_size "))
    }


@pytest.mark.usefixtures("clean_env")
def test_show_lists_every_key_with_value_and_source(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_text(
        "engine=Python\noption.max_rolling_batch_size=8\noption.typo_key=1\noption.max_loras=2\n"
    )
    result = show(tmp_path, env={"OPTION_DTYPE": "fp16", "HF_MODEL_ID": "org/model"})
    assert result.exit_code == 0, result.output
    table = rows(result.stdout)
    assert table["engine"] == ["Python", "serving.properties:1"]
    assert table["option.max_rolling_batch_size"] == ["8", "serving.properties:2"]
    assert table["option.dtype"] == ["fp16", "OPTION_DTYPE"]
    assert table["option.model_id"] == ["org/model", "HF_MODEL_ID"]
    assert table["job_queue_size"] == ["1000", "default"]
    assert table["max_request_size"] == ["6291456", "default"]
    assert table["option.rope_scaling"] == ["-", "default"]
    assert table["option.typo_key"][:2] == ["1", "serving.properties:3,"]
    assert len(table) == 41  # 40 schema keys + 1 extra option
    assert result.stdout.splitlines()[0] == f"model folder: {tmp_path}"
    # the table has a header and column order key | value | source
    header = next(line for line in result.stdout.splitlines() if line.startswith("key"))
    assert header.split() == ["key", "value", "source"]


@pytest.mark.usefixtures("clean_env")
def test_show_prints_warnings_to_stderr_only(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_text("option.max_rolling_batchsize=4\n")
    result = show(tmp_path)
    assert result.exit_code == 0
    assert result.stderr == (
        "warning: Unknown key 'option.max_rolling_batchsize' (serving.properties:1); "
        "did you mean 'option.max_rolling_batch_size'?\n"
    )
    assert "warning:" not in result.stdout


@pytest.mark.usefixtures("clean_env")
def test_show_without_serving_properties(tmp_path: Path) -> None:
    result = show(tmp_path)
    assert result.exit_code == 0
    assert result.stderr == ""
    assert all(cells[-1] == "default" for cells in rows(result.stdout).values())


@pytest.mark.usefixtures("clean_env")
def test_show_error_exits_2_with_every_problem_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_text("option.max_model_len=-5\noption.dtype=int4\n")
    result = show(tmp_path, env={"OPTION_MAX_LORAS": "many"})
    assert result.exit_code == 2
    assert result.stdout == ""
    err = result.stderr.splitlines()
    assert err[0] == "error: invalid configuration:"
    assert err[1] == "serving.properties:1: option.max_model_len = '-5': expected an integer >= 1"
    assert err[2].startswith("serving.properties:2: option.dtype = 'int4': expected one of auto")
    assert err[3] == "OPTION_MAX_LORAS: option.max_loras = 'many': expected an integer >= 1"
    assert "Traceback" not in result.output


@pytest.mark.usefixtures("clean_env")
def test_show_unreadable_file_exits_2(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_bytes(b"\xff\xfe\x00")
    result = show(tmp_path)
    assert result.exit_code == 2
    assert "not UTF-8" in result.stderr


def test_show_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    result = show(tmp_path / "absent")
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_config_group_is_named_config_and_registered() -> None:
    assert isinstance(config_group, click.Group)
    assert config_group.name == "config"
    assert "show" in config_group.commands
    from lmforge.cli import main

    result = CliRunner().invoke(main, ["config", "show", "--help"])
    assert result.exit_code == 0
    assert "MODEL_DIR" in result.output


@pytest.mark.usefixtures("clean_env")
def test_show_says_what_a_vllm_start_does_with_the_compiled_artifact(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs the vllm extra")
    (tmp_path / "serving.properties").write_text("option.rolling_batch=vllm\n")
    result = show(tmp_path)
    assert result.exit_code == 0, result.output
    assert "vLLM compile cache: none (no lmforge-compiled/vllm in the model folder)" in result.stdout
    (tmp_path / "serving.properties").write_text("option.rolling_batch=vllm\noption.compile_cache=off\n")
    assert "vLLM compile cache: none (option.compile_cache=off)" in show(tmp_path).stdout
    (tmp_path / "serving.properties").write_text("option.rolling_batch=lmi-dist\n")
    assert "compile cache" not in show(tmp_path).stdout
