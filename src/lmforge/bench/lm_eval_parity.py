"""lm-eval-harness through lmforge against lm-eval's own ``hf`` model on the same weights.

A user who evaluates a model through an lmforge server (lm-eval's ``local-completions`` model: the
log-likelihood of each choice from ``/v1/completions`` with ``echo``, ``logprobs: 1`` and
``max_tokens: 1``) must get the scores lm-eval gets by loading the weights itself. :func:`write_task`
writes a multiple-choice task of :data:`QUESTIONS` (a local JSON file: no dataset hub), :func:`evaluate`
runs one lm-eval model on it and returns its accuracy and every choice's log-likelihood, and
:func:`compare` says how far two runs are apart.

lm-eval (the ``lm-eval`` package, in lmforge's ``dev`` extra) is imported only by :func:`evaluate`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
