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

``--w8a8`` measures issue 56's combined goal instead: four servers at once, loaded in turn round by
round (the order reversed every other round): LMI-Dist fp32 without speculation, LMI-Dist on the W8A8
folder that `lmforge compile --quantize w8a8` makes from it (timed) without and with n-gram speculation
(:data:`SPECULATION`), and vLLM-CPU fp32 through `lmforge serve` (``option.rolling_batch=vllm`` with
bench/frontend_overhead.py's engine settings, as bench/quantized.py runs it). Concurrency 1 unless
``--concurrency`` says more, both workloads; goals: W8A8 + n-gram on the input-grounded workload at
concurrency 1 >= :data:`GOAL_W8A8_VS_FP32` x LMI-Dist fp32 and >= :data:`GOAL_W8A8_VS_VLLM` x vLLM fp32.
Its result is ``speculative-w8a8-smollm2-135m.json``.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speculative --w8a8 [--rounds 2] [--concurrency 1 8]

``--model tiny`` runs any of them on the tiny example model (a check of the harness, not a figure;
give ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench import record
from bench.frontend_overhead import lmforge_server, server_env
from bench.models import DESCRIPTIONS, MODELS, SMOLLM2, result_name, write_model
from lmforge.bench.results import machine, versions

RESULTS = record.RESULTS
BASE = "speculative"
NAME = result_name(BASE, SMOLLM2)
CONCURRENCIES = (1, 8, 32)
REQUESTS = {1: 4, 8: 16, 32: 32}
SPECULATION = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
DRAFT_BASE = "speculative-draft"
DRAFT_NAME = result_name(DRAFT_BASE, SMOLLM2)
DRAFT_SPECULATION = {"method": "draft_model", "num_speculative_tokens": 4, "model": "draft"}
"""The draft-model proposer: ``model`` is the ``draft/`` folder inside the model folder."""
DRAFT_LAYERS = 8
"""SmolLM2-135M's first 8 of 30 decoder layers (the embeddings and LM head, 28 M of its 135 M
parameters, are the draft's too)."""
TARGET_GROUNDED_C1 = 1.8
"""The issue's goal: input-grounded output tok/s at concurrency 1, on / off."""
TARGET_NO_LOSS = 0.98
"""... and no loss on open chat."""
#: LMI-Dist's settings, with speculation on and off (the W8A8 folder of ``--w8a8`` inherits them)
LMI_DIST_PROPERTIES = (
    "option.rolling_batch=lmi-dist\noption.dtype=fp32\noption.max_rolling_batch_size=32\n"
    "option.max_model_len=2048\n"
)

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
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=None, help="default 1 8 32 (with --w8a8: 1)"
    )
    parser.add_argument(
        "--w8a8",
        action="store_true",
        help="W8A8 + n-gram vs LMI-Dist fp32 and vLLM-CPU fp32 (issue 56's combined goal)",
    )
    parser.add_argument("--model", choices=MODELS, default=SMOLLM2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.w8a8:
        if args.proposer != "ngram":
            parser.error("--w8a8 measures n-gram speculation: leave out --proposer")
        main_w8a8(args)
        return
    draft = args.proposer == "draft_model"
    name = result_name(DRAFT_BASE if draft else BASE, args.model)
    spec = DRAFT_SPECULATION if draft else SPECULATION
    out = args.out or RESULTS / f"{name}.json"
    concurrencies = tuple(args.concurrency or CONCURRENCIES)
    started = time.monotonic()
    runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = {
        w: {c: {"off": [], "on": []} for c in concurrencies} for w in WORKLOADS
    }
    properties = LMI_DIST_PROPERTIES
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        off_dir = tmp / "off"
        write_model(args.model, off_dir)
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
                            print(f"round {r + 1} {workload:<15} c={c} {label:<3} {_line(rec)}", flush=True)
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
    flags = f" --proposer draft_model --draft-layers {args.draft_layers}" if draft else ""
    command = _command(flags, concurrencies, CONCURRENCIES, args.model)
    result = {
        "name": name,
        "command": command,
        "rows": rows,
        "settings": {
            "model": DESCRIPTIONS[args.model],
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


def _line(rec: dict[str, Any]) -> str:
    """One measurement, as the run prints it."""
    if "empty_reading" in rec:
        return f"EMPTY READING: {rec['empty_reading']}"
    extra = (
        f" acceptance {rec['acceptance']:.2f} mean accepted length {rec['mean_accepted_length']:.2f}"
        if "acceptance" in rec
        else ""
    )
    return f"{rec['output_throughput']:6.1f} tok/s {rec['ms_per_token']:6.1f} ms/token{extra}"


# ------------------------------------------------------------------ --w8a8: W8A8 + n-gram vs the peers

W8A8_BASE = "speculative-w8a8"
#: the servers of ``--w8a8``, in the order they are loaded (reversed every other round)
FP32, W8A8, W8A8_NGRAM, VLLM = "lmi-dist fp32", "lmi-dist w8a8", "lmi-dist w8a8 ngram", "vllm fp32"
W8A8_LABELS = (FP32, W8A8, W8A8_NGRAM, VLLM)
#: the one that speculates (its /metrics give acceptance and accepted length)
SPECULATING = W8A8_NGRAM
W8A8_CONCURRENCIES = (1,)
GOAL_W8A8_VS_FP32 = 3.0
"""Issue 56: W8A8 + speculation on the input-grounded workload at concurrency 1 >= 3x LMI-Dist fp32 ..."""
GOAL_W8A8_VS_VLLM = 2.5
"""... and >= 2.5x vLLM-CPU fp32."""
#: measurements more of a cell that raised or gave no tokens, before it is recorded as failed
REMEASURES = 1


def measure_cell(run: Callable[[], dict[str, Any]], cell: str) -> dict[str, Any]:
    """``run()`` (one measurement), again up to :data:`REMEASURES` times while it raises or counts no
    output tokens; the last failure comes back as ``{"empty_reading": why}``, which the medians leave
    out and the report names, instead of a crash that loses every other cell of the run."""
    problem = ""
    for attempt in range(1 + REMEASURES):
        try:
            rec = run()
            if rec.get("tokens"):
                return rec
            problem = "no output tokens"
        except Exception as exc:  # a server gone or a refused request: a failed reading, not a lost run
            problem = f"measure raised {exc!r}"[:300]
        then = f"remeasuring ({attempt + 1}/{REMEASURES})" if attempt < REMEASURES else "recorded as failed"
        print(f"{cell} EMPTY READING: {problem}; {then}", flush=True)
    return {"empty_reading": problem}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize_w8a8(workload: str, concurrency: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One cell's medians over the rounds, each server's good readings only (a server whose every round
    failed is None there, and so are the ratios it enters); ``failed_cells`` names the failed readings.

    ``vs_fp32`` / ``vs_vllm``: W8A8 + n-gram over LMI-Dist fp32 / vLLM fp32 (the goals);
    ``w8a8_vs_fp32``: W8A8 alone over fp32; ``speculation_gain``: W8A8 + n-gram over W8A8 alone."""
    good = {k: [x for x in v if "empty_reading" not in x] for k, v in runs.items()}
    tput = {k: _median([x["output_throughput"] for x in v]) for k, v in good.items()}
    spec = good.get(SPECULATING, [])
    row: dict[str, Any] = {
        "workload": workload,
        "concurrency": concurrency,
        "output_throughput": tput,
        "ms_per_token": {k: _median([x["ms_per_token"] for x in v]) for k, v in good.items()},
        "acceptance": _median([x["acceptance"] for x in spec]),
        "mean_accepted_length": _median([x["mean_accepted_length"] for x in spec]),
        "vs_fp32": _ratio(tput.get(W8A8_NGRAM), tput.get(FP32)),
        "vs_vllm": _ratio(tput.get(W8A8_NGRAM), tput.get(VLLM)),
        "w8a8_vs_fp32": _ratio(tput.get(W8A8), tput.get(FP32)),
        "speculation_gain": _ratio(tput.get(W8A8_NGRAM), tput.get(W8A8)),
    }
    failed = {
        k: [x["empty_reading"] for x in v if "empty_reading" in x]
        for k, v in runs.items()
        if any("empty_reading" in x for x in v)
    }
    if failed:
        row["failed_cells"] = failed
    return row


def _weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def _compile_w8a8(source: Path, out: Path) -> float:
    """`lmforge compile SOURCE --quantize w8a8 -o OUT` (as bench/quantized.py runs it); its seconds."""
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "lmforge", "compile", str(source), "--quantize", "w8a8", "-o", str(out)]
    subprocess.run(cmd, check=True)
    return time.monotonic() - t0


def main_w8a8(args: argparse.Namespace) -> None:
    from bench.frontend_overhead import properties as vllm_properties

    name = result_name(W8A8_BASE, args.model)
    out = args.out or RESULTS / f"{name}.json"
    concurrencies = tuple(args.concurrency or W8A8_CONCURRENCIES)
    started = time.monotonic()
    spec_line = f"option.speculative_config={json.dumps(SPECULATION)}\n"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        dirs = {FP32: tmp / "fp32", W8A8: tmp / "w8a8", W8A8_NGRAM: tmp / "w8a8-ngram", VLLM: tmp / "vllm"}
        write_model(args.model, dirs[FP32])
        (dirs[FP32] / "serving.properties").write_text(LMI_DIST_PROPERTIES)
        compile_s = _compile_w8a8(dirs[FP32], dirs[W8A8])
        shutil.copytree(dirs[W8A8], dirs[W8A8_NGRAM])
        props = dirs[W8A8_NGRAM] / "serving.properties"
        props.write_text(props.read_text() + spec_line)
        shutil.copytree(dirs[FP32], dirs[VLLM])
        (dirs[VLLM] / "serving.properties").write_text(vllm_properties(args.model))
        weights = {k: _weight_bytes(d) for k, d in dirs.items()}
        env = server_env(tmp / "cache")
        runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = {
            w: {c: {k: [] for k in W8A8_LABELS} for c in concurrencies} for w in WORKLOADS
        }
        with contextlib.ExitStack() as stack:
            servers = {k: stack.enter_context(lmforge_server(dirs[k], env)) for k in W8A8_LABELS}
            print(f"servers up after {time.monotonic() - started:.0f} s", flush=True)
            for label, srv in servers.items():  # one unmeasured pass each
                measure(srv.url, WORKLOADS["open-chat"], 1, 16, label == SPECULATING)
            for r in range(args.rounds):
                for workload, prompts in WORKLOADS.items():
                    for c in concurrencies:
                        order = list(W8A8_LABELS) if r % 2 == 0 else list(reversed(W8A8_LABELS))
                        for label in order:
                            cell = f"round {r + 1} {workload:<15} c={c} {label:<20}"
                            url, spec = servers[label].url, label == SPECULATING
                            rec = measure_cell(
                                functools.partial(measure, url, prompts, c, args.max_tokens, spec), cell
                            )
                            runs[workload][c][label].append(rec)
                            print(f"{cell} {_line(rec)}", flush=True)
    rows = [summarize_w8a8(w, c, runs[w][c]) for w in WORKLOADS for c in concurrencies]
    command = _command(" --w8a8", concurrencies, W8A8_CONCURRENCIES, args.model)
    result = {
        "name": name,
        "command": command,
        "rows": rows,
        "settings": {
            "model": DESCRIPTIONS[args.model],
            "proposer": "ngram",
            "speculative_config": SPECULATION,
            "lmi_dist_properties": LMI_DIST_PROPERTIES.strip().splitlines(),
            "vllm_properties": vllm_properties(args.model).strip().splitlines(),
            "requests": {c: REQUESTS.get(c, c) for c in concurrencies},
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
        },
        "compile_s": round(compile_s, 1),
        "weight_bytes": weights,
        "machine": machine(),
        "versions": versions(),
        "wall_s": round(time.monotonic() - started, 1),
        "runs": {w: {str(c): v for c, v in x.items()} for w, x in runs.items()},
    }
    record.write(out, result, section_w8a8)
    print(report_w8a8(result))


def _cell(row: dict[str, Any], label: str) -> str:
    tput, ms = row["output_throughput"][label], row["ms_per_token"][label]
    return "failed (no reading)" if tput is None else f"{tput:.1f} ({ms:.0f} ms/token)"


def _times(ratio: float | None, bold: bool = True) -> str:
    if ratio is None:
        return "n/a (a reading failed)"
    return f"**{ratio:.2f}x**" if bold else f"{ratio:.2f}x"


def _plain(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report_w8a8(result: dict[str, Any]) -> str:
    s = result["settings"]
    head = [
        "workload",
        "concurrency",
        *(f"{label} tok/s" for label in W8A8_LABELS),
        "W8A8 + n-gram / fp32",
        "W8A8 + n-gram / vLLM fp32",
        "W8A8 / fp32",
        "n-gram gain on W8A8",
        "acceptance",
        "mean accepted length",
    ]
    lines = [
        [
            r["workload"],
            str(r["concurrency"]),
            *(_cell(r, label) for label in W8A8_LABELS),
            _times(r["vs_fp32"]),
            _times(r["vs_vllm"]),
            _times(r["w8a8_vs_fp32"], bold=False),
            _times(r["speculation_gain"], bold=False),
            _plain(r["acceptance"]),
            _plain(r["mean_accepted_length"]),
        ]
        for r in result["rows"]
    ]
    failed = [
        f"- {r['workload']} c={r['concurrency']} {label}: {len(why)} failed reading(s), {why[-1]}"
        for r in result["rows"]
        for label, why in r.get("failed_cells", {}).items()
    ]
    notes = f"\n{result['notes']}\n" if result.get("notes") else ""
    if failed:
        notes += (
            f"\nReadings that failed after {REMEASURES} remeasure (left out of the medians):\n"
            + "\n".join(failed)
            + "\n"
        )
    wb = result["weight_bytes"]
    requests = ", ".join(f"{n} at {c}" for c, n in s["requests"].items())
    title = f"Speculative decoding on a W8A8 model vs LMI-Dist fp32 and vLLM-CPU fp32, {_key(s)}"
    spec = json.dumps(s["speculative_config"])
    return f"""## {title} (`bench/speculative.py --w8a8`)

{s["model"]}: LMI-Dist fp32 without speculation; LMI-Dist on the W8A8 folder `lmforge compile
--quantize w8a8` made from it in {result["compile_s"]:.0f} s ({wb[W8A8] / 2**20:.0f} MiB of weights vs
{wb[FP32] / 2**20:.0f} MiB), without and with `option.speculative_config={spec}`;
vLLM-CPU fp32 through `lmforge serve` (`{" ".join(s["vllm_properties"])}`). Greedy chat requests of
{s["max_tokens"]} tokens at most, the n-gram section's workloads
(input-grounded, open chat); the four servers up at once,
loaded in turn for {s["rounds"]} rounds (the order reversed every other round), medians; requests per
run {requests}. Cells: output tok/s (mean time per output token of a request, prefill included).
Goals (issue 56): W8A8 + n-gram on the input-grounded workload at concurrency 1 >= {GOAL_W8A8_VS_FP32}x
LMI-Dist fp32 and >= {GOAL_W8A8_VS_VLLM}x vLLM-CPU fp32. Result: `bench/results/{result["name"]}.json`.

{record.table(head, lines)}
{notes}"""


def _key(settings: dict[str, Any]) -> str:
    return next((k for k, v in DESCRIPTIONS.items() if v == settings["model"]), settings["model"])


def section_w8a8(result: dict[str, Any]) -> dict[str, Any]:
    row = next(
        (r for r in result["rows"] if r["workload"] == "input-grounded" and r["concurrency"] == 1), None
    )
    wanted: list[tuple[str, float | None, float]] = []
    if row is not None:
        wanted = [
            (
                "Speculation (n-gram) on W8A8, input-grounded c=1: / LMI-Dist fp32",
                row["vs_fp32"],
                GOAL_W8A8_VS_FP32,
            ),
            (
                "Speculation (n-gram) on W8A8, input-grounded c=1: / vLLM-CPU fp32",
                row["vs_vllm"],
                GOAL_W8A8_VS_VLLM,
            ),
        ]
    # a goal whose reading failed has no figure: the report names the failed cell instead
    summary = [record.summary_row(name, v, goal) for name, v, goal in wanted if v is not None]
    return record.section(record.ORDER["speculative"] + 2, report_w8a8(result), summary)


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


def _command(flags: str, concurrencies: list[int] | tuple[int, ...], default: Any, model: str) -> str:
    """The command line that reruns a measurement: ``flags``, then what differs from the defaults."""
    command = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.speculative" + flags
    if tuple(concurrencies) != tuple(default):
        command += " --concurrency " + " ".join(map(str, concurrencies))
    if model != SMOLLM2:
        command += f" --model {model}"
    return command


if __name__ == "__main__":
    main()
