"""The guard around lmforge's moto patches: every reach-in checked at start, each patch applied once,
and lmforge's state kept off moto's objects."""

from __future__ import annotations

import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from lmforge.local import autoscaling_ext, component_actions, iam_ext, moto_ext
from lmforge.local.ecr import patches as ecr_patches
from lmforge.local.inference_components import components
from lmforge.local.moto_patch import TESTED_MOTO, Patch, Reach, apply, check, missing, original


@pytest.fixture
def fake_moto() -> Iterator[str]:
    """A module standing in for a moto module, with a class the tests patch."""

    class Backend:
        def __init__(self) -> None:
            self.endpoints: dict[str, Any] = {}

        def create(self) -> str:
            return "moto's"

    module = types.ModuleType(f"fake_moto_{uuid.uuid4().hex}")  # new: patches apply once per name
    module.Backend = Backend  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        yield module.__name__
    finally:
        del sys.modules[module.__name__]


def test_the_pinned_moto_has_every_attribute_the_patches_reach() -> None:
    for reaches in (
        moto_ext.REACHES,
        component_actions.REACHES,
        ecr_patches.REACHES,
        iam_ext.REACHES,
        autoscaling_ext.REACHES,
    ):
        assert missing(reaches) == []
    moto_ext.check_compatible()
    ecr_patches.check_compatible()
    iam_ext.check_compatible()
    autoscaling_ext.check_compatible()


def test_a_missing_application_auto_scaling_attribute_stops_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The patch that admits sagemaker:inference-component:DesiredCopyCount replaces a moto function:
    one renamed upstream fails the start, naming it and the version tested."""
    from lmforge.errors import LmforgeError
    from lmforge.reachins import resolve

    monkeypatch.delattr(resolve("moto.applicationautoscaling.models"), "_target_params_are_valid")
    with pytest.raises(LmforgeError, match=rf"_target_params_are_valid.*{TESTED_MOTO}"):
        autoscaling_ext.check_compatible()


def test_a_missing_attribute_is_named_with_the_tested_version(fake_moto: str) -> None:
    reaches = [
        Reach(f"{fake_moto}:Backend", ("create", "delete")),
        Reach(f"{fake_moto}:Backend", ("endpoints", "_models"), set_in="__init__"),
        Reach(f"{fake_moto}:Gone", ("anything",)),
    ]
    with pytest.raises(RuntimeError) as caught:
        check("the test's patches", reaches)
    message = str(caught.value)
    assert f"{fake_moto}.Backend.delete;" in message
    assert f"{fake_moto}.Backend._models (set in __init__)" in message
    assert f"{fake_moto}.Gone." in message
    assert "Backend.create" not in message and "Backend.endpoints" not in message
    assert message.startswith("the test's patches cannot start on moto ")
    assert f"written and tested against moto {TESTED_MOTO}" in message


def test_a_real_moto_attribute_planted_missing_fails_the_local_start_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lmforge.errors import LmforgeError
    from lmforge.reachins import resolve

    reach = next(r for r in iam_ext.REACHES if r.owner == "moto.iam.models:ManagedPolicy" and not r.set_in)
    monkeypatch.delattr(resolve(reach.owner), reach.names[0])
    with pytest.raises(
        LmforgeError, match=rf"moto\.iam\.models\.ManagedPolicy\.{reach.names[0]}.*{TESTED_MOTO}"
    ):
        iam_ext.check_compatible()


def test_a_patch_is_applied_once_and_keeps_moto_s_method_in_lmforge_s_table(fake_moto: str) -> None:
    owner = f"{fake_moto}:Backend"

    def create(self: Any) -> str:
        return "lmforge's, then " + original(owner, "create")(self)

    def other(self: Any) -> str:
        return "another"

    apply([Patch(owner, "create", create), Patch(owner, "added", other, adds=True)])
    apply([Patch(owner, "create", other)])  # installed already: nothing changes
    backend = sys.modules[fake_moto].Backend()
    assert backend.create() == "lmforge's, then moto's"
    assert backend.added() == "another"
    assert {name for name in vars(type(backend)) if "lmforge" in name} == set()


def test_inference_components_are_kept_by_lmforge_and_go_with_moto_s_reset() -> None:
    from moto.sagemaker.models import SageMakerModelBackend

    backend = SageMakerModelBackend("us-east-1", "123456789012")
    store = components(backend)
    store["ic"] = object()  # type: ignore[assignment]
    assert components(backend) is store
    assert not any("lmforge" in name for name in vars(backend))
    assert components(SageMakerModelBackend("us-east-1", "123456789012")) == {}
    backend.reset()
    assert components(backend) == {}
