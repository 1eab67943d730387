"""bench/speculative.py's ``--w8a8`` summary: W8A8 + n-gram speculation against LMI-Dist fp32 and vLLM-CPU
fp32 (issue 56's combined goals), its medians and ratios, failed readings left out of them and named,
and the section and summary rows docs/performance.md gets from the result."""

from __future__ import annotations

from typing import Any

import pytest
from bench import record, speculative
from bench import report as page

pytestmark = pytest.mark.xdist_group("bench-scenarios")

FP32, W8A8, NGRAM, VLLM = speculative.W8A8_LABELS


def _reading(tput: float, ms: float = 50.0, acceptance: float | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"output_throughput": tput, "tokens": 384, "wall_s": 384 / tput, "ms_per_token": ms}
    if acceptance is not None:
        rec |= {"acceptance": acceptance, "mean_accepted_length": 1 + 4 * acceptance, "speculated_share": 1.0}
    return rec


def _cell(fp32: tuple[float, float], w8a8: tuple[float, float], ngram: tuple[float, float],
          vllm: tuple[float, float]) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Two rounds of the four servers (the speculating one with acceptance 0.5, then 0.7)."""
    return {
        FP32: [_reading(x) for x in fp32],
        W8A8: [_reading(x) for x in w8a8],
        NGRAM: [_reading(x, acceptance=a) for x, a in zip(ngram, (0.5, 0.7), strict=True)],
        VLLM: [_reading(x) for x in vllm],
    }


def _result(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "speculative-w8a8-test",
        "rows": rows,
        "settings": {
            "model": speculative.DESCRIPTIONS[speculative.SMOLLM2],
            "speculative_config": speculative.SPECULATION,
            "vllm_properties": ["option.rolling_batch=vllm", "option.dtype=fp32"],
            "requests": {"1": 4},
            "max_tokens": 96,
            "rounds": 2,
        },
        "compile_s": 12.3,
        "weight_bytes": {FP32: 540 * 2**20, W8A8: 150 * 2**20, NGRAM: 150 * 2**20, VLLM: 540 * 2**20},
        "machine": {"cpu": "test cpu", "cpu_count": 2},
    }


def test_the_row_holds_medians_and_the_goal_ratios() -> None:
    row = speculative.summarize_w8a8(
        "input-grounded", 1, _cell((12.0, 14.0), (20.0, 24.0), (40.0, 44.0), (15.0, 17.0))
    )
    assert row["output_throughput"] == {FP32: 13.0, W8A8: 22.0, NGRAM: 42.0, VLLM: 16.0}
    assert row["vs_fp32"] == pytest.approx(42.0 / 13.0)
    assert row["vs_vllm"] == pytest.approx(42.0 / 16.0)
    assert row["w8a8_vs_fp32"] == pytest.approx(22.0 / 13.0)
    assert row["speculation_gain"] == pytest.approx(42.0 / 22.0)
    # acceptance and accepted length come from the speculating server's readings alone
    assert row["acceptance"] == pytest.approx(0.6)
    assert row["mean_accepted_length"] == pytest.approx(1 + 4 * 0.6)
    assert "failed_cells" not in row


def test_the_goals_become_summary_rows_of_the_page() -> None:
    rows = [
        speculative.summarize_w8a8("input-grounded", 1, _cell((10.0, 10.0), (18, 18), (33, 33), (12, 12))),
        speculative.summarize_w8a8("open-chat", 1, _cell((10.0, 10.0), (18, 18), (20, 20), (12, 12))),
    ]
    result = _result(rows)
    sec = speculative.section_w8a8(result)
    assert sec["order"] == record.ORDER["speculative"] + 2
    assert sec["title"].startswith("Speculative decoding on a W8A8 model vs LMI-Dist fp32 and vLLM-CPU fp32")
    summary = {r["scenario"]: r for r in sec["summary"]}
    vs_fp32 = summary["Speculation (n-gram) on W8A8, input-grounded c=1: / LMI-Dist fp32"]
    vs_vllm = summary["Speculation (n-gram) on W8A8, input-grounded c=1: / vLLM-CPU fp32"]
    assert (vs_fp32["figure"], vs_fp32["target"]) == ("3.30x", ">= 3.0x")
    assert vs_fp32["ratio"] == pytest.approx(3.3 / 3.0)  # met
    assert (vs_vllm["figure"], vs_vllm["target"]) == ("2.75x", ">= 2.5x")
    assert vs_vllm["ratio"] == pytest.approx(2.75 / 2.5)
    # the open-chat row is reported, with no goal of its own
    [table] = [b["table"] for b in sec["body"] if "table" in b]
    assert [r[0] for r in table["rows"]] == ["input-grounded", "open-chat"]
    assert all(len(r) == len(table["head"]) for r in table["rows"])
    grounded = dict(zip(table["head"], table["rows"][0], strict=True))
    assert grounded[f"{NGRAM} tok/s"] == "33.0 (50 ms/token)"
    assert (
        grounded["W8A8 + n-gram / fp32"] == "**3.30x**"
        and grounded["W8A8 + n-gram / vLLM fp32"] == "**2.75x**"
    )
    assert grounded["n-gram gain on W8A8"] == "1.83x" and grounded["acceptance"] == "0.60"
    # and bench.report puts both on docs/performance.md
    text = page.render({"speculative-w8a8-test": {**result, "report": sec}})
    assert (
        "| Speculation (n-gram) on W8A8, input-grounded c=1: / vLLM-CPU fp32 | 2.75x | >= 2.5x | 1.10 | met"
        in text
    )
    assert "## Speculative decoding on a W8A8 model" in text


def test_a_goal_missed_reads_missed() -> None:
    rows = [
        speculative.summarize_w8a8("input-grounded", 1, _cell((10.0, 10.0), (18, 18), (25, 25), (12, 12)))
    ]
    summary = speculative.section_w8a8(_result(rows))["summary"]
    assert [page.verdict(r["ratio"]) for r in summary] == [
        "**missed**",
        "**missed**",
    ]  # 2.5x < 3, 2.08x < 2.5


def test_a_failed_cell_is_left_out_of_the_medians_and_its_goal_claims_nothing() -> None:
    failed = {"empty_reading": "measure raised ConnectError('refused')"}
    cell = _cell((10.0, 12.0), (18, 18), (33, 33), (12, 12))
    cell[VLLM] = [failed, failed]  # every round of vLLM failed
    cell[FP32] = [failed, _reading(12.0)]  # one round of fp32
    row = speculative.summarize_w8a8("input-grounded", 1, cell)
    assert row["output_throughput"][VLLM] is None and row["vs_vllm"] is None
    assert row["output_throughput"][FP32] == 12.0  # the good round alone
    assert row["vs_fp32"] == pytest.approx(33.0 / 12.0)
    assert row["failed_cells"] == {VLLM: [failed["empty_reading"]] * 2, FP32: [failed["empty_reading"]]}
    result = _result([row])
    text = speculative.report_w8a8(result)
    assert "failed (no reading)" in text and "n/a (a reading failed)" in text
    assert f"- input-grounded c=1 {VLLM}: 2 failed reading(s), measure raised ConnectError('refused')" in text
    scenarios = [r["scenario"] for r in speculative.section_w8a8(result)["summary"]]
    assert scenarios == ["Speculation (n-gram) on W8A8, input-grounded c=1: / LMI-Dist fp32"]


def test_a_reading_that_raises_or_has_no_tokens_is_measured_again(capsys: pytest.CaptureFixture[str]) -> None:
    readings = iter([{**_reading(10.0), "tokens": 0}, _reading(30.0)])
    assert speculative.measure_cell(lambda: next(readings), "round 1 c=1 vllm fp32") == _reading(30.0)
    assert (
        "round 1 c=1 vllm fp32 EMPTY READING: no output tokens; remeasuring (1/1)" in capsys.readouterr().out
    )

    calls = 0

    def gone() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        raise OSError("server gone")

    rec = speculative.measure_cell(gone, "c=1 lmi-dist fp32")
    assert calls == 1 + speculative.REMEASURES
    assert rec == {"empty_reading": "measure raised OSError('server gone')"}
    assert "recorded as failed" in capsys.readouterr().out
