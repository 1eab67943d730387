"""Whether a crowd of streams is served together: judged from the order in which the client received
the tokens of all of them, not from when.

A server that batches N requests and streams each token as it comes delivers the crowd's tokens
interleaved: every stream's first token before any stream's last, and, while the first stream to
finish gets its last token, every other stream well into its own (all of them gain a token a step).
A frontend that starves some streams (a consumer that drains some requests' outputs before others, a
loop that writes one stream's backlog while the others wait) or an engine that serialises them shows
in that order; so does a queue, which is why the crowd must fit in the server's batch.

The order is the client's reading order, so the client must keep up: one that fell a whole stream
behind would read each stream's backlog in one burst. It needs a few milliseconds of CPU a decode step
for a crowd of 64; a false finding needs it to fall half the tokens behind (with 128 tokens, 64 steps).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Crowd:
    order: list[int]
    """The stream of each token line, in the order the client read them (one event loop: one order)."""
    tokens: int
    """The tokens each stream asked for (and, with ``ignore_eos_token``, got)."""
    streams: int


def findings(crowd: Crowd, *, share: float = 0.5) -> list[str]:
    """What in ``crowd.order`` says the streams were not served together: a stream whose first token
    came after another stream had all of its tokens, and a stream that had less than ``share`` of its
    tokens when the first stream to finish got its last one. Empty when they were."""
    out: list[str] = []
    counts = dict.fromkeys(range(crowd.streams), 0)
    first_at: dict[int, int] = {}
    first_done: int | None = None
    at_first_done: dict[int, int] = {}
    for at, stream in enumerate(crowd.order):
        counts[stream] += 1
        first_at.setdefault(stream, at)
        if first_done is None and counts[stream] == crowd.tokens:
            first_done = at
            at_first_done = dict(counts)
    missing = [s for s, n in counts.items() if n != crowd.tokens]
    if missing:
        out.append(f"streams {missing} did not get {crowd.tokens} tokens: {[counts[s] for s in missing]}")
    if first_done is None:
        return out
    late = sorted(s for s, at in first_at.items() if at > first_done)
    if late:
        out.append(f"streams {late} began after stream {crowd.order[first_done]} had all its tokens")
    behind = sorted(s for s in counts if s not in late and at_first_done.get(s, 0) < share * crowd.tokens)
    if behind:
        had = [at_first_done.get(s, 0) for s in behind]
        out.append(
            f"streams {behind} had {had} of {crowd.tokens} tokens when stream "
            f"{crowd.order[first_done]} had all of its own"
        )
    return out


async def _crowd(url: str, streams: int, tokens: int, prompt: str) -> Crowd:
    import aiohttp

    order: list[int] = []
    body = {
        "inputs": prompt,
        "parameters": {"max_new_tokens": tokens, "ignore_eos_token": True, "do_sample": False},
        "stream": True,
    }
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(stream: int) -> None:
            async with session.post(url + "/invocations", json=body) as resp:
                assert resp.status == 200, await resp.text()
                async for line in resp.content:
                    if line.strip() and json.loads(line).get("token") is not None:
                        order.append(stream)

        await asyncio.gather(*(one(i) for i in range(streams)))
    return Crowd(order=order, tokens=tokens, streams=streams)


def crowd(url: str, streams: int = 64, tokens: int = 64, prompt: str = "def fibonacci(n):") -> Crowd:
    """``streams`` LMI jsonlines streams of ``tokens`` tokens each, sent at once to ``url``; the order
    in which their token lines arrived."""
    return asyncio.run(_crowd(url, streams, tokens, prompt))
