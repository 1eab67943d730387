"""Multi-LoRA on LMI-Dist through the real server: per-request adapters equal PEFT, the adapters API
in LMI's and SageMaker's forms, and hostile sources refused."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from lmforge.testing.lora import PeftReference, make_adapter
from lmforge.testing.server import RemoteServer, http_client, metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("tiny-server")]

PROMPTS = ["def hello(x):", "import os\n", "class Foo:", "for i in range("]
NEW = 12


@pytest.fixture(scope="module")
def lora_model(
    tiny_model: Path, lora_adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny model with a1 and a2 baked into adapters/, and an extra root holding a3 and bad ones."""
    root = tmp_path_factory.mktemp("lora")
    model = root / "model"
    shutil.copytree(tiny_model, model)
    for name in ("a1", "a2"):
        shutil.copytree(lora_adapters[name], model / "adapters" / name)
    extra = root / "extra"
    shutil.copytree(lora_adapters["a3"], extra / "a3")
    # hostile or broken adapters under the allowed root
    pickled = extra / "pickled"
    shutil.copytree(lora_adapters["a1"], pickled)
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    big = extra / "big-rank"
    make_adapter(tiny_model, big, seed=9, rank=32, targets=("q_proj",))
    wrong = extra / "wrong-shape"
    shutil.copytree(lora_adapters["a1"], wrong)
    cfg = json.loads((wrong / "adapter_config.json").read_text())
    cfg["target_modules"] = ["qkv_proj"]
    (wrong / "adapter_config.json").write_text(json.dumps(cfg))
    for name, change in (
        ("nan-alpha", {"lora_alpha": float("nan")}),
        ("layer-subset", {"layers_to_transform": [0]}),
        ("regex", {"target_modules": r".*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"}),
    ):
        shutil.copytree(lora_adapters["a1"], extra / name)
        data = {**json.loads((extra / name / "adapter_config.json").read_text()), **change}
        (extra / name / "adapter_config.json").write_text(json.dumps(data))
    from safetensors.torch import load_file, save_file

    shutil.copytree(lora_adapters["a1"], extra / "nan-weights")
    tensors = load_file(str(extra / "nan-weights" / "adapter_model.safetensors"))
    first = sorted(tensors)[0]
    tensors[first] = tensors[first].clone().fill_(float("nan"))
    save_file(tensors, str(extra / "nan-weights" / "adapter_model.safetensors"))
    (extra / "escape").symlink_to(lora_adapters["a1"], target_is_directory=True)  # a link leaving the root
    outside = root / "extra2"  # a sibling whose name starts like the root
    shutil.copytree(lora_adapters["a1"], outside / "a1")
    (model / "serving.properties").write_text(
        "engine=Python\noption.rolling_batch=lmi-dist\noption.enable_lora=true\noption.max_loras=2\n"
        f"option.max_lora_rank=16\noption.adapter_roots={extra}\noption.max_rolling_batch_size=16\n"
    )
    return model


@pytest.fixture(scope="module")
def server(lora_model: Path) -> Iterator[RemoteServer]:
    with RemoteServer(lora_model) as srv:
        yield srv


@pytest.fixture(scope="module")
def peft(tiny_model: Path, lora_adapters: dict[str, Path]) -> PeftReference:
    return PeftReference(tiny_model, lora_adapters)


def generate(srv: RemoteServer, prompt: str, how: str, name: str | None, stream: bool = False) -> list[int]:
    body: dict[str, object] = {
        "inputs": prompt,
        "parameters": {"max_new_tokens": NEW, "ignore_eos_token": True, "details": True},
        "stream": stream,
    }
    headers, params = {}, {}
    if name is not None:
        if how == "body":
            body["adapters"] = name
        elif how == "header":
            headers["X-Amzn-SageMaker-Adapter-Identifier"] = name
        elif how == "alias":
            headers["X-Amzn-SageMaker-Adapter-Alias"] = name
        else:
            params["adapter"] = name
    resp = http_client().post(
        srv.url + "/invocations", json=body, headers=headers, params=params, timeout=120
    )
    assert resp.status_code == 200, resp.text
    if stream:
        lines = [json.loads(line) for line in resp.text.splitlines() if line]
        return [line["token"]["id"] for line in lines]
    return [t["id"] for t in resp.json()["details"]["tokens"]]


def test_mixed_batch_equals_peft_per_adapter(server: RemoteServer, peft: PeftReference) -> None:
    resp = http_client().post(
        server.url + "/adapters", params={"name": "a3", "src": str(server.model_dir.parent / "extra" / "a3")}
    )
    assert resp.status_code == 200, resp.text
    jobs = [
        (prompt, how, name)
        for prompt in PROMPTS
        for how, name in (("body", None), ("body", "a1"), ("header", "a2"), ("query", "a3"), ("body", "a2"))
    ]
    # three adapters with max_loras=2: requests wait for a slot, one batch still mixes base + adapters
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: generate(server, *job), jobs))
    for (prompt, _how, name), out in zip(jobs, outs, strict=True):
        assert out == peft.greedy(prompt, NEW, name), (prompt, name)
    stats = metrics(server.url)
    assert stats["lmforge_engine_lora_resident"] <= 2
    assert stats["lmforge_engine_running"] == 0
    # streamed tokens equal the non-streamed ones for an adapter
    assert generate(server, PROMPTS[0], "body", "a1", stream=True) == peft.greedy(PROMPTS[0], NEW, "a1")
    assert http_client().delete(server.url + "/adapters/a3").status_code == 200


def test_register_list_describe_update_remove(server: RemoteServer, peft: PeftReference) -> None:
    src = str(server.model_dir.parent / "extra" / "a3")
    url = server.url + "/models/model/adapters"
    resp = http_client().post(url, params={"name": "tmp", "src": src, "preload": "true"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["adapter"]["rank"] == 16
    again = http_client().post(server.url + "/adapters", json={"name": "tmp", "src": src})
    assert again.status_code == 409 and "already registered" in again.json()["message"]
    names = [a["name"] for a in http_client().get(url).json()["adapters"]]
    assert names == ["a1", "a2", "tmp"]
    page = http_client().get(url, params={"limit": 2}).json()
    assert [a["name"] for a in page["adapters"]] == ["a1", "a2"] and page["nextPageToken"] == "2"
    desc = http_client().get(url + "/tmp").json()
    assert desc["src"] == src and desc["target_modules"] == ["down_proj", "gate_proj", "up_proj"]
    assert generate(server, PROMPTS[1], "body", "tmp") == peft.greedy(PROMPTS[1], NEW, "a3")
    # update: same name, another source (a2's files), effective for the next request
    a2 = str(server.model_dir / "adapters" / "a2")
    upd = http_client().post(
        url + "/tmp/update",
        params={"src": a2, "pin": "true"},
        headers={"X-Amzn-SageMaker-Adapter-Alias": "al"},
    )
    assert upd.status_code == 200, upd.text
    assert upd.json()["adapter"]["pin"] is True and upd.json()["adapter"]["alias"] == "al"
    assert generate(server, PROMPTS[1], "header", "tmp") == peft.greedy(PROMPTS[1], NEW, "a2")
    # SageMaker's alias names the adapter too (when no identifier comes with it); an alias nothing
    # carries is a name, and an unknown one is a 404 naming it
    assert generate(server, PROMPTS[1], "alias", "al") == peft.greedy(PROMPTS[1], NEW, "a2")
    assert generate(server, PROMPTS[1], "alias", "a1") == peft.greedy(PROMPTS[1], NEW, "a1")
    nope = http_client().post(
        server.url + "/invocations",
        json={"inputs": "x"},
        headers={"X-Amzn-SageMaker-Adapter-Alias": "nope"},
        timeout=30,
    )
    assert nope.status_code == 404 and "'nope'" in nope.json()["message"]
    assert http_client().delete(server.url + "/adapters/tmp").status_code == 200
    gone = http_client().post(
        server.url + "/invocations", json={"inputs": "x", "adapters": "tmp"}, timeout=30
    )
    assert gone.status_code == 404 and "'tmp'" in gone.json()["message"]
    assert gone.json()["param"] == "adapters"
    assert http_client().delete(server.url + "/adapters/tmp").status_code == 404
    assert http_client().get(server.url + "/models/other/adapters").status_code == 404


@pytest.mark.parametrize(
    ("src", "needle"),
    [
        ("../../etc", "'..'"),
        ("/etc", "outside the allowed"),
        ("{extra}/../model", "'..'"),
        ("{extra}2/a1", "outside the allowed"),
        ("{extra}/escape", "outside"),
        ("http://169.254.169.254/latest/meta-data", "not allowed"),
        ("file:///etc/passwd", "not allowed"),
        ("s3://bucket/adapters/a1", "not under an allowed S3 prefix"),
        ("{extra}/pickled", "adapter_model.bin is not allowed"),
        ("{extra}/big-rank", "max_lora_rank=16"),
        ("{extra}/wrong-shape", "qkv_proj"),
        ("{extra}/missing", "is not a folder"),
        ("{extra}/nan-alpha", "lora_alpha"),
        ("{extra}/nan-weights", "NaN or infinite"),
        ("{extra}/layer-subset", "layers_to_transform"),
    ],
)
def test_bad_sources_are_refused(server: RemoteServer, src: str, needle: str) -> None:
    extra = server.model_dir.parent / "extra"
    resp = http_client().post(server.url + "/adapters", json={"name": "bad", "src": src.format(extra=extra)})
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert needle in body["message"], body
    assert body["param"] == "src"
    assert "bad" not in [a["name"] for a in http_client().get(server.url + "/adapters").json()["adapters"]]


def test_regex_target_modules_and_chat_model_names(server: RemoteServer, peft: PeftReference) -> None:
    src = str(server.model_dir.parent / "extra" / "regex")
    assert http_client().post(server.url + "/adapters", json={"name": "rx", "src": src}).status_code == 200
    models = http_client().get(server.url + "/v1/models").json()["data"]
    assert models[0]["id"] == "model" and "parent" not in models[0]
    assert {m["id"]: m["parent"] for m in models[1:]} == dict.fromkeys(("a1", "a2", "rx"), "model")
    assert generate(server, PROMPTS[2], "body", "rx") == peft.greedy(PROMPTS[2], NEW, "a1")
    assert http_client().delete(server.url + "/adapters/rx").status_code == 200
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for model, status in (("model", 200), ("a1", 200), ("rx", 404), ("nope", 404)):
        resp = http_client().post(
            server.url + "/v1/chat/completions", json={**chat, "model": model}, timeout=60
        )
        assert resp.status_code == status, (model, resp.text)
        if status == 404:  # vLLM's answer, in OpenAI's error shape
            error = resp.json()["error"]
            assert (error["param"], error["type"]) == ("model", "NotFoundError"), error
            assert f"The model `{model}` does not exist" in error["message"] and "a1" in error["message"]
        else:
            assert resp.json()["model"] == model  # the answer names what served it
    # pinning every slot would leave requests for other adapters waiting forever
    assert (
        http_client().put(server.url + "/adapters/a1", json={"pin": True}).status_code == 200
    )  # 1 of 2 slots
    pin = http_client().put(server.url + "/adapters/a2", json={"pin": True})
    assert pin.status_code == 400 and "one must stay free" in pin.json()["message"], pin.text
    assert http_client().put(server.url + "/adapters/a1", json={"pin": False}).status_code == 200


def test_bad_requests_name_the_field(server: RemoteServer) -> None:
    post = httpx.post
    assert post(server.url + "/adapters", json={"src": "x"}).json()["param"] == "name"
    assert post(server.url + "/adapters", json={"name": "../a", "src": "x"}).json()["param"] == "name"
    assert (
        post(server.url + "/adapters", json={"name": "a", "src": "x", "color": 1}).json()["param"] == "color"
    )
    assert (
        post(server.url + "/adapters", content=b"{", headers={"content-type": "application/json"}).status_code
        == 400
    )
    unknown = post(server.url + "/invocations", json={"inputs": "x", "adapters": "nope"})
    assert unknown.status_code == 404 and "'nope'" in unknown.json()["message"]
    both = post(
        server.url + "/invocations",
        json={"inputs": "x", "adapters": "a1"},
        headers={"X-Amzn-SageMaker-Adapter-Identifier": "a2"},
    )
    assert both.status_code == 400 and both.json()["param"] == "adapters"
    assert http_client().patch(server.url + "/adapters/a1").status_code == 405


def test_lora_disabled_says_how_to_enable(tiny_server: RemoteServer) -> None:
    """The plain tiny-model server (no option.enable_lora)."""
    resp = http_client().post(tiny_server.url + "/adapters", json={"name": "a", "src": "/x"})
    assert resp.status_code == 400 and "option.enable_lora" in resp.json()["message"]
    resp = http_client().post(tiny_server.url + "/invocations", json={"inputs": "x", "adapters": "a"})
    assert resp.status_code == 400 and "enable_lora" in resp.json()["message"]
    assert resp.json()["param"] == "adapters"


def test_adapter_folder_with_a_bad_adapter_fails_start(lora_model: Path, tmp_path: Path) -> None:
    model = tmp_path / "m"
    shutil.copytree(lora_model, model, symlinks=True)
    (model / "adapters" / "a2" / "adapter_model.bin").write_bytes(b"x")
    srv = RemoteServer(model, wait_ready=False).start()
    assert srv.proc is not None
    try:
        assert srv.proc.wait(120) == 1
    finally:
        srv.stop()
    logs = srv.logs()
    assert "model failed to load" in logs and "adapters/a2" in logs and "adapter_model.bin" in logs, logs
    assert "engine core" not in logs, "the folder's adapters are checked before the model loads"


def test_the_same_answer_alone_or_in_a_crowd_of_adapters(server: RemoteServer, peft: PeftReference) -> None:
    """:mod:`tests.same_answer` with two adapters and the base model mixed in one crowd: prompt
    log-probs (scored with the request's adapter), generated tokens, alternatives, seeds, penalties
    and structured output are each request's own, alone or in a mixed batch."""
    from tests.same_answer import same_with_adapters_in_a_crowd

    same_with_adapters_in_a_crowd(server.url, PROMPTS, peft)
