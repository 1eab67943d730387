"""The official ``openai`` client's view of a server, checked the same way on every engine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from lmforge.models.example import EOS, SPECIAL_TOKENS
from lmforge.testing.server import VLLM_ENV, http_client

PROMPT = "def fibonacci(n):"


def check_openai_client(
    client: openai.OpenAI, model: str | None = None, greedy_text: str | None = None
) -> None:
    """What every engine must give the official client: the model list (the served model first), chat
    and completions streamed and not (equal texts), usage, logprobs, vLLM's extras, a 400 by name."""
    models = client.models.list()
    served = models.data[0].id
    assert model is None or served == model
    model = served

    messages: Any = [{"role": "user", "content": "Say hello"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    text = chat.choices[0].message.content
    assert isinstance(text, str) and chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage is not None and 0 < chat.usage.completion_tokens <= 8
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    done = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    choice = done.choices[0]
    if greedy_text is not None:
        assert choice.text == greedy_text
    assert choice.logprobs is not None and len(choice.logprobs.token_logprobs or []) == 6
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs or [])
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=6,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, "top_k": 1},
        )
    ]
    assert "".join(pieces) == choice.text

    # vLLM's sampling extras, honoured: a +100 logit_bias decides every greedy token; min_tokens holds
    # EOS back even when logit_bias makes it the only choice
    biased = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=0, logit_bias={"100": 100}
    )
    assert biased.choices[0].logprobs is not None
    assert len(set(biased.choices[0].logprobs.tokens or [])) == 1, biased
    assert biased.usage is not None and biased.usage.completion_tokens == 5
    eos = {str(SPECIAL_TOKENS.index(EOS)): 100}
    for least in (0, 3):
        held = client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=8,
            temperature=0,
            logit_bias=eos,
            extra_body={"min_tokens": least},
        )
        assert held.choices[0].finish_reason == "stop" and held.usage is not None
        assert held.usage.completion_tokens in (least, least + 1), held
    sampled = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0.8,
        seed=3,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        extra_body={"min_p": 0.05},
    )
    assert sampled.usage is not None and sampled.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=4, extra_body={"min_tokens": 5})
    # OpenAI's error object, as vLLM's server sends it: the client reads body, code, param and type
    body = caught.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}, body
    assert (caught.value.code, caught.value.param, caught.value.type) == (
        "400",
        "min_tokens",
        "BadRequestError",
    )
    assert "min_tokens" in str(caught.value)
    # a model the server does not serve: vLLM's 404, whatever the route, streamed or not
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=2, stream=stream)
        assert missing.value.param == "model" and "The model `gpt-4o` does not exist" in str(missing.value)
    assert client.chat.completions.create(
        model="", messages=messages, max_tokens=2
    ).choices  # as SageMaker sends

    # lm-eval-harness's log-likelihood request: the prompt's tokens scored, nothing generated
    scored = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    echoed = scored.choices[0]
    assert echoed.text == PROMPT and echoed.finish_reason == "length"
    assert scored.usage is not None and scored.usage.completion_tokens == 0
    lp = echoed.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.token_logprobs) == scored.usage.prompt_tokens and lp.token_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert lp.top_logprobs[0] is None and all(len(t) == 1 for t in lp.top_logprobs[1:])
    more = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=3, echo=True, logprobs=1, temperature=0
    )
    assert more.choices[0].logprobs is not None and more.choices[0].logprobs.token_logprobs is not None
    again_lp = more.choices[0].logprobs.token_logprobs
    assert again_lp[: len(lp.token_logprobs)] == pytest.approx(lp.token_logprobs, abs=1e-4)
    assert len(again_lp) == len(lp.token_logprobs) + 3
    # a token id past the vocabulary is the client's error, and the engine keeps serving everyone
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=[1, 10**7], max_tokens=2)
    assert "out of range" in str(caught.value)
    again = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    assert again.choices[0].text == choice.text

    # stop_token_ids end the reply as EOS does, without their text (the ids from LMI's details)
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    lmi = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "details": True, "do_sample": False}}
    tokens = http_client().post(f"{base}/invocations", json=lmi, timeout=60).json()["details"]["tokens"]
    ids = [t["id"] for t in tokens]
    at = ids.index(ids[2])
    cut = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, temperature=0, extra_body={"stop_token_ids": [ids[2]]}
    )
    assert cut.choices[0].finish_reason == "stop" and cut.usage is not None
    assert cut.usage.completion_tokens == at + 1
    assert cut.choices[0].text == "".join(t["text"] for t in tokens[:at])

    # n choices: greedy ones are all the greedy answer; seeded samples are reproducible, streamed or not
    greedy = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2] and {c.text for c in greedy.choices} == {
        choice.text
    }
    assert greedy.usage is not None and greedy.usage.completion_tokens == 18
    assert done.usage is not None and greedy.usage.prompt_tokens == done.usage.prompt_tokens
    several: Any = {
        "model": model,
        "messages": messages,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 11,
        "n": 3,
    }
    whole = client.chat.completions.create(**several)
    texts = [c.message.content for c in sorted(whole.choices, key=lambda c: c.index)]
    assert len(texts) == 3 and len(set(texts)) > 1, texts  # seed + i: different draws
    parts: dict[int, str] = {}
    finished = set()
    for chunk in client.chat.completions.create(
        **several, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            assert whole.usage is not None and chunk.usage.completion_tokens == whole.usage.completion_tokens
        for c in chunk.choices:
            parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finished.add(c.index)
    assert [parts[i] for i in range(3)] == texts and finished == {0, 1, 2}


ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def check_structured_output(client: openai.OpenAI, model: str, *, auto_tools: bool = False) -> None:
    """``response_format`` and forced tool calls through the official client: replies that follow the
    schema even from a random-weight model (the schemas leave few choices, so replies are short), the
    same greedy answer streamed and not, and 400s that name the field."""
    ask: Any = [{"role": "user", "content": "Is it raining? Answer as JSON."}]
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}
    reply = client.chat.completions.create(
        model=model, messages=ask, max_tokens=32, temperature=0, response_format=fmt
    )
    assert reply.choices[0].finish_reason == "stop"
    assert json.loads(reply.choices[0].message.content or "") in ({"answer": "yes"}, {"answer": "no"})
    sampled = client.chat.completions.create(
        model=model, messages=ask, max_tokens=32, temperature=1.0, seed=7, response_format=fmt
    )
    assert json.loads(sampled.choices[0].message.content or "")["answer"] in ("yes", "no")
    # the completions route takes response_format too (as vLLM's does)
    done = client.completions.create(
        model=model, prompt="Answer: ", max_tokens=32, temperature=0, extra_body={"response_format": fmt}
    )
    assert json.loads(done.choices[0].text)["answer"] in ("yes", "no")

    weather: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    call = client.chat.completions.create(
        model=model, messages=weather, tools=[WEATHER, TIME], tool_choice=named, max_tokens=48, temperature=0
    )
    choice = call.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].function.name == "get_weather"
    args = json.loads(calls[0].function.arguments)
    assert args["city"] in ("Paris", "Rome") and args["unit"] in ("celsius", "fahrenheit")
    assert calls[0].id

    # streamed: the client's deltas add up to the same call
    stream = client.chat.completions.create(
        model=model,
        messages=weather,
        tools=[WEATHER, TIME],
        tool_choice=named,
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    name, arguments, finish, ids = "", "", None, set()
    for chunk in stream:
        delta = chunk.choices[0].delta
        for piece in delta.tool_calls or []:
            assert piece.index == 0
            if piece.id:
                ids.add(piece.id)
            if piece.function is not None:
                name += piece.function.name or ""
                arguments += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, json.loads(arguments), finish, len(ids)) == ("get_weather", args, "tool_calls", 1)

    # a tool call, then its result, then the answer: the history is accepted and rendered
    history: Any = [
        *weather,
        {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"celsius": 21}'},
    ]
    after = client.chat.completions.create(model=model, messages=history, max_tokens=4, temperature=0)
    assert after.choices[0].message.tool_calls is None

    # "required": one or more calls of the given tools; parallel_tool_calls=false: exactly one
    required = client.chat.completions.create(
        model=model,
        messages=weather,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
    )
    got = required.choices[0].message.tool_calls or []
    assert required.choices[0].finish_reason == "tool_calls" and len(got) == 1
    assert got[0].function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(got[0].function.arguments), dict)

    refusals: list[tuple[dict[str, Any], str]] = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}}, "schema"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"tools": [WEATHER], "tool_choice": named | {"function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": fmt, "ignore_eos": True}, "ignore_eos"),
    ]
    if not auto_tools:  # auto without option.enable_auto_tool_choice: refused, saying what to set
        refusals.append(({"tools": [WEATHER]}, "tool_choice"))
    for extra, field in refusals:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=model, messages=ask, max_tokens=4, extra_body=extra)
        assert field in str(caught.value), (extra, str(caught.value))


def run_vllm_bench_serve(url: str, model: str, tokenizer: Path, runs: list[tuple[str, str]]) -> list[str]:
    """``vllm bench serve --backend BACKEND --endpoint ENDPOINT --ignore-eos`` for each of ``runs``, one
    after the other in one process (vLLM's import is most of a run's CPU time); each run's output,
    to be checked with :func:`check_vllm_bench_serve`. Needs vLLM (mark the test ``needs_vllm``)."""
    args: list[str] = []
    for backend, endpoint in runs:
        args += [
            *(["--then"] if args else []),
            *("--backend", backend, "--base-url", url, "--endpoint", endpoint),
            *("--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random"),
            *("--random-input-len", "32", "--random-output-len", "16", "--num-prompts", "24", "--ignore-eos"),
        ]
    script = Path(__file__).parent / "integration" / "vllm_bench_serve.py"
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300 * len(runs),
        env={**os.environ, **VLLM_ENV},
    )
    parts = re.split(r"^=== vllm bench serve run \d+ ===$", proc.stdout, flags=re.M)[1:]
    assert proc.returncode == 0 and len(parts) == len(runs), (proc.stdout + proc.stderr)[-3000:]
    return parts


def check_vllm_bench_serve(out: str) -> None:
    """Every request of a ``vllm bench serve`` run succeeded."""
    assert re.search(r"Successful requests:\s+24\b", out), out[-3000:]
    assert re.search(r"Failed requests:\s+0\b", out), out[-3000:]
