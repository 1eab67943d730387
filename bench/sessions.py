"""Sticky sessions: the second turn of a chat with its prefix warm vs cold (TTFT).

A SageMaker session sends every turn of a conversation to one instance; there the engine's prefix
cache still holds the KV blocks of the previous turn, so the next turn only prefills what is new.
This measures what that is worth on one `lmforge serve` (LMI-Dist by default, or ``--engine vllm``)
with ``option.enable_stateful_sessions=true`` and the 135 M model (real weights, fp32):

* **warm**: open a session, send turn 1 (a long system prompt + a question), then turn 2 (turn 1,
  its answer and a follow-up) in the same session;
* **cold**: turn 2 of a conversation the server has never seen, of the same length.

Figure: TTFT of turn 2, median over ``--trials`` conversations, cold / warm. Each conversation has
its own system prompt, so nothing is shared between trials. Writes bench/results/sessions-<engine>.json.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.sessions [--engine lmi-dist|vllm] [--trials 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import record
from bench.models import DESCRIPTIONS, SMOLLM2, write_model

ROOT = Path(__file__).resolve().parent.parent

RESULTS = record.RESULTS
SYSTEM_WORDS = 420
ANSWER_TOKENS = 24
WORDS = (
    *("river", "stone", "garden", "lantern", "harbor", "meadow", "copper", "violet", "engine", "signal"),
    *("winter", "orchard", "canyon", "glacier", "market", "pepper", "silver", "thunder", "velvet"),
    *("compass", "marble", "island", "forest", "bridge", "candle", "falcon", "harvest", "ladder"),
    *("mirror", "needle", "ocean", "pillow", "quartz", "saddle", "tunnel", "walnut", "yellow", "zephyr"),
)


def system_prompt(seed: int) -> str:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(SYSTEM_WORDS)]
    return "You are a careful assistant. Background notes: " + " ".join(words) + "."


def ttft(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[float, str]:
    """Seconds to the first streamed token, and the reply's text."""
    start = time.perf_counter()
    first = None
    text = []
    with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            piece = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if piece is not None and first is None:
                first = time.perf_counter() - start
            text.append(piece or "")
    assert first is not None, "no token streamed"
    return first, "".join(text)


def turns(seed: int) -> tuple[list[dict[str, str]], str]:
    messages = [
        {"role": "system", "content": system_prompt(seed)},
        {"role": "user", "content": "Which three words appear most often in the notes?"},
    ]
    return messages, "And which word appears least often?"


def main() -> None:
    from lmforge.bench.results import machine, versions
    from lmforge.testing.server import TEST_ENV, VLLM_ENV, RemoteServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("lmi-dist", "vllm"), default="lmi-dist")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    properties = (
        f"option.rolling_batch={args.engine}\noption.dtype=fp32\noption.max_model_len=2048\n"
        "option.max_rolling_batch_size=8\noption.enable_stateful_sessions=true\n"
    )
    if args.engine == "vllm":
        properties += "option.enforce_eager=true\noption.enable_prefix_caching=true\n"
    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(SMOLLM2, Path(tmp) / "model")
        (model / "serving.properties").write_text(properties)
        env = {**TEST_ENV, **(VLLM_ENV if args.engine == "vllm" else {}), "VLLM_CACHE_ROOT": f"{tmp}/vllm"}
        with RemoteServer(model, env=env, startup_timeout=400) as server, httpx.Client(timeout=300) as client:
            chat = server.url + "/v1/chat/completions"
            ttft(client, chat, {"messages": turns(999)[0], "max_tokens": 2, "temperature": 0}, {})  # warm-up
            for trial in range(args.trials):
                opened = client.post(server.url + "/invocations", json={"requestType": "NEW_SESSION"})
                opened.raise_for_status()
                session = {
                    "X-Amzn-SageMaker-Session-Id": opened.headers["x-amzn-sagemaker-session-id"].split(";")[0]
                }
                messages, follow_up = turns(trial)
                first_ttft, answer = ttft(
                    client,
                    chat,
                    {"messages": messages, "max_tokens": ANSWER_TOKENS, "temperature": 0},
                    session,
                )
                second = [
                    *messages,
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": follow_up},
                ]
                warm, _ = ttft(client, chat, {"messages": second, "max_tokens": 4, "temperature": 0}, session)
                # the same second turn of a conversation the server has never seen (another system prompt)
                other, _ = turns(1000 + trial)
                unseen = [
                    *other,
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": follow_up},
                ]
                cold, _ = ttft(client, chat, {"messages": unseen, "max_tokens": 4, "temperature": 0}, {})
                client.post(server.url + "/invocations", json={"requestType": "CLOSE"}, headers=session)
                rows.append({"turn1_ttft_s": first_ttft, "warm_ttft_s": warm, "cold_ttft_s": cold})
                line = f"turn 1 {first_ttft:.3f} s, turn 2 warm {warm:.3f} s, cold {cold:.3f} s"
                print(f"trial {trial + 1}: {line}", flush=True)
    warm_med = statistics.median(r["warm_ttft_s"] for r in rows)
    cold_med = statistics.median(r["cold_ttft_s"] for r in rows)
    name = f"sessions-{args.engine}"
    result = {
        "name": name,
        "command": f"OMP_NUM_THREADS=1 .venv/bin/python -m bench.sessions --engine {args.engine}",
        "ratio": cold_med / warm_med,
        "warm_ttft_s_p50": warm_med,
        "cold_ttft_s_p50": cold_med,
        "settings": {
            "model": DESCRIPTIONS[SMOLLM2],
            "engine": args.engine,
            "properties": properties.strip().splitlines(),
            "system_prompt_words": SYSTEM_WORDS,
            "answer_tokens": ANSWER_TOKENS,
            "trials": args.trials,
        },
        "rows": rows,
        "machine": machine(),
        "versions": versions(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    out = RESULTS / f"{name}.json"
    record.write(out, result, section)
    summary = f"warm {warm_med:.3f} s, cold {cold_med:.3f} s, cold / warm {result['ratio']:.2f}x"
    print(f"turn 2 TTFT p50: {summary}; wrote {out}")


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    s = result["settings"]
    ms = [
        (r["turn1_ttft_s"] * 1000, r["warm_ttft_s"] * 1000, r["cold_ttft_s"] * 1000) for r in result["rows"]
    ]
    rows = "\n".join(f"| {i + 1} | {a:.0f} | {b:.0f} | {c:.0f} |" for i, (a, b, c) in enumerate(ms))
    return f"""## Sticky sessions: the second turn with its prefix warm (`bench/sessions.py`, {s["engine"]})

One `lmforge serve` ({s["engine"]}, {s["model"]}, `option.enable_stateful_sessions=true`). Per trial:
open a session, turn 1 (a {s["system_prompt_words"]}-word system prompt and a question,
{s["answer_tokens"]}-token answer), turn 2 (turn 1, its answer, a follow-up) in the same session
(**warm**: the engine's prefix cache still holds turn 1's KV blocks); then the same turn 2 of a
conversation the server never saw (**cold**: another system prompt, same length). Streamed chat,
TTFT = request sent -> first token. Result: `bench/results/{result["name"]}.json`.

| trial | turn 1 TTFT (ms) | turn 2 warm (ms) | turn 2 cold (ms) |
| --- | --- | --- | --- |
{rows}

Turn 2 TTFT p50: warm **{result["warm_ttft_s_p50"] * 1000:.0f} ms**, cold
{result["cold_ttft_s_p50"] * 1000:.0f} ms: **{result["ratio"]:.2f}x** faster with the session's prefix
warm. On SageMaker with more than one instance, that gain depends on sticky routing: without it a
turn lands on an instance that has never seen the conversation.
"""


#: turn-2 TTFT cold / warm that a kept prefix should reach
TARGET = 1.2


def section(result: dict[str, Any]) -> dict[str, Any]:
    engine = result["settings"]["engine"]
    what = f"turn-2 TTFT cold / warm, a session's prefix kept ({'vLLM' if engine == 'vllm' else 'LMI-Dist'})"
    summary = [
        record.summary_row(f"Sticky sessions ({what})", result["ratio"], float(result.get("target", TARGET)))
    ]
    return record.section(record.ORDER["sessions"] + (engine == "vllm"), report(result), summary)


if __name__ == "__main__":
    main()
