"""Which container image a deployment uses when the user names none.

Until lmforge's own images are published, the default is AWS's LMI image (the ``djl-inference``
repository of the AWS Deep Learning Containers account for the region) that matches the backend,
the same one the SageMaker SDK's ``image_uris.retrieve("djl-lmi" | "djl-tensorrtllm", region)``
returns. ``LMFORGE_IMAGE_URI`` or ``--image-uri`` override it.
"""

from __future__ import annotations

import os

from lmforge.config import ServingConfig

LMI_TAG = "0.33.0-lmi15.0.0-cu128"
TRTLLM_TAG = "0.33.0-tensorrtllm0.21.0-cu128"
_DLC_ACCOUNT = "763104351884"
_REGION_ACCOUNTS = {
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "eu-south-1": "692866216735",
    "me-south-1": "217643126080",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
}


def default_image_uri(config: ServingConfig, region: str) -> str:
    """The image for ``config`` in ``region``: ``LMFORGE_IMAGE_URI`` if set, else the matching LMI image."""
    explicit = os.environ.get("LMFORGE_IMAGE_URI")
    if explicit:
        return explicit
    account = _REGION_ACCOUNTS.get(region, _DLC_ACCOUNT)
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    tag = TRTLLM_TAG if config.rolling_batch == "trtllm" else LMI_TAG
    return f"{account}.dkr.ecr.{region}.{domain}/djl-inference:{tag}"
