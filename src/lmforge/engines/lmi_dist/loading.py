"""LMI-Dist startup (in the engine core and every tensor-parallel rank): load tokenizer and model, size
the KV cache, set up transformers' batching loop (the caller starts it)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist.lora import LoraLayers
    from lmforge.engines.lmi_dist.prompt_scores import ForwardGate
    from lmforge.engines.lmi_dist.sampler import RequestSampler
    from lmforge.engines.lmi_dist.sizing import KvCachePlan
    from lmforge.engines.structured import Grammars

log = logging.getLogger("lmforge.engines.lmi_dist")

_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass
class Built:
    tokenizer: Any
    model: Any
    manager: Any
    sampler: RequestSampler
    plan: KvCachePlan
    max_model_len: int
    eos_ids: list[int]
    vocab_size: int
    gate: ForwardGate
    """Every forward pass of ``model`` takes it: the batch's steps and the prompt scorer's passes."""
    lora: LoraLayers | None = None


_PR_SET_THP_DISABLE = 41
_PR_GET_THP_DISABLE = 42


@contextlib.contextmanager
def small_pages() -> Iterator[None]:
    """Memory first touched inside is backed by ordinary 4 KiB pages, not transparent huge pages (Linux:
    the process's ``PR_SET_THP_DISABLE`` flag, put back as it was on exit; elsewhere nothing changes).

    The engine core asks PyTorch for huge pages (``THP_MEM_ALLOC_ENABLE=1``, :mod:`.client`) because
    the weights a decode step streams read ~5-15 % faster from them. The KV cache is different: one
    block of up to many GiB that transformers zero-fills at once when the engine starts, and getting
    that many huge pages makes the kernel compact memory first, page by page, when the page cache
    holds most of it (the usual state after reading the weights): SmolLM2-135M's 1.5 GiB cache took
    4.5 s to allocate with huge pages on this machine and 0.65 s without. Memory touched after the
    block, and the weights touched before it, keep their huge pages."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    before = libc.prctl(_PR_GET_THP_DISABLE, 0, 0, 0, 0) if libc is not None else -1
    if before not in (0, 1):  # not Linux, or a kernel without the flag
        yield
        return
    assert libc is not None
    libc.prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(_PR_SET_THP_DISABLE, before, 0, 0, 0)


def build(cfg: ServingConfig) -> Built:
    """Load tokenizer and model, size the KV cache and set up the continuous-batching loop, ready for
    ``built.manager.start()``.

    Runs on every tensor-parallel rank (``RANK``/``WORLD_SIZE`` in the environment), which must all
    make the same calls in the same order: the cache sizing and the loop talk to each other.
    """
    phases: dict[str, float] = {}  # startup phase -> seconds, logged in one line (bench/cold_start.py)
    clock = [time.monotonic()]

    def mark(phase: str) -> None:
        phases[phase], clock[0] = time.monotonic() - clock[0], time.monotonic()

    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        ContinuousBatchingConfig,
        DistributedConfig,
        GenerationConfig,
    )
    from transformers.generation.continuous_batching.model_runner import infer_max_single_request_tokens

    from lmforge.engines.lmi_dist import attention, compat
    from lmforge.engines.lmi_dist import sampler as sampler_mod
    from lmforge.engines.lmi_dist.distributed import tensor_parallel_size
    from lmforge.engines.lmi_dist.prompt_scores import ForwardGate
    from lmforge.engines.lmi_dist.sizing import kv_bytes_per_token, plan_kv_cache
    from lmforge.process import freeze_startup_heap

    compat.check_classes()
    # the imports ran without the cyclic collector (lmforge.process.pause_gc_for_startup): what they
    # made is for good (frozen, their little garbage with it), and the weights load with the collector
    # on, so that a cycle holding tensors (an exception's traceback, say) is freed at once. Kept for the
    # start: the pause and freezes cut the engine core's start 3.9 -> 2.8 CPU-s (tiny model, median of
    # 5, 2026-12; lmforge.process.pause_gc_for_startup has the figures)
    freeze_startup_heap(collect=False)
    mark("import")
    world = tensor_parallel_size(cfg)
    if cfg.enable_lora and world > 1:
        raise LmforgeError(
            "lmi-dist serves LoRA adapters on one device only: option.enable_lora=true needs "
            f"option.tensor_parallel_degree=1 (got {world}); use option.rolling_batch=vllm for both"
        )
    if cfg.pipeline_parallel_degree != 1:
        raise LmforgeError(
            f"lmi-dist supports tensor parallelism only: option.pipeline_parallel_degree="
            f"{cfg.pipeline_parallel_degree} must be 1"
        )
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    path = cfg.model_path
    if path is None:
        raise LmforgeError(
            f"option.model_id={cfg.model_id!r} is not a local folder; lmi-dist loads local models only "
            "(download it first, or point option.model_id at the folder)"
        )
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if cfg.revision:
        kwargs["revision"] = cfg.revision
    tokenizer = AutoTokenizer.from_pretrained(str(path), **kwargs)
    mark("tokenizer")
    if world > 1:
        kwargs["distributed_config"] = DistributedConfig(tp_plan="auto")
    from lmforge.quantize.start_check import check_at_start

    check_at_start(cfg, path, "lmi-dist")  # the quantize manifest: hit / miss (why) / none, or refused
    quant, checkpoint = quantization(cfg, path, world, torch.cuda.is_available())
    if checkpoint:
        from lmforge.quantize import MANIFEST, read_manifest

        made = read_manifest(path)
        log.info(
            "lmi-dist: %s checkpoint (%s)",
            quant,
            f"{MANIFEST}: lmforge compile from {made.get('source', {}).get('weights', '?')}, LM head "
            f"{made.get('lm_head', '?')}, {made.get('libraries', {})}"
            if made
            else f"no {MANIFEST}: made elsewhere; its quantization_config decides",
        )
        model = _load_w4a16(path, kwargs) if quant == "gptq" else _load_w8a8(path, kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=_DTYPES.get(cfg.dtype, "auto"), **kwargs
        )
    if world == 1 and torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    if world == 1:
        from lmforge.engines.lmi_dist import lean_layers
        from lmforge.engines.lmi_dist.cpu_linear import prepack, quantize_int8

        # LoRA adapts q/k/v and gate/up one by one: with adapters they stay separate layers
        lean_layers.install(model, fuse=not cfg.enable_lora)
        if quant is None:
            prepack(model, cfg.max_rolling_batch_size)
        elif quant == "gptq":
            from lmforge.engines.lmi_dist.cpu_linear import quantize_int4

            quantize_int4(model)
            prepack(model, cfg.max_rolling_batch_size)  # what the checkpoint left in float32
        else:
            from lmforge.quantize.w8a8 import rtn_int8

            started = time.monotonic()
            quantize_int8(model, rtn_int8, checkpoint=checkpoint)
            prepack(model, cfg.max_rolling_batch_size)  # what the checkpoint left in float32
            if not checkpoint:
                log.warning(
                    "lmi-dist: option.quantize=%s: quantized the weights at load in %.1f s (int8 weights "
                    "rounded to nearest, int8 activations per token); `lmforge compile %s --quantize %s "
                    "-o OUT` writes the quantized checkpoint once and saves this at every start",
                    quant,
                    time.monotonic() - started,
                    path,
                    quant,
                )
    gate = ForwardGate(model)
    mark("weights")

    text_cfg = model.config.get_text_config()
    model_max = int(getattr(text_cfg, "max_position_embeddings", 0) or 0) or 2048
    max_model_len = min(cfg.max_model_len or model_max, model_max)
    if cfg.max_model_len and cfg.max_model_len > model_max:
        log.warning(
            "option.max_model_len=%d exceeds the model's max_position_embeddings=%d; using %d",
            cfg.max_model_len,
            model_max,
            model_max,
        )
    heads = text_cfg.num_attention_heads
    head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // heads
    kv_heads = getattr(text_cfg, "num_key_value_heads", None) or heads
    plan = plan_kv_cache(
        bytes_per_token=kv_bytes_per_token(
            num_layers=text_cfg.num_hidden_layers,
            num_kv_heads=max(1, kv_heads // world),
            head_dim=head_dim,
            dtype_bytes=torch.finfo(model.dtype).bits // 8,
        ),
        max_model_len=max_model_len,
        max_batch_size=cfg.max_rolling_batch_size,
        prefill_tokens=cfg.max_rolling_batch_prefill_tokens,
        memory_budget_bytes=cfg.kv_cache_memory_mb * 2**20 if cfg.kv_cache_memory_mb else None,
    )
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    gen_config = GenerationConfig(
        do_sample=False,
        eos_token_id=eos_ids or None,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=cfg.default_max_new_tokens,
    )
    cb_config = ContinuousBatchingConfig(
        page_size=plan.page_size,
        num_blocks=plan.num_blocks,
        max_batch_tokens=plan.max_batch_tokens,
        return_logprobs=False,
        # Shared prefix blocks hold K/V computed with one adapter; with LoRA they must not be shared.
        allow_block_sharing=not cfg.enable_lora,
        # Our sampler runs Python per row: no graph capture, no overlapped (async) batches.
        use_cuda_graph=False,
        use_async_batching=False,
    )
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)
    attention.install()
    manager = model.init_continuous_batching(
        generation_config=gen_config, continuous_batching_config=cb_config
    )
    vocab_size = int(text_cfg.vocab_size)

    def grammars() -> Grammars:
        from lmforge.engines.structured import Grammars

        return Grammars(tokenizer, vocab_size, eos_ids)

    sampler = sampler_mod.RequestSampler(grammars, eos_ids)
    lora = None
    if cfg.enable_lora:
        from lmforge.engines.lmi_dist.lora import LoraLayers

        lora = LoraLayers(model, cfg.max_cpu_loras or cfg.max_loras)
    sampler_mod.install(manager, sampler, lora.on_batch if lora is not None else None)
    mark("batching_init")
    if manager.batch_processor is None:  # what warmup() does first: allocate the paged KV cache
        with small_pages():
            manager.batch_processor = manager._create_batch_processor()
    compat.check_manager(manager)
    sampler_mod.take_choices(manager.batch_processor.model_runner, sampler)
    mark("kv_cache")
    manager.warmup()  # builds the cache now, so its real capacity is known before serving
    mark("warmup")
    capacity = infer_max_single_request_tokens(manager.batch_processor.cache)
    if capacity < max_model_len:
        log.warning("KV cache fits %d tokens per sequence; max_model_len lowered to it", capacity)
        max_model_len = capacity
    log.info("lmi-dist startup phases (s): %s", " ".join(f"{k}={v:.3f}" for k, v in phases.items()))
    log.info(
        "lmi-dist ready: %s on %s, dtype=%s, tensor parallel %d, max_model_len=%d, "
        "KV cache %d blocks x %d tokens (%.1f MiB), prefill chunk %d tokens",
        path,
        model.device.type,
        model.dtype,
        world,
        max_model_len,
        plan.num_blocks,
        plan.page_size,
        plan.total_bytes / 2**20,
        plan.max_batch_tokens,
    )
    return Built(tokenizer, model, manager, sampler, plan, max_model_len, eos_ids, vocab_size, gate, lora)


def quantization(cfg: ServingConfig, path: Any, world: int, cuda: bool) -> tuple[str | None, bool]:
    """(the method LMI-Dist serves the model with, or None; whether the folder is a quantized
    checkpoint). Refuses what it cannot serve, naming the option, never falling back to full precision:
    an unknown or unbuilt method, a method this hardware lacks, a checkpoint whose scheme its kernels do
    not compute, an ``option.quantize`` that disagrees with the checkpoint, tensor parallelism, a GPU
    (the int8 kernels are CPU ones) or a dtype other than fp32."""
    from pathlib import Path

    from lmforge.quantize import METHODS, checkpoint_scheme, method, quantization_config

    qc = quantization_config(Path(path))
    asked = cfg.quantize.strip().lower() if cfg.quantize else None
    if qc is not None:
        have = checkpoint_scheme(qc)
        if asked and asked not in METHODS:
            method(asked)  # unknown: the error lists the choices
        if asked and asked != have:
            raise LmforgeError(
                f"option.quantize={cfg.quantize} but {path} is already quantized ({have}, config.json "
                "quantization_config); remove option.quantize, or serve the unquantized folder"
            )
    elif asked:
        have = method(asked, cpu_only=not cuda).name
        if METHODS[have].needs_calibration:
            raise LmforgeError(
                f"option.quantize={cfg.quantize}: {have} is calibrated on a prompt set, which lmi-dist "
                f"does not do at load; make the checkpoint first (lmforge compile {path} --quantize {have} "
                "-o OUT) and serve OUT, or use option.quantize=w8a8, which quantizes at load"
            )
    else:
        return None, False
    where = (
        "tensor parallelism (option.tensor_parallel_degree > 1: shards of quantized weights are not built "
        "yet)"
        if world > 1
        else ("a GPU (its int8 and int4 kernels are CPU ones so far)" if cuda else None)
    )
    if where:
        raise LmforgeError(f"lmi-dist serves {have} (option.quantize / quantization_config) without {where}")
    if cfg.dtype not in ("auto", "fp32"):
        raise LmforgeError(
            f"option.dtype={cfg.dtype} with {have}: lmi-dist's quantized layers compute in float32; set "
            "option.dtype=fp32 (or leave it unset)"
        )
    return have, qc is not None


def _load_w8a8(path: Any, kwargs: dict[str, Any]) -> Any:
    """A compressed-tensors W8A8 folder as a float32 model whose linear weights hold the int8 values,
    each with its scale (``cpu_linear.W_SCALE``) for ``cpu_linear.quantize_int8``; so does the input
    embedding when the checkpoint quantized it (its ``Embedding`` group: the matrix of the int8 LM head
    it is tied to, stored once). transformers loads it without its quantization_config (its
    compressed-tensors path would decompress to float); the scales come from the safetensors files."""
    import json
    from pathlib import Path

    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    from lmforge.engines.lmi_dist.cpu_linear import W_SCALE

    config = AutoConfig.from_pretrained(str(path), **kwargs)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_pretrained(str(path), config=config, dtype=torch.float32, **kwargs)
    modules = dict(model.named_modules())
    missing = []
    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else [p.name for p in sorted(folder.glob("*.safetensors"))]
    )
    found = 0
    for name in files:
        with safe_open(str(folder / name), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                if not key.endswith(".weight_scale"):
                    continue
                module = modules.get(key.removesuffix(".weight_scale"))
                if not isinstance(module, torch.nn.Linear | torch.nn.Embedding):
                    missing.append(key)
                    continue
                setattr(module, W_SCALE, f.get_tensor(key).float().reshape(-1, 1))
                found += 1
    if missing or not found:
        raise LmforgeError(
            f"{path}: W8A8 checkpoint whose scales match no linear layer or embedding of the model "
            f"({', '.join(missing[:3]) or 'no weight_scale tensors'})"
        )
    return model


def _load_w4a16(path: Any, kwargs: dict[str, Any]) -> Any:
    """A compressed-tensors W4A16 (pack-quantized) folder as a float32 model whose linear weights hold
    the int4 values (-8..7), each with its group scales (``cpu_linear.W_SCALE``, out x groups) for
    ``cpu_linear.quantize_int4``. transformers loads the rest of the model without the
    quantization_config (the packed weights are not its ``weight`` tensors, so it initialises those,
    quietly: they are replaced here); the packed values and scales come from the safetensors files."""
    import json
    from pathlib import Path

    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import (  # type: ignore[import-untyped]
        unpack_from_int32,
    )
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from lmforge.engines.lmi_dist.cpu_linear import W_SCALE

    config = AutoConfig.from_pretrained(str(path), **kwargs)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized" weights: the packed ones, filled in below
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), config=config, dtype=torch.float32, **kwargs)
    finally:
        hf_logging.set_verbosity(level)
    modules = dict(model.named_modules())
    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else [p.name for p in sorted(folder.glob("*.safetensors"))]
    )
    tensors: dict[str, Any] = {}
    for name in files:
        with safe_open(str(folder / name), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                if key.endswith((".weight_packed", ".weight_scale", ".weight_shape")):
                    tensors[key] = f.get_tensor(key)
    prefixes = sorted(k.removesuffix(".weight_packed") for k in tensors if k.endswith(".weight_packed"))
    bad = [
        p
        for p in prefixes
        if not isinstance(modules.get(p), torch.nn.Linear)
        or f"{p}.weight_scale" not in tensors
        or f"{p}.weight_shape" not in tensors
    ]
    if bad or not prefixes:
        raise LmforgeError(
            f"{path}: W4A16 checkpoint whose packed weights match no linear layer of the model, or lack "
            f"their scale or shape ({', '.join(bad[:3]) or 'no weight_packed tensors'})"
        )
    with torch.no_grad():
        for prefix in prefixes:
            module = modules[prefix]
            shape = torch.Size(tensors[f"{prefix}.weight_shape"].tolist())
            if shape != module.weight.shape:
                raise LmforgeError(
                    f"{path}: {prefix}.weight_shape {list(shape)} is not the model's "
                    f"{list(module.weight.shape)}"
                )
            values = unpack_from_int32(tensors[f"{prefix}.weight_packed"], 4, shape)
            module.weight.data = values.float()
            setattr(module, W_SCALE, tensors[f"{prefix}.weight_scale"].float().reshape(shape[0], -1))
    return model
