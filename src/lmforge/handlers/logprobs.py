"""Log-probs in OpenAI's shapes, with every token named by its real bytes.

A token of a byte-level tokenizer can hold part of a UTF-8 character (an emoji or a CJK character
split over several tokens). Its text as the stream returns it is empty (the detokenizer holds the
bytes back until the character is complete) and decoding it alone gives U+FFFD, so neither names
the token. OpenAI answers with the token's own bytes instead, and so does lmforge:

* ``bytes`` is the token's raw UTF-8 bytes: for a GPT-2 style byte-level BPE token, its symbols
  mapped back through the byte-level alphabet; for a SentencePiece token, ``▁`` as a space and a
  byte-fallback token ``<0xNN>`` as that byte; a special token, its own text;
* ``token`` is those bytes as text when they are valid UTF-8, else ``bytes:`` followed by the text
  with each undecodable byte escaped as ``\\xNN`` (as OpenAI renders such tokens);
* in a completions ``top_logprobs`` object (keyed by token text), two alternatives that would get the
  same key keep the first as it is and name the others ``token_id:N`` (vLLM's token-id form), so no
  alternative is lost.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmforge.engines.protocol import Token

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_METASPACE = "\u2581"


def json_logprob(value: float) -> float | None:
    """A log-prob for JSON (the one conversion every answer uses): NaN and infinities (unknown,
    impossible) become null."""
    return value if math.isfinite(value) else None


def byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's), symbol -> byte: printable Latin-1 bytes stand for
    themselves; every other byte is given the next unused code point from 256 upwards, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            symbols[chr(256 + extra)] = b
            extra += 1
    return symbols


def _decoder_kinds(tokenizer: Any) -> set[str]:
    """The types of the tokenizer's decoder (a ``Sequence`` lists its members)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return set()
    try:
        spec = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return {type(decoder).__name__}
    members = spec.get("decoders") or [spec]
    return {str(m.get("type")) for m in members if isinstance(m, dict)}


class TokenText:
    """Names tokens as OpenAI's log-probs do: their raw bytes, and those bytes as text.

    Built once per handler from the engine's tokenizer; ``None`` (a formatter used on its own) names
    a token by the text it is given.
    """

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._bytes: dict[int, bytes] = {}
        self._decoded: dict[int, str] = {}
        kinds = _decoder_kinds(tokenizer) if tokenizer is not None else set()
        self._alphabet = byte_level_alphabet() if "ByteLevel" in kinds else None
        self._metaspace = bool(kinds & {"Metaspace", "ByteFallback"})
        self._special: set[int] = set()
        if tokenizer is not None:
            self._special = set(getattr(tokenizer, "all_special_ids", ()) or ())
            self._special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})

    def raw(self, token_id: int, text: str = "") -> bytes:
        """The token's own bytes (``text`` encoded when there is no tokenizer to ask)."""
        if self.tokenizer is None:
            return text.encode("utf-8")
        cached = self._bytes.get(token_id)
        if cached is None:
            cached = self._bytes[token_id] = self._lookup(token_id)
        return cached

    def _lookup(self, token_id: int) -> bytes:
        tok: Any = self.tokenizer
        try:
            symbol = tok.convert_ids_to_tokens(token_id)
        except (IndexError, KeyError, OverflowError, TypeError, ValueError):
            symbol = None
        if not isinstance(symbol, str):
            return str(tok.decode([token_id])).encode("utf-8")
        if token_id in self._special:
            return symbol.encode("utf-8")
        if self._alphabet is not None and all(c in self._alphabet for c in symbol):
            return bytes(self._alphabet[c] for c in symbol)
        if self._metaspace:
            fallback = _BYTE_FALLBACK.match(symbol)
            if fallback is not None:
                return bytes([int(fallback.group(1), 16)])
            return symbol.replace(_METASPACE, " ").encode("utf-8")
        return str(tok.decode([token_id])).encode("utf-8")

    def decoded(self, token_id: int) -> str:
        """The token decoded on its own, as LMI's ``top_tokens`` give an alternative's text (U+FFFD
        for part of a character; empty without a tokenizer)."""
        if self.tokenizer is None:
            return ""
        cached = self._decoded.get(token_id)
        if cached is None:
            cached = self._decoded[token_id] = str(self.tokenizer.decode([token_id]))
        return cached

    def name(self, token_id: int, text: str = "") -> str:
        """The token as text: its bytes decoded, or ``bytes:`` + the bytes with ``\\xNN`` escapes."""
        raw = self.raw(token_id, text)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + raw.decode("utf-8", errors="backslashreplace")

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token's share of the decoded text of ``ids`` (held-back bytes go to the token that
        completes the character; special tokens add nothing), as a stream returns the text."""
        if self.tokenizer is None:
            return ["" for _ in ids]
        from lmforge.engines.text import IncrementalDetokenizer

        detok = IncrementalDetokenizer(self.tokenizer)
        return [detok.step(t) for t in ids]

    # ------------------------------------------------------------------ chat

    def chat_entry(self, token: Token) -> dict[str, Any]:
        """One ``logprobs.content`` entry of a chat answer."""
        raw = self.raw(token.id, token.text)
        return {
            "token": self.name(token.id, token.text),
            "logprob": json_logprob(token.log_prob),
            "bytes": list(raw),
            "top_logprobs": [
                {"token": self.name(t), "logprob": json_logprob(lp), "bytes": list(self.raw(t))}
                for t, lp in token.top_logprobs or []
            ],
        }

    # ------------------------------------------------------------------ completions

    def top_dict(self, token: Token) -> dict[str, float | None]:
        """A completions ``top_logprobs`` entry: alternative -> log-prob, no alternative merged into
        another."""
        out: dict[str, float | None] = {}
        for t, lp in token.top_logprobs or []:
            key = self.name(t)
            out[f"token_id:{t}" if key in out else key] = json_logprob(lp)
        return out

    def completion_logprobs(
        self, tokens: list[Token], offsets: list[int], *, first_unscored: bool = False
    ) -> dict[str, Any]:
        """A completions ``logprobs`` object for ``tokens`` at text offsets ``offsets``;
        ``first_unscored``: the first token is the prompt's first, which has no log-prob and no
        alternatives (``null`` for both, as vLLM and OpenAI give it)."""
        top: list[dict[str, float | None] | None] = [self.top_dict(t) for t in tokens]
        if first_unscored and top:
            top[0] = None
        return {
            "tokens": [self.name(t.id, t.text) for t in tokens],
            "token_logprobs": [
                None if first_unscored and i == 0 else json_logprob(t.log_prob) for i, t in enumerate(tokens)
            ],
            "top_logprobs": top,
            "text_offset": offsets,
        }
