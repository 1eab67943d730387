"""Whether what ``lmforge compile`` makes on this machine will be a hit on a SageMaker instance type.

``lmforge deploy --compile`` compiles before packing only where the compiled graphs can run, and be
used, on the endpoint: a GPU instance type only on a machine with that GPU; a CPU instance type only
on a CPU machine whose instruction-set extensions the instance's processors all have (a kernel
compiled here with AVX-512 BF16 would fault on a Skylake ``ml.m5``). The compile itself runs inside the
endpoint's image, so vLLM, torch and Python are the image's own. Otherwise deploy says why and ships the
folder uncompiled; the container compiles at its first start, as without ``--compile``.
The container checks the manifest again at every start (``compile cache: hit|miss``), whatever this
module concluded.
"""

from __future__ import annotations

from lmforge.deploy.instances import get_instance
from lmforge.engines.vllm.compile_manifest import Target

_SKYLAKE = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")
_ICE_LAKE = (*_SKYLAKE, "avx512_vnni")
_SAPPHIRE_RAPIDS = (*_ICE_LAKE, "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")

#: The instruction-set extensions (of :data:`~lmforge.engines.vllm.compile_manifest.CPU_FEATURES`) every
#: processor of a CPU instance family has: AWS places m5/c5 on Skylake or Cascade Lake, m6i/c6i on Ice
#: Lake, m7i/c7i on Sapphire Rapids.
CPU_FAMILY_FEATURES: dict[str, tuple[str, ...]] = {
    "m5": _SKYLAKE,
    "c5": _SKYLAKE,
    "r5": _SKYLAKE,
    "m6i": _ICE_LAKE,
    "c6i": _ICE_LAKE,
    "r6i": _ICE_LAKE,
    "m7i": _SAPPHIRE_RAPIDS,
    "c7i": _SAPPHIRE_RAPIDS,
    "r7i": _SAPPHIRE_RAPIDS,
}


def _family(instance_type: str) -> str:
    parts = instance_type.lower().removeprefix("ml.").split(".")
    return parts[0] if parts else ""


def compile_here_problem(instance_type: str, here: Target) -> str | None:
    """Why kernels compiled on this machine's processor (``here``) would not serve on ``instance_type``;
    None when they would. The software (vLLM, torch, the exact Python) is the image's own: the compile
    runs inside it (:mod:`lmforge.container.compile_in_image`)."""
    try:
        instance = get_instance(instance_type)
    except ValueError as exc:
        return str(exc)
    if instance.is_cpu:
        if here.device != "cpu":
            return f"{instance.name} is a CPU instance type and this machine compiles for its {here.gpu} GPU"
        features = CPU_FAMILY_FEATURES.get(_family(instance.name))
        if features is None:
            return (
                f"lmforge does not know which instruction-set extensions every {instance.name} processor has"
            )
        if here.arch != "x86_64":
            return f"{instance.name} is an x86_64 instance type and this machine is {here.arch}"
        extra = [f for f in here.cpu_flags if f not in features]
        if extra:
            return (
                f"this CPU has {' '.join(extra)}, which not every {instance.name} processor has: kernels "
                "compiled here could fault there"
            )
    else:
        gpu = here.gpu or ""
        wanted = instance.accelerator.split("-")
        if here.device != "cuda" or not all(part.lower() in gpu.lower() for part in wanted):
            have = f"its GPU is {gpu}" if gpu else "it has no GPU"
            return f"{instance.name} has {instance.accelerator} GPUs and this machine does not ({have})"
    return None
