"""Batched completions prompts and vLLM's peer routes (``/health``, ``/version``, ``/tokenize``,
``/detokenize``, ``/tokenizer_info``) in-process: the real App and default handler on the scripted
engine (tests/unit/test_http_contract.py's harness), whose answers are a function of each prompt."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import lmforge
from lmforge.handlers.openai_api import MAX_BATCH_CHOICES
from lmforge.testing.scripted import LOG_PROB, MAX_MODEL_LEN
from tests.unit.test_http_contract import ECHO_HANDLER, PROMPT, Served, oerr, run
from tests.unit.test_openai_contract import events

PROMPTS = [PROMPT, "class Node:", "import os"]
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


async def complete(srv: Served, **body: Any) -> dict[str, Any]:
    resp = await srv.client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


# --------------------------------------------------------------------------- batched prompts


def test_a_list_of_prompts_answers_each_as_if_sent_alone_in_vllms_order(tiny_model: Path) -> None:
    """prompt p's choice i is choice p * n + i; each equals the same prompt sent alone (text, finish,
    log-probs); usage counts each prompt once and every choice's tokens, streamed or not."""

    async def scenario(srv: Served) -> None:
        tok = srv.engine.tokenizer
        body = {"max_tokens": 4, "temperature": 0, "logprobs": 1, "n": 2}
        alone = [await complete(srv, prompt=p, **body) for p in PROMPTS]
        for prompt in (PROMPTS, [tok.encode(p) for p in PROMPTS]):  # texts, and lists of token ids
            out = await complete(srv, prompt=prompt, **body)
            assert [c["index"] for c in out["choices"]] == list(range(6))
            for k, choice in enumerate(out["choices"]):
                single = alone[k // 2]["choices"][k % 2]
                assert {**choice, "index": 0} == {**single, "index": 0}, k
            prompt_tokens = sum(len(tok.encode(p)) for p in PROMPTS)
            assert out["usage"] == {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 6 * 4,
                "total_tokens": prompt_tokens + 24,
            }
            assert len({c["text"] for c in out["choices"]}) == 3  # greedy: both choices of a prompt agree
            options = {"stream": True, "stream_options": {"include_usage": True}}
            chunks = events(
                await srv.client.post("/v1/completions", json={**body, "prompt": prompt, **options})
            )
            *parts, usage = chunks
            assert usage["choices"] == [] and usage["usage"] == out["usage"]
            assert len({c["id"] for c in chunks}) == 1
            texts = dict.fromkeys(range(6), "")
            for c in parts:
                (choice,) = c["choices"]
                texts[choice["index"]] += choice["text"]
            assert texts == {c["index"]: c["text"] for c in out["choices"]}
        one = await complete(srv, prompt=[PROMPT], max_tokens=4, temperature=0)  # a list of one
        assert one["choices"][0]["text"] == alone[0]["choices"][0]["text"]

    run(tiny_model, scenario)


def test_a_batch_runs_every_choice_at_once_and_seeds_as_alone(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        srv.engine.gate = asyncio.Event()
        body = {"prompt": PROMPTS, "n": 2, "max_tokens": 3, "temperature": 0.7, "seed": 11}
        pending = asyncio.create_task(srv.client.post("/v1/completions", json=body))
        while srv.engine.stats().running < 6:  # every choice in the engine before any token
            await asyncio.sleep(0.01)
        srv.engine.gate.set()
        assert (await pending).status_code == 200
        seen = srv.engine.seen[-6:]
        assert [r.params.seed for r in seen] == [11, 12] * 3  # choice i of each prompt: seed + i
        assert len({r.request_id for r in seen}) == 6
        ids = [srv.engine.tokenizer.encode(p) for p in PROMPTS for _ in range(2)]
        assert [r.prompt for r in seen] == ids

    run(tiny_model, scenario)


def test_lm_eval_harness_batched_loglikelihood(tiny_model: Path) -> None:
    """lm-eval-harness's ``local-completions`` with ``batch_size`` > 1: a list of prompts, ``echo``,
    ``logprobs: 1``, ``max_tokens: 0``: each choice is its prompt scored, as the prompt alone is."""

    async def scenario(srv: Served) -> None:
        body = {"max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
        out = await complete(srv, prompt=PROMPTS, **body)
        for i, (prompt, choice) in enumerate(zip(PROMPTS, out["choices"], strict=True)):
            alone = (await complete(srv, prompt=prompt, **body))["choices"][0]
            assert choice == {**alone, "index": i}
            assert choice["text"] == prompt and choice["finish_reason"] == "length"
            lp = choice["logprobs"]["token_logprobs"]
            assert lp[0] is None and lp[1:] == [LOG_PROB] * (len(lp) - 1)
        assert out["usage"]["completion_tokens"] == 0
        ids = [srv.engine.tokenizer.encode(p) for p in PROMPTS]
        echoed = await complete(srv, prompt=ids, echo=True, max_tokens=1, temperature=0)
        assert [c["text"][: len(p)] for c, p in zip(echoed["choices"], PROMPTS, strict=True)] == PROMPTS

    run(tiny_model, scenario)


def test_batched_prompts_are_checked_like_one_and_named_by_place(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        too_long = "x " * (MAX_MODEL_LEN + 10)
        many = ["a"] * (MAX_BATCH_CHOICES + 1)
        for body, param in (
            ({"prompt": [PROMPT, PROMPT, too_long]}, "prompt.2"),  # the engine's size check
            ({"prompt": [PROMPT, PROMPT, too_long], "stream": True}, "prompt.2"),
            ({"prompt": [PROMPT, ""]}, "prompt.1"),
            ({"prompt": []}, "prompt"),
            ({"prompt": many}, "prompt"),
            ({"prompt": ["a"] * 20, "n": 16}, "prompt"),
            ({"prompt": PROMPTS, "max_tokens": 0}, "max_tokens"),
        ):
            resp = await srv.client.post("/v1/completions", json=body)
            err = oerr(resp)
            assert (resp.status_code, err["param"]) == (400, param), (body, resp.text)
            assert param in err["message"]
        assert (
            await srv.client.post("/v1/completions", json={"prompt": many[:-1], "max_tokens": 1})
        ).status_code == 200

    run(tiny_model, scenario)


# --------------------------------------------------------------------------- health and version


def test_health_is_vllms_and_version_is_lmforges(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        health = await srv.client.get("/health")
        assert (health.status_code, health.content) == (200, b"")
        version = await srv.client.get("/version")
        assert (version.status_code, version.json()) == (200, {"version": lmforge.__version__})
        wrong = await srv.client.post("/health")
        assert (wrong.status_code, oerr(wrong)["type"]) == (405, "MethodNotAllowedError")
        srv.engine.kill()
        dead = await srv.client.get("/health")
        assert (dead.status_code, dead.content) == (503, b"")

    run(tiny_model, scenario)


def test_health_is_503_until_the_model_serves(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        assert (await srv.client.get("/health")).status_code == 503
        assert (await srv.client.get("/version")).status_code == 200
        for method, path in (("POST", "/tokenize"), ("GET", "/tokenizer_info")):
            resp = await srv.client.request(method, path, json={"prompt": "x"})
            assert (resp.status_code, oerr(resp)["type"]) == (503, "ServiceUnavailableError")

    run(tiny_model, scenario, fail_start="weights are missing")


# --------------------------------------------------------------------------- tokenizer routes


def test_tokenize_is_what_a_request_counts_and_detokenize_inverts_it(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        tok = srv.engine.tokenizer
        out = (await srv.client.post("/tokenize", json={"prompt": PROMPT})).json()
        ids = tok.encode(PROMPT)
        assert out == {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids, "token_strs": None}
        completion = await complete(srv, prompt=PROMPT, max_tokens=1)
        assert completion["usage"]["prompt_tokens"] == out["count"]
        bare = (
            await srv.client.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": False})
        ).json()
        assert bare["tokens"] == ids[1:] and ids[0] == tok.bos_token_id
        strs = await srv.client.post("/tokenize", json={"prompt": PROMPT, "return_token_strs": True})
        assert strs.json()["token_strs"] == tok.convert_ids_to_tokens(ids)
        back = await srv.client.post("/detokenize", json={"tokens": bare["tokens"]})
        assert back.json() == {"prompt": PROMPT}
        with_bos = await srv.client.post("/detokenize", json={"tokens": out["tokens"], "model": "model"})
        assert with_bos.json() == {"prompt": tok.bos_token + PROMPT}  # special tokens kept, as vLLM
        assert (await srv.client.post("/detokenize", json={"tokens": []})).json() == {"prompt": ""}

        for extra in ({}, {"max_tokens": 3}):  # rendered and counted as chat completions do
            chat = await srv.client.post("/v1/chat/completions", json={"messages": CHAT, **extra})
            counted = (await srv.client.post("/tokenize", json={"messages": CHAT})).json()
            assert counted["count"] == chat.json()["usage"]["prompt_tokens"]
        rendered = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
        assert counted["tokens"] == tok.encode(rendered, add_special_tokens=False)
        plain = (
            await srv.client.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False})
        ).json()
        assert plain["count"] < counted["count"] and counted["tokens"][: plain["count"]] == plain["tokens"]
        prefill = [*CHAT, {"role": "assistant", "content": "Sure"}]
        cont = (
            await srv.client.post("/tokenize", json={"messages": prefill, "continue_final_message": True})
        ).json()
        text = (await srv.client.post("/detokenize", json={"tokens": cont["tokens"]})).json()["prompt"]
        assert text.endswith("Sure"), text  # the last turn left open
        variables = {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}}
        assert (await srv.client.post("/tokenize", json=variables)).json() == counted

    run(tiny_model, scenario)


def test_tokenizer_routes_refuse_bad_input_by_field(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        vocab = len(srv.engine.tokenizer)
        for path, body, status, param in (
            ("/tokenize", {}, 400, "prompt"),
            ("/tokenize", {"prompt": "x", "messages": CHAT}, 400, "messages"),
            ("/tokenize", {"prompt": 3}, 400, "prompt"),
            ("/tokenize", {"prompt": "x", "bogus": 1}, 400, "bogus"),
            ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
            ("/tokenize", {"messages": CHAT, "chat_template": "{{ 1 }}"}, 400, "chat_template"),
            (
                "/tokenize",
                {"messages": CHAT, "add_generation_prompt": True, "continue_final_message": True},
                400,
                "continue_final_message",
            ),
            (
                "/tokenize",
                {"messages": CHAT, "chat_template_kwargs": {"tokenize": True}},
                400,
                "chat_template_kwargs.tokenize",
            ),
            ("/tokenize", {"prompt": "x", "model": "gpt-4o"}, 404, "model"),
            ("/detokenize", {}, 400, "tokens"),
            ("/detokenize", {"tokens": [1, vocab]}, 400, "tokens"),
            ("/detokenize", {"tokens": [1, -2]}, 400, "tokens.1"),
            ("/detokenize", {"tokens": "12"}, 400, "tokens"),
            ("/detokenize", {"tokens": [1], "model": "gpt-4o"}, 404, "model"),
        ):
            resp = await srv.client.post(path, json=body)
            err = oerr(resp)
            assert (resp.status_code, err["param"]) == (status, param), (path, body, resp.text)
            assert "Traceback" not in resp.text
        unknown = await srv.client.post("/v1/completions", json={"prompt": "x", "model": "gpt-4o"})
        same = await srv.client.post("/tokenize", json={"prompt": "x", "model": "gpt-4o"})
        assert oerr(same) == oerr(unknown)  # the same 404 as /v1/completions
        raw = await srv.client.post(
            "/tokenize", content=b"{nope", headers={"Content-Type": "application/json"}
        )
        assert (raw.status_code, oerr(raw)["param"]) == (400, "body")
        assert (await srv.client.get("/tokenize")).status_code == 405
        assert (await srv.client.post("/tokenizer_info")).status_code == 405

    run(tiny_model, scenario)


def test_tokenizer_info_is_the_tokenizers_config(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        tok = srv.engine.tokenizer
        info = (await srv.client.get("/tokenizer_info")).json()
        assert info["eos_token"] == tok.eos_token == "</s>" and info["bos_token"] == "<s>"
        assert info["tokenizer_class"] == type(tok).__name__
        assert info["chat_template"] == tok.chat_template
        assert "vocab_file" not in info and "merges_file" not in info

    run(tiny_model, scenario)


def test_a_user_handler_has_health_and_version_but_no_tokenizer(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        assert (await srv.client.get("/health")).status_code == 200
        assert (await srv.client.get("/version")).status_code == 200
        resp = await srv.client.post("/tokenize", json={"prompt": "x"})
        assert (resp.status_code, oerr(resp)["type"]) == (404, "NotFoundError")

    run(tiny_model, scenario, files={"model.py": ECHO_HANDLER})
