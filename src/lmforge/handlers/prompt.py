"""A request's prompt as the engine takes it: token ids, made here and nowhere else.

As vLLM does at its edge, text becomes token ids once, before the engine sees the request
(:attr:`lmforge.engines.protocol.GenerationRequest.prompt` is always ids; the engine only checks
sizes). Which special tokens a prompt gets is decided here, once: a chat is rendered with the
model's chat template (:func:`lmforge.handlers.chat_template.render_chat`) and tokenized without the
tokenizer's special tokens, since the template writes its own (``<s>``, role markers); a plain
prompt (LMI ``inputs``, a completions text) gets the tokenizer's own (its BOS); ids a client sends
are taken as they are, once checked against the vocabulary. vLLM's ``/tokenize`` renders and
tokenizes through the same calls, so it counts what a request counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import RequestField
from lmforge.errors import BadRequestError
from lmforge.handlers.chat_template import check_variables, render_chat
from lmforge.handlers.fields import client_name
from lmforge.handlers.openai_api import template_messages
from lmforge.handlers.tokenization import TokenizeChat, TokenizePrompt
from lmforge.handlers.tools import template_tools

if TYPE_CHECKING:
    from lmforge.engines.protocol import Engine, SamplingParams
    from lmforge.handlers.request_common import ParsedRequest


class Prompts:
    """Tokenizes the prompts of requests on ``engine``'s tokenizer (which it has once started)."""

    def __init__(self, engine: Engine, max_output_len: int | None) -> None:
        self._engine = engine
        self._max_output_len = max_output_len

    @property
    def tokenizer(self) -> Any:
        return self._engine.tokenizer

    @property
    def max_model_len(self) -> int:
        """Prompt + generated tokens one sequence may hold (0: the engine does not say)."""
        return self._engine.max_model_len

    def ids(self, req: ParsedRequest) -> list[int]:
        """``req``'s one prompt as token ids: its ids checked, its chat rendered and tokenized, or
        its text tokenized with the tokenizer's special tokens."""
        if req.prompt_ids is not None:
            self.check_ids(req.prompt_ids, client_name(RequestField.PROMPT, req) or "prompt")
            return list(req.prompt_ids)
        if req.chat:
            text = render_chat(self.tokenizer, req.messages or [], tools=req.tools)
            return self._encode(text, special_tokens=False)
        return self._encode(req.prompt, special_tokens=True)

    def tokenize(self, req: TokenizePrompt | TokenizeChat) -> list[int]:
        """vLLM's ``POST /tokenize``: a text, or messages rendered as a chat request renders them, with
        the special tokens the client asks for (by default, as a request of that kind gets them)."""
        if isinstance(req, TokenizePrompt):
            return self._encode(req.prompt, special_tokens=req.add_special_tokens)
        variables = req.chat_template_kwargs or {}
        check_variables(self.tokenizer, variables, "chat_template_kwargs")
        text = render_chat(
            self.tokenizer,
            template_messages(req.messages),
            tools=template_tools(req.tools),
            add_generation_prompt=req.generation_prompt(),
            continue_final_message=req.continue_final_message,
            variables=variables,
        )
        return self._encode(text, special_tokens=req.add_special_tokens)

    def _encode(self, text: str, *, special_tokens: bool) -> list[int]:
        """``text``'s token ids; ``special_tokens``: with those the tokenizer adds (its BOS, ...)."""
        return list(self.tokenizer.encode(text, add_special_tokens=special_tokens))

    def check_ids(self, ids: Iterable[int], param: str) -> None:
        """An id past the vocabulary would fail inside the engine's batched step, for every request."""
        vocab = len(self.tokenizer)
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise BadRequestError(
                f"{param}: token id {bad} is out of range: this model's vocabulary has {vocab} tokens "
                f"(ids 0 to {vocab - 1})",
                param=param,
            )

    def check_params(self, params: SamplingParams) -> None:
        """The token ids among the sampling settings (``logit_bias``, ``stop_token_ids``)."""
        if params.logit_bias:
            self.check_ids((t for t, _ in params.logit_bias), "logit_bias")
        if params.stop_token_ids:
            self.check_ids(params.stop_token_ids, "stop_token_ids")

    def params(self, req: ParsedRequest, ids: list[int]) -> SamplingParams:
        """``req``'s sampling settings for its prompt ``ids``: a chat request with no length may
        generate up to the model's remaining length (as OpenAI and vLLM do), capped by
        option.max_output_len; not the LMI default length."""
        params = req.params
        if not req.chat or req.length_given:
            return params
        limit = self.max_model_len
        room = limit - len(ids)
        if self._max_output_len is not None:
            room = min(room, self._max_output_len)
        # no room (or no known length): the engine's size check decides (naming messages)
        return dataclasses.replace(params, max_new_tokens=room) if limit > 0 and room >= 1 else params
