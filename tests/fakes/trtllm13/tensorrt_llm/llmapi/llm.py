"""FAKE tensorrt_llm.llmapi.llm (tests only): the PyTorch-backend ``LLM`` (and ``AsyncLLM``) of 1.3."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tensorrt_llm.sampling_params import SamplingParams

#: the TorchLlmArgs fields the fake accepts (all recorded in tests/fakes/trtllm_api_1.3.json)
_ARGS = {
    "pipeline_parallel_size": 1,
    "max_batch_size": 2048,
    "max_input_len": 1024,
    "max_seq_len": None,
    "max_num_tokens": 8192,
    "kv_cache_config": None,
    "cuda_graph_config": None,
    "torch_compile_config": None,
    "enable_lora": False,
    "lora_config": None,
    "speculative_config": None,
    "enable_chunked_prefill": False,
    "orchestrator_type": None,
    "backend": None,
}


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class RequestOutput:
    """One request's result, updated in place per streamed step (as the real GenerationResult)."""

    def __init__(self, llm: LLM, request_id: int, prompt: list[int], params: SamplingParams, shift: int):
        self.request_id = request_id
        self.prompt = None
        self.prompt_token_ids = prompt
        self.outputs = [CompletionOutput(0)]
        self.finished = False
        self._llm, self._params, self._shift, self._aborted = llm, params, shift, False

    def abort(self) -> None:
        self._aborted = True
        self._llm.aborted.append(self.request_id)

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        await asyncio.sleep(0.001)
        out = self.outputs[0]
        if self._aborted:
            out.finish_reason, self.finished = "cancelled", True
            return self
        token = fake_next_token(self.prompt_token_ids, out.token_ids, self._llm.vocab, self._shift)
        out.token_ids = [*out.token_ids, token]
        out.logprobs = [*out.logprobs, {token: Logprob(-0.5 - 0.01 * len(out.token_ids), 1)}]
        params, eos_after = self._params, self._llm.eos_after
        stops = set(params.stop_token_ids or ())
        if eos_after is not None and len(out.token_ids) >= eos_after and not params.ignore_eos:
            out.token_ids[-1] = self._llm.eos_id
            out.logprobs[-1] = {self._llm.eos_id: Logprob(-0.1, 1)}
            out.finish_reason, self.finished = "stop", True
        elif token in stops and len(out.token_ids) >= (params.min_tokens or 0):
            out.finish_reason, out.stop_reason, self.finished = "stop", token, True
        elif len(out.token_ids) >= params.max_tokens:
            out.finish_reason, self.finished = "length", True
        return self


def fake_next_token(prompt: list[int], generated: list[int], vocab: int, shift: int = 0) -> int:
    """The fake's deterministic "model": a function of the last token, the position and the adapter."""
    last = (generated or prompt)[-1]
    return (last * 31 + 7 * (len(generated) + 1) + shift) % (vocab - 10) + 5


def fake_lora_shift(lora_path: str) -> int:
    """The fake's stand-in for an adapter's effect: a number drawn from its weights file."""
    digest = hashlib.sha256((Path(lora_path) / "adapter_model.safetensors").read_bytes()).digest()
    return int.from_bytes(digest[:2], "big") % 997 + 1


class LLM:
    """FAKE PyTorch-backend LLM: takes the Hugging Face folder itself; nothing is built."""

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
        **kwargs: Any,
    ) -> None:
        for key in kwargs:  # like BaseLLM: anything that is not a TorchLlmArgs field is refused
            if key not in _ARGS:
                raise ValueError(f"{type(self).__name__} got invalid argument: {key}")
        if kwargs.get("backend") not in (None, "pytorch"):
            raise ValueError("the TensorRT backend was removed; PyTorch is the only backend")
        self.args = {**_ARGS, **kwargs, "dtype": dtype, "tensor_parallel_size": tensor_parallel_size}
        self.model = Path(model)
        config = json.loads((self.model / "config.json").read_text())  # a HF folder, never an engine
        if "build_config" in config:
            raise ValueError(f"{model} is a TensorRT engine folder; TensorRT-LLM 1.3 loads checkpoints only")
        quant = self.model / "hf_quant_config.json"
        self.quant_algo = (
            json.loads(quant.read_text())["quantization"]["quant_algo"] if quant.is_file() else None
        )
        self.vocab = int(config.get("vocab_size", 1000))
        self.eos_id = int(config.get("eos_token_id") or 2)
        eos_after = os.environ.get("FAKE_TRTLLM_EOS_AFTER")
        self.eos_after = int(eos_after) if eos_after else None
        from tensorrt_llm._torch.peft.lora.config import LoraConfig

        lora = kwargs.get("lora_config")
        if lora is not None and not isinstance(lora, LoraConfig):
            raise TypeError(f"lora_config must be a LoraConfig, got {type(lora).__name__}")
        self.lora_config = lora
        self.lora_cache: OrderedDict[int, int] = OrderedDict()
        self.lora_loads: list[int] = []
        self.lora_requests: list[Any] = []
        self.aborted: list[int] = []
        self._next = 0
        self._ready = True
        if os.environ.get("FAKE_TRTLLM_LOADS"):
            with open(os.environ["FAKE_TRTLLM_LOADS"], "a") as f:
                f.write(f"{type(self).__name__} {model}\n")
        LLM.instances.append(self)

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
    ) -> RequestOutput:
        asyncio.get_running_loop()  # like the real one: requests are made inside the event loop
        if not self._ready:
            raise RuntimeError("AsyncLLM is not set up: await llm.setup_async() first")
        shift = 0 if lora_request is None else self._lora(lora_request)
        self._next += 1
        return RequestOutput(self, self._next, list(inputs), sampling_params or SamplingParams(), shift)

    def _lora(self, request: Any) -> int:
        from tensorrt_llm.executor.request import LoRARequest

        if not isinstance(request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(request).__name__}")
        if self.lora_config is None:
            raise ValueError("a LoRA request needs an LLM made with a lora_config")
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


class AsyncLLM(LLM):
    """FAKE AsyncLLM: an LLM on the Ray orchestrator that must be set up with ``await`` before use."""

    def __init__(
        self,
        placement_groups: list[Any] | None = None,
        placement_bundle_indices: list[list[int]] | None = None,
        per_worker_gpu_share: float | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        kwargs["orchestrator_type"] = "ray"
        super().__init__(*args, **kwargs)
        self._ready = False

    async def setup_async(self) -> AsyncLLM:
        self._ready = True
        return self
