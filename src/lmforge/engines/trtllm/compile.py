"""Compile TensorRT-LLM engines: ahead of time (``lmforge compile``) or just in time at server start.

The build runs in a child process (``python -m lmforge.engines.trtllm.build``) so a deadline can stop
it and its own log can be shown when it fails. Output goes to a temporary sibling folder and is moved
into place only when complete, with the plan recorded in it (``lmforge-trtllm-plan.json``): a folder
either holds a whole engine for a known plan or nothing.

JIT engines are cached under ``<cache>/trtllm/<plan cache key>``; the key covers every build option,
the model and revision, the GPU architecture and the TensorRT-LLM version.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lmforge.engines.trtllm.plan import PLAN_FILE, BuildPlan, read_plan
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge.engines.trtllm")

#: tokenizer and config files an engine folder needs beside the engines
_CARRY = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


class CompileError(LmforgeError):
    kind = "model_error"


def is_compiled(folder: Path) -> bool:
    """True for a TensorRT-LLM engine folder (``config.json`` with a ``build_config`` and engines)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "build_config" in config and any(folder.glob("rank*.engine"))


def plan_differences(recorded: dict[str, object], plan: BuildPlan) -> list[str]:
    """Build fields where a compiled folder's recorded plan differs from ``plan`` (model id ignored)."""
    wanted = plan.build_fields()
    return [
        f"{key}: compiled {recorded.get(key)!r}, configured {value!r}"
        for key, value in wanted.items()
        if key not in ("model_id", "revision", "model_fingerprint") and recorded.get(key) != value
    ]


def cache_dir(plan: BuildPlan) -> Path:
    from lmforge.artifacts.download import cache_root

    return cache_root() / "trtllm" / plan.cache_key()


def compile_engine(
    plan: BuildPlan,
    source: Path,
    output: Path,
    *,
    timeout_s: float,
    progress: Callable[[str], None] = log.info,
    python: str = sys.executable,
) -> Path:
    """Build ``plan`` from the Hugging Face folder ``source`` into ``output``; CompileError on failure."""
    output = output.resolve()
    staging = output.with_name(f".{output.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    plan_path = staging / PLAN_FILE
    plan_path.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    cmd = [python, "-m", "lmforge.engines.trtllm.build", str(plan_path), str(source), str(staging)]
    progress(
        f"compiling {plan.model_id} with TensorRT-LLM {plan.trtllm_version} (key {plan.cache_key()}); "
        f"deadline {timeout_s:.0f} s"
    )
    started = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    try:
        deadline = started + timeout_s
        for line in _lines(proc, deadline):
            tail.append(line)
            progress(f"[trtllm-build] {line}")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise CompileError(
                f"the TensorRT-LLM build did not finish within {timeout_s:.0f} s "
                "(option.model_loading_timeout); compile ahead of time with `lmforge compile` and deploy "
                "the engine instead. Last output:\n" + "\n".join(tail)
            )
        if proc.returncode != 0:
            raise CompileError(
                f"the TensorRT-LLM build failed (exit code {proc.returncode}). Its output:\n"
                + "\n".join(tail)
            )
        if not is_compiled(staging):
            raise CompileError(f"the TensorRT-LLM build finished but wrote no engine into {staging}")
        for name in _CARRY:
            if (source / name).is_file() and not (staging / name).exists():
                shutil.copy2(source / name, staging / name)
        shutil.rmtree(output, ignore_errors=True)
        output.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(output)
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"compiled in {time.monotonic() - started:.0f} s into {output}")
    return output


def _lines(proc: subprocess.Popen[str], deadline: float) -> collections.abc.Iterator[str]:
    """The child's output lines until it exits or ``deadline`` passes (a reader thread feeds a queue)."""
    import queue
    import threading

    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            line = lines.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            continue
        if line is None:
            proc.wait()
            return
        yield line


def ensure_engine(
    plan: BuildPlan, model_folder: Path, *, timeout_s: float, progress: Callable[[str], None] = log.info
) -> Path:
    """The engine folder to serve for ``plan``: the model folder itself when it is an engine compiled for
    this plan (AOT), else a cached JIT build, compiled now when missing."""
    if is_compiled(model_folder):
        recorded = read_plan(model_folder)
        if recorded is not None:
            differences = plan_differences(recorded, plan)
            if differences:
                raise CompileError(
                    f"{model_folder} holds an engine compiled for other settings; recompile it "
                    "(lmforge compile) or restore them:\n  " + "\n  ".join(differences)
                )
        progress(f"serving the precompiled engine in {model_folder}")
        return model_folder
    cached = cache_dir(plan)
    if is_compiled(cached) and (read_plan(cached) or {}).get("cache_key") == plan.cache_key():
        progress(f"reusing the engine compiled earlier for this plan: {cached}")
        return cached
    return compile_engine(plan, model_folder, cached, timeout_s=timeout_s, progress=progress)
