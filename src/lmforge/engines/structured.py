"""Structured output (OpenAI's ``response_format``, forced tool calls) with xgrammar.

An engine that picks its own tokens (LMI-Dist) constrains them with a grammar matcher per request:
before each step's choice, the matcher's bitmask removes every token that would break the grammar;
after it, the chosen token advances the matcher. Once the grammar is complete only the model's stop
tokens remain allowed, so the reply ends with EOS. vLLM does the same inside its own engine
(``StructuredOutputsParams``, with xgrammar as its default backend), so the constraint means the same
on both engines.

Grammars are compiled once per constraint (xgrammar's compiler caches them); compiling is the slow
part (milliseconds to seconds for a large schema), so engines compile off the event loop before they
submit a request (:meth:`Grammars.compile`), and the generation step only finds the compiled grammar.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import FieldError, RequestField, StructuredOutput

if TYPE_CHECKING:
    import torch

#: matchers kept for requests that may still be running (followers of a tensor-parallel group never
#: hear that a request ended: the oldest are dropped past this many)
MAX_MATCHERS = 4096
#: a JSON object with any members: what ``response_format: {"type": "json_object"}`` asks for
JSON_OBJECT_SCHEMA = '{"type": "object"}'


def schema_text(constraint: StructuredOutput) -> str:
    return JSON_OBJECT_SCHEMA if constraint.kind == "json_object" else constraint.schema


class Grammars:
    """Compiled grammars for one tokenizer, and the per-request matchers of one sampler."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> None:
        try:
            import xgrammar as xgr
        except ImportError:
            raise FieldError(
                RequestField.STRUCTURED,
                "structured output is not available on this server: the xgrammar package is not "
                "installed (pip install 'lmforge[lmi-dist]')",
            ) from None

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids or None
        )
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)
        self._lock = threading.Lock()
        self._matchers: OrderedDict[int, Any] = OrderedDict()

    def compile(self, constraint: StructuredOutput) -> Any:
        """The compiled grammar of ``constraint`` (cached); a schema xgrammar cannot compile is a 400."""
        try:
            # no free whitespace between tokens: a small model cannot pad the reply with endless
            # blanks, and the reply is compact JSON (the settings vLLM's xgrammar backend uses with
            # disable_any_whitespace, which lmforge sets for vLLM: the same grammar on both engines)
            return self._compiler.compile_json_schema(
                schema_text(constraint), any_whitespace=False, separators=(",", ":")
            )
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError with the reason
            raise FieldError(
                RequestField.STRUCTURED, f"the JSON schema cannot be used: {str(exc).strip()[:300]}"
            ) from None

    def matcher(self, key: int, constraint: StructuredOutput) -> Any:
        """Request ``key``'s matcher, created on its first step."""
        with self._lock:
            found = self._matchers.get(key)
            if found is not None:
                self._matchers.move_to_end(key)
                return found
        made = self._xgr.GrammarMatcher(self.compile(constraint))
        with self._lock:
            self._matchers[key] = made
            while len(self._matchers) > MAX_MATCHERS:
                self._matchers.popitem(last=False)
        return made

    def drop(self, key: int) -> None:
        with self._lock:
            self._matchers.pop(key, None)

    def mask(self, scores: torch.Tensor, rows: list[tuple[int, Any]]) -> torch.Tensor:
        """A copy of ``scores`` with each listed row (index, matcher) limited to the tokens its
        grammar allows next."""
        import torch

        xgr = self._xgr
        out = scores.to(torch.float32, copy=True)  # xgrammar's CPU kernel masks float32 logits
        bitmask = xgr.allocate_token_bitmask(scores.size(0), self.vocab_size)
        for index, matcher in rows:
            matcher.fill_next_token_bitmask(bitmask, index)
        xgr.apply_token_bitmask_inplace(
            out, bitmask.to(scores.device), vocab_size=self.vocab_size, indices=[i for i, _ in rows]
        )
        return out
