"""vLLM's own offline ``LLM.generate``, the reference the vLLM backend is checked against.

Run as a script (vLLM's engine must not share the test process): ``python vllm_offline.py MODEL_DIR
REQUESTS_JSON OUT_JSON``. Each request is ``{"prompt", "max_tokens", "stop"?}``, greedy, with the
sampled token's log-prob; the output is ``[{"ids", "text", "logprobs", "finish_reason", "stop_reason"}]``.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    model_dir, requests_path, out_path = sys.argv[1:4]
    from vllm import LLM, SamplingParams

    with open(requests_path) as f:
        requests = json.load(f)
    llm = LLM(
        model=model_dir,
        max_model_len=1024,
        enforce_eager=True,
        dtype="float32",
        kv_cache_memory_bytes=256 << 20,
    )
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
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
