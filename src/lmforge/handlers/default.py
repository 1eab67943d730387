"""The default handler: LMI/TGI, chat and completions requests on the configured engine, streamed or
not, and vLLM's tokenizer routes on its tokenizer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import EngineStats, FieldError, GenerationEvent, GenerationRequest
from lmforge.errors import LmforgeError
from lmforge.handlers import streams, tokenization
from lmforge.handlers.choices import answer_choices
from lmforge.handlers.fields import in_client_terms
from lmforge.handlers.io import Input, Output
from lmforge.handlers.prompt import Prompts
from lmforge.handlers.replies import Replies
from lmforge.handlers.requests import ParsedRequest, parse_body, parse_request
from lmforge.handlers.served import ServedModels

if TYPE_CHECKING:
    from lmforge.adapters.registry import AdapterRegistry
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import Engine

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
        self.replies = Replies(config, engine, lambda: self.prompts.tokenizer)

    async def start(self) -> None:
        if self.adapters is not None:  # a bad adapter in the folder stops the start before the model loads
            await asyncio.to_thread(self.adapters.check_folder)
        await self.engine.start()
        if self.adapters is not None:
            names = await self.adapters.load_folder()
            if names:
                log.info("registered %d adapters from the model folder: %s", len(names), ", ".join(names))

    def check_health(self) -> None:
        self.engine.check_health()

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def shutdown(self) -> None:
        await self.engine.shutdown()

    async def handle(self, inputs: Input) -> Output:
        """Parse, tokenize once, name what serves it, run it on the engine, answer in the asked shape."""
        body = parse_body(inputs.get_as_bytes(), inputs.get_property("content-type"))
        req = parse_request(
            body,
            default_max_new_tokens=self.config.default_max_new_tokens,
            schema=inputs.api,  # the route's, from the server's route table
            auto_tools=self.config.enable_auto_tool_choice,
        )
        media = self.replies.media_type(req, inputs.get_property("accept"))
        self.prompts.check_params(req.params)
        ids = [(each, self.prompts.ids(each)) for each in req.each_prompt()]
        served = self.served.resolve(req, inputs)
        request_id = _request_id(inputs)
        #: one (request of one prompt, the engine's request for it) a prompt
        runs = [
            (
                each,
                GenerationRequest(
                    request_id, prompt, self.prompts.params(each, prompt), adapter=served.adapter
                ),
            )
            for each, prompt in ids
        ]
        if len(runs) > 1 or req.n > 1:
            return await answer_choices(self.replies, self._generate, req.n, served.model_name, runs, media)
        ((one, request),) = runs  # the request itself, or the one prompt of a one-item list
        events = self._generate(request, one)
        first = await _first_event(events, one)
        out = Output()
        if media is None:
            async with contextlib.aclosing(events):
                return out.add_as_json(await self.replies.collect(one, served.model_name, first, events))
        out.add_property("Content-Type", media)
        out.add_property("X-Accel-Buffering", "no")
        return out.add_stream_content(self.replies.stream(one, served.model_name, first, events, media))

    def _generate(
        self, request: GenerationRequest, req: ParsedRequest
    ) -> AsyncGenerator[GenerationEvent, None]:
        """The engine's events for ``request``; the prompt alone for ``echo`` with ``max_tokens: 0``."""
        events = self.engine.generate(request)
        return streams.prompt_only(events) if req.echo_only else events

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``."""
        return self.served.models(int(self.started))

    def model_names(self) -> set[str]:
        """LMI's default model name and the served model's."""
        return {"model", self.engine.model_name}

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


async def _first_event(events: AsyncGenerator[GenerationEvent, None], req: ParsedRequest) -> GenerationEvent:
    """The engine's first event: the request's checks happen there, before any byte is sent (a refusal
    raises in the client's terms, and the events are closed)."""
    try:
        first = await anext(events)
        if first.finished and (failed := streams.failure(first, req.openai_body)) is not None:
            raise failed
    except FieldError as err:
        await events.aclose()
        raise in_client_terms(err, req) from None
    except BaseException:
        await events.aclose()
        raise
    return first


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
