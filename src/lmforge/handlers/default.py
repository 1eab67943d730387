"""The default handler: LMI/TGI, chat and completions requests on the configured engine, streamed or
not, and vLLM's tokenizer routes on its tokenizer."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import (
    EngineStats,
    FieldError,
    GenerationEvent,
    GenerationRequest,
    RequestField,
    SamplingParams,
)
from lmforge.errors import BadRequestError, LmforgeError, NotFoundError
from lmforge.handlers import formatters as fmt
from lmforge.handlers import openai_formatters as ofmt
from lmforge.handlers import streams, tokenization
from lmforge.handlers.chat_template import check_variables, render_chat
from lmforge.handlers.fields import client_name, in_client_terms
from lmforge.handlers.io import Input, Output
from lmforge.handlers.logprobs import TokenText
from lmforge.handlers.openai_api import template_messages
from lmforge.handlers.reply_parsing import ReplyParser
from lmforge.handlers.requests import CHAT_ROUTE, COMPLETIONS_ROUTE, ParsedRequest, parse_body, parse_request
from lmforge.handlers.tools import template_tools

if TYPE_CHECKING:
    from lmforge.adapters.registry import AdapterRegistry
    from lmforge.adapters.spec import LoraAdapter
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import CallSyntax, Engine

log = logging.getLogger("lmforge.handlers")

REQUEST_ID_HEADERS = ("x-amzn-sagemaker-inference-id", "x-request-id")
ADAPTER_HEADER = "x-amzn-sagemaker-adapter-identifier"
ALIAS_HEADER = "x-amzn-sagemaker-adapter-alias"
ADAPTER_QUERY = "adapter"
OPENAI_ROUTES = (CHAT_ROUTE, COMPLETIONS_ROUTE)


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
            self._token_text = TokenText(self.engine.tokenizer)
        return self._token_text

    def _served_names(self) -> set[str]:
        """Names an OpenAI ``model`` may give for the base model (``/v1/models``'s name, ``model``,
        ``option.model_id``, the folder's name; or none). Others: an adapter, else vLLM's 404 on /v1."""
        names = {"model", self.engine.model_name}
        if self.config.model_id:
            names.add(self.config.model_id)
        if self.config.model_dir is not None:
            names.add(self.config.model_dir.name)
        return names

    def _unknown_model(self, named: str) -> NotFoundError:
        """vLLM's 404 for a ``model`` that is neither the served model nor a registered adapter."""
        names = ", ".join(sorted(self._served_names()))
        adapters = [a.name for a in self.adapters.all()] if self.adapters is not None else []
        also = f"; adapters: {', '.join(adapters[:20])}" if adapters else ""
        return NotFoundError(
            f"The model `{named}` does not exist. Valid aliases: {names}{also}.", param="model"
        )

    def _check_model(self, named: str | None) -> None:
        """An OpenAI ``model`` must name the served model or a registered adapter (vLLM's 404)."""
        if not named or named in self._served_names():
            return
        if self.adapters is None or self.adapters.find(named) is None:
            raise self._unknown_model(named)

    def _adapter(self, req: ParsedRequest, inputs: Input) -> LoraAdapter | None:
        """The adapter a request asks for: header (SageMaker's identifier, else its alias), body
        (``adapters``) or ``?adapter=``."""
        identifier = inputs.get_property(ADAPTER_HEADER)
        alias = inputs.get_property(ALIAS_HEADER)
        if not identifier and alias:
            found = self.adapters.find_alias(alias) if self.adapters is not None else None
            identifier = found.name if found is not None else alias
        wanted = {
            source: value
            for source, value in (
                ("the X-Amzn-SageMaker-Adapter-Identifier or -Alias header", identifier),
                ("adapters" if not req.openai else "model", req.adapter),
                ("the adapter query parameter", inputs.get_query(ADAPTER_QUERY)),
            )
            if value
        }
        if req.openai and "model" in wanted:
            named = wanted["model"]
            if inputs.route in OPENAI_ROUTES:
                self._check_model(named)
            if named in self._served_names():
                del wanted["model"]  # the OpenAI model field names the served model, not an adapter
            elif self.adapters is None:  # /invocations: SageMaker routes by endpoint, and its
                del wanted["model"]  # clients send any model name
        if not wanted:
            return None
        if len(set(wanted.values())) > 1:
            raise BadRequestError(
                "the request names different adapters: "
                + ", ".join(f"{v!r} in {k}" for k, v in wanted.items()),
                param="adapters",
            )
        name = next(iter(wanted.values()))
        if self.adapters is None:
            raise BadRequestError(
                f"adapter {name!r} requested but LoRA adapters are not enabled (option.enable_lora=true)",
                param="adapters",
            )
        return self.adapters.get(name)

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

    def _check_ids(self, ids: Iterable[int], param: str) -> None:
        """An id past the vocabulary would fail inside the engine's batched step, for every request."""
        vocab = len(self.engine.tokenizer)
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise BadRequestError(
                f"{param}: token id {bad} is out of range: this model's vocabulary has {vocab} tokens "
                f"(ids 0 to {vocab - 1})",
                param=param,
            )

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """``text``'s token ids, as the engines tokenize a prompt (:meth:`EngineBase.prepare`)."""
        return list(self.engine.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _check_param_ids(self, params: SamplingParams) -> None:
        if params.logit_bias:
            self._check_ids((t for t, _ in params.logit_bias), "logit_bias")
        if params.stop_token_ids:
            self._check_ids(params.stop_token_ids, "stop_token_ids")

    def _prompt(self, req: ParsedRequest) -> tuple[str | list[int], bool]:
        """One prompt as the engine takes it (text or ids), and whether it adds special tokens."""
        if req.prompt_ids is not None:
            self._check_ids(req.prompt_ids, client_name(RequestField.PROMPT, req) or "prompt")
            return req.prompt_ids, True
        if not req.chat:
            return req.prompt, True
        text = render_chat(self.engine.tokenizer, req.messages or [], tools=req.tools)
        return text, False

    def _to_model_length(self, prompt: str, params: SamplingParams) -> tuple[list[int], SamplingParams]:
        """A chat request with no max_tokens may generate up to the model's remaining length (as
        OpenAI and vLLM do), capped by option.max_output_len; not the LMI default length. Returns the
        rendered prompt's token ids (the engine takes them as they are: tokenized once) and the params."""
        ids = self.encode(prompt, add_special_tokens=False)
        limit = int(getattr(self.engine, "max_model_len", 0) or 0)
        room = limit - len(ids)
        if self.config.max_output_len is not None:
            room = min(room, self.config.max_output_len)
        # no room (or no known length): the engine's size check decides (naming messages)
        return ids, dataclasses.replace(params, max_new_tokens=room) if limit > 0 and room >= 1 else params

    async def handle(self, inputs: Input) -> Output:
        body = parse_body(inputs.get_as_bytes(), inputs.get_property("content-type"))
        req = parse_request(
            body,
            default_max_new_tokens=self.config.default_max_new_tokens,
            route=inputs.route,
            auto_tools=self.config.enable_auto_tool_choice,
        )
        media = self._media_type(req, inputs.get_property("accept"), inputs.route)
        self._check_param_ids(req.params)
        prompts = [(each, *self._prompt(each)) for each in req.each_prompt()]
        adapter = self._adapter(req, inputs)
        # OpenAI answers name what served them: the adapter, else the model
        served = adapter.name if adapter is not None else self.engine.model_name
        request_id = _request_id(inputs)
        requests: list[tuple[ParsedRequest, GenerationRequest]] = []
        for each, prompt, add_special in prompts:
            params = each.params
            if each.chat and not each.length_given and isinstance(prompt, str):
                prompt, params = self._to_model_length(prompt, params)
            request = GenerationRequest(
                request_id=request_id,
                prompt=prompt,
                params=params,
                add_special_tokens=add_special,
                adapter=adapter,
            )
            requests.append((each, request))
        if len(requests) > 1 or req.n > 1:
            return await self._choices(req.n, served, requests, media)
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
                body_obj = await self._collect(req, served, first, events)
            return out.add_as_json(body_obj)
        out.add_property("Content-Type", media)
        out.add_property("X-Accel-Buffering", "no")
        return out.add_stream_content(self._stream(req, served, first, events, media))

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
        self._check_model(req.model)
        if isinstance(req, tokenization.TokenizeChat):
            variables = req.chat_template_kwargs or {}
            check_variables(self.engine.tokenizer, variables, "chat_template_kwargs")
            text = render_chat(
                self.engine.tokenizer,
                template_messages(req.messages),
                tools=template_tools(req.tools),
                add_generation_prompt=req.generation_prompt(),
                continue_final_message=req.continue_final_message,
                variables=variables,
            )
        else:
            text = req.prompt
        ids = self.encode(text, req.add_special_tokens)
        limit = int(getattr(self.engine, "max_model_len", 0) or 0)
        return tokenization.tokenize_answer(ids, limit, self.engine.tokenizer, bool(req.return_token_strs))

    def detokenize(self, raw: bytes) -> dict[str, Any]:
        """``POST /detokenize``: the text of token ids (special tokens included, as vLLM decodes them)."""
        req = tokenization.parse_detokenize(parse_body(raw, None))
        self._check_model(req.model)
        self._check_ids(req.tokens, "tokens")
        return {"prompt": str(self.engine.tokenizer.decode(req.tokens))}

    def tokenizer_info(self) -> dict[str, Any]:
        """``GET /tokenizer_info``: the tokenizer's settings (vLLM's shape)."""
        return tokenization.tokenizer_info(self.engine.tokenizer)


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
