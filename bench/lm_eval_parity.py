"""lm-eval-harness through lmforge vs lm-eval's own ``hf`` model, on SmolLM2-135M (fp32).

Runs lm-eval's ``hf`` model on the weights, then its ``local-completions`` model through ``lmforge
serve`` on LMI-Dist and on vLLM, each at ``num_concurrent=8`` (one prompt a request) and with
batched prompts (``batch_size=4``, ``num_concurrent=2``), on the 20-question multiple-choice task of
this module's :data:`QUESTIONS`. Writes ``bench/results/lm-eval-smollm2-135m.json``: each run's
accuracy, the largest gap between a choice's log-likelihood and the ``hf`` run's, and the lm-eval
call that made it. The goal: the same accuracy, and every gap within 1e-3.

    .venv/bin/python -m bench.lm_eval_parity [--engines lmi-dist,vllm]

The pieces, which tests/integration/test_lm_eval.py uses too. A user who evaluates a model through
an lmforge server (lm-eval's ``local-completions`` model: the log-likelihood of each choice from
``/v1/completions`` with ``echo``, ``logprobs: 1`` and ``max_tokens: 1``) must get the scores
lm-eval gets by loading the weights itself. :func:`write_task` writes a multiple-choice task of
:data:`QUESTIONS` (a local JSON file: no dataset hub), :func:`evaluate` runs one lm-eval model on it
and returns its accuracy and every choice's log-likelihood, and :func:`compare` says how far two
runs are apart.

lm-eval (the ``lm-eval`` package, in lmforge's ``dev`` extra) is imported only by :func:`evaluate`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import record
from lmforge.models.smollm2 import write_smollm2_model
from lmforge.testing.server import VLLM_ENV, RemoteServer

TASK = "lmforge_mc"

#: (question, choices, index of the right one): general knowledge a 135 M instruct model mostly knows
QUESTIONS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("What is the capital of France?", ("Paris", "Berlin", "Madrid", "Rome"), 0),
    ("How many legs does a spider have?", ("six", "eight", "ten", "four"), 1),
    ("Which planet is closest to the Sun?", ("Venus", "Earth", "Mercury", "Mars"), 2),
    ("What do bees make?", ("milk", "silk", "wax paper", "honey"), 3),
    ("What is frozen water called?", ("ice", "steam", "sand", "glass"), 0),
    ("Which animal is known as the king of the jungle?", ("the mouse", "the lion", "the cow", "the duck"), 1),
    ("What color is the sky on a clear day?", ("green", "red", "blue", "black"), 2),
    ("How many days are in a week?", ("five", "six", "ten", "seven"), 3),
    ("What gas do plants take in from the air?", ("carbon dioxide", "helium", "neon", "argon"), 0),
    ("Which is the largest ocean on Earth?", ("the Arctic", "the Pacific", "the Indian", "the Baltic"), 1),
    ("What is the boiling point of water at sea level in Celsius?", ("50", "75", "100", "150"), 2),
    ("Which language is mainly spoken in Brazil?", ("Spanish", "French", "English", "Portuguese"), 3),
    ("What is 2 plus 2?", ("4", "5", "6", "22"), 0),
    ("Who wrote Romeo and Juliet?", ("Charles Darwin", "William Shakespeare", "Isaac Newton", "Mozart"), 1),
    ("Which organ pumps blood through the body?", ("the lung", "the liver", "the heart", "the skin"), 2),
    ("What is the largest planet in the solar system?", ("Mars", "Earth", "Venus", "Jupiter"), 3),
    ("Which season comes after winter?", ("spring", "autumn", "summer", "night"), 0),
    ("What do cows drink?", ("oil", "water", "ink", "juice of stones"), 1),
    ("Which shape has three sides?", ("a circle", "a square", "a triangle", "a line"), 2),
    ("In which country are the pyramids of Giza?", ("Peru", "China", "Mexico", "Egypt"), 3),
)


def write_task(folder: Path) -> Path:
    """The task's YAML and its data in ``folder`` (lm-eval's ``include_path``); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "questions.jsonl"
    data.write_text(
        "".join(json.dumps({"question": q, "choices": list(c), "answer": a}) + "\n" for q, c, a in QUESTIONS)
    )
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        'target_delimiter: " "\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1\n"
    )
    return folder


@dataclass
class Scores:
    accuracy: float
    loglikelihoods: dict[int, list[float]] = field(default_factory=dict)
    """Per question (its doc id): each choice's log-likelihood, in choice order."""


def evaluate(model: str, model_args: str, task_dir: Path) -> Scores:
    """Run lm-eval's ``model`` (``hf``, ``local-completions``, ...) with ``model_args`` on the task."""
    from lmforge.process import gc_paused

    # lm-eval's imports and its per-request bookkeeping make many objects and few cycles: with the
    # collector off for the run, the hf run on this task takes 9.7 CPU-s instead of 14.0 here
    with gc_paused():
        return _evaluate(model, model_args, task_dir)


def _evaluate(model: str, model_args: str, task_dir: Path) -> Scores:
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[TASK],
        # only this task's folder: lm-eval's own ~thousands of task files (include_defaults) are read and
        # parsed on every TaskManager, ~5 CPU-s here, for a task that uses none of them
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    assert out is not None, "lm-eval returned no results"
    scores = Scores(float(out["results"][TASK]["acc,none"]))
    for sample in out["samples"][TASK]:
        scores.loglikelihoods[int(sample["doc_id"])] = [float(r[0]) for r in sample["filtered_resps"]]
    return scores


def compare(reference: Scores, other: Scores) -> dict[str, Any]:
    """The two runs' accuracies and the largest gap between the same choice's log-likelihoods."""
    gaps = [
        abs(a - b)
        for doc, want in reference.loglikelihoods.items()
        for a, b in zip(want, other.loglikelihoods.get(doc, []), strict=True)
    ]
    assert reference.loglikelihoods.keys() == other.loglikelihoods.keys(), "the runs scored other questions"
    return {
        "accuracy": other.accuracy,
        "reference_accuracy": reference.accuracy,
        "max_loglikelihood_gap": max(gaps),
        "choices": len(gaps),
    }


def local_completions_args(url: str, model: str, *, num_concurrent: int, batch_size: int) -> str:
    """lm-eval's ``local-completions`` arguments for an lmforge server at ``url``: the tokenizer is
    the server's own (lm-eval finds ``/tokenizer_info`` and ``/tokenize`` and uses them)."""
    return (
        f"base_url={url.rstrip('/')}/v1/completions,model={model},num_concurrent={num_concurrent},"
        f"batch_size={batch_size},max_retries=1,timeout=300"
    )


# ---------------------------------------------------------------------------------- the scenario

RESULT = record.RESULTS / "lm-eval-smollm2-135m.json"
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
        "task": f"{TASK}: {len(QUESTIONS)} questions x 4 choices (bench.lm_eval_parity.QUESTIONS)",
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.lm_eval_parity",
        "goal": "equal accuracy, every choice's log-likelihood within 1e-3 of hf's",
        "met": all(
            r["accuracy"] == reference.accuracy and r.get("max_loglikelihood_gap", 0.0) <= 1e-3 for r in runs
        ),
        "ratio": _ratio(runs, reference.accuracy),
        "runs": runs,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d"),
    }
    record.write(RESULT, result, section)
    print(f"met: {result['met']}. Next: .venv/bin/python -m bench.report")


def _ratio(runs: list[dict[str, Any]], accuracy: float) -> float:
    """1e-3 / the worst log-likelihood gap (>= 1: met); 0 when any run's accuracy differs."""
    if any(r["accuracy"] != accuracy for r in runs):
        return 0.0
    worst = max((r.get("max_loglikelihood_gap", 0.0) for r in runs), default=0.0)
    return TOL / max(worst, 1e-9)


def _gap(run: dict[str, Any]) -> str:
    return f"{run['max_loglikelihood_gap']:.1e}" if "max_loglikelihood_gap" in run else "(reference)"


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
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


def section(result: dict[str, Any]) -> dict[str, Any]:
    what = "lm-eval local-completions vs hf: 1e-3 / worst log-likelihood gap, same accuracy"
    summary = [record.summary_row(f"lm-eval parity ({what})", result["ratio"], 1.0)]
    return record.section(record.ORDER["lm_eval_parity"], report(result), summary)


if __name__ == "__main__":
    main()
