"""FAKE tensorrt_llm._tensorrt_engine (tests only): the TensorRT-engine flavour of ``LLM``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tensorrt_llm.builder import BuildConfig
from tensorrt_llm.sampling_params import SamplingParams


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False


def fake_next_token(prompt: list[int], generated: list[int], vocab: int, shift: int = 0) -> int:
    """The fake engine's deterministic "model": a function of the last token and the position (and, for a
    LoRA request, of the adapter: ``shift``)."""
    last = (generated or prompt)[-1]
    return (last * 31 + 7 * (len(generated) + 1) + shift) % (vocab - 10) + 5


def fake_lora_shift(lora_path: str) -> int:
    """The fake's stand-in for an adapter's effect on the tokens: a number drawn from its weights file."""
    digest = hashlib.sha256((Path(lora_path) / "adapter_model.safetensors").read_bytes()).digest()
    return int.from_bytes(digest[:2], "big") % 997 + 1


class GenerationResult:
    def __init__(
        self,
        llm: LLM,
        request_id: int,
        prompt: list[int],
        params: SamplingParams,
        streaming: bool,
        shift: int = 0,
    ) -> None:
        self._llm, self._prompt, self._params, self._streaming = llm, prompt, params, streaming
        self._shift = shift
        self._aborted = False
        self.output = RequestOutput(request_id, prompt, [CompletionOutput()])

    def abort(self) -> None:
        self._aborted = True
        self._llm.aborted.append(self.output.request_id)

    def __aiter__(self) -> GenerationResult:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.output.finished:
            raise StopAsyncIteration
        await asyncio.sleep(0.001)
        completion = self.output.outputs[0]
        if self._aborted:
            completion.finish_reason = "cancelled"
            self.output.finished = True
            return self.output
        token = fake_next_token(self._prompt, completion.token_ids, self._llm.vocab, self._shift)
        completion.token_ids = [*completion.token_ids, token]
        completion.logprobs = [
            *completion.logprobs,
            {token: Logprob(-0.5 - 0.01 * len(completion.token_ids), 1)},
        ]
        if (
            self._llm.eos_after is not None
            and len(completion.token_ids) >= self._llm.eos_after
            and not self._params.ignore_eos
        ):
            completion.token_ids[-1] = self._llm.eos_id
            completion.logprobs[-1] = {self._llm.eos_id: Logprob(-0.1, 1)}
            completion.finish_reason = "stop"
            self.output.finished = True
        elif len(completion.token_ids) >= self._params.max_tokens:
            completion.finish_reason = "length"
            self.output.finished = True
        return self.output


class LLM:
    """FAKE: builds (save) and serves with the same constructor keywords lmforge passes."""

    instances: ClassVar[list[LLM]] = []

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        *,
        pipeline_parallel_size: int = 1,
        build_config: BuildConfig | None = None,
        quant_config: Any = None,
        kv_cache_config: Any = None,
        enable_lora: bool = False,
        lora_config: Any = None,
        gather_generation_logits: bool = False,
        **kwargs: Any,
    ) -> None:
        if kwargs:  # like TrtLlmArgs (a strict model): unknown arguments are refused
            raise ValueError(f"LLM() got unexpected keyword arguments {sorted(kwargs)}")
        self.model = Path(model)
        self.kwargs = {
            "dtype": dtype,
            "tensor_parallel_size": tensor_parallel_size,
            "quant_config": quant_config,
            "kv_cache_config": kv_cache_config,
            "build_config": build_config,
        }
        self.build_config = build_config
        self.gather_generation_logits = gather_generation_logits
        from tensorrt_llm.lora_helper import LoraConfig

        if lora_config is not None and not isinstance(lora_config, LoraConfig):
            raise TypeError(f"lora_config must be a LoraConfig, got {type(lora_config).__name__}")
        self.enable_lora = enable_lora
        self.lora_config = lora_config
        # the host-memory adapter cache (TensorRT-LLM's PEFT cache): adapter id -> its effect, LRU order
        self.lora_cache: OrderedDict[int, int] = OrderedDict()
        self.lora_loads: list[int] = []
        self.lora_requests: list[Any] = []
        self.aborted: list[int] = []
        self._next = 0
        config = json.loads((self.model / "config.json").read_text())
        pretrained = config.get("pretrained_config", config)
        self.vocab = int(pretrained.get("vocab_size", 1000))
        self.eos_id = int(pretrained.get("eos_token_id") or 2)
        self.eos_after = (
            int(os.environ["FAKE_TRTLLM_EOS_AFTER"]) if os.environ.get("FAKE_TRTLLM_EOS_AFTER") else None
        )
        LLM.instances.append(self)

    def save(self, engine_dir: str) -> None:
        out = Path(engine_dir)
        print("[fake trtllm] converting checkpoint", flush=True)
        if os.environ.get("FAKE_TRTLLM_BUILD_COUNT"):
            with open(os.environ["FAKE_TRTLLM_BUILD_COUNT"], "a") as f:
                f.write("build\n")
        time.sleep(float(os.environ.get("FAKE_TRTLLM_BUILD_SECONDS", "0")))
        if os.environ.get("FAKE_TRTLLM_FAIL"):
            print("[fake trtllm] error: out of memory while building the engine", flush=True)
            raise RuntimeError("fake build failure")
        hf = json.loads((self.model / "config.json").read_text())
        assert self.build_config is not None
        build = {
            k: getattr(self.build_config, k)
            for k in ("max_input_len", "max_seq_len", "max_batch_size", "max_num_tokens")
        }
        pretrained = {
            "architecture": (hf.get("architectures") or ["LlamaForCausalLM"])[0],
            "dtype": self.kwargs["dtype"],
            "vocab_size": hf.get("vocab_size", 1000),
            "hidden_size": hf.get("hidden_size"),
            "intermediate_size": hf.get("intermediate_size"),
            "num_key_value_heads": hf.get("num_key_value_heads"),
            "num_attention_heads": hf.get("num_attention_heads"),
            "num_hidden_layers": hf.get("num_hidden_layers"),
            "max_position_embeddings": hf.get("max_position_embeddings"),
            "eos_token_id": hf.get("eos_token_id"),
        }
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(
            json.dumps({"version": "1.2.1", "pretrained_config": pretrained, "build_config": build})
        )
        for rank in range(self.kwargs["tensor_parallel_size"]):
            (out / f"rank{rank}.engine").write_bytes(b"FAKE ENGINE")
        print("[fake trtllm] engine saved", flush=True)

    def generate_async(
        self,
        inputs: list[int],
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        cache_salt: str | None = None,
    ) -> GenerationResult:
        asyncio.get_running_loop()  # like the real one: requests are made inside the event loop
        if sampling_params is not None and sampling_params.logprobs and not self.gather_generation_logits:
            raise ValueError(
                "`sampling_params.logprobs` requires `gather_generation_logits=True` to be passed explicitly "
                "to the `LLM()` constructor."
            )
        shift = 0 if lora_request is None else self._lora(lora_request)
        self._next += 1
        return GenerationResult(
            self, self._next, list(inputs), sampling_params or SamplingParams(), streaming, shift
        )

    def _lora(self, request: Any) -> int:
        from tensorrt_llm.executor.request import LoRARequest

        if not isinstance(request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(request).__name__}")
        if not self.enable_lora or self.lora_config is None:
            raise ValueError(
                "a LoRA request needs an LLM built and loaded with enable_lora and a lora_config"
            )
        self.lora_requests.append(request)
        if request.lora_int_id in self.lora_cache:  # cached by id: the path is not read again
            self.lora_cache.move_to_end(request.lora_int_id)
            return self.lora_cache[request.lora_int_id]
        shift = fake_lora_shift(request.lora_path)
        self.lora_loads.append(request.lora_int_id)
        self.lora_cache[request.lora_int_id] = shift
        capacity = self.lora_config.max_cpu_loras or self.lora_config.max_loras or 1
        while len(self.lora_cache) > capacity:
            self.lora_cache.popitem(last=False)
        return shift

    def shutdown(self) -> None:
        pass
