"""What every lmforge engine shares: its configuration, the ``option.*`` keys it may take, the
tokenizer, the served model name, and the frame of every request (:meth:`EngineBase.generate`: its
checks, :meth:`EngineBase.prepare`, and the request counters behind ``/metrics``); an engine writes
only its own part, :meth:`EngineBase._generate`."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from lmforge.engines.limits import check_request_size
from lmforge.engines.protocol import EngineStats

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import CallSyntax, GenerationEvent, GenerationRequest, SamplingParams


class RequestCounters(TypedDict):
    """The counters every engine keeps as its requests run (:class:`EngineStats` has their meaning)."""

    requests_total: int
    aborted_total: int
    tokens_total: int


class EngineBase:
    name: str

    def __init__(self, config: ServingConfig, extra_options: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.extra_options = dict(extra_options or {})
        self._tokenizer: Any = None
        self._counters = RequestCounters(requests_total=0, aborted_total=0, tokens_total=0)
        self.load_seconds = 0.0
        self.max_model_len = 0
        """Prompt + generated tokens one sequence may hold (known once the engine started)."""

    def check_health(self) -> None:
        raise NotImplementedError

    def stats(self) -> EngineStats:
        raise NotImplementedError

    def _stats(
        self, running: int, *, waiting: int = 0, healthy: bool, extra: Mapping[str, float] | None = None
    ) -> EngineStats:
        """The engine's :class:`EngineStats`: its gauges (and own extras) with the request counters."""
        counters = self._counters
        return EngineStats(
            running=running,
            waiting=waiting,
            requests_total=counters["requests_total"],
            aborted_total=counters["aborted_total"],
            tokens_total=counters["tokens_total"],
            healthy=healthy,
            extra=dict(extra or {}),
        )

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        """One request's events: :meth:`prepare`, then the engine's own :meth:`_generate`, counted for
        ``/metrics`` here, once for every engine. A stream its caller closes before the final event
        (a client that went away) is aborted; a refusal raised to the caller is not."""
        params = self.prepare(request)
        counters = self._counters
        counters["requests_total"] += 1
        ended = False
        try:
            async with contextlib.aclosing(self._generate(request, params)) as events:
                async for event in events:
                    if event.token is not None:
                        counters["tokens_total"] += 1
                    ended = event.finish_reason is not None
                    yield event
        except Exception:
            ended = True
            raise
        finally:
            if not ended:
                counters["aborted_total"] += 1

    def _generate(
        self, request: GenerationRequest, params: SamplingParams
    ) -> AsyncGenerator[GenerationEvent, None]:
        """The engine's part of :meth:`generate`: ``request`` run with ``params`` (from :meth:`prepare`),
        its events up to one with a ``finish_reason``. Closing it early stops the request."""
        raise NotImplementedError

    def prepare(self, request: GenerationRequest) -> SamplingParams:
        """What every engine does first with a request: refuse it when the engine cannot serve, give
        a sampled request without a seed one of its own (its draws are then reproducible, and equal
        on every tensor-parallel rank), and check its size
        (:func:`lmforge.engines.limits.check_request_size`). Returns the settings to run it with."""
        self.check_health()
        params = request.params
        if params.do_sample and params.seed is None:
            params = dataclasses.replace(params, seed=random.getrandbits(62))
        check_request_size(self.config, len(request.prompt), params.max_new_tokens, self.max_model_len)
        return params

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def tool_call_syntax(self, name: str, tools: list[dict[str, Any]]) -> CallSyntax | None:
        """:meth:`lmforge.engines.protocol.Engine.tool_call_syntax`: none of its own by default."""
        return None

    @property
    def model_name(self) -> str:
        """``option.model_id`` (a folder's name when it is a local path), else the model folder's name."""
        model_id = self.config.model_id
        if model_id:
            return Path(model_id).name if model_id.startswith(("/", ".", "~")) else model_id
        return self.config.model_dir.name if self.config.model_dir else "model"
