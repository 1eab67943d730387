"""The TensorRT-LLM backend: engines served through TensorRT-LLM's LLM API (in-flight batching).

Start-up makes the build plan (invalid options fail here, before any work), finds or builds the
engine (:func:`.compile.ensure_engine`: a precompiled folder, a cached JIT build, or a JIT build now
within ``option.model_loading_timeout``), and loads it. Each request streams through
``LLM.generate_async(..., streaming=True)``; tokens arrive as ids with their log-probs and lmforge
detokenizes and matches stop strings (:class:`lmforge.engines.streaming.TokenStream`), as for vLLM.
Closing a stream early aborts the request in TensorRT-LLM.
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
from lmforge.engines.protocol import FinishReason, GenerationEvent, GenerationRequest, SamplingParams, Token
from lmforge.engines.streaming import TokenStream
from lmforge.errors import ERROR_TABLE, BadRequestError, EngineDeadError, NotReadyError

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.engines.trtllm.api import TrtllmApi
    from lmforge.engines.trtllm.plan import BuildPlan

log = logging.getLogger("lmforge.engines.trtllm")

#: TensorRT-LLM's finish reasons -> lmforge's (a stop string is found by lmforge itself)
_FINISH = {"length": FinishReason.LENGTH, "stop": FinishReason.EOS, "cancelled": FinishReason.ABORT}
# anything else ("timeout", unknown) ends the stream with an error event that names it


class TrtllmEngine(EngineBase):
    name = "trtllm"

    def __init__(
        self,
        config: ServingConfig,
        extra_options: Mapping[str, str] | None = None,
        *,
        api: TrtllmApi | None = None,
    ) -> None:
        super().__init__(config, extra_options)
        self._api = api
        self._llm: Any = None
        self.plan: BuildPlan | None = None
        self.max_model_len = 0
        self._eos_ids: set[int] = set()
        self._live: dict[str, Any] = {}
        self._dead: str | None = None

    async def start(self) -> None:
        from lmforge.engines.trtllm.api import load_api
        from lmforge.engines.trtllm.compile import ensure_engine
        from lmforge.engines.trtllm.plan import gpu_arch, make_plan

        started = time.monotonic()
        api = self._api or load_api()
        self._api = api
        plan = make_plan(self.config, self.extra_options, arch=gpu_arch(), trtllm_version=api.version)
        self.plan = plan
        folder = self.config.model_path
        if folder is None:
            raise NotReadyError(f"option.model_id={self.config.model_id!r} is not a local folder")
        engine_dir = await asyncio.to_thread(
            ensure_engine, plan, folder, timeout_s=float(self.config.model_loading_timeout)
        )
        kv = api.KvCacheConfig(
            free_gpu_memory_fraction=plan.runtime["kv_cache_free_gpu_mem_fraction"],
            enable_block_reuse=plan.runtime["enable_kv_cache_reuse"],
        )
        self._llm = await asyncio.to_thread(
            api.LLM,
            model=str(engine_dir),
            tokenizer=str(engine_dir),
            kv_cache_config=kv,
            gather_generation_logits=True,  # TensorRT-LLM refuses per-token log-probs without it
        )
        self._tokenizer = await asyncio.to_thread(self._load_tokenizer, str(engine_dir))
        if self._tokenizer.eos_token_id is not None:
            self._eos_ids = {int(self._tokenizer.eos_token_id)}
        self.max_model_len = plan.max_seq_len
        self.load_seconds = time.monotonic() - started
        log.info("TensorRT-LLM engine ready in %.1f s (%s)", self.load_seconds, engine_dir)

    @staticmethod
    def _load_tokenizer(folder: str) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)

    async def shutdown(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    def _executor_down(self) -> bool:
        executor = getattr(self._llm, "_executor", None)
        is_shutdown = getattr(executor, "is_shutdown", None)
        return bool(callable(is_shutdown) and is_shutdown())

    def check_health(self) -> None:
        if self._dead is None and self._llm is not None and self._executor_down():
            self._dead = "its executor shut down"
        if self._dead is not None:
            raise EngineDeadError(f"the TensorRT-LLM engine failed: {self._dead}")
        if self._llm is None:
            raise NotReadyError("the TensorRT-LLM engine is not running")

    def stats(self) -> dict[str, float]:
        healthy = float(self._llm is not None and self._dead is None)
        return {"running": float(len(self._live)), "waiting": 0.0, **self._counters, "healthy": healthy}

    async def abort(self, request_id: str) -> None:
        result = self._live.get(request_id)
        if result is not None:
            result.abort()

    def _sampling_params(self, params: SamplingParams) -> Any:
        assert self._api is not None
        sampled = params.do_sample
        return self._api.SamplingParams(
            max_tokens=params.max_new_tokens,
            temperature=params.temperature if sampled else 0.0,  # 0: greedy
            top_k=(params.top_k or None) if sampled else None,
            top_p=params.top_p if sampled else None,
            repetition_penalty=params.repetition_penalty,
            seed=params.seed,
            ignore_eos=params.ignore_eos,
            logprobs=max(1, params.top_n_logprobs),
            detokenize=False,
        )

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.check_health()
        assert self.plan is not None
        params = request.params
        if params.do_sample and params.seed is None:
            params = dataclasses.replace(params, seed=random.getrandbits(62))
        ids = (
            list(request.prompt)
            if isinstance(request.prompt, list)
            else self._tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        )
        check_request_size(self.config, len(ids), params.max_new_tokens, self.max_model_len)
        if len(ids) > self.plan.max_input_len:
            raise BadRequestError(
                f"the prompt has {len(ids)} tokens; the engine was built for at most "
                f"{self.plan.max_input_len} (option.max_input_len)",
                param="inputs",
            )
        rid = request.request_id
        if rid in self._live:
            raise BadRequestError(f"request id {rid!r} is already in flight", param="request_id")
        result = self._llm.generate_async(ids, sampling_params=self._sampling_params(params), streaming=True)
        self._live[rid] = result
        self._counters["requests_total"] += 1
        state = TokenStream(self._tokenizer, params.stop, len(ids))
        seen = 0
        try:
            async for output in result:
                completion = output.outputs[0]
                new_ids = list(completion.token_ids[seen:])
                logprobs = list(completion.logprobs or [])
                tokens = [self._token(tid, logprobs, seen + i, params) for i, tid in enumerate(new_ids)]
                seen += len(new_ids)
                self._counters["tokens_total"] += len(new_ids)
                done = (
                    _FINISH.get(str(completion.finish_reason), FinishReason.ERROR)
                    if output.finished
                    else None
                )
                for event in state.step(tokens, done, f"finish_reason={completion.finish_reason!r}"):
                    yield event
                if state.finished:
                    return
            if not state.finished:
                yield state.final(FinishReason.ABORT)
        except Exception as exc:  # TensorRT-LLM raises a request's error while it is iterated
            log.error("TensorRT-LLM request %s failed: %s: %s", rid, type(exc).__name__, exc)
            if self._executor_down():
                self._dead = f"{type(exc).__name__}: {exc}"
            status = ERROR_TABLE["engine_dead" if self._dead else "model_error"].status
            yield state.final(FinishReason.ERROR, f"TensorRT-LLM failed the request: {exc}", status)
        finally:
            if not state.finished:
                self._counters["aborted_total"] += 1
                result.abort()
            if self._live.get(rid) is result:
                del self._live[rid]

    def _token(self, tid: int, logprobs: list[Any], index: int, params: SamplingParams) -> Token:
        position = logprobs[index] if index < len(logprobs) else None
        log_prob = float("nan")
        top = None
        if isinstance(position, Mapping):
            entry = position.get(tid)
            if entry is not None:
                log_prob = _logprob(entry)
            if params.top_n_logprobs:
                ranked = sorted(position.items(), key=lambda kv: -_logprob(kv[1]))
                top = [
                    (t, self._tokenizer.decode([t]), _logprob(lp))
                    for t, lp in ranked[: params.top_n_logprobs]
                ]
        elif isinstance(position, float | int):
            log_prob = float(position)
        return Token(tid, "", log_prob, special=tid in self._eos_ids, top_logprobs=top)


def _logprob(entry: Any) -> float:
    """A log-prob from TensorRT-LLM's per-position entries (a Logprob object or a bare float)."""
    value = getattr(entry, "logprob", entry)
    return float(value)
