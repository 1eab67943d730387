"""The official ``openai`` Python client against ``lmforge serve`` on LMI-Dist (the tiny model), over
real sockets: chat and completions, streamed and not, logprobs, usage, the model list and errors.
tests/integration/test_vllm.py runs the same client against the vLLM engine."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from lmforge.testing.server import RemoteServer
from tests.conftest import Reference
from tests.openai_checks import (
    PROMPT,
    check_openai_client,
    check_structured_output,
    check_vllm_bench_serve,
    run_vllm_bench_serve,
)
from tests.shared_vllm import needs_vllm

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tiny_server: RemoteServer) -> RemoteServer:
    return tiny_server


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_official_openai_client(client: openai.OpenAI, server: RemoteServer, reference: Reference) -> None:
    ids, _ = reference.greedy(PROMPT, 6, eos=False)
    check_openai_client(client, "tiny", reference.decode(ids))


def test_structured_output_and_forced_tool_calls(client: openai.OpenAI) -> None:
    check_structured_output(client, "tiny")


BENCH_RUNS = [("openai-chat", "/v1/chat/completions"), ("openai", "/v1/completions")]


@pytest.fixture(scope="module")
def vllm_bench_outputs(server: RemoteServer, tiny_model: Path) -> dict[str, str]:
    """Both ``vllm bench serve`` runs, in one process."""
    outputs = run_vllm_bench_serve(server.url, "tiny", tiny_model, BENCH_RUNS)
    return {backend: out for (backend, _), out in zip(BENCH_RUNS, outputs, strict=True)}


@pytest.mark.vllm
@needs_vllm
@pytest.mark.parametrize("backend", [backend for backend, _ in BENCH_RUNS])
def test_vllm_bench_serve_completes_with_no_failures(
    vllm_bench_outputs: dict[str, str], backend: str
) -> None:
    """``vllm bench serve --backend openai-chat|openai --ignore-eos``: vLLM's tool sends vLLM's extras
    (ignore_eos, stream_options) and reads SSE as it reads vLLM's own server."""
    check_vllm_bench_serve(vllm_bench_outputs[backend])
