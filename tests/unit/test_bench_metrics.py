"""lmforge.bench: metrics on hand-made timings (vLLM's definitions), prompts, arrivals, CLI arguments."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lmforge.bench import metrics
from lmforge.bench.loadgen import Load, arrival_times
from lmforge.bench.metrics import RequestResult, compute, percentile, summary
from lmforge.bench.prompts import Prompt, make_prompts, token_prompts, word_prompts
from lmforge.bench.targets import _LmiReader, _message, _OpenAIReader
from lmforge.cli import main


def _request(start: float, arrivals: list[float], tokens: int | None = None) -> RequestResult:
    r = RequestResult(start=start)
    last = start
    for t in arrivals:
        last = r.chunk(t, last)
    r.output_tokens = len(arrivals) if tokens is None else tokens
    r.success = True
    return r


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert math.isclose(percentile(values, 90) or 0, 3.7)  # numpy.percentile([1,2,3,4], 90)
    assert math.isclose(percentile(values, 99) or 0, 3.97)
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile(values, 101)


def test_summary_scales_and_is_none_when_empty() -> None:
    assert summary([0.001, 0.003], 1000.0) == pytest.approx(
        {"mean": 2.0, "p50": 2.0, "p90": 2.8, "p99": 2.98}
    )
    assert summary([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_metrics_follow_vllm_definitions() -> None:
    # request A: sent at 10.0, chunks at 10.1, 10.15, 10.25 (3 tokens)
    a = _request(10.0, [10.1, 10.15, 10.25])
    # request B: sent at 10.0, one chunk carrying 4 tokens at 10.3, then one at 10.5 (5 tokens, 2 chunks)
    b = _request(10.0, [10.3, 10.5], tokens=5)
    failed = RequestResult(start=10.0).fail("HTTP 503: busy")
    m = compute([a, b, failed], duration_s=2.0)
    assert (m.completed, m.failed, m.errors) == (2, 1, ["HTTP 503: busy"])
    assert m.total_output_tokens == 8
    assert m.output_throughput == 4.0 and m.request_throughput == 1.0
    assert m.ttft_ms["mean"] == pytest.approx(200.0)  # (100 + 300) / 2
    assert m.e2el_ms["p50"] == pytest.approx(375.0)  # 250 and 500
    # ITL: the gaps between chunks, pooled: 50, 100 (A) and 200 (B)
    assert m.itl_ms["mean"] == pytest.approx(350 / 3)
    assert m.itl_ms["p50"] == pytest.approx(100.0)
    # TPOT: (e2e - ttft) / (tokens - 1): A 150/2 = 75, B 200/4 = 50
    assert m.tpot_ms["mean"] == pytest.approx(62.5)
    assert m.total_input_tokens is None  # prompt lengths unknown
    assert json.loads(json.dumps(m.to_dict()))["itl_ms"]["p50"] == pytest.approx(100.0)


def test_single_token_requests_have_no_tpot_and_input_totals_add_up() -> None:
    one = _request(0.0, [0.2])
    one.prompt_len = 7
    two = _request(0.0, [0.1, 0.3])
    two.prompt_len = 9
    m = compute([one, two], 1.0)
    assert m.tpot_ms["p50"] == pytest.approx(200.0)  # only the two-token request
    assert m.total_input_tokens == 16
    with pytest.raises(ValueError, match="duration"):
        compute([one], 0.0)


def test_all_failed_gives_none_latencies_and_keeps_a_few_errors() -> None:
    results = [RequestResult().fail(f"error {i}") for i in range(9)]
    m = compute(results, 1.0)
    assert m.completed == 0 and m.failed == 9 and m.output_throughput == 0
    assert m.errors == [f"error {i}" for i in range(metrics.KEEP_ERRORS)]
    assert m.ttft_ms["mean"] is None


def test_lmi_reader_counts_token_lines_and_reports_error_lines() -> None:
    r = RequestResult(start=1.0)
    reader = _LmiReader(r)
    for i, line in enumerate(
        [
            b'data: {"token":{"id":1,"text":"a"},"generated_text":null,"details":null}',
            b'{"token":{"id":2,"text":"b"},"generated_text":"ab","details":{"prompt_tokens":5}}',
        ]
    ):
        obj = _message(line)
        assert obj is not None
        assert reader.feed(obj, 2.0 + i)
    done = reader.finish()
    assert (done.success, done.output_tokens, done.text, done.prompt_len) == (True, 2, "ab", 5)
    assert done.ttft == 1.0 and done.itl == [1.0] and done.latency == 2.0
    assert _message(b"data: [DONE]") is None and _message(b": ping") is None

    bad = _LmiReader(RequestResult(start=0.0))
    assert not bad.feed({"token": None, "generated_text": "", "error": "engine died", "code": 424}, 1.0)
    assert bad.finish().success is False and "engine died" in bad.result.error
    assert _LmiReader(RequestResult()).finish().error == "the stream ended without a token"


def test_openai_reader_takes_usage_then_tokenizer_then_chunks() -> None:
    chunks = [{"choices": [{"text": "ab"}]}, {"choices": [{"text": "c"}]}]
    usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}
    r = _OpenAIReader(RequestResult(), None)
    for i, obj in enumerate([*chunks, usage]):
        r.feed(obj, float(i + 1))
    done = r.finish()
    assert (done.output_tokens, done.chunks, done.prompt_len, done.text) == (3, 2, 4, "abc")
    counted = _OpenAIReader(RequestResult(), len)  # "tokenizer" = characters
    for obj in chunks:
        counted.feed(obj, 1.0)
    assert counted.finish().output_tokens == 3
    plain = _OpenAIReader(RequestResult(), None)
    for obj in chunks:
        plain.feed(obj, 1.0)
    assert plain.finish().output_tokens == 2
    chat = _OpenAIReader(RequestResult(), None)  # chat chunks: text in delta.content, role first
    for obj in (
        {"choices": [{"delta": {"role": "assistant", "content": "ab"}}]},
        {"choices": [{"delta": {"content": "c"}, "finish_reason": "length"}]},
        usage,
    ):
        chat.feed(obj, 1.0)
    assert (chat.finish().text, chat.result.output_tokens) == ("abc", 3)


def test_word_prompts_are_deterministic_per_seed() -> None:
    a, b, c = word_prompts(4, 16, 0), word_prompts(4, 16, 0), word_prompts(4, 16, 1)
    assert a == b and a != c
    assert all(len(p.text.split()) == 16 and p.prompt_len is None for p in a)
    assert len({p.text for p in a}) == 4
    with pytest.raises(ValueError, match="input length"):
        make_prompts(2, 0, 0)
    with pytest.raises(ValueError, match="number of prompts"):
        make_prompts(0, 4, 0)


def test_token_prompts_have_the_exact_length_and_repeat_per_seed(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    prompts = token_prompts(tok, 6, 24, seed=3)
    assert prompts == token_prompts(tok, 6, 24, seed=3)
    assert prompts != token_prompts(tok, 6, 24, seed=4)
    for p in prompts:
        assert isinstance(p, Prompt) and p.prompt_len == 24
        assert len(tok(p.text).input_ids) == 24  # what the server sees, BOS included
    with pytest.raises(ValueError, match="special token"):
        token_prompts(tok, 1, tok.num_special_tokens_to_add(), seed=0)


def test_poisson_arrivals_are_seeded_and_scaled_to_the_rate() -> None:
    times = arrival_times(50, 10.0, seed=0)
    assert times == arrival_times(50, 10.0, seed=0) != arrival_times(50, 10.0, seed=1)
    assert times == sorted(times) and math.isclose(times[-1], 5.0)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert len({round(g, 9) for g in gaps}) > 40  # not evenly spaced


def test_load_refuses_contradictions() -> None:
    with pytest.raises(ValueError, match="either"):
        Load()
    with pytest.raises(ValueError, match="either"):
        Load(concurrency=2, request_rate=1.0)
    with pytest.raises(ValueError, match="concurrency must be"):
        Load(concurrency=0)
    with pytest.raises(ValueError, match="rate must be positive"):
        Load(request_rate=0.0)
    assert Load(request_rate=2.0, max_concurrency=4).limit == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["127.0.0.1:8080"], "TARGET is a server URL"),
        (["my-endpoint"], "TARGET is a server URL"),
        (["http://x:1", "--api", "sagemaker"], "endpoint name, not a URL"),
        (["http://x:1", "--concurrency", "1,zero"], "'zero' is not a whole number"),
        (["http://x:1", "--concurrency", "0"], "must be a finite number greater than 0"),
        (["http://x:1", "--concurrency", "4", "--request-rate", "2"], "not both"),
        (["http://x:1", "--max-concurrency", "4"], "only applies with --request-rate"),
        (["http://x:1", "--request-rate", "fast"], "'fast' is not a number"),
        (["http://x:1", "--num-requests", "0"], "--num-requests"),
        (["http://x:1", "--api", "grpc"], "--api"),
        (["http://x:1", "--region", "us-east-1"], "only to --api sagemaker"),
        (["http://x:1", "--plot", "out.svg"], "PNG"),
        (["http://x:1", "--tokenizer", "/nonexistent/dir"], "--tokenizer"),
        (["http://x:1", "--request-rate", "inf"], "finite"),
        (["http://127.0.0.1:99999"], "not a valid URL"),
        (["http://"], "names no host"),
        (["http://[::1"], "not a valid URL"),
    ],
)
def test_cli_argument_errors_are_clear(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_cli_reports_an_unreachable_server_as_failed_requests(tmp_path: Path) -> None:
    from lmforge.testing.server import free_port

    out = tmp_path / "r.json"
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(
        main, ["bench", url, "--num-requests", "2", "--warmup", "0", "--out", str(out)]
    )
    assert result.exit_code == 1
    record: dict[str, Any] = json.loads(out.read_text())["results"][0]
    assert record["failed"] == 2 and record["completed"] == 0
    assert "cannot connect" in record["errors"][0]
    assert "request(s) failed" in result.output


def test_http_client_reuses_and_recovers_keepalive_connections() -> None:
    from lmforge.bench.http import HttpClient

    async def scenario() -> list[tuple[int, bytes]]:
        served = []
        closed = asyncio.Event()  # the server has closed the first connection, idle after two answers

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            served.append(1)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(
                next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
            )
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab\n\r\n2\r\nc\n\r\n0\r\n\r\n"
            )
            await writer.drain()
            if len(served) == 1:  # keep the first connection open for reuse, then close it idle
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(
                        b":"
                    )[1]
                )
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnope")
                await writer.drain()
            writer.close()
            await writer.wait_closed()
            closed.set()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HttpClient(f"http://127.0.0.1:{port}")
        out = []
        for i in range(3):
            async with client.post("/x", b"{}", {}) as resp:
                out.append((resp.status, b"|".join([c async for c in resp.chunks()])))
            if i == 1:  # the third request finds its kept-alive connection closed by the server
                await asyncio.wait_for(closed.wait(), 30)
        await client.aclose()
        server.close()
        await server.wait_closed()
        assert len(served) == 2  # the second request reused the first connection
        return out

    assert asyncio.run(scenario()) == [(200, b"ab\n|c\n"), (404, b"nope"), (200, b"ab\n|c\n")]


class FakeRuntime:
    """Stands in for boto3's sagemaker-runtime client (AWS is out of reach here): answers every
    call with LMI jsonlines cut across PayloadPart events at awkward places."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def invoke_endpoint_with_response_stream(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        body = json.loads(kwargs["Body"])
        n = body["parameters"]["max_new_tokens"]
        lines = b"".join(
            json.dumps({"token": {"id": i, "text": f"t{i}"}, "generated_text": None}).encode() + b"\n"
            for i in range(n)
        )
        return {"Body": [{"PayloadPart": {"Bytes": lines[i : i + 7]}} for i in range(0, len(lines), 7)]}


def test_sagemaker_target_streams_through_invoke_endpoint_with_response_stream() -> None:
    from lmforge.bench.targets import SageMakerTarget

    fake = FakeRuntime()
    target = SageMakerTarget("my-llm", inference_component="ic-1", workers=2, client=fake)

    async def go() -> list[RequestResult]:
        try:
            return list(await asyncio.gather(*(target.send(Prompt("hi", 3), 5) for _ in range(3))))
        finally:
            await target.aclose()

    results = asyncio.run(go())
    assert all(r.success and r.output_tokens == 5 and r.text == "t0t1t2t3t4" for r in results)
    assert all(r.chunks == 5 and len(r.itl) == 4 and r.prompt_len == 3 for r in results)
    call = fake.calls[0]
    assert call["EndpointName"] == "my-llm" and call["InferenceComponentName"] == "ic-1"
    assert json.loads(call["Body"])["parameters"] == {"max_new_tokens": 5, "ignore_eos_token": True}
