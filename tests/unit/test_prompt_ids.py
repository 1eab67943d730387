"""The token ids every route hands the engine, pinned: what a request's prompt becomes (LMI and TGI
``inputs``, OpenAI completions prompts as text, lists and ids, chat messages with and without tools,
echo with prompt log-probs) and what ``/tokenize`` counts, with the length a chat request without one
is given. The pinned ids were taken before the prompt was tokenized in one place
(:mod:`lmforge.handlers.prompt`): any change in them is a change clients see.

``prompt_ids.json`` holds them, one case a line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from lmforge.engines.protocol import GenerationRequest, SamplingParams
from tests.unit.test_http_contract import PROMPT, Served, run

pytestmark = pytest.mark.xdist_group("prompt-ids")

PINNED = Path(__file__).with_name("prompt_ids.json")

#: the example model's template, with the tools and the assistant's tool calls written out
TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>\n{{ tools | tojson }}</s>\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m.get('tool_calls') %}{{ m['tool_calls'] | tojson }}{% endif %}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi <s> there"}]
TOOL_CHAT = [
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]
ODD = "  naïve 😀 中文\n\tend <s>x</s>"

#: (case, route, body): each one's engine requests are pinned, in order
REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("lmi", "/invocations", {"inputs": PROMPT}),
    ("lmi-odd", "/invocations", {"inputs": ODD, "parameters": {"max_new_tokens": 3}}),
    ("tgi-details", "/invocations", {"inputs": PROMPT, "parameters": {"details": True, "top_n_tokens": 2}}),
    ("lmi-chat", "/invocations", {"messages": CHAT}),
    ("lmi-chat-length", "/invocations", {"messages": CHAT, "max_tokens": 7}),
    ("invocations-completion", "/invocations", {"prompt": PROMPT, "max_tokens": 2}),
    ("completion", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
    ("completion-odd", "/v1/completions", {"prompt": ODD, "max_tokens": 2}),
    ("completion-list", "/v1/completions", {"prompt": [PROMPT, ODD], "max_tokens": 2}),
    ("completion-ids", "/v1/completions", {"prompt": [5, 7, 9, 1, 2], "max_tokens": 2}),
    ("completion-id-lists", "/v1/completions", {"prompt": [[3, 4], [1, 8, 9]], "max_tokens": 2, "n": 2}),
    ("completion-n", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "n": 2, "seed": 3}),
    ("echo", "/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1}),
    ("echo-ids", "/v1/completions", {"prompt": [1, 475, 290], "max_tokens": 1, "echo": True, "logprobs": 0}),
    ("chat", "/v1/chat/completions", {"messages": CHAT}),
    ("chat-length", "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 4}),
    ("chat-odd", "/v1/chat/completions", {"messages": [{"role": "user", "content": ODD}], "max_tokens": 2}),
    ("chat-tools", "/v1/chat/completions", {"messages": TOOL_CHAT, "tools": TOOLS, "tool_choice": "none"}),
    (
        "chat-forced-tool",
        "/v1/chat/completions",
        {"messages": TOOL_CHAT, "tools": TOOLS, "tool_choice": "required"},
    ),
    ("chat-n", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "n": 2}),
]

#: (case, body): each one's ``/tokenize`` ids
TOKENIZE: list[tuple[str, dict[str, Any]]] = [
    ("tokenize-prompt", {"prompt": ODD}),
    ("tokenize-prompt-bare", {"prompt": ODD, "add_special_tokens": False}),
    ("tokenize-chat", {"messages": CHAT}),
    ("tokenize-chat-special", {"messages": CHAT, "add_special_tokens": True}),
    ("tokenize-chat-tools", {"messages": TOOL_CHAT, "tools": TOOLS}),
    ("tokenize-chat-continue", {"messages": CHAT, "continue_final_message": True}),
]


@pytest.fixture(scope="module")
def tools_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example model with a chat template that writes out tools and tool calls."""
    folder = tmp_path_factory.mktemp("tools-model") / "tiny-tools"
    shutil.copytree(tiny_model, folder)
    (folder / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return folder


def observed(model: Path) -> dict[str, list[Any]]:
    """Every case's engine prompts as ``[ids, max_new_tokens]`` (``/tokenize``: its ids)."""

    async def scenario(srv: Served) -> dict[str, list[Any]]:
        taken: list[list[Any]] = []
        prepare = srv.engine.prepare

        def recording(request: GenerationRequest) -> SamplingParams:
            params = prepare(request)
            taken.append([request.prompt, params.max_new_tokens])
            return params

        srv.engine.prepare = recording  # type: ignore[method-assign]
        out: dict[str, list[Any]] = {}
        for case, route, body in REQUESTS:
            resp = await srv.client.post(route, json=body)
            assert resp.status_code == 200, (case, resp.text)
            out[case], taken[:] = list(taken), []
        for case, body in TOKENIZE:
            resp = await srv.client.post("/tokenize", json=body)
            assert resp.status_code == 200, (case, resp.text)
            out[case] = resp.json()["tokens"]
        return out

    return run(model, scenario)


def test_every_route_hands_the_engine_the_pinned_ids(tools_model: Path) -> None:
    pinned = json.loads(PINNED.read_text())
    got = observed(tools_model)
    assert list(got) == list(pinned)
    for case, ids in got.items():
        assert ids == pinned[case], case


LONG = "x " * 600
CHAT_LONG = [{"role": "user", "content": LONG}]
#: (route, body, status, the field the error names): prompts refused by the prompt unit or by the
#: engine's size check (the scripted engine's max_model_len is 512), named as the client sent them
REFUSED: list[tuple[str, dict[str, Any], int, str]] = [
    ("/v1/completions", {"prompt": [[1, 2], [99999]], "max_tokens": 2}, 400, "prompt.1"),
    ("/v1/completions", {"prompt": [99999], "max_tokens": 2}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "logit_bias": {"99999": 1}}, 400, "logit_bias"),
    (
        "/v1/completions",
        {"prompt": [1, 2], "max_tokens": 2, "stop_token_ids": [99999]},
        400,
        "stop_token_ids",
    ),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "model": "nope"}, 404, "model"),
    ("/invocations", {"inputs": "x", "adapters": "a1"}, 400, "adapters"),
    ("/v1/completions", {"prompt": ["hi", LONG], "max_tokens": 2}, 400, "prompt.1"),
    ("/invocations", {"inputs": LONG}, 400, "inputs"),
    ("/invocations", {"messages": CHAT_LONG}, 400, "messages"),
    ("/v1/chat/completions", {"messages": CHAT_LONG}, 400, "messages"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 600}, 400, "max_tokens"),
    ("/tokenize", {"prompt": "x", "model": "nope"}, 404, "model"),
    ("/detokenize", {"tokens": [99999]}, 400, "tokens"),
]


def test_refused_prompts_keep_their_status_and_field(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> list[tuple[int, str]]:
        got = []
        for route, body, _, _ in REFUSED:
            resp = await srv.client.post(route, json=body)
            error = resp.json()
            got.append((resp.status_code, (error.get("error") or error)["param"]))
        return got

    assert run(tiny_model, scenario) == [(status, param) for _, _, status, param in REFUSED]
