"""The same answer alone or in a crowd on a GPU: LMI-Dist on CUDA, through ``lmforge serve``.

:mod:`tests.same_answer`'s probes (echo scoring, the three routes streamed and not with alternatives,
seeds, penalties, structured output, batched prompts) for the base model and two LoRA adapters mixed in
one crowd must answer as they do alone (the same tokens; log-probs within :data:`CUDA_TOL`), and each
echo probe's prompt log-probs must equal PEFT's forward pass with the same adapter (on the CPU, within
1e-3). On CUDA the batch changes which kernels run, not only the order of the sums, and prompt scoring
shares the GPU with the batch's steps, so this is not the CPU test again.

Why 1e-3 here and 1e-4 on the CPU: cuBLAS picks its fp32 matrix-product kernel (tiling, split-K) by
the shape, so a row's sums run in another order when the batch has 1 row or 30, through 30 layers. On a
lent H200 (torch 2.11, 2026-11-28) every token was the same alone and in the crowd, and the 40
log-prob differences over 1e-4 that the harness listed (its cap) were 1.0e-4 to 2.6e-4, with either
sign; a request given another request's values, the fault this harness exists for, moves them by whole
nats.

The real SmolLM2-135M weights cannot reach a lent GPU machine (only the working tree travels), so the
model is a random-weight Llama of SmolLM2-135M's shape (30 layers, hidden 576, 9/3 heads) with the
tiny model's tokenizer. Runs only where CUDA is (``-m gpu``); skipped elsewhere.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmforge.testing.server import RemoteServer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.xdist_group("same-answer-gpu"),
]

#: alone and in a crowd on CUDA, fp32 (see the module's docstring)
CUDA_TOL = 1e-3

PROMPTS = (
    "def hello(x):",
    "import os\nimport sys\nfrom pathlib import Path\n",
    "class Foo:\n    def __init__(self):",
    "for i in range(",
    "x",
)


@pytest.fixture(scope="module")
def gpu_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmforge.testing.lora import make_adapter

    root = tmp_path_factory.mktemp("gpu-same-answer")
    model = root / "model"
    shutil.copytree(tiny_model, model)
    config = LlamaConfig.from_pretrained(model)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 576, 1536, 30
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 9, 3, 64
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(model)
    adapters = {
        "a1": make_adapter(model, root / "a1", seed=1),
        "a2": make_adapter(model, root / "a2", seed=2, rank=4, targets=("q_proj", "v_proj")),
    }
    for name, path in adapters.items():
        shutil.copytree(path, model / "adapters" / name)
    (model / "serving.properties").write_text(
        "option.rolling_batch=lmi-dist\noption.dtype=fp32\noption.enable_lora=true\noption.max_loras=2\n"
        "option.max_lora_rank=8\noption.max_rolling_batch_size=32\noption.max_model_len=512\n"
    )
    assert json.loads((model / "config.json").read_text())["num_hidden_layers"] == 30
    return model, adapters


@pytest.fixture(scope="module")
def gpu_server(gpu_model: tuple[Path, dict[str, Path]]) -> Iterator[RemoteServer]:
    with RemoteServer(gpu_model[0], startup_timeout=300) as server:
        yield server


def test_the_engine_runs_on_the_gpu(gpu_server: RemoteServer) -> None:
    log = gpu_server.log_path.read_text(errors="replace")
    assert " on cuda, dtype=torch.float32" in log, log[-3000:]


def test_lmi_dist_on_cuda_same_alone_and_in_a_crowd_of_adapters(
    gpu_server: RemoteServer, gpu_model: tuple[Path, dict[str, Path]]
) -> None:
    from lmforge.testing.lora import PeftReference
    from tests.same_answer import same_with_adapters_in_a_crowd

    model, adapters = gpu_model
    same_with_adapters_in_a_crowd(gpu_server.url, PROMPTS, PeftReference(model, adapters), tol=CUDA_TOL)
