"""Request-size rules every engine applies before a request reaches it (one source for the
messages): a non-empty prompt, ``option.max_input_len``, ``option.max_output_len`` and the model
length (prompt + ``max_new_tokens`` <= ``max_model_len``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmforge.errors import BadRequestError

if TYPE_CHECKING:
    from lmforge.config import ServingConfig


def check_request_size(cfg: ServingConfig, prompt_len: int, max_new: int, max_model_len: int) -> None:
    """Raise :class:`BadRequestError` naming the field when a request cannot be served whole."""
    if prompt_len == 0:
        raise BadRequestError("inputs must not be empty", param="inputs")
    if cfg.max_input_len is not None and prompt_len > cfg.max_input_len:
        raise BadRequestError(
            f"the prompt has {prompt_len} tokens, more than option.max_input_len={cfg.max_input_len}",
            param="inputs",
        )
    if cfg.max_output_len is not None and max_new > cfg.max_output_len:
        raise BadRequestError(
            f"max_new_tokens={max_new} is more than option.max_output_len={cfg.max_output_len}",
            param="parameters.max_new_tokens",
        )
    if prompt_len + max_new > max_model_len:
        raise BadRequestError(
            f"the prompt ({prompt_len} tokens) plus max_new_tokens ({max_new}) is more than "
            f"max_model_len ({max_model_len})",
            param="parameters.max_new_tokens" if prompt_len < max_model_len else "inputs",
        )
