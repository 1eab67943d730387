"""LMI-Dist's speculative decoding inside lmforge's cpu image (marker ``image``; the image the session
builds once, tests/image/conftest.py): the image serves the tiny model with ``option.speculative_config``,
n-gram prompt lookup and a draft model named by a folder relative to the model (``"model": "draft"``:
``/opt/ml/model/draft`` in the container, read-only as SageMaker mounts it), and its answers equal the
same image's without speculation (tests/same_answer.py's speculation probes: tokens, text and log-probs,
alone and in a crowd); its ``/metrics`` show that drafts were proposed, by that proposer."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmforge.testing.server import metrics
from tests.image.conftest import BuiltImage, ImageRun
from tests.integration.test_lifecycle import with_properties

pytestmark = [pytest.mark.image, pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("image")]

#: prompts of different lengths for tests.same_answer's plain probes
PROMPTS = ("def add(a, b):\n    return a + b\n\ndef", "import os\n", "class Foo:")


@pytest.fixture(scope="module")
def without(cpu_image: BuiltImage, tiny_model: Path) -> Iterator[ImageRun]:
    """The image serving the tiny model, not speculating: the answers to equal."""
    with ImageRun(cpu_image, tiny_model) as run:
        run.wait_for_ping(timeout=120)
        yield run


@pytest.mark.parametrize("proposer", ["ngram", "draft_model"])
def test_the_image_speculates_and_answers_as_without(
    cpu_image: BuiltImage, tiny_model: Path, tmp_path: Path, without: ImageRun, proposer: str
) -> None:
    from lmforge.models.truncate import write_truncated_model
    from tests.same_answer import same_with_speculation, speculation_probes

    spec: dict[str, object] = {"method": proposer, "num_speculative_tokens": 3, "disable_by_batch_size": 64}
    if proposer == "ngram":
        spec["prompt_lookup_min"] = 1
    else:
        spec["model"] = "draft"  # relative: the folder inside the model's, wherever it is mounted
    model = with_properties(tiny_model, tmp_path / "model", **{"option.speculative_config": json.dumps(spec)})
    if proposer == "draft_model":
        # the tiny model's first layer: drafts often wrong, so rejected runs roll back in the image too
        # (readable by the image's uid 1000: write_truncated_model leaves no 0600 file behind)
        write_truncated_model(tiny_model, model / "draft", 1)
    with ImageRun(cpu_image, model) as run:
        run.wait_for_ping(timeout=120)
        _, near_ties = same_with_speculation(without.url, run.url, speculation_probes(PROMPTS))
        stats = metrics(run.url)
    for tie in near_ties:
        warnings.warn(f"near-tie: {tie}", stacklevel=1)
    proposed = stats["lmforge_engine_speculative_proposed_tokens_total"]
    assert proposed > 0, "no draft was proposed: the test checked nothing of speculation"
    assert (
        stats[f'lmforge_engine_speculative_proposer_proposed_tokens_total{{proposer="{proposer}"}}']
        == proposed
    )
    assert stats["lmforge_engine_speculative_accepted_tokens_total"] > 0, "no draft was ever accepted"
