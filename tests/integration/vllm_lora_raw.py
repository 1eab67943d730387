"""vLLM alone (no lmforge plugin) on a batch that mixes base-model and LoRA requests, then the same batch
after lmforge's fix is applied in this process.

Run as a script with ``VLLM_PLUGINS=`` (no vLLM plugin loads, so lmforge's fix does not either) and
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (vLLM's engine core and worker run in this process, so the fix
applied here reaches the model): ``python vllm_lora_raw.py MODEL_DIR ADAPTER_DIR PROMPTS_JSON OUT_JSON``.
Prompts alternate base / adapter / base ...; the output is ``{"raw": [[ids]...], "fixed": [[ids]...],
"patched": bool}``.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    model_dir, adapter_dir, prompts_path, out_path = sys.argv[1:5]
    assert os.environ.get("VLLM_PLUGINS") == "", "run with VLLM_PLUGINS= so that no plugin loads"
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from lmforge.engines.vllm import lora_fix

    with open(prompts_path) as f:
        spec = json.load(f)
    llm = LLM(
        model=model_dir,
        max_model_len=512,
        enforce_eager=True,
        dtype="float32",
        kv_cache_memory_bytes=128 << 20,
        enable_lora=True,
        max_loras=1,  # one slot: index -1 aliases it
        max_lora_rank=16,
    )
    lora = LoRARequest("a1", 1, adapter_dir)
    prompts = spec["prompts"]
    loras = [lora if i % 2 else None for i in range(len(prompts))]
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True)

    def run() -> list[list[int]]:
        outs = llm.generate([{"prompt": p} for p in prompts], params, lora_request=loras)
        return [list(o.outputs[0].token_ids) for o in outs]

    raw = run()
    patched = lora_fix.apply()
    fixed = run()
    with open(out_path, "w") as f:
        json.dump({"raw": raw, "fixed": fixed, "patched": patched}, f)


if __name__ == "__main__":
    main()
