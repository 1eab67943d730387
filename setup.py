"""The one C extension of lmforge; everything else about the package is in pyproject.toml.

LMI-Dist's fused LoRA pass for CPU decode steps and the per-token scaling around fbgemm's W8A8 int8
products (src/lmforge/engines/lmi_dist/lora_kernel.c), its own W8A8 int8 kernel (int8_kernel.c), its
W4A16 int4 kernel (int4_kernel.c, AVX-512 BF16) and its decode attention (attention_kernel.c) are a
plain shared library that :mod:`lmforge.engines.lmi_dist.lora_kernel`, :mod:`.int8_kernel`,
:mod:`.int4_kernel` and :mod:`.attention` load with ctypes. It is optional:
without a C compiler the package still builds, and LMI-Dist uses PyTorch's operations instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "lmforge.engines.lmi_dist._lora_kernel",
            sources=[
                "src/lmforge/engines/lmi_dist/lora_kernel.c",
                "src/lmforge/engines/lmi_dist/int8_kernel.c",
                "src/lmforge/engines/lmi_dist/int4_kernel.c",
                "src/lmforge/engines/lmi_dist/attention_kernel.c",
            ],
            extra_compile_args=["-O3", "-ffp-contract=off"],  # W8A8: the roundings tests check bit for bit
            libraries=["m"],  # fmaf: the portable path's fused multiply-adds
            optional=True,
        )
    ]
)
