"""Server lifecycle and limits: each test that stops, breaks or configures a server its own way gets its
own server process; the tests of a server's limits share one whose start they observe."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmforge.testing.server import TEST_ENV, RemoteServer, http_client
from tests.conftest import Reference

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("lifecycle")]


@dataclass
class Limited:
    """One server for the tests of a server's limits (started here, so that its start is observed):
    one batch slot, a job queue of one, and a model whose generation_config lists a second EOS id
    that greedy decoding of ``"def "`` reaches (``ids``, the greedy tokens without EOS, and
    ``stop_id``)."""

    srv: RemoteServer
    ids: list[int]
    stop_id: int
    pings: list[int] = field(default_factory=list)
    """/ping statuses seen from the first answer until 200."""
    refused: list[httpx.Response] = field(default_factory=list)
    """/invocations answers other than 200 while the model was loading."""


@pytest.fixture(scope="module")
def limited(
    tiny_model: Path, reference: Reference, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Limited]:
    ids, _ = reference.greedy("def ", 12, eos=False)
    stop_id = ids[5]
    model = with_properties(
        tiny_model, tmp_path_factory.mktemp("limited") / "m", **{"option.max_rolling_batch_size": "1"}
    )
    gen = json.loads((model / "generation_config.json").read_text())
    base = gen["eos_token_id"]
    gen["eos_token_id"] = [base, stop_id] if isinstance(base, int) else [*base, stop_id]
    (model / "generation_config.json").write_text(json.dumps(gen))
    srv = RemoteServer(model, env={"SERVING_JOB_QUEUE_SIZE": "1"}, wait_ready=False).start()
    try:
        state = Limited(srv, ids, stop_id)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                status = http_client().get(srv.url + "/ping", timeout=2).status_code
            except httpx.HTTPError:
                time.sleep(0.02)
                continue
            state.pings.append(status)
            if status == 200:
                break
            resp = http_client().post(srv.url + "/invocations", json={"inputs": "x"}, timeout=30)
            if resp.status_code != 200:  # (unless loading just finished)
                state.refused.append(resp)
            time.sleep(0.05)
        srv.wait_for_ping(200, 30)  # (its log in the error, if it never got there)
        yield state
    finally:
        srv.stop()


def test_ping_is_not_200_before_the_model_is_loaded(limited: Limited) -> None:
    assert limited.pings[-1] == 200
    assert set(limited.pings) == {503, 200}, "the port answers before the model is loaded, with 503"
    # while loading, invocations are refused with 503 too, saying so
    assert limited.refused
    for resp in limited.refused:
        assert resp.status_code == 503
        assert resp.json()["type"] == "not_ready"
        assert "Retry-After" in resp.headers


def test_model_that_fails_to_load_exits_nonzero(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "serving.properties").write_text("option.rolling_batch=lmi-dist\n")
    (bad / "config.json").write_text('{"model_type": "llama"}')  # no weights, no tokenizer
    with RemoteServer(bad, wait_ready=False) as srv:
        assert srv.proc is not None
        code = srv.proc.wait(120)
        assert code != 0
        assert "model failed to load" in srv.logs()


def test_invalid_serving_properties_is_a_clear_error(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "serving.properties").write_text("engine=Python\noption.max_rolling_batch_size = lots\n")
    proc = subprocess.run(
        [sys.executable, "-m", "lmforge", "serve", str(d), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**TEST_ENV, "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert "serving.properties:2" in proc.stderr
    assert "option.max_rolling_batch_size" in proc.stderr
    assert "lots" in proc.stderr


def with_properties(src: Path, dst: Path, **props: str) -> Path:
    """A copy of a model folder with some serving.properties keys replaced (the file beats OPTION_* env)."""
    shutil.copytree(src, dst)
    lines = [
        ln for ln in (dst / "serving.properties").read_text().splitlines() if ln.split("=")[0] not in props
    ]
    lines += [f"{k}={v}" for k, v in props.items()]
    (dst / "serving.properties").write_text("\n".join(lines) + "\n")
    return dst


def test_queue_full_gets_503_with_retry_after(limited: Limited) -> None:
    srv = limited.srv
    body = {"inputs": "def ", "parameters": {"max_new_tokens": 900, "ignore_eos_token": True}}

    def one(_: int) -> httpx.Response:
        return http_client().post(srv.url + "/invocations", json=body, timeout=120)

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(one, range(6)))
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) >= 2, codes  # the running one and the queued one finish
    rejected = [r for r in responses if r.status_code == 503]
    assert rejected, codes
    for r in rejected:
        assert r.headers["Retry-After"] == "1"
        assert r.json()["type"] == "overloaded"
    for r in responses:
        if r.status_code == 200:
            assert len(r.json()["generated_text"]) > 0


def test_eos_finish_reason(limited: Limited) -> None:
    """A model whose generation_config lists a second EOS id that greedy decoding reaches."""
    first = limited.ids.index(limited.stop_id)

    def details(**parameters: object) -> dict[str, Any]:
        body = {"inputs": "def ", "parameters": {"max_new_tokens": 12, "details": True, **parameters}}
        resp = http_client().post(limited.srv.url + "/invocations", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        return dict(resp.json()["details"])

    out = details()
    assert out["finish_reason"] == "eos_token"
    assert [t["id"] for t in out["tokens"]] == limited.ids[: first + 1]
    ignored = details(ignore_eos_token=True)
    assert ignored["finish_reason"] == "length"
    assert ignored["generated_tokens"] == 12


MODEL_PY = """
from djl_python import Input, Output

state = {}


def handle(inputs: Input):
    if inputs.is_empty():
        state["props"] = inputs.get_properties()
        return None
    data = inputs.get_as_json()
    if data.get("fail"):
        raise ValueError("the model refused: " + data["fail"])
    out = Output()
    out.add_as_json({"echo": data["inputs"][::-1], "max_size": state["props"]["max_rolling_batch_size"]})
    return out
"""


def test_custom_model_py_written_for_lmi(tmp_path: Path) -> None:
    d = tmp_path / "custom"
    d.mkdir()
    (d / "serving.properties").write_text("engine=Python\noption.max_rolling_batch_size=7\n")
    (d / "model.py").write_text(MODEL_PY)
    with RemoteServer(d) as srv:
        resp = http_client().post(srv.url + "/invocations", json={"inputs": "abc"})
        assert resp.status_code == 200
        assert resp.json() == {"echo": "cba", "max_size": "7"}
        resp = http_client().post(srv.url + "/invocations", json={"inputs": "abc", "fail": "no"})
        assert resp.status_code == 424
        assert "the model refused: no" in resp.json()["message"]
        assert "Traceback" not in resp.text
