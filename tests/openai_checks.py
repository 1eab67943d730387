"""The official ``openai`` client's view of a server, checked the same way on every engine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from lmforge.testing.server import VLLM_ENV

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

    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=4, extra_body={"min_tokens": 2})
    assert "min_tokens" in str(caught.value)
    # a token id past the vocabulary is the client's error, and the engine keeps serving everyone
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=[1, 10**7], max_tokens=2)
    assert "out of range" in str(caught.value)
    again = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    assert again.choices[0].text == choice.text


def run_vllm_bench_serve(url: str, model: str, tokenizer: Path, backend: str, endpoint: str) -> None:
    """``vllm bench serve --backend BACKEND --ignore-eos``: vLLM's load generator sends vLLM's extras
    (ignore_eos, stream_options) and reads SSE as from vLLM's own server; every request must succeed."""
    pytest.importorskip("vllm.benchmarks.serve")
    args = [
        *("--backend", backend, "--base-url", url, "--endpoint", endpoint),
        *("--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random"),
        *("--random-input-len", "32", "--random-output-len", "16", "--num-prompts", "24", "--ignore-eos"),
    ]
    script = Path(__file__).parent / "integration" / "vllm_bench_serve.py"
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **VLLM_ENV},
    )
    out = proc.stdout + proc.stderr
    assert re.search(r"Successful requests:\s+24\b", out), out[-3000:]
    assert re.search(r"Failed requests:\s+0\b", out), out[-3000:]
