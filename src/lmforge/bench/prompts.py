"""Synthetic prompts of a set length, reproducible from a seed (no datasets needed).

With a tokenizer, prompts are built the way vLLM's ``random`` benchmark dataset builds them: each
request takes a run of consecutive ids from the tokenizer's non-special vocabulary, starting at a
random offset, decodes it to text, and re-encodes that text, cutting or topping up with random ids
until the text encodes to the requested number of tokens (a run that never settles is tried again
from another offset) (the tokens the server adds itself, such
as BOS, count towards the length). Without a tokenizer, prompts are random words from a fixed list,
one word per requested token: the real token count depends on the server's tokenizer, and the
results then carry no input token totals.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by",
    "this", "are", "from", "at", "or", "an", "which", "have", "not", "but", "all", "can", "one", "has",
    "more", "new", "time", "will", "first", "also", "its", "when", "into", "them", "some", "only",
    "other", "data", "model", "value", "list", "file", "line", "code", "test", "name", "type", "user",
    "state", "error", "number", "result", "function", "return", "string", "system", "point", "order",
    "table", "group", "field", "method", "class", "object", "query", "event", "token",
)  # fmt: skip
#: how many decode/encode rounds may adjust a prompt before its length is taken as it is
MAX_ADJUST = 10
#: how many other starting offsets a prompt may try when its adjustments do not settle
MAX_RESTARTS = 20


@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_len: int | None
    """Tokens the server will see (special tokens included); None without a tokenizer."""


def load_tokenizer(path: str | Path) -> Any:
    """A Hugging Face tokenizer from a local folder (a model folder or just its tokenizer files)."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder {folder} does not exist")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def word_prompts(count: int, input_len: int, seed: int) -> list[Prompt]:
    """``count`` prompts of ``input_len`` random words each."""
    _check(count, input_len)
    rng = random.Random(seed)
    return [Prompt(" ".join(rng.choices(WORDS, k=input_len)), None) for _ in range(count)]


def token_prompts(tokenizer: Any, count: int, input_len: int, seed: int) -> list[Prompt]:
    """``count`` prompts that encode to ``input_len`` tokens with ``tokenizer`` (see the module doc)."""
    _check(count, input_len)
    special = int(tokenizer.num_special_tokens_to_add())
    inner = input_len - special
    if inner < 1:
        raise ValueError(
            f"input length {input_len} leaves no room for text: the tokenizer adds {special} "
            "special token(s) itself"
        )
    banned = set(tokenizer.all_special_ids)
    allowed = [i for i in range(int(tokenizer.vocab_size)) if i not in banned]
    rng = random.Random(seed)
    offsets = [rng.randrange(len(allowed)) for _ in range(count)]
    prompts = []
    for index, offset in enumerate(offsets):
        for _ in range(MAX_RESTARTS):
            ids = [allowed[(offset + index + k) % len(allowed)] for k in range(inner)]
            text, ids = _fit(tokenizer, ids, inner, allowed, rng)
            if len(ids) == inner:
                break
            offset = rng.randrange(len(allowed))  # this run of ids does not settle: start elsewhere
        prompts.append(Prompt(text, len(ids) + special))  # the true length, even if it never settled
    return prompts


def _fit(
    tokenizer: Any, ids: list[int], target: int, allowed: list[int], rng: random.Random
) -> tuple[str, list[int]]:
    """Decode ``ids`` and re-encode until the text is ``target`` tokens long (or the rounds run out)."""
    for _ in range(MAX_ADJUST):
        text = str(tokenizer.decode(ids))
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if len(ids) == target:
            return text, ids
        if len(ids) > target:
            ids = ids[:target]
        else:
            ids += rng.choices(allowed, k=target - len(ids))
    text = str(tokenizer.decode(ids))
    return text, list(tokenizer.encode(text, add_special_tokens=False))


def make_prompts(count: int, input_len: int, seed: int, tokenizer: Any = None) -> list[Prompt]:
    if tokenizer is None:
        return word_prompts(count, input_len, seed)
    return token_prompts(tokenizer, count, input_len, seed)


def _check(count: int, input_len: int) -> None:
    if count < 1:
        raise ValueError(f"the number of prompts must be at least 1, got {count}")
    if input_len < 1:
        raise ValueError(f"the input length must be at least 1 token, got {input_len}")
