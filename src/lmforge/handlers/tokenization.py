"""vLLM's tokenizer routes: ``POST /tokenize``, ``POST /detokenize`` and ``GET /tokenizer_info``, with
vLLM's request and response shapes, on the engine's own tokenizer.

Nothing here tokenizes or renders a chat on its own: :class:`lmforge.handlers.prompt.Prompts` (what
every request's prompt goes through) does, so ``/tokenize`` gives the ids, and the count, a request
would have.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError

from lmforge.errors import BadRequestError
from lmforge.handlers.openai_api import ChatMessage
from lmforge.handlers.request_common import STRICT, validation_error
from lmforge.handlers.tools import Tools

#: tokenizer settings ``/tokenizer_info`` leaves out, as vLLM does: paths to files on the server
_FILE_FIELDS = ("vocab_file", "merges_file")


class TokenizePrompt(BaseModel):
    """``/tokenize`` of a text, as a completions prompt is tokenized."""

    model_config = STRICT
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChat(BaseModel):
    """``/tokenize`` of chat messages, rendered as a chat request renders them."""

    model_config = STRICT
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool | None = None
    """Default: true, unless ``continue_final_message`` is (the two cannot both be)."""
    continue_final_message: bool = False
    add_special_tokens: bool = False
    """False: the chat template writes the special tokens itself (as for chat requests)."""
    return_token_strs: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Tools | None = None
    chat_template: None = None
    """A template sent with the request: vLLM takes one only when started with
    ``--trust-request-chat-template``; lmforge renders with the model's own template only (null)."""

    def generation_prompt(self) -> bool:
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        if self.add_generation_prompt and self.continue_final_message:
            raise BadRequestError(
                "continue_final_message cannot be combined with add_generation_prompt=true",
                param="continue_final_message",
            )
        return self.add_generation_prompt


class Detokenize(BaseModel):
    model_config = STRICT
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


def parse_tokenize(body: dict[str, Any]) -> TokenizePrompt | TokenizeChat:
    """A ``/tokenize`` body: ``messages`` (chat) or ``prompt`` (text); a 400 naming the field otherwise."""
    if ("messages" in body) == ("prompt" in body):
        raise BadRequestError(
            "/tokenize takes either 'prompt' (text) or 'messages' (chat)",
            param="messages" if "messages" in body else "prompt",
        )
    schema: type[TokenizePrompt | TokenizeChat] = TokenizeChat if "messages" in body else TokenizePrompt
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


def parse_detokenize(body: dict[str, Any]) -> Detokenize:
    if "tokens" not in body:
        raise BadRequestError("/detokenize needs 'tokens' (token ids)", param="tokens")
    try:
        return Detokenize.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


def tokenize_answer(ids: list[int], max_model_len: int, tokenizer: Any, with_strs: bool) -> dict[str, Any]:
    """vLLM's ``TokenizeResponse``; ``token_strs`` (the tokens as the vocabulary writes them) when asked."""
    strs = [str(t) for t in tokenizer.convert_ids_to_tokens(ids)] if with_strs else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    """vLLM's ``/tokenizer_info``: the tokenizer's settings (what its ``tokenizer_config.json`` gave it:
    ``eos_token``, ``bos_token``, ``model_max_length``, ...; special tokens as their text), without file
    paths, with its class and the chat template lmforge renders chats with."""
    config = {k: _json(v) for k, v in (getattr(tokenizer, "init_kwargs", None) or {}).items()}
    for name in _FILE_FIELDS:
        config.pop(name, None)
    config["tokenizer_class"] = type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None)
    if template:
        config["chat_template"] = template
    return config


def _json(value: Any) -> Any:
    """``value`` as JSON can hold it: a special token (``AddedToken``) as its text, mappings with text
    keys, tuples as lists; anything else JSON has no type for as its text."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
