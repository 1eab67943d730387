"""TensorRT-LLM >= 1.3 (the PyTorch-backend path) against the FAKE tensorrt_llm 1.3 (tests/fakes/trtllm13)
and the FAKE ModelOpt (tests/fakes/modelopt): ``option.rolling_batch=trtllm`` starts on the PyTorch-backend
LLM with the HF folder, streams, aborts and serves LoRA; ``lmforge compile`` quantizes once and the output
is served without quantizing again; concurrent JIT of one key builds once on both paths.

No GPU or TensorRT-LLM is needed; what only the real ones can show is in the gpu-marked tests at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmforge.config import load_config
from lmforge.testing.server import RemoteServer, http_client, metrics, stream_lines

pytestmark = [pytest.mark.integration]

FAKES = Path(__file__).resolve().parents[1] / "fakes"
FAKE13 = FAKES / "trtllm13"
SRC = Path(__file__).resolve().parents[2] / "src"


def _drop_fake_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in ("tensorrt_llm", "modelopt")]:
        del sys.modules[name]  # later tests must not find the fakes installed


@pytest.fixture
def fake13(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The fake 1.3 (then the fake ModelOpt) first on the path, here and in child processes."""
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAKE13), str(FAKES), str(SRC), os.environ.get("PYTHONPATH", "")]),
        "LMFORGE_CACHE_DIR": str(tmp_path / "cache"),
        "FAKE_MODELOPT_COUNT": str(tmp_path / "quantizations.txt"),
        "FAKE_TRTLLM_LOADS": str(tmp_path / "loads.txt"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.syspath_prepend(str(FAKE13))
    _drop_fake_modules()
    yield env
    _drop_fake_modules()


def _model(tiny_model: Path, folder: Path, extra: str = "") -> Path:
    shutil.copytree(tiny_model, folder)
    (folder / "serving.properties").write_text(
        "option.rolling_batch=trtllm\noption.max_model_len=512\noption.max_rolling_batch_size=8\n" + extra
    )
    return folder


def _count(path: str) -> int:
    return len(Path(path).read_text().splitlines()) if Path(path).exists() else 0


def _engine(folder: Path) -> Any:
    from lmforge.engines.trtllm.pt_api import load_pt_api
    from lmforge.engines.trtllm.pytorch_backend import TrtllmPytorchEngine

    resolved = load_config(folder, env={})
    return TrtllmPytorchEngine(resolved.config, resolved.extra_options, api=load_pt_api())


def test_the_version_gate_picks_the_pytorch_path(fake13: dict[str, str]) -> None:
    from lmforge.engines.registry import explain_choice
    from lmforge.engines.trtllm.version_gate import choose

    choice = choose()
    assert (choice.path, choice.version, choice.installed) == ("pytorch", "1.3.0rc29", True)
    lines = explain_choice("trtllm")
    assert lines[-1].startswith("trtllm path: PyTorch-backend path (TensorRT-LLM 1.3.0rc29 installed")
    assert choose("1.2.1").path == "engine" and choose("1.4.0rc1").path == "pytorch"


def test_server_streams_and_aborts_on_the_pytorch_backend(
    tiny_model: Path, tmp_path: Path, fake13: dict[str, str]
) -> None:
    folder = _model(tiny_model, tmp_path / "m")
    with RemoteServer(folder, env={**fake13, "FAKE_TRTLLM_EOS_AFTER": ""}) as server:
        lines = [
            json.loads(line)
            for _, line in stream_lines(
                server.url + "/invocations",
                {"inputs": "def ", "parameters": {"max_new_tokens": 10, "details": True}, "stream": True},
            )
        ]
        assert len(lines) == 10 and all(line["token"]["log_prob"] < 0 for line in lines)
        assert lines[-1]["details"]["finish_reason"] == "length"
        before = metrics(server.url).get("lmforge_engine_aborted_total", 0.0)
        with http_client().stream(
            "POST",
            server.url + "/invocations",
            json={"inputs": "def ", "parameters": {"max_new_tokens": 400}, "stream": True},
            timeout=30,
        ) as resp:
            next(resp.iter_lines())
        deadline = time.monotonic() + 10
        while metrics(server.url).get("lmforge_engine_aborted_total", 0.0) < before + 1:
            assert time.monotonic() < deadline, "the disconnect did not abort the request"
            time.sleep(0.1)
    loads = Path(fake13["FAKE_TRTLLM_LOADS"]).read_text().splitlines()
    assert loads == [f"LLM {folder}"]  # the PyTorch backend took the HF folder itself: nothing was built
    assert _count(fake13["FAKE_MODELOPT_COUNT"]) == 0


def test_start_arguments_sampling_and_async_llm(
    tiny_model: Path, tmp_path: Path, fake13: dict[str, str]
) -> None:
    import asyncio

    from lmforge.engines.protocol import GenerationRequest, SamplingParams

    folder = _model(
        tiny_model,
        tmp_path / "m",
        "option.kv_cache_free_gpu_mem_fraction=0.5\noption.cuda_graph_max_batch_size=4\n"
        "option.torch_compile=true\noption.trtllm_async_llm=true\n",
    )
    engine = _engine(folder)

    async def scenario() -> list[int]:
        await engine.start()
        try:
            prompt = engine.tokenizer.encode("def ")
            request = GenerationRequest("1", prompt, SamplingParams(max_new_tokens=6, min_new_tokens=2))
            return [e.token.id async for e in engine.generate(request) if e.token is not None]
        finally:
            await engine.shutdown()

    tokens = asyncio.run(scenario())
    from tensorrt_llm.llmapi import AsyncLLM

    llm = AsyncLLM.instances[-1]
    assert type(llm) is AsyncLLM and llm.args["orchestrator_type"] == "ray" and len(tokens) == 6
    assert (
        llm.args["kv_cache_config"].free_gpu_memory_fraction,
        llm.args["kv_cache_config"].enable_block_reuse,
    ) == (
        0.5,
        True,
    )
    graphs = llm.args["cuda_graph_config"]
    assert (graphs.max_batch_size, graphs.enable_padding) == (4, True)
    assert llm.args["torch_compile_config"] is not None and llm.args["max_batch_size"] == 8
    assert llm.args["max_seq_len"] == 512 and llm.args["lora_config"] is None


def test_lora_adapters_per_request(
    tiny_model: Path, tmp_path: Path, fake13: dict[str, str], lora_adapters: dict[str, Path]
) -> None:
    import asyncio

    from lmforge.adapters.registry import AdapterRegistry
    from lmforge.engines.protocol import GenerationRequest, SamplingParams
    from lmforge.errors import NotFoundError

    folder = _model(
        tiny_model,
        tmp_path / "m",
        "option.enable_lora=true\noption.max_loras=2\noption.max_lora_rank=16\noption.max_cpu_loras=3\n"
        "option.cuda_graph=false\n",
    )
    for name in ("a1", "a2"):
        shutil.copytree(lora_adapters[name], folder / "adapters" / name)
    engine = _engine(folder)
    registry = AdapterRegistry(engine.config, engine)

    async def tokens(rid: str, adapter: Any) -> list[int]:
        prompt = engine.tokenizer.encode("def ")
        request = GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=8), adapter=adapter)
        return [e.token.id async for e in engine.generate(request) if e.token is not None]

    async def scenario() -> None:
        await engine.start()
        try:
            llm = engine._llm
            cfg = llm.lora_config
            assert (cfg.max_lora_rank, cfg.max_loras, cfg.max_cpu_loras) == (16, 2, 3)
            assert cfg.lora_dir == [str(folder / "adapters" / "a1"), str(folder / "adapters" / "a2")]
            assert llm.args["cuda_graph_config"] is None
            assert sorted(await registry.load_folder()) == ["a1", "a2"]
            a1, a2 = registry.get("a1"), registry.get("a2")
            outs = await asyncio.gather(tokens("1", a1), tokens("2", a2), tokens("3", None))
            assert len({tuple(t) for t in outs}) == 3
            seen = {(r.lora_name, r.lora_int_id, r.lora_path) for r in llm.lora_requests}
            assert seen == {("a1", a1.int_id, str(a1.path)), ("a2", a2.int_id, str(a2.path))}
            await registry.remove("a1")
            with pytest.raises(NotFoundError, match="'a1'"):
                await tokens("4", a1)
        finally:
            await engine.shutdown()

    asyncio.run(scenario())


def test_engine_only_options_and_engine_folders_are_refused(
    tiny_model: Path, tmp_path: Path, fake13: dict[str, str]
) -> None:
    import asyncio

    from lmforge.engines.trtllm.buildplan import BuildPlanError
    from lmforge.engines.trtllm.compile import CompileError

    folder = _model(tiny_model, tmp_path / "m", "option.use_paged_context_fmha=true\n")
    with pytest.raises(BuildPlanError, match="use_paged_context_fmha is a TensorRT engine build setting"):
        asyncio.run(_engine(folder).start())
    engine_dir = _model(tiny_model, tmp_path / "e")
    config = json.loads((engine_dir / "config.json").read_text())
    (engine_dir / "config.json").write_text(json.dumps({"pretrained_config": config, "build_config": {}}))
    (engine_dir / "rank0.engine").write_bytes(b"engine")
    with pytest.raises(CompileError, match=r"holds TensorRT engines .* tensorrt-llm-1\.2 image"):
        asyncio.run(_engine(engine_dir).start())


def test_compile_quantizes_once_and_the_output_serves_without_quantizing(
    tiny_model: Path, tmp_path: Path, fake13: dict[str, str]
) -> None:
    import asyncio

    folder = _model(
        tiny_model, tmp_path / "m", "option.quantize=fp8\noption.kv_cache_dtype=fp8\noption.calib_size=6\n"
    )
    out = tmp_path / "fp8"
    env = {**os.environ, **fake13}
    proc = subprocess.run(
        [sys.executable, "-m", "lmforge", "compile", str(folder), "--output", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[modelopt] [fake modelopt] quantized to FP8 / KV FP8 after 6 calibration forwards" in proc.stderr
    quant = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["kv_cache_quant_algo"]) == ("FP8", "FP8")
    recorded = json.loads((out / "lmforge-trtllm-quant-plan.json").read_text())
    assert recorded["modelopt_config"] == "FP8_DEFAULT_CFG" and recorded["trtllm_version"] == "1.3.0rc29"
    assert recorded["modelopt_version"] == "0.46.0" and recorded["tensor_parallel"] == 1
    props = (out / "serving.properties").read_text()
    assert "option.quantize=fp8" in props and "option.calib_size" not in props
    assert (out / "tokenizer.json").is_file() and _count(fake13["FAKE_MODELOPT_COUNT"]) == 1
    engine = _engine(out)  # served as it is: never quantized again at start
    asyncio.run(engine.start())
    llm = engine._llm
    asyncio.run(engine.shutdown())
    assert engine.checkpoint == out and _count(fake13["FAKE_MODELOPT_COUNT"]) == 1
    assert llm.quant_algo == "FP8" and llm.model == out


JIT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from lmforge.config import load_config
    resolved = load_config(Path(sys.argv[2]), env={})
    if sys.argv[1] == "pytorch":
        from lmforge.engines.trtllm.quantize import ensure_checkpoint
        from lmforge.engines.trtllm.quantplan import make_quant_plan
        plan = make_quant_plan(resolved.config, resolved.extra_options, trtllm_version="1.3.0rc29")
        print(ensure_checkpoint(plan, Path(sys.argv[2]), timeout_s=120, progress=print))
    else:
        from lmforge.engines.trtllm.compile import ensure_engine
        from lmforge.engines.trtllm.plan import make_plan
        plan = make_plan(
            resolved.config, resolved.extra_options, arch="sm90", trtllm_version="1.2.1", device_count=1
        )
        print(ensure_engine(plan, Path(sys.argv[2]), timeout_s=120, progress=print))
    """
)


@pytest.mark.parametrize("path", ["pytorch", "engine"])
def test_concurrent_jit_of_one_key_builds_once(
    tiny_model: Path, tmp_path: Path, fake13: dict[str, str], path: str
) -> None:
    """Two processes asking for the same quantized checkpoint (>= 1.3) or engine (1.2) at once: one
    builds, the other waits (saying for whom) and reuses it."""
    count = tmp_path / "builds.txt"
    env = {**os.environ, **fake13, "FAKE_MODELOPT_COUNT": str(count), "FAKE_TRTLLM_BUILD_COUNT": str(count)}
    if path == "engine":  # the 1.2 fake only
        env["PYTHONPATH"] = os.pathsep.join([str(FAKES), str(SRC)])
        env["FAKE_TRTLLM_BUILD_SECONDS"] = "3"
        folder = _model(tiny_model, tmp_path / "m", "option.dtype=fp16\noption.max_input_len=256\n")
    else:
        env["FAKE_MODELOPT_SECONDS"] = "3"
        folder = _model(tiny_model, tmp_path / "m", "option.quantize=int8_wo\n")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", JIT, path, str(folder)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert len(count.read_text().splitlines()) == 1, outputs
    assert outputs[0].strip().splitlines()[-1] == outputs[1].strip().splitlines()[-1]  # the same folder
    assert any("waiting for pid" in o and "meanwhile" in o for o in outputs), outputs


@pytest.mark.slow
@pytest.mark.parametrize(
    ("quantize", "kv", "algos"), [("fp8", "fp8", ("FP8", "FP8")), ("awq", "auto", ("W4A16_AWQ", None))]
)
def test_real_modelopt_quantizes_the_example_model(
    tiny_model: Path, tmp_path: Path, quantize: str, kv: str, algos: tuple[str, str | None]
) -> None:
    """Where NVIDIA ModelOpt is installed (pip install 'nvidia-modelopt[torch]'; it runs on CPU too): the
    quantization child with the real mtq.quantize / export_hf_checkpoint writes the checkpoint TensorRT-LLM
    loads."""
    modelopt = pytest.importorskip("modelopt")
    if str(getattr(modelopt, "__file__", "")).startswith(str(FAKES)):
        pytest.skip("the fake ModelOpt is on the path")
    pytest.importorskip("modelopt.torch.quantization")
    from lmforge.config import ServingConfig
    from lmforge.engines.trtllm.quantize import quantize_checkpoint
    from lmforge.engines.trtllm.quantplan import checkpoint_quantization, make_quant_plan

    extra = {"kv_cache_dtype": kv, "calib_size": "4", "calib_seq_len": "64"}
    plan = make_quant_plan(
        ServingConfig(model_dir=tiny_model, quantize=quantize), extra, trtllm_version="1.3.0rc29"
    )
    out = quantize_checkpoint(plan, tiny_model, tmp_path / "q", timeout_s=900, progress=print)
    assert checkpoint_quantization(out) == algos
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_algo"] == algos[0]
    recorded = json.loads((out / "lmforge-trtllm-quant-plan.json").read_text())
    assert recorded["modelopt_version"] == modelopt.__version__ and (out / "tokenizer.json").is_file()


# ---------------------------------------------------------------------- real TensorRT-LLM (GPU only)


def _real_trtllm(minimum: tuple[int, int] | None, maximum: tuple[int, int] | None) -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    trtllm = pytest.importorskip("tensorrt_llm")
    if str(getattr(trtllm, "__file__", "")).startswith(str(FAKES)):
        pytest.skip("a fake TensorRT-LLM is on the path")
    from lmforge.engines.trtllm.version_gate import release

    version = release(str(trtllm.__version__))
    if (minimum and version < minimum) or (maximum and version > maximum):
        pytest.skip(f"this test is for another TensorRT-LLM release than {trtllm.__version__}")
    return trtllm


def _greedy_like_transformers(model: Path, url: str, prompt: str, n: int, dtype: str) -> None:
    """The server's greedy tokens equal transformers' for the same model in the same dtype (on the GPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    ref = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).to("cuda")
    ids = tok(prompt, return_tensors="pt").input_ids.to("cuda")
    want = ref.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1] :].tolist()
    body = {"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True, "ignore_eos_token": True}}
    got = [
        t["id"]
        for t in http_client().post(url + "/invocations", json=body, timeout=300).json()["details"]["tokens"]
    ]
    assert got == want


@pytest.mark.gpu
def test_real_pytorch_path_quantizes_serves_and_streams_smollm2(smollm2_model: Path, tmp_path: Path) -> None:
    """TensorRT-LLM >= 1.3 with ModelOpt: the 135 M model served unquantized (greedy tokens equal to
    transformers'), then quantized to FP8 by `lmforge compile` and served from the checkpoint, streaming."""
    _real_trtllm((1, 3), None)
    folder = _model(smollm2_model, tmp_path / "m", "option.dtype=bf16\n")
    with RemoteServer(folder, startup_timeout=1800) as server:
        _greedy_like_transformers(smollm2_model, server.url, "def fibonacci(n):", 8, "bf16")
    (folder / "serving.properties").write_text(
        "option.rolling_batch=trtllm\noption.quantize=fp8\noption.calib_size=64\noption.dtype=bf16\n"
    )
    out = tmp_path / "fp8"
    proc = subprocess.run([sys.executable, "-m", "lmforge", "compile", str(folder), "--output", str(out)])
    assert proc.returncode == 0
    with RemoteServer(out, startup_timeout=1800) as server:
        lines = list(
            stream_lines(
                server.url + "/invocations",
                {"inputs": "def ", "parameters": {"max_new_tokens": 8}, "stream": True},
            )
        )
        assert len(lines) == 8


@pytest.mark.gpu
def test_real_engine_path_builds_serves_and_streams_smollm2(smollm2_model: Path, tmp_path: Path) -> None:
    """TensorRT-LLM <= 1.2: an fp32 engine of the 135 M model compiled AOT, served, greedy tokens equal to
    transformers'."""
    _real_trtllm(None, (1, 2))
    folder = _model(smollm2_model, tmp_path / "m", "option.dtype=fp32\noption.max_input_len=256\n")
    out = tmp_path / "engine"
    proc = subprocess.run([sys.executable, "-m", "lmforge", "compile", str(folder), "--output", str(out)])
    assert proc.returncode == 0
    with RemoteServer(out, startup_timeout=1800) as server:
        _greedy_like_transformers(smollm2_model, server.url, "def fibonacci(n):", 16, "fp32")
