"""Speculative decoding on LMI-Dist: n-gram prompt lookup off vs on, SmolLM2-135M, concurrency 1, 8, 32.

Two `lmforge serve` servers at once on the same folder, one with ``option.speculative_config`` (n-gram,
:data:`SPECULATION`), one without, loaded alternately round by round (the order flips each round), with
greedy chat requests of two workloads:

* **input-grounded**: rewrite or repeat code that is in the prompt (what prompt lookup is for);
* **open chat**: questions whose answers are not in the prompt.

Per run: output tokens/s (completion tokens over the run's wall time), the mean time per output token
of a request (its latency over its tokens, prefill included), and, from the speculating server's
``/metrics`` counters before and after, the acceptance rate (accepted / proposed drafts) and the mean
accepted length (tokens a speculating request-step emitted: accepted drafts + 1). Medians over rounds.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speculative [--rounds 2] [--max-tokens 96]

``--proposer draft_model`` measures the draft-model proposer instead (:data:`DRAFT_SPECULATION`): the
draft is SmolLM2-135M's first ``--draft-layers`` decoder layers with its embeddings, final norm and LM
head (:func:`lmforge.models.truncate.write_truncated_model`: no training), written as a model folder of
its own; ``--concurrency 1 8`` limits the runs. Its result is ``speculative-draft-smollm2-135m.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import record
from bench.frontend_overhead import lmforge_server, server_env
from bench.models import DESCRIPTIONS, SMOLLM2, write_model
from lmforge.bench.results import machine, versions

RESULTS = record.RESULTS
NAME = "speculative-smollm2-135m"
CONCURRENCIES = (1, 8, 32)
REQUESTS = {1: 4, 8: 16, 32: 32}
SPECULATION = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
DRAFT_NAME = "speculative-draft-smollm2-135m"
DRAFT_SPECULATION = {"method": "draft_model", "num_speculative_tokens": 4, "model": "draft"}
"""The draft-model proposer: ``model`` is the ``draft/`` folder inside the model folder."""
DRAFT_LAYERS = 8
"""SmolLM2-135M's first 8 of 30 decoder layers (the embeddings and LM head, 28 M of its 135 M
parameters, are the draft's too)."""
TARGET_GROUNDED_C1 = 1.8
"""The issue's goal: input-grounded output tok/s at concurrency 1, on / off."""
TARGET_NO_LOSS = 0.98
"""... and no loss on open chat."""

_FUNCTIONS = [
    (
        "merge_sorted",
        "a, b",
        [
            "result = []",
            "i = j = 0",
            "while i < len(a) and j < len(b):",
            "    if a[i] <= b[j]:",
            "        result.append(a[i])",
            "        i += 1",
            "    else:",
            "        result.append(b[j])",
            "        j += 1",
            "result.extend(a[i:])",
            "result.extend(b[j:])",
            "return result",
        ],
    ),
    (
        "count_words",
        "text",
        [
            "counts = {}",
            "for word in text.split():",
            "    word = word.lower()",
            "    counts[word] = counts.get(word, 0) + 1",
            "return counts",
        ],
    ),
    (
        "flatten",
        "items",
        [
            "out = []",
            "for item in items:",
            "    if isinstance(item, list):",
            "        out.extend(flatten(item))",
            "    else:",
            "        out.append(item)",
            "return out",
        ],
    ),
    (
        "moving_average",
        "values, window",
        [
            "if window <= 0:",
            "    raise ValueError('window must be positive')",
            "averages = []",
            "for i in range(len(values) - window + 1):",
            "    averages.append(sum(values[i:i + window]) / window)",
            "return averages",
        ],
    ),
]
_ASKS = [
    "Rewrite this Python function with type hints and a docstring; keep the body exactly the same.",
    "Rename the function to snake_case_v2 and repeat the rest of the code unchanged.",
    "Add a comment above each line of this function; do not change the code.",
    "Repeat this code exactly, then say in one sentence what it does.",
]
OPEN_CHAT = [
    "Why is the sky blue? Explain to a ten-year-old.",
    "Write a short poem about autumn leaves.",
    "Give three tips for learning a new language.",
    "What are the main differences between cats and dogs as pets?",
    "Describe a day in the life of a lighthouse keeper.",
    "How does a refrigerator keep food cold?",
    "Suggest a name and a slogan for a new coffee shop.",
    "What should I pack for a weekend hiking trip?",
]


def grounded_prompts() -> list[str]:
    out = []
    for i in range(8):
        name, args, body = _FUNCTIONS[i % len(_FUNCTIONS)]
        code = f"def {name}({args}):\n" + "\n".join("    " + line for line in body)
        out.append(f"{_ASKS[i % len(_ASKS)]}\n\n```python\n{code}\n```")
    return out


WORKLOADS = {"input-grounded": grounded_prompts(), "open-chat": OPEN_CHAT}


def _counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        # the engine's series (the per-proposer ones, speculative_proposer_*{proposer=...}, equal them)
        if line.startswith("lmforge_engine_speculative_") and "{" not in line:
            key, value = line.split()[0], line.split()[-1]
            out[key.removeprefix("lmforge_engine_speculative_")] = float(value)
    return out


async def _run(url: str, prompts: list[str], concurrency: int, n: int, max_tokens: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    per_token: list[float] = []
    tokens = 0

    async def one(client: httpx.AsyncClient, prompt: str) -> None:
        nonlocal tokens
        async with sem:
            body = {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            started = time.perf_counter()
            resp = await client.post(url + "/v1/chat/completions", json=body)
            took = time.perf_counter() - started
            resp.raise_for_status()
            got = resp.json()["usage"]["completion_tokens"]
            tokens += got
            per_token.append(1000 * took / max(got, 1))

    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        await asyncio.gather(*(one(client, prompts[i % len(prompts)]) for i in range(n)))
        wall = time.perf_counter() - started
    return {
        "output_throughput": tokens / wall,
        "tokens": tokens,
        "wall_s": wall,
        "ms_per_token": statistics.mean(per_token),
    }


def measure(
    url: str, prompts: list[str], concurrency: int, max_tokens: int, speculating: bool
) -> dict[str, Any]:
    before = _counters(url) if speculating else {}
    rec = asyncio.run(_run(url, prompts, concurrency, REQUESTS.get(concurrency, concurrency), max_tokens))
    if speculating:
        after = _counters(url)
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        proposed, accepted = delta.get("proposed_tokens_total", 0.0), delta.get("accepted_tokens_total", 0.0)
        steps, emitted = delta.get("steps_total", 0.0), delta.get("emitted_tokens_total", 0.0)
        rec["acceptance"] = accepted / proposed if proposed else 0.0
        rec["mean_accepted_length"] = emitted / steps if steps else 0.0
        rec["speculated_share"] = emitted / rec["tokens"] if rec["tokens"] else 0.0
    return rec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--proposer", choices=("ngram", "draft_model"), default="ngram")
    parser.add_argument("--draft-layers", type=int, default=DRAFT_LAYERS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    draft = args.proposer == "draft_model"
    name = DRAFT_NAME if draft else NAME
    spec = DRAFT_SPECULATION if draft else SPECULATION
    out = args.out or RESULTS / f"{name}.json"
    concurrencies = tuple(args.concurrency)
    started = time.monotonic()
    runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = {
        w: {c: {"off": [], "on": []} for c in concurrencies} for w in WORKLOADS
    }
    properties = (
        "option.rolling_batch=lmi-dist\noption.dtype=fp32\noption.max_rolling_batch_size=32\n"
        "option.max_model_len=2048\n"
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        off_dir = tmp / "off"
        write_model(SMOLLM2, off_dir)
        (off_dir / "serving.properties").write_text(properties)
        on_dir = tmp / "on"
        shutil.copytree(off_dir, on_dir)
        if draft:
            from lmforge.models.truncate import write_truncated_model

            write_truncated_model(off_dir, on_dir / "draft", args.draft_layers)
        (on_dir / "serving.properties").write_text(
            properties + f"option.speculative_config={json.dumps(spec)}\n"
        )
        env = server_env(tmp / "cache")
        with lmforge_server(off_dir, env) as off, lmforge_server(on_dir, env) as on:
            urls = {"off": off.url, "on": on.url}
            for label, url in urls.items():  # one unmeasured pass
                measure(url, WORKLOADS["open-chat"], 1, 16, label == "on")
            for r in range(args.rounds):
                for workload, prompts in WORKLOADS.items():
                    for c in concurrencies:
                        order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
                        for label in order:
                            rec = measure(urls[label], prompts, c, args.max_tokens, label == "on")
                            runs[workload][c][label].append(rec)
                            extra = (
                                f" acceptance {rec['acceptance']:.2f}"
                                f" mean accepted length {rec['mean_accepted_length']:.2f}"
                                if label == "on"
                                else ""
                            )
                            print(
                                f"round {r + 1} {workload:<15} c={c} {label:<3} "
                                f"{rec['output_throughput']:6.1f} tok/s "
                                f"{rec['ms_per_token']:6.1f} ms/token{extra}",
                                flush=True,
                            )
    rows = []
    for workload in WORKLOADS:
        for c in concurrencies:
            got = runs[workload][c]
            med = {k: statistics.median(x["output_throughput"] for x in v) for k, v in got.items()}
            rows.append(
                {
                    "workload": workload,
                    "concurrency": c,
                    "output_throughput": med,
                    "ms_per_token": {
                        k: statistics.median(x["ms_per_token"] for x in v) for k, v in got.items()
                    },
                    "acceptance": statistics.median(x["acceptance"] for x in got["on"]),
                    "mean_accepted_length": statistics.median(x["mean_accepted_length"] for x in got["on"]),
                    "ratio": med["on"] / med["off"],
                }
            )
    command = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.speculative"
    if draft:
        command += f" --proposer draft_model --draft-layers {args.draft_layers}"
    if concurrencies != CONCURRENCIES:
        command += " --concurrency " + " ".join(map(str, concurrencies))
    result = {
        "name": name,
        "command": command,
        "rows": rows,
        "settings": {
            "model": DESCRIPTIONS[SMOLLM2],
            "proposer": args.proposer,
            **({"draft": f"SmolLM2-135M's first {args.draft_layers} of 30 decoder layers"} if draft else {}),
            "speculative_config": spec,
            "properties": properties.strip().splitlines(),
            "requests": REQUESTS,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
        },
        "machine": machine(),
        "versions": versions(),
        "wall_s": round(time.monotonic() - started, 1),
        "runs": {w: {str(c): v for c, v in x.items()} for w, x in runs.items()},
    }
    record.write(out, result, section)
    print(report(result))


def _row(result: dict[str, Any], workload: str, c: int) -> dict[str, Any]:
    return next(r for r in result["rows"] if r["workload"] == workload and r["concurrency"] == c)


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"| {r['workload']} | {r['concurrency']} "
        f"| {r['output_throughput']['off']:.1f} / {r['output_throughput']['on']:.1f} "
        f"| **{r['ratio']:.2f}x** | {r['ms_per_token']['off']:.1f} / {r['ms_per_token']['on']:.1f} "
        f"| {r['acceptance']:.2f} | {r['mean_accepted_length']:.2f} |"
        for r in result["rows"]
    ]
    notes = f"\n{result['notes']}\n" if result.get("notes") else ""
    requests = ", ".join(f"{n} at {c}" for c, n in s["requests"].items())
    head = "| workload | concurrency | out tok/s off / on | on / off | ms per token off / on | acceptance |"
    proposer = s.get("proposer", "ngram")
    title = ", a draft model proposing" if proposer == "draft_model" else ""
    draft = f"The draft: {s['draft']} (no training), its own model folder.\n" if s.get("draft") else ""
    return f"""## Speculative decoding on LMI-Dist{title}, smollm2-135m (`bench/speculative.py`)

{draft}{s["model"]} on LMI-Dist through `lmforge serve`, greedy chat requests of {s["max_tokens"]} tokens
at most,
two servers at once (speculation off, and `option.speculative_config={json.dumps(s["speculative_config"])}`),
loaded alternately for {s["rounds"]} rounds, medians; requests per run {requests}.
Input-grounded: rewrite or repeat code that is in the prompt; open chat: answers not in the prompt.
Acceptance = accepted / proposed drafts; mean accepted length = tokens a speculating request-step
emitted (accepted drafts + 1). Result:
`bench/results/{result["name"]}.json`.

{head} mean accepted length |
| --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(lines)}
{notes}"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    proposer = result["settings"].get("proposer", "ngram")
    which = "draft model" if proposer == "draft_model" else "n-gram"
    grounded = _row(result, "input-grounded", 1)["ratio"]
    chat = min(r["ratio"] for r in result["rows"] if r["workload"] == "open-chat")
    summary = [
        record.summary_row(
            f"Speculation ({which}), input-grounded c=1: on / off output tok/s", grounded, TARGET_GROUNDED_C1
        ),
        record.summary_row(
            f"Speculation ({which}), open chat, lowest over concurrencies: on / off", chat, TARGET_NO_LOSS
        ),
    ]
    top = [r["ratio"] for r in result["rows"] if r["concurrency"] == max(CONCURRENCIES)]
    if top:
        summary.append(
            record.summary_row(
                f"Speculation ({which}), c={max(CONCURRENCIES)}, lowest workload: on / off",
                min(top),
                TARGET_NO_LOSS,
            )
        )
    order = record.ORDER["speculative"] + (1 if proposer == "draft_model" else 0)
    return record.section(order, report(result), summary)


if __name__ == "__main__":
    main()
