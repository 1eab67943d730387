"""`lmforge bench` against a real `lmforge serve` of the tiny model: jsonlines and SSE, small numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.testing.server import RemoteServer

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("tiny-server")]

FIGURES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


@pytest.fixture(scope="module")
def server(tiny_server: RemoteServer) -> RemoteServer:
    return tiny_server


class Ran:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _bench(*args: str) -> Ran:
    """The CLI in this process (imports once); its HTTP requests go to the real server process."""
    from click.testing import CliRunner

    from lmforge.cli import main

    result = CliRunner().invoke(main, ["bench", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


@pytest.mark.parametrize("api", ["lmforge", "lmforge-sse"])
def test_bench_streams_and_writes_results_and_plot(
    server: RemoteServer, tiny_model: Path, tmp_path: Path, api: str
) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = _bench(
        server.url,
        *("--api", api, "--concurrency", "1,4", "--num-requests", "6", "--input-len", "12"),
        *("--output-len", "8", "--seed", "0", "--tokenizer", str(tiny_model)),
        *("--out", str(out), "--plot", str(png)),
    )
    assert proc.returncode == 0, proc.stderr
    # the summary table on stdout, progress and next steps on stderr
    assert "out tok/s" in proc.stdout and "c=4" in proc.stdout
    assert "Next:" in proc.stderr
    data = json.loads(out.read_text())
    records = data["results"]
    assert [r["config"]["concurrency"] for r in records] == [1, 4]
    for rec in records:
        cfg = rec["config"]
        assert cfg["api"] == api and cfg["input_len"] == 12 and cfg["output_len"] == 8
        assert cfg["request_rate"] is None and cfg["warmup"] == 1
        assert rec["completed"] == 6 and rec["failed"] == 0 and rec["errors"] == []
        assert rec["total_output_tokens"] == 6 * 8  # ignore_eos: exactly output-len each
        assert rec["total_input_tokens"] == 6 * 12  # --tokenizer: exact prompt lengths
        assert rec["output_throughput"] > 0 and rec["request_throughput"] > 0
        for key in FIGURES:
            fig = rec[key]
            assert set(fig) == {"mean", "p50", "p90", "p99"}
            assert 0 < fig["p50"] <= fig["p90"] <= fig["p99"]
        assert rec["versions"]["lmforge"] and rec["machine"]["cpu_count"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_bench_request_rate_and_server_errors(server: RemoteServer, tmp_path: Path) -> None:
    out = tmp_path / "rate.json"
    proc = _bench(
        server.url,
        *("--request-rate", "20", "--max-concurrency", "2", "--num-requests", "4", "--output-len", "4"),
        *("--warmup", "0", "--out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text())["results"][0]
    assert rec["config"]["request_rate"] == 20 and rec["config"]["max_concurrency"] == 2
    assert rec["completed"] == 4 and rec["total_input_tokens"] is None  # word prompts: lengths unknown
    # the server's 400 for a length past the model's limit is counted and quoted, not a crash
    proc = _bench(server.url, "--num-requests", "2", "--output-len", "100000", "--warmup", "0")
    assert proc.returncode == 1
    assert "2 request(s) failed" in proc.stderr and "HTTP 400" in proc.stderr
