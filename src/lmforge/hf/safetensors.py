"""Safetensors headers and weight files of a model folder: every tensor's name, dtype, shape and
size from the header alone (the tensor data is never read)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from lmforge.hf.errors import ModelFileError

#: A larger header is not a safetensors file (the format caps it at 100 MB).
MAX_HEADER_BYTES = 100 * 1024**2


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file, from its header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


def read_safetensors_header(path: Path) -> list[TensorInfo]:
    """The tensors listed in a ``.safetensors`` file's header; the tensor data is not read.

    The format: an 8-byte little-endian header length, then that many bytes of JSON mapping each
    tensor name to its dtype, shape and ``data_offsets`` (begin, end) in the data section.
    """
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ModelFileError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER_BYTES:
                raise ModelFileError(f"{path}: not a safetensors file (header of {length} bytes)")
            header = json.loads(f.read(length))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path}: unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: the safetensors header is not a JSON object")
    out: list[TensorInfo] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            out.append(
                TensorInfo(name, str(info["dtype"]), tuple(int(d) for d in info["shape"]), end - begin)
            )
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"{path}: malformed safetensors header entry {name!r}") from None
    return out


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model folder: those of the index when there is one, else every
    ``*.safetensors`` file except Mistral's duplicate ``consolidated*`` copies."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (OSError, ValueError, AttributeError):
            weight_map = {}
        if isinstance(weight_map, dict) and weight_map:
            names = sorted({str(v) for v in weight_map.values()})
            return [folder / n for n in names if (folder / n).is_file()]
    files = sorted(folder.glob("*.safetensors"))
    return [f for f in files if not f.name.startswith("consolidated")] or files
