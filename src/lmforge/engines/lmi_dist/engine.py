"""LMI-Dist engine: continuous batching on transformers' paged-attention manager.

What lmforge adds on top of ``model.init_continuous_batching`` (transformers 5.19):

* explicit KV-cache sizing (:mod:`.sizing`) instead of "60 % of RAM";
* admission: prompt + ``max_new_tokens`` is checked against ``max_model_len`` (which the cache can
  always hold) before the request reaches the manager, whose loop dies on a request it cannot fit;
* at most ``max_rolling_batch_size`` sequences in the running batch, the rest wait in order;
* per-request sampling, seeds, repetition penalty and true log-probs (:mod:`.sampler`);
* incremental detokenization and stop sequences (:mod:`lmforge.engines.text`);
* per-request attention instead of one dense attention over all histories (:mod:`.attention`);
* a final event for cancelled requests (the manager sends none) and a supervisor that ends every
  in-flight stream with an error and reports unhealthy if the generation thread or a rank dies;
* tensor parallelism with one process per rank (:mod:`.distributed`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lmforge.engines.base import EngineBase
from lmforge.engines.limits import check_request_size
from lmforge.engines.protocol import FinishReason, GenerationEvent, GenerationRequest, SamplingParams, Token
from lmforge.engines.text import IncrementalDetokenizer, StopMatcher
from lmforge.errors import ERROR_TABLE, BadRequestError, EngineDeadError, LmforgeError, NotReadyError

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter
    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist.distributed import FollowerGroup
    from lmforge.engines.lmi_dist.lora import LoraRuntime
    from lmforge.engines.lmi_dist.sampler import Record, RequestSampler
    from lmforge.engines.lmi_dist.sizing import KvCachePlan

log = logging.getLogger("lmforge.engines.lmi_dist")

_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_SUPERVISE_EVERY_S = 0.25


@dataclass
class _Live:
    """Bookkeeping of one in-flight request on the event-loop side."""

    outputs: deque[Any] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    dead_error: str | None = None
    engine_done: bool = False
    """The manager delivered its last output for this request (finished or failed)."""

    def push(self, output: Any) -> None:
        self.outputs.append(output)
        self.wake.set()


@dataclass
class Built:
    tokenizer: Any
    model: Any
    manager: Any
    sampler: RequestSampler
    plan: KvCachePlan
    max_model_len: int
    eos_ids: list[int]
    lora: LoraRuntime | None = None


def build(cfg: ServingConfig) -> Built:
    """Load tokenizer and model, size the KV cache and start the continuous-batching loop.

    Runs on every tensor-parallel rank (``RANK``/``WORLD_SIZE`` in the environment), which must all
    make the same calls in the same order: the cache sizing and the loop talk to each other.
    """
    phases: dict[str, float] = {}  # startup phase -> seconds, logged in one line (bench/cold_start.py)
    clock = [time.monotonic()]

    def mark(phase: str) -> None:
        phases[phase], clock[0] = time.monotonic() - clock[0], time.monotonic()

    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        ContinuousBatchingConfig,
        DistributedConfig,
        GenerationConfig,
    )
    from transformers.generation.continuous_batching.model_runner import infer_max_single_request_tokens

    from lmforge.engines.lmi_dist import attention
    from lmforge.engines.lmi_dist import sampler as sampler_mod
    from lmforge.engines.lmi_dist.distributed import tensor_parallel_size
    from lmforge.engines.lmi_dist.sizing import kv_bytes_per_token, plan_kv_cache

    mark("import")
    world = tensor_parallel_size(cfg)
    if cfg.enable_lora and world > 1:
        raise LmforgeError(
            "lmi-dist serves LoRA adapters on one device only: option.enable_lora=true needs "
            f"option.tensor_parallel_degree=1 (got {world}); use option.rolling_batch=vllm for both"
        )
    if cfg.pipeline_parallel_degree != 1:
        raise LmforgeError(
            f"lmi-dist supports tensor parallelism only: option.pipeline_parallel_degree="
            f"{cfg.pipeline_parallel_degree} must be 1"
        )
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    path = cfg.model_path
    if path is None:
        raise LmforgeError(
            f"option.model_id={cfg.model_id!r} is not a local folder; lmi-dist loads local models only "
            "(download it first, or point option.model_id at the folder)"
        )
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if cfg.revision:
        kwargs["revision"] = cfg.revision
    tokenizer = AutoTokenizer.from_pretrained(str(path), **kwargs)
    mark("tokenizer")
    if world > 1:
        kwargs["distributed_config"] = DistributedConfig(tp_plan="auto")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_DTYPES.get(cfg.dtype, "auto"), **kwargs)
    if world == 1 and torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    mark("weights")

    text_cfg = model.config.get_text_config()
    model_max = int(getattr(text_cfg, "max_position_embeddings", 0) or 0) or 2048
    max_model_len = min(cfg.max_model_len or model_max, model_max)
    if cfg.max_model_len and cfg.max_model_len > model_max:
        log.warning(
            "option.max_model_len=%d exceeds the model's max_position_embeddings=%d; using %d",
            cfg.max_model_len,
            model_max,
            model_max,
        )
    heads = text_cfg.num_attention_heads
    head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // heads
    kv_heads = getattr(text_cfg, "num_key_value_heads", None) or heads
    plan = plan_kv_cache(
        bytes_per_token=kv_bytes_per_token(
            num_layers=text_cfg.num_hidden_layers,
            num_kv_heads=max(1, kv_heads // world),
            head_dim=head_dim,
            dtype_bytes=torch.finfo(model.dtype).bits // 8,
        ),
        max_model_len=max_model_len,
        max_batch_size=cfg.max_rolling_batch_size,
        prefill_tokens=cfg.max_rolling_batch_prefill_tokens,
        memory_budget_bytes=cfg.kv_cache_memory_mb * 2**20 if cfg.kv_cache_memory_mb else None,
    )
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    gen_config = GenerationConfig(
        do_sample=False,
        eos_token_id=eos_ids or None,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=cfg.default_max_new_tokens,
    )
    cb_config = ContinuousBatchingConfig(
        page_size=plan.page_size,
        num_blocks=plan.num_blocks,
        max_batch_tokens=plan.max_batch_tokens,
        return_logprobs=False,
        # Shared prefix blocks hold K/V computed with one adapter; with LoRA they must not be shared.
        allow_block_sharing=not cfg.enable_lora,
        # Our sampler runs Python per row: no graph capture, no overlapped (async) batches.
        use_cuda_graph=False,
        use_async_batching=False,
    )
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)
    attention.install()
    manager = model.init_continuous_batching(
        generation_config=gen_config, continuous_batching_config=cb_config
    )
    sampler = sampler_mod.RequestSampler()
    lora = None
    if cfg.enable_lora:
        from lmforge.engines.lmi_dist.lora import LoraRuntime

        lora = LoraRuntime(model, cfg.max_loras, cfg.max_cpu_loras or cfg.max_loras)
    sampler_mod.install(manager, sampler, lora.on_batch if lora is not None else None)
    mark("batching_init")
    if manager.batch_processor is None:  # what warmup() does first: allocate the paged KV cache
        manager.batch_processor = manager._create_batch_processor()
    mark("kv_cache")
    manager.warmup()  # builds the cache now, so its real capacity is known before serving
    mark("warmup")
    capacity = infer_max_single_request_tokens(manager.batch_processor.cache)
    if capacity < max_model_len:
        log.warning("KV cache fits %d tokens per sequence; max_model_len lowered to it", capacity)
        max_model_len = capacity
    manager.start()
    mark("start")
    log.info("lmi-dist startup phases (s): %s", " ".join(f"{k}={v:.3f}" for k, v in phases.items()))
    log.info(
        "lmi-dist ready: %s, dtype=%s, tensor parallel %d, max_model_len=%d, KV cache %d blocks x %d tokens "
        "(%.1f MiB), prefill chunk %d tokens",
        path,
        model.dtype,
        world,
        max_model_len,
        plan.num_blocks,
        plan.page_size,
        plan.total_bytes / 2**20,
        plan.max_batch_tokens,
    )
    return Built(tokenizer, model, manager, sampler, plan, max_model_len, eos_ids, lora)


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
        self._live: dict[str, _Live] = {}
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
            await asyncio.to_thread(manager.stop, block=True, timeout=10)
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
        rid = request.request_id
        if rid in self._live:
            raise BadRequestError(f"request id {rid!r} is already in flight", param="request_id")
        adapter = request.adapter
        lora = self._lora_runtime() if adapter is not None else None
        live = _Live()
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
                yield self._terminal(live.dead_error, len(prompt_ids), 0)
                return
            self.check_health()
            key, record = self._sampler.register()
            manager = self._manager
            manager.register_result_handler(cb_rid, live.push)
            eos = -1 if params.ignore_eos or not self._eos_ids else self._eos_ids
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
            async for event in self._events(live, params, record, len(prompt_ids)):
                if event.finished:
                    finished = True
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

    def _terminal(self, reason: str, prompt_len: int, generated: int) -> GenerationEvent:
        if reason == "aborted":
            return GenerationEvent(None, prompt_len, generated, finish_reason=FinishReason.ABORT)
        status = ERROR_TABLE["engine_dead"].status
        return GenerationEvent(
            None, prompt_len, generated, finish_reason=FinishReason.ERROR, error=reason, error_status=status
        )

    async def _events(
        self, live: _Live, params: SamplingParams, record: Record, prompt_len: int
    ) -> AsyncIterator[GenerationEvent]:
        from transformers.generation.continuous_batching.requests import RequestStatus

        detok = IncrementalDetokenizer(self._tokenizer)
        stops = StopMatcher(params.stop)
        seen = 0
        while True:
            if not live.outputs:
                if live.dead_error is not None:
                    for token, text in stops.flush():
                        token.text = text
                        yield GenerationEvent(token, prompt_len, seen)
                    yield self._terminal(live.dead_error, prompt_len, seen)
                    return
                live.wake.clear()
                await live.wake.wait()
                continue
            output = live.outputs.popleft()
            live.engine_done = output.is_finished()
            if output.status == RequestStatus.FAILED:
                failure = self._loop_failure()
                if failure is not None:  # a dead rank or a fatal loop error, not this request's fault
                    yield self._terminal(f"engine failure: {failure}", prompt_len, seen)
                    return
                yield GenerationEvent(
                    None,
                    prompt_len,
                    seen,
                    finish_reason=FinishReason.ERROR,
                    error=f"generation failed: {output.error}",
                    error_status=ERROR_TABLE["model_error"].status,
                )
                return
            new_ids = output.generated_tokens[seen:]
            done = output.status == RequestStatus.FINISHED
            ready: list[tuple[Any, str]] = []
            for tid in new_ids:
                idx = seen
                seen += 1
                self._counters["tokens_total"] += 1
                special = tid in self._eos_ids
                token = Token(
                    id=tid,
                    text="",
                    log_prob=record.logprobs[idx] if idx < len(record.logprobs) else math.nan,
                    special=special,
                    top_logprobs=self._top(params, record, idx),
                )
                ready.extend(stops.push(token, detok.step(tid)))
                if stops.stopped:
                    break
            reason: FinishReason | None = None
            if stops.stopped:
                reason = FinishReason.STOP_SEQUENCE
            elif done:
                ready.extend(stops.flush())
                reason = self._finish_reason(output.generated_tokens, params)
            last = len(ready) - 1
            for i, (token, text) in enumerate(ready):
                token.text = text
                yield GenerationEvent(token, prompt_len, seen, finish_reason=reason if i == last else None)
            if reason is not None:
                if not ready:
                    yield GenerationEvent(None, prompt_len, seen, finish_reason=reason)
                return

    def _finish_reason(self, generated: list[int], params: SamplingParams) -> FinishReason:
        if generated and generated[-1] in self._eos_ids and not params.ignore_eos:
            return FinishReason.EOS
        return FinishReason.LENGTH

    def _top(self, params: SamplingParams, record: Record, idx: int) -> list[tuple[int, str, float]] | None:
        if params.top_n_logprobs <= 0 or idx >= len(record.top):
            return None
        return [(tid, self._tokenizer.decode([tid]), lp) for tid, lp in record.top[idx]]
