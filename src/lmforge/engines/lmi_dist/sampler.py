"""Per-request sampling inside transformers' continuous-batching step.

transformers 5.19's continuous batching only varies temperature/top-k/top-p per request, makes
``do_sample`` global, has no per-request seed or repetition penalty, and reports log-probs *after*
its warpers (so a greedy request sees 0.0). LMI-Dist therefore installs this one logits processor in
place of the manager's list: it receives the raw logits of every row that gets a new token, picks the
token itself (greedy or sampled with the request's own settings and generator), records the model's
log-prob of that token (and top-n alternatives), and hands back scores whose argmax is that token.
The manager runs with ``do_sample=False``, so its own argmax reproduces our choice exactly.

Rows are matched to requests through an integer key passed as a logits-processor kwarg, which
transformers threads through its batch tensors for us, in row order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.logits_process import LogitsProcessorList

from lmforge.engines.protocol import SamplingParams

KEY_KWARG = "lmforge_key"


@dataclass
class SamplingState:
    """What the sampler knows of one request; written by the engine, read on the generation thread."""

    params: SamplingParams
    prompt_ids: list[int]
    generator: torch.Generator | None = None
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    _seen: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.params.repetition_penalty != 1.0:
            self._seen = torch.tensor(sorted(set(self.prompt_ids)), dtype=torch.long)

    def seen_ids(self, device: torch.device) -> torch.Tensor | None:
        if self._seen is not None and self._seen.device != device:
            self._seen = self._seen.to(device)
        return self._seen

    def generator_on(self, device: torch.device) -> torch.Generator | None:
        """The request's own random generator (seeded requests only), on the device of the logits."""
        if self.params.seed is None:
            return None
        if self.generator is None or self.generator.device != device:
            self.generator = torch.Generator(device=device).manual_seed(self.params.seed)
        return self.generator

    def record(self, token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> None:
        self.logprobs.append(logprob)
        if top is not None:
            self.top.append(top)
        if self._seen is not None and not bool((self._seen == token_id).any()):
            extra = torch.tensor([token_id], dtype=torch.long, device=self._seen.device)
            self._seen = torch.cat([self._seen, extra])


class RequestSampler(ContinuousBatchingLogitsProcessor):  # type: ignore[misc]
    supported_kwargs: dict[str, type] = {KEY_KWARG: int}  # noqa: RUF012 - interface of the base class
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._states: dict[int, SamplingState] = {}
        self._lock = threading.Lock()
        self._next_key = 0

    def add(self, state: SamplingState) -> int:
        with self._lock:
            key = self._next_key
            self._next_key = (self._next_key + 1) % (2**31 - 1)
            self._states[key] = state
        return key

    def remove(self, key: int) -> None:
        self._states.pop(key, None)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(-1)

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        keys = [r.state.logit_processor_kwargs.get(KEY_KWARG, -1) for r in requests_with_new_token]
        return torch.tensor(keys, dtype=torch.int32)

    @torch.no_grad()  # type: ignore[untyped-decorator]
    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows = scores.size(0)
        keys = tensor_arg[:rows].tolist()
        logprobs = torch.log_softmax(scores, dim=-1)
        chosen = torch.argmax(scores, dim=-1)
        for i, key in enumerate(keys):
            state = self._states.get(key)
            if state is None:
                continue  # warm-up rows or a request cancelled mid-step: greedy, nobody reads it
            p = state.params
            if p.do_sample or p.repetition_penalty != 1.0:
                chosen[i] = self._pick(scores[i], state)
            tok = int(chosen[i])
            top = None
            if p.top_n_logprobs > 0:
                values, ids = torch.topk(logprobs[i], p.top_n_logprobs)
                top = list(zip(ids.tolist(), values.tolist(), strict=True))
            state.record(tok, float(logprobs[i, tok]), top)
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(rows), chosen] = 0.0
        return out

    @staticmethod
    def _pick(row: torch.Tensor, state: SamplingState) -> torch.Tensor:
        p = state.params
        row = row.clone()
        seen = state.seen_ids(row.device)
        if seen is not None:
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if not p.do_sample:
            return torch.argmax(row)
        if p.temperature != 1.0:
            row = row / p.temperature
        if 0 < p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_vals, sorted_idx = torch.sort(row, descending=True)
            cum = torch.softmax(sorted_vals, dim=-1).cumsum(dim=-1)
            drop = cum - torch.softmax(sorted_vals, dim=-1) >= p.top_p  # keep the token that crosses top_p
            row = row.scatter(0, sorted_idx, sorted_vals.masked_fill(drop, float("-inf")))
        probs = torch.softmax(row, dim=-1)
        return torch.multinomial(probs, 1, generator=state.generator_on(row.device))[0]


def install(manager: Any, sampler: RequestSampler) -> None:
    """Replace a ContinuousBatchingManager's logits processors by ``sampler`` (before ``start``)."""
    processors = ContinuousBatchingLogitsProcessorList(
        LogitsProcessorList([sampler]), per_request_processors=False, drop_unsupported_processors=False
    )
    processors.tensors_required = 1  # one int32 row per batch: the request keys
    manager.logit_processor = processors
