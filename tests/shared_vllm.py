"""The vLLM server that test_vllm.py and test_vllm_lora.py share (the fixtures are in
tests/integration/conftest.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lmforge.testing.server import RemoteServer

#: Skips a module where the vllm extra is not installed. Whether vLLM is there is asked of the import
#: system, not by importing it: ``pytest.importorskip("vllm")`` at module level imported vLLM (~3.5
#: CPU-s) in every pytest-xdist worker's collection, where only the worker that runs these tests
#: needs it (and the integration tests never import it: their vLLM runs in server processes).
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="the vLLM backend needs the vllm extra (make install puts it in .venv)",
)

#: The shared vLLM server's settings past VLLM_PROPERTIES: tool_choice "auto" read by vLLM's own
#: pythonic tool parser (a name lmforge does not read itself), and LoRA with two slots for three
#: adapters (a1 and a2 from the folder's adapters/, a3 from an allowed root).
VLLM_SHARED_PROPERTIES = """\
option.enable_auto_tool_choice=true
option.tool_call_parser=pythonic
option.kv_cache_memory_mb=128
option.enable_lora=true
option.max_loras=2
option.max_lora_rank=16
option.max_cpu_loras=4
"""


class SharedVllm:
    """One ``lmforge serve`` on vLLM for the vLLM modules (a vLLM start is ~20 CPU-seconds of three
    processes). Started without waiting, so that a module computes its reference (vLLM offline, in a
    process of its own) while it starts; a test that breaks it (``breaks_vllm``) gets it marked, and
    the next test that uses it gets it started again first."""

    def __init__(self, server: RemoteServer, vllm_env: dict[str, str]) -> None:
        self.server = server
        self.model = server.model_dir
        self.vllm_env = vllm_env
        self.broken = False

    def ready(self) -> RemoteServer:
        if self.broken:
            self.server.stop()
            self.server.start()
            self.broken = False
        self.server.wait_for_ping(200, 400)
        return self.server

    def reference(self, script: str, args: list[str], out: Path, **env: str) -> tuple[RemoteServer, Any]:
        """Run ``script`` (beside the vLLM tests; vLLM's engine and worker in that one process, one torch
        thread, ``env`` on top), which writes JSON to ``out``, while the server starts; then the ready
        server and that JSON."""
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).parent / "integration" / script), *args],
            env={
                **os.environ,
                **self.vllm_env,
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "OMP_NUM_THREADS": "1",
                **env,
            },
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        return self.ready(), json.loads(out.read_text())
