"""How a request is answered: one JSON body or a stream (the media type), and the formatter that writes
it (LMI/TGI, OpenAI chat or completions), from the engine's events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from lmforge.handlers import formatters as fmt
from lmforge.handlers import openai_formatters as ofmt
from lmforge.handlers import streams
from lmforge.handlers.logprobs import TokenText
from lmforge.handlers.reply_parsing import ReplyParser
from lmforge.handlers.streams import Events

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import CallSyntax, Engine, GenerationEvent
    from lmforge.handlers.request_common import ParsedRequest


class Replies:
    """The answer's shape for the server's configuration and engine (``tokenizer``: the engine's, asked
    for once the engine has loaded it)."""

    def __init__(self, config: ServingConfig, engine: Engine, tokenizer: Callable[[], Any]) -> None:
        self._config = config
        self._engine = engine
        self._tokenizer = tokenizer
        self._token_text: TokenText | None = None

    def token_text(self) -> TokenText:
        """How log-probs name the engine's tokens (built on first use)."""
        if self._token_text is None:
            self._token_text = TokenText(self._tokenizer())
        return self._token_text

    def media_type(self, req: ParsedRequest, accept: str | None) -> str | None:
        """The streaming media type, or None for one JSON answer. OpenAI routes stream SSE, as OpenAI
        clients expect whatever they send as Accept; /invocations follows LMI's rules."""
        if req.openai_route:
            return fmt.SSE if req.stream else None
        configured = self._config.output_formatter
        wants_sse = configured == "sse" or "text/event-stream" in (accept or "")
        if req.stream or configured in ("jsonlines", "sse"):
            return fmt.SSE if wants_sse else fmt.JSONLINES
        return None

    async def collect(
        self, req: ParsedRequest, model_name: str, first: GenerationEvent, events: Events
    ) -> dict[str, Any]:
        """One JSON answer from every event."""
        collected = await streams.drain(first, events, req.openai_body)
        if req.openai_body:
            return self.openai(req, model_name).final_json(collected)
        lmi = self.lmi(req)
        for event in collected:
            lmi.add(event)
        return lmi.final_json(collected[-1])

    def stream(
        self, req: ParsedRequest, model_name: str, first: GenerationEvent, events: Events, media: str
    ) -> AsyncIterator[bytes]:
        """The answer's frames as the events come."""
        if req.openai_body:
            openai = self.openai(req, model_name)
            return streams.frames(first, events, media, openai.stream_frame, openai.trailer)
        lmi = self.lmi(req)
        return streams.frames(first, events, media, lmi.stream_frame, None)

    def lmi(self, req: ParsedRequest) -> fmt.LmiFormatter:
        """The LMI/TGI formatter for ``req``."""
        return fmt.LmiFormatter(
            req.prompt,
            details=req.details,
            return_full_text=req.return_full_text,
            token_text=self.token_text(),
        )

    def openai(self, req: ParsedRequest, model_name: str) -> ofmt.ChatFormatter | ofmt.CompletionFormatter:
        """The OpenAI formatter for ``req`` (``model_name``: the name the answer gives as ``model``)."""
        token_text = self.token_text()
        if req.chat:
            name = self._config.tool_call_parser if req.auto_tools else None
            tools: str | CallSyntax | None = name
            if name is not None:
                tools = self._engine.tool_call_syntax(name, req.tools or []) or name
            reasoning = self._config.reasoning_parser
            parse = (tools or reasoning) and req.tool_mode is None
            return ofmt.ChatFormatter(
                model_name,
                logprobs=req.logprobs,
                include_usage=req.include_usage,
                tool_mode=req.tool_mode,
                reply=ReplyParser(reasoning, tools) if parse else None,
                token_text=token_text,
            )
        echo = None
        if req.echo:  # the prompt's text: as sent, or its token ids decoded
            ids = req.prompt_ids
            echo = req.prompt if ids is None else "".join(token_text.pieces(ids))
        return ofmt.CompletionFormatter(
            model_name,
            logprobs=req.logprobs,
            include_usage=req.include_usage,
            echo=echo,
            token_text=token_text,
        )
