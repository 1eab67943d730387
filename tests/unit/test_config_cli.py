from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from lmforge.cli import main


def test_config_show_lists_values_and_sources(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_text(
        "engine=Python\noption.max_rolling_batch_size=8\noption.typo_key=1\n"
    )
    result = CliRunner().invoke(main, ["config", "show", str(tmp_path)], env={"OPTION_DTYPE": "fp16"})
    assert result.exit_code == 0, result.output
    rows = {
        line.split()[0]: line.split()[1:]
        for line in result.output.splitlines()
        if line.startswith(("option.", "engine"))
    }
    assert rows["option.max_rolling_batch_size"] == ["8", "serving.properties:2"]
    assert rows["option.dtype"] == ["fp16", "OPTION_DTYPE"]
    assert rows["option.job_queue_size" if "option.job_queue_size" in rows else "engine"][0] == "Python"
    assert "job_queue_size" in result.output
    assert "warning: Unknown key 'option.typo_key'" in result.output


def test_config_show_error_exits_2(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_text("option.max_model_len=-5\n")
    result = CliRunner().invoke(main, ["config", "show", str(tmp_path)])
    assert result.exit_code == 2
    assert "serving.properties:1: option.max_model_len = '-5'" in result.output
