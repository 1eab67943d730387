"""The TensorRT-LLM backend: engines served through TensorRT-LLM's LLM API (in-flight batching).

Start-up makes the build plan (invalid options fail here, before any work), finds or builds the
engine (:func:`.compile.ensure_engine`: a precompiled folder, a cached JIT build, or a JIT build now
within ``option.model_loading_timeout``), and loads it. Each request streams through
``LLM.generate_async(..., streaming=True)``; tokens arrive as ids with their log-probs and lmforge
detokenizes and matches stop strings (:class:`lmforge.engines.streaming.TokenStream`), as for vLLM.
Closing a stream early aborts the request in TensorRT-LLM.

LoRA (``option.enable_lora``): the engine is built with TensorRT-LLM's LoRA plugin (the build plan) and
loaded with a ``LoraConfig`` (``max_lora_rank``; ``max_loras`` adapters in GPU memory and
``max_cpu_loras`` in host memory: TensorRT-LLM's PEFT cache, least recently used leave first). A request
for an adapter carries ``LoRARequest(name, id, path)`` (``tensorrt_llm.executor.request``); TensorRT-LLM
reads the adapter's PEFT folder the first time an id is used and caches it by id. Its LLM API has no call
to preload or drop one adapter, so registering checks the folder and removing stops new requests (ids are
never reused, so a removed adapter's cached weights are never picked up again; they age out of the cache).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.base import EngineBase
from lmforge.engines.lora_handles import LoraHandles
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
from lmforge.errors import ERROR_TABLE, BadRequestError, EngineDeadError, LmforgeError, NotReadyError

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter
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
        self._api: Any = api  # TrtllmApi here; the >= 1.3 subclass keeps its own API object in it
        self._llm: Any = None
        self.plan: BuildPlan | None = None
        self.max_input_len: int | None = None
        """The longest prompt the engine takes (the built ``max_input_len``), None: only max_model_len."""
        self.max_lora_rank: int | None = None
        self.max_model_len = 0
        self._eos_ids: set[int] = set()
        self._running = 0
        self._dead: str | None = None
        # LoRA: adapter id -> TensorRT-LLM's LoRARequest (registered, not removed); running requests per id
        self._lora_layers: dict[str, tuple[int, int]] | None = None
        self._loras = LoraHandles()

    async def start(self) -> None:
        refuse_speculation(self.config)
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
        lora: dict[str, Any] = {}
        if plan.lora:
            cfg = self.config
            lora = {
                "enable_lora": True,
                "lora_config": api.LoraConfig(
                    max_lora_rank=plan.max_lora_rank,
                    max_loras=cfg.max_loras,
                    max_cpu_loras=cfg.max_cpu_loras or cfg.max_loras,
                ),
            }
        self._llm = await asyncio.to_thread(
            api.LLM,
            model=str(engine_dir),
            tokenizer=str(engine_dir),
            kv_cache_config=kv,
            gather_generation_logits=True,  # TensorRT-LLM refuses per-token log-probs without it
            **lora,
        )
        self._tokenizer = await asyncio.to_thread(self._load_tokenizer, str(engine_dir))
        if self._tokenizer.eos_token_id is not None:
            self._eos_ids = {int(self._tokenizer.eos_token_id)}
        self.max_model_len = plan.max_seq_len
        self.max_input_len = plan.max_input_len
        self.max_lora_rank = plan.max_lora_rank
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

    def stats(self) -> EngineStats:
        return self._stats(self._running, healthy=self._llm is not None and self._dead is None)

    # ------------------------------------------------------------------ LoRA adapters

    def _lora_enabled(self) -> None:
        if not self.config.enable_lora:
            raise BadRequestError(
                "LoRA adapters are not enabled; set option.enable_lora=true", param="adapters"
            )

    def lora_layers(self) -> dict[str, tuple[int, int]]:
        """The base model's linear layers, from its Hugging Face ``config.json`` (a compiled engine folder
        keeps it beside the engines)."""
        self._lora_enabled()
        if self._lora_layers is None:
            from lmforge.adapters.validate import linear_layers_from_folder

            folder = self.config.model_path
            if folder is None:
                raise NotReadyError(f"option.model_id={self.config.model_id!r} is not a local folder")
            from lmforge.engines.trtllm.compile import is_compiled

            if is_compiled(Path(folder)):
                self._lora_layers = _engine_linear_layers(Path(folder))
            else:
                self._lora_layers = linear_layers_from_folder(
                    Path(folder), trust_remote_code=bool(self.config.trust_remote_code)
                )
        return self._lora_layers

    async def add_adapter(self, adapter: LoraAdapter) -> None:
        self._lora_enabled()
        self.check_health()
        assert self._api is not None
        if self.max_lora_rank is not None and adapter.rank > self.max_lora_rank:
            raise BadRequestError(
                f"adapter {adapter.name!r} has rank {adapter.rank}; the engine was built for at most "
                f"{self.max_lora_rank} (option.max_lora_rank)",
                param="src",
            )
        if adapter.options.get("pin") not in (None, False, "false", "0"):
            raise BadRequestError(
                f"cannot pin adapter {adapter.name!r}: TensorRT-LLM's LLM API keeps adapters in its cache "
                "by recent use only",
                param="pin",
            )
        try:
            lora = self._api.LoRARequest(adapter.name, adapter.int_id, str(adapter.path), "hf")
        except ValueError as exc:
            raise BadRequestError(
                f"TensorRT-LLM refuses adapter {adapter.name!r}: {exc}", param="src"
            ) from None
        self._loras.add(adapter, lora)

    async def remove_adapter(self, adapter: LoraAdapter) -> None:
        """New requests cannot use ``adapter``; returns once the requests running with it are done."""
        await self._loras.retire(adapter)

    # ------------------------------------------------------------------ requests

    def _sampling_params(self, params: SamplingParams) -> Any:
        assert self._api is not None
        unmapped = {
            RequestField.MIN_NEW_TOKENS: params.min_new_tokens,
            RequestField.PRESENCE_PENALTY: params.presence_penalty,
            RequestField.FREQUENCY_PENALTY: params.frequency_penalty,
            RequestField.MIN_P: params.min_p,
            RequestField.LOGIT_BIAS: params.logit_bias,
            RequestField.STOP_TOKEN_IDS: params.stop_token_ids,
            RequestField.STRUCTURED: params.structured,
            RequestField.PROMPT_TOP_N: params.prompt_top_n is not None,
        }
        asked = next((name for name, value in unmapped.items() if value), None)
        if asked is not None:
            raise not_supported(asked)
        sampled = params.do_sample
        return self._api.SamplingParams(
            max_tokens=params.max_new_tokens,
            temperature=params.temperature if sampled else 0.0,  # 0: greedy
            top_k=(params.top_k or None) if sampled else None,
            top_p=params.top_p if sampled else None,
            repetition_penalty=params.repetition_penalty,
            seed=params.seed,
            ignore_eos=params.ignore_eos,
            logprobs=max(1, params.top_n),
            detokenize=False,
        )

    async def _generate(
        self, request: GenerationRequest, params: SamplingParams
    ) -> AsyncGenerator[GenerationEvent, None]:
        ids = request.prompt
        if self.max_input_len is not None and len(ids) > self.max_input_len:
            raise FieldError(
                RequestField.PROMPT,
                f"the prompt has {len(ids)} tokens; the engine takes at most "
                f"{self.max_input_len} (option.max_input_len)",
            )
        rid = request.request_id
        lora = self._loras.get(request.adapter)
        result = self._llm.generate_async(
            ids, sampling_params=self._sampling_params(params), lora_request=lora, streaming=True
        )
        self._running += 1
        stream = TokenStream(self._tokenizer, params.stop, len(ids))
        if lora is not None:  # counted until the stream ends: remove_adapter waits for these
            self._loras.begin(lora.lora_int_id)
        seen = 0
        try:
            async for output in result:
                completion = output.outputs[0]
                new_ids = list(completion.token_ids[seen:])
                logprobs = list(completion.logprobs or [])
                tokens = [self._token(tid, logprobs, seen + i, params) for i, tid in enumerate(new_ids)]
                seen += len(new_ids)
                done = (
                    _FINISH.get(str(completion.finish_reason), FinishReason.ERROR)
                    if output.finished
                    else None
                )
                for event in stream.step(tokens, done, f"finish_reason={completion.finish_reason!r}"):
                    yield event
                if stream.finished:
                    return
            if not stream.finished:  # the results ended unfinished: TensorRT-LLM cancelled the request
                for event in stream.end(FinishReason.ABORT):
                    yield event
        except Exception as exc:  # TensorRT-LLM raises a request's error while it is iterated
            log.error("TensorRT-LLM request %s failed: %s: %s", rid, type(exc).__name__, exc)
            if self._executor_down():
                self._dead = f"{type(exc).__name__}: {exc}"
            status = ERROR_TABLE["engine_dead" if self._dead else "model_error"].status
            for event in stream.end(FinishReason.ERROR, f"TensorRT-LLM failed the request: {exc}", status):
                yield event
        finally:
            if not stream.finished:  # the stream was closed early: the request stops in TensorRT-LLM
                result.abort()
            self._running -= 1
            if lora is not None:
                self._loras.done(lora.lora_int_id)

    def _token(self, tid: int, logprobs: list[Any], index: int, params: SamplingParams) -> Token:
        position = logprobs[index] if index < len(logprobs) else None
        log_prob = float("nan")
        top = None
        if isinstance(position, Mapping):
            entry = position.get(tid)
            if entry is not None:
                log_prob = _logprob(entry)
            if params.top_n:
                ranked = sorted(position.items(), key=lambda kv: -_logprob(kv[1]))
                top = [(t, _logprob(lp)) for t, lp in ranked[: params.top_n]]
        elif isinstance(position, float | int):
            log_prob = float(position)
        return Token(tid, "", log_prob, special=tid in self._eos_ids, top_logprobs=top)


def not_supported(field: RequestField) -> FieldError:
    """The 400 for a request field this backend does not map to TensorRT-LLM yet."""
    return FieldError(
        field, field, " is not supported by lmforge's TensorRT-LLM backend yet (LMI-Dist and vLLM honour it)"
    )


def _logprob(entry: Any) -> float:
    """A log-prob from TensorRT-LLM's per-position entries (a Logprob object or a bare float)."""
    value = getattr(entry, "logprob", entry)
    return float(value)


def _engine_linear_layers(folder: Path) -> dict[str, tuple[int, int]]:
    """The linear layers of the model a compiled engine folder was built from, rebuilt (on the meta device)
    from the ``pretrained_config`` TensorRT-LLM records in the folder's ``config.json``."""
    import json

    import transformers

    from lmforge.adapters.validate import AdapterError, linear_layers_of

    pretrained = json.loads((folder / "config.json").read_text()).get("pretrained_config") or {}
    arch = str(pretrained.get("architecture", ""))
    model_cls = getattr(transformers, arch, None)
    if model_cls is None:
        raise AdapterError(
            f"cannot tell the layers of the compiled engine's model ({arch or 'no architecture recorded'}) "
            "to check adapters against",
            param="src",
        )
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "num_hidden_layers", "max_position_embeddings")  # fmt: skip
    config = model_cls.config_class(**{k: pretrained[k] for k in fields if pretrained.get(k) is not None})
    import torch

    with torch.device("meta"):
        model = model_cls(config)
    return linear_layers_of(model)


def refuse_speculation(config: ServingConfig) -> None:
    """lmforge hands speculative decoding to TensorRT-LLM >= 1.3 only (:mod:`.pytorch_backend`), not to
    the 1.2 engine API: a 1.2 start that asks for it stops here, naming the option, rather than serve
    without it."""
    if config.speculation is not None:
        raise LmforgeError(
            f"option.speculative_config ({config.speculation.method}): lmforge passes speculative "
            "decoding to TensorRT-LLM >= 1.3 only, not to this 1.2 engine API; LMI-Dist "
            "(option.rolling_batch=lmi-dist), vLLM on a GPU and TensorRT-LLM >= 1.3 serve it"
        )
