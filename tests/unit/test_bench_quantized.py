"""bench/quantized.py's guard against an empty reading: a measurement with no completed request, no
output tokens or no TPOT is measured again, then recorded as failed (named in the report, left out of
the medians and the goals) instead of crashing the run and losing every other cell."""

from __future__ import annotations

from typing import Any

import pytest
from bench import quantized

LABELS = ("lmi-dist w8a8", "lmi-dist gptq", "lmi-dist fp32", "vllm fp32")


def _reading(tput: float, tpot: float = 20.0) -> dict[str, Any]:
    return {"completed": 64, "failed": 0, "errors": [], "output_throughput": tput, "tpot_ms": {"p50": tpot}}


EMPTY = {"completed": 0, "failed": 64, "errors": ["ConnectError('refused')"], "output_throughput": 0.0,
         "tpot_ms": {"p50": None}}  # fmt: skip


@pytest.mark.parametrize(
    ("rec", "says"),
    [
        (EMPTY, "no request completed (64 failed; first error: ConnectError('refused'))"),
        ({**_reading(0.0), "output_throughput": 0.0}, "no output tokens"),
        ({**_reading(10.0), "tpot_ms": {"p50": None}}, "no TPOT"),
        ({"completed": 0}, "no request completed (0 failed)"),
    ],
)
def test_what_counts_as_an_empty_reading(rec: dict[str, Any], says: str) -> None:
    problem = quantized.reading_problem(rec)
    assert problem is not None and problem.startswith(says)
    assert quantized.reading_problem(_reading(100.0)) is None


def test_an_empty_reading_is_measured_again(capsys: pytest.CaptureFixture[str]) -> None:
    readings = iter([EMPTY, _reading(123.0)])
    rec = quantized.measure_cell(lambda: next(readings), "round 1 c=8   lmi-dist w8a8")
    assert rec == _reading(123.0)
    out = capsys.readouterr().out
    assert "round 1 c=8   lmi-dist w8a8 EMPTY READING: no request completed" in out
    assert "remeasuring (1/2)" in out


def test_a_cell_that_stays_empty_or_raises_is_recorded_as_failed(capsys: pytest.CaptureFixture[str]) -> None:
    calls = 0

    def run() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("server gone")
        return EMPTY

    rec = quantized.measure_cell(run, "c=32 vllm fp32")
    assert calls == 1 + quantized.REMEASURES
    assert rec["empty_reading"].startswith("no request completed")
    assert "measure raised OSError('server gone')" in capsys.readouterr().out


def _result(runs: dict[int, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    return {
        "name": "quantized-test",
        "settings": {"model": "m", "input_len": 32, "output_len": 64, "rounds": 2},
        "rows": [quantized.summarize(c, runs[c]) for c in runs],
        "weight_bytes": dict.fromkeys(LABELS, 2**20),
        "peak_rss_bytes": dict.fromkeys(LABELS),
        "compile_s": 1.0,
    }


def test_a_failed_cell_is_left_out_of_the_medians_and_named_in_the_report() -> None:
    failed = {**EMPTY, "empty_reading": "no request completed (64 failed)"}
    runs = {
        c: {
            label: [_reading(100.0 * (i + 1)), _reading(100.0 * (i + 1) + 10)]
            for i, label in enumerate(LABELS)
        }
        for c in (1, 8, 32)
    }
    runs[8]["vllm fp32"] = [failed, failed]  # every round of one cell failed
    runs[32]["lmi-dist fp32"] = [failed, _reading(300.0)]  # one round of another
    result = _result(runs)
    rows = {r["concurrency"]: r for r in result["rows"]}
    assert rows[1]["vs_fp32"] == pytest.approx(105.0 / 305.0)
    assert rows[8]["output_throughput"]["vllm fp32"] is None
    assert rows[8]["vs_vllm"] is None and rows[8]["gptq_vs_vllm"] is None
    assert rows[8]["vs_fp32"] == pytest.approx(105.0 / 305.0)
    assert rows[32]["output_throughput"]["lmi-dist fp32"] == 300.0  # the good round alone
    assert rows[8]["failed_cells"] == {"vllm fp32": ["no request completed (64 failed)"] * 2}

    text = quantized.report(result)
    assert "failed (no reading)" in text and "n/a (a reading failed)" in text
    assert "- c=8 vllm fp32: 2 failed reading(s), no request completed (64 failed)" in text
    assert "- c=32 lmi-dist fp32: 1 failed reading(s)" in text
    scenarios = [row["scenario"] for row in quantized.section(result).get("summary", [])]
    # the lowest-over-c goals have a failed cell: no figure claimed; the c=1 and c=32 ones stand
    assert scenarios == [
        "Quantized: LMI-Dist W8A8 / fp32 output tok/s, c=1",
        "Quantized: LMI-Dist W8A8 / fp32 output tok/s, c=32",
    ]
