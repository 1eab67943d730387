"""LMI-Dist engine: continuous batching on transformers' paged-attention manager.

What lmforge adds on top of ``model.init_continuous_batching`` (transformers 5.19):

* explicit KV-cache sizing (:mod:`.sizing`) instead of "60 % of RAM" (startup: :mod:`.loading`);
* admission: prompt + ``max_new_tokens`` is checked against ``max_model_len`` (which the cache can
  always hold) before the request reaches the manager, whose loop dies on a request it cannot fit;
* at most ``max_rolling_batch_size`` sequences in the running batch, the rest wait in order;
* per-request sampling, seeds, repetition penalty and true log-probs (:mod:`.sampler`);
* incremental detokenization and stop sequences (:mod:`.events`, :mod:`lmforge.engines.text`);
* per-request attention instead of one dense attention over all histories (:mod:`.attention`);
* a final event for cancelled requests (the manager sends none) and a supervisor that ends every
  in-flight stream with an error and reports unhealthy if the generation thread or a rank dies;
* tensor parallelism with one process per rank (:mod:`.distributed`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any

from lmforge.engines.base import EngineBase
from lmforge.engines.limits import check_request_size
from lmforge.engines.lmi_dist.events import Live, output_events, terminal_event
from lmforge.engines.lmi_dist.loading import build
from lmforge.engines.protocol import GenerationEvent, GenerationRequest, Token
from lmforge.errors import BadRequestError, EngineDeadError, NotReadyError

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter
    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist.distributed import FollowerGroup
    from lmforge.engines.lmi_dist.lora import LoraRuntime
    from lmforge.engines.lmi_dist.sampler import RequestSampler
    from lmforge.engines.lmi_dist.sizing import KvCachePlan

log = logging.getLogger("lmforge.engines.lmi_dist")

_SUPERVISE_EVERY_S = 0.25


class LmiDistEngine(EngineBase):
    name = "lmi-dist"

    def __init__(self, config: ServingConfig, extra_options: Mapping[str, str] | None = None) -> None:
        super().__init__(config, extra_options)  # LMI-Dist takes no extra options; the config warned
        self._model: Any = None
        self._manager: Any = None
        self._sampler: RequestSampler | None = None
        self.plan: KvCachePlan | None = None
        self.max_model_len = 0
        self._eos_ids: list[int] = []
        self._lora: LoraRuntime | None = None
        self._slots: asyncio.Semaphore | None = None
        self._live: dict[str, Live] = {}
        self._submissions = 0
        self._followers: FollowerGroup | None = None
        self._dead: str | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False
        self._counters["waiting"] = 0.0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        started = time.monotonic()
        await asyncio.to_thread(self._load)
        self.load_seconds = time.monotonic() - started
        self._slots = asyncio.Semaphore(self.config.max_rolling_batch_size)
        self._supervisor = asyncio.create_task(self._supervise(), name="lmi-dist-supervisor")

    def _load(self) -> None:
        from lmforge.engines.lmi_dist.distributed import FollowerGroup, tensor_parallel_size

        world = tensor_parallel_size(self.config)
        if world > 1:
            self._followers = FollowerGroup(self.config, world)
        try:
            built = build(self.config)
        except BaseException:
            if self._followers is not None:
                for proc in self._followers.procs:
                    proc.kill()
            raise
        self._tokenizer = built.tokenizer
        self._model = built.model
        self._manager = built.manager
        self._sampler = built.sampler
        self.plan = built.plan
        self.max_model_len = built.max_model_len
        self._eos_ids = built.eos_ids
        self._lora = built.lora

    async def shutdown(self) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        for live in list(self._live.values()):
            live.dead_error = "the server is shutting down"
            live.wake.set()
        if self._manager is not None:
            manager, self._manager = self._manager, None
            # the streams were told above; a flush would finish (or wait out) their generation first
            await asyncio.to_thread(manager.stop, block=True, timeout=10, hard_stop=True)
        if self._followers is not None:
            await asyncio.to_thread(self._followers.stop)

    # ------------------------------------------------------------------ health

    def check_health(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"lmi-dist engine is dead: {self._dead}")
        if self._manager is None:
            raise NotReadyError("lmi-dist engine is not running")

    def _loop_failure(self) -> str | None:
        manager = self._manager
        if manager is None:
            return None
        # A dead rank also breaks the loop's collectives; name the rank, the cause, first.
        if self._followers is not None and (failure := self._followers.failure()) is not None:
            return failure
        fatal = manager.background_thread_status.fatal_error
        if fatal is not None:
            return f"{type(fatal).__name__}: {fatal}"
        if not manager.is_running():
            return "the generation thread exited"
        return None

    async def _supervise(self) -> None:
        while self._dead is None and not self._stopping:
            await asyncio.sleep(_SUPERVISE_EVERY_S)
            failure = self._loop_failure()
            if failure is not None and not self._stopping:
                self._dead = failure
                log.error("lmi-dist generation loop died: %s; failing %d requests", failure, len(self._live))
                for live in list(self._live.values()):
                    live.dead_error = f"engine failure: {failure}"
                    live.wake.set()

    def stats(self) -> dict[str, float]:
        running = len(self._live) - self._counters["waiting"]
        out = {"running": float(running), **self._counters, "healthy": float(self._dead is None)}
        if self._lora is not None:
            out.update(self._lora.stats())
        return out

    # ------------------------------------------------------------------ LoRA adapters

    def _lora_runtime(self) -> LoraRuntime:
        if self._lora is None:
            raise BadRequestError(
                "LoRA adapters are not enabled; set option.enable_lora=true", param="adapters"
            )
        return self._lora

    def lora_layers(self) -> dict[str, tuple[int, int]]:
        return self._lora_runtime().layers()

    async def add_adapter(self, adapter: LoraAdapter) -> None:
        options = adapter.options
        await self._lora_runtime().add(
            adapter, preload=bool(options.get("preload", True)), pin=bool(options.get("pin", False))
        )

    async def remove_adapter(self, adapter: LoraAdapter) -> None:
        self._lora_runtime().remove(adapter)

    # ------------------------------------------------------------------ requests

    def _tokenize(self, request: GenerationRequest) -> list[int]:
        if isinstance(request.prompt, list):
            return list(request.prompt)
        ids: list[int] = self._tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        return ids

    def _validate(self, prompt_len: int, max_new: int) -> None:
        check_request_size(self.config, prompt_len, max_new, self.max_model_len)

    async def _score_prompt(self, ids: list[int], top_n: int | None) -> list[Token] | None:
        """The prompt's log-probs when asked (:mod:`.prompt_scores`), computed off the event loop."""
        if top_n is None:
            return None
        if self._lora is not None or self._followers is not None:
            raise BadRequestError(
                "echo with logprobs (the prompt's log-probs) is not available on lmi-dist with "
                "option.enable_lora=true or tensor parallelism; use option.rolling_batch=vllm",
                param="echo",
            )
        from lmforge.engines.lmi_dist.prompt_scores import score_prompt

        return await asyncio.to_thread(score_prompt, self._model, self._tokenizer, ids, top_n)

    async def abort(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is not None and live.dead_error is None:
            live.dead_error = "aborted"
            live.wake.set()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.check_health()
        assert self._slots is not None and self._sampler is not None
        from lmforge.engines.lmi_dist.sampler import LORA_KWARG, request_kwargs

        params = request.params
        if params.do_sample and params.seed is None:
            # every sampled request gets its own seed: reproducible draws, equal on all TP ranks
            params = dataclasses.replace(params, seed=random.getrandbits(62))
        prompt_ids = self._tokenize(request)
        self._validate(len(prompt_ids), params.max_new_tokens)
        scored = await self._score_prompt(prompt_ids, params.prompt_logprobs)
        if params.structured is not None:  # compiled off the event loop, before the step needs it
            sampler, constraint = self._sampler, params.structured
            await asyncio.to_thread(lambda: sampler.grammars.compile(constraint))
        rid = request.request_id
        if rid in self._live:
            raise BadRequestError(f"request id {rid!r} is already in flight", param="request_id")
        adapter = request.adapter
        lora = self._lora_runtime() if adapter is not None else None
        live = Live()
        self._live[rid] = live
        # The manager's id is unique per submission: a late cancel of an earlier request must never
        # hit a newer one that reuses the caller's id.
        self._submissions += 1
        cb_rid = f"{rid}#{self._submissions}"
        self._counters["requests_total"] += 1
        self._counters["waiting"] += 1
        waiting = True
        submitted = False
        finished = False
        key = -1
        adapter_held = False
        try:
            if lora is not None and adapter is not None:
                await lora.acquire(adapter)  # waits for a free adapter slot (option.max_loras)
                adapter_held = True
            await self._slots.acquire()
            self._counters["waiting"] -= 1
            waiting = False
            if live.dead_error is not None:  # aborted while waiting for a slot
                finished = True
                yield terminal_event(live.dead_error, len(prompt_ids), 0)
                return
            self.check_health()
            key, record = self._sampler.register()
            manager = self._manager
            manager.register_result_handler(cb_rid, live.push)
            ends = [*([] if params.ignore_eos else self._eos_ids), *params.stop_token_ids]
            eos = ends or -1
            kwargs = request_kwargs(key, params)
            if adapter is not None:
                kwargs[LORA_KWARG] = adapter.int_id
            await asyncio.to_thread(
                manager.add_request,
                prompt_ids,
                request_id=cb_rid,
                max_new_tokens=params.max_new_tokens,
                streaming=True,
                eos_token_id=eos,
                **kwargs,
            )
            submitted = True
            events = output_events(
                live,
                params,
                record,
                len(prompt_ids),
                tokenizer=self._tokenizer,
                eos_ids=self._eos_ids,
                counters=self._counters,
                loop_failure=self._loop_failure,
            )
            async for event in events:
                if event.finished:
                    finished = True
                if scored is not None:  # the first event carries the prompt's log-probs
                    event.prompt_logprobs, scored = scored, None
                yield event
        finally:
            if waiting:
                self._counters["waiting"] -= 1
            else:
                self._slots.release()
            if submitted and not finished:
                self._counters["aborted_total"] += 1
            if submitted and self._manager is not None:
                if not live.engine_done:  # stopped early (stop string, abort, disconnect)
                    self._manager.cancel_request(cb_rid)
                with self._manager.output_router._lock:
                    self._manager.output_router.result_handlers.pop(cb_rid, None)
            if key >= 0:
                self._sampler.remove(key)
            if adapter_held and lora is not None and adapter is not None:
                lora.release(adapter)
            self._live.pop(rid, None)
