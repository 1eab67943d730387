"""SageMaker real-time instance types that lmforge can plan for.

One table, :data:`INSTANCES`, from AWS's published instance specifications: accelerator, how many
GPUs, memory per GPU, host memory and vCPUs. Memory is AWS's nominal figure in GiB (for example 24
for an A10G); the driver and CUDA reserve a little of it, which the plan's fixed runtime overhead
covers. Inferentia and Trainium accelerators are listed so that a plan can say why they are refused:
lmforge's GPU backends do not run on them (they need the LMI NeuronX container).
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass

#: Accelerators lmforge's GPU backends cannot use.
UNSUPPORTED_ACCELERATORS = frozenset({"inferentia2", "trainium"})
#: GPUs without native bf16 (compute capability below 8.0).
NO_BF16_GPUS = frozenset({"T4", "V100"})
#: GPUs with fp8 tensor cores (Ada Lovelace and Hopper).
FP8_GPUS = frozenset({"L4", "L40S", "H100", "H200"})


@dataclass(frozen=True)
class InstanceType:
    """One SageMaker instance type.

    ``gpu_count`` counts accelerator devices (Neuron chips for inf2/trn1, 0 for CPU instances) and
    ``memory_per_gpu_gib`` is each device's memory (0 for CPU instances).
    """

    name: str
    accelerator: str
    gpu_count: int
    memory_per_gpu_gib: float
    host_memory_gib: float
    vcpus: int

    @property
    def is_cpu(self) -> bool:
        """True for instances without an accelerator."""
        return self.accelerator == "none"

    @property
    def is_supported_gpu(self) -> bool:
        """True for NVIDIA GPU instances, which lmforge's GPU backends can use."""
        return not self.is_cpu and self.accelerator not in UNSUPPORTED_ACCELERATORS

    @property
    def total_gpu_memory_gib(self) -> float:
        """All accelerator memory of the instance."""
        return self.gpu_count * self.memory_per_gpu_gib

    def describe(self) -> str:
        """A short description, e.g. ``4 x A10G 24 GiB, 48 vCPUs, 192 GiB host memory``."""
        host = f"{self.vcpus} vCPUs, {self.host_memory_gib:g} GiB host memory"
        if self.is_cpu:
            return f"CPU only, {host}"
        return f"{self.gpu_count} x {self.accelerator} {self.memory_per_gpu_gib:g} GiB, {host}"


def _family(
    prefix: str, accelerator: str, memory_gib: float, rows: tuple[tuple[str, int, float, int], ...]
) -> tuple[InstanceType, ...]:
    # rows: (size, gpu count, host memory GiB, vCPUs)
    return tuple(
        InstanceType(f"ml.{prefix}.{size}", accelerator, gpus, memory_gib, host, vcpus)
        for size, gpus, host, vcpus in rows
    )


def _cpu(prefix: str, rows: tuple[tuple[str, float, int], ...]) -> tuple[InstanceType, ...]:
    # rows: (size, host memory GiB, vCPUs)
    return tuple(
        InstanceType(f"ml.{prefix}.{size}", "none", 0, 0.0, host, vcpus) for size, host, vcpus in rows
    )


#: vCPUs per size of the 6th (Ice Lake) and 7th (Sapphire Rapids) generation CPU families
_SIZES_6I = (
    ("large", 2),
    ("xlarge", 4),
    ("2xlarge", 8),
    ("4xlarge", 16),
    ("8xlarge", 32),
    ("12xlarge", 48),
    ("16xlarge", 64),
    ("24xlarge", 96),
    ("32xlarge", 128),
)
_SIZES_7I = (*_SIZES_6I[:-1], ("48xlarge", 192))
_GIB_PER_VCPU = (("m", 4), ("c", 2), ("r", 8))


def _cpu_family(
    prefix: str, sizes: tuple[tuple[str, int], ...], gib_per_vcpu: int
) -> tuple[InstanceType, ...]:
    return _cpu(prefix, tuple((size, float(vcpus * gib_per_vcpu), vcpus) for size, vcpus in sizes))


# g5 (A10G), g6 (L4) share one layout; g6e (L40S) doubles the host memory.
_G5_G6_LAYOUT: tuple[tuple[str, int, float, int], ...] = (
    ("xlarge", 1, 16, 4),
    ("2xlarge", 1, 32, 8),
    ("4xlarge", 1, 64, 16),
    ("8xlarge", 1, 128, 32),
    ("12xlarge", 4, 192, 48),
    ("16xlarge", 1, 256, 64),
    ("24xlarge", 4, 384, 96),
    ("48xlarge", 8, 768, 192),
)

#: Every instance type lmforge knows, GPU families first.
INSTANCES: tuple[InstanceType, ...] = (
    *_family(
        "g4dn",
        "T4",
        16,
        (
            ("xlarge", 1, 16, 4),
            ("2xlarge", 1, 32, 8),
            ("4xlarge", 1, 64, 16),
            ("8xlarge", 1, 128, 32),
            ("12xlarge", 4, 192, 48),
            ("16xlarge", 1, 256, 64),
        ),
    ),
    *_family("g5", "A10G", 24, _G5_G6_LAYOUT),
    *_family("g6", "L4", 24, _G5_G6_LAYOUT),
    *_family(
        "g6e",
        "L40S",
        48,
        (
            ("xlarge", 1, 32, 4),
            ("2xlarge", 1, 64, 8),
            ("4xlarge", 1, 128, 16),
            ("8xlarge", 1, 256, 32),
            ("12xlarge", 4, 384, 48),
            ("16xlarge", 1, 512, 64),
            ("24xlarge", 4, 768, 96),
            ("48xlarge", 8, 1536, 192),
        ),
    ),
    *_family("p3", "V100", 16, (("2xlarge", 1, 61, 8), ("8xlarge", 4, 244, 32), ("16xlarge", 8, 488, 64))),
    InstanceType("ml.p4d.24xlarge", "A100-40GB", 8, 40, 1152, 96),
    InstanceType("ml.p4de.24xlarge", "A100-80GB", 8, 80, 1152, 96),
    InstanceType("ml.p5.48xlarge", "H100", 8, 80, 2048, 192),
    InstanceType("ml.p5e.48xlarge", "H200", 8, 141, 2048, 192),
    InstanceType("ml.p5en.48xlarge", "H200", 8, 141, 2048, 192),
    # Inferentia2 / Trainium: device = one Neuron chip with 32 GiB of HBM.
    *_family(
        "inf2",
        "inferentia2",
        32,
        (("xlarge", 1, 16, 4), ("8xlarge", 1, 128, 32), ("24xlarge", 6, 384, 96), ("48xlarge", 12, 768, 192)),
    ),
    *_family("trn1", "trainium", 32, (("2xlarge", 1, 32, 8), ("32xlarge", 16, 512, 128))),
    *_cpu(
        "m5",
        (
            ("large", 8, 2),
            ("xlarge", 16, 4),
            ("2xlarge", 32, 8),
            ("4xlarge", 64, 16),
            ("12xlarge", 192, 48),
            ("24xlarge", 384, 96),
        ),
    ),
    *_cpu(
        "c5",
        (
            ("large", 4, 2),
            ("xlarge", 8, 4),
            ("2xlarge", 16, 8),
            ("4xlarge", 32, 16),
            ("9xlarge", 72, 36),
            ("18xlarge", 144, 72),
        ),
    ),
    *_cpu(
        "r5",
        (
            ("large", 16, 2),
            ("xlarge", 32, 4),
            ("2xlarge", 64, 8),
            ("4xlarge", 128, 16),
            ("12xlarge", 384, 48),
            ("24xlarge", 768, 96),
        ),
    ),
    # general purpose (m: 4 GiB per vCPU), compute (c: 2) and memory (r: 8) families of one generation
    # share their sizes
    *(i for kind, gib in _GIB_PER_VCPU for i in _cpu_family(f"{kind}6i", _SIZES_6I, gib)),
    *(i for kind, gib in _GIB_PER_VCPU for i in _cpu_family(f"{kind}7i", _SIZES_7I, gib)),
)

_BY_NAME: dict[str, InstanceType] = {i.name: i for i in INSTANCES}


@functools.cache
def sagemaker_instance_types() -> tuple[str, ...]:
    """Every real-time instance type SageMaker accepts, from the installed botocore's service model
    (wider than the planning table above, which only lists types lmforge knows the memory of)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return tuple(model.shape_for("ProductionVariantInstanceType").enum)


def get_instance(name: str) -> InstanceType:
    """The instance type called ``name`` (``ml.`` may be left out; case is ignored).

    Raises ``ValueError`` naming the closest known types when there is no such type.
    """
    key = name.strip().lower()
    if key and not key.startswith("ml."):
        key = "ml." + key
    found = _BY_NAME.get(key)
    if found is not None:
        return found
    close = difflib.get_close_matches(key, list(_BY_NAME), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(
        f"unknown instance type {name!r}{hint} (known: ml.g4dn, g5, g6, g6e, p3, p4d, p4de, p5, p5e, "
        "p5en, inf2, trn1, m5, c5, r5, m6i, c6i, r6i, m7i, c7i and r7i sizes)"
    )
