"""A layer-truncated copy of a model folder: the first N decoder layers, the same embeddings, final norm,
LM head and tokenizer. Used as a draft model for speculative decoding (the target's own tokenizer by
construction) in tests and benches.

``write_truncated_model(SRC, DST, layers)`` reads SRC's safetensors and writes DST with
``num_hidden_layers = layers`` and the tensors of layers ``>= layers`` left out. torch and safetensors
are imported inside, so importing this module is cheap.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from lmforge.models.files import make_readable

__all__ = ["write_truncated_model"]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def write_truncated_model(src: Path, dst: Path, layers: int) -> Path:
    """Write the first ``layers`` decoder layers of the model folder ``src`` as the folder ``dst``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    text = config.get("text_config", config)
    have = int(text["num_hidden_layers"])
    if not 1 <= layers <= have:
        raise ValueError(f"layers={layers} must be from 1 to the model's {have}")
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if (
            item.is_file()
            and not item.name.endswith(".safetensors")
            and item.name
            not in (
                "config.json",
                "model.safetensors.index.json",
            )
        ):
            shutil.copy2(item, dst / item.name)
    text["num_hidden_layers"] = layers
    if isinstance(text.get("layer_types"), list):
        text["layer_types"] = text["layer_types"][:layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                match = _LAYER.search(key)
                if match is None or int(match.group(1)) < layers:
                    tensors[key] = f.get_tensor(key).contiguous()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    make_readable(dst)  # a draft is served from inside the model folder, by the image's user too
    return dst
