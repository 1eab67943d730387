"""Inference components without a server: how copies are placed on a variant's instances (the local
SageMaker's bookkeeping), what a component's settings may be, and the requirements ``lmforge deploy``
defaults. The components running on the local SageMaker are tests/integration/test_local_components.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmforge.deploy import BadSetting, DeploySettings, DeployUsageError
from lmforge.deploy.components import default_requirements
from lmforge.deploy.settings import check_settings
from lmforge.local.placements import Needs, VariantHosts, instance_capacity


def _hosts(managed: bool, minimum: int = 1, maximum: int = 1) -> VariantHosts:
    hosts = VariantHosts("ml.m5.xlarge", instance_capacity("ml.m5.xlarge"), [], managed, minimum, maximum)
    hosts.add()
    return hosts


def test_copies_share_an_instance_while_they_fit() -> None:
    hosts = _hosts(managed=False)
    two = Needs(cpus=2, memory_mb=1024)
    assert hosts.place(two) is hosts.hosts[0]
    assert hosts.place(two) is hosts.hosts[0]  # 4 vCPUs: both fit
    assert hosts.place(Needs(cpus=0.25, memory_mb=128)) is None  # no core left, no scaling
    assert hosts.place(Needs(memory_mb=15 * 1024)) is None  # memory counts too
    hosts.hosts[0].release(two)
    assert hosts.place(Needs(cpus=1, memory_mb=1024)) is hosts.hosts[0]


def test_managed_scaling_adds_instances_up_to_the_maximum_and_stops_empty_ones() -> None:
    hosts = _hosts(managed=True, minimum=0, maximum=2)
    four = Needs(cpus=4, memory_mb=1024)
    first, second = hosts.place(four), hosts.place(four)
    assert first is not None and second is not None and first is not second
    assert hosts.place(four) is None  # MaxInstanceCount 2
    assert hosts.place(Needs(cpus=5, memory_mb=1)) is None and len(hosts.hosts) == 2  # fits no instance
    assert hosts.scale_in() == []
    first.release(four)
    assert hosts.scale_in() == [first] and hosts.hosts == [second]
    second.release(four)
    assert hosts.scale_in() == [second] and hosts.hosts == []  # MinInstanceCount 0: zero instances


def test_an_unknown_instance_type_limits_nothing() -> None:
    assert instance_capacity("ml.nothing.large") is None
    hosts = VariantHosts("ml.nothing.large", None, [])
    hosts.add()
    assert hosts.place(Needs(cpus=1000, memory_mb=1e9, accelerators=64)) is hosts.hosts[0]


def _settings(tmp_path: Path, **fields: Any) -> DeploySettings:
    base: dict[str, Any] = {"endpoint_name": "e", "instance_type": "ml.m5.xlarge", "inference_component": "c"}
    return DeploySettings(model_dir=tmp_path, **{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "option"),
    [
        ({"inference_component": "bad_name"}, "--inference-component"),
        ({"copies": -1}, "--copies"),
        ({"copies": 1.5}, "--copies"),
        ({"cpus": 0.1}, "--cpus"),
        ({"memory_mb": 64}, "--memory-mb"),
        ({"accelerators": -1}, "--accelerators"),
        ({"instance_count": 2, "max_instance_count": 1}, "--max-instances"),
    ],
)
def test_component_settings_are_refused_naming_the_option(
    tmp_path: Path, fields: dict[str, Any], option: str
) -> None:
    with pytest.raises(BadSetting) as err:
        check_settings(_settings(tmp_path, **fields))
    assert err.value.option == option


def test_autoscale_on_a_component_counts_copies_from_zero(tmp_path: Path) -> None:
    """A component's ``--autoscale`` is a range of copies, 0 allowed (a variant's starts at 1), that
    holds ``--copies``; it needs the wait, as a variant's does."""
    from lmforge.deploy import Autoscale

    check_settings(_settings(tmp_path, autoscale=Autoscale(0, 2, 10.0)))
    check_settings(_settings(tmp_path, autoscale=Autoscale(0, 2), copies=0))
    with pytest.raises(BadSetting, match="--copies 3 is outside 0:2") as err:
        check_settings(_settings(tmp_path, autoscale=Autoscale(0, 2), copies=3))
    assert err.value.option == "--autoscale"
    with pytest.raises(DeployUsageError, match="drop --no-wait"):
        check_settings(_settings(tmp_path, autoscale=Autoscale(0, 2), wait=False))
    with pytest.raises(BadSetting, match="scale to zero is for inference components") as err:
        check_settings(_settings(tmp_path, autoscale=Autoscale(0, 2), inference_component=None))
    assert err.value.option == "--autoscale"


def test_requirements_default_from_the_instance_type_without_a_plan() -> None:
    cpu = default_requirements("ml.m5.xlarge", None)
    assert (cpu.cpus, cpu.memory_mb, cpu.accelerators) == (1.0, 1024, 0)
    gpu = default_requirements("ml.g5.12xlarge", None, cpus=2, memory_mb=4096)
    assert (gpu.cpus, gpu.memory_mb, gpu.accelerators) == (2, 4096, 1)
    assert gpu.to_api() == {
        "NumberOfCpuCoresRequired": 2,
        "MinMemoryRequiredInMb": 4096,
        "NumberOfAcceleratorDevicesRequired": 1,
    }
