"""Which container image a deployment runs, and whether that image can serve the configuration.

The default is lmforge's own image for the backend and instance type, in the deploying account's
ECR: ``ACCOUNT.dkr.ecr.REGION.amazonaws.com/lmforge-<flavour>:<version>`` (``lmforge container
push FLAVOUR`` puts it there; ``lmforge deploy --build-image`` builds and pushes it when missing).
``--image lmi`` picks AWS's LMI image for the backend (the ``djl-inference`` repository of the AWS
Deep Learning Containers account, what the SageMaker SDK's ``image_uris.retrieve("djl-lmi")``
returns); any other value is an image URI used as given. ``$LMFORGE_IMAGE_URI`` stands in for a
missing ``--image``.

:func:`image_problem` refuses, before anything is uploaded, a configuration that the chosen image
cannot serve: a backend that the lmforge flavour lacks, a GPU image on a CPU instance, LMI-Dist on
AWS LMI 0.33 or later (LMI removed it), TensorRT-LLM on the vLLM image and the reverse.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from lmforge import __version__
from lmforge.config import ServingConfig
from lmforge.container.refs import lmforge_flavour_of

LMI_TAG = "0.33.0-lmi15.0.0-cu128"
TRTLLM_TAG = "0.33.0-tensorrtllm0.21.0-cu128"
ENV_IMAGE = "LMFORGE_IMAGE_URI"
#: the first LMI release without LMI-Dist
LMI_WITHOUT_LMI_DIST = (0, 33)
_DLC_ACCOUNT = "763104351884"
_REGION_ACCOUNTS = {
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "eu-south-1": "692866216735",
    "me-south-1": "217643126080",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
}
#: image flavour for each backend on GPU instances, and on CPU instances
GPU_FLAVOURS = {"lmi-dist": "lmi-dist", "vllm": "vllm", "auto": "vllm", "trtllm": "tensorrt-llm"}
CPU_FLAVOURS = {"lmi-dist": "cpu", "auto": "cpu", "vllm": "vllm-cpu"}

ImageKind = Literal["lmforge", "lmi", "other"]


class ImageError(ValueError):
    pass


@dataclass(frozen=True)
class ImageChoice:
    uri: str
    kind: ImageKind
    flavour: str | None = None
    """lmforge's flavour, for ``kind == "lmforge"``."""
    default: bool = False
    """lmforge's default image in the deploying account's ECR (which may be built and pushed)."""


def ecr_domain(region: str) -> str:
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def lmi_image_uri(config: ServingConfig, region: str) -> str:
    """AWS's LMI image for ``config``'s backend in ``region``."""
    account = _REGION_ACCOUNTS.get(region, _DLC_ACCOUNT)
    tag = TRTLLM_TAG if config.rolling_batch == "trtllm" else LMI_TAG
    return f"{account}.dkr.ecr.{region}.{ecr_domain(region)}/djl-inference:{tag}"


def lmforge_repository(flavour: str) -> str:
    return f"lmforge-{flavour}"


def lmforge_image_uri(flavour: str, account: str, region: str) -> str:
    return f"{account}.dkr.ecr.{region}.{ecr_domain(region)}/{lmforge_repository(flavour)}:{__version__}"


def is_cpu_instance(instance_type: str | None) -> bool | None:
    """True/False for instance types lmforge knows, None for unknown ones (or none given)."""
    if instance_type is None:
        return None
    from lmforge.deploy.instances import get_instance

    try:
        return bool(get_instance(instance_type).is_cpu)
    except ValueError:
        pass
    family = instance_type.removeprefix("ml.").split(".", 1)[0]
    if family[:1] in ("c", "m", "r", "t"):  # general purpose, compute, memory: no accelerator
        return True
    if family[:1] in ("g", "p") or family.startswith(("inf", "trn")):
        return False
    return None


def flavour_for(rolling_batch: str, instance_type: str | None) -> str:
    """The lmforge flavour that serves ``rolling_batch`` on ``instance_type``."""
    if is_cpu_instance(instance_type):
        flavour = CPU_FLAVOURS.get(rolling_batch)
        if flavour is None:
            raise ImageError(
                f"option.rolling_batch={rolling_batch} needs an NVIDIA GPU and {instance_type} has none "
                "(use a GPU instance type, or option.rolling_batch=lmi-dist or vllm on CPU)"
            )
        return flavour
    return GPU_FLAVOURS.get(rolling_batch, "lmi-dist")


def choose_image(
    option: str | None, config: ServingConfig, instance_type: str | None, region: str, account: str
) -> ImageChoice:
    """The image for ``--image OPTION`` (None: ``$LMFORGE_IMAGE_URI``, else lmforge's default)."""
    value = str(option or os.environ.get(ENV_IMAGE) or "lmforge").strip()
    if value == "lmi":
        return ImageChoice(lmi_image_uri(config, region), "lmi")
    if value == "lmforge":
        flavour = flavour_for(config.rolling_batch, instance_type)
        return ImageChoice(lmforge_image_uri(flavour, account, region), "lmforge", flavour, default=True)
    named = lmforge_flavour_of(value)
    if named is not None:
        return ImageChoice(value, "lmforge", named)
    if "/djl-inference:" in value:
        return ImageChoice(value, "lmi")
    return ImageChoice(value, "other")


def _lmi_version(uri: str) -> tuple[int, int] | None:
    match = re.search(r":(\d+)\.(\d+)\.\d+-", uri)
    return (int(match.group(1)), int(match.group(2))) if match else None


def image_problem(choice: ImageChoice, config: ServingConfig, instance_type: str | None) -> str | None:
    """Why ``choice`` cannot serve ``config`` on ``instance_type``, or None."""
    backend = config.rolling_batch
    cpu = is_cpu_instance(instance_type)
    if choice.kind == "lmforge" and choice.flavour is not None:
        from lmforge.container.flavours import FlavourError, load_flavour

        try:
            flavour = load_flavour(choice.flavour)
        except FlavourError:
            return None  # not an lmforge checkout, or a flavour of a newer lmforge: cannot tell
        if backend != "auto" and backend not in flavour.backends:
            return (
                f"the {flavour.name} image serves option.rolling_batch={' or '.join(flavour.backends)}, not "
                f"{backend} (lmforge's image for it: lmforge-{flavour_for(backend, instance_type)})"
            )
        if flavour.gpu and cpu:
            return f"the {flavour.name} image needs an NVIDIA GPU and {instance_type} has none"
        return None
    if choice.kind == "lmi":
        if cpu:
            return f"AWS's LMI images need an NVIDIA GPU and {instance_type} has none"
        trt_image = "tensorrtllm" in choice.uri
        if backend == "trtllm" and not trt_image:
            return "option.rolling_batch=trtllm needs LMI's TensorRT-LLM image (djl-inference:*-tensorrtllm*)"
        if backend in ("vllm", "lmi-dist") and trt_image:
            return f"LMI's TensorRT-LLM image does not serve option.rolling_batch={backend}"
        version = _lmi_version(choice.uri)
        if backend == "lmi-dist" and version is not None and version >= LMI_WITHOUT_LMI_DIST:
            return (
                f"option.rolling_batch=lmi-dist cannot start on AWS LMI {version[0]}.{version[1]}: "
                "LMI removed LMI-Dist in 0.33. Use lmforge's image (the default, which ships LMI-Dist), or "
                "option.rolling_batch=vllm"
            )
    return None
