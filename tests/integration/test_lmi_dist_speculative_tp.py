"""LMI-Dist speculation under tensor parallelism: both ranks schedule the same drafts and make the
same choices, so the answers are those of one process."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from lmforge.testing.server import RemoteServer
from tests.conftest import Reference
from tests.integration.test_lifecycle import with_properties
from tests.integration.test_load import tensor_parallel_matches_one_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_two_ranks_speculating_answer_as_one_process(
    tiny_model: Path, tmp_path: Path, reference: Reference
) -> None:
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1})
    model = with_properties(
        tiny_model,
        tmp_path / "tp",
        **{"option.tensor_parallel_degree": "2", "option.speculative_config": spec},
    )
    with RemoteServer(model) as srv:
        tensor_parallel_matches_one_process(srv, reference)
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text
    proposed = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("lmforge_engine_speculative_proposed_tokens_total")
    )
    assert proposed > 0, "no draft was proposed: the test checked nothing of speculation"
