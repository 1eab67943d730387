"""vLLM alone, as the reference the vLLM modules check lmforge against, in one process for both (a vLLM
start is ~10 CPU-seconds): ``python vllm_reference.py JOB_JSON OUT_JSON``.

Run with ``VLLM_PLUGINS=`` (no vLLM plugin loads, so lmforge's LoRA fix does not either; the one
plugin taken explicitly counts log-prob ranks, which nothing here returns) and
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (vLLM's engine core and worker run in this process, so the fix
applied here reaches the model). One engine, LoRA on with one slot, does in order:

1. ``offline``: vLLM's own ``LLM.generate`` on base-model requests ``{"prompt", "max_tokens", "stop"?}``,
   greedy, with each sampled token's log-prob (before any adapter is loaded, so the LoRA layers add
   zeros); out: ``[{"ids", "text", "logprobs", "finish_reason", "stop_reason"}]``;
2. ``lora``: a batch of ``prompts`` that alternates base / adapter / base ... (adapter ``adapter``),
   ``max_tokens`` each, greedy, as vLLM does it and again after lmforge's fix is applied in this
   process; out: ``{"raw": [[ids]...], "fixed": [[ids]...], "patched": bool}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def offline(llm: Any, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from vllm import SamplingParams

    params = [
        SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, logprobs=0, stop=r.get("stop"))
        for r in requests
    ]
    outputs = llm.generate([{"prompt": r["prompt"]} for r in requests], params)
    result = []
    for out in outputs:
        c = out.outputs[0]
        result.append(
            {
                "ids": list(c.token_ids),
                "text": c.text,
                "logprobs": [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs, strict=True)],
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
        )
    return result


def lora_batch(llm: Any, spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    from lmforge.engines.vllm import lora_fix

    lora = LoRARequest("a1", 1, spec["adapter"])
    prompts = spec["prompts"]
    loras = [lora if i % 2 else None for i in range(len(prompts))]
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True)

    def run() -> list[list[int]]:
        outs = llm.generate([{"prompt": p} for p in prompts], params, lora_request=loras)
        return [list(o.outputs[0].token_ids) for o in outs]

    raw = run()
    patched = lora_fix.apply()
    return {"raw": raw, "fixed": run(), "patched": patched}


def main() -> None:
    job_path, out_path = sys.argv[1:3]
    assert os.environ.get("VLLM_PLUGINS") == "", "run with VLLM_PLUGINS= so that no plugin loads"
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    from lmforge import import_cache
    from lmforge.process import freeze_startup_heap, pause_gc_for_startup

    import_cache.install()  # transformers' import scans from lmforge's cache, as in lmforge's processes
    pause_gc_for_startup()  # vLLM's imports and the engine's start: ~1.5 CPU-s less, as in lmforge serve
    from vllm import LLM

    from lmforge.engines.vllm import logprob_ranks

    # the ranks are not part of what this returns: counted without vLLM's compiled kernel, whose C++
    # inductor would build at the first log-prob request (~10 CPU-s with an empty cache)
    logprob_ranks.apply()

    with open(job_path) as f:
        job = json.load(f)
    llm = LLM(
        model=job["model"],
        max_model_len=1024,
        enforce_eager=True,
        dtype="float32",
        kv_cache_memory_bytes=256 << 20,
        enable_lora=True,
        max_loras=1,  # one slot: index -1 aliases it
        max_lora_rank=16,
    )
    freeze_startup_heap(collect=True)
    result = {"offline": offline(llm, job["offline"]), "lora": lora_batch(llm, job["lora"])}
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
