"""Soak: the same concurrency-64 load, again and again, on one long-lived server of each kind; the
last run against the first.

A server that keeps state per request served, or whose per-step cost grows, slows as it serves; one
that starves some streams shows a bimodal TPOT. So ``vllm bench serve`` (chat route, the random
dataset of bench/vllm_bench_parity.py, 32 prompt / 64 output tokens, temperature 0) loads, in turn,
`lmforge serve` on vLLM, `vllm serve` (the reference) and `lmforge serve` on LMI-Dist, all up at once
with 64 sequences a batch, once unmeasured (a new server's first batches of 64) and then ``--runs``
times each; per run: output tok/s, the TPOT spread over the
requests (bench/vllm_bench_parity.py's ``tpot_spread``) and the server's RSS. The finding per server
is the median of the last third of its runs over the median of the first third (goal: at least 0.95, no
slowdown; single runs on a shared 2-core VM move by +-30 % with the host, so one run against one
says little) and any bimodal TPOT. Beside it, the work a request costs the server, measured in a way
the host's speed cancels out of: the server's CPU-seconds per request (frontend and engine core) over
the load generator's own CPU-seconds per request in the same run (the same client code doing the
same work every run, so its cost moves with the machine's speed, not with the server's state); a
server that keeps state per request served or whose per-step cost grows shows it there, whatever the
neighbours do. Writes ``bench/results/soak[-MODEL].json``.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.soak [--runs 9] [--model tiny|smollm2-135m]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import record
from bench.frontend_overhead import MAX_SEQS, VllmServer, server_env, settle, vllm_args, vllm_model
from bench.models import DESCRIPTIONS, MODELS, TINY, result_name
from bench.vllm_bench_parity import (
    BIMODAL_SHARE,
    SLOW_STREAM,
    VllmBench,
    bench_args,
    bimodal,
    git_describe,
    one_run,
    process_tree,
)

ROOT = Path(__file__).resolve().parent.parent

RESULTS = record.RESULTS
NAME = "soak"
CONCURRENCY = 64
PROMPTS = 384
SERVERS = ("lmforge-vllm", "vllm", "lmforge-lmi-dist")
#: the least the late runs' output tok/s over the early runs' may be, per server (no slowdown; faster
#: late runs are this machine's run-to-run spread, not a defect)
GOAL = 0.95


def thirds(values: list[float]) -> tuple[float, float]:
    """The medians of the first and of the last third of ``values`` (a run each at least)."""
    k = max(1, len(values) // 3)
    return statistics.median(values[:k]), statistics.median(values[-k:])


def work(run: dict[str, Any]) -> float | None:
    """The server's CPU per request (frontend and engine) over the load generator's in the same run."""
    cpu = run.get("cpu_ms_per_request") or {}
    if not cpu.get("client"):
        return None
    return (cpu["frontend"] + cpu["engine"]) / cpu["client"]


def lmi_dist_model(folder: Path, vllm_folder: Path) -> Path:
    """The same model with LMI-Dist's settings: the example model's, with the batch of the others."""
    from lmforge.models.example import SERVING_PROPERTIES

    shutil.copytree(vllm_folder, folder)
    text = SERVING_PROPERTIES.replace(
        "option.max_rolling_batch_size=32", f"option.max_rolling_batch_size={MAX_SEQS}"
    )
    assert f"max_rolling_batch_size={MAX_SEQS}" in text
    (folder / "serving.properties").write_text(text)
    return folder


def rss_mib(pid: int) -> float:
    """Resident memory of a server process and its children (the engine cores), MiB."""
    import psutil

    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return round(total / 2**20, 1)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    tput = [r["output_throughput"] for r in runs]
    early, late = thirds(tput)
    costs = [w for w in map(work, runs) if w is not None]
    work_early, work_late = thirds(costs) if costs else (None, None)
    return {
        "output_throughput_runs": [round(t, 1) for t in tput],
        "last_over_first": round(tput[-1] / tput[0], 3),
        "late_over_early": round(late / early, 3),
        "work_runs": [round(w, 2) for w in costs],
        # above 1: a request costs the server more late than early (against the same client's cost)
        "work_late_over_early": round(work_late / work_early, 3) if work_early else None,
        "spread": round((max(tput) - min(tput)) / statistics.median(tput), 3),
        "tpot_std_ms_runs": [r.get("tpot_spread", {}).get("std_ms") for r in runs],
        "tpot_p99_ms_runs": [r.get("p99_tpot_ms") for r in runs],
        "bimodal_runs": [i + 1 for i, r in enumerate(runs) if bimodal(r.get("tpot_spread", {}))],
        "rss_mib_runs": [r["rss_mib"] for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--model", choices=MODELS, default=TINY)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    from lmforge.bench.results import machine, versions
    from lmforge.testing.server import RemoteServer

    started = time.monotonic()
    bench = VllmBench()
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SERVERS}
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        vllm_dir = vllm_model(tmp / args.model, args.model)
        # the same folder name: the served model name the OpenAI routes check
        lmi_dir = lmi_dist_model(tmp / "lmi-dist" / args.model, vllm_dir)
        env = server_env(tmp / "vllm-cache")
        ref = VllmServer(vllm_dir, env, tmp / "vllm-serve.log", args.model)
        stack.callback(ref.stop)
        ours = RemoteServer(vllm_dir, env=env, wait_ready=False, startup_timeout=400).start()
        stack.callback(ours.stop)
        lmi = RemoteServer(lmi_dir, env=env, wait_ready=False, startup_timeout=400).start()
        stack.callback(lmi.stop)
        ours.wait_for_ping(200, 400)
        lmi.wait_for_ping(200, 400)
        ref.wait()
        targets = {
            "lmforge-vllm": (ours.url, ours.proc.pid),
            "vllm": (ref.url, ref.proc.pid),
            "lmforge-lmi-dist": (lmi.url, lmi.proc.pid),
        }
        print(f"servers up after {time.monotonic() - started:.0f} s", flush=True)
        command = ""
        # one run each, unmeasured, first: a new server's first batches of 64 are start-up, not soak
        for label in SERVERS:
            url, pid = targets[label]
            settle([p for _, server in targets.values() for p in process_tree(server)])
            warm = one_run(
                bench, bench_args(url, "chat", CONCURRENCY, vllm_dir, args.model, PROMPTS), pid, PROMPTS
            )
            print(f"warm-up {label:<17} {warm['output_throughput']:7.0f} tok/s", flush=True)
        for i in range(args.runs):
            order = SERVERS if i % 2 == 0 else SERVERS[::-1]
            for label in order:
                url, pid = targets[label]
                argv = bench_args(url, "chat", CONCURRENCY, vllm_dir, args.model, PROMPTS)
                command = " ".join(["vllm", "bench", "serve", *argv]).replace(url, "$URL")
                settle([p for _, server in targets.values() for p in process_tree(server)])
                rec = one_run(bench, argv, pid, PROMPTS)
                if rec.get("failed") or not rec.get("completed"):
                    raise SystemExit(f"{label} run {i + 1}: failed requests: {rec.get('errors')}")
                rec["rss_mib"] = rss_mib(pid)
                runs[label].append(rec)
                spread = rec.get("tpot_spread", {})
                print(
                    f"run {i + 1} {label:<17} {rec['output_throughput']:7.0f} tok/s  TPOT mean "
                    f"{rec['mean_tpot_ms']:.1f} std {spread.get('std_ms', 0):.1f} "
                    f"p99 {rec['p99_tpot_ms']:.1f} ms  slow streams {spread.get('slow_share', 0):.1%}  "
                    f"RSS {rec['rss_mib']:.0f} MiB",
                    flush=True,
                )
    rows = {label: summarize(runs[label]) for label in SERVERS}
    name = result_name(NAME, args.model)
    result = {
        "name": name,
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.soak"
        + (f" --model {args.model}" if args.model != TINY else ""),
        "commit": git_describe(),
        # the worst server's late runs over its early ones (the summary row's ratio: target 0.95)
        "ratio": min(row["late_over_early"] for row in rows.values()),
        "target": GOAL,
        "goal_last_over_first": GOAL,
        "rows": rows,
        "vllm_bench_serve": command,
        "settings": {
            "model": DESCRIPTIONS[args.model],
            "model_key": args.model,
            "concurrency": CONCURRENCY,
            "prompts": PROMPTS,
            "runs": args.runs,
            "vllm_serve_args": vllm_args(args.model),
            "slow_stream": SLOW_STREAM,
            "bimodal_share": BIMODAL_SHARE,
        },
        "versions": versions(),
        "machine": machine(),
        "wall_s": round(time.monotonic() - started, 1),
        "runs": runs,
    }
    out = args.out_dir / f"{name}.json"
    record.write(out, result, section)
    print(report(result))


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for a soak result."""
    from lmforge.bench.results import cpu_text

    s = result["settings"]
    low = result["goal_last_over_first"]
    lines = []
    for label, row in result["rows"].items():
        ratio = row.get("late_over_early", row["last_over_first"])
        ok = "met" if low <= ratio else "MISSED"
        runs = ", ".join(f"{t:.0f}" for t in row["output_throughput_runs"])
        cost = row.get("work_late_over_early")
        cost_text = "-" if cost is None else f"{cost:.2f}"

        std = ", ".join(f"{x:.1f}" for x in row["tpot_std_ms_runs"] if x is not None)
        rss = f"{row['rss_mib_runs'][0]:.0f} -> {row['rss_mib_runs'][-1]:.0f}"
        bimodal_runs = ", ".join(map(str, row["bimodal_runs"])) or "none"
        lines.append(
            f"| {label} | {runs} | **{ratio:.2f}** ({ok}) | {row['last_over_first']:.2f} | {cost_text} "
            f"| {std} | {bimodal_runs} | {rss} |"
        )
    columns = (
        "server", "output tok/s, run by run", "late / early", "last / first", "work late / early",
        "TPOT std by run (ms)", "bimodal runs", "RSS MiB",
    )  # fmt: skip
    head = f"| {' | '.join(columns)} |\n|{' --- |' * len(columns)}"
    model = "the example model" if s["model_key"] == TINY else DESCRIPTIONS[s["model_key"]]
    return f"""## Soak: one long-lived server, the same load {s["runs"]} times (`bench/soak.py`)

`vllm bench serve --backend openai-chat` at concurrency {s["concurrency"]} ({s["prompts"]} prompts a run), on
{model}, against each server in turn, all up at once with the same engine settings
(`{" ".join(s["vllm_serve_args"])}`; LMI-Dist with the example model's settings at the same batch).
Goal: the median output tok/s of the last third of the runs at least {low} of the first third's (no
slowdown; faster late runs are the run-to-run spread: one run moves by up to +-30 % with the host
here), and no bimodal TPOT (over
{s["bimodal_share"]:.0%} of streams at more than {s["slow_stream"]:g}x the median). "Work late / early": the
server's CPU per request over the load generator's CPU per request in the same run (the host's speed
cancels out), last third over first third: above 1 means a request costs the server more as it serves. Commit
`{result["commit"]}`, taken on {cpu_text(result["machine"])}.
Result: `bench/results/{result["name"]}.json`.

{head}
{chr(10).join(lines)}
"""


def section(result: dict[str, Any]) -> dict[str, Any]:
    what = "late / early output tok/s of identical concurrency-64 runs, worst server"
    summary = [record.summary_row(f"Soak ({what})", result["ratio"], float(result["target"]))]
    return record.section(record.ORDER["soak"], report(result), summary)


if __name__ == "__main__":
    main()
