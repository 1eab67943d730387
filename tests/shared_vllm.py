"""The vLLM server that test_vllm.py and test_vllm_lora.py share (the fixtures are in
tests/integration/conftest.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
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

#: The shared vLLM server's settings past VLLM_PROPERTIES (a later key wins): a batch of 64, which a
#: crowd of 64 streams fits (test_vllm.py's interleaving check), tool_choice "auto" read by vLLM's own
#: pythonic tool parser (a name lmforge does not read itself), and LoRA with two slots for three
#: adapters (a1 and a2 from the folder's adapters/, a3 from an allowed root).
VLLM_SHARED_PROPERTIES = """\
option.max_rolling_batch_size=64
option.enable_auto_tool_choice=true
option.tool_call_parser=pythonic
option.kv_cache_memory_mb=128
option.enable_lora=true
option.max_loras=2
option.max_lora_rank=16
option.max_cpu_loras=4
"""


#: test_vllm.py's prompts, checked against vLLM's own offline ``LLM.generate`` (greedy, with log-probs;
#: the last one stops on a string)
OFFLINE_PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Tree:", "x"]
OFFLINE_MAX_TOKENS = 24
OFFLINE_REQUESTS = [{"prompt": p, "max_tokens": OFFLINE_MAX_TOKENS} for p in OFFLINE_PROMPTS] + [
    {"prompt": OFFLINE_PROMPTS[0], "max_tokens": OFFLINE_MAX_TOKENS, "stop": ["e"]}
]
#: test_vllm_lora.py's batch for vLLM alone, base / adapter a1 / base rows (the upstream bug it shows)
RAW_LORA: dict[str, Any] = {"prompts": ["def hello(x):", "import os\n", "class Foo:"], "max_tokens": 12}


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
        self._references: dict[str, Any] | None = None

    def ready(self) -> RemoteServer:
        if self.broken:
            self.server.stop()
            self.server.start()
            self.broken = False
        self.server.wait_for_ping(200, 400)
        return self.server

    def references(self) -> tuple[RemoteServer, dict[str, Any]]:
        """The ready server and vLLM's own results for :data:`OFFLINE_REQUESTS` and the :data:`RAW_LORA`
        batch (``vllm_reference.py``: one vLLM engine in that one process, one torch thread, no plugin),
        made while the server starts, the first time a module asks."""
        if self._references is None:
            root = Path(tempfile.mkdtemp(prefix="vllm-reference-", dir=self.model.parent))
            job = {
                "model": str(self.model),
                "offline": OFFLINE_REQUESTS,
                "lora": {**RAW_LORA, "adapter": str(self.model / "adapters" / "a1")},
            }
            (root / "job.json").write_text(json.dumps(job))
            script = Path(__file__).parent / "integration" / "vllm_reference.py"
            proc = subprocess.run(
                [sys.executable, str(script), str(root / "job.json"), str(root / "out.json")],
                env={
                    **os.environ,
                    **self.vllm_env,
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                    "VLLM_PLUGINS": "",
                    "OMP_NUM_THREADS": "1",
                },
                capture_output=True,
                text=True,
                timeout=400,
            )
            assert proc.returncode == 0, proc.stderr[-4000:]
            self._references = json.loads((root / "out.json").read_text())
        return self.ready(), self._references
