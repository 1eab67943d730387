"""Compile TensorRT-LLM engines: ahead of time (``lmforge compile``) or just in time at server start.

The build runs in a child process (``python -m lmforge.engines.trtllm.build``) so a deadline can stop
it and its own log can be shown when it fails. Output goes to a temporary sibling folder and is moved
into place only when complete, with the plan recorded in it (``lmforge-trtllm-plan.json``): a folder
either holds a whole engine for a known plan or nothing.

JIT engines are cached under ``<cache>/trtllm/<plan cache key>``; the key covers every build option,
the model and revision, the GPU architecture and the TensorRT-LLM version. Processes that need the same
key at once build it once (:func:`.lock.build_lock`); the others wait and reuse it.
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

from lmforge.engines.trtllm.lock import build_lock
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
    from lmforge.paths import cache_dir

    return cache_dir("trtllm") / plan.cache_key()


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
    progress(
        f"compiling {plan.model_id} with TensorRT-LLM {plan.trtllm_version} (key {plan.cache_key()}); "
        f"deadline {timeout_s:.0f} s"
    )
    return run_child(
        "lmforge.engines.trtllm.build",
        PLAN_FILE,
        plan.to_dict(),
        source,
        output,
        timeout_s=timeout_s,
        progress=progress,
        label="TensorRT-LLM build",
        tag="trtllm-build",
        done=is_compiled,
        python=python,
    )


def run_child(
    module: str,
    plan_file: str,
    plan: dict[str, object],
    source: Path,
    output: Path,
    *,
    timeout_s: float,
    progress: Callable[[str], None],
    label: str,
    tag: str,
    done: Callable[[Path], bool],
    python: str = sys.executable,
) -> Path:
    """Run ``python -m module PLAN SOURCE STAGING`` within ``timeout_s``, its output shown as progress,
    and move the staging folder to ``output`` once ``done(staging)`` holds; CompileError otherwise. The
    plan is recorded in the output as ``plan_file``; tokenizer files are carried over from ``source``."""
    output = output.resolve()
    staging = output.with_name(f".{output.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    plan_path = staging / plan_file
    plan_path.write_text(json.dumps(plan, indent=2) + "\n")
    cmd = [python, "-m", module, str(plan_path), str(source), str(staging)]
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
            progress(f"[{tag}] {line}")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise CompileError(
                f"the {label} did not finish within {timeout_s:.0f} s "
                "(option.model_loading_timeout); run it ahead of time with `lmforge compile` and deploy "
                "its output instead. Last output:\n" + "\n".join(tail)
            )
        if proc.returncode != 0:
            raise CompileError(
                f"the {label} failed (exit code {proc.returncode}). Its output:\n" + "\n".join(tail)
            )
        if not done(staging):
            raise CompileError(f"the {label} finished but left no usable output in {staging}")
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
    progress(f"done in {time.monotonic() - started:.0f} s: {output}")
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

    def ready() -> bool:
        return is_compiled(cached) and (read_plan(cached) or {}).get("cache_key") == plan.cache_key()

    if ready():
        progress(f"reusing the engine compiled earlier for this plan: {cached}")
        return cached
    started = time.monotonic()
    with build_lock(cached, timeout_s=timeout_s, progress=progress):  # one build per key across processes
        if ready():
            progress(f"another process compiled this plan meanwhile: {cached}")
            return cached
        left = max(1.0, timeout_s - (time.monotonic() - started))
        return compile_engine(plan, model_folder, cached, timeout_s=left, progress=progress)
