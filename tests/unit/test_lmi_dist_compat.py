"""LMI-Dist's start-time check of what it reaches for inside transformers (lmi_dist.compat)."""

from __future__ import annotations

import types

import pytest

from lmforge.engines.lmi_dist import compat
from lmforge.errors import LmforgeError


def test_the_pinned_transformers_has_everything() -> None:
    compat.check_classes()


def test_a_missing_private_method_stops_the_start_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.generation.continuous_batching.model_runner import ModelRunner

    monkeypatch.delattr(ModelRunner, "_sample")
    with pytest.raises(LmforgeError, match=r"lacks ModelRunner\._sample.*tested with transformers 5\.19"):
        compat.check_classes()


def test_the_managers_attributes_are_checked_once_it_exists() -> None:
    runner = types.SimpleNamespace(_sample=None, do_sample=False, return_logprobs=False)
    status = types.SimpleNamespace(fatal_error=None)
    complete = types.SimpleNamespace(
        background_thread_status=status,
        output_router=None,
        _generation_thread=None,
        batch_processor=types.SimpleNamespace(model_runner=runner),
    )
    compat.check_manager(complete)
    del complete.output_router
    del runner.return_logprobs
    with pytest.raises(LmforgeError, match=r"output_router.*ModelRunner\.return_logprobs"):
        compat.check_manager(complete)
