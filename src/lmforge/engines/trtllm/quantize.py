"""ModelOpt quantization for TensorRT-LLM >= 1.3: the ahead-of-time step of that path.

:func:`ensure_checkpoint` gives the folder the PyTorch backend loads: a ModelOpt checkpoint as it is
(``lmforge compile`` output, or any folder with ``hf_quant_config.json``: never quantized again), the
model folder itself when nothing is to be quantized, else a cached quantization made now under
``<cache>/trtllm-quant/<plan cache key>`` (one per key across processes: :func:`.lock.build_lock`).

The quantization itself runs in a child process (``python -m lmforge.engines.trtllm.quantize PLAN
SOURCE OUTPUT``, started by :func:`.compile.run_child`, with a deadline and its output as progress): the
model in transformers, ``modelopt.torch.quantization.quantize(model, config, forward_loop)`` with the
plan's ModelOpt preset (plus ``update_quant_cfg_with_kv_cache_quant`` for the KV cache), calibrated on the
offline prompt set (:mod:`.calibration`), then ``modelopt.torch.export.export_hf_checkpoint`` and the
tokenizer. Names checked against ModelOpt 0.46.0's source (``tests/fakes/modelopt_api.json``).
"""

from __future__ import annotations

import copy
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmforge.engines.trtllm.compile import CompileError, is_compiled, run_child
from lmforge.engines.trtllm.lock import build_lock
from lmforge.engines.trtllm.quantplan import QUANT_PLAN_FILE, QuantPlan, checkpoint_quantization

log = logging.getLogger("lmforge.engines.trtllm")


def checkpoint_cache_dir(plan: QuantPlan) -> Path:
    from lmforge.paths import cache_dir

    return cache_dir("trtllm-quant") / plan.cache_key()


def is_checkpoint(folder: Path) -> bool:
    return (folder / "config.json").is_file() and checkpoint_quantization(folder) is not None


def quantize_checkpoint(
    plan: QuantPlan, source: Path, output: Path, *, timeout_s: float, progress: Callable[[str], None]
) -> Path:
    """Quantize ``source`` by ``plan`` into ``output`` (a child process); CompileError on failure."""
    progress(
        f"quantizing {plan.model_id} to {plan.quant_algo or 'unchanged weights'} / KV "
        f"{plan.kv_cache_quant_algo or 'auto'} with ModelOpt for TensorRT-LLM {plan.trtllm_version} "
        f"(key {plan.cache_key()}); deadline {timeout_s:.0f} s"
    )
    return run_child(
        "lmforge.engines.trtllm.quantize",
        QUANT_PLAN_FILE,
        plan.to_dict(),
        source,
        output,
        timeout_s=timeout_s,
        progress=progress,
        label="ModelOpt quantization",
        tag="modelopt",
        done=is_checkpoint,
    )


def ensure_checkpoint(
    plan: QuantPlan, folder: Path, *, timeout_s: float, progress: Callable[[str], None] = log.info
) -> Path:
    """The folder ``tensorrt_llm.LLM`` loads for ``plan`` (see the module docstring)."""
    found = checkpoint_quantization(folder)
    if found is not None:
        wanted = (plan.quant_algo, plan.kv_cache_quant_algo)
        clashes = [
            f"{name}: checkpoint {have!r}, configured {want!r}"
            for name, have, want in zip(("quant_algo", "kv_cache_quant_algo"), found, wanted, strict=True)
            if want is not None and have != want
        ]
        if clashes:
            raise CompileError(
                f"{folder} is a quantized checkpoint of another kind; quantize the original model again "
                "(lmforge compile) or change option.quantize / option.kv_cache_dtype:\n  "
                + "\n  ".join(clashes)
            )
        progress(
            f"serving the quantized checkpoint in {folder} ({found[0] or 'weights as they are'}, "
            f"KV {found[1] or 'auto'})"
        )
        return folder
    if is_compiled(folder):
        raise CompileError(
            f"{folder} holds TensorRT engines (TensorRT-LLM <= 1.2); TensorRT-LLM {plan.trtllm_version} "
            "loads Hugging Face checkpoints only: serve engines with the tensorrt-llm-1.2 image, or "
            "serve (or `lmforge compile`) the original model"
        )
    if not plan.quantizes:
        return folder
    cached = checkpoint_cache_dir(plan)

    def ready() -> bool:
        recorded = _recorded_key(cached)
        return is_checkpoint(cached) and recorded == plan.cache_key()

    if ready():
        progress(f"reusing the checkpoint quantized earlier for this plan: {cached}")
        return cached
    started = time.monotonic()
    with build_lock(cached, timeout_s=timeout_s, progress=progress):
        if ready():
            progress(f"another process quantized this plan meanwhile: {cached}")
            return cached
        left = max(1.0, timeout_s - (time.monotonic() - started))
        return quantize_checkpoint(plan, folder, cached, timeout_s=left, progress=progress)


def _recorded_key(folder: Path) -> str | None:
    try:
        key = json.loads((folder / QUANT_PLAN_FILE).read_text()).get("cache_key")
    except (OSError, ValueError, AttributeError):
        return None
    return key if isinstance(key, str) else None


# ------------------------------------------------------------------ the child process


def modelopt_config(mtq: Any, plan: dict[str, Any]) -> dict[str, Any]:
    """The ``mtq.quantize`` config of ``plan``: its preset (copied: ModelOpt's presets are module-level
    dicts that older releases update in place), with the KV-cache preset added."""
    config: dict[str, Any] = (
        copy.deepcopy(getattr(mtq, plan["modelopt_config"])) if plan["modelopt_config"] else {}
    )
    if plan["kv_modelopt_config"]:
        kv = copy.deepcopy(getattr(mtq, plan["kv_modelopt_config"]))
        config = mtq.update_quant_cfg_with_kv_cache_quant(config, kv["quant_cfg"])
    return config


def run(plan_path: Path, source: Path, output: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmforge.quantize.calibration import load_prompts

    try:
        import modelopt
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError as exc:
        raise SystemExit(
            f"quantizing for TensorRT-LLM needs NVIDIA ModelOpt ({exc}): pip install "
            "'nvidia-modelopt[torch]' (TensorRT-LLM depends on it; the lmforge tensorrt-llm image has it)"
        ) from None
    plan = json.loads(plan_path.read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"loading {source} on {device} (ModelOpt {modelopt.__version__})", flush=True)
    dtype = {"auto": "auto", "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    trust = bool(plan["trust_remote_code"])
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype[plan["dtype"]], trust_remote_code=trust)
    model = model.to(device).eval()
    forward_loop = None
    if plan["calib_size"]:
        prompts = load_prompts(plan["runtime"].get("calib_source") or "")
        prompts = [prompts[i % len(prompts)] for i in range(plan["calib_size"])]
        seq_len = int(plan["calib_seq_len"])

        def forward_loop(model: Any) -> None:
            with torch.no_grad():
                for number, prompt in enumerate(prompts, 1):
                    ids = tokenizer(
                        prompt, return_tensors="pt", truncation=True, max_length=seq_len
                    ).input_ids
                    model(ids.to(device))
                    if number % 64 == 0 or number == len(prompts):
                        print(f"calibrated on {number}/{len(prompts)} prompts", flush=True)

    config = modelopt_config(mtq, plan)
    mtq.quantize(model, config, forward_loop)
    print(f"exporting the {plan['quant_algo'] or 'KV-cache'} checkpoint", flush=True)
    export_hf_checkpoint(model, export_dir=str(output))
    tokenizer.save_pretrained(str(output))
    recorded = {**plan, "modelopt_version": str(modelopt.__version__), "calibration_device": device}
    plan_path.write_text(json.dumps(recorded, indent=2) + "\n")
    print(f"saved the quantized checkpoint to {output}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m lmforge.engines.trtllm.quantize PLAN_JSON SOURCE OUTPUT", file=sys.stderr)
        return 2
    run(Path(args[0]), Path(args[1]), Path(args[2]))
    return 0


if __name__ == "__main__":
    from lmforge.process import run_main

    run_main(main)
