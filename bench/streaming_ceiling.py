"""Streaming ceiling: CPU microseconds per streamed token of the serving path, with a no-op engine.

Starts bench/noop_server.py (`lmforge serve`'s server with an engine that emits fixed tokens as fast
as they are taken, as ``python -m bench.noop_server``) on the example model's tokenizer in its own
process, streams requests to it from this process at several concurrencies, and divides the server
process's CPU time (user + system, all threads, from psutil) by the tokens streamed. The client is a
lean asyncio HTTP/1.1 client (keep-alive, one connection per concurrent stream, the body parsed and
checked after it ended), so the 2 cores go to the server. Variants: LMI jsonlines and SSE, each with
and without ``details``.

Usage: python -m bench.streaming_ceiling [--tokens 256] [--out bench/results/streaming-ceiling.json]
       [--before OLD.json]   (embed an earlier result's figures as "before")
Target: <= 20 us per token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import record

ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS
NAME = "streaming-ceiling"
TARGET_US = 20.0
VARIANTS = [
    {"framing": "jsonlines", "details": False},
    {"framing": "jsonlines", "details": True},
    {"framing": "sse", "details": False},
    {"framing": "sse", "details": True},
]
CONCURRENCY = (1, 16, 64)
TEST_ENV = {"OMP_NUM_THREADS": "1", "OPTION_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# ---------------------------------------------------------------------------------- pure pieces


def dechunk(data: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body (``data`` starts at the first chunk-size line)."""
    out = bytearray()
    pos = 0
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol].split(b";", 1)[0], 16)
        if size == 0:
            return bytes(out)
        start = eol + 2
        out += data[start : start + size]
        pos = start + size + 2


def stream_objects(payload: bytes, framing: str) -> list[dict[str, Any]]:
    """The JSON objects of a jsonlines or SSE (``data: ...`` events) body."""
    objs = []
    for line in payload.split(b"\n"):
        if not line.strip():
            continue
        if framing == "sse":
            if not line.startswith(b"data: "):
                raise ValueError(f"not an SSE data line: {line[:80]!r}")
            line = line[6:]
        objs.append(json.loads(line))
    return objs


def check_stream(objs: list[dict[str, Any]], tokens: int, details: bool) -> int:
    """Validate one LMI stream of ``tokens`` tokens; return the number of token lines."""
    got = sum(1 for o in objs if o.get("token") is not None)
    if got != tokens:
        raise AssertionError(f"expected {tokens} token lines, got {got}")
    last = objs[-1]
    if not isinstance(last.get("generated_text"), str):
        raise AssertionError(f"last line has no generated_text: {last}")
    if details:
        d = last.get("details") or {}
        if d.get("finish_reason") != "length" or d.get("generated_tokens") != tokens:
            raise AssertionError(f"bad details on the last line: {d}")
    elif last.get("details") is not None:
        raise AssertionError("details sent but not asked for")
    return got


def us_per_token(cpu_s: float, tokens: int) -> float:
    return cpu_s / tokens * 1e6 if tokens else float("nan")


# ---------------------------------------------------------------------------------- client


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs /invocations and reads a chunked stream."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes, accept: str) -> bytes:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST /invocations HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: {accept}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        headers = await self.reader.readuntil(b"\r\n\r\n")
        status = int(headers.split(b" ", 2)[1])
        if status != 200 or b"transfer-encoding: chunked" not in headers.lower():
            raise RuntimeError(f"unexpected response: {headers[:200]!r}")
        buf = bytearray()
        while not (buf.endswith(b"\r\n0\r\n\r\n") or buf == b"0\r\n\r\n"):
            chunk = await self.reader.read(65536)
            if not chunk:
                raise RuntimeError("server closed the connection mid-stream")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def run_level(
    host: str, port: int, framing: str, details: bool, concurrency: int, requests: int, tokens: int
) -> tuple[int, float]:
    """Send ``requests`` streaming requests, ``concurrency`` at a time; (token lines checked, wall s)."""
    body = json.dumps(
        {
            "inputs": "def fibonacci(n):\n    ",
            "parameters": {"max_new_tokens": tokens, "details": details},
            "stream": True,
        }
    ).encode()
    accept = "text/event-stream" if framing == "sse" else "application/jsonlines"
    todo = list(range(requests))
    counted = 0

    async def worker() -> None:
        nonlocal counted
        conn = Connection(host, port)
        try:
            while todo:
                todo.pop()
                raw = await conn.post(body, accept)
                counted += check_stream(stream_objects(dechunk(raw), framing), tokens, details)
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return counted, time.perf_counter() - t0


# ---------------------------------------------------------------------------------- driver


def server_cpu(proc: Any) -> tuple[float, float]:
    """(user, system) CPU seconds of the process, all threads."""
    t = proc.cpu_times()
    return float(t.user), float(t.system)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"no-op server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/ping", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError("no-op server did not become ready")


class Server:
    """bench/noop_server.py in its own process (``bare``: the minimal ASGI app on uvicorn, the floor)."""

    def __init__(self, model: Path, *, bare: bool = False) -> None:
        from lmforge.testing.server import free_port

        self.port = free_port()
        cmd = [sys.executable, "-m", "bench.noop_server", str(model), "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, "--bare"] if bare else cmd, cwd=ROOT, env={**os.environ, **TEST_ENV}
        )

    def __enter__(self) -> Server:
        import psutil

        wait_ready(f"http://127.0.0.1:{self.port}", self.proc)
        self.ps = psutil.Process(self.proc.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def level(
        self, framing: str, details: bool, conc: int, requests: int, tokens: int, rounds: int
    ) -> dict[str, Any]:
        """``rounds`` runs of one level; the figures are the median round (by CPU per token)."""
        samples = []
        for _ in range(rounds):
            u0, s0 = server_cpu(self.ps)
            counted, wall = asyncio.run(
                run_level("127.0.0.1", self.port, framing, details, conc, requests, tokens)
            )
            u1, s1 = server_cpu(self.ps)
            samples.append((us_per_token((u1 - u0) + (s1 - s0), counted), u1 - u0, s1 - s0, counted, wall))
        samples.sort()
        us, user, system, counted, wall = samples[len(samples) // 2]
        return {
            "framing": framing,
            "details": details,
            "concurrency": conc,
            "requests": requests,
            "tokens": counted,
            "us_per_token": us,
            "user_us_per_token": us_per_token(user, counted),
            "sys_us_per_token": us_per_token(system, counted),
            "tokens_per_s": counted / wall,
            "rounds_us_per_token": [round(x[0], 2) for x in samples],
        }


def show(label: str, row: dict[str, Any]) -> None:
    print(
        f"{label:24s} c={row['concurrency']:>3}: {row['us_per_token']:6.1f} us/token of server CPU "
        f"(user {row['user_us_per_token']:.1f}, sys {row['sys_us_per_token']:.1f}; "
        f"rounds {row['rounds_us_per_token']}), {row['tokens_per_s']:6.0f} tok/s",
        flush=True,
    )


def measure(model: Path, tokens: int, requests_per_level: int, rounds: int) -> dict[str, Any]:
    floor = []
    with Server(model, bare=True) as bare:
        bare.level("jsonlines", False, 4, 16, tokens, 1)  # warm-up
        for conc in CONCURRENCY:
            row = bare.level("jsonlines", False, conc, max(requests_per_level, conc * 2), tokens, rounds)
            floor.append(row)
            show("bare uvicorn (floor)", row)
    rows = []
    with Server(model) as srv:
        srv.level("jsonlines", False, 4, 64, 1, 1)  # warm-up
        # per-request cost: 1-token requests (parse, handler, headers, the final line)
        n_small = 400
        per_request_us = srv.level("jsonlines", False, 4, n_small, 1, rounds)["us_per_token"]
        print(f"per request (1 token, jsonlines): {per_request_us:.0f} us of server CPU", flush=True)
        for variant in VARIANTS:
            framing, details = str(variant["framing"]), bool(variant["details"])
            for conc in CONCURRENCY:
                row = srv.level(framing, details, conc, max(requests_per_level, conc * 2), tokens, rounds)
                rows.append(row)
                show(f"{framing} details={details}", row)
    worst = max(r["us_per_token"] for r in rows)
    return {"rows": rows, "floor": floor, "per_request_us": per_request_us, "worst_us_per_token": worst}


def main() -> None:
    from lmforge.bench.results import machine, versions
    from lmforge.models.example import write_example_model

    parser = argparse.ArgumentParser(description="CPU microseconds per streamed token, no-op engine")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per request")
    parser.add_argument("--requests", type=int, default=128, help="requests per level (at least 2 x conc)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per level; the median is kept")
    parser.add_argument("--out", type=Path, default=RESULTS / f"{NAME}.json")
    parser.add_argument("--before", type=Path, help="an earlier result to embed as the 'before' figures")
    parser.add_argument("--note", default="", help="what this run measures (e.g. the change under test)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = write_example_model(Path(tmp) / "tiny")
        figures = measure(model, args.tokens, args.requests, args.rounds)
    result: dict[str, Any] = {
        "name": NAME,
        "machine": machine(),
        "versions": versions(),
        "python_impl": platform.python_implementation(),
        "command": "python -m bench.streaming_ceiling"
        + (f" --tokens {args.tokens}" if args.tokens != 256 else ""),
        "settings": {
            "tokens_per_request": args.tokens,
            "rounds": args.rounds,
            "concurrency": list(CONCURRENCY),
            "engine": "bench/noop_server.py NoopEngine (example model tokenizer, fixed tokens)",
            "client": "asyncio HTTP/1.1, same machine, separate process",
        },
        "target_us_per_token": TARGET_US,
        **figures,
        "ratio": TARGET_US / figures["worst_us_per_token"],
        "note": args.note,
    }
    if args.before is not None:
        before = json.loads(args.before.read_text())
        result["before"] = {k: before[k] for k in ("rows", "per_request_us", "worst_us_per_token", "note")}
    record.write(args.out, result, section)
    met = "met" if result["ratio"] >= 1 else "MISSED"
    worst = figures["worst_us_per_token"]
    print(f"worst {worst:.1f} us/token (target {TARGET_US:.0f}: {met}); wrote {args.out}")


def report(r: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    s = r["settings"]
    head = (
        "| framing | details | concurrency | server CPU us/token | user / sys | tok/s (client-bound) |\n"
        "| --- | --- | --- | --- | --- | --- |\n"
    )
    rows = [
        f"| {x['framing']} | {'yes' if x['details'] else 'no'} | {x['concurrency']} "
        f"| **{x['us_per_token']:.1f}** "
        f"| {x.get('user_us_per_token', float('nan')):.1f} / {x.get('sys_us_per_token', float('nan')):.1f} "
        f"| {x['tokens_per_s']:.0f} |"
        for x in r["rows"]
    ]
    floor = r.get("floor") or []
    floor_text = ""
    if floor:
        floor_text = (
            "\nThe floor under lmforge, the same client against a bare ASGI app on the same uvicorn settings "
            "that streams one fixed line per event-loop turn (`noop_server.py --bare`, no lmforge code): "
            + ", ".join(f"{x['us_per_token']:.1f} us at concurrency {x['concurrency']}" for x in floor)
            + ". One `send()` system call per token (TCP on loopback) is most of it.\n"
        )
    before = r.get("before")
    before_text = ""
    if before:
        b_rows = {(x["framing"], x["details"], x["concurrency"]): x["us_per_token"] for x in before["rows"]}
        pairs = [
            f"{x['framing']}{'+details' if x['details'] else ''} c={x['concurrency']}: "
            f"{b_rows[(x['framing'], x['details'], x['concurrency'])]:.1f} -> {x['us_per_token']:.1f}"
            for x in r["rows"]
            if (x["framing"], x["details"], x["concurrency"]) in b_rows
        ]
        before_text = f"""
**Before / after.** Before ({before.get("note") or "the earlier run"}): worst
{before["worst_us_per_token"]:.1f} us/token, {before["per_request_us"]:.0f} us per request. After
({r.get("note") or "this run"}): worst {r["worst_us_per_token"]:.1f} us/token. Per variant (us/token):
{"; ".join(pairs)}.
"""
    notes = f"\n{r['notes']}\n" if r.get("notes") else ""
    return f"""## Streaming ceiling: CPU per streamed token (`bench/streaming_ceiling.py`)

The whole HTTP path of `lmforge serve` (uvicorn + `App` + the default handler + formatters) over a
no-op engine (`bench/noop_server.py`: the example model's real tokenizer, fixed tokens, one token per
event-loop turn, no model) in its own process; an asyncio HTTP/1.1 client on the same machine streams
{s["tokens_per_request"]} tokens per request. Figure: the server process's CPU time (user + system,
from psutil) / tokens streamed, median of {s.get("rounds", 1)} rounds (CPU time is counted in 10 ms
ticks: about +-0.5 us here). Target <= {r["target_us_per_token"]:.0f} us per token. Per-request cost (a
1-token request): {r["per_request_us"]:.0f} us. Result: `bench/results/streaming-ceiling.json`.

{head}{chr(10).join(rows)}
{floor_text}{before_text}
{notes}"""


def section(r: dict[str, Any]) -> dict[str, Any]:
    worst, target = r["worst_us_per_token"], r["target_us_per_token"]
    summary = {
        "scenario": "Streaming ceiling",
        "figure": f"{worst:.1f} us/token (worst variant)",
        "target": f"<= {target:.0f} us",
        "ratio": target / worst,
    }
    return record.section(record.ORDER["streaming_ceiling"], report(r), [summary])


if __name__ == "__main__":
    main()
