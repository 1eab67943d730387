"""Engine-side text helpers: incremental detokenization and stop-sequence matching with hold-back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def load_tokenizer(path: str, **kwargs: Any) -> Any:
    """The tokenizer ``AutoTokenizer.from_pretrained(path, **kwargs)`` gives, without importing
    PyTorch where that is certain to be the same one.

    ``AutoTokenizer`` imports transformers' configuration and generation modules, which import
    PyTorch (~3.5 s of CPU and a few hundred MB in a process that never runs a model, such as
    LMI-Dist's HTTP process). A local folder whose ``tokenizer_config.json`` names the plain
    ``TokenizersBackend`` (what transformers 5 saves for a ``tokenizer.json`` tokenizer), with no
    custom code, gets that class directly, as ``AutoTokenizer`` would pick it; anything else goes
    through ``AutoTokenizer``."""
    import json
    from pathlib import Path

    folder = Path(path)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if (
        isinstance(config, dict)
        and config.get("tokenizer_class") == "TokenizersBackend"
        and "auto_map" not in config
        and (folder / "tokenizer.json").is_file()
        and not kwargs.get("trust_remote_code")
    ):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(path, **kwargs)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, **kwargs)


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker`` (text that must be
    held back while it may still turn into ``marker``)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces whose concatenation is the decoded text.

    Uses ``tokenizers.decoders.DecodeStream``, which holds back bytes of incomplete UTF-8 characters
    and byte-level merges, so each piece is valid text; a token that completes nothing yields ``""``.
    """

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend = tokenizer.backend_tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        piece = self._stream.step(self._backend, token_id)
        return piece or ""


@dataclass
class _Pending:
    item: Any
    start: int
    end: int


@dataclass
class StopMatcher:
    """Finds stop strings in generated text and holds back text that may be the start of one.

    Feed each token's text with :meth:`push`; it returns the items that are safe to emit (their text
    cannot be part of a stop string). When a stop string completes, :attr:`stopped` is set and
    :meth:`push` returns the remaining items, whose text is cut right before the match, via
    :meth:`cut`. :meth:`flush` releases everything held back when generation ends for another reason.
    """

    stops: tuple[str, ...]
    text: str = ""
    stopped: bool = False
    _pending: list[_Pending] = field(default_factory=list)
    _released: int = 0

    def __post_init__(self) -> None:
        self._longest = max((len(s) for s in self.stops), default=0)

    def push(self, item: Any, piece: str) -> list[tuple[Any, str]]:
        """Add one token (``item``) whose text is ``piece``; return ``(item, text)`` pairs to emit now."""
        if not self.stops:  # nothing to match or hold back (the common case): no bookkeeping
            self.text += piece
            return [(item, piece)]
        start = len(self.text)
        self.text += piece
        self._pending.append(_Pending(item, start, len(self.text)))
        search_from = max(0, self._released - self._longest + 1, start - self._longest + 1)
        hit = self._find(search_from)
        if hit is not None:
            self.stopped = True
            self.text = self.text[:hit]
            return self._release(hit, final=True)
        return self._release(len(self.text) - self._held_suffix())

    def flush(self) -> list[tuple[Any, str]]:
        return self._release(len(self.text), final=True)

    def _find(self, search_from: int) -> int | None:
        best: int | None = None
        for stop in self.stops:
            pos = self.text.find(stop, search_from)
            if pos != -1 and (best is None or pos < best):
                best = pos
        return best

    def _held_suffix(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        text = self.text
        for k in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(stop.startswith(tail) for stop in self.stops):
                return k
        return 0

    def _release(self, upto: int, *, final: bool = False) -> list[tuple[Any, str]]:
        out: list[tuple[Any, str]] = []
        keep: list[_Pending] = []
        for p in self._pending:
            if p.end <= upto:
                out.append((p.item, self.text[p.start : p.end]))
            elif final:
                # Cut at the stop match: the token that crosses it keeps the text before it.
                out.append((p.item, self.text[p.start : upto] if p.start < upto else ""))
            else:
                keep.append(p)
        self._pending = keep
        self._released = max(self._released, upto if not keep else keep[0].start)
        return out
