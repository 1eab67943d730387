from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.engines.text import StopMatcher


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[tuple[int, str]], bool, str]:
    m = StopMatcher(stops)
    out: list[tuple[int, str]] = []
    for i, piece in enumerate(pieces):
        out.extend(m.push(i, piece))
        if m.stopped:
            break
    if not m.stopped:
        out.extend(m.flush())
    return out, m.stopped, m.text


def test_no_stops_passes_everything_through() -> None:
    out, stopped, text = run((), ["a", "b", "c"])
    assert out == [(0, "a"), (1, "b"), (2, "c")]
    assert not stopped and text == "abc"


def test_stop_inside_one_token_cuts_it() -> None:
    out, stopped, text = run(("XY",), ["ab", "cXYd", "e"])
    assert stopped
    assert text == "abc"
    assert out == [(0, "ab"), (1, "c")]


def test_stop_across_tokens_holds_back_the_prefix() -> None:
    m = StopMatcher(("\n\n",))
    assert m.push(0, "hi") == [(0, "hi")]
    assert m.push(1, "\n") == []  # could be the start of the stop string
    out = m.push(2, "\nmore")
    assert m.stopped
    assert m.text == "hi"
    assert out == [(1, ""), (2, "")]


def test_held_prefix_is_released_when_it_does_not_match() -> None:
    m = StopMatcher(("\n\n",))
    assert m.push(0, "a\n") == []
    assert m.push(1, "b") == [(0, "a\n"), (1, "b")]
    assert not m.stopped


def test_flush_releases_held_text_at_the_end() -> None:
    out, stopped, text = run(("END",), ["x", "EN"])
    assert not stopped
    assert out == [(0, "x"), (1, "EN")]
    assert text == "xEN"


def test_earliest_of_several_stops_wins() -> None:
    _, stopped, text = run(("cd", "b"), ["abcd"])
    assert stopped and text == "a"


@pytest.mark.parametrize("split", range(1, 9))
def test_concatenation_is_text_for_every_split(split: int) -> None:
    full = "hello STOP world"
    pieces = [full[i : i + split] for i in range(0, len(full), split)]
    out, stopped, text = run(("STOP",), pieces)
    assert stopped
    assert text == "hello "
    assert "".join(t for _, t in out) == "hello "


def test_load_tokenizer_is_autotokenizers_choice_without_pytorch(tiny_model: Path, tmp_path: Path) -> None:
    """A transformers-5 tokenizer folder loads without importing PyTorch (LMI-Dist's HTTP process
    never runs a model) and gives what AutoTokenizer gives; other folders go through AutoTokenizer."""
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from lmforge.engines.text import load_tokenizer

    script = (
        "import sys; from lmforge.engines.text import load_tokenizer; "
        f"t = load_tokenizer({str(tiny_model)!r}); "
        "print(type(t).__name__, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["TokenizersBackend", "False"], out.stderr[-2000:]
    ours, auto = load_tokenizer(str(tiny_model)), AutoTokenizer.from_pretrained(str(tiny_model))
    assert type(ours) is type(auto)
    text = "def fib(n):\n    return n  # ünïcode"
    assert ours.encode(text) == auto.encode(text) and ours.decode(auto.encode(text)) == auto.decode(
        auto.encode(text)
    )
    chat = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    ) == auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert (ours.eos_token_id, ours.all_special_ids) == (auto.eos_token_id, auto.all_special_ids)
    # a folder that names another class (or custom code) is AutoTokenizer's to load
    other = tmp_path / "other"
    other.mkdir()
    for item in tiny_model.iterdir():
        (other / item.name).symlink_to(item)
    (other / "tokenizer_config.json").unlink()
    config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    assert load_tokenizer(str(other)).encode(text) == auto.encode(text)
