"""The one rendering of chat messages into a prompt: the model's chat template, through its tokenizer.

Chat completions (and chat bodies on ``/invocations``) and ``POST /tokenize`` with ``messages`` both
render here, so ``/tokenize`` counts exactly the tokens a chat request's ``usage.prompt_tokens`` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from lmforge.errors import BadRequestError


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """``messages`` (as :func:`lmforge.handlers.openai_api.template_messages` gives them) through the
    model's chat template, as text. ``variables`` are extra template variables (vLLM's
    ``chat_template_kwargs``); a template that fails on the messages is a 400 naming ``messages``."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise BadRequestError(
            "this model has no chat template; send a plain prompt ('inputs' or 'prompt') instead of "
            "'messages'",
            param="messages",
        )
    extra = dict(variables or {})
    if tools:
        extra["tools"] = tools
    if continue_final_message:  # only when asked: older templates' callers do not know the argument
        extra["continue_final_message"] = True
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, **extra
        )
    except Exception as exc:  # a template may raise on roles it does not support
        raise BadRequestError(f"the chat template rejected the messages: {exc}", param="messages") from None
    return str(text)


def check_variables(tokenizer: Any, variables: Mapping[str, Any], field: str) -> None:
    """Refuse template variables that are arguments of ``apply_chat_template`` itself (``tokenize``,
    ``tools``, ``add_generation_prompt``, ...): they would change how it renders or what it returns,
    not what the template sees; those that mean something have fields of their own."""
    try:
        own = inspect.signature(tokenizer.apply_chat_template).parameters
    except (TypeError, ValueError):  # no signature to read: nothing can be told apart
        return
    for key in variables:
        param = own.get(key)
        if key == "messages" or (param is not None and param.kind is not param.VAR_KEYWORD):
            raise BadRequestError(
                f"{field}.{key}: is an argument of the chat template's renderer, not a template "
                "variable (use the request's own field where there is one)",
                param=f"{field}.{key}",
            )
