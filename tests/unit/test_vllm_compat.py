"""What lmforge reaches for inside vLLM (engines.vllm.compat): every entry there on the pinned vLLM, and
a missing one stops the engine's start naming it, its reason and the tested release."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmforge.engines.vllm import compat
from lmforge.reachins import ReachError, missing, resolve
from tests.shared_vllm import needs_vllm

pytestmark = [needs_vllm, pytest.mark.xdist_group("vllm-unit")]


def test_every_entry_resolves_on_the_installed_vllm_and_torch() -> None:
    assert missing(compat.VLLM.reaches) == []
    assert missing(compat.TORCH.reaches) == []
    compat.check_at_start()


def test_the_prometheus_stand_in_overrides_every_stat_logger_method() -> None:
    from lmforge.engines.vllm.stat_loggers import no_prometheus

    (stand_in,) = no_prometheus()
    assert compat.overrides_every_stat_method(stand_in)


@pytest.mark.parametrize("index", range(len(compat.REACHES)))
def test_a_missing_attribute_stops_the_start_naming_it(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    reach = compat.REACHES[index]
    owner = resolve(reach.owner)
    # gone from the class and from every base that has it; an instance attribute: the methods that
    # assign it (on the class and its bases) no longer do
    planted = reach.methods[0] if reach.methods else reach.names[0]
    for cls in getattr(owner, "__mro__", (owner,)):
        if cls is not object and planted in vars(cls):
            if reach.methods:
                monkeypatch.setattr(cls, planted, lambda self: None)
            else:
                monkeypatch.delattr(cls, planted)
    with pytest.raises(ReachError) as caught:
        compat.check_at_start()
    text = str(caught.value)
    assert f"{reach.label}.{reach.names[0]}" in text
    assert reach.why in text
    assert f"tested against vllm {compat.TESTED}.x" in text


def test_a_new_stat_logger_method_the_stand_in_lacks_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.metrics.loggers import StatLoggerBase

    monkeypatch.setattr(StatLoggerBase, "record_something_new", lambda self: None, raising=False)
    with pytest.raises(ReachError, match=r"StatLoggerBase\.record_something_new.*does not override"):
        compat.check_at_start()


def test_the_vllm_engine_s_start_fails_naming_a_planted_missing_attribute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """VllmEngine.start checks the table before vLLM starts anything."""
    import asyncio

    from vllm.v1.engine import utils

    from lmforge.config import ServingConfig
    from lmforge.engines.vllm.engine import VllmEngine

    monkeypatch.delattr(utils, "get_mp_context")
    engine = VllmEngine(ServingConfig(model_dir=tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ReachError, match=r"vllm\.v1\.engine\.utils\.get_mp_context \(process_start"):
        asyncio.run(engine.start())
