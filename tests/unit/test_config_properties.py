from __future__ import annotations

import pytest

from lmforge.config.properties import PropertiesSyntaxError, PropertyEntry, parse_properties


def kv(text: str) -> list[tuple[str, str, int]]:
    return [(e.key, e.value, e.line) for e in parse_properties(text)]


def test_separators_and_whitespace() -> None:
    text = "a=1\nb = 2\nc: 3\nd 4\n   e\t=\t5\nf :6\ng\n"
    assert kv(text) == [
        ("a", "1", 1),
        ("b", "2", 2),
        ("c", "3", 3),
        ("d", "4", 4),
        ("e", "5", 5),
        ("f", "6", 6),
        ("g", "", 7),
    ]


def test_comments_and_blank_lines() -> None:
    text = "# comment\n! also\n\n   # indented comment\nk=v # not a comment\n"
    assert kv(text) == [("k", "v # not a comment", 5)]


def test_continuation_lines() -> None:
    text = "k = one \\\n    two \\\n  three\nnext=1\n"
    assert kv(text) == [("k", "one two three", 1), ("next", "1", 4)]


def test_even_backslashes_do_not_continue() -> None:
    assert kv("k=a\\\\\nz=1\n") == [("k", "a\\", 1), ("z", "1", 2)]


def test_comment_line_ending_in_backslash_does_not_continue() -> None:
    assert kv("# c \\\nk=v\n") == [("k", "v", 2)]


def test_escapes() -> None:
    text = "tab=a\\tb\nnl=a\\nb\nu=\\u00e9t\\u00E9\nkey\\=with\\:seps\\ and\\#=v\nother=\\q\n"
    assert kv(text) == [
        ("tab", "a\tb", 1),
        ("nl", "a\nb", 2),
        ("u", "été", 3),
        ("key=with:seps and#", "v", 4),
        ("other", "q", 5),
    ]


def test_value_keeps_later_separators() -> None:
    assert kv("x=y=z\nw = = v\nu=:t\n") == [("x", "y=z", 1), ("w", "= v", 2), ("u", ":t", 3)]


def test_crlf_and_cr_line_ends() -> None:
    assert kv("a=1\r\nb=2\rc=3") == [("a", "1", 1), ("b", "2", 2), ("c", "3", 3)]


def test_bad_unicode_escape() -> None:
    with pytest.raises(PropertiesSyntaxError, match=r"serving.properties:2: malformed"):
        parse_properties("a=1\nb=\\u12g4\n")


def test_lmi_examples() -> None:
    text = """\
engine=MPI
option.model_id=s3://my-bucket/llama-2-13b/
option.tensor_parallel_degree=max
option.rolling_batch=lmi-dist
option.max_rolling_batch_size=64
option.model_loading_timeout = 7200
option.entryPoint=djl_python.huggingface
"""
    entries = parse_properties(text)
    assert entries[0] == PropertyEntry("engine", "MPI", 1)
    assert {e.key: e.value for e in entries}["option.model_loading_timeout"] == "7200"
    assert entries[-1] == PropertyEntry("option.entryPoint", "djl_python.huggingface", 7)
