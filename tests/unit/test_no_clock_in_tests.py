"""No test times the machine (tests/clock_check.py says what counts): the suite as it is, and the
check itself on planted cases, among them the shapes that were in the suite before it was fixed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.clock_check import check_source, check_tree, is_duration_name

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_module_asserts_on_a_clock_or_sleeps_as_one() -> None:
    findings = check_tree(TESTS)
    assert not findings, (
        "judge by what happened (a log line, a counter, the order of events), not by how long it "
        "took; timings belong in bench/:\n" + "\n".join(map(str, findings))
    )


def _found(source: str) -> list[tuple[int, str]]:
    return [(f.line, f.kind) for f in check_source(textwrap.dedent(source))]


# Each planted case: the source, and the (line, kind) findings it must give. The first ones are the
# shapes the suite had (test_vllm_compile.py, test_vllm.py, test_server.py, test_local_sagemaker.py,
# test_load.py, test_local_ecr.py, test_http_contract.py, test_package.py).
PLANTED = {
    "a ratio of two durations read from logs": (
        """
        def _init_seconds(log):
            return float(log.split()[-1])

        def test_hit(log, compile_log):
            assert _init_seconds(log) < _init_seconds(compile_log) / 3
        """,
        [(6, "assert")],
    ),
    "a bound on a clock difference": (
        """
        import time

        def test_stop(container):
            started = time.monotonic()
            assert container.sigterm() == 0
            assert time.monotonic() - started < 30
        """,
        [(7, "assert")],
    ),
    "CPU seconds over a sleep": (
        """
        import time

        def test_idle(worker):
            before = sum(worker.cpu_times()[:2])
            time.sleep(0.9)
            spent = sum(worker.cpu_times()[:2]) - before
            assert spent < 0.15
        """,
        [(6, "sleep"), (8, "assert")],
    ),
    "readings gathered in a list": (
        """
        import time

        def test_handshakes(connect):
            handshakes = []
            for _ in range(3):
                t0 = time.perf_counter()
                connect()
                handshakes.append(time.perf_counter() - t0)
            assert min(handshakes) < 0.25, handshakes
        """,
        [(10, "assert")],
    ),
    "a place of a returned tuple": (
        """
        import time

        def _stream(client):
            start = time.monotonic()
            objs, times = [], []
            for obj in client:
                objs.append(obj)
                times.append(time.monotonic() - start)
            return objs, times

        def test_first_event(client):
            objs, times = _stream(client)
            assert len(objs) == 300
            assert times[-1] - times[0] > 0.05
        """,
        [(15, "assert")],
    ),
    "a duration by its name": (
        """
        def test_record(rec, result):
            assert rec["wall_s"] < 5
            assert result.took <= 2.0
            assert result.elapsed_seconds < result.budget
        """,
        [(3, "assert"), (4, "assert"), (5, "assert")],
    ),
    "a timestamp against now": (
        """
        from datetime import UTC, datetime, timedelta

        def test_token(data):
            assert data["expiresAt"] - datetime.now(UTC) > timedelta(hours=11, minutes=59)
        """,
        [(5, "assert")],
    ),
    "a bound after a wait, outside the loop": (
        """
        import time

        def test_drain(srv):
            sent = time.monotonic()
            code = srv.wait()
            exited = time.monotonic() - sent
            assert code == 0
            assert exited < 12
        """,
        [(9, "assert")],
    ),
    "a sleep once a case, in a loop that does not poll": (
        """
        import time

        def test_cases(cases, srv):
            for case in cases:
                srv.send(case)
                time.sleep(0.5)
                assert srv.alive()
        """,
        [(7, "sleep")],
    ),
    "sleeps as clocks": (
        """
        import asyncio
        import time

        def test_signal(srv):
            time.sleep(0.3)
            srv.stop()

        async def test_expiry(client):
            await asyncio.sleep(1.1)
        """,
        [(6, "sleep"), (10, "sleep")],
    ),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_a_planted_clock_is_found(name: str) -> None:
    source, expected = PLANTED[name]
    assert _found(source) == expected


ALLOWED = {
    "a hang guard on a polled wait": """
        import time

        def test_restart(sm):
            deadline = time.monotonic() + 120
            while sm.status() != "InService":
                assert time.monotonic() < deadline, "not restarted"
                time.sleep(0.5)
        """,
    "a stamp between two readings": """
        from datetime import UTC, datetime, timedelta

        def test_pushed(client):
            before = datetime.now(UTC)
            detail = client.push()
            assert before <= detail["imagePushedAt"] <= datetime.now(UTC) + timedelta(seconds=1)
        """,
    "a figure recorded": """
        def test_build(result, summary):
            assert result.seconds > 0 and summary["wall_s"] >= 0
        """,
    "durations worked out from fixed data, and settings": """
        import pytest

        def test_plan(plan, compiled, plain):
            assert plan.download_s == pytest.approx(107.1)
            assert compiled.health_check_timeout_s < plain.health_check_timeout_s
            assert VLLM_CPU_COMPILED_START_S < VLLM_CPU_START_S
            assert roofline_tokens_per_s(1, 2) < 3
        """,
    "a deadline handed on, not compared": """
        import time

        def test_relay(relay):
            out, ends = relay(time.monotonic() + 60)
            assert out == b"0\\r\\n\\r\\n" and ends == []
        """,
    "sleeps that poll, yield, pace or play a slow peer": """
        import asyncio
        import time

        async def test_poll(ready, rng):
            while not ready():
                time.sleep(0.05)
            await asyncio.sleep(0)
            await asyncio.sleep(rng.uniform(0, 0.3))  # sleep-ok: the client goes away at a random moment
        """,
}


@pytest.mark.parametrize("name", list(ALLOWED))
def test_what_does_not_time_the_machine_is_left_alone(name: str) -> None:
    assert _found(ALLOWED[name]) == []


def test_duration_names() -> None:
    for name in ("init_seconds", "took", "wall_s", "cpu_ms", "elapsed", "ttft_latency", "_seconds"):
        assert is_duration_name(name), name
    for name in ("health_check_timeout_s", "tokens_per_s", "MAX_S", "cpu_image", "status", "sessions"):
        assert not is_duration_name(name), name
