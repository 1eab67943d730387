"""The real server process with the tiny model, over real sockets: what needs the real engine, uvicorn
or signals. The request and response schemas and the error table are tested in-process
(tests/unit/test_http_contract.py)."""

from __future__ import annotations

import json
import math
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from lmforge.testing.server import RemoteServer, http_client, metrics, stream_lines
from tests.conftest import Reference
from tests.interleaving import crowd, findings

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("tiny-server")]

PROMPTS = ["def ", "import os\n", "class Foo(object):\n    ", "for i in range("]


@pytest.fixture(scope="module")
def server(tiny_server: RemoteServer) -> RemoteServer:
    return tiny_server


def invoke(srv: RemoteServer, body: object, **kwargs: object) -> httpx.Response:
    return http_client().post(srv.url + "/invocations", json=body, timeout=120, **kwargs)  # type: ignore[arg-type]


def test_ping_healthy(server: RemoteServer) -> None:
    resp = http_client().get(server.url + "/ping")
    assert resp.status_code == 200
    assert resp.json()["status"] == "healthy"


def test_greedy_equals_transformers_generate(server: RemoteServer, reference: Reference) -> None:
    for prompt in PROMPTS:
        ids, scores = reference.greedy(prompt, 24)
        resp = invoke(server, {"inputs": prompt, "parameters": {"max_new_tokens": 24, "details": True}})
        assert resp.status_code == 200, resp.text
        out = resp.json()
        tokens = out["details"]["tokens"]
        assert [t["id"] for t in tokens] == ids
        assert out["generated_text"] == reference.decode(ids)
        assert out["generated_text"] == "".join(t["text"] for t in tokens)
        for tok, ref in zip(tokens, scores, strict=True):
            assert math.isfinite(tok["log_prob"]) and tok["log_prob"] <= 0
            assert tok["log_prob"] == pytest.approx(ref, abs=1e-4)
        details = out["details"]
        assert details["generated_tokens"] == len(ids)
        assert details["inputs"] == prompt
        assert details["finish_reason"] in ("length", "eos_token")


def _http_chunks(srv: RemoteServer, body: dict[str, object]) -> list[bytes]:
    """A streamed answer's body as the HTTP chunks the server framed it in (h11 reads the framing)."""
    import h11

    payload = json.dumps(body).encode()
    conn = h11.Connection(h11.CLIENT)
    head = [
        ("Host", "127.0.0.1"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(payload))),
    ]
    chunks: list[bytes] = []
    current = b""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=120) as sock:
        request = h11.Request(method="POST", target="/invocations", headers=head)
        for message in (request, h11.Data(data=payload), h11.EndOfMessage()):
            sock.sendall(conn.send(message) or b"")
        while not isinstance(event := conn.next_event(), h11.EndOfMessage):
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                assert event.status_code == 200, event
            elif isinstance(event, h11.Data):
                current += event.data
                if event.chunk_end:
                    chunks.append(current)
                    current = b""
    return chunks


def test_stream_tokens_arrive_one_by_one(server: RemoteServer, reference: Reference) -> None:
    """Each token leaves in an HTTP chunk of its own: judged by the framing on the wire (an answer held
    to its end goes out as one chunk), not by arrival times; that each goes out as its token comes is
    tests/unit/test_http_contract.py's (one ASGI message a token)."""
    body = {
        "inputs": "def ",
        "parameters": {"max_new_tokens": 200, "details": True, "ignore_eos_token": True},
        "stream": True,
    }
    chunks = _http_chunks(server, body)
    assert len(chunks) == 200 and all(c.count(b"\n") == 1 and c.endswith(b"\n") for c in chunks), chunks[:3]
    parsed = [json.loads(chunk) for chunk in chunks]
    for item in parsed[:-1]:
        assert set(item) >= {"token", "generated_text", "details"}
        assert item["generated_text"] is None and item["details"] is None
        assert set(item["token"]) >= {"id", "text", "log_prob"}
    last = parsed[-1]
    assert last["details"]["finish_reason"] == "length"
    assert last["details"]["generated_tokens"] == 200
    assert last["generated_text"] == "".join(p["token"]["text"] for p in parsed)
    ids, _ = reference.greedy("def ", 200, eos=False)
    assert [p["token"]["id"] for p in parsed] == ids


def test_a_crowd_larger_than_the_batch_is_found_queued(server: RemoteServer) -> None:
    """The interleaving check of tests/interleaving.py on a serialisation that is real: 64 streams to
    a server whose batch holds 32 (the tiny model's serving.properties). The second half waits for
    slots, so streams begin after others have ended; the check says so (on the 64-slot servers of
    test_load.py and test_vllm.py it must find nothing)."""
    found = findings(crowd(server.url, streams=64, tokens=16))
    assert any("began after" in f for f in found), found


def test_stream_matches_non_stream(server: RemoteServer) -> None:
    params = {"max_new_tokens": 40, "details": True}
    whole = invoke(server, {"inputs": "import os\n", "parameters": params}).json()
    lines = [
        json.loads(line)
        for _, line in stream_lines(
            server.url + "/invocations", {"inputs": "import os\n", "parameters": params, "stream": True}
        )
    ]
    assert lines[-1]["generated_text"] == whole["generated_text"]
    assert [p["token"]["id"] for p in lines] == [t["id"] for t in whole["details"]["tokens"]]


def test_sse_when_asked(server: RemoteServer) -> None:
    body = {"inputs": "def ", "parameters": {"max_new_tokens": 8}, "stream": True}
    with http_client().stream(
        "POST", server.url + "/invocations", json=body, headers={"Accept": "text/event-stream"}
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert len(events) == 8
    assert all(e.startswith("data: ") for e in events)
    assert json.loads(events[-1][6:])["details"] is None  # details not asked


def test_finish_reason_length_and_stop_sequence(server: RemoteServer, reference: Reference) -> None:
    ids, _ = reference.greedy("def ", 30, eos=False)
    text = reference.decode(ids)
    out = invoke(server, {"inputs": "def ", "parameters": {"max_new_tokens": 5, "details": True}}).json()
    assert out["details"]["finish_reason"] == "length"
    assert out["details"]["generated_tokens"] == 5
    stop = text[12:15]
    assert stop.strip(), "choose a visible stop string"
    cut = text[: text.index(stop)]
    out = invoke(
        server,
        {"inputs": "def ", "parameters": {"max_new_tokens": 30, "details": True, "stop_sequences": [stop]}},
    ).json()
    assert out["details"]["finish_reason"] == "stop_sequence"
    assert out["generated_text"] == cut
    # Streaming holds back a partial match, so the streamed text never contains the stop string.
    lines = [
        json.loads(line)
        for _, line in stream_lines(
            server.url + "/invocations",
            {"inputs": "def ", "parameters": {"max_new_tokens": 30, "stop": stop}, "stream": True},
        )
    ]
    assert "".join(p["token"]["text"] for p in lines if p["token"]) == cut
    assert lines[-1]["generated_text"] == cut


def test_return_full_text(server: RemoteServer) -> None:
    out = invoke(
        server, {"inputs": "def ", "parameters": {"max_new_tokens": 4, "return_full_text": True}}
    ).json()
    plain = invoke(server, {"inputs": "def ", "parameters": {"max_new_tokens": 4}}).json()
    assert out["generated_text"] == "def " + plain["generated_text"]


def test_seeded_sampling_is_reproducible(server: RemoteServer) -> None:
    params = {
        "max_new_tokens": 16,
        "do_sample": True,
        "temperature": 0.9,
        "top_k": 40,
        "top_p": 0.95,
        "seed": 11,
    }
    a = invoke(server, {"inputs": "def ", "parameters": params}).json()["generated_text"]
    b = invoke(server, {"inputs": "def ", "parameters": params}).json()["generated_text"]
    c = invoke(server, {"inputs": "def ", "parameters": {**params, "seed": 12}}).json()["generated_text"]
    assert a == b
    assert a != c


def test_32_concurrent_streams(server: RemoteServer, reference: Reference) -> None:
    expected = {p: reference.decode(reference.greedy(p, 32)[0]) for p in PROMPTS}

    def one(i: int) -> tuple[str, str]:
        prompt = PROMPTS[i % len(PROMPTS)]
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 32}, "stream": True}
        lines = [json.loads(line) for _, line in stream_lines(server.url + "/invocations", body)]
        assert lines[-1]["generated_text"] == "".join(p["token"]["text"] for p in lines)
        return prompt, lines[-1]["generated_text"]

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    assert len(results) == 32
    for prompt, text in results:
        assert text == expected[prompt]


def test_disconnect_aborts_engine_request(server: RemoteServer) -> None:
    before = metrics(server.url)
    body = json.dumps(
        {"inputs": "def ", "parameters": {"max_new_tokens": 900, "ignore_eos_token": True}, "stream": True}
    ).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    received = b""
    while received.count(b"\n{") < 3:
        received += sock.recv(65536)
    assert received.startswith(b"HTTP/1.1 200")
    sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = metrics(server.url)
        if now["lmforge_engine_running"] == 0 and now["lmforge_engine_aborted_total"] > before.get(
            "lmforge_engine_aborted_total", 0
        ):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"engine request was not aborted: {now}")
    assert now["lmforge_engine_tokens_total"] - before["lmforge_engine_tokens_total"] < 900


def test_chat_messages(server: RemoteServer) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "temperature": 0}
    out = invoke(server, body).json()
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    assert out["usage"]["completion_tokens"] <= 12
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    # Streaming chunks reassemble to the same content; SSE ends with [DONE].
    with http_client().stream(
        "POST",
        server.url + "/invocations",
        json={**body, "stream": True},
        headers={"Accept": "text/event-stream"},
    ) as resp:
        raw = resp.read().decode()
    events = [e[6:] for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert (
        "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == choice["message"]["content"]
    )
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    # OpenAI path alias
    alias = http_client().post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert alias["choices"][0]["message"]["content"] == choice["message"]["content"]


def test_body_too_large_is_413(server: RemoteServer) -> None:
    big = b'{"inputs": "' + b"a" * (7 * 2**20) + b'"}'
    resp = http_client().post(
        server.url + "/invocations", content=big, headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 413
    assert resp.json()["type"] == "payload_too_large"


def test_ctrl_c_to_the_process_group_drains_and_exits_zero(tiny_model: Path) -> None:
    """SIGINT to the server's whole process group, engine core included (Ctrl-C in a terminal; systemd
    and ``timeout`` do the same with SIGTERM): the server drains, the core keeps generating until the
    server tells it to stop, and everything exits cleanly. (SIGTERM to the server alone, SageMaker's
    way: test_load.py under load, tests/image inside the image.)"""
    srv = RemoteServer(tiny_model, own_group=True).start()
    body = {"inputs": "def ", "parameters": {"max_new_tokens": 300, "ignore_eos_token": True}, "stream": True}
    got: list[bytes] = []

    def reader() -> None:
        for _, line in stream_lines(srv.url + "/invocations", body):
            got.append(line)

    t = threading.Thread(target=reader)
    t.start()
    deadline = time.monotonic() + 60  # a hang guard: the signal comes once the stream has begun
    while not got:
        assert time.monotonic() < deadline and t.is_alive(), "the stream did not begin"
        time.sleep(0.01)
    code = srv.stop(signal.SIGINT, group=True)
    t.join(30)
    assert code == 0, srv.logs()
    assert len(got) == 300
    assert json.loads(got[-1])["details"] is None
    logs = srv.logs()
    assert "Traceback" not in logs and "KeyboardInterrupt" not in logs, logs
    assert "killed" not in logs and "engine core failed" not in logs, logs  # stopped by the server


# ---------------------------------------------------------------- bidirectional streaming (WebSocket)

BIDI = "/invocations-bidirectional-stream"


def _ws_url(srv: RemoteServer, path: str = BIDI) -> str:
    return srv.url.replace("http://", "ws://") + path


def _answer(ws: object) -> list[str]:
    """The messages of one request's answer, up to its [DONE]."""
    frames = []
    while (frame := ws.recv(timeout=120)) != "[DONE]":  # type: ignore[attr-defined]
        frames.append(frame)
    return frames


def test_bidirectional_stream_with_a_websocket_client(server: RemoteServer) -> None:
    """SageMaker's WebSocket route, driven by the `websockets` client library: accepted (within the
    client's open_timeout, a hang guard), pings answered, LMI and chat requests answered with the
    same objects the jsonlines stream carries and [DONE], bad requests answered with the HTTP error
    body while the socket stays open."""
    from websockets.sync.client import connect

    for _ in range(3):
        with connect(_ws_url(server), open_timeout=30) as ws:
            assert ws.protocol.state.name == "OPEN"

    lmi = {"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 12, "details": True, "do_sample": False}}
    expected = invoke(server, lmi).json()["generated_text"]
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}
    chat_text = invoke(server, chat).json()["choices"][0]["message"]["content"]
    with connect(_ws_url(server), open_timeout=5) as ws:
        ws.ping().wait(5)  # the socket answers pings (SageMaker pings every 60 s)
        # two requests sent back to back are answered in order
        ws.send(json.dumps(lmi))
        ws.send(json.dumps(chat).encode())  # a binary message is a request too
        objs = [json.loads(f) for f in _answer(ws)]
        assert len(objs) == 12 and all("token" in o for o in objs)
        assert "".join(o["token"]["text"] for o in objs) == expected
        assert objs[-1]["details"]["finish_reason"] == "length"
        chunks = [json.loads(f) for f in _answer(ws)]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == chat_text

        for bad, param in (
            ("{not json", "body"),
            (json.dumps({"inputs": "x", "parameters": {"top_p": 7}}), "top_p"),
        ):
            ws.send(bad)
            (error,) = (json.loads(f) for f in _answer(ws))
            assert error["code"] == 400 and param in (error.get("param") or error["message"]), error
        ws.send(json.dumps(lmi))  # still open and serving
        assert "".join(json.loads(f)["token"]["text"] for f in _answer(ws)) == expected


def test_bidirectional_stream_close_aborts_and_other_paths_are_refused(server: RemoteServer) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    before = metrics(server.url)
    with connect(_ws_url(server), open_timeout=5) as ws:
        ws.send(json.dumps({"inputs": "a", "parameters": {"max_new_tokens": 1000, "ignore_eos_token": True}}))
        ws.recv(timeout=60)  # generating
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = metrics(server.url)
        if now["lmforge_engine_running"] == 0 and now["lmforge_in_flight_requests"] == 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"closing the socket did not abort the request: {now}")
    assert now["lmforge_engine_tokens_total"] - before["lmforge_engine_tokens_total"] < 900
    with pytest.raises(InvalidStatus) as refused:
        connect(_ws_url(server, "/invocations"), open_timeout=5)
    assert refused.value.response.status_code == 403
