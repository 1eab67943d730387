"""LMI-Dist speculation under tensor parallelism: both ranks schedule the same drafts (prompt lookup, or
a whole copy of the draft model on each rank) and make the same choices, so the answers are those of
one process, and those of the same ranks without speculation (tokens, log-probs, alternatives),
alone and in a crowd. (Prompt scoring, ``echo``, is refused with tensor parallelism on LMI-Dist, with or
without speculation.)"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmforge.testing.server import RemoteServer, metrics
from tests.conftest import Reference
from tests.integration.test_lifecycle import with_properties
from tests.integration.test_load import tensor_parallel_matches_one_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: prompts of different lengths for tests.same_answer's probes (at least 4)
PROMPTS = ("def add(a, b):\n    return a + b\n\ndef", "import os\n", "class Foo:", "for i in range(10):\n   ")


@pytest.fixture(scope="module")
def without(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    """The same two ranks, not speculating."""
    model = with_properties(
        tiny_model, tmp_path_factory.mktemp("tp-off") / "model", **{"option.tensor_parallel_degree": "2"}
    )
    with RemoteServer(model) as srv:
        yield srv


@pytest.mark.parametrize("proposer", ["ngram", "draft_model"])
def test_two_ranks_speculating_answer_as_one_process_and_as_without(
    tiny_model: Path, tmp_path: Path, reference: Reference, without: RemoteServer, proposer: str
) -> None:
    from lmforge.models.truncate import write_truncated_model
    from tests.same_answer import same_with_speculation, speculation_probes, standard_probes

    spec: dict[str, object] = {"method": proposer, "num_speculative_tokens": 3, "disable_by_batch_size": 64}
    if proposer == "ngram":
        spec["prompt_lookup_min"] = 1
    else:
        # the tiny model's first layer: drafts often wrong, so both ranks roll back alike too
        spec["model"] = str(write_truncated_model(tiny_model, tmp_path / "draft", 1))
    model = with_properties(
        tiny_model,
        tmp_path / "tp",
        **{"option.tensor_parallel_degree": "2", "option.speculative_config": json.dumps(spec)},
    )
    # prompt scoring (echo) is refused with tensor parallelism, speculating or not
    probes = [p for p in [*speculation_probes(PROMPTS), *standard_probes(PROMPTS)] if not p.body.get("echo")]
    with RemoteServer(model) as srv:
        tensor_parallel_matches_one_process(srv, reference)
        _, near_ties = same_with_speculation(without.url, srv.url, probes)
        stats = metrics(srv.url)
    for tie in near_ties:
        warnings.warn(f"near-tie: {tie}", stacklevel=1)
    proposed = stats["lmforge_engine_speculative_proposed_tokens_total"]
    assert proposed > 0, "no draft was proposed: the test checked nothing of speculation"
    label = f'{{proposer="{proposer}"}}'
    assert stats[f"lmforge_engine_speculative_proposer_proposed_tokens_total{label}"] == proposed
