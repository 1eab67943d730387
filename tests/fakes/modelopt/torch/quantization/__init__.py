"""FAKE modelopt.torch.quantization (tests only)."""

from __future__ import annotations

import copy
import os
import time
from typing import Any


def _preset(fmt: str, quantizer: str = "*weight_quantizer") -> dict[str, Any]:
    return {"quant_cfg": [{"quantizer_name": quantizer, "format": fmt}], "algorithm": "max"}


FP8_DEFAULT_CFG = _preset("FP8")
NVFP4_DEFAULT_CFG = _preset("NVFP4")
INT4_AWQ_CFG = {**_preset("W4A16_AWQ"), "algorithm": {"method": "awq_lite"}}
INT8_SMOOTHQUANT_CFG = {**_preset("W8A8_SQ_PER_CHANNEL"), "algorithm": "smoothquant"}
INT8_WEIGHT_ONLY_CFG = _preset("W8A16")
FP8_KV_CFG = _preset("FP8", "*[kv]_bmm_quantizer")
NVFP4_KV_CFG = _preset("NVFP4", "*[kv]_bmm_quantizer")


def update_quant_cfg_with_kv_cache_quant(
    quant_cfg: dict[str, Any], kv_cache_quant_cfg: list[dict[str, Any]]
) -> dict[str, Any]:
    quant_cfg = copy.deepcopy(quant_cfg)
    inner = quant_cfg.get("quant_cfg") or [{"quantizer_name": "*", "enable": False}]
    quant_cfg["quant_cfg"] = inner + list(kv_cache_quant_cfg)
    if not quant_cfg.get("algorithm"):
        quant_cfg["algorithm"] = "max"
    return quant_cfg


def quantize(model: Any, config: dict[str, Any], forward_loop: Any = None) -> Any:
    entries = config["quant_cfg"]
    weights = next((e["format"] for e in entries if e.get("quantizer_name") == "*weight_quantizer"), None)
    kv = next((e["format"] for e in entries if e.get("quantizer_name") == "*[kv]_bmm_quantizer"), None)
    if os.environ.get("FAKE_MODELOPT_COUNT"):
        with open(os.environ["FAKE_MODELOPT_COUNT"], "a") as f:
            f.write(f"quantize {weights} {kv}\n")
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        if forward_loop is not None:
            forward_loop(model)
    finally:
        handle.remove()
    time.sleep(float(os.environ.get("FAKE_MODELOPT_SECONDS", "0")))
    if os.environ.get("FAKE_MODELOPT_FAIL"):
        print("[fake modelopt] error: CUDA out of memory during calibration", flush=True)
        raise RuntimeError("fake quantization failure")
    model._fake_modelopt = {
        "quant_algo": weights,
        "kv_cache_quant_algo": kv,
        "calibration_forwards": len(calls),
    }
    print(
        f"[fake modelopt] quantized to {weights} / KV {kv} after {len(calls)} calibration forwards",
        flush=True,
    )
    return model
