"""The servers ``lmforge bench`` can load, each behind one small interface.

* ``lmforge``: ``POST {url}/invocations`` with an LMI body, streamed as jsonlines (one line per token).
* ``lmforge-sse``: the same request with ``Accept: text/event-stream`` (SSE ``data:`` events).
* ``openai``: ``POST {url}/v1/completions`` with ``stream``, ``stream_options.include_usage`` and
  ``ignore_eos`` (vLLM's OpenAI server and other OpenAI-compatible peers).
* ``openai-chat``: ``POST {url}/v1/chat/completions``, the prompt as one user message, the same options
  (the prompt length then includes the chat template's tokens, as the server's usage reports).
* ``sagemaker``: ``invoke_endpoint_with_response_stream`` on an endpoint (AWS, or the local
  SageMaker when boto3 is pointed at it), read with :func:`lmforge.client.invoke_stream`.

Every request asks for exactly ``output_len`` tokens past EOS (``ignore_eos``), as vLLM's benchmark
does, so all servers do the same work.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from lmforge.bench.http import HttpClient, HttpError
from lmforge.bench.metrics import RequestResult
from lmforge.bench.prompts import Prompt

APIS = ("lmforge", "lmforge-sse", "openai", "openai-chat", "sagemaker")
HTTP_APIS = APIS[:4]
OPENAI_PATHS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}


class Target(Protocol):
    api: str
    where: str

    async def send(self, prompt: Prompt, output_len: int) -> RequestResult: ...

    async def aclose(self) -> None: ...


def lmi_body(prompt: Prompt, output_len: int) -> dict[str, Any]:
    return {
        "inputs": prompt.text,
        "parameters": {"max_new_tokens": output_len, "ignore_eos_token": True},
        "stream": True,
    }


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


class _LmiReader:
    """Folds LMI stream objects (jsonlines lines or SSE events) into a :class:`RequestResult`."""

    def __init__(self, result: RequestResult) -> None:
        self.result = result
        self.last = result.start
        self.parts: list[str] = []

    def feed(self, obj: dict[str, Any], now: float) -> bool:
        """Take one object; False once the stream reported an error."""
        result = self.result
        token = obj.get("token")
        if token is not None:
            self.last = result.chunk(now, self.last)
            result.output_tokens += 1
            self.parts.append(str(token.get("text") or ""))
        details = obj.get("details")
        if isinstance(details, dict) and isinstance(details.get("prompt_tokens"), int):
            result.prompt_len = details["prompt_tokens"]
        if obj.get("error") is not None:
            result.fail(f"error line after {result.output_tokens} tokens: {_error_text(obj['error'])}")
            return False
        return True

    def finish(self) -> RequestResult:
        result = self.result
        result.text = "".join(self.parts)
        if result.error:
            return result
        if result.chunks == 0:
            return result.fail("the stream ended without a token")
        result.success = True
        return result


class _OpenAIReader:
    """Folds OpenAI completion or chat chunks into a :class:`RequestResult` (tokens from ``usage``)."""

    def __init__(self, result: RequestResult, count_tokens: Callable[[str], int] | None) -> None:
        self.result = result
        self.last = result.start
        self.parts: list[str] = []
        self.count_tokens = count_tokens
        self.usage_tokens: int | None = None

    def feed(self, obj: dict[str, Any], now: float) -> bool:
        result = self.result
        if obj.get("error") is not None:
            result.fail(f"error chunk after {result.chunks} chunks: {_error_text(obj['error'])}")
            return False
        choices = obj.get("choices")
        if choices:
            self.last = result.chunk(now, self.last)
            choice = choices[0]
            delta = choice.get("delta")  # chat chunks carry their text in delta.content
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            self.parts.append(str(text or ""))
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                result.prompt_len = usage["prompt_tokens"]
        return True

    def finish(self) -> RequestResult:
        result = self.result
        result.text = "".join(self.parts)
        if result.error:
            return result
        if result.chunks == 0:
            return result.fail("the stream ended without a completion chunk")
        if self.usage_tokens is not None:
            result.output_tokens = self.usage_tokens
        elif self.count_tokens is not None:
            result.output_tokens = self.count_tokens(result.text)
        else:  # no usage and no tokenizer: one token per chunk
            result.output_tokens = result.chunks
        result.success = True
        return result


def _message(line: bytes) -> dict[str, Any] | None:
    """The JSON object of one jsonlines line or SSE line; None for SSE framing, comments, [DONE]."""
    if line.startswith(b"data:"):
        line = line[5:].strip()
        if line == b"[DONE]":
            return None
    elif line.startswith((b":", b"event:", b"id:", b"retry:")):
        return None
    obj = json.loads(line)
    return obj if isinstance(obj, dict) else None


class HttpTarget:
    """An HTTP server: lmforge (jsonlines or SSE) or an OpenAI-compatible peer."""

    def __init__(
        self,
        url: str,
        api: str,
        *,
        model: str | None = None,
        timeout: float = 600.0,
        count_tokens: Callable[[str], int] | None = None,
    ) -> None:
        if api not in HTTP_APIS:
            raise ValueError(f"api must be one of {', '.join(HTTP_APIS)}, got {api!r}")
        self.api = api
        self.client = HttpClient(url)
        self.model = model
        self.timeout = timeout
        self.count_tokens = count_tokens
        self.path = OPENAI_PATHS.get(api, "/invocations")
        self.where = url.rstrip("/") + self.path
        self.headers = {"Content-Type": "application/json"}
        if api == "lmforge-sse":
            self.headers["Accept"] = "text/event-stream"

    def body(self, prompt: Prompt, output_len: int) -> dict[str, Any]:
        if self.api not in OPENAI_PATHS:
            return lmi_body(prompt, output_len)
        body: dict[str, Any] = (
            {"prompt": prompt.text, "max_tokens": output_len}
            if self.api == "openai"
            else {"messages": [{"role": "user", "content": prompt.text}], "max_completion_tokens": output_len}
        )
        body |= {
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.model:
            body["model"] = self.model
        return body

    async def send(self, prompt: Prompt, output_len: int) -> RequestResult:
        content = json.dumps(self.body(prompt, output_len)).encode()
        result = RequestResult(prompt_len=prompt.prompt_len)
        result.start = time.perf_counter()
        reader = _OpenAIReader(result, self.count_tokens) if self.api in OPENAI_PATHS else _LmiReader(result)
        try:
            async with asyncio.timeout(self.timeout):
                await self._read(content, result, reader)
        except TimeoutError:
            return result.fail(f"no complete answer within {self.timeout:g} s")
        except asyncio.IncompleteReadError:
            return result.fail(
                f"the server closed the connection mid-answer, after {result.chunks} streamed chunks"
            )
        except (HttpError, OSError, ValueError) as exc:
            return result.fail(f"{type(exc).__name__}: {exc}")
        return result if result.error else reader.finish()

    async def _read(self, content: bytes, result: RequestResult, reader: _LmiReader | _OpenAIReader) -> None:
        async with self.client.post(self.path, content, self.headers) as resp:
            if resp.status != 200:
                body = (await resp.read()).decode("utf-8", "replace").strip()
                result.fail(f"HTTP {resp.status}: {body[:300]}")
                return
            pending = b""
            async for data in resp.chunks():
                now = time.perf_counter()
                pending += data
                if b"\n" not in data:
                    continue
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    obj = _message(line.strip()) if line.strip() else None
                    if obj is not None and not reader.feed(obj, now):
                        return
            if pending.strip():
                obj = _message(pending.strip())
                if obj is not None:
                    reader.feed(obj, time.perf_counter())

    async def aclose(self) -> None:
        await self.client.aclose()


class SageMakerTarget:
    """A SageMaker endpoint through ``invoke_endpoint_with_response_stream`` (boto3, in threads)."""

    api = "sagemaker"

    def __init__(
        self,
        endpoint_name: str,
        *,
        region: str | None = None,
        inference_component: str | None = None,
        sse: bool = False,
        workers: int = 64,
        timeout: float = 600.0,
        client: Any = None,
    ) -> None:
        self.endpoint_name = endpoint_name
        self.inference_component = inference_component
        self.accept = "text/event-stream" if sse else None
        self.where = f"SageMaker endpoint {endpoint_name}"
        if inference_component:
            self.where += f" (inference component {inference_component})"
        self.client = client if client is not None else self._client(region, workers, timeout)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="bench-sagemaker")

    @staticmethod
    def _client(region: str | None, workers: int, timeout: float) -> Any:
        import boto3
        from botocore.config import Config

        # no retries: a retried request would be timed as one slow request
        config = Config(
            read_timeout=timeout,
            connect_timeout=30,
            max_pool_connections=max(10, workers),
            retries={"max_attempts": 1, "mode": "standard"},
        )
        return boto3.client("sagemaker-runtime", region_name=region, config=config)

    async def send(self, prompt: Prompt, output_len: int) -> RequestResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self._send, prompt, output_len)

    def _send(self, prompt: Prompt, output_len: int) -> RequestResult:
        from botocore.exceptions import BotoCoreError, ClientError

        from lmforge.client import invoke_stream

        result = RequestResult(prompt_len=prompt.prompt_len)
        reader = _LmiReader(result)
        result.start = time.perf_counter()
        try:
            for obj in invoke_stream(
                self.endpoint_name,
                lmi_body(prompt, output_len),
                client=self.client,
                accept=self.accept,
                inference_component=self.inference_component,
            ):
                if not reader.feed(obj, time.perf_counter()):
                    break
        except (BotoCoreError, ClientError, OSError, ValueError) as exc:
            return result.fail(f"{type(exc).__name__}: {exc}")
        return reader.finish()

    async def aclose(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
