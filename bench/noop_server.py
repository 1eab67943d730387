"""`lmforge serve` with a no-op engine: the whole HTTP path, no model.

Usage: python bench/noop_server.py MODEL_DIR [--host H] [--port P] [--log-level L]

The server is the one `lmforge serve` builds (lmforge.serving.launcher.serve: uvicorn with the same
settings, lmforge.serving.app.App, the default handler and its formatters); only the engine differs.
:class:`NoopEngine` loads the model folder's real tokenizer (the handler tokenizes prompts with it, as
for a real engine) but no weights: it emits ``max_new_tokens`` tokens with fixed ids and texts, one per event
loop turn, as fast as the consumer takes them. Sampling parameters and stop strings are ignored;
every stream ends with ``finish_reason=length``. bench/streaming_ceiling.py uses it to measure the
CPU cost of the serving path per streamed token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any

from lmforge.engines.base import EngineBase
from lmforge.engines.protocol import (
    EngineStats,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    Token,
)
from lmforge.errors import EngineDeadError, NotReadyError

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

#: how many distinct fixed tokens the engine cycles through
FIXED_TOKENS = 16
LOG_PROB = -0.25
#: prompt + generated tokens a request may hold: no model limits it, the size checks still run
NO_MODEL_LEN = 1 << 16


class NoopEngine(EngineBase):
    """An :class:`lmforge.engines.protocol.Engine` that generates fixed tokens without a model."""

    name = "noop"

    def __init__(self, config: ServingConfig, extra_options: Mapping[str, str] | None = None) -> None:
        super().__init__(config, extra_options)
        self._tokens: list[Token] = []
        self._live: set[str] = set()
        self._running = False

    async def start(self) -> None:
        from transformers import AutoTokenizer

        path = self.config.model_path
        if path is None:
            raise NotReadyError("the no-op engine needs a local model folder for its tokenizer")
        self._tokenizer = AutoTokenizer.from_pretrained(str(path))
        special = set(self._tokenizer.all_special_ids)
        # Fixed, ordinary tokens from the middle of the vocabulary, with the text each decodes to.
        ids = [i for i in range(len(self._tokenizer) // 2, len(self._tokenizer)) if i not in special]
        # Token objects are made once: the engine's own cost per token stays a few attribute writes.
        self._tokens = [Token(i, self._tokenizer.decode([i]), LOG_PROB) for i in ids[:FIXED_TOKENS]]
        self.max_model_len = NO_MODEL_LEN
        self._running = True

    def check_health(self) -> None:
        if not self._running:
            raise EngineDeadError("the no-op engine is not running")

    def stats(self) -> EngineStats:
        return self._stats(len(self._live), healthy=self._running)

    async def shutdown(self) -> None:
        self._running = False

    async def _generate(
        self, request: GenerationRequest, params: SamplingParams
    ) -> AsyncGenerator[GenerationEvent, None]:
        rid = request.request_id
        prompt_len = len(request.prompt)
        n = params.max_new_tokens
        self._live.add(rid)
        try:
            for i in range(n):
                await asyncio.sleep(0)  # one event-loop turn per token, as an engine step would give
                if not self._running:
                    yield GenerationEvent(
                        None, prompt_len, i, FinishReason.ERROR, "the server is shutting down", 503
                    )
                    return
                last = i == n - 1
                yield GenerationEvent(
                    self._tokens[i % len(self._tokens)],
                    prompt_len,
                    i + 1,
                    FinishReason.LENGTH if last else None,
                )
            if n == 0:
                yield GenerationEvent(None, prompt_len, 0, finish_reason=FinishReason.LENGTH)
        finally:
            self._live.discard(rid)


#: the line a bare server streams per token: what lmforge sends for a plain LMI jsonlines token
BARE_LINE = b'{"token":{"id":1000,"text":" x","log_prob":-0.25},"generated_text":null,"details":null}\n'


async def bare_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A minimal ASGI app (no lmforge code): ``/ping``, and ``POST`` streams ``max_new_tokens`` fixed
    lines, one per event-loop turn. It measures the floor of uvicorn + the kernel under lmforge."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/ping":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    n = int(json.loads(body)["parameters"]["max_new_tokens"])
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/jsonlines")],
        }
    )
    for i in range(n):
        await asyncio.sleep(0)
        line = BARE_LINE if i < n - 1 else BARE_LINE.replace(b'"generated_text":null', b'"generated_text":""')
        await send({"type": "http.response.body", "body": line, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def main(argv: list[str] | None = None) -> int:
    from lmforge.serving.launcher import serve

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--bare", action="store_true", help="serve bare_app on uvicorn instead (the floor)")
    args = parser.parse_args(argv)
    if args.bare:
        import uvicorn

        # uvicorn's defaults as lmforge uses them: httptools parser, uvloop when installed
        config = uvicorn.Config(
            bare_app, host=args.host, port=args.port, log_level=args.log_level, access_log=False
        )
        uvicorn.Server(config).run()
        return 0
    return serve(
        args.model_dir, host=args.host, port=args.port, log_level=args.log_level, engine_factory=NoopEngine
    )


if __name__ == "__main__":
    sys.exit(main())
