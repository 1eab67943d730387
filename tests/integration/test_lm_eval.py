"""lm-eval-harness through lmforge scores what lm-eval's own ``hf`` model scores on the same weights.

lm-eval's ``local-completions`` model (the client nobody here wrote) evaluates a 20-question
multiple-choice task (:mod:`bench.lm_eval_parity`) through ``lmforge serve`` on SmolLM2-135M
(fp32): on LMI-Dist with ``num_concurrent=8`` (one prompt a request, eight requests at once), on vLLM
with batched prompts (``batch_size=4``: lists of prompts in one request). Its tokenizer is the
server's (lm-eval detects ``/tokenizer_info`` and ``/tokenize`` and uses them). The accuracy must equal
the ``hf`` run's, and every choice's log-likelihood must be within 1e-3 of it. Before the LMI-Dist fix
of 2026-11-28, the concurrent run scored 0.25-0.30 where ``hf`` scored 0.90 on a similar set.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from bench.lm_eval_parity import Scores, compare, evaluate, local_completions_args, write_task

from lmforge.testing.server import RemoteServer
from tests.shared_vllm import needs_vllm

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("lm_eval") is None,
        reason="lm-eval-harness is in the dev extra (make install)",
    ),
    pytest.mark.xdist_group("smollm2"),
]

TOL = 1e-3


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch) -> Path:
    monkeypatch_module.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch_module.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf-datasets")))
    return write_task(tmp_path_factory.mktemp("lm-eval-task"))


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def reference(smollm2_model: Path, task: Path) -> Scores:
    """lm-eval's own ``hf`` model on the folder."""
    import torch

    torch.set_num_threads(1)
    return evaluate("hf", f"pretrained={smollm2_model},dtype=float32,device=cpu,batch_size=8", task)


def _through(server: RemoteServer, task: Path, caplog: pytest.LogCaptureFixture, **load: int) -> Scores:
    name = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
    caplog.set_level(logging.INFO, logger="lm_eval")
    scores = evaluate("local-completions", local_completions_args(server.url, name, **load), task)
    assert "Using remote tokenizer" in caplog.text, "lm-eval did not take the server's tokenizer routes"
    return scores


def _check(reference: Scores, got: Scores) -> None:
    summary = compare(reference, got)
    assert summary["accuracy"] == summary["reference_accuracy"], summary
    assert summary["max_loglikelihood_gap"] <= TOL, summary


def test_lm_eval_through_lmi_dist_concurrent_equals_hf(
    smollm2_lmi_dist: RemoteServer, task: Path, reference: Scores, caplog: pytest.LogCaptureFixture
) -> None:
    _check(reference, _through(smollm2_lmi_dist, task, caplog, num_concurrent=8, batch_size=1))


@needs_vllm
@pytest.mark.vllm
def test_lm_eval_through_vllm_batched_equals_hf(
    smollm2_vllm: RemoteServer, task: Path, reference: Scores, caplog: pytest.LogCaptureFixture
) -> None:
    _check(reference, _through(smollm2_vllm, task, caplog, num_concurrent=2, batch_size=4))
