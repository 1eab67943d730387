"""The HTTP contract in-process: the real ``App`` and default handler over ``httpx.ASGITransport``, on
a scripted engine (:mod:`lmforge.testing.scripted`). No subprocess, no model weights: the answers are
known exactly, so each test states the whole response. What needs real sockets (uvicorn, signals,
disconnects, the real engines) stays in tests/integration."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmforge.config import load_config
from lmforge.errors import ERROR_TABLE
from lmforge.handlers import Handler, create_handler
from lmforge.handlers.default import DefaultHandler
from lmforge.serving.app import App
from lmforge.serving.state import Phase, ServerState
from lmforge.testing.scripted import LOG_PROB, ScriptedEngine

T = TypeVar("T")
PROMPT = "def fibonacci(n):"


class Served:
    """One in-process server: its client, app, state and engine."""

    def __init__(self, client: httpx.AsyncClient, app: App, engine: ScriptedEngine) -> None:
        self.client = client
        self.app = app
        self.state = app.state
        self.engine = engine

    async def invoke(self, body: object, **kwargs: Any) -> httpx.Response:
        return await self.client.post("/invocations", json=body, **kwargs)

    async def raw(self, content: bytes, content_type: str = "application/json") -> httpx.Response:
        return await self.client.post("/invocations", content=content, headers={"Content-Type": content_type})


def model_folder(model_dir: Path, properties: str = "", files: dict[str, str] | None = None) -> Path:
    """A model folder beside ``model_dir``: its files linked, plus ``serving.properties`` and ``files``."""
    key = (properties, tuple(sorted((files or {}).items())))
    folder = model_dir.parent / f"contract-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"
    if not folder.exists():
        folder.mkdir()
        for item in model_dir.iterdir():
            if item.name != "serving.properties":
                (folder / item.name).symlink_to(item)
        (folder / "serving.properties").write_text("option.rolling_batch=lmi-dist\n" + properties)
        for name, text in (files or {}).items():
            (folder / name).write_text(text)
    return folder


@contextlib.asynccontextmanager
async def serve(
    model_dir: Path, properties: str = "", files: dict[str, str] | None = None, **engine_kwargs: Any
) -> AsyncIterator[Served]:
    """The server ``lmforge serve`` builds (config, handler, App with its lifespan), minus uvicorn:
    requests go straight into the ASGI app. The default handler runs on a scripted engine; a folder
    with a ``model.py`` (in ``files``) gets the user's handler, as ``create_handler`` decides."""
    resolved = load_config(model_folder(model_dir, properties, files))
    config = resolved.config
    engine = ScriptedEngine(config, **engine_kwargs)
    handler: Handler = (
        create_handler(resolved) if files and "model.py" in files else DefaultHandler(config, engine)
    )
    state = ServerState.for_config(config)
    app = App(handler, state)
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    lifespan = asyncio.create_task(app({"type": "lifespan"}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    while state.phase == Phase.LOADING:  # the model loads in the background, as in `lmforge serve`
        await asyncio.sleep(0.01)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://lmforge", timeout=30) as client:
            yield Served(client, app, engine)
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await lifespan


def run(
    model_dir: Path,
    scenario: Callable[[Served], Awaitable[T]],
    properties: str = "",
    files: dict[str, str] | None = None,
    **kw: Any,
) -> T:
    async def main() -> T:
        async with serve(model_dir, properties, files, **kw) as srv:
            return await scenario(srv)

    return asyncio.run(main())


def lines(resp: httpx.Response) -> list[dict[str, Any]]:
    assert resp.status_code == 200, resp.text
    return [json.loads(line) for line in resp.text.splitlines() if line]


def oerr(resp: httpx.Response) -> dict[str, Any]:
    """The error of an OpenAI route's answer: ``{"error": {"message", "type", "param", "code"}}``, as
    vLLM's OpenAI server sends it, ``code`` the HTTP status."""
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == resp.status_code and body["error"]["message"], body
    return dict(body["error"])


def sse(resp: httpx.Response) -> list[str]:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = [e for e in resp.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


# --------------------------------------------------------------------------- health and routes


def test_ping_and_routes(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        ping = await srv.client.get("/ping")
        assert (ping.status_code, ping.json()) == (200, {"status": "healthy"})
        assert (await srv.client.head("/ping")).status_code == 200
        for method, path, status in (
            ("GET", "/nope", 404),
            ("GET", "/invocations", 405),
            ("POST", "/ping", 405),
            ("DELETE", "/v1/chat/completions", 405),
            ("GET", "/v1/nope", 404),
        ):
            resp = await srv.client.request(method, path)
            err = oerr(resp) if path.startswith("/v1/") else resp.json()
            assert (resp.status_code, err["code"]) == (status, status), resp.text
            assert err["message"] and "Traceback" not in resp.text

    run(tiny_model, scenario)


def test_a_model_that_fails_to_load_answers_503_with_the_reason(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        assert srv.state.phase == Phase.FAILED
        ping = await srv.client.get("/ping")
        assert ping.status_code == 503 and "weights are missing" in ping.json()["message"]
        resp = await srv.invoke({"inputs": "x"})
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        assert resp.json()["type"] == "not_ready"

    run(tiny_model, scenario, fail_start="weights are missing")


def test_a_dead_engine_turns_ping_503_and_ends_running_streams(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        srv.engine.kill()
        ping = await srv.client.get("/ping")
        assert ping.status_code == 503 and ping.json()["status"] == "unhealthy"
        resp = await srv.invoke({"inputs": "x"})
        assert resp.status_code == 503 and resp.json()["type"] == "engine_dead"

    run(tiny_model, scenario)


# --------------------------------------------------------------------------- LMI / TGI schema


def test_generated_text_and_details_are_the_engines(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        expected = srv.engine.text(PROMPT, 6)
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "details": True}}
        out = (await srv.invoke(body)).json()
        assert out["generated_text"] == expected
        details = out["details"]
        assert details["finish_reason"] == "length"
        assert details["generated_tokens"] == 6
        ids = srv.engine.script(srv.engine.tokenizer.encode(PROMPT), 6)
        assert [t["id"] for t in details["tokens"]] == ids
        assert all(t["log_prob"] == LOG_PROB for t in details["tokens"])
        assert "".join(t["text"] for t in details["tokens"]) == expected
        full = await srv.invoke(
            {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "return_full_text": True}}
        )
        assert full.json()["generated_text"] == PROMPT + expected
        plain = await srv.raw(PROMPT.encode(), "text/plain")
        assert plain.status_code == 200 and isinstance(plain.json()["generated_text"], str)

    run(tiny_model, scenario)


def test_jsonlines_stream_equals_the_whole_answer(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "details": True}}
        whole = (await srv.invoke(body)).json()
        streamed = lines(await srv.invoke({**body, "stream": True}))
        assert len(streamed) == 8
        assert all(line["token"]["log_prob"] == LOG_PROB for line in streamed)
        assert all(line["generated_text"] is None for line in streamed[:-1])
        assert "".join(line["token"]["text"] for line in streamed) == whole["generated_text"]
        assert streamed[-1]["generated_text"] == whole["generated_text"]
        assert streamed[-1]["details"]["finish_reason"] == "length"
        assert streamed[-1]["details"]["generated_tokens"] == 8

    run(tiny_model, scenario)


def test_sse_when_asked_by_accept_header_or_option(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> list[str]:
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4}, "stream": True}
        events = sse(await srv.invoke(body, headers={"Accept": "text/event-stream"}))
        assert len(events) == 4
        assert json.loads(events[-1])["generated_text"] == srv.engine.text(PROMPT, 4)
        return events

    by_header = run(tiny_model, scenario)
    by_option = run(tiny_model, scenario, properties="option.output_formatter=sse\n")
    assert by_header == by_option


def test_stop_sequences_and_eos_end_with_their_reason(tiny_model: Path) -> None:
    async def stop(srv: Served) -> None:
        text = srv.engine.text(PROMPT, 10)
        word = srv.engine.tokenizer.decode(srv.engine.script(srv.engine.tokenizer.encode(PROMPT), 10)[4])
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 10, "stop": [word], "details": True}}
        out = (await srv.invoke(body)).json()
        assert out["details"]["finish_reason"] == "stop_sequence"
        assert out["generated_text"] == text[: text.index(word)]
        streamed = lines(await srv.invoke({**body, "stream": True}))
        assert streamed[-1]["generated_text"] == out["generated_text"]

    async def eos(srv: Served) -> None:
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 10, "details": True}}
        out = (await srv.invoke(body)).json()
        assert out["details"]["finish_reason"] == "eos_token"
        assert out["generated_text"] == srv.engine.text(PROMPT, 3)
        ignore = {"inputs": PROMPT, "parameters": {"max_new_tokens": 10, "ignore_eos_token": True}}
        assert (await srv.invoke(ignore)).json()["generated_text"] == srv.engine.text(PROMPT, 10)

    run(tiny_model, stop)
    run(tiny_model, eos, eos_after=3)


def test_an_engine_error_mid_stream_is_the_last_line_and_a_424_otherwise(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 8}}
        whole = await srv.invoke(body)
        assert whole.status_code == 424, whole.text
        assert "scripted failure after 2 tokens" in whole.json()["message"]
        streamed = lines(await srv.invoke({**body, "stream": True}))
        assert [line["token"]["text"] for line in streamed[:2]] == [
            srv.engine.tokenizer.decode([t])
            for t in srv.engine.script(srv.engine.tokenizer.encode(PROMPT), 2)
        ]
        last = streamed[-1]
        assert last["details"]["finish_reason"] == "error", last
        assert "scripted failure" in json.dumps(last)

    run(tiny_model, scenario, fail_after=2)


def test_request_id_header_reaches_the_engine(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        headers = {"X-Amzn-SageMaker-Inference-Id": "req-42"}
        resp = await srv.invoke({"inputs": "x", "parameters": {"max_new_tokens": 1}}, headers=headers)
        assert resp.status_code == 200
        first = srv.engine.seen[-1].request_id
        assert first.startswith("req-42-")
        await srv.invoke({"inputs": "x", "parameters": {"max_new_tokens": 1}}, headers=headers)
        second = srv.engine.seen[-1].request_id
        assert second.startswith("req-42-") and second != first

    run(tiny_model, scenario)


# --------------------------------------------------------------------------- chat


def test_chat_completion_and_chunks(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        messages = [{"role": "user", "content": "hello"}]
        body = {"messages": messages, "max_tokens": 5}
        out = (await srv.invoke(body)).json()
        tok = srv.engine.tokenizer
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok.encode(rendered, add_special_tokens=False)
        expected = tok.decode(srv.engine.script(ids, 5))
        assert out["object"] == "chat.completion"
        choice = out["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": expected}
        assert choice["finish_reason"] == "length"
        usage = out["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(ids), 5)
        assert usage["total_tokens"] == len(ids) + 5
        events = sse(await srv.invoke({**body, "stream": True}, headers={"Accept": "text/event-stream"}))
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        alias = (await srv.client.post("/v1/chat/completions", json=body)).json()
        assert alias["choices"][0]["message"]["content"] == expected

    run(tiny_model, scenario)


# --------------------------------------------------------------------------- errors


BAD_BODIES = [
    (b'{"inputs": "def ", "parameters": {', "body"),
    (b"[1, 2]", "body"),
    (b'{"parameters": {}}', "inputs"),
    (b'{"inputs": 5}', "inputs"),
    (b'{"inputs": ""}', "inputs"),
    (b'{"inputs": ["a", "b"]}', "inputs"),
    (b'{"inputs": "x", "parameters": {"max_new_tokens": "ten"}}', "parameters.max_new_tokens"),
    (b'{"inputs": "x", "parameters": {"max_new_tokens": 0}}', "parameters.max_new_tokens"),
    (b'{"inputs": "x", "parameters": {"temperature": -1}}', "parameters.temperature"),
    (b'{"inputs": "x", "parameters": {"top_p": 1.5}}', "parameters.top_p"),
    (b'{"inputs": "x", "parameters": {"do_sample": "yes"}}', "parameters.do_sample"),
    (b'{"inputs": "x", "parameters": {"bogus": 1}}', "parameters.bogus"),
    (b'{"inputs": "x", "parameters": {"max_new_tokens": 5000}}', "parameters.max_new_tokens"),
    (b'{"inputs": "x", "stream": "true"}', "stream"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', "messages.0.role"),
    (b'{"messages": []}', "messages"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}', "max_tokens"),
    (
        b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100000}',
        "max_completion_tokens",
    ),
    (b"\xff\xfe", "body"),
]


def test_bad_requests_get_400_naming_the_field(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> list[tuple[int, dict[str, Any]]]:
        return [((r := await srv.raw(body)).status_code, r.json()) for body, _ in BAD_BODIES]

    answers = run(tiny_model, scenario)
    for (body, param), (status, err) in zip(BAD_BODIES, answers, strict=True):
        assert status == 400, (body, err)
        assert (err["code"], err["type"], err["param"]) == (400, "bad_request", param), (body, err)
        assert err["message"]
        if param.endswith("max_new_tokens") or param.startswith("max_"):  # the engine's size check too
            assert param.rpartition(".")[2] in err["message"], err


def test_size_and_media_type_errors(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        big = await srv.raw(b'{"inputs": "' + b"a" * 2048 + b'"}')
        assert (big.status_code, big.json()["type"]) == (413, "payload_too_large")
        assert (await srv.raw(b'{"inputs": "x"}')).status_code == 200

    run(tiny_model, scenario, properties="max_request_size=1024\n")


def test_at_capacity_is_refused_with_retry_after_and_the_queue_drains(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        srv.engine.gate = asyncio.Event()
        body = {"inputs": "x", "parameters": {"max_new_tokens": 2}}
        held = [asyncio.create_task(srv.invoke(body)) for _ in range(2)]
        while srv.state.in_flight < 2:
            await asyncio.sleep(0.01)
        over = await srv.invoke(body)
        assert over.status_code == ERROR_TABLE["overloaded"].status, over.text
        assert over.headers["retry-after"] == "1"
        assert over.json()["type"] == "overloaded"
        srv.engine.gate.set()
        assert [t.status_code for t in await asyncio.gather(*held)] == [200, 200]
        assert srv.state.in_flight == 0
        metrics = (await srv.client.get("/metrics")).text
        assert 'lmforge_responses_total{code="200"} 2' in metrics
        assert f'lmforge_responses_total{{code="{over.status_code}"}} 1' in metrics
        assert "lmforge_engine_requests_total 2" in metrics
        assert "# TYPE lmforge_engine_requests_total counter" in metrics
        assert "lmforge_engine_running 0" in metrics and "lmforge_engine_healthy 1" in metrics
        names = {line.split()[0] for line in metrics.splitlines() if line.startswith("lmforge_engine_")}
        every = ("running", "waiting", "requests_total", "aborted_total", "tokens_total", "healthy")
        assert names == {f"lmforge_engine_{name}" for name in every}

    run(tiny_model, scenario, properties="option.max_rolling_batch_size=1\njob_queue_size=1\n")


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_bodies = st.one_of(
    st.fixed_dictionaries(
        {"inputs": _values},
        optional={
            "parameters": st.dictionaries(
                st.sampled_from(
                    [
                        "max_new_tokens",
                        "temperature",
                        "top_p",
                        "top_k",
                        "do_sample",
                        "stop",
                        "details",
                        "seed",
                    ]
                ),
                _values,
                max_size=4,
            ),
            "stream": _values,
        },
    ),
    st.fixed_dictionaries(
        {
            "messages": st.one_of(
                st.lists(
                    st.fixed_dictionaries({"role": st.sampled_from(["user", "x"]), "content": _values}),
                    max_size=2,
                ),
                _values,
            )
        },
        optional={"max_tokens": _values, "temperature": _values, "stream": _values, "logprobs": _values},
    ),
    _values,
)


def test_generated_bodies_never_get_a_5xx(tiny_model: Path) -> None:
    """Random, mostly malformed bodies through one server: 200, or a 4xx JSON error that says why."""

    async def scenario(srv: Served) -> None:
        loop = asyncio.get_running_loop()
        answers: list[httpx.Response] = []

        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
        @given(body=_bodies)
        def send(body: object) -> None:
            content = json.dumps(body, allow_nan=True).encode()
            future = asyncio.run_coroutine_threadsafe(srv.raw(content), loop)
            answers.append(resp := future.result(30))
            assert resp.status_code < 500, resp.text
            if resp.status_code != 200:
                err = resp.json()
                assert err["code"] == resp.status_code and err["message"], err
                assert "Traceback" not in resp.text

        await asyncio.to_thread(send)
        assert len(answers) >= 400
        assert (await srv.client.get("/ping")).status_code == 200

    run(tiny_model, scenario)


def test_one_error_two_shapes_lmi_on_invocations_openai_on_v1(tiny_model: Path) -> None:
    """The same failure, from the one error table: LMI's body on /invocations, OpenAI's (as vLLM sends
    it) on every /v1 route, with the same status, message and param."""

    async def scenario(srv: Served) -> None:
        bad = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}
        lmi = await srv.client.post("/invocations", json=bad)
        openai = await srv.client.post("/v1/chat/completions", json=bad)
        assert lmi.status_code == openai.status_code == 400
        assert lmi.headers["content-type"].startswith("application/json")
        plain, err = lmi.json(), oerr(openai)
        assert set(plain) == {"code", "type", "message", "param"} and plain["type"] == "bad_request"
        assert (err["type"], err["param"], err["message"]) == (
            "BadRequestError",
            "max_tokens",
            plain["message"],
        )
        broken = await srv.client.post(
            "/v1/completions", content=b"{", headers={"Content-Type": "application/json"}
        )
        assert (oerr(broken)["param"], oerr(broken)["type"]) == ("body", "BadRequestError")
        srv.engine.gate = asyncio.Event()  # at capacity: 503 with Retry-After, in OpenAI's shape
        body = {"prompt": "x", "max_tokens": 2}
        held = [asyncio.create_task(srv.client.post("/v1/completions", json=body)) for _ in range(2)]
        while srv.state.in_flight < 2:
            await asyncio.sleep(0.01)
        over = await srv.client.post("/v1/completions", json=body)
        assert (over.status_code, over.headers["retry-after"]) == (503, "1")
        assert oerr(over)["type"] == "ServiceUnavailableError"
        srv.engine.gate.set()
        await asyncio.gather(*held)
        assert (await srv.client.post("/v1/models")).status_code == 405
        assert oerr(await srv.client.post("/v1/models"))["type"] == "MethodNotAllowedError"

    run(tiny_model, scenario, properties="option.max_rolling_batch_size=1\njob_queue_size=1\n")


# --------------------------------------------------------------------------- user handlers (model.py)

ECHO_HANDLER = """
import json
from djl_python import Input, Output

seen = {}


def handle(inputs: Input) -> Output:
    if inputs.is_empty():  # LMI's initialize call carries the properties
        seen.update(inputs.get_properties())
        return None
    body = inputs.get_as_json()
    if body.get("boom"):
        raise ValueError("the user's handler failed")
    if body.get("wrong"):
        return "not an Output"
    if body.get("refuse"):
        return Output().error("refused by model.py", code=422)
    out = Output().add_as_json({"echo": body["inputs"].upper(), "rolling_batch": seen["rolling_batch"]})
    return out.add_property("X-Handler", "echo")
"""


def test_a_user_model_py_serves_its_own_answers_and_errors(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        ok = await srv.invoke({"inputs": "abc"})
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"echo": "ABC", "rolling_batch": "lmi-dist"}
        assert ok.headers["x-handler"] == "echo"
        refused = await srv.invoke({"inputs": "x", "refuse": True})
        assert refused.status_code == 422
        for body, words in (({"boom": True}, "the user's handler failed"), ({"wrong": True}, "must return")):
            resp = await srv.invoke({"inputs": "x", **body})
            assert resp.status_code == 424, resp.text
            assert words in resp.json()["message"] and "Traceback" not in resp.text
        assert (await srv.client.get("/ping")).status_code == 200
        metrics = (await srv.client.get("/metrics")).text  # the server's own, no engine of ours
        assert "lmforge_responses_total" in metrics and "lmforge_engine_" not in metrics

    run(tiny_model, scenario, files={"model.py": ECHO_HANDLER})


def test_a_user_handler_that_fails_to_initialize_fails_the_load(tiny_model: Path) -> None:
    broken = "def handle(inputs):\n    raise RuntimeError('no GPU here')\n"

    async def scenario(srv: Served) -> None:
        assert srv.state.phase == Phase.FAILED
        ping = await srv.client.get("/ping")
        assert ping.status_code == 503 and "no GPU here" in ping.json()["message"]

    run(tiny_model, scenario, files={"model.py": broken})


# --------------------------------------------------------------------------- OpenAI routes


def _sse_objects(resp: httpx.Response) -> list[dict[str, Any]]:
    events = sse(resp)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_openai_chat_route_streams_sse_whatever_accept_says(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
        for accept in ("application/json", "*/*", "application/jsonlines"):
            resp = await srv.client.post("/v1/chat/completions", json=body, headers={"Accept": accept})
            chunks = _sse_objects(resp)
            assert all(c["object"] == "chat.completion.chunk" for c in chunks)
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            assert all("usage" not in c for c in chunks)
        # /invocations keeps LMI's rules for the same body: jsonlines unless SSE is asked for
        assert lines(await srv.invoke(body))[-1]["choices"][0]["finish_reason"] == "length"
        usage = _sse_objects(
            await srv.client.post(
                "/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}}
            )
        )[-1]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4

    run(tiny_model, scenario)


async def _asgi_messages(srv: Served, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The ASGI messages the app sends for one request (what uvicorn turns into socket writes)."""
    pending = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b""}
    await srv.app(scope, receive, send)
    return sent


def test_a_stream_ends_with_its_last_token_in_one_write(tiny_model: Path) -> None:
    """The last token's frame, OpenAI's usage chunk and ``[DONE]`` and the end of the chunked body go as
    one message, one write on the socket (they were three): a client reading one answer at a time
    has all of it with its last token. Every token before goes out as it comes, one message each."""

    async def scenario(srv: Served) -> None:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
        openai = await _asgi_messages(
            srv, "/v1/chat/completions", {**chat, "stream_options": {"include_usage": True}}
        )
        lmi = await _asgi_messages(
            srv, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 4}, "stream": True}
        )
        for sent, tokens in ((openai, 4), (lmi, 4)):
            assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
            bodies = sent[1:]
            assert len(bodies) == tokens and all(m["type"] == "http.response.body" for m in bodies)
            assert all(m["more_body"] for m in bodies[:-1]) and not bodies[-1]["more_body"]
        events = [e.removeprefix("data: ") for e in openai[-1]["body"].decode().split("\n\n") if e]
        assert events[-1] == "[DONE]" and len(events) == 3
        last, usage = json.loads(events[0]), json.loads(events[1])
        assert last["choices"][0]["finish_reason"] == "length" and usage["usage"]["completion_tokens"] == 4
        final = json.loads(lmi[-1]["body"])  # LMI: the last line, with generated_text
        assert final["generated_text"] == srv.engine.text(PROMPT, 4)

    run(tiny_model, scenario)


def test_openai_completions(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        expected = srv.engine.text(PROMPT, 5)
        body = {"model": srv.engine.model_name, "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
        out = (await srv.client.post("/v1/completions", json=body)).json()
        assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
        assert out["choices"][0]["text"] == expected
        assert out["choices"][0]["finish_reason"] == "length" and out["choices"][0]["logprobs"] is None
        ids = srv.engine.tokenizer.encode(PROMPT)
        assert out["usage"] == {
            "prompt_tokens": len(ids),
            "completion_tokens": 5,
            "total_tokens": len(ids) + 5,
        }
        default = (await srv.client.post("/v1/completions", json={"prompt": PROMPT})).json()
        assert default["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens
        chunks = _sse_objects(await srv.client.post("/v1/completions", json={**body, "stream": True}))
        assert "".join(c["choices"][0]["text"] for c in chunks) == expected
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        # logprobs in the completions shape, echo, token-id prompts, and the same body on /invocations
        lp = (await srv.client.post("/v1/completions", json={**body, "logprobs": 2, "echo": True})).json()
        choice = lp["choices"][0]
        assert choice["text"] == PROMPT + expected
        generated = {k: v[-5:] for k, v in choice["logprobs"].items()}  # after the prompt's tokens
        assert generated["token_logprobs"] == [LOG_PROB] * 5
        assert "".join(generated["tokens"]) == expected
        assert generated["text_offset"][0] == len(PROMPT)
        assert all(len(top) == 2 for top in generated["top_logprobs"])
        by_ids = (await srv.client.post("/v1/completions", json={**body, "prompt": ids})).json()
        assert by_ids["choices"][0]["text"] == expected
        assert (await srv.invoke(body)).json()["choices"][0]["text"] == expected

    run(tiny_model, scenario)


def test_openai_vllm_extras_accepted_or_refused_by_name(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        extras = {
            "ignore_eos": True,
            "top_k": 5,
            "repetition_penalty": 1.0,
            "min_tokens": 0,
            "logprobs": None,
        }
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 6, **extras}
        chat.pop("logprobs")
        out = (await srv.client.post("/v1/chat/completions", json=chat)).json()
        assert out["usage"]["completion_tokens"] == 6  # EOS (after 2) ignored
        comp = {"prompt": PROMPT, "max_tokens": 6, "stream_options": {"include_usage": True}, **extras}
        chunks = _sse_objects(await srv.client.post("/v1/completions", json={**comp, "stream": True}))
        assert chunks[-1]["usage"]["completion_tokens"] == 6
        for field, value in (
            ("min_tokens", 7),  # more than max_tokens
            ("n", 17),  # more choices than one request may ask for
            ("best_of", 3),
            ("suffix", "x"),
            ("stop_token_ids", [-1]),
            ("bogus", 1),
        ):
            resp = await srv.client.post("/v1/completions", json={**comp, "stream": True, field: value})
            assert resp.status_code == 400, (field, resp.text)
            assert oerr(resp)["param"].split(".")[0] == field, resp.json()
        missing = await srv.client.post("/v1/completions", json={"messages": []})
        assert (missing.status_code, oerr(missing)["param"]) == (400, "prompt")
        long = await srv.client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 100_000})
        assert (long.status_code, oerr(long)["param"]) == (400, "max_tokens")

    run(tiny_model, scenario, eos_after=2)


def test_openai_models_lists_the_served_model(tiny_model: Path) -> None:
    async def scenario(srv: Served) -> None:
        models = (await srv.client.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == [srv.engine.model_name]
        assert (await srv.client.post("/v1/models")).status_code == 405

    run(tiny_model, scenario)


def test_openai_edge_cases_real_clients_send(tiny_model: Path) -> None:
    """Found by a review with the official client: ids past the vocabulary, nested token ids, OpenAI's
    nullable fields sent as null, neutral values of features not served, malformed prompts."""

    async def scenario(srv: Served) -> None:
        vocab = len(srv.engine.tokenizer)
        for ids in ([vocab], [1, 2, 999_999]):
            resp = await srv.client.post("/v1/completions", json={"prompt": ids, "max_tokens": 2})
            assert (resp.status_code, oerr(resp)["param"]) == (400, "prompt"), resp.text
            assert str(vocab) in oerr(resp)["message"]
        assert (await srv.client.get("/ping")).status_code == 200
        ids = srv.engine.tokenizer.encode(PROMPT)
        nested = await srv.client.post("/v1/completions", json={"prompt": [ids], "max_tokens": 3})
        assert nested.json()["choices"][0]["text"] == srv.engine.text(PROMPT, 3)
        nulls = {"n": None, "stream": None, "presence_penalty": None, "frequency_penalty": None}
        nulls |= {"ignore_eos": None, "min_tokens": None, "logprobs": None, "top_logprobs": None}
        neutral = {"stop": [], "tools": None, "tool_choice": "none", "response_format": {"type": "text"}}
        neutral |= {"store": False, "metadata": {}, "parallel_tool_calls": False, "min_p": 0, "seed": -1}
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **nulls, **neutral}
        ok = await srv.client.post("/v1/chat/completions", json=chat)
        assert ok.status_code == 200, ok.text
        done = await srv.client.post("/v1/completions", json={"prompt": PROMPT, "echo": None, **neutral})
        assert done.status_code == 200, done.text
        for body, param in (
            ({"prompt": ""}, "prompt"),
            ({"prompt": []}, "prompt"),
            ({"prompt": [-1, 2]}, "prompt"),
            ({"prompt": ["a", ""]}, "prompt.1"),  # lists of prompts name the prompt at fault
            ({"prompt": [[1, 2], []]}, "prompt.1"),
            ({"prompt": [[1, 2], [3, -4]]}, "prompt.1"),
            ({"prompt": [[1], [vocab]]}, "prompt.1"),
            ({"prompt": ["a", 1]}, "prompt"),
            ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
            ({"prompt": "x", "response_format": {"type": "json_objects"}}, "response_format"),
            ({"prompt": "x", "tools": [{"type": "function"}]}, "tools"),  # chat only
            ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias.abc"),
            ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias.5"),
            ({"prompt": "x", "logit_bias": {str(vocab): 1}}, "logit_bias"),  # past the vocabulary
            ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
            ({"prompt": "x", "min_p": 1.5}, "min_p"),
            ({"prompt": "x", "stop_token_ids": [vocab]}, "stop_token_ids"),
        ):
            resp = await srv.client.post("/v1/completions", json=body)
            assert (resp.status_code, oerr(resp)["param"]) == (400, param), (body, resp.text)
        parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
        await srv.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}]})
        prompt = srv.engine.seen[-1].prompt  # ids when the handler tokenized it (no max_tokens given)
        text = srv.engine.tokenizer.decode(prompt) if isinstance(prompt, list) else prompt
        assert "Hello\nworld" in text  # text parts joined as vLLM joins them

    run(tiny_model, scenario)


def test_chat_without_a_length_runs_to_the_models_length(tiny_model: Path) -> None:
    """OpenAI and vLLM: no max_tokens means the rest of the model's length, not LMI's default (30)."""

    async def scenario(srv: Served) -> dict[str, int]:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        out = (await srv.client.post("/v1/chat/completions", json=body)).json()
        assert out["choices"][0]["finish_reason"] == "length"
        return dict(out["usage"])

    usage = run(tiny_model, scenario)
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 512  # the scripted engine's length
    capped = run(tiny_model, scenario, properties="option.max_output_len=40\n")
    assert capped["completion_tokens"] == 40


AUTO_TOOLS = (
    "option.enable_auto_tool_choice=true\noption.tool_call_parser=hermes\noption.reasoning_parser=qwen3\n"
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_auto_tool_calls_and_reasoning_are_read_from_the_reply(tiny_model: Path) -> None:
    """tool_choice auto with option.tool_call_parser=hermes and option.reasoning_parser=qwen3: the
    model's own <think> and <tool_call> text comes back as reasoning_content and tool_calls, whole and
    streamed; a plain answer stays content; without the options, auto is a 400 that says what to set."""
    said = (
        "<think>\nThe user wants the weather.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )

    async def scenario(srv: Served) -> None:
        srv.engine.reply = said
        body = {"messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": [WEATHER_TOOL]}
        whole = (await srv.client.post("/v1/chat/completions", json=body)).json()
        choice = whole["choices"][0]
        assert choice["finish_reason"] == "tool_calls", whole
        message = choice["message"]
        assert message["reasoning_content"] == "The user wants the weather." and message["content"] is None
        (call,) = message["tool_calls"]
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
        chunks = _sse_objects(await srv.client.post("/v1/chat/completions", json={**body, "stream": True}))
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert (
            "".join(d.get("reasoning_content", "") for d in deltas).strip() == "The user wants the weather."
        )
        assert not "".join(d.get("content") or "" for d in deltas).strip()
        streamed = [t for d in deltas for t in d.get("tool_calls", [])]
        assert [(t["index"], t["function"]["name"], t["function"]["arguments"]) for t in streamed] == [
            (0, "get_weather", '{"city": "Rome"}')
        ]
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        srv.engine.reply = "It is sunny in Rome."
        plain = (await srv.client.post("/v1/chat/completions", json=body)).json()["choices"][0]
        assert plain["message"]["content"] == "It is sunny in Rome." and plain["finish_reason"] == "stop"
        assert "tool_calls" not in plain["message"]

    run(tiny_model, scenario, AUTO_TOOLS)

    async def without(srv: Served) -> None:
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL]}
        resp = await srv.client.post("/v1/chat/completions", json=body)
        assert (resp.status_code, oerr(resp)["param"]) == (400, "tool_choice")
        assert "option.enable_auto_tool_choice" in oerr(resp)["message"]

    run(tiny_model, without)


def test_stateful_sessions_open_serve_close_and_expire(tiny_model: Path) -> None:
    """option.enable_stateful_sessions: SageMaker's session requests answered by the server itself,
    session ids checked on model requests; off, a session request is a 400 that says what to set."""
    import re

    body = {"inputs": "a", "parameters": {"max_new_tokens": 2}}

    async def scenario(srv: Served) -> None:
        opened = await srv.client.post("/invocations", json={"requestType": "NEW_SESSION"})
        assert opened.status_code == 200 and opened.text.startswith("Session ")
        value = opened.headers["x-amzn-sagemaker-session-id"]
        assert value == opened.headers["x-amzn-sagemaker-new-session-id"]
        assert re.fullmatch(r"[0-9a-f-]+; Expires=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", value)
        sid = value.split(";")[0]
        header = {"X-Amzn-SageMaker-Session-Id": sid}
        assert (await srv.client.post("/invocations", json=body, headers=header)).status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert (await srv.client.post("/v1/chat/completions", json=chat, headers=header)).status_code == 200
        for bad, param in (
            ({"X-Amzn-SageMaker-Session-Id": "nope"}, "X-Amzn-SageMaker-Session-Id"),
            ({}, "X-Amzn-SageMaker-Session-Id"),  # CLOSE without the id
        ):
            resp = await srv.client.post("/invocations", json={"requestType": "CLOSE"}, headers=bad)
            assert (resp.status_code, resp.json()["param"]) == (400, param), resp.text
        wrong = await srv.client.post("/invocations", json={"requestType": "OPEN"})
        assert (wrong.status_code, wrong.json()["param"]) == (400, "requestType")
        closed = await srv.client.post("/invocations", json={"requestType": "CLOSE"}, headers=header)
        assert closed.status_code == 200 and closed.headers["x-amzn-sagemaker-closed-session-id"] == sid
        after = await srv.client.post("/invocations", json=body, headers=header)
        assert (after.status_code, after.json()["param"]) == (400, "X-Amzn-SageMaker-Session-Id")
        assert "NEW_SESSION" in after.json()["message"]
        # a short-lived session expires
        srv.state.sessions.expiration_s = 1  # type: ignore[union-attr]
        brief = (await srv.client.post("/invocations", json={"requestType": "NEW_SESSION"})).headers
        late = {"X-Amzn-SageMaker-Session-Id": brief["x-amzn-sagemaker-session-id"].split(";")[0]}
        deadline = time.monotonic() + 30  # a hang guard: the session lasts a second
        while (expired := await srv.client.post("/invocations", json=body, headers=late)).status_code == 200:
            assert time.monotonic() < deadline, "a one-second session is still open"
            await asyncio.sleep(0.1)
        assert expired.status_code == 400 and "NEW_SESSION" in expired.json()["message"], expired.text

    run(tiny_model, scenario, "option.enable_stateful_sessions=true\n")

    async def off(srv: Served) -> None:
        resp = await srv.client.post("/invocations", json={"requestType": "NEW_SESSION"})
        assert (resp.status_code, resp.json()["param"]) == (400, "requestType")
        assert "option.enable_stateful_sessions" in resp.json()["message"]
        # without sessions the header means nothing, and a prompt may mention requestType
        fine = {"inputs": '{"requestType": "NEW_SESSION"}', "parameters": {"max_new_tokens": 2}}
        ok = await srv.client.post("/invocations", json=fine, headers={"X-Amzn-SageMaker-Session-Id": "x"})
        assert ok.status_code == 200

    run(tiny_model, off)


def test_sagemaker_custom_attributes_and_inference_id_come_back(tiny_model: Path) -> None:
    """SageMaker hands the container's X-Amzn-SageMaker-Custom-Attributes back to the client: the
    server echoes the request's (and its inference id), streamed or not; a query parameter of the
    same name is not a header."""
    sent = {"X-Amzn-SageMaker-Custom-Attributes": "trace=abc", "X-Amzn-SageMaker-Inference-Id": "req-42"}
    body = {"inputs": "a", "parameters": {"max_new_tokens": 2}}

    async def scenario(srv: Served) -> None:
        for stream in (False, True):
            resp = await srv.client.post("/invocations", json={**body, "stream": stream}, headers=sent)
            assert resp.status_code == 200
            assert resp.headers["x-amzn-sagemaker-custom-attributes"] == "trace=abc"
            assert resp.headers["x-amzn-sagemaker-inference-id"] == "req-42"
        plain = await srv.client.post(
            "/invocations", json=body, params={"x-amzn-sagemaker-custom-attributes": "from-query"}
        )
        assert "x-amzn-sagemaker-custom-attributes" not in plain.headers
        assert srv.engine.seen[-1].request_id != srv.engine.seen[-2].request_id
        assert srv.engine.seen[-2].request_id.startswith("req-42-")  # the engine's id carries it

    run(tiny_model, scenario)


def test_query_parameters_are_not_headers(tiny_model: Path) -> None:
    """Headers and query parameters are separate namespaces: ``?content-type=`` or ``?accept=`` never
    change how the body is parsed or answered; a model.py finds the query in ``get_query`` and in its
    content (as DJL Serving puts it), the headers in its properties."""
    body = {"inputs": "a", "parameters": {"max_new_tokens": 2}}

    async def scenario(srv: Served) -> None:
        resp = await srv.client.post(
            "/invocations",
            json=body,
            params={"content-type": "text/plain", "accept": "text/event-stream", "stream": "true"},
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("application/json")
        assert "generated_text" in resp.json()

    run(tiny_model, scenario)

    user = """
from djl_python import Input, Output

def handle(inputs: Input):
    if inputs.is_empty():
        return None
    return Output().add_as_json({
        "query": inputs.get_query("color"),
        "content": inputs.get_as_string("color"),
        "header": inputs.get_property("color"),
        "data": inputs.get_as_json(),
        "content_type": inputs.get_property("content-type"),
    })
"""

    async def custom(srv: Served) -> None:
        resp = await srv.client.post(
            "/invocations?color=red&data=x&content-type=text/plain", json={"a": 1}, headers={"color": "blue"}
        )
        assert resp.status_code == 200, resp.text
        assert resp.json() == {
            "query": "red",
            "content": "red",
            "header": "blue",
            "data": {"a": 1},
            "content_type": "application/json",
        }

    run(tiny_model, custom, files={"model.py": user})
