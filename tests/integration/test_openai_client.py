"""The official ``openai`` Python client against ``lmforge serve`` on LMI-Dist (the tiny model), over
real sockets: chat and completions, streamed and not, logprobs, usage, the model list and errors;
batched completions prompts; vLLM's tokenizer routes beside them.
tests/integration/test_vllm.py runs the same client against the vLLM engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from lmforge.testing.server import RemoteServer, http_client
from tests.conftest import Reference
from tests.openai_checks import (
    PROMPT,
    check_openai_client,
    check_structured_output,
    check_vllm_bench_serve,
    run_vllm_bench_serve,
)
from tests.shared_vllm import needs_vllm

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("tiny-server")]


@pytest.fixture(scope="module")
def server(tiny_server: RemoteServer) -> RemoteServer:
    return tiny_server


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_official_openai_client(client: openai.OpenAI, server: RemoteServer, reference: Reference) -> None:
    ids, _ = reference.greedy(PROMPT, 6, eos=False)
    check_openai_client(client, "tiny", reference.decode(ids))


def test_structured_output_and_forced_tool_calls(client: openai.OpenAI) -> None:
    check_structured_output(client, "tiny")


BATCH = [PROMPT, "class Node:", "import os"]


def _choice(choice: Any) -> dict[str, Any]:
    """A completions choice without its index, log-probs rounded (batched and lone forward passes may
    differ in the last float bits)."""
    out: dict[str, Any] = choice.model_dump(exclude={"index"})
    lp = out.get("logprobs") or {}
    lp["token_logprobs"] = [None if v is None else round(v, 3) for v in lp.get("token_logprobs") or []]
    lp["top_logprobs"] = [
        None if top is None else {k: round(v, 3) for k, v in top.items()}
        for top in lp.get("top_logprobs") or []
    ]
    return out


@pytest.mark.parametrize("max_tokens", [0, 4])  # 0: lm-eval-harness's batched log-likelihood request
def test_batched_prompts_with_the_official_client(client: openai.OpenAI, max_tokens: int) -> None:
    """``prompt`` as a list with ``n=2``, ``echo`` and ``logprobs``: choice ``p * 2 + i`` is prompt
    ``p``'s, and equals that prompt sent alone (greedy), streamed or not; usage counts each prompt once."""
    body: dict[str, Any] = {"model": "tiny", "n": 2, "echo": True, "logprobs": 1, "max_tokens": max_tokens}
    body["temperature"] = 0
    out = client.completions.create(prompt=BATCH, **body)
    assert [c.index for c in out.choices] == list(range(6))
    alone = [client.completions.create(prompt=p, **body) for p in BATCH]
    for k, choice in enumerate(out.choices):
        assert choice.text.startswith(BATCH[k // 2])
        assert _choice(choice) == _choice(alone[k // 2].choices[k % 2]), k
    assert out.usage is not None and out.usage.prompt_tokens == sum(
        a.usage.prompt_tokens for a in alone if a.usage
    )
    assert out.usage.completion_tokens == 6 * max_tokens
    stream = client.completions.create(
        prompt=BATCH, stream=True, stream_options={"include_usage": True}, **body
    )
    texts = dict.fromkeys(range(6), "")
    usage = None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
        usage = chunk.usage or usage
    assert texts == {c.index: c.text for c in out.choices}
    assert usage == out.usage


def test_tokenize_round_trips_and_counts_as_requests_do(server: RemoteServer, client: openai.OpenAI) -> None:
    """vLLM's ``/tokenize`` on the real server: ``/detokenize`` gives the text back, and a chat's count is
    the ``prompt_tokens`` chat completions reports; ``/health`` and ``/version`` as vLLM answers them."""
    http = http_client()
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)"
    ids = http.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert ids["count"] == len(ids["tokens"]) > 0 and ids["max_model_len"] > 0
    back = http.post(server.url + "/detokenize", json={"tokens": ids["tokens"]})
    assert back.json() == {"prompt": text}
    completion = client.completions.create(model="tiny", prompt=text, max_tokens=1)
    counted = http.post(server.url + "/tokenize", json={"prompt": text}).json()["count"]
    assert completion.usage is not None and completion.usage.prompt_tokens == counted
    messages: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    tokenized = http.post(server.url + "/tokenize", json={"model": "tiny", "messages": messages}).json()
    assert chat.usage is not None and tokenized["count"] == chat.usage.prompt_tokens
    health = http.get(server.url + "/health")
    assert (health.status_code, health.content) == (200, b"")
    assert set(http.get(server.url + "/version").json()) == {"version"}
    assert http.get(server.url + "/tokenizer_info").json()["eos_token"]


BENCH_RUNS = [("openai-chat", "/v1/chat/completions"), ("openai", "/v1/completions")]


@pytest.fixture(scope="module")
def vllm_bench_outputs(server: RemoteServer, tiny_model: Path) -> dict[str, str]:
    """Both ``vllm bench serve`` runs, in one process."""
    outputs = run_vllm_bench_serve(server.url, "tiny", tiny_model, BENCH_RUNS)
    return {backend: out for (backend, _), out in zip(BENCH_RUNS, outputs, strict=True)}


@pytest.mark.vllm
@needs_vllm
@pytest.mark.parametrize("backend", [backend for backend, _ in BENCH_RUNS])
def test_vllm_bench_serve_completes_with_no_failures(
    vllm_bench_outputs: dict[str, str], backend: str
) -> None:
    """``vllm bench serve --backend openai-chat|openai --ignore-eos``: vLLM's tool sends vLLM's extras
    (ignore_eos, stream_options) and reads SSE as it reads vLLM's own server."""
    check_vllm_bench_serve(vllm_bench_outputs[backend])
