"""The one C extension of lmforge; everything else about the package is in pyproject.toml.

LMI-Dist's fused LoRA pass for CPU decode steps and the per-token scaling around its W8A8 int8 products
(src/lmforge/engines/lmi_dist/lora_kernel.c) are a plain shared library that
:mod:`lmforge.engines.lmi_dist.lora_kernel` loads with ctypes. It is optional:
without a C compiler the package still builds, and LMI-Dist uses PyTorch's operations instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "lmforge.engines.lmi_dist._lora_kernel",
            sources=["src/lmforge/engines/lmi_dist/lora_kernel.c"],
            extra_compile_args=["-O3", "-ffp-contract=off"],  # W8A8 scaling: PyTorch's roundings
            libraries=["m"],  # fmaf: the portable path's fused multiply-adds
            optional=True,
        )
    ]
)
