"""LMI-Dist engine: continuous batching on transformers' paged-attention manager, in an engine core
process of its own (the shape vLLM's V1 engine proved).

This class is the frontend, in the server process: it checks sizes, admits requests, turns
the core's token ids into text and stop strings (:class:`lmforge.engines.streaming.TokenStream`, as
for every engine), and keeps adapter slots. The engine core (:mod:`.core`, reached through
:class:`.client.CoreProcess`) owns the model, transformers' ``ContinuousBatchingManager`` and
lmforge's per-request sampler; the two share no interpreter lock and exchange token ids only.

What lmforge adds on top of ``model.init_continuous_batching`` (transformers 5.19):

* explicit KV-cache sizing (:mod:`.sizing`) instead of "60 % of RAM" (startup: :mod:`.loading`);
* admission: prompt + ``max_new_tokens`` is checked against ``max_model_len`` (which the cache can
  always hold) before the request reaches the manager, whose loop dies on a request it cannot fit;
* at most ``max_rolling_batch_size`` sequences in the running batch, the rest wait in order;
* per-request sampling, seeds, penalties, grammars and true log-probs (:mod:`.sampler`);
* per-request attention instead of one dense attention over all histories (:mod:`.attention`);
* per-request LoRA adapters in one batch (:mod:`.lora`, slots in :mod:`.lora_slots`);
* cancellation: a stream closed early (a client that went away) cancels its request in the core;
* supervision: when the core's generation loop or a tensor-parallel rank fails, or the core process
  dies, every in-flight stream ends with an error and the engine reports unhealthy;
* tensor parallelism with one process per rank (:mod:`.distributed`), the core being rank 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.base import EngineBase
from lmforge.engines.lmi_dist import ipc
from lmforge.engines.lmi_dist.client import CoreProcess
from lmforge.engines.lmi_dist.lora_slots import LoraSlots
from lmforge.engines.protocol import (
    EngineStats,
    FieldError,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    RequestField,
    SamplingParams,
    Token,
)
from lmforge.engines.streaming import TokenStream
from lmforge.errors import ERROR_TABLE, BadRequestError, EngineDeadError, NotReadyError

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter
    from lmforge.config import ServingConfig

log = logging.getLogger("lmforge.engines.lmi_dist")


@dataclass
class _Live:
    """One in-flight request, on the event loop."""

    outputs: deque[ipc.Out] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    dead_error: str | None = None
    """Why the engine can no longer serve it (shutdown, a dead core): the stream ends with this error."""
    engine_done: bool = False
    """The core sent its last output for this request (finished, failed or refused)."""


class LmiDistEngine(EngineBase):
    name = "lmi-dist"

    def __init__(self, config: ServingConfig, extra_options: Mapping[str, str] | None = None) -> None:
        super().__init__(config, extra_options)  # LMI-Dist takes no extra options; the config warned
        self._core: CoreProcess | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._lora: LoraSlots | None = None
        self._lora_layers: dict[str, tuple[int, int]] = {}
        self._slots: asyncio.Semaphore | None = None
        self._live: dict[str, _Live] = {}
        self._submissions = 0
        self._waiting = 0
        """Requests admitted and waiting for a batch slot (or an adapter slot)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        started = time.monotonic()
        core = CoreProcess(self.config, self._on_outputs, self._on_death)
        self._core = core
        # the tokenizer loads here while the core loads the model
        tokenizer = asyncio.create_task(asyncio.to_thread(self._load_tokenizer))
        try:
            ready = await core.start()
        finally:
            await tokenizer
        self.max_model_len = ready.max_model_len
        self._eos_ids = frozenset(ready.eos_ids)
        self._lora_layers = ready.lora_layers
        if self.config.enable_lora:
            self._lora = LoraSlots(_Installer(core), self.config.max_loras)
        self._slots = asyncio.Semaphore(self.config.max_rolling_batch_size)
        self.load_seconds = time.monotonic() - started

    def _load_tokenizer(self) -> None:
        from lmforge.engines.text import load_tokenizer

        kwargs: dict[str, Any] = {"trust_remote_code": self.config.trust_remote_code}
        if self.config.revision:
            kwargs["revision"] = self.config.revision
        self._tokenizer = load_tokenizer(str(self.config.model_path), **kwargs)

    async def shutdown(self) -> None:
        self._end_all("the server is shutting down")
        if self._core is not None:
            await self._core.close()

    # ------------------------------------------------------------------ the core's news

    def _on_outputs(self, items: list[ipc.Out]) -> None:
        for out in items:
            live = self._live.get(out.rid)
            if live is not None:
                live.outputs.append(out)
                live.wake.set()

    def _on_death(self, reason: str) -> None:
        log.error("lmi-dist engine failed: %s; failing %d requests", reason, len(self._live))
        self._end_all(f"engine failure: {reason}")

    def _end_all(self, reason: str) -> None:
        for live in list(self._live.values()):
            live.dead_error = reason
            live.wake.set()

    # ------------------------------------------------------------------ health

    def check_health(self) -> None:
        core = self._core
        if core is not None and core.dead is not None:
            raise EngineDeadError(f"lmi-dist engine is dead: {core.dead}")
        if core is None or core.ready is None:
            raise NotReadyError("lmi-dist engine is not running")

    def stats(self) -> EngineStats:
        extra = self._lora.stats() if self._lora is not None else {}
        if self.config.speculation is not None:
            extra = {
                **extra,
                **speculation_metrics(
                    self._core.speculation if self._core else None, self.config.speculation.method
                ),
            }
        return self._stats(
            len(self._live) - self._waiting,
            waiting=self._waiting,
            healthy=self._core is not None and self._core.dead is None,
            extra=extra or None,
        )

    # ------------------------------------------------------------------ LoRA adapters

    def _slots_or_refuse(self) -> LoraSlots:
        if self._lora is None:
            raise BadRequestError(
                "LoRA adapters are not enabled; set option.enable_lora=true", param="adapters"
            )
        return self._lora

    @property
    def adapter_slots(self) -> LoraSlots | None:
        """The LoRA slots (which adapters are resident), or None when LoRA is off."""
        return self._lora

    def lora_layers(self) -> dict[str, tuple[int, int]]:
        self._slots_or_refuse()
        return dict(self._lora_layers)

    async def add_adapter(self, adapter: LoraAdapter) -> None:
        options = adapter.options
        await self._slots_or_refuse().add(
            adapter, preload=bool(options.get("preload", True)), pin=bool(options.get("pin", False))
        )

    async def remove_adapter(self, adapter: LoraAdapter) -> None:
        await self._slots_or_refuse().remove(adapter)

    async def start_profile(self) -> None:
        """Start the PyTorch profiler in the engine core (:mod:`.profiling`)."""
        assert self._core is not None
        await self._core.call(ipc.Method.PROFILE_START)

    async def stop_profile(self, path: str | Path) -> dict[str, Any]:
        """Stop it, write its operator tables to ``path`` and return its summary (wall time, device-busy
        time, kernel launches, ...)."""
        assert self._core is not None
        summary: dict[str, Any] = await self._core.call(ipc.Method.PROFILE_STOP, path=str(path))
        return summary

    # ------------------------------------------------------------------ requests

    async def _score_prompt(
        self, ids: list[int], top_n: int | None, adapter: LoraAdapter | None
    ) -> list[Token] | None:
        """The prompt's log-probs when asked (:mod:`.prompt_scores`, computed by the engine core, with
        ``adapter`` applied: the caller holds its slot)."""
        if top_n is None:
            return None
        assert self._core is not None and self._core.ready is not None
        if self._core.ready.world > 1:
            raise FieldError(
                RequestField.PROMPT_TOP_N,
                "the prompt's log-probs (",
                RequestField.PROMPT_TOP_N,
                " with logprobs) are not available on lmi-dist with tensor parallelism; use "
                "option.rolling_batch=vllm",
            )
        scored = await self._core.call(
            ipc.Method.SCORE_PROMPT,
            ids=ids,
            top_n=top_n,
            adapter=adapter.int_id if adapter is not None else 0,
        )
        return [
            Token(tid, "", lp, top_logprobs=[(t, v) for t, v in top] if i else None)
            for i, (tid, lp, top) in enumerate(scored)
        ]

    async def _generate(
        self, request: GenerationRequest, params: SamplingParams
    ) -> AsyncGenerator[GenerationEvent, None]:
        prompt_ids = request.prompt
        assert self._slots is not None and self._core is not None
        adapter = request.adapter
        lora = self._slots_or_refuse() if adapter is not None else None
        # The core's id is unique per submission: a late cancel of an earlier request must never hit
        # a newer one that reuses the caller's id.
        self._submissions += 1
        rid = f"{request.request_id}#{self._submissions}"
        live = _Live()
        self._live[rid] = live
        stream = TokenStream(self._tokenizer, params.stop, len(prompt_ids), frozenset(params.stop_token_ids))
        self._waiting += 1
        waiting, submitted, adapter_held = True, False, False
        try:
            if lora is not None and adapter is not None:
                await lora.acquire(adapter)  # waits for a free adapter slot (option.max_loras)
                adapter_held = True
            scored = await self._score_prompt(prompt_ids, params.prompt_top_n, adapter)
            await self._slots.acquire()
            self._waiting -= 1
            waiting = False
            if live.dead_error is None:
                self.check_health()
                sampling = ipc.Sampling.of(params)
                self._core.send(ipc.Add(rid, prompt_ids, sampling, adapter.int_id if adapter else 0))
                submitted = True
            while True:
                if not live.outputs:
                    if live.dead_error is not None:
                        status = ERROR_TABLE["engine_dead"].status
                        for event in stream.end(FinishReason.ERROR, live.dead_error, status):
                            yield event
                        return
                    live.wake.clear()
                    await live.wake.wait()
                    continue
                out = live.outputs.popleft()
                if out.status == ipc.FAILED and live.dead_error is not None:
                    # the core failed it because the engine is stopping (or dying) after the frontend
                    # ended its requests: the stream ends with the reason they were given
                    live.engine_done = True
                    continue
                if out.status == ipc.REJECTED:
                    live.engine_done = True
                    raise _refusal(out)
                live.engine_done = out.status != ipc.RUNNING
                tokens = self._tokens(out, params.top_n)
                for event in stream.step(tokens, self._done(out, params), out.error or ""):
                    if scored is not None:  # the first event carries the prompt's log-probs
                        event.prompt_logprobs, scored = scored, None
                    yield event
                if stream.finished:
                    return
        finally:
            if waiting:
                self._waiting -= 1
            else:
                self._slots.release()
            if submitted and not live.engine_done:  # stopped early (a stop string, a closed stream)
                self._core.send(ipc.Cancel(rid))
            if adapter_held and lora is not None and adapter is not None:
                lora.release(adapter)
            self._live.pop(rid, None)

    def _tokens(self, out: ipc.Out, top_n: int) -> list[Token]:
        tokens = []
        for i, tid in enumerate(out.tokens):
            top = None
            if top_n > 0 and out.top_logprobs is not None and i < len(out.top_logprobs):
                top = [(t, lp) for t, lp in out.top_logprobs[i]]
            tokens.append(Token(tid, "", out.logprobs[i], special=tid in self._eos_ids, top_logprobs=top))
        return tokens

    def _done(self, out: ipc.Out, params: Any) -> FinishReason | None:
        if out.status == ipc.RUNNING:
            return None
        if out.status == ipc.FAILED:
            return FinishReason.ERROR
        last = out.tokens[-1] if out.tokens else None
        if last in params.stop_token_ids or (last in self._eos_ids and not params.ignore_eos):
            return FinishReason.EOS
        return FinishReason.LENGTH


def _refusal(out: ipc.Out) -> BadRequestError:
    """The core's refusal of a request (a grammar that cannot compile, ...). Its field comes back as
    its neutral id; its text as the core wrote it (fields named in a core's message keep their ids)."""
    text = out.error or "the request was refused"
    try:
        return FieldError(RequestField(out.param or ""), text)
    except ValueError:  # not a request field
        return BadRequestError(text, param=out.param)


class _Installer:
    """LoRA slot changes, as calls into the engine core."""

    def __init__(self, core: CoreProcess) -> None:
        self.core = core

    async def install(self, adapter: LoraAdapter) -> None:
        await self.core.call(ipc.Method.INSTALL, adapter=ipc.AdapterRef.of(adapter).to_wire())

    async def preload(self, adapter: LoraAdapter) -> None:
        await self.core.call(ipc.Method.PRELOAD, adapter=ipc.AdapterRef.of(adapter).to_wire())

    async def uninstall(self, adapter_id: int) -> None:
        await self.core.call(ipc.Method.UNINSTALL, adapter_id=adapter_id)

    async def forget(self, adapter_id: int) -> None:
        await self.core.call(ipc.Method.FORGET, adapter_id=adapter_id)


def speculation_metrics(counts: ipc.SpeculationCounts | None, proposer: str) -> dict[str, float]:
    """``/metrics`` of speculative decoding: draft tokens proposed and accepted, tokens emitted by
    speculating steps, request-steps that speculated, steps too large to, and the mean tokens a
    speculating step emitted per request (accepted drafts + 1), and steps paused because the
    proposer's drafts were mostly rejected lately: the engine's (``speculative_*``) and
    the same per proposer (``speculative_proposer_*{proposer="ngram"|"draft_model"}``; an engine has
    one, so its series equal the engine's: a family of their own, never summed twice)."""
    proposed, accepted, emitted, steps, skipped, paused = counts or (0, 0, 0, 0, 0, 0)
    values = {
        "proposed_tokens_total": float(proposed),
        "accepted_tokens_total": float(accepted),
        "emitted_tokens_total": float(emitted),
        "steps_total": float(steps),
        "mean_accepted_length": emitted / steps if steps else 0.0,
    }
    label = f'{{proposer="{proposer}"}}'
    return {
        **{f"speculative_{key}": value for key, value in values.items()},
        "speculative_skipped_batch_steps_total": float(skipped),
        "speculative_paused_steps_total": float(paused),
        **{f"speculative_proposer_{key}{label}": value for key, value in values.items()},
    }
