"""Request-size rules every engine applies before a request reaches it (one source for the
messages): a non-empty prompt, ``option.max_input_len``, ``option.max_output_len`` and the model
length (prompt + ``max_new_tokens`` <= ``max_model_len``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmforge.engines.protocol import FieldError, RequestField

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

PROMPT, MAX_NEW_TOKENS = RequestField.PROMPT, RequestField.MAX_NEW_TOKENS


def check_request_size(cfg: ServingConfig, prompt_len: int, max_new: int, max_model_len: int) -> None:
    """Raise :class:`FieldError` naming the field when a request cannot be served whole."""
    if prompt_len == 0:
        raise FieldError(PROMPT, PROMPT, " must not be empty")
    if cfg.max_input_len is not None and prompt_len > cfg.max_input_len:
        raise FieldError(
            PROMPT, f"the prompt has {prompt_len} tokens, more than option.max_input_len={cfg.max_input_len}"
        )
    if cfg.max_output_len is not None and max_new > cfg.max_output_len:
        raise FieldError(
            MAX_NEW_TOKENS,
            MAX_NEW_TOKENS,
            f"={max_new} is more than option.max_output_len={cfg.max_output_len}",
        )
    if prompt_len + max_new > max_model_len:
        raise FieldError(
            MAX_NEW_TOKENS if prompt_len < max_model_len else PROMPT,
            f"the prompt ({prompt_len} tokens) plus ",
            MAX_NEW_TOKENS,
            f" ({max_new}) is more than max_model_len ({max_model_len})",
        )
