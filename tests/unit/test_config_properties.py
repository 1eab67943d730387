"""The serving.properties parser follows java.util.Properties.load (checked against a JVM when written)."""

from __future__ import annotations

import pytest

from lmforge.config import PropertyEntry, parse_properties
from lmforge.config.properties import PropertiesSyntaxError


def kv(text: str) -> list[tuple[str, str, int]]:
    return [(e.key, e.value, e.line) for e in parse_properties(text)]


def test_separators() -> None:
    text = "a=1\nb = 2\nc: 3\nd 4\ne\t=\t5\nf :6\ng\t7\nh\f8\n"
    assert kv(text) == [
        ("a", "1", 1),
        ("b", "2", 2),
        ("c", "3", 3),
        ("d", "4", 4),
        ("e", "5", 5),
        ("f", "6", 6),
        ("g", "7", 7),
        ("h", "8", 8),
    ]


def test_leading_whitespace_is_ignored_and_trailing_whitespace_kept() -> None:
    assert kv("   \t\fkey = value  \n") == [("key", "value  ", 1)]


def test_key_without_value() -> None:
    assert kv("alone\nalso=\nthird :\n") == [("alone", "", 1), ("also", "", 2), ("third", "", 3)]


def test_empty_key() -> None:
    assert kv("=value\n: other\n") == [("", "value", 1), ("", "other", 2)]


def test_value_keeps_later_separators() -> None:
    # after the separator (and the whitespace around it) everything is the value
    assert kv("x=y=z\nw = = v\nu=:t\ns : =r\nq  p  o\n") == [
        ("x", "y=z", 1),
        ("w", "= v", 2),
        ("u", ":t", 3),
        ("s", "=r", 4),
        ("q", "p  o", 5),
    ]


def test_comments_and_blank_lines() -> None:
    text = "# comment\n! also\n\n \t \n   # indented comment\n\t!indented\nk=v # not a comment\nx=!y\n"
    assert kv(text) == [("k", "v # not a comment", 7), ("x", "!y", 8)]


def test_hash_inside_a_key_ends_nothing() -> None:
    assert kv("a#b=c\n") == [("a#b", "c", 1)]


def test_continuation_lines_drop_leading_whitespace() -> None:
    text = "k = one \\\n    two \\\n  three\nnext=1\n"
    assert kv(text) == [("k", "one two three", 1), ("next", "1", 4)]


def test_continuation_within_the_key() -> None:
    assert kv("option.max_\\\n   loras=3\n") == [("option.max_loras", "3", 1)]


def test_odd_and_even_backslashes() -> None:
    assert kv("k=a\\\\\nz=1\n") == [("k", "a\\", 1), ("z", "1", 2)]  # 2: an escaped backslash
    assert kv("k=a\\\\\\\nb\nz=1\n") == [("k", "a\\b", 1), ("z", "1", 3)]  # 3: escaped + continuation


def test_continued_line_starting_with_hash_is_not_a_comment() -> None:
    assert kv("k=a\\\n  # b\n") == [("k", "a# b", 1)]


def test_comment_line_ending_in_backslash_does_not_continue() -> None:
    assert kv("# c \\\nk=v\n") == [("k", "v", 2)]


def test_continuation_into_a_blank_line_ends_the_entry() -> None:
    assert kv("k=a\\\n\nb=1\n") == [("k", "a", 1), ("b", "1", 3)]


def test_continuation_at_end_of_text_is_dropped() -> None:
    assert kv("k=a\\") == [("k", "a", 1)]
    assert kv("k=a\\\n") == [("k", "a", 1)]


def test_lone_backslash_line_starts_over() -> None:
    # Java: nothing was read yet, so the next line starts a fresh entry (a comment stays a comment)
    assert kv("\\\n# comment\nk=v\n") == [("k", "v", 3)]
    assert kv("  \\\n\n\nk=v\n") == [("k", "v", 4)]
    assert kv("k=v\n\\") == [("k", "v", 1), ("", "", 2)]  # at the very end: an empty entry, as in Java
    assert kv("k=v\n\\\r\n") == [("k", "v", 1)]


def test_escapes() -> None:
    text = (
        "tab=a\\tb\nnl=a\\nb\ncr=a\\rb\nff=a\\fb\nbs=a\\\\b\n"
        'u=\\u00e9t\\u00E9\nkey\\=with\\:seps\\ and\\#\\!=v\nother=\\q\\b\\"\n\\ lead=x\n'
    )
    assert kv(text) == [
        ("tab", "a\tb", 1),
        ("nl", "a\nb", 2),
        ("cr", "a\rb", 3),
        ("ff", "a\fb", 4),
        ("bs", "a\\b", 5),
        ("u", "été", 6),
        ("key=with:seps and#!", "v", 7),
        ("other", 'qb"', 8),
        (" lead", "x", 9),
    ]


def test_escaped_whitespace_keeps_value_leading_space() -> None:
    assert kv("k=\\  v\n") == [("k", "  v", 1)]


def test_unicode_escape_in_key() -> None:
    assert kv("\\u006Bey=1\n") == [("key", "1", 1)]


@pytest.mark.parametrize("text", ["a=1\nb=\\u12g4\n", "a=1\nb=\\u12\n", "a=1\nb\\u=1\n"])
def test_malformed_unicode_escape_names_file_and_line(text: str) -> None:
    with pytest.raises(PropertiesSyntaxError, match=r"^conf.properties:2: malformed \\uXXXX escape"):
        parse_properties(text, "conf.properties")


def test_crlf_and_cr_line_ends_count_as_one_line() -> None:
    assert kv("a=1\r\nb=2\rc=3\n\nd=4") == [("a", "1", 1), ("b", "2", 2), ("c", "3", 3), ("d", "4", 5)]
    assert kv("a=x\\\r\n  y\r\nb=2") == [("a", "xy", 1), ("b", "2", 3)]


def test_byte_order_mark_is_ignored() -> None:
    assert kv("\ufeffengine=Python\n") == [("engine", "Python", 1)]


def test_line_numbers_are_where_entries_start() -> None:
    text = "# header\n\na = 1 \\\n  2 \\\n  3\n\n! c\nb=2\n"
    assert kv(text) == [("a", "1 2 3", 3), ("b", "2", 8)]


def test_duplicates_are_all_returned_in_order() -> None:
    assert kv("k=1\nother=x\nk=2\n") == [("k", "1", 1), ("other", "x", 2), ("k", "2", 3)]


def test_empty_text() -> None:
    assert parse_properties("") == []
    assert parse_properties("\n\n# only comments\n") == []


def test_lmi_examples() -> None:
    text = """\
engine=MPI
option.model_id=s3://my-bucket/llama-2-13b/
option.tensor_parallel_degree=max
option.rolling_batch=lmi-dist
option.max_rolling_batch_size=64
option.model_loading_timeout = 7200
option.entryPoint=djl_python.huggingface
# LMI docs style, with spaces and a comment
option.dtype = fp16
engine=Python
"""
    entries = parse_properties(text)
    assert entries[0] == PropertyEntry("engine", "MPI", 1)
    assert entries[1] == PropertyEntry("option.model_id", "s3://my-bucket/llama-2-13b/", 2)
    assert entries[2] == PropertyEntry("option.tensor_parallel_degree", "max", 3)
    assert entries[5] == PropertyEntry("option.model_loading_timeout", "7200", 6)
    assert entries[6] == PropertyEntry("option.entryPoint", "djl_python.huggingface", 7)
    assert entries[7] == PropertyEntry("option.dtype", "fp16", 9)
    assert entries[8] == PropertyEntry("engine", "Python", 10)
    assert len(entries) == 9
