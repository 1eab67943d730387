"""A ``java.util.Properties.load`` compatible parser that remembers line numbers.

Syntax: ``key=value``, ``key = value``, ``key: value`` and ``key value``; ``#`` and ``!`` comment
lines; a line ending in an odd number of backslashes continues on the next line (whose leading
whitespace is dropped); escapes ``\\t \\n \\r \\f \\uXXXX``, and a backslash before any other
character stands for that character (so ``\\=``, ``\\:``, ``\\ `` and ``\\#`` put those in keys).
A UTF-8 byte-order mark at the start is ignored. Duplicate keys are all returned, in file order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


class PropertiesSyntaxError(ValueError):
    """A malformed ``\\uXXXX`` escape; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class PropertyEntry:
    key: str
    value: str
    line: int
    """1-based number of the line where the entry starts."""


def _logical_lines(text: str) -> list[tuple[int, str]]:
    parts = re.split(r"(\r\n|\r|\n)", text)
    natural, ends = parts[0::2], [*parts[1::2], ""]
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(natural):
        start = i
        line = natural[i].lstrip(_WS)
        i += 1
        if not line or line[0] in "#!":
            continue
        if line == "\\":
            # A lone backslash continues an empty line: like Java, start over on the next line, where
            # blank lines are skipped and '#'/'!' still begin a comment. (When the text ends right
            # after it, or after one \n or \r but not \r\n, Java reads the key "" with the value "".)
            if i == len(natural) or (i == len(natural) - 1 and natural[i] == "" and ends[i - 1] != "\r\n"):
                out.append((start + 1, ""))
            continue
        while _continues(line) and i < len(natural):
            line = line[:-1] + natural[i].lstrip(_WS)
            i += 1
        if _continues(line):  # a continuation at end of file is dropped, as Java does
            line = line[:-1]
        out.append((start + 1, line))
    return out


def _continues(line: str) -> bool:
    backslashes = len(line) - len(line.rstrip("\\"))
    return backslashes % 2 == 1


def _unescape(raw: str, filename: str, lineno: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        i += 1
        if i >= len(raw):
            break
        nxt = raw[i]
        if nxt == "u":
            digits = raw[i + 1 : i + 5]
            if len(digits) < 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise PropertiesSyntaxError(f"{filename}:{lineno}: malformed \\uXXXX escape: \\u{digits}")
            out.append(chr(int(digits, 16)))
            i += 5
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 1
    return "".join(out)


def _split(line: str) -> tuple[str, str]:
    """Split a logical line at the first unescaped separator (``=``, ``:`` or whitespace)."""
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=:" or ch in _WS:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WS)
    if rest[:1] in ("=", ":") and (i >= len(line) or line[i] in _WS or line[i] in "=:"):
        # a whitespace separator may be followed by one '=' or ':'; an '='/':' separator is consumed here
        rest = rest[1:].lstrip(_WS)
    return key, rest


def parse_properties(text: str, filename: str = "serving.properties") -> list[PropertyEntry]:
    """Parse properties text into entries in file order (duplicates kept; later ones win when merged)."""
    entries = []
    for lineno, line in _logical_lines(text.removeprefix("\ufeff")):
        raw_key, raw_value = _split(line)
        key = _unescape(raw_key, filename, lineno)
        value = _unescape(raw_value, filename, lineno)
        entries.append(PropertyEntry(key=key, value=value, line=lineno))
    return entries
