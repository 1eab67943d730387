"""Cross-engine truth on real weights: SmolLM2-135M-Instruct (fp32, ``lmforge example-model --model
smollm2-135m``) answers the same greedy tokens on LMI-Dist, vLLM and transformers' own ``generate``.

For fixed completion prompts (LMI's ``inputs``) and a fixed chat (``messages``), each engine's first
:data:`NEW` greedy tokens must equal transformers' exactly (ids for completions; the text for chat,
whose OpenAI log-probs carry no ids), and each token's log-prob must be within :data:`LOGPROB_TOL`
of transformers'. All are fp32 on one CPU thread with the same weights; the engines lay out the batch
and attention differently, so log-probs differ in the low bits only: measured here, at most 1.7e-4
on either engine over these prompts, streamed or not (2026-11-24), so 1e-3 leaves a 5x margin while
a wrong position, a mask or a missing temperature/penalty step would move them by far more.

Paths: vLLM through ``lmforge serve`` over HTTP (``/invocations`` and ``/v1/chat/completions``,
streamed and not), with lmforge sizing vLLM's CPU KV cache itself (no ``kv_cache_memory_mb``);
LMI-Dist through the local SageMaker (``lmforge deploy``, then boto3 ``invoke_endpoint`` and
``invoke_endpoint_with_response_stream``). Each engine gets all of its requests at once, so they
share its continuous batch (prompts of different lengths decoding side by side, which must not change
a row's tokens) and the 540 MB of weights are read once per step for all of them, not once per request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmforge.testing.server import RemoteServer, http_client
from tests.conftest import Reference
from tests.local_sagemaker import lmforge

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("smollm2")]

NEW = 32
LOGPROB_TOL = 1e-3
COMPLETIONS = ("def fibonacci(n):", "The three primary colors are")
CHAT = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}]

Want = tuple[list[int], list[float], str]
"""Greedy ids, their log-probs and the decoded text."""
Expected = dict[str, Want]


@pytest.fixture(scope="module")
def expected(smollm2_reference: Reference) -> Expected:
    """transformers' greedy ids, log-probs and text for each completion prompt and for the chat."""
    ref = smollm2_reference
    out: Expected = {}
    for prompt in COMPLETIONS:
        ids, logprobs = ref.greedy(prompt, NEW)
        out[prompt] = (ids, logprobs, ref.decode(ids))
    chat_ids = ref.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)["input_ids"]
    ids, logprobs = ref.greedy(list(chat_ids), NEW)
    out["chat"] = (ids, logprobs, ref.decode(ids))
    for key, (ids, _, _) in out.items():
        assert len(ids) == NEW, f"{key!r}: the reference stopped early; pick a prompt with a longer answer"
    return out


def _check_tokens(tokens: list[dict[str, Any]], want: Want, where: str) -> None:
    ids, logprobs, _ = want
    assert [t["id"] for t in tokens] == ids, where
    for i, (token, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        assert token["log_prob"] is not None, f"{where}: token {i} has no log_prob"
        assert abs(token["log_prob"] - lp) <= LOGPROB_TOL, (where, i, token["log_prob"], lp)


def _check_chat(text: str, logprobs: list[float], want: Want, where: str) -> None:
    assert text == want[2], where
    assert len(logprobs) == NEW, where
    for i, (got, lp) in enumerate(zip(logprobs, want[1], strict=True)):
        assert abs(got - lp) <= LOGPROB_TOL, (where, i, got, lp)


def _lmi_body(prompt: str, stream: bool) -> dict[str, Any]:
    params = {"max_new_tokens": NEW, "details": True, "do_sample": False}
    return {"inputs": prompt, "parameters": params, "stream": stream}


def _chat_body(stream: bool) -> dict[str, Any]:
    return {"messages": CHAT, "max_tokens": NEW, "temperature": 0, "logprobs": True, "stream": stream}


def _chat_from_chunks(chunks: list[dict[str, Any]]) -> tuple[str, list[float]]:
    text, logprobs = "", []
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            text += choice["delta"].get("content") or ""
            logprobs += [c["logprob"] for c in (choice.get("logprobs") or {}).get("content") or []]
    return text, logprobs


def _chat_from_reply(reply: dict[str, Any]) -> tuple[str, list[float]]:
    choice = reply["choices"][0]
    return choice["message"]["content"], [c["logprob"] for c in choice["logprobs"]["content"]]


def _check_all(
    engine: str,
    invoke: Callable[[dict[str, Any]], dict[str, Any]],
    stream: Callable[[dict[str, Any]], list[dict[str, Any]]],
    chat: Callable[[bool], tuple[str, list[float]]],
    expected: Expected,
) -> None:
    """Every completion prompt whole and streamed, and the chat whole and streamed, all sent at once
    (one continuous batch); each answer checked against transformers'."""
    with ThreadPoolExecutor(2 * len(COMPLETIONS) + 2) as pool:
        whole = {p: pool.submit(invoke, _lmi_body(p, False)) for p in COMPLETIONS}
        streamed = {p: pool.submit(stream, _lmi_body(p, True)) for p in COMPLETIONS}
        chats = {s: pool.submit(chat, s) for s in (False, True)}
    for prompt in COMPLETIONS:
        reply = whole[prompt].result()
        _check_tokens(reply["details"]["tokens"], expected[prompt], f"{engine} {prompt!r}")
        assert reply["generated_text"] == expected[prompt][2]
        lines = streamed[prompt].result()
        _check_tokens([line["token"] for line in lines], expected[prompt], f"{engine} {prompt!r} streamed")
    _check_chat(*chats[False].result(), expected["chat"], f"{engine} chat")
    _check_chat(*chats[True].result(), expected["chat"], f"{engine} chat streamed")


# --------------------------------------------------------------------------- vLLM over HTTP


@pytest.mark.vllm
def test_vllm_over_http_agrees_with_transformers(smollm2_vllm: RemoteServer, expected: Expected) -> None:
    logs = smollm2_vllm.log_path.read_text(errors="replace")
    assert "vLLM on CPU: KV cache" in logs, "lmforge did not size vLLM's CPU KV cache itself"
    url = smollm2_vllm.url

    def invoke(body: dict[str, Any]) -> dict[str, Any]:
        return dict(http_client().post(f"{url}/invocations", json=body, timeout=120).json())

    def stream(body: dict[str, Any]) -> list[dict[str, Any]]:
        return _lines(http_client().post(f"{url}/invocations", json=body, timeout=120))

    def chat(streamed: bool) -> tuple[str, list[float]]:
        resp = http_client().post(f"{url}/v1/chat/completions", json=_chat_body(streamed), timeout=120)
        if not streamed:
            return _chat_from_reply(resp.json())
        events = resp.text.split("\n\n")
        return _chat_from_chunks([json.loads(e[6:]) for e in events if e.startswith("data: {")])

    _check_all("vllm", invoke, stream, chat, expected)


def _lines(resp: httpx.Response) -> list[dict[str, Any]]:
    assert resp.status_code == 200, resp.text
    return [json.loads(line) for line in resp.text.splitlines() if line.strip()]


# --------------------------------------------------------------------------- LMI-Dist via the local SageMaker


@pytest.fixture(scope="module")
def lmi_dist_endpoint(local: dict[str, str], smollm2_model: Path) -> Iterator[str]:
    """The folder as ``example-model`` writes it (LMI-Dist), deployed with ``lmforge deploy`` as an
    uncompressed S3 prefix (what LMI advises for large models; gzip of the 540 MB of fp32 weights
    would cost more CPU than the rest of the deployment, and tar.gz is covered on the tiny model)."""
    assert "option.rolling_batch=lmi-dist" in (smollm2_model / "serving.properties").read_text()
    name = "smollm2-lmi-dist"
    args = ("deploy", str(smollm2_model), "--endpoint-name", name, "--instance-type", "ml.m5.xlarge")
    args += ("--artifact-format", "prefix")
    out = lmforge(*args, env=local, timeout=600)
    assert f"{name}: InService" in out.stdout
    try:
        yield name
    finally:
        lmforge("delete", name, env=local)


def test_lmi_dist_through_the_local_sagemaker_agrees_with_transformers(
    lmi_dist_endpoint: str, clients: dict[str, Any], expected: Expected
) -> None:
    from lmforge.client import iter_stream_objects

    smr = clients["sagemaker-runtime"]

    def invoke(body: dict[str, Any]) -> dict[str, Any]:
        resp = smr.invoke_endpoint(
            EndpointName=lmi_dist_endpoint, Body=json.dumps(body), ContentType="application/json"
        )
        return dict(json.loads(resp["Body"].read()))

    def stream(body: dict[str, Any]) -> list[dict[str, Any]]:
        resp = smr.invoke_endpoint_with_response_stream(
            EndpointName=lmi_dist_endpoint, Body=json.dumps(body), ContentType="application/json"
        )
        return list(iter_stream_objects(resp["Body"]))

    def chat(streamed: bool) -> tuple[str, list[float]]:
        if streamed:
            return _chat_from_chunks(stream(_chat_body(True)))
        return _chat_from_reply(invoke(_chat_body(False)))

    _check_all("lmi-dist", invoke, stream, chat, expected)


# --------------------------------------------------------------------------- structured output, both engines

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def _structured_bodies() -> list[dict[str, Any]]:
    ask = [{"role": "user", "content": "Alice is 30 and lives in Paris. Describe her as JSON."}]
    weather = [{"role": "user", "content": "What is the weather like in Rome today?"}]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 24}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    named = {"type": "function", "function": {"name": "get_weather"}}
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    return [
        {"messages": ask, "max_tokens": 64, "temperature": 0, "response_format": schema},
        {"messages": weather, "max_tokens": 32, "temperature": 0, "tools": tools, "tool_choice": named},
    ]


def _without_ids(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply's message, less the tool-call ids (random per reply)."""
    message = dict(reply["choices"][0]["message"])
    calls = message.get("tool_calls") or []
    message["tool_calls"] = [{k: v for k, v in c.items() if k != "id"} for c in calls]
    return message


@pytest.mark.vllm
def test_structured_output_is_the_same_on_both_engines(
    smollm2_vllm: RemoteServer, lmi_dist_endpoint: str, clients: dict[str, Any]
) -> None:
    """The same grammar (xgrammar on both) over the same weights: greedy replies are identical, follow
    the schema, and read as an answer (LMI-Dist through the local SageMaker and boto3, vLLM over HTTP)."""
    smr = clients["sagemaker-runtime"]

    def vllm(body: dict[str, Any]) -> dict[str, Any]:
        return dict(
            http_client().post(f"{smollm2_vllm.url}/v1/chat/completions", json=body, timeout=120).json()
        )

    def lmi(body: dict[str, Any]) -> dict[str, Any]:
        resp = smr.invoke_endpoint(
            EndpointName=lmi_dist_endpoint, Body=json.dumps(body), ContentType="application/json"
        )
        return dict(json.loads(resp["Body"].read()))

    bodies = _structured_bodies()
    with ThreadPoolExecutor(2 * len(bodies)) as pool:  # both bodies in one batch on each engine
        pairs = [(pool.submit(vllm, body), pool.submit(lmi, body)) for body in bodies]
    replies = []
    for via_vllm_f, via_lmi_f in pairs:
        via_vllm, via_lmi = via_vllm_f.result(), via_lmi_f.result()
        assert _without_ids(via_vllm) == _without_ids(via_lmi), (via_vllm, via_lmi)
        replies.append(via_lmi["choices"][0])
    described = json.loads(replies[0]["message"]["content"])
    assert replies[0]["finish_reason"] == "stop"
    assert set(described) == {"name", "age", "city"} and described["age"] == 30, described
    assert "Alice" in described["name"] and "Paris" in described["city"], described
    (tool_call,) = replies[1]["message"]["tool_calls"]
    assert replies[1]["finish_reason"] == "tool_calls"
    assert tool_call["function"]["name"] == "get_weather"
    assert "Rome" in json.loads(tool_call["function"]["arguments"])["city"]
