"""``lmforge compile DIR`` for vLLM: start the engine once, as serving would, and keep what it compiled.

The engine is lmforge's own :class:`~.engine.VllmEngine` with the model folder's resolved configuration
(``serving.properties`` and the ``OPTION_*`` environment, as ``lmforge serve`` reads them), so the
engine arguments, the CPU KV-cache sizing and vLLM's environment are the ones a later start computes;
only vLLM's cache folder differs (an empty one, :attr:`VllmEngine.compile_capture`). What vLLM wrote
there becomes ``DIR/lmforge-compiled/vllm/`` (:func:`.compile_cache.write_compiled`).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.vllm.compile_cache import (
    AOT_DIR,
    BACKEND_DIR,
    CACHE_DIR,
    COMPILED_DIR,
    StartFacts,
    compiled_folder,
    decide,
    write_compiled,
)
from lmforge.engines.vllm.compile_manifest import Decision, Manifest, compiled_settings

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CompilePlan:
    """What ``lmforge compile`` would do (``--dry-run``)."""

    model_dir: Path
    output: Path
    settings: dict[str, Any]
    facts: StartFacts
    existing: Decision
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": "vllm",
            "model_dir": str(self.model_dir),
            "writes": str(compiled_folder(self.output)),
            "compiled_settings": self.settings,
            "target": self.facts.target.to_dict(),
            "env": self.facts.env,
            "existing": self.existing.line(),
            "notes": list(self.notes),
        }

    def render(self) -> str:
        target = self.facts.target
        machine = (
            f"{target.gpu} (CUDA {target.cuda})"
            if target.device == "cuda"
            else f"{target.arch} CPU [{' '.join(target.cpu_flags) or 'flags unknown'}]"
        )
        lines = [
            "vLLM compile plan (start the engine once, as `lmforge serve` would; keep what it compiled)",
            f"  model folder: {self.model_dir}",
            f"  writes:       {compiled_folder(self.output)}/ (manifest.json, cache/)",
            f"  for:          vLLM {target.vllm}, torch {target.torch}, Python {target.python}, {machine}",
            "  compiled configuration (a later start with other values compiles just in time):",
        ]
        lines += [f"    {name} = {value}" for name, value in self.settings.items()]
        if self.facts.env:
            lines.append("  vLLM environment: " + ", ".join(f"{k}={v}" for k, v in self.facts.env.items()))
        lines.append(f"  now: {self.existing.line()}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def engine_settings(
    config: ServingConfig, extra_options: Mapping[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """The engine arguments a start of ``config`` gives vLLM (as :meth:`VllmEngine.start` computes them:
    lmforge's mapping, then the CPU KV-cache sizing), and notes on values that depend on this machine."""
    from lmforge.engines.vllm.options import engine_kwargs

    kwargs = engine_kwargs(config, extra_options)
    notes: list[str] = []
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from lmforge.engines.vllm.cpu_sizing import cpu_cache_kwargs

        sized, _note = cpu_cache_kwargs(config, kwargs, extra_options)
        kwargs.update(sized)
        if config.max_model_len is None and "max_model_len" in sized:
            notes.append(
                f"max_model_len = {sized['max_model_len']} was sized from this machine's free memory; set "
                "option.max_model_len so that every start compiles for (and matches) the same length"
            )
        if config.enable_lora:
            notes.append(
                "vLLM's CPU platform runs LoRA models without torch.compile: only vLLM's model "
                "inspection is kept (it still saves a subprocess at every start)"
            )
    if config.enforce_eager:
        notes.append("option.enforce_eager=true: vLLM compiles nothing; only its model inspection is kept")
    return kwargs, notes


def plan(config: ServingConfig, extra_options: Mapping[str, str], output: Path) -> CompilePlan:
    kwargs, notes = engine_settings(config, extra_options)
    facts = StartFacts.collect(config, kwargs)
    assert config.model_dir is not None
    existing = decide(output, "auto", lambda: facts)
    return CompilePlan(config.model_dir, output, compiled_settings(kwargs), facts, existing, tuple(notes))


def decide_here(config: ServingConfig, extra_options: Mapping[str, str]) -> Decision:
    """What a vLLM start of ``config`` on this machine would do with the folder's compiled artifact
    (``lmforge config show``); without one, nothing is imported."""

    def facts() -> StartFacts:
        kwargs, _notes = engine_settings(config, extra_options)
        return StartFacts.collect(config, kwargs)

    return decide(config.model_dir, config.compile_cache, facts)


def _ticker(progress: Progress, started: float, done: threading.Event) -> None:
    while not done.wait(20.0):
        progress(f"  ... {time.monotonic() - started:.0f} s (vLLM is starting and compiling)")


#: the greedy probe ``lmforge compile`` records in the manifest: what the engine it compiled answers
PROBE_PROMPT = "def fibonacci(n):"
PROBE_TOKENS = 8


async def _greedy_ids(engine: Any, prompt: str, tokens: int) -> list[int]:
    from lmforge.engines.protocol import GenerationRequest, SamplingParams

    ids = list(engine.tokenizer.encode(prompt))  # as a plain prompt is tokenized: with the BOS
    request = GenerationRequest("lmforge-compile-probe", ids, SamplingParams(max_new_tokens=tokens))
    return [event.token.id async for event in engine.generate(request) if event.token is not None]


async def _start_probe_stop(engine: Any) -> tuple[float, list[int]]:
    """Start ``engine``, answer the probe greedily, stop it; (seconds the start took, probe ids)."""
    started = time.monotonic()
    try:
        await engine.start()
        seconds = time.monotonic() - started
        return seconds, await _greedy_ids(engine, PROBE_PROMPT, PROBE_TOKENS)
    finally:
        # stopped on purpose: vLLM's output handler would log the engine core's exit as an error
        logging.getLogger("vllm.v1.engine.async_llm").setLevel(logging.CRITICAL)
        await engine.shutdown()


def compile_folder(
    config: ServingConfig,
    extra_options: Mapping[str, str],
    output: Path,
    *,
    progress: Progress,
    created_by: str,
) -> Manifest:
    """Start vLLM on ``config`` once with an empty cache folder, then keep what it compiled as
    ``output``'s compiled artifact (``output`` is the model folder itself, or a copy of it)."""
    from lmforge.engines.vllm.engine import VllmEngine

    for note in engine_settings(config, extra_options)[1]:
        progress(f"note: {note}")
    engine = VllmEngine(config, extra_options)
    with tempfile.TemporaryDirectory(prefix="lmforge-compile-") as tmp:
        engine.compile_capture = Path(tmp) / CACHE_DIR
        progress("starting vLLM with the serving configuration (it compiles the model during its warm-up)")
        started = time.monotonic()
        done = threading.Event()
        ticker = threading.Thread(target=_ticker, args=(progress, started, done), daemon=True)
        ticker.start()
        try:
            seconds, probe = asyncio.run(_start_probe_stop(engine))
        finally:
            done.set()
        state = engine.compile_cache
        assert state is not None
        progress(f"vLLM started (and compiled) in {seconds:.1f} s; keeping what it compiled")
        manifest = write_compiled(
            output,
            state,
            compile_seconds=seconds,
            created_by=created_by,
            probe={"prompt": PROBE_PROMPT, "greedy_ids": probe},
        )
    graphs = len(manifest.vllm_cache_keys)
    size = sum(f.size for f in manifest.files)
    progress(
        f"wrote {COMPILED_DIR}/{BACKEND_DIR}/ in {output}: {graphs} compiled graph key(s) under {AOT_DIR}, "
        f"{len(manifest.files)} files, {size / 2**20:.1f} MiB"
        + ("" if graphs else " (vLLM compiled nothing for this configuration)")
    )
    return manifest
