"""option.speculative_config and LMI's legacy speculative keys: resolved once, bad values named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.config import ConfigError, ServingConfig, load_config
from lmforge.config.speculative import MAX_SPECULATIVE_TOKENS, Speculation, draft_folder, draft_source


def _load(tmp_path: Path, text: str = "", **env: str) -> ServingConfig:
    (tmp_path / "serving.properties").write_text(text, encoding="utf-8")
    return load_config(tmp_path, env=env).config


def test_off_unless_configured() -> None:
    assert ServingConfig().speculation is None


def test_vllm_json_from_properties_and_env(tmp_path: Path) -> None:
    text = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
    spec = _load(tmp_path, f"option.speculative_config={text}\n").speculation
    assert spec == Speculation("ngram", 4, 1, 3)
    env = _load(tmp_path, OPTION_SPECULATIVE_CONFIG=text).speculation
    assert env == spec
    assert spec.to_vllm(None) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 3,
    }


def test_lmi_legacy_keys_map_to_a_draft_model(tmp_path: Path) -> None:
    spec = _load(
        tmp_path, "option.speculative_draft_model=/models/draft\noption.speculative_length=3\n"
    ).speculation
    assert spec == Speculation("draft_model", 3, model="/models/draft")
    assert _load(tmp_path, OPTION_SPECULATIVE_DRAFT_MODEL="d").speculation.num_speculative_tokens == 5


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (
            {"method": "eagle9", "num_speculative_tokens": 2},
            "method='eagle9' is not one of ngram, draft_model",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 0},
            "num_speculative_tokens=0 must be an integer from 1",
        ),
        ({"method": "ngram", "num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1}, "from 1 to 16"),
        ({"method": "ngram"}, "num_speculative_tokens is required"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
            "min=5",
        ),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs model"),
        ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "unknown field 'typo'"),
    ],
)
def test_bad_values_are_refused_naming_the_option(tmp_path: Path, value: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=r"option\.speculative_config") as err:
        _load(tmp_path, OPTION_SPECULATIVE_CONFIG=json.dumps(value))
    assert match in str(err.value)


def test_not_json_and_both_forms_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"option\.speculative_config is not JSON"):
        _load(tmp_path, OPTION_SPECULATIVE_CONFIG="ngram")
    with pytest.raises(ConfigError, match="set one of them"):
        _load(
            tmp_path,
            OPTION_SPECULATIVE_CONFIG='{"method": "ngram", "num_speculative_tokens": 2}',
            OPTION_SPECULATIVE_LENGTH="2",
        )
    with pytest.raises(ConfigError, match=r"speculative_length needs option\.speculative_draft_model"):
        _load(tmp_path, OPTION_SPECULATIVE_LENGTH="3")


def test_config_show_prints_the_resolved_settings(tmp_path: Path) -> None:
    from lmforge.config.show import render_config

    (tmp_path / "serving.properties").write_text(
        "option.speculative_draft_model=/models/draft\n", encoding="utf-8"
    )
    text = render_config(load_config(tmp_path, env={}))
    assert (
        'speculative decoding (resolved): {"method": "draft_model", "num_speculative_tokens": 5, '
        '"prompt_lookup_min": 1, "prompt_lookup_max": 4, "model": "/models/draft"}'
    ) in text


def test_config_show_describes_the_draft_model_folder(tmp_path: Path) -> None:
    """A relative draft folder is taken inside the model folder; show reads its config.json (no
    weights) and says when the folder is not a model folder."""
    import json

    from lmforge.config.show import render_config

    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 3, "vocab_size": 2048})
    )
    (tmp_path / "serving.properties").write_text(
        'option.speculative_config={"model": "draft", "num_speculative_tokens": 3}\n',
        encoding="utf-8",
    )
    text = render_config(load_config(tmp_path, env={}))
    assert f"draft model: {tmp_path / 'draft'} (LlamaForCausalLM, 3 layers, vocabulary 2048)" in text
    (tmp_path / "serving.properties").write_text("option.speculative_draft_model=nowhere\n", encoding="utf-8")
    text = render_config(load_config(tmp_path, env={}))
    assert f"draft model: {tmp_path / 'nowhere'} (not a model folder" in text
    assert "(not a model folder: no config.json; the engine refuses it at start)" in text


def test_a_draft_model_folder_resolves_relative_to_the_model_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One resolver for every engine: a relative draft folder is inside the model folder (LMI-Dist and
    TensorRT-LLM read draft_folder, vLLM gets draft_source); an absolute one stays; a hub id passes to
    vLLM as it is unless a folder of that name is in the model folder."""
    model = tmp_path / "model"
    (model / "draft").mkdir(parents=True)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the model folder: a relative draft must not be read from here
    assert draft_folder("draft", model) == model / "draft"
    assert draft_source("draft", model) == str(model / "draft")
    assert draft_source("./draft", model) == str(model / "draft")
    assert draft_source(str(tmp_path / "abs"), model) == str(tmp_path / "abs")
    assert draft_folder("draft", None) == elsewhere / "draft"  # no model folder: the working directory
    assert draft_source("HuggingFaceTB/SmolLM2-135M", model) == "HuggingFaceTB/SmolLM2-135M"
    (model / "org" / "tiny").mkdir(parents=True)
    assert draft_source("org/tiny", model) == str(model / "org" / "tiny")  # a folder wins over a hub id
    assert draft_source("nowhere", model) == str(model / "nowhere")  # not a hub id: the folder it names
    for text in (
        'option.speculative_config={"method": "draft_model", "model": "draft", "num_speculative_tokens": 2}',
        "option.speculative_draft_model=draft",
    ):
        config = _load(model, text + "\n")
        assert config.speculation is not None
        assert config.speculation.to_vllm(config.model_dir)["model"] == str(model / "draft")
