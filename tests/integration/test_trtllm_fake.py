"""TensorRT-LLM control flow against the FAKE TensorRT-LLM package (tests/fakes/tensorrt_llm): JIT
compile with progress, a cache keyed on the whole plan, failures and deadlines surfaced, AOT output
served without compiling, and the backend streaming through a real ``lmforge serve`` process.

No GPU or TensorRT-LLM is needed; what only real TensorRT-LLM can show is in the gpu-marked test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmforge.config import load_config
from lmforge.engines.trtllm.compile import CompileError, ensure_engine, is_compiled
from lmforge.engines.trtllm.plan import PLAN_FILE, make_plan
from lmforge.testing.server import RemoteServer, http_client, metrics, stream_lines

pytestmark = [pytest.mark.integration]

FAKES = Path(__file__).resolve().parents[1] / "fakes"


@pytest.fixture
def fake_trtllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Child processes import the fake; the JIT cache is private to the test."""
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAKES), os.environ.get("PYTHONPATH", "")]),
        "LMFORGE_CACHE_DIR": str(tmp_path / "cache"),
        "FAKE_TRTLLM_BUILD_COUNT": str(tmp_path / "builds.txt"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def _model(tiny_model: Path, folder: Path, extra: str = "") -> Path:
    shutil.copytree(tiny_model, folder)
    (folder / "serving.properties").write_text(
        "option.rolling_batch=trtllm\noption.dtype=fp16\noption.max_model_len=512\noption.max_input_len=256\n"
        + extra
    )
    return folder


def _plan(folder: Path) -> Any:
    resolved = load_config(folder, env={})
    return make_plan(
        resolved.config, resolved.extra_options, arch="sm90", trtllm_version="1.2.1", device_count=1
    )


def _builds(env: dict[str, str]) -> int:
    path = Path(env["FAKE_TRTLLM_BUILD_COUNT"])
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_jit_builds_once_per_plan(tiny_model: Path, tmp_path: Path, fake_trtllm: dict[str, str]) -> None:
    folder = _model(tiny_model, tmp_path / "m")
    lines: list[str] = []
    engine = ensure_engine(_plan(folder), folder, timeout_s=120, progress=lines.append)
    assert is_compiled(engine) and engine.parent.name == "trtllm"
    assert json.loads((engine / PLAN_FILE).read_text())["cache_key"] == engine.name
    assert (engine / "tokenizer.json").is_file()  # carried beside the engines
    assert any("[trtllm-build] [fake trtllm] engine saved" in line for line in lines)
    assert _builds(fake_trtllm) == 1
    assert ensure_engine(_plan(folder), folder, timeout_s=120) == engine  # cache hit
    assert _builds(fake_trtllm) == 1
    changed = _model(tiny_model, tmp_path / "m2", "option.max_rolling_batch_size=8\n")
    other = ensure_engine(_plan(changed), changed, timeout_s=120)
    assert other != engine and _builds(fake_trtllm) == 2  # a changed option never reuses a stale engine


def test_build_failure_and_deadline_are_surfaced(
    tiny_model: Path, tmp_path: Path, fake_trtllm: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _model(tiny_model, tmp_path / "m")
    monkeypatch.setenv("FAKE_TRTLLM_FAIL", "1")
    with pytest.raises(CompileError, match="out of memory while building the engine"):
        ensure_engine(_plan(folder), folder, timeout_s=120)
    monkeypatch.delenv("FAKE_TRTLLM_FAIL")
    monkeypatch.setenv("FAKE_TRTLLM_BUILD_SECONDS", "30")
    with pytest.raises(CompileError, match="did not finish within 3 s"):
        ensure_engine(_plan(folder), folder, timeout_s=3)
    cache = Path(fake_trtllm["LMFORGE_CACHE_DIR"]) / "trtllm"
    assert not cache.exists() or not any(is_compiled(p) for p in cache.iterdir())  # nothing half-built left


def test_aot_compile_output_serves_without_compiling(
    tiny_model: Path, tmp_path: Path, fake_trtllm: dict[str, str]
) -> None:
    folder = _model(tiny_model, tmp_path / "m", "option.max_rolling_batch_size=4\n")
    out = tmp_path / "engine"
    env = {**os.environ, **fake_trtllm}
    proc = subprocess.run(
        [sys.executable, "-m", "lmforge", "compile", str(folder), "--output", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert is_compiled(out) and (out / PLAN_FILE).is_file()
    props = (out / "serving.properties").read_text()
    assert "option.model_id" not in props and "option.rolling_batch=trtllm" in props
    assert "option.max_rolling_batch_size=4" in props
    builds = _builds(fake_trtllm)
    recorded = json.loads((out / PLAN_FILE).read_text())
    arch = recorded["gpu_arch"]  # the build machine's (none here)
    plan = make_plan(load_config(out, env={}).config, {}, arch=arch, trtllm_version="1.2.1", device_count=1)
    assert ensure_engine(plan, out, timeout_s=60) == out and _builds(fake_trtllm) == builds
    assert recorded["max_batch_size"] == plan.max_batch_size == 4
    other_gpu = make_plan(
        load_config(out, env={}).config, {}, arch="sm80", trtllm_version="1.2.1", device_count=1
    )
    with pytest.raises(CompileError, match=f"gpu_arch: compiled {arch!r}, configured 'sm80'"):
        ensure_engine(other_gpu, out, timeout_s=60)
    for bad in (folder, tmp_path):  # never overwrite the model or an unrelated folder
        refused = subprocess.run(
            [sys.executable, "-m", "lmforge", "compile", str(folder), "--output", str(bad)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 2 and "--output" in refused.stderr
    assert (folder / "model.safetensors").is_file()


def test_backend_streams_through_the_server(
    tiny_model: Path, tmp_path: Path, fake_trtllm: dict[str, str]
) -> None:
    """The real server on the fake engine: tokens stream one by one with log-probs, stop strings and
    lengths end with the right finish_reason, prompts over the built max_input_len are 400s, and a
    disconnect aborts the request."""
    folder = _model(tiny_model, tmp_path / "m")
    with RemoteServer(folder, env={**fake_trtllm, "FAKE_TRTLLM_EOS_AFTER": ""}) as server:
        lines = [
            json.loads(line)
            for _, line in stream_lines(
                server.url + "/invocations",
                {"inputs": "def ", "parameters": {"max_new_tokens": 12, "details": True}, "stream": True},
            )
        ]
        assert len(lines) == 12
        assert all(line["token"]["log_prob"] < 0 for line in lines)
        assert lines[-1]["details"]["finish_reason"] == "length"
        assert lines[-1]["generated_text"] == "".join(line["token"]["text"] for line in lines)
        text = lines[-1]["generated_text"]
        stop = next(
            text[i : i + 2] for i in range(len(text) // 2, len(text) - 1) if text[i : i + 2].isalnum()
        )
        resp = (
            http_client()
            .post(
                server.url + "/invocations",
                json={
                    "inputs": "def ",
                    "parameters": {"max_new_tokens": 12, "stop": [stop], "details": True},
                },
                timeout=30,
            )
            .json()
        )
        assert resp["details"]["finish_reason"] == "stop_sequence"
        assert resp["generated_text"] == text[: text.index(stop)]
        too_long = http_client().post(
            server.url + "/invocations",
            json={"inputs": "word " * 400, "parameters": {"max_new_tokens": 2}},
            timeout=30,
        )
        assert too_long.status_code == 400 and too_long.json()["param"] == "inputs"
        # the prompt's log-probs (echo with logprobs) are not mapped on this backend: a 400 naming echo
        scored = {"prompt": "def ", "echo": True, "logprobs": 1, "max_tokens": 0}
        echo = http_client().post(server.url + "/v1/completions", json=scored, timeout=30)
        assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo", echo.text
        plain = http_client().post(
            server.url + "/v1/completions", json={**scored, "logprobs": None}, timeout=30
        )
        assert plain.status_code == 200 and plain.json()["choices"][0]["text"] == "def "
        before = metrics(server.url).get("lmforge_engine_aborted_total", 0.0)
        with http_client().stream(
            "POST",
            server.url + "/invocations",
            json={"inputs": "def ", "parameters": {"max_new_tokens": 200}, "stream": True},
            timeout=30,
        ) as resp:
            it = resp.iter_lines()
            next(it)
        import time

        deadline = time.monotonic() + 10
        while metrics(server.url).get("lmforge_engine_aborted_total", 0.0) < before + 1:
            assert time.monotonic() < deadline, "the disconnect did not abort the request"
            time.sleep(0.1)
        assert metrics(server.url)["lmforge_engine_running"] == 0


@pytest.mark.gpu
def test_real_tensorrt_llm_compiles_and_serves_the_example_model(tiny_model: Path, tmp_path: Path) -> None:
    """Only where an NVIDIA GPU and the real TensorRT-LLM are installed."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    trtllm = pytest.importorskip("tensorrt_llm")
    if str(getattr(trtllm, "__file__", "")).startswith(str(FAKES)):
        pytest.skip("the fake TensorRT-LLM is on the path")
    folder = _model(tiny_model, tmp_path / "m")
    with RemoteServer(folder, startup_timeout=1800) as server:
        out = (
            http_client()
            .post(
                server.url + "/invocations",
                json={"inputs": "def ", "parameters": {"max_new_tokens": 8, "details": True}},
                timeout=120,
            )
            .json()
        )
        assert out["details"]["generated_tokens"] == 8


# ---------------------------------------------------------------------- LoRA adapters

LORA_PROPS = "option.enable_lora=true\noption.max_loras=2\noption.max_lora_rank=16\noption.max_cpu_loras=3\n"


@pytest.fixture
def fake_model_fn(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The fake engine's token function and adapter effect, imported from the fake package."""
    monkeypatch.syspath_prepend(str(FAKES))
    from tensorrt_llm._tensorrt_engine import fake_lora_shift, fake_next_token

    yield fake_next_token, fake_lora_shift
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]  # later tests must not find the fake installed


def _fake_tokens(
    fns: Any, tokenizer: Any, prompt: str, adapter: Path | None, n: int, vocab: int
) -> list[int]:
    next_token, shift_of = fns
    prompt_ids = tokenizer(prompt).input_ids
    shift = shift_of(str(adapter)) if adapter is not None else 0
    out: list[int] = []
    for _ in range(n):
        out.append(next_token(prompt_ids, out, vocab, shift))
    return out


def test_lora_adapters_per_request_through_the_server(
    tiny_model: Path,
    tmp_path: Path,
    fake_trtllm: dict[str, str],
    lora_adapters: dict[str, Path],
    fake_model_fn: Any,
) -> None:
    """Base and two adapters in one batch each get their own tokens (the fake's adapter effect), an adapter
    registered at run time works, and after removal its name is refused and a new one with the same name
    gets the new weights, never the cached old ones."""
    from concurrent.futures import ThreadPoolExecutor

    from transformers import AutoTokenizer

    folder = _model(tiny_model, tmp_path / "m", LORA_PROPS + f"option.adapter_roots={tmp_path / 'extra'}\n")
    for name in ("a1", "a2"):
        shutil.copytree(lora_adapters[name], folder / "adapters" / name)
    for name in ("a1", "a3"):
        shutil.copytree(lora_adapters[name], tmp_path / "extra" / name)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]

    def expect(prompt: str, adapter: str | None) -> list[int]:
        path = None if adapter is None else lora_adapters[adapter]
        return _fake_tokens(fake_model_fn, tokenizer, prompt, path, 8, vocab)

    def ask(url: str, prompt: str, adapter: str | None) -> list[int]:
        body: dict[str, Any] = {"inputs": prompt, "parameters": {"max_new_tokens": 8, "details": True}}
        if adapter is not None:
            body["adapters"] = adapter
        resp = http_client().post(url + "/invocations", json=body, timeout=30)
        assert resp.status_code == 200, resp.text
        return [t["id"] for t in resp.json()["details"]["tokens"]]

    with RemoteServer(folder, env={**fake_trtllm, "FAKE_TRTLLM_EOS_AFTER": ""}) as server:
        jobs = [(p, a) for p in ("def ", "import os") for a in (None, "a1", "a2")]
        with ThreadPoolExecutor(len(jobs)) as pool:
            outs = list(pool.map(lambda job: ask(server.url, *job), jobs))
        assert outs == [expect(*job) for job in jobs]
        assert len({tuple(o) for o in outs[:3]}) == 3  # the adapters change the tokens
        resp = http_client().post(
            server.url + "/adapters", json={"name": "a3", "src": str(tmp_path / "extra" / "a3")}
        )
        assert resp.status_code == 200, resp.text
        assert ask(server.url, "def ", "a3") == expect("def ", "a3")
        assert http_client().delete(server.url + "/adapters/a3").status_code == 200
        gone = http_client().post(
            server.url + "/invocations", json={"inputs": "x", "adapters": "a3"}, timeout=30
        )
        assert gone.status_code == 404 and "'a3'" in gone.json()["message"]
        resp = http_client().post(
            server.url + "/adapters", json={"name": "a3", "src": str(tmp_path / "extra" / "a1")}
        )
        assert resp.status_code == 200, resp.text
        assert ask(server.url, "def ", "a3") == expect("def ", "a1")


def test_lora_engine_loads_with_lora_config_and_round_trips(
    tiny_model: Path,
    tmp_path: Path,
    fake_trtllm: dict[str, str],
    lora_adapters: dict[str, Path],
    fake_model_fn: Any,
) -> None:
    """The engine in this process (on the fake): LLM loaded with enable_lora and LoraConfig(max_lora_rank,
    max_loras, max_cpu_loras); LoRARequest per request; a removed adapter is refused by the engine itself,
    and requests still running with it finish with it."""
    import asyncio

    from lmforge.adapters.registry import AdapterRegistry
    from lmforge.engines.protocol import GenerationRequest, SamplingParams
    from lmforge.engines.trtllm.api import load_api
    from lmforge.engines.trtllm.engine import TrtllmEngine
    from lmforge.errors import NotFoundError

    folder = _model(tiny_model, tmp_path / "m", LORA_PROPS)
    for name in ("a1", "a2"):
        shutil.copytree(lora_adapters[name], folder / "adapters" / name)
    resolved = load_config(folder, env={})
    engine = TrtllmEngine(resolved.config, resolved.extra_options, api=load_api())
    registry = AdapterRegistry(resolved.config, engine)

    async def tokens(rid: str, prompt: str, adapter: Any, n: int = 8) -> list[int]:
        ids = engine.tokenizer.encode(prompt)
        request = GenerationRequest(rid, ids, SamplingParams(max_new_tokens=n), adapter=adapter)
        return [e.token.id async for e in engine.generate(request) if e.token is not None]

    async def scenario() -> None:
        await engine.start()
        try:
            llm = engine._llm
            assert llm.enable_lora is True
            cfg = llm.lora_config
            assert (cfg.max_lora_rank, cfg.max_loras, cfg.max_cpu_loras) == (16, 2, 3)
            assert sorted(await registry.load_folder()) == ["a1", "a2"]
            a1, a2 = registry.get("a1"), registry.get("a2")
            both = await asyncio.gather(
                tokens("1", "def ", a1), tokens("2", "def ", a2), tokens("3", "def ", None)
            )
            assert len({tuple(t) for t in both}) == 3
            seen = {(r.lora_name, r.lora_int_id, r.lora_path, r.lora_ckpt_source) for r in llm.lora_requests}
            assert seen == {("a1", a1.int_id, str(a1.path), "hf"), ("a2", a2.int_id, str(a2.path), "hf")}
            # remove while a request with it runs: it finishes with a1; later ones are refused
            submitted = len(llm.lora_requests)
            running = asyncio.create_task(tokens("long", "def ", a1, n=200))
            for _ in range(1000):  # loop turns until the engine has the request (it runs with a1)
                if len(llm.lora_requests) > submitted:
                    break
                await asyncio.sleep(0)
            assert len(llm.lora_requests) > submitted and not running.done()
            await registry.remove("a1")
            assert running.done() and len(running.result()) == 200
            with pytest.raises(NotFoundError, match="'a1'"):
                await tokens("4", "def ", a1)
        finally:
            await engine.shutdown()

    asyncio.run(scenario())


@pytest.mark.gpu
def test_real_tensorrt_llm_serves_lora_adapters_like_peft(
    tiny_model: Path, tmp_path: Path, lora_adapters: dict[str, Path]
) -> None:
    """Only with an NVIDIA GPU and the real TensorRT-LLM: an fp32 engine built with the LoRA plugin serves
    the base model and two adapters in one batch, each equal to PEFT's greedy tokens for it alone."""
    from concurrent.futures import ThreadPoolExecutor

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    trtllm = pytest.importorskip("tensorrt_llm")
    if str(getattr(trtllm, "__file__", "")).startswith(str(FAKES)):
        pytest.skip("the fake TensorRT-LLM is on the path")
    from lmforge.testing.lora import PeftReference

    folder = _model(tiny_model, tmp_path / "m", LORA_PROPS)
    props = (folder / "serving.properties").read_text().replace("option.dtype=fp16", "option.dtype=fp32")
    (folder / "serving.properties").write_text(props)
    for name in ("a1", "a2"):
        shutil.copytree(lora_adapters[name], folder / "adapters" / name)
    peft = PeftReference(tiny_model, {n: lora_adapters[n] for n in ("a1", "a2")})
    jobs = [(p, a) for p in ("def hello(x):", "import os\n") for a in (None, "a1", "a2")]

    def ask(url: str, prompt: str, adapter: str | None) -> list[int]:
        body: dict[str, Any] = {
            "inputs": prompt,
            "parameters": {"max_new_tokens": 12, "ignore_eos_token": True, "details": True},
        }
        if adapter is not None:
            body["adapters"] = adapter
        resp = http_client().post(url + "/invocations", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        return [t["id"] for t in resp.json()["details"]["tokens"]]

    with RemoteServer(folder, startup_timeout=1800) as server, ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: ask(server.url, *job), jobs))
    assert outs == [peft.greedy(p, 12, a) for p, a in jobs]
