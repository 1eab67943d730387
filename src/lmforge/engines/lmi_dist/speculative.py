"""Speculative decoding inside LMI-Dist's continuous batch: several tokens a step, the same answer.

How a step is built (transformers 5.19's continuous batching) and where this module steps in:

1. **Schedule.** The scheduler picks the step's requests; a decoding request's
   ``RequestState.tokens_to_process`` is its last generated token, its ``FutureRequestState.query_length``
   is 1, and the cache has been given room for that one token (``can_store_request_tokens``).
   :meth:`Speculator.schedule_batch` wraps the scheduler's: for each decoding request that may
   speculate it asks the proposer for up to k tokens that may follow (n-gram prompt lookup: the last
   n tokens found earlier in the prompt or output, and what followed them there; or a draft model's
   greedy continuation, :mod:`.draft`, whose own per-request cache follows the accepted tokens), asks
   the cache for
   room for them too, and makes them extra query tokens, exactly as a chunk of prefill would be:
   ``tokens_to_process = [last, d1..dk]``, ``query_length = 1 + k``, the step's query-token count
   grows by k and it is no longer a one-token-per-request ("decode fast path") step. Drafts are cut
   to the step's token budget and to the request's ``max_new_tokens`` (the last position's token is
   a free one). Steps with more decoding requests than ``disable_by_batch_size`` and requests whose
   drafts are mostly rejected (a per-request gate with a back-off) do not speculate.
2. **Tensors.** ``prepare_batch_tensors`` lays out positions, KV slots and causal offsets per request
   from ``position_offset`` and ``query_length`` (advancing ``position_offset`` by ``1 + k``) and
   keeps one logits row per request, at its last position. :meth:`Speculator.prepare_batch_tensors`
   then makes the logits indices of the step: ``1 + k`` consecutive rows for a speculating request
   (the target model's next-token scores after ``last``, after ``d1``, ...), one for the others;
   ``get_model_kwargs`` hands them to the forward (``logits_to_keep``) and to the sampler.
3. **Sample.** lmforge's sampler (:mod:`.sampler`) chooses a token for every row, each as if the
   drafts before it had been generated (its penalties, ``min_tokens`` and draw index see them), and
   records the target model's log-prob of each choice.
4. **Verify and roll back.** :meth:`Speculator.update_batch` replaces the batch's update: for a
   speculating request with choices ``c0..ck``, draft ``d(j+1)`` is accepted while it equals ``cj``;
   the tokens emitted are ``c0..ca`` (the accepted drafts, then the target's own next token),
   appended one by one through ``update_and_check_completion`` so EOS and ``max_new_tokens`` end the
   request at the right one. The KV cache holds the keys of ``last, d1..dk``; those of
   ``last, d1..da`` are right and kept, and ``position_offset`` goes back to just after them, so the
   next step writes ``ca`` over the first rejected slot (the blocks stay allocated to the request, to
   be filled as it grows). Prefix-cache hashes are registered only for blocks that the kept
   positions complete. The sampler's records (log-probs, top-n) are cut to the emitted tokens, so the
   frontend receives several tokens with the target's log-probs in one ``Out``, and its
   ``TokenStream`` applies stop strings to them in order.

Greedy requests are the same token for token as without speculation (up to floating-point ties: a
verify pass has other matmul shapes). So are seeded sampled ones: the sampler draws the token at
index t from the request's seed and t alone (:mod:`.sampler`), so verifying a draft means drawing
that token exactly as without speculation and accepting the draft when they agree. For prompt
lookup's and the draft model's proposals (each a point mass on one token d: the draft proposes
greedily) that is the rejection-sampling rule itself: d is
accepted with probability p_target(d), and otherwise the token emitted is distributed as the target
without d, renormalised; the output distribution is the target's because the output is the one
without speculation. Structured output speculates too: its verify rows are chosen one by one, each
under the grammar as it stands after the tokens before it, and the walk stops at the first choice
that is not the draft, so the grammar matcher takes exactly the tokens emitted
(:meth:`.sampler.RequestSampler._verify_chain`). With tensor parallelism every rank installs it
(:mod:`.follower`): the drafts are a pure function of each request's tokens, so all ranks build the
same steps. Models with sliding-window layers run without it (a rejected token could overwrite a
window slot still in use).
"""

from __future__ import annotations

import logging
import threading
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from collections.abc import Callable

    from lmforge.config import ServingConfig
    from lmforge.config.speculative import Speculation
    from lmforge.engines.lmi_dist.draft import DraftModel
    from lmforge.engines.lmi_dist.ipc import SpeculationCounts
    from lmforge.engines.lmi_dist.loading import Built
    from lmforge.engines.lmi_dist.sampler import RequestSampler

PROPOSERS = ("ngram", "draft_model")

log = logging.getLogger("lmforge.engines.lmi_dist")

DEFAULT_DISABLE_BY_BATCH_SIZE = 8
"""Steps with more decoding requests than this do not speculate (``disable_by_batch_size`` unset): a
batch that large is bound by compute, not by reading the weights, on a CPU."""
_GATE_WINDOW = 32
"""Drafted tokens of a request before its acceptance is judged."""
_DRAFT_GATE_WINDOW = 8
"""The same for a draft model, whose proposals cost a forward pass each: judged sooner."""
_GATE_MIN_RATE = 0.25
"""Below this acceptance (over a window) a request stops speculating for a while."""
_GATE_PAUSE = 16
"""Steps a low-acceptance request waits before it tries again (doubling each time, up to 256)."""
_GATE_MAX_PAUSE = 256
_ENGINE_WINDOWS = 4
"""When this many requests' windows in a row (any requests) are judged low, with none judged fine
between them, no request speculates for a while (:data:`_GATE_PAUSE` steps, doubling each time, up to
:data:`_ENGINE_MAX_PAUSE`; a window judged fine ends the back-off): a request's own gate judges it
only after its first window, which a proposer whose drafts are all rejected (an untrained draft
model) would otherwise charge every new request; a crowd where some requests' drafts pay keeps
speculating for them."""
_ENGINE_MAX_PAUSE = 1024


def propose_ngram(tokens: array[int], k: int, low: int, high: int) -> list[int]:
    """Prompt lookup: for n from ``high`` down to ``low``, the last n tokens of ``tokens`` found
    earlier in it (the latest such place), and the up to ``k`` tokens that followed there."""
    size = len(tokens)
    if k <= 0 or size < low + 1:
        return []
    data = tokens.tobytes()
    width = tokens.itemsize
    for n in range(min(high, size - 1), low - 1, -1):
        pattern = data[(size - n) * width :]
        end = (size - 1) * width  # the match must end before the last token: not the suffix itself
        pos = data.rfind(pattern, 0, end)
        while pos > 0 and pos % width:  # a match across token boundaries: look further back
            pos = data.rfind(pattern, 0, pos + len(pattern) - 1)
        if pos >= 0 and pos % width == 0:
            start = pos // width + n
            return tokens[start : start + k].tolist()
    return []


@dataclass
class _Gate:
    """A request's acceptance, to stop speculating where its drafts are mostly wrong."""

    drafted: int = 0
    accepted: int = 0
    pause: int = 0
    next_pause: int = _GATE_PAUSE
    tokens: array[int] = field(default_factory=lambda: array("i"))
    prompt_len: int = -1


@dataclass
class SpeculationStats:
    """Counters since the core started (``/metrics``: ``speculative_*_total``)."""

    proposed: int = 0
    """Draft tokens verified."""
    accepted: int = 0
    """Draft tokens that were the target's own choice."""
    emitted: int = 0
    """Tokens emitted by speculating requests' steps (accepted drafts + the target's next token)."""
    steps: int = 0
    """Request-steps that verified drafts."""
    skipped_batch: int = 0
    """Steps that did not speculate because the batch was larger than disable_by_batch_size."""
    paused: int = 0
    """Steps that did not speculate because the proposer's drafts were mostly rejected lately."""

    def wire(self) -> SpeculationCounts:
        return (self.proposed, self.accepted, self.emitted, self.steps, self.skipped_batch, self.paused)


class Speculator:
    """Speculative decoding for one ContinuousBatchProcessor (see the module's docstring)."""

    def __init__(
        self,
        processor: Any,
        sampler: RequestSampler,
        settings: Speculation,
        draft: Callable[[int], DraftModel] | None = None,
    ) -> None:
        from transformers.generation.continuous_batching.cache_allocators.full_attention import (
            FullAttentionCacheAllocator,
        )

        if settings.method not in PROPOSERS:
            raise LmforgeError(
                f"option.speculative_config: method={settings.method} is not served by lmi-dist; "
                f"use one of {', '.join(PROPOSERS)}"
            )
        if settings.method == "draft_model" and draft is None:
            raise LmforgeError("option.speculative_config: method=draft_model needs its draft model loaded")
        cache = processor.cache
        if not all(isinstance(a, FullAttentionCacheAllocator) for a in cache.cache_allocators.values()):
            raise LmforgeError(
                "option.speculative_config: lmi-dist speculates for models with full attention only "
                "(this model has sliding-window layers)"
            )
        if processor.use_async_batching:
            raise LmforgeError("option.speculative_config: lmi-dist speculates with synchronous batches only")
        self.processor = processor
        self.sampler = sampler
        self.settings = settings
        self.k = settings.num_speculative_tokens
        self.max_batch = settings.disable_by_batch_size or DEFAULT_DISABLE_BY_BATCH_SIZE
        self.stats = SpeculationStats()
        self.draft: DraftModel | None = draft(self.max_batch) if draft is not None else None
        """The draft model (``method: draft_model``), or None: n-gram prompt lookup."""
        self.window = _GATE_WINDOW if self.draft is None else _DRAFT_GATE_WINDOW
        self.pause = 0
        """Steps left in which no request speculates (the proposer's drafts were mostly rejected)."""
        self.next_pause = _GATE_PAUSE
        self.low_verdicts = 0
        """Requests' windows judged low since the last one judged fine (:data:`_ENGINE_WINDOWS`)."""
        self.lock = threading.Lock()
        self.plan: dict[str, list[int]] = {}
        self.gates: dict[str, _Gate] = {}
        self._indices: Any = None
        self._steps = 0
        scheduler, io = processor.scheduler, processor.inputs_and_outputs
        self._schedule = scheduler.schedule_batch
        self._prepare = io.prepare_batch_tensors
        self._kwargs = io.get_model_kwargs
        self._update = processor.update_batch
        scheduler.schedule_batch = self.schedule_batch
        io.prepare_batch_tensors = self.prepare_batch_tensors
        io.get_model_kwargs = self.get_model_kwargs
        processor.update_batch = self.update_batch
        sampler.drafts = self.plan

    # ------------------------------------------------------------------ 1. schedule

    def schedule_batch(self, token_budget: int, cache_budget: int) -> Any:
        from transformers.generation.continuous_batching.requests import RequestStatus

        from lmforge.engines.lmi_dist.sampler import PARAMS_KWARG

        self.plan.clear()
        requests, fast_path, num_q, max_kv = self._schedule(token_budget, cache_budget)
        if not requests:
            return requests, fast_path, num_q, max_kv
        self._steps += 1
        if self._steps % 256 == 0:
            self._prune()
        decoding = [
            fs
            for fs in requests
            if fs.has_new_token
            and fs.query_length == 1
            and fs.state.status == RequestStatus.DECODING
            and fs.state.generated_tokens
        ]
        if not decoding:
            return requests, fast_path, num_q, max_kv
        if len(decoding) > self.max_batch:
            self.stats.skipped_batch += 1
            return requests, fast_path, num_q, max_kv
        if self.pause > 0:
            self.pause -= 1
            self.stats.paused += 1
            return requests, fast_path, num_q, max_kv
        budget = self.processor.max_batch_tokens - num_q
        cache = self.processor.cache
        for fs in decoding:
            if budget <= 0:
                break
            state = fs.state
            params = state.logit_processor_kwargs.get(PARAMS_KWARG)
            if params is None:
                continue
            gate = self.gates.get(state.request_id)
            if gate is None:
                gate = self.gates[state.request_id] = _Gate()
            if gate.pause > 0:
                gate.pause -= 1
                continue
            left = state._new_tokens_limit - len(state.generated_tokens) - 1
            k = min(self.k, left, budget)
            if k <= 0:
                continue
            tokens = self._tokens(gate, state)
            if self.draft is not None:
                if not cache.can_store_request_tokens(state, 1 + k):
                    k = _room(cache, state, k)
                    if k <= 0:
                        continue
                drafts = self.draft.propose(state.request_id, tokens, k)
            else:
                drafts = propose_ngram(
                    tokens, k, self.settings.prompt_lookup_min, self.settings.prompt_lookup_max
                )
            if not drafts or not cache.can_store_request_tokens(state, 1 + len(drafts)):
                continue
            state.tokens_to_process = [*state.tokens_to_process, *drafts]
            fs.query_length = 1 + len(drafts)
            num_q += len(drafts)
            budget -= len(drafts)
            self.plan[state.request_id] = drafts
        if self.plan:
            fast_path = False
        return requests, fast_path, num_q, max_kv

    def _tokens(self, gate: _Gate, state: Any) -> array[int]:
        """The request's prompt and output so far, kept up to date step by step."""
        prompt, generated = state.initial_tokens, state.generated_tokens
        tokens = gate.tokens
        if gate.prompt_len != len(prompt) or len(tokens) > len(prompt) + len(generated):
            tokens = gate.tokens = array("i", prompt)  # first sight, or a soft reset moved the output
            gate.prompt_len = len(prompt)
        done = len(tokens) - len(prompt)
        if done < len(generated):
            tokens.extend(generated[done:])
        return tokens

    def _prune(self) -> None:
        active = self.processor.scheduler.active_requests
        for rid in [rid for rid in self.gates if rid not in active]:
            del self.gates[rid]
        if self.draft is not None:
            self.draft.prune(active)

    # ------------------------------------------------------------------ 2. tensors

    def prepare_batch_tensors(self, requests_in_batch: list[Any], *args: Any, **kwargs: Any) -> None:
        self._prepare(requests_in_batch, *args, **kwargs)
        if not self.plan:
            self._indices = None
            return
        import torch

        io = self.processor.inputs_and_outputs
        indices: list[int] = []
        end = 0
        for fs in requests_in_batch:
            end += fs.query_length
            if fs.has_new_token:
                drafted = len(self.plan.get(fs.state.request_id, ()))
                indices.extend(range(end - 1 - drafted, end))
        self._indices = torch.tensor(indices, dtype=torch.int32, device=io.device)

    def get_model_kwargs(self, *args: Any, **kwargs: Any) -> Any:
        batch = self._kwargs(*args, **kwargs)
        if self._indices is not None:
            batch["logits_indices"] = self._indices
        return batch

    # ------------------------------------------------------------------ 4. verify and roll back

    def update_batch(self) -> None:
        if not self.plan:
            self._update()
            return
        from transformers.generation.continuous_batching.requests import RequestStatus

        from lmforge.engines.lmi_dist.sampler import KEY_KWARG

        processor = self.processor
        io, cache, scheduler = processor.inputs_and_outputs, processor.cache, processor.scheduler
        assert self._indices is not None
        rows: list[int] = io.output_ids[0, : self._indices.numel()].tolist()
        at = 0
        pending = []
        stats = self.stats
        for fs in io.requests_in_batch:
            state = fs.state
            if state.status in (RequestStatus.FINISHED, RequestStatus.PENDING):
                raise RuntimeError(
                    f"Tried to update {state.status.name} request {state.request_id} in sync mode."
                )
            if not fs.has_new_token:
                if state.status == RequestStatus.PREFILLING:
                    cache.mark_complete_blocks(state, fs.complete_blocks)
                continue
            if state.generated_len() == 0:
                state.status = RequestStatus.DECODING
            drafts = self.plan.get(state.request_id)
            if not drafts:
                finished = state.update_and_check_completion(rows[at], None)
                at += 1
                cache.mark_complete_blocks(state, fs.complete_blocks)
            else:
                chosen = rows[at : at + len(drafts) + 1]
                at += len(drafts) + 1
                accepted = 0
                while accepted < len(drafts) and chosen[accepted] == drafts[accepted]:
                    accepted += 1
                kept = accepted + 1  # positions whose keys are right: last, d1..d_accepted
                past = state.position_offset - len(drafts) - 1
                state.position_offset = past + kept
                before = state.generated_len()
                finished = False
                for token in chosen[:kept]:
                    finished = state.update_and_check_completion(token, None)
                    if finished:
                        break
                emitted = state.generated_len() - before
                self._trim_record(state.logit_processor_kwargs.get(KEY_KWARG), len(drafts) + 1, emitted)
                if cache.use_prefix_sharing:
                    cache.mark_complete_blocks(state, self._complete_blocks(past, kept))
                stats.proposed += len(drafts)
                stats.accepted += accepted
                stats.emitted += emitted
                stats.steps += 1
                self._judge(state.request_id, len(drafts), accepted)
            if finished:
                scheduler.finish_request(state.request_id)
                scheduler.block_new_requests = False
                self.gates.pop(state.request_id, None)
                if self.draft is not None:
                    self.draft.forget(state.request_id)
            if state.streaming or state.status == RequestStatus.FINISHED:
                pending.append(state.to_generation_output())
        if pending:
            processor.output_router.deliver_batch(pending)

    def _complete_blocks(self, past: int, kept: int) -> dict[str, int]:
        out = {}
        for name, allocator in self.processor.cache.cache_allocators.items():
            page = allocator.tokens_per_page
            complete = (past % page + kept) // page
            if complete:
                out[name] = complete
        return out

    def _trim_record(self, key: int | None, rows: int, emitted: int) -> None:
        """The sampler recorded a log-prob (and top-n) for each of the ``rows`` positions: keep the
        emitted tokens' only."""
        record = self.sampler._records.get(key) if key is not None else None
        if record is None:
            return
        if rows > emitted:
            del record.logprobs[len(record.logprobs) - rows + emitted :]
            if record.top_logprobs:  # top-n requests: one list per row too
                del record.top_logprobs[len(record.top_logprobs) - rows + emitted :]

    def _judge(self, rid: str, drafted: int, accepted: int) -> None:
        gate = self.gates.get(rid)
        if gate is None:
            return
        low = judge(gate, drafted, accepted, self.window, _GATE_MAX_PAUSE)
        if low is None:
            return
        if not low:  # a request whose drafts pay: the proposer is worth trying on every request
            self.low_verdicts = 0
            self.next_pause = _GATE_PAUSE
            return
        self.low_verdicts += 1
        if self.low_verdicts >= _ENGINE_WINDOWS:
            self.low_verdicts = 0
            self.pause = self.next_pause
            self.next_pause = min(2 * self.next_pause, _ENGINE_MAX_PAUSE)
            log.info(
                "lmi-dist: speculation paused for %d steps: the %s proposer's drafts were mostly rejected "
                "in the last %d windows judged",
                self.pause,
                self.settings.method,
                _ENGINE_WINDOWS,
            )


def judge(gate: _Gate, drafted: int, accepted: int, window: int, cap: int) -> bool | None:
    """Count a step's drafts into ``gate``; once ``window`` are counted, pause it when fewer than
    :data:`_GATE_MIN_RATE` of them were accepted (:data:`_GATE_PAUSE` steps, doubling while it stays
    low, up to ``cap``) and start a new window. Returns the verdict: True (low: paused now), False
    (fine), None (the window is not full yet)."""
    gate.drafted += drafted
    gate.accepted += accepted
    if gate.drafted < window:
        return None
    low = gate.accepted < _GATE_MIN_RATE * gate.drafted
    if low:
        gate.pause = gate.next_pause
        gate.next_pause = min(2 * gate.next_pause, cap)
    else:
        gate.next_pause = _GATE_PAUSE
    gate.drafted = gate.accepted = 0
    return low


def _room(cache: Any, state: Any, k: int) -> int:
    """The most drafts (up to ``k``) the cache has room for after the request's next token."""
    while k > 0 and not cache.can_store_request_tokens(state, 1 + k):
        k -= 1
    return k


def install(built: Built, config: ServingConfig) -> Speculator | None:
    """Speculate in ``built``'s batch processor (made, not started) as ``config.speculation`` says
    (loading its draft model, for ``method: draft_model``); None when off."""
    settings = config.speculation
    if settings is None:
        return None
    draft = None
    if settings.method == "draft_model":
        from lmforge.engines.lmi_dist.draft import DraftModel

        folder = settings.model
        assert folder is not None

        def draft(slots: int) -> DraftModel:
            return DraftModel(config, folder, built.model, built.tokenizer, slots)

    speculator = Speculator(built.manager.batch_processor, built.sampler, settings, draft)
    log.info(
        "lmi-dist: speculative decoding on: %s, up to %d tokens a step, %s, off above %d decoding requests",
        settings.method,
        speculator.k,
        f"draft model {settings.model}"
        if settings.method == "draft_model"
        else f"prompt lookup {settings.prompt_lookup_min}-{settings.prompt_lookup_max}",
        speculator.max_batch,
    )
    return speculator
