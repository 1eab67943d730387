"""lm-eval-harness through lmforge vs lm-eval's own ``hf`` model, on SmolLM2-135M (fp32).

Runs lm-eval's ``hf`` model on the weights, then its ``local-completions`` model through ``lmforge
serve`` on LMI-Dist and on vLLM, each at ``num_concurrent=8`` (one prompt a request) and with
batched prompts (``batch_size=4``, ``num_concurrent=2``), on the 20-question multiple-choice task of
:mod:`lmforge.bench.lm_eval_parity`. Writes ``bench/results/lm-eval-smollm2-135m.json``: each run's
accuracy, the largest gap between a choice's log-likelihood and the ``hf`` run's, and the lm-eval
call that made it. The goal: the same accuracy, and every gap within 1e-3.

    .venv/bin/python bench/lm_eval_parity.py [--engines lmi-dist,vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from lmforge.bench.lm_eval_parity import compare, evaluate, local_completions_args, write_task
from lmforge.models.smollm2 import write_smollm2_model
from lmforge.testing.server import VLLM_ENV, RemoteServer

RESULT = Path(__file__).parent / "results" / "lm-eval-smollm2-135m.json"
TOL = 1e-3
LOADS = ({"num_concurrent": 8, "batch_size": 1}, {"num_concurrent": 2, "batch_size": 4})
VLLM_PROPERTIES = (
    "option.rolling_batch=vllm\noption.dtype=fp32\noption.enforce_eager=true\n"
    "option.max_model_len=1024\noption.max_rolling_batch_size=8\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="lmi-dist,vllm")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="lm-eval-parity-") as tmp:
        root = Path(tmp)
        os.environ["HF_DATASETS_CACHE"] = str(root / "datasets")
        model = write_smollm2_model(root / "smollm2", dtype="fp32", progress=lambda s: print(s, flush=True))
        task = write_task(root / "task")
        hf_args = f"pretrained={model},dtype=float32,device=cpu,batch_size=8"
        print("[1] lm-eval hf on the weights", flush=True)
        started = time.monotonic()
        reference = evaluate("hf", hf_args, task)
        runs: list[dict[str, Any]] = [
            {
                "model": "hf",
                "model_args": hf_args.replace(str(model), "SMOLLM2_DIR"),
                "accuracy": reference.accuracy,
                "seconds": round(time.monotonic() - started, 1),
            }
        ]
        for engine in args.engines.split(","):
            folder = root / f"model-{engine}"
            shutil.copytree(model, folder)
            env = None
            if engine == "vllm":
                (folder / "serving.properties").write_text(VLLM_PROPERTIES)
                env = dict(VLLM_ENV)
            print(f"[2] lmforge serve ({engine})", flush=True)
            with RemoteServer(folder, env=env, startup_timeout=600) as server:
                name = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
                for load in LOADS:
                    print(f"[3] lm-eval local-completions through {engine}, {load}", flush=True)
                    started = time.monotonic()
                    model_args = local_completions_args(server.url, name, **load)
                    got = evaluate("local-completions", model_args, task)
                    runs.append(
                        {
                            "model": "local-completions",
                            "engine": engine,
                            "model_args": model_args.replace(server.url, "http://127.0.0.1:PORT"),
                            **load,
                            **compare(reference, got),
                            "seconds": round(time.monotonic() - started, 1),
                        }
                    )
                    print(json.dumps(runs[-1]), flush=True)
    result = {
        "scenario": "lm-eval-harness local-completions through lmforge vs lm-eval's hf model",
        "model": "SmolLM2-135M-Instruct (lmforge example-model --model smollm2-135m, fp32)",
        "task": "lmforge_mc: 20 questions x 4 choices (lmforge.bench.lm_eval_parity.QUESTIONS)",
        "command": "OMP_NUM_THREADS=1 .venv/bin/python bench/lm_eval_parity.py",
        "goal": "equal accuracy, every choice's log-likelihood within 1e-3 of hf's",
        "met": all(
            r["accuracy"] == reference.accuracy and r.get("max_loglikelihood_gap", 0.0) <= 1e-3 for r in runs
        ),
        "ratio": _ratio(runs, reference.accuracy),
        "runs": runs,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT}; met: {result['met']}. Next: .venv/bin/python bench/report.py")


def _ratio(runs: list[dict[str, Any]], accuracy: float) -> float:
    """1e-3 / the worst log-likelihood gap (>= 1: met); 0 when any run's accuracy differs."""
    if any(r["accuracy"] != accuracy for r in runs):
        return 0.0
    worst = max((r.get("max_loglikelihood_gap", 0.0) for r in runs), default=0.0)
    return TOL / max(worst, 1e-9)


def _gap(run: dict[str, Any]) -> str:
    return f"{run['max_loglikelihood_gap']:.1e}" if "max_loglikelihood_gap" in run else "(reference)"


def report(result: dict[str, Any]) -> str:
    """The section of docs/performance.md (bench/report.py)."""
    rows = "\n".join(
        f"| {r['model']} | {r.get('engine', '-')} | {r.get('num_concurrent', '-')} "
        f"| {r.get('batch_size', '-')} | {r['accuracy']:.2f} "
        f"| {_gap(r)} | {r['seconds']} |"
        for r in result["runs"]
    )
    return (
        "## lm-eval-harness through lmforge (`bench/lm_eval_parity.py`)\n\n"
        f"{result['scenario']}: {result['model']}, task {result['task']}. Goal: {result['goal']}. "
        f"Met: {'yes' if result['met'] else 'no'} ({result['date']}).\n\n"
        "| lm-eval model | engine | num_concurrent | batch_size | accuracy | worst gap to hf (nats) | s |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
        f"{rows}\n\n{result.get('note', '')}`{result['command']}`\n"
    )


if __name__ == "__main__":
    main()
