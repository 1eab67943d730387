"""Readers of Hugging Face model folders, shared by the deployment planner and the adapter checks:
the model's shape from ``config.json`` and the tensors listed in safetensors headers. They sit at the
bottom of the layers (see docs/architecture.md) and import nothing else of lmforge."""

from lmforge.hf.config import QUANT_SCALE_OVERHEAD_BITS, ModelShape
from lmforge.hf.errors import ModelFileError
from lmforge.hf.safetensors import TensorInfo, read_safetensors_header, weight_files

__all__ = [
    "QUANT_SCALE_OVERHEAD_BITS",
    "ModelFileError",
    "ModelShape",
    "TensorInfo",
    "read_safetensors_header",
    "weight_files",
]
