"""The OpenAI routes in-process, where real OpenAI clients are strict: error bodies and in-band error
events in OpenAI's shape, the ``model`` field, finish reasons, log-probs of byte-level tokens, and
``echo`` with prompt log-probs (lm-eval-harness's log-likelihood calls). Same harness as
tests/unit/test_http_contract.py: the real App and default handler on the scripted engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from lmforge.testing.scripted import LOG_PROB
from tests.unit.test_http_contract import PROMPT, Served, oerr, run, sse

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
OPENAI_FINISH = {"stop", "length", "tool_calls", "content_filter", None}


def events(resp: httpx.Response) -> list[Any]:
    """An OpenAI SSE stream's objects, its [DONE] checked and left out."""
    data = sse(resp)
    assert data[-1] == "[DONE]", data
    return [json.loads(d) for d in data[:-1]]


def finish_reasons(objs: list[dict[str, Any]]) -> set[str | None]:
    return {c["finish_reason"] for o in objs for c in o.get("choices", [])}


# --------------------------------------------------------------------------- the model field


def test_an_unknown_model_is_a_404_on_v1_as_vllm_answers_it(tiny_model: Path) -> None:
    """LoRA off: the /v1 routes accept the served name (as /v1/models lists it), ``model``, the model
    folder's name, an empty name and none at all; any other name is vLLM's 404. /invocations does not
    check it: SageMaker routes by endpoint and its clients send any string there."""

    async def scenario(srv: Served) -> None:
        served = (await srv.client.get("/v1/models")).json()["data"][0]["id"]
        assert served == srv.engine.model_name
        folder = srv.engine.config.model_dir
        assert folder is not None
        for name in (served, "model", folder.name, "", None):
            body = {**CHAT, "model": name} if name is not None else CHAT
            ok = await srv.client.post("/v1/chat/completions", json=body)
            assert ok.status_code == 200, (name, ok.text)
            assert ok.json()["model"] == served
        for path, body in (
            ("/v1/chat/completions", {**CHAT, "model": "gpt-4o"}),
            ("/v1/completions", {"prompt": PROMPT, "model": "gpt-4o"}),
            ("/v1/completions", {"prompt": PROMPT, "model": "gpt-4o", "stream": True}),
        ):
            resp = await srv.client.post(path, json=body)
            assert resp.status_code == 404, resp.text
            err = oerr(resp)
            assert (err["type"], err["param"]) == ("NotFoundError", "model")
            assert err["message"].startswith("The model `gpt-4o` does not exist.")
            assert served in err["message"]  # the valid names, as vLLM lists its aliases
        sagemaker = await srv.client.post("/invocations", json={**CHAT, "model": "my-endpoint"})
        assert sagemaker.status_code == 200, sagemaker.text

    run(tiny_model, scenario)


# --------------------------------------------------------------------------- errors in a stream


def test_an_engine_error_mid_stream_is_one_openai_error_event(tiny_model: Path) -> None:
    """An engine failure after the status line: OpenAI's error object as an SSE event, then [DONE];
    no chunk carries an "error" finish reason and no usage chunk follows. Whole answers get the
    status, in OpenAI's shape."""

    async def scenario(srv: Served) -> None:
        for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": PROMPT})):
            whole = await srv.client.post(path, json=body)
            assert whole.status_code == 424, whole.text
            assert oerr(whole)["type"] == "InternalServerError"
            asked = {**body, "stream": True, "stream_options": {"include_usage": True}}
            for n in (1, 2):
                objs = events(await srv.client.post(path, json={**asked, "n": n}))
                *chunks, last = objs
                assert set(last) == {"error"}, last
                error = last["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert (error["code"], error["type"]) == (424, "InternalServerError")
                assert "scripted failure after 2 tokens" in error["message"]
                assert all("error" not in c and c["choices"] for c in chunks), chunks  # no usage chunk
                assert finish_reasons(chunks) == {None}
                texts = "".join(
                    c["choices"][0].get("text") or c["choices"][0]["delta"].get("content") or ""
                    for c in chunks
                )
                assert texts  # the tokens before the failure were sent

    run(tiny_model, scenario, fail_after=2)


def test_an_aborted_request_has_no_finish_reason_but_an_error(tiny_model: Path) -> None:
    """A request the engine cancels itself (vLLM's ``abort``, TensorRT-LLM's ``cancelled``) has no OpenAI
    finish reason: before any token it is the status (503, retry), streamed or not, in OpenAI's shape;
    LMI's own schema keeps reporting it as it was. (After the first token it is the stream's error
    event: tests/unit/test_formatters.py.)"""

    async def scenario(srv: Served) -> None:
        for body in (CHAT, {**CHAT, "stream": True}):
            resp = await srv.client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 503 and oerr(resp)["type"] == "ServiceUnavailableError"
            assert "aborted" in oerr(resp)["message"]
        lmi = await srv.invoke({"inputs": PROMPT, "parameters": {"details": True}})
        assert lmi.json()["details"]["finish_reason"] == "abort"

    run(tiny_model, scenario, cancel_after=0)


def test_finish_reasons_are_only_openais(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> set[str | None]:
        seen: set[str | None] = set()
        for body in (CHAT, {**CHAT, "stop": ["e", "a", "o"]}, {**CHAT, "max_tokens": 2}):
            seen |= finish_reasons([(await srv.client.post("/v1/chat/completions", json=body)).json()])
            objs = events(await srv.client.post("/v1/chat/completions", json={**body, "stream": True}))
            seen |= finish_reasons(objs)
        return seen

    seen = run(tiny_model, scenario, eos_after=3)
    assert {"stop", "length", None} <= seen <= OPENAI_FINISH


# --------------------------------------------------------------------------- byte-level tokens

EMOJI = "\U0001f600"  # 4 UTF-8 bytes, one byte-level token each on the tiny model's tokenizer
CJK = "\u4e2d"  # 3 UTF-8 bytes


def test_logprobs_name_byte_level_tokens_by_their_bytes(tiny_model: Path) -> None:
    """A reply whose emoji is split over byte-level tokens: each chat log-prob entry carries the
    token's real bytes (together: the reply's bytes), and a token that is no valid UTF-8 on its own
    is named ``bytes:\\xNN``, never "" or U+FFFD; streamed chunks name them the same way."""
    reply = f"{EMOJI} ok"

    async def scenario(srv: Served) -> None:
        srv.engine.reply = reply
        body = {**CHAT, "max_tokens": 20, "logprobs": True, "top_logprobs": 2}
        out = (await srv.client.post("/v1/chat/completions", json=body)).json()
        choice = out["choices"][0]
        assert choice["message"]["content"] == reply
        content = choice["logprobs"]["content"]
        *text_entries, eos = content
        assert eos["token"] == "</s>" and bytes(eos["bytes"]) == b"</s>"
        assert b"".join(bytes(e["bytes"]) for e in text_entries) == reply.encode()
        pieces = [e["token"] for e in text_entries]
        assert pieces[:4] == ["bytes:\\xf0", "bytes:\\x9f", "bytes:\\x98", "bytes:\\x80"]
        assert all("\ufffd" not in e["token"] and e["token"] for e in content)
        for entry in content:
            assert len(entry["top_logprobs"]) == 2
            for alt in entry["top_logprobs"]:
                assert alt["bytes"] == list(alt["token"].encode())  # ASCII alternatives
        streamed = events(await srv.client.post("/v1/chat/completions", json={**body, "stream": True}))
        entries = [e for c in streamed for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
        assert entries == content

    run(tiny_model, scenario)


def test_completions_top_logprobs_keep_every_alternative(tiny_model: Path) -> None:
    """echo with logprobs on a token-id prompt of an emoji and a CJK character: the prompt's tokens are
    named by their bytes, and alternatives that all decode to U+FFFD stay apart in ``top_logprobs``
    (the scripted engine's alternatives at a prompt position are the prompt's tokens up to it)."""

    async def scenario(srv: Served) -> None:
        tok = srv.engine.tokenizer
        ids = tok.encode(EMOJI + CJK, add_special_tokens=False)
        assert len(ids) == 7 and all(tok.decode([i]) == "\ufffd" for i in ids)
        body = {"prompt": ids, "echo": True, "logprobs": 3, "max_tokens": 0}
        out = (await srv.client.post("/v1/completions", json=body)).json()
        choice = out["choices"][0]
        assert choice["text"] == EMOJI + CJK
        lp = choice["logprobs"]
        raw = (EMOJI + CJK).encode()
        assert lp["tokens"] == ["bytes:" + "".join(f"\\x{b:02x}" for b in [byte]) for byte in raw]
        assert lp["text_offset"] == [0, 0, 0, 0, 1, 1, 1]  # each character starts where its last byte lands
        assert lp["top_logprobs"][0] is None
        for i, top in enumerate(lp["top_logprobs"][1:], start=1):
            assert len(top) == min(3, i + 1), top  # distinct tokens, distinct keys
            assert list(top) == [lp["tokens"][j] for j in range(i, max(-1, i - 3), -1)]

    run(tiny_model, scenario)


# --------------------------------------------------------------------------- echo and prompt log-probs


def test_echo_with_max_tokens_0_scores_the_prompt_as_lm_eval_harness_asks(tiny_model: Path) -> None:
    """lm-eval-harness's log-likelihood request: the prompt back with its tokens' log-probs (the first
    one null), no completion tokens, streamed or not; echo with generation appends the reply's."""

    async def scenario(srv: Served) -> None:
        tok = srv.engine.tokenizer
        ids = tok.encode(PROMPT)
        body = {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
        out = (await srv.client.post("/v1/completions", json=body)).json()
        choice = out["choices"][0]
        assert (choice["text"], choice["finish_reason"]) == (PROMPT, "length")
        assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
        lp = choice["logprobs"]
        assert lp["tokens"] == [tok.convert_ids_to_tokens(i).replace("\u0120", " ") for i in ids]
        assert lp["token_logprobs"] == [None] + [LOG_PROB] * (len(ids) - 1)
        assert lp["top_logprobs"][0] is None and all(len(t) == 1 for t in lp["top_logprobs"][1:])
        assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
        assert srv.engine.seen[-1].params.prompt_top_n == 1
        streamed = events(await srv.client.post("/v1/completions", json={**body, "stream": True}))
        assert len(streamed) == 1 and streamed[0]["choices"][0]["text"] == PROMPT
        assert streamed[0]["choices"][0]["logprobs"] == lp
        assert streamed[0]["choices"][0]["finish_reason"] == "length"
        both = (await srv.client.post("/v1/completions", json={**body, "max_tokens": 3})).json()
        lp3 = both["choices"][0]["logprobs"]
        assert lp3["token_logprobs"] == lp["token_logprobs"] + [LOG_PROB] * 3
        assert both["choices"][0]["text"] == PROMPT + srv.engine.text(PROMPT, 3)
        assert lp3["text_offset"][len(ids)] == len(PROMPT)
        plain = await srv.client.post("/v1/completions", json={"prompt": ids, "echo": True, "max_tokens": 0})
        assert plain.json()["choices"][0]["text"] == PROMPT  # token ids echoed as their text
        assert srv.engine.seen[-1].params.prompt_top_n is None  # nothing to score without logprobs
        for bad in ({"prompt": PROMPT, "max_tokens": 0}, {"prompt": PROMPT, "max_tokens": -1, "echo": True}):
            resp = await srv.client.post("/v1/completions", json=bad)
            assert (resp.status_code, oerr(resp)["param"]) == (400, "max_tokens"), resp.text

    run(tiny_model, scenario)
