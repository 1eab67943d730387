"""The default handler: LMI/TGI, chat and completions requests on the configured engine, streamed or
not, and vLLM's tokenizer routes on its tokenizer."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import EngineStats, FieldError, GenerationEvent, GenerationRequest
from lmforge.errors import LmforgeError
from lmforge.handlers import formatters as fmt
from lmforge.handlers import openai_formatters as ofmt
from lmforge.handlers import streams, tokenization
from lmforge.handlers.fields import in_client_terms
from lmforge.handlers.io import Input, Output
from lmforge.handlers.logprobs import TokenText
from lmforge.handlers.prompt import Prompts
from lmforge.handlers.reply_parsing import ReplyParser
from lmforge.handlers.requests import OPENAI_ROUTES, ParsedRequest, parse_body, parse_request
from lmforge.handlers.served import ServedModels

if TYPE_CHECKING:
    from lmforge.adapters.registry import AdapterRegistry
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import CallSyntax, Engine

log = logging.getLogger("lmforge.handlers")

REQUEST_ID_HEADERS = ("x-amzn-sagemaker-inference-id", "x-request-id")


class DefaultHandler:
    """Parses a request, runs it on the engine and formats the answer (see :mod:`.formatters`)."""

    def __init__(self, config: ServingConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self.name = engine.name
        self.adapters: AdapterRegistry | None = None
        self.started = time.time()
        self._token_text: TokenText | None = None
        if config.enable_lora:
            from lmforge.adapters.registry import AdapterRegistry
            from lmforge.engines.protocol import LoraEngine

            if not isinstance(engine, LoraEngine):
                raise LmforgeError(
                    f"option.enable_lora=true: the {engine.name} backend does not serve LoRA adapters"
                )
            self.adapters = AdapterRegistry(config, engine)
        self.prompts = Prompts(engine, config.max_output_len)
        self.served = ServedModels(config, engine, self.adapters)

    async def start(self) -> None:
        if self.adapters is not None:  # a bad adapter in the folder stops the start before the model loads
            await asyncio.to_thread(self.adapters.check_folder)
        await self.engine.start()
        if self.adapters is not None:
            names = await self.adapters.load_folder()
            if names:
                log.info("registered %d adapters from the model folder: %s", len(names), ", ".join(names))

    @property
    def token_text(self) -> TokenText:
        """How log-probs name the engine's tokens (built once the engine has its tokenizer)."""
        if self._token_text is None:
            self._token_text = TokenText(self.prompts.tokenizer)
        return self._token_text

    def check_health(self) -> None:
        self.engine.check_health()

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def shutdown(self) -> None:
        await self.engine.shutdown()

    def _media_type(self, req: ParsedRequest, accept: str | None, route: str) -> str | None:
        """The streaming media type, or None for one JSON answer. OpenAI routes stream SSE, as OpenAI
        clients expect whatever they send as Accept; /invocations follows LMI's rules."""
        if route in OPENAI_ROUTES:
            return fmt.SSE if req.stream else None
        configured = self.config.output_formatter
        wants_sse = configured == "sse" or "text/event-stream" in (accept or "")
        if req.stream or configured in ("jsonlines", "sse"):
            return fmt.SSE if wants_sse else fmt.JSONLINES
        return None

    async def handle(self, inputs: Input) -> Output:
        body = parse_body(inputs.get_as_bytes(), inputs.get_property("content-type"))
        req = parse_request(
            body,
            default_max_new_tokens=self.config.default_max_new_tokens,
            route=inputs.route,
            auto_tools=self.config.enable_auto_tool_choice,
        )
        media = self._media_type(req, inputs.get_property("accept"), inputs.route)
        self.prompts.check_params(req.params)
        prompts = [(each, self.prompts.ids(each)) for each in req.each_prompt()]
        served = self.served.resolve(req, inputs)
        request_id = _request_id(inputs)
        requests = [
            (each, GenerationRequest(request_id, ids, self.prompts.params(each, ids), adapter=served.adapter))
            for each, ids in prompts
        ]
        if len(requests) > 1 or req.n > 1:
            return await self._choices(req.n, served.name, requests, media)
        req, request = requests[0]
        events = self._generate(request, req)
        try:
            first = await anext(events)  # validation happens here, before any byte is sent
            if first.finished and (failed := streams.failure(first, req.openai)) is not None:
                raise failed
        except FieldError as err:
            await events.aclose()
            raise in_client_terms(err, req) from None
        except BaseException:
            await events.aclose()
            raise
        out = Output()
        if media is None:
            async with contextlib.aclosing(events):
                body_obj = await self._collect(req, served.name, first, events)
            return out.add_as_json(body_obj)
        out.add_property("Content-Type", media)
        out.add_property("X-Accel-Buffering", "no")
        return out.add_stream_content(self._stream(req, served.name, first, events, media))

    def _generate(
        self, request: GenerationRequest, req: ParsedRequest
    ) -> AsyncGenerator[GenerationEvent, None]:
        """The engine's events for ``request``; the prompt alone for ``echo`` with ``max_tokens: 0``."""
        events = self.engine.generate(request)
        return streams.prompt_only(events) if req.echo_only else events

    async def _choices(
        self,
        n: int,
        served: str,
        requests: list[tuple[ParsedRequest, GenerationRequest]],
        media: str | None,
    ) -> Output:
        """OpenAI's ``n`` > 1 or a list of prompts: one engine request per choice, all in the running batch
        at once, answered together. Choice ``p * n + i`` is prompt ``p``'s ``i``-th (vLLM's order), and
        samples as choice ``i`` of that prompt alone would (a seeded one with seed + i)."""
        choices: list[tuple[ParsedRequest, GenerationRequest]] = []
        for each, request in requests:
            for i in range(n):
                params = request.params
                if params.seed is not None:
                    params = dataclasses.replace(params, seed=(params.seed + i) % 2**63)
                rid = f"{request.request_id}-{len(choices)}"
                choices.append((each, dataclasses.replace(request, request_id=rid, params=params)))
        sources = [self._generate(r, each) for each, r in choices]
        firsts = await asyncio.gather(*(anext(s) for s in sources), return_exceptions=True)
        for (each, _), first in zip(choices, firsts, strict=True):
            err = first if isinstance(first, BaseException) else streams.failure(first, openai=True)
            if err is not None:  # the first choice that failed decides the answer (naming its prompt)
                await asyncio.gather(*(s.aclose() for s in sources), return_exceptions=True)
                if isinstance(err, FieldError):
                    raise in_client_terms(err, each) from None
                raise err
        starts = [f for f in firsts if isinstance(f, GenerationEvent)]
        formatters = [self._openai_formatter(each, served) for each, _ in choices]
        for i, formatter in enumerate(formatters):
            formatter.index, formatter.id, formatter.created = i, formatters[0].id, formatters[0].created
        out = Output()
        if media is None:
            try:
                pairs = zip(starts, sources, strict=True)
                collected = await asyncio.gather(*(streams.drain(f, s, openai=True) for f, s in pairs))
            finally:
                await asyncio.gather(*(s.aclose() for s in sources), return_exceptions=True)
            bodies = [f.final_json(events) for f, events in zip(formatters, collected, strict=True)]
            answer = {**bodies[0], "choices": [b["choices"][0] for b in bodies]}
            answer["usage"] = ofmt.choices_usage(formatters, n)
            return out.add_as_json(answer)
        out.add_property("Content-Type", media)
        out.add_property("X-Accel-Buffering", "no")
        return out.add_stream_content(streams.merged_choices(formatters, n, starts, sources, media))

    async def _collect(
        self,
        req: ParsedRequest,
        served: str,
        first: GenerationEvent,
        events: AsyncGenerator[GenerationEvent, None],
    ) -> dict[str, Any]:
        collected = await streams.drain(first, events, req.openai)
        last = collected[-1]
        if req.openai:
            return self._openai_formatter(req, served).final_json(collected)
        lmi = fmt.LmiFormatter(req.prompt, details=req.details, return_full_text=req.return_full_text)
        for event in collected:
            lmi.add(event)
        return lmi.final_json(last)

    def _stream(
        self,
        req: ParsedRequest,
        served: str,
        first: GenerationEvent,
        events: AsyncGenerator[GenerationEvent, None],
        media: str,
    ) -> AsyncIterator[bytes]:
        if req.openai:
            openai = self._openai_formatter(req, served)
            return streams.frames(first, events, media, openai.stream_frame, openai.trailer)
        lmi = fmt.LmiFormatter(req.prompt, details=req.details, return_full_text=req.return_full_text)
        return streams.frames(first, events, media, lmi.stream_frame, None)

    def _openai_formatter(
        self, req: ParsedRequest, model: str
    ) -> ofmt.ChatFormatter | ofmt.CompletionFormatter:
        if req.chat:
            name = self.config.tool_call_parser if req.auto_tools else None
            tools: str | CallSyntax | None = name
            syntax = getattr(self.engine, "tool_call_syntax", None)
            if name is not None and syntax is not None:
                tools = syntax(name, req.tools or []) or name
            reasoning = self.config.reasoning_parser
            parse = (tools or reasoning) and req.tool_mode is None
            return ofmt.ChatFormatter(
                model,
                logprobs=req.logprobs,
                include_usage=req.include_usage,
                tool_mode=req.tool_mode,
                reply=ReplyParser(reasoning, tools) if parse else None,
                token_text=self.token_text,
            )
        echo = None
        if req.echo:  # the prompt's text: as sent, or its token ids decoded
            ids = req.prompt_ids
            echo = req.prompt if ids is None else "".join(self.token_text.pieces(ids))
        return ofmt.CompletionFormatter(
            model,
            logprobs=req.logprobs,
            include_usage=req.include_usage,
            echo=echo,
            token_text=self.token_text,
        )

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the served model, then each registered adapter (its parent: the model)."""
        base = self.engine.model_name
        created = int(self.started)

        def entry(name: str, **parent: str) -> dict[str, Any]:
            return {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "lmforge",
                "root": name,
                **parent,
            }

        adapters = self.adapters.all() if self.adapters is not None else []
        return {"object": "list", "data": [entry(base), *(entry(a.name, parent=base) for a in adapters)]}

    # ------------------------------------------------------------------ vLLM's tokenizer routes

    def tokenize(self, raw: bytes) -> dict[str, Any]:
        """``POST /tokenize``: a prompt's ids as a completions request tokenizes it, or chat messages'
        as a chat request renders and tokenizes them."""
        req = tokenization.parse_tokenize(parse_body(raw, None))
        self.served.check(req.model)
        ids = self.prompts.tokenize(req)
        strs = bool(req.return_token_strs)
        return tokenization.tokenize_answer(ids, self.prompts.max_model_len, self.prompts.tokenizer, strs)

    def detokenize(self, raw: bytes) -> dict[str, Any]:
        """``POST /detokenize``: the text of token ids (special tokens included, as vLLM decodes them)."""
        req = tokenization.parse_detokenize(parse_body(raw, None))
        self.served.check(req.model)
        self.prompts.check_ids(req.tokens, "tokens")
        return {"prompt": str(self.prompts.tokenizer.decode(req.tokens))}

    def tokenizer_info(self) -> dict[str, Any]:
        """``GET /tokenizer_info``: the tokenizer's settings (vLLM's shape)."""
        return tokenization.tokenizer_info(self.prompts.tokenizer)


def _request_id(inputs: Input) -> str:
    """The engine's id for a request: the client's (SageMaker's inference id, or X-Request-Id) when it
    sends one, so engine logs can be matched to it, plus a unique suffix (ids must be unique in an
    engine, and clients reuse theirs)."""
    suffix = uuid.uuid4().hex
    for header in REQUEST_ID_HEADERS:
        given = inputs.get_property(header)
        if given:
            safe = "".join(c for c in given[:96] if c.isprintable() and not c.isspace())
            if safe:
                return f"{safe}-{suffix[:12]}"
    return suffix
