"""FAKE modelopt.torch.export (tests only)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any


def export_hf_checkpoint(
    model: Any,
    dtype: Any = None,
    export_dir: Path | str = tempfile.gettempdir(),  # noqa: B008 (the real signature)
    save_modelopt_state: bool = False,
    components: list[str] | None = None,
    extra_state_dict: dict[str, Any] | None = None,
    max_shard_size: int | str = "10GB",
) -> None:
    done = getattr(model, "_fake_modelopt", None)
    if done is None:
        raise ValueError("export_hf_checkpoint: the model was not quantized")
    out = Path(export_dir)
    model.save_pretrained(out)
    quant = {"quant_algo": done["quant_algo"], "kv_cache_quant_algo": done["kv_cache_quant_algo"]}
    hf_quant = {"producer": {"name": "modelopt", "version": "0.46.0"}, "quantization": quant}
    (out / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=4))
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", **quant}
    (out / "config.json").write_text(json.dumps(config, indent=4))
    print(
        f"[fake modelopt] exported to {out} ({done['calibration_forwards']} calibration forwards)", flush=True
    )
