"""LMI-Dist speculation with LoRA adapters: the request's own adapter verifies its drafts, so a batch
mixing the base model and adapters answers as PEFT does per adapter."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lmforge.testing.lora import PeftReference
from lmforge.testing.server import RemoteServer, metrics
from tests.integration.test_lora import NEW, PROMPTS, generate, lora_model, peft  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_adapters_verify_their_own_drafts(lora_model: Path, peft: PeftReference, tmp_path: Path) -> None:  # noqa: F811
    model = tmp_path / "model"
    shutil.copytree(lora_model, model, symlinks=True)
    spec = json.dumps(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "disable_by_batch_size": 64}
    )
    with (model / "serving.properties").open("a") as f:
        f.write(f"option.speculative_config={spec}\n")
    jobs = [(p, "body", name) for p in PROMPTS for name in (None, "a1", "a2")]
    with RemoteServer(model) as srv, ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: generate(srv, *job), jobs))
        stats = metrics(srv.url)
    for (prompt, _how, name), out in zip(jobs, outs, strict=True):
        assert out == peft.greedy(prompt, NEW, name), (prompt, name)
    assert stats["lmforge_engine_speculative_proposed_tokens_total"] > 0
