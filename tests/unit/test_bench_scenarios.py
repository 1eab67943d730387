"""The pure pieces of the bench/ scenarios: the no-op engine's contract, the LMI token-line template,
stream parsing, workloads, log parsing, roofline arithmetic and the report page."""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lmforge.engines.protocol import (
    Engine,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    Token,
)
from lmforge.handlers import formatters as fmt

pytestmark = pytest.mark.xdist_group("bench-scenarios")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py, the package the scenarios run from (``python -m bench.<name>``)."""
    return importlib.import_module(f"bench.{name}")


noop = bench_module("noop_server")
ceiling = bench_module("streaming_ceiling")
batching = bench_module("batching")
cold = bench_module("cold_start")
roofline = bench_module("gpu_roofline")
report = bench_module("report")
record = bench_module("record")


# ---------------------------------------------------------------------------------- no-op engine


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Any:
    from lmforge.config import load_config

    eng = noop.NoopEngine(load_config(tiny_model, env={}).config)
    asyncio.run(eng.start())
    return eng


PROMPT_IDS = [5, 6, 7, 8]


def _request(rid: str, n: int) -> GenerationRequest:
    return GenerationRequest(rid, PROMPT_IDS, SamplingParams(max_new_tokens=n))


def test_noop_engine_obeys_the_engine_protocol(engine: Any) -> None:
    assert isinstance(engine, Engine)

    async def run() -> list[GenerationEvent]:
        return [e async for e in engine.generate(_request("a", 7))]

    events = asyncio.run(run())
    assert len(events) == 7 and all(e.token is not None for e in events)
    assert [e.finish_reason for e in events] == [None] * 6 + [FinishReason.LENGTH]
    assert [e.generated_tokens for e in events] == list(range(1, 8))
    assert {e.prompt_tokens for e in events} == {len(PROMPT_IDS)}
    # fixed tokens: real ids of the tokenizer, each with the text it decodes to
    for e in events:
        assert e.token is not None and engine.tokenizer.decode([e.token.id]) == e.token.text
    assert engine.stats().running == 0


def test_noop_engine_aclose_aborts_and_frees_the_request(engine: Any) -> None:
    before = engine.stats().aborted_total

    async def run() -> None:
        gen = engine.generate(_request("c", 100))
        await anext(gen)
        assert engine.stats().running == 1
        await gen.aclose()

    asyncio.run(run())
    assert engine.stats().running == 0
    assert engine.stats().aborted_total == before + 1


# ---------------------------------------------------------------------------------- LMI token line template


TEXTS = ["x", " hello", 'quo"te', "back\\slash", "new\nline\t\r", "\x00\x1f", "ünïcødé 字 🙂", "", "\u2028"]
LOG_PROBS = [-0.25, 0.0, -0.0, -1e-300, -123456.789, float("nan"), float("-inf"), float("inf"), -1 / 3]


@pytest.mark.parametrize("media", [fmt.JSONLINES, fmt.SSE])
def test_stream_frame_is_byte_identical_to_the_encoded_dict(media: str) -> None:
    fast = fmt.LmiFormatter("p", details=True, return_full_text=False)
    slow = fmt.LmiFormatter("p", details=True, return_full_text=False)
    n = 0
    for text in TEXTS:
        for lp in LOG_PROBS:
            n += 1
            event = GenerationEvent(Token(n * 7919, text, lp), 3, n)
            assert fast.stream_frame(event, media) == fmt.frame(slow.stream_line(event), media), (text, lp)
    last = GenerationEvent(Token(5, "end", -0.5), 3, n + 1, finish_reason=FinishReason.LENGTH)
    assert fast.stream_frame(last, media) == fmt.frame(slow.stream_line(last), media)
    assert fast.generated_text() == slow.generated_text()


@pytest.mark.parametrize(
    "token",
    [
        Token(1, "a", -0.5, special=True),
        Token(1, "a", -0.5, top_logprobs=[(2, -1.0)]),
        Token(True, "a", -0.5),  # not a plain int: the dict path decides
        Token(1, "a", 0),  # an int log-prob: the dict path writes it as json does
    ],
)
def test_stream_frame_falls_back_to_the_dict_path(token: Token) -> None:
    fast = fmt.LmiFormatter("p", details=False, return_full_text=False)
    slow = fmt.LmiFormatter("p", details=False, return_full_text=False)
    event = GenerationEvent(token, 1, 1)
    assert fast.stream_frame(event, fmt.JSONLINES) == fmt.frame(slow.stream_line(event), fmt.JSONLINES)


# ---------------------------------------------------------------------------------- streaming ceiling client


def test_dechunk_and_stream_objects() -> None:
    lines = [b'{"token":{"id":1},"generated_text":null}\n', b'{"token":{"id":2},"generated_text":"ab"}\n']
    body = b"".join(b"%x\r\n%s\r\n" % (len(x), x) for x in lines) + b"0\r\n\r\n"
    payload = ceiling.dechunk(body)
    assert payload == b"".join(lines)
    objs = ceiling.stream_objects(payload, "jsonlines")
    assert ceiling.check_stream(objs, 2, details=False) == 2
    with pytest.raises(AssertionError, match="expected 3 token lines"):
        ceiling.check_stream(objs, 3, details=False)
    sse = b"".join(b"data: " + x + b"\n" for x in lines)
    assert ceiling.stream_objects(sse, "sse") == objs
    with pytest.raises(ValueError, match="not an SSE data line"):
        ceiling.stream_objects(payload, "sse")


def test_check_stream_wants_details_when_asked() -> None:
    objs = [
        {
            "token": {"id": 1},
            "generated_text": "a",
            "details": {"finish_reason": "length", "generated_tokens": 1},
        }
    ]
    assert ceiling.check_stream(objs, 1, details=True) == 1
    with pytest.raises(AssertionError, match="details sent but not asked for"):
        ceiling.check_stream(objs, 1, details=False)
    objs[0]["details"] = {"finish_reason": "eos_token", "generated_tokens": 1}
    with pytest.raises(AssertionError, match="bad details"):
        ceiling.check_stream(objs, 1, details=True)


# ---------------------------------------------------------------------------------- batching


def test_batching_workloads_and_static_slots() -> None:
    assert batching.workload("equal", 8) == [64] * 8
    varying = batching.workload("varying", 64)
    assert varying == batching.workload("varying", 64)  # seeded
    assert sum(1 for n in varying if n >= 192) == 8 and all(8 <= n <= 32 or 192 <= n <= 256 for n in varying)
    assert batching.static_slots([10, 20, 5, 5, 1], 2) == 20 * 2 + 5 * 2 + 1 * 1
    with pytest.raises(ValueError, match="unknown workload"):
        batching.workload("bursty")
    assert all(len(p) == 16 for p in batching.prompts(4, 16))


# ---------------------------------------------------------------------------------- cold start


LMI_LOG = (
    "2026-11-23 10:00:01,250 INFO lmforge.serving: lmforge serving /m on http://127.0.0.1:1 (/ping)\n"
    "2026-11-23 10:00:03,000 INFO lmforge.engines.lmi_dist: lmi-dist startup phases (s): import=1.500 "
    "tokenizer=0.020 weights=0.100 batching_init=0.010 kv_cache=0.005 warmup=0.300 start=0.001\n"
    "2026-11-23 10:00:03,100 INFO lmforge.serving: model loaded in 2.1 s; serving with handler lmi-dist\n"
)


def test_cold_start_log_parsing() -> None:
    import time as _time

    t_boot = cold.log_time(LMI_LOG.splitlines()[0])
    assert t_boot is not None
    assert _time.localtime(t_boot).tm_min == 0 and abs(t_boot % 1 - 0.25) < 1e-6
    assert cold.log_time("no stamp here") is None
    assert cold.lmi_phases(LMI_LOG) == {
        "import": 1.5,
        "tokenizer": 0.02,
        "weights": 0.1,
        "batching_init": 0.01,
        "kv_cache": 0.005,
        "warmup": 0.3,
        "start": 0.001,
    }
    row = cold.breakdown(t_boot - 1.0, t_boot + 2.5, LMI_LOG)
    assert row["ready_s"] == pytest.approx(3.5)
    assert row["server_boot_s"] == pytest.approx(1.0)
    assert row["model_load_s"] == 2.1
    assert row["unaccounted_s"] == pytest.approx(0.4)


def test_vllm_log_durations() -> None:
    log = (
        "(EngineCore pid=1) INFO 11-23 10:00:05 [default_loader.py:267] Loading weights took 0.05 seconds\n"
        "(EngineCore pid=1) INFO 11-23 10:00:05 [gpu_model_runner.py:1] Model loading took 0.0037 GiB and "
        "0.31 seconds\n"
        "(EngineCore pid=1) INFO 11-23 10:00:09 [core.py:1] init engine (profile, create kv cache, "
        "warmup model) took 3.20 seconds\n"
        "INFO 11-23 10:00:09 [api.py:1] nothing timed here\n"
    )
    got = cold.vllm_durations(log)
    assert [x["seconds"] for x in got] == [0.05, 0.31, 3.2]
    assert got[0]["what"].startswith("Loading weights")
    assert "init engine" in got[2]["what"]


def test_vllm_timeline_from_log_stamps() -> None:
    log = (
        "2026-11-23 10:39:50,000 INFO lmforge.serving: lmforge serving /m on http://127.0.0.1:1 (/ping)\n"
        "2026-11-23 10:40:00,500 WARNING vllm.triton_utils.importing: Triton is installed, but ...\n"
        "(MainProcess pid=1) INFO 11-23 10:40:12 [model.py:733] Resolved architecture: LlamaForCausalLM\n"
        "(EngineCore pid=2) INFO 11-23 10:40:19 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with\n"
        "(Worker pid=3) INFO 11-23 10:40:28 [cpu_model_runner.py:68] Starting to load model /m...\n"
        "(Worker pid=3) INFO 11-23 10:40:28 [default_loader.py:501] Loading weights took 0.01 seconds\n"
        "(EngineCore pid=2) INFO 11-23 10:40:29 [core.py:402] init engine (profile, create kv cache, warmup "
        "model) took 0.16 s\n"
        "2026-11-23 10:40:29,800 INFO lmforge.serving: model loaded in 39.7 s; serving with handler vllm\n"
    )
    t0 = cold.log_time(log.splitlines()[0])
    assert t0 is not None
    timeline = cold.vllm_timeline(t0 - 0.5, log)
    assert [x["milestone"] for x in timeline] == [label for label, _ in cold.VLLM_MILESTONES]
    assert [x["at_s"] for x in timeline] == [0.5, 11.0, 22.5, 29.5, 38.5, 38.5, 39.5, 40.3]
    assert [x["phase_s"] for x in timeline][:3] == [0.5, 10.5, 11.5]
    assert cold.vllm_timeline(t0, "nothing logged") == []


# ---------------------------------------------------------------------------------- roofline


def test_roofline_arithmetic() -> None:
    # TinyLlama's shape: 22 layers, 4 KV heads of 64 dims, bf16 -> 2 (K, V) * 22 * 4 * 64 * 2 bytes
    kv = roofline.kv_bytes_per_token(22, 4, 64, 2)
    assert kv == 2 * 22 * 4 * 64 * 2
    assert roofline.mean_context(128, 129) == 192
    weights, bw = 2 * 10**9, 2 * 10**12
    # batch 1 with no context: one weight read per token
    assert roofline.roofline_tokens_per_s(weights, kv, 1, 0, bw) == pytest.approx(1000)
    per_step = roofline.bytes_per_step(weights, kv, 64, 192)
    assert per_step == weights + 64 * 192 * kv
    assert roofline.roofline_tokens_per_s(weights, kv, 64, 192, bw) == pytest.approx(64 * bw / per_step)
    # larger batches amortise the weights: tokens/s grows with the batch, towards bw / (context * kv)
    rates = [roofline.roofline_tokens_per_s(weights, kv, b, 192, bw) for b in (1, 8, 64)]
    assert rates == sorted(rates) and rates[-1] < bw / (192 * kv)
    assert roofline.decode_rate([1.0, 1.5], [3.0, 3.5], [11, 11]) == pytest.approx(20 / 2.0)
    assert math.isnan(roofline.decode_rate([1.0], [1.0], [1]))


def test_gpu_roofline_without_a_gpu_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "roofline.json"
    monkeypatch.setattr(sys, "argv", ["gpu_roofline.py", "--out", str(out)])
    assert roofline.main() == 0
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


# ---------------------------------------------------------------------------------- report


def _sample_results() -> dict[str, Any]:
    row = {"framing": "jsonlines", "details": False, "concurrency": 16, "tokens_per_s": 30000.0}
    return {
        "streaming-ceiling": {
            "settings": {"tokens_per_request": 256, "rounds": 3},
            "target_us_per_token": 20.0,
            "per_request_us": 350.0,
            "worst_us_per_token": 25.0,
            "rows": [{**row, "us_per_token": 25.0, "user_us_per_token": 18.0, "sys_us_per_token": 7.0}],
            "floor": [{**row, "us_per_token": 6.5}],
            "before": {
                "rows": [{**row, "us_per_token": 33.0}],
                "per_request_us": 400.0,
                "worst_us_per_token": 33.0,
            },
            "note": "after the fix",
        },
        "batching": {
            "model": {"params": 24e6, "hidden_size": 512, "num_hidden_layers": 8},
            "settings": {"requests": 64, "prompt_tokens": 16, "batch": 16, "repeats": 2},
            "rows": [
                {
                    "workload": "varying",
                    "output_tokens": {"min": 8, "max": 256, "total": 3000},
                    "static": {"tokens_per_s": 90.0, "tokens_per_cpu_s": 100.0},
                    "continuous": {"tokens_per_s": 300.0, "tokens_per_cpu_s": 420.0},
                    "ratio": 4.2,
                    "ratio_wall": 3.33,
                    "static_slot_use": 0.2,
                }
            ],
            "target": 3.0,
            "ratio": 4.2,
        },
        "cold-start": {
            "settings": {"repeats": 2},
            "backends": [
                {
                    "backend": "lmi-dist",
                    "best": {
                        "ready_s": 6.0,
                        "server_boot_s": 1.0,
                        "engine_phases_s": {"import": 3.0, "warmup": 0.5},
                    },
                    "runs": [6.0, 6.4],
                    "engine_own": {
                        "total_s": 5.0,
                        "interpreter_s": 0.1,
                        "import_s": 4.0,
                        "tokenizer_s": 0.1,
                        "weights_s": 0.3,
                        "warmup_s": 0.5,
                    },
                    "ratio_ready_vs_own": 1.2,
                },
                {
                    "backend": "vllm",
                    "best": {
                        "ready_s": 40.0,
                        "server_boot_s": 0.5,
                        "model_load_s": 39.4,
                        "timeline": [{"milestone": "vLLM imported", "at_s": 11.0, "phase_s": 10.5}],
                    },
                    "runs": [40.0, 44.0],
                    "engine_own": {"lines": [{"what": "Loading weights took", "seconds": 0.01}]},
                },
            ],
        },
    }


def _records(results: dict[str, Any]) -> dict[str, Any]:
    """The sample results as their scenarios write them: each with its ``report`` object."""
    sections = {
        "streaming-ceiling": ceiling.section,
        "batching": batching.section,
        "cold-start": cold.section,
    }
    return {name: {**r, "report": sections[name](r)} for name, r in results.items()}


def _external(order: int, title: str, **report_extra: Any) -> dict[str, Any]:
    return {"report": {"order": order, "title": title, "body": [{"text": "text"}], **report_extra}}


def test_report_renders_every_scenario_with_its_ratio() -> None:
    page = report.render({**_records(_sample_results()), "engines": _external(800, "Engines section")})
    assert "| Streaming ceiling | 25.0 us/token (worst variant) | <= 20 us | 0.80 | **missed** |" in page
    assert "| Batching (varying lengths) | 4.20x | >= 3x | 1.40 | met |" in page
    assert "| jsonlines | no | 16 | **25.0** | 18.0 / 7.0 | 30000 |" in page
    assert "jsonlines c=16: 33.0 -> 25.0" in page  # before / after
    assert "6.5 us at concurrency 16" in page  # the bare-uvicorn floor
    assert "| varying | 8-256, 3000 | 100 | 420 | **4.20x** | 3.33x | 20% |" in page
    assert "| engine: import | 3.00 |" in page and "| other | 1.50 |" in page
    assert "**ready (ping 200)** | **6.00**" in page and "**1.20x**" in page
    assert "| vLLM imported | 11.0 | 10.5 |" in page and "| Loading weights took | 0.01 |" in page
    assert "Ready (ping 200) in **40.00 s** (all starts: 40.00, 44.00)" in page
    assert "## Engines section" in page
    assert "## Reproduce" in page
    assert "## LMI-Dist on one GPU" not in page and "## LMI-Dist decode vs the memory-bandwidth" not in page
    assert "## Cold start (`bench/cold_start.py`)" in page and "Cold start, SmolLM2-135M" not in page
    # the record's order places the sections: streaming (200), batching (300), cold start (400), engines
    at = [
        page.index(h) for h in ("## Streaming ceiling", "## Batching", "## Cold start", "## Engines section")
    ]
    assert at == sorted(at)


def test_a_record_round_trips_its_tables() -> None:
    md = (
        "## Title (`bench/x.py`)\n\nSome text.\n\n"
        "| a | b |\n| --- | --- |\n| 1 | **2** |\n| `x\\|y` | 3 |\n\nAfter.\n"
    )
    rep = record.section(1, md)
    assert rep["title"] == "Title (`bench/x.py`)"
    assert rep["body"] == [
        {"text": "Some text."},
        {"table": {"head": ["a", "b"], "rows": [["1", "**2**"], ["`x\\|y`", "3"]]}},
        {"text": "After."},
    ]
    assert record.render(rep["body"]) == md.partition("\n\n")[2].strip()
    with pytest.raises(ValueError, match="heading"):
        record.section(1, "no heading")


def test_a_rerun_keeps_the_notes_of_the_result_it_replaces(tmp_path: Path) -> None:
    out = tmp_path / "x.json"

    def section(r: dict[str, Any]) -> dict[str, Any]:
        return record.section(1, f"## X\n\n{r['figure']}\n\n{r.get('notes', '')}")

    record.write(out, {"figure": 1, "notes": "found by hand"}, section)
    record.write(out, {"figure": 2}, section)
    written = json.loads(out.read_text())
    assert written["notes"] == "found by hand" and written["report"]["body"] == [
        {"text": "2\n\nfound by hand"}
    ]


def test_report_renders_the_real_models_cold_start_beside_the_tiny_ones() -> None:
    results = _sample_results()
    real = {
        **results["cold-start"],
        "name": "cold-start-smollm2-135m",
        "settings": {"model_key": "smollm2-135m", "repeats": 2},
        "notes": "before this change the kv_cache phase took 3.15 s",
    }
    page = report.render(
        {**_records(results), "cold-start-smollm2-135m": {**real, "report": cold.section(real)}}
    )
    tiny_at = page.index("## Cold start (`bench/cold_start.py`)")
    real_at = page.index("## Cold start, SmolLM2-135M (`bench/cold_start.py`)")
    assert tiny_at < real_at
    assert "on SmolLM2-135M-Instruct (fp32)" in page[real_at:]
    assert "`bench/results/cold-start-smollm2-135m.json`" in page[real_at:]
    assert "before this change the kv_cache phase took 3.15 s" in page[real_at:]


def test_report_summary_and_comparison_come_from_the_records() -> None:
    epyc = {"cpu": "AMD EPYC", "cpu_count": 2, "cpu_flags": ["avx", "avx2", "avx512f", "avx512_bf16"]}
    avx2 = {"cpu": "AMD EPYC", "cpu_count": 2, "cpu_flags": ["avx", "avx2", "fma"]}
    results = {
        "soak": {**_external(900, "Soak", summary=[record.summary_row("Soak", 0.99, 0.95)]), "machine": avx2},
        "engines": {
            **_external(
                800,
                "Engines",
                summary=[record.summary_row("Engines", 0.72, 0.8)],
                compare={"model": "tiny", "rows": [["Engines c=32", "0.72x"]]},
            ),
            "machine": epyc,
        },
        "engines-real": {
            **_external(801, "Engines real", compare={"model": "real", "rows": [["Engines c=32", "0.88x"]]}),
            "compare_notes": "- **The engines' kernels decide.**",
        },
        "frontend": _external(600, "Frontend", summary=[record.summary_row("Frontend overhead", 1.02, 0.98)]),
        "lora-step": {"figures": 1},  # no report object: not on the page
    }
    rows = report.summary_rows(results)
    assert [r[0] for r in rows] == ["Frontend overhead", "Engines", "Soak"]
    assert rows[0][1:3] == ("1.02x", ">= 0.98x") and rows[0][4] == "not recorded"
    assert rows[1][3] == pytest.approx(0.9) and report.verdict(rows[1][3]) == "**missed**"
    assert rows[1][4] == "AMD EPYC, 2 cores, avx512_bf16" and rows[2][4] == "AMD EPYC, 2 cores, avx2"
    page = report.render(results)
    assert "| taken on |" in page
    assert "| Engines c=32 | 0.72x | 0.88x |" in page and "- **The engines' kernels decide.**" in page
    assert "## Engines real" in page and "lora-step" not in page


def test_the_page_is_the_records_rendered() -> None:
    """docs/performance.md is what bench/report.py makes of bench/results: nothing kept by hand."""
    assert report.render(report.load_all()) == report.DOC.read_text()


def test_a_bimodal_tpot_is_a_finding() -> None:
    """vllm bench serve's per-request lists -> each request's TPOT; a run where some streams go at a
    fraction of the others' pace is bimodal (issue 60: mean 40.5 ms, std 33.7, p99 100 against a
    median ITL of 19.6), one whose streams go alike is not."""
    parity = bench_module("vllm_bench_parity")
    even = {"latencies": [1.28 + 0.01 * i for i in range(64)], "ttfts": [0.02] * 64, "output_lens": [64] * 64}
    starved = {**even, "latencies": [1.3] * 54 + [6.4] * 10}
    assert not parity.bimodal(parity.tpot_spread(even))
    spread = parity.tpot_spread(starved)
    assert parity.bimodal(spread) and spread["slow_share"] == pytest.approx(10 / 64, abs=1e-4)
    assert spread["p50_ms"] == pytest.approx(1e3 * 1.28 / 63, rel=1e-3)
    assert parity.tpot_spread({}) == {} and not parity.bimodal({})


def test_the_soak_compares_the_late_runs_with_the_early_ones() -> None:
    soak = bench_module("soak")
    tput = (3000.0, 2400.0, 2800.0, 2700.0, 2900.0, 2600.0, 2500.0, 2300.0, 2650.0)
    # the client's CPU per request moves with the host's speed; the server's costs 3x it, then 3.3x
    client = (2.0, 2.5, 2.2, 2.1, 2.0, 2.4, 2.2, 2.0, 2.6)
    runs = [
        {
            "output_throughput": t,
            "p99_tpot_ms": 20.0,
            "rss_mib": 500.0 + i,
            "tpot_spread": {"std_ms": 1.0},
            "cpu_ms_per_request": {"frontend": c, "engine": c * (2.0 if i < 6 else 2.3), "client": c},
        }
        for i, (t, c) in enumerate(zip(tput, client, strict=True))
    ]
    row = soak.summarize(runs)
    assert row["last_over_first"] == pytest.approx(2650 / 3000, abs=1e-3)
    # medians of the first three (2800) and the last three (2500) runs
    assert row["late_over_early"] == pytest.approx(2500 / 2800, abs=1e-3)
    assert row["work_runs"][:2] == [3.0, 3.0] and row["work_late_over_early"] == pytest.approx(1.1, abs=1e-3)
    assert row["bimodal_runs"] == [] and row["rss_mib_runs"][-1] == 508.0
    result = {
        "name": "soak",
        "commit": "abc1234",
        "goal_last_over_first": soak.GOAL,
        "rows": {"lmforge-vllm": row},
        "settings": {
            "runs": 9,
            "concurrency": 64,
            "prompts": 384,
            "model_key": "tiny",
            "vllm_serve_args": ["--x"],
            "bimodal_share": 0.05,
            "slow_stream": 2.0,
        },
        "machine": {"cpu": "AMD EPYC", "cpu_count": 2, "cpu_flags": ["avx2"]},
    }
    page = soak.report(result)
    runs_text = ", ".join(f"{t:.0f}" for t in tput)
    assert f"| lmforge-vllm | {runs_text} | **0.89** (MISSED) | 0.88 | 1.10 |" in page
    assert "`abc1234`, taken on AMD EPYC, 2 cores, avx2" in page
