"""The TensorRT-LLM build, run as a child process by :mod:`.compile`::

    python -m lmforge.engines.trtllm.build PLAN_JSON SOURCE_FOLDER OUTPUT_FOLDER

It turns the recorded plan into ``BuildConfig`` / ``QuantConfig`` / LLM arguments, builds (and, for
quantized plans, calibrates) through TensorRT-LLM's LLM API, and saves the engine folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from lmforge.engines.trtllm.api import TrtllmApi, load_api


def llm_kwargs(api: TrtllmApi, plan: dict[str, Any], source: str) -> dict[str, Any]:
    """Keyword arguments of ``LLM(...)`` that build ``plan`` from ``source``."""
    build = api.BuildConfig(
        max_input_len=plan["max_input_len"],
        max_seq_len=plan["max_seq_len"],
        max_batch_size=plan["max_batch_size"],
        max_num_tokens=plan["max_num_tokens"],
        max_beam_width=plan["max_beam_width"],
    )
    plugins = build.plugin_config
    plugins.paged_kv_cache = plan["paged_kv_cache"]
    plugins.context_fmha = plan["context_fmha"]
    plugins.use_paged_context_fmha = plan["paged_context_fmha"]
    plugins.use_custom_all_reduce = plan["use_custom_all_reduce"]
    if plan["lora"]:
        plugins.lora_plugin = plan["dtype"]
    kwargs: dict[str, Any] = {
        "model": source,
        "tokenizer": source,
        "dtype": plan["dtype"],
        "tensor_parallel_size": plan["tensor_parallel"],
        "pipeline_parallel_size": plan["pipeline_parallel"],
        "build_config": build,
        "gather_generation_logits": True,  # every streamed token carries its log-prob
        "trust_remote_code": bool(plan.get("trust_remote_code", False)),
    }
    if plan.get("revision"):
        kwargs["revision"] = plan["revision"]
    quant: dict[str, Any] = {}
    if plan["quant_algo"]:
        quant["quant_algo"] = getattr(api.QuantAlgo, plan["quant_algo"])
    if plan["kv_cache_quant_algo"]:
        quant["kv_cache_quant_algo"] = getattr(api.QuantAlgo, plan["kv_cache_quant_algo"])
    if plan["smoothquant_alpha"] is not None:
        quant["smoothquant_val"] = plan["smoothquant_alpha"]
    if plan["awq_block_size"] is not None:
        quant["group_size"] = plan["awq_block_size"]
    if quant:
        kwargs["quant_config"] = api.QuantConfig(**quant)
    if plan["lora"]:
        kwargs["enable_lora"] = True
        kwargs["lora_config"] = api.LoraConfig(
            max_lora_rank=plan["max_lora_rank"], max_loras=plan["max_loras"]
        )
    return kwargs


def build(plan_path: Path, source: Path, output: Path, api: TrtllmApi | None = None) -> None:
    api = api or load_api()
    plan = json.loads(plan_path.read_text())
    print(f"building {plan['model_id']} ({plan['cache_key']}) with TensorRT-LLM {api.version}", flush=True)
    llm = api.LLM(**llm_kwargs(api, plan, str(source)))
    try:
        llm.save(str(output))
    finally:
        llm.shutdown()
    print(f"saved the engine to {output}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m lmforge.engines.trtllm.build PLAN_JSON SOURCE OUTPUT", file=sys.stderr)
        return 2
    build(Path(args[0]), Path(args[1]), Path(args[2]))
    return 0


if __name__ == "__main__":
    from lmforge.process import run_main

    run_main(main)
