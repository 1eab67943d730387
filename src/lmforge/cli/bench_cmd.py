"""``lmforge bench TARGET``: load a server with streaming requests and report TTFT, ITL, TPOT,
end-to-end latency and throughput (definitions: docs/benchmarks.md)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from lmforge.cli.progress import note


def _numbers(text: str, kind: type[int] | type[float], name: str) -> list[Any]:
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = kind(part)
        except ValueError:
            raise click.BadParameter(
                f"{part!r} is not a {'whole ' if kind is int else ''}number (give e.g. 1,16,64)",
                param_hint=name,
            ) from None
        if not value > 0 or not math.isfinite(value):
            raise click.BadParameter(f"{part!r} must be a finite number greater than 0", param_hint=name)
        values.append(value)
    if not values:
        raise click.BadParameter("give at least one value", param_hint=name)
    return values


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary_table(records: list[dict[str, Any]]) -> str:
    """A plain-text table of the runs (one row each)."""
    head = (
        "load", "ok", "failed", "out tok/s", "req/s", "TTFT p50/p99 ms", "ITL p50/p99 ms", "TPOT p50 ms",
        "E2E p50 ms",
    )  # fmt: skip
    rows = [head]
    for rec in records:
        cfg = rec["config"]
        if cfg["request_rate"] is not None:
            load = f"{cfg['request_rate']:g} req/s"
            if cfg["max_concurrency"]:
                load += f" (max {cfg['max_concurrency']})"
        else:
            load = f"c={cfg['concurrency']}"
        ttft, itl = rec["ttft_ms"], rec["itl_ms"]
        rows.append(
            (
                load,
                str(rec["completed"]),
                str(rec["failed"]),
                f"{rec['output_throughput']:.0f}",
                f"{rec['request_throughput']:.2f}",
                f"{_fmt(ttft['p50'])} / {_fmt(ttft['p99'])}",
                f"{_fmt(itl['p50'], 2)} / {_fmt(itl['p99'], 2)}",
                _fmt(rec["tpot_ms"]["p50"], 2),
                _fmt(rec["e2el_ms"]["p50"], 0),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@click.command("bench")
@click.argument("target")
@click.option(
    "--api",
    type=click.Choice(["lmforge", "lmforge-sse", "openai", "openai-chat", "sagemaker"]),
    default="lmforge",
    show_default=True,
    help="lmforge: POST /invocations, jsonlines; lmforge-sse: the same as SSE; openai: /v1/completions, "
    "openai-chat: /v1/chat/completions (lmforge, vLLM and other OpenAI-compatible servers); "
    "sagemaker: TARGET is an endpoint name.",
)
@click.option("--concurrency", help="Fixed concurrency, one run per value: e.g. 1,16,64 [default: 1].")
@click.option("--request-rate", help="Requests per second (Poisson arrivals), one run per value: e.g. 2,8.")
@click.option(
    "--max-concurrency", type=click.IntRange(1), help="With --request-rate: at most this many in flight."
)
@click.option(
    "--num-requests", type=click.IntRange(1), default=64, show_default=True, help="Measured requests per run."
)
@click.option("--input-len", type=click.IntRange(1), default=32, show_default=True, help="Prompt tokens.")
@click.option(
    "--output-len",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Tokens to generate (EOS ignored).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the prompts and arrival times.")
@click.option(
    "--warmup",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Unmeasured requests before each run.",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Tokenizer folder (e.g. the model folder): prompts of exactly --input-len tokens, built as "
    "vLLM's random dataset builds them.",
)
@click.option("--model", help="Model name for --api openai (the request's `model`), recorded in the results.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the results (JSON) here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Draw a PNG here.")
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=600, show_default=True, help="Seconds per request."
)
@click.option("--region", help="AWS region (--api sagemaker).")
@click.option("--inference-component", help="InferenceComponentName (--api sagemaker).")
def bench_command(
    target: str,
    api: str,
    concurrency: str | None,
    request_rate: str | None,
    max_concurrency: int | None,
    num_requests: int,
    input_len: int,
    output_len: int,
    seed: int,
    warmup: int,
    tokenizer: Path | None,
    model: str | None,
    out: Path | None,
    plot_path: Path | None,
    timeout: float,
    region: str | None,
    inference_component: str | None,
) -> None:
    """Benchmark TARGET (a server URL, or a SageMaker endpoint name with --api sagemaker).

    \b
    lmforge bench http://127.0.0.1:8080 --concurrency 1,16,64 --out results.json --plot results.png
    lmforge bench http://127.0.0.1:8000 --api openai --model m --concurrency 16
    lmforge bench my-llm --api sagemaker --request-rate 4 --max-concurrency 16
    """
    from lmforge.bench import BenchConfig, Load, benchmark
    from lmforge.bench.prompts import load_tokenizer
    from lmforge.cli.progress import progress_bar

    loads = _loads(concurrency, request_rate, max_concurrency)
    _check_target(target, api, region, inference_component)
    if plot_path is not None and plot_path.suffix.lower() != ".png":
        raise click.BadParameter("the plot is a PNG: give a path ending in .png", param_hint="--plot")
    tok = None
    if tokenizer is not None:
        try:
            tok = load_tokenizer(tokenizer)
        except Exception as exc:
            raise click.BadParameter(
                f"cannot load a tokenizer from {tokenizer}: {exc}", param_hint="--tokenizer"
            ) from None
        special = tok.num_special_tokens_to_add()
        if special >= input_len:
            raise click.BadParameter(
                f"{input_len} is too short: the tokenizer adds {special} special token(s) itself",
                param_hint="--input-len",
            )
    config = BenchConfig(
        target=target,
        api=api,
        num_requests=num_requests,
        input_len=input_len,
        output_len=output_len,
        seed=seed,
        warmup=warmup,
        model=model,
        tokenizer=str(tokenizer) if tokenizer else None,
    )
    note(f"lmforge bench ({api}): {target}")
    note(f"  {num_requests} requests per run, {input_len} tokens in, {output_len} out, seed {seed}")
    if tok is None:
        note("  prompts: random words (about --input-len tokens; give --tokenizer DIR for exact lengths)")
    options: dict[str, Any] = {"timeout": timeout}
    if api == "sagemaker":
        options.update(region=region, inference_component=inference_component)
    with contextlib.ExitStack() as stack:
        advance: list[Callable[[int], None]] = []

        def on_start(load: Load) -> None:
            advance.append(stack.enter_context(progress_bar(f"  {load.label():<24}", num_requests)))

        def on_finish(_run: object) -> None:
            stack.close()
            advance.clear()

        try:
            records = benchmark(
                config,
                loads,
                tokenizer=tok,
                on_start=on_start,
                on_done=lambda _result: advance[-1](1),
                on_finish=on_finish,
                **options,
            )
        except KeyboardInterrupt:
            raise click.Abort from None
    click.echo(summary_table(records))
    failed = sum(r["failed"] for r in records)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"benchmark": "lmforge bench", "results": records}, indent=2) + "\n")
        note(f"results: {out}")
    if plot_path is not None:
        from lmforge.bench.plot import plot

        plot({f"{api} {target}": records}, plot_path, title=f"lmforge bench: {target}")
        note(f"plot: {plot_path}")
    _next_steps(records, failed, api, out, plot_path)
    if failed and all(r["completed"] == 0 for r in records):
        sys.exit(1)


def _loads(concurrency: str | None, request_rate: str | None, max_concurrency: int | None) -> list[Any]:
    from lmforge.bench import Load

    if concurrency is not None and request_rate is not None:
        raise click.UsageError(
            "give --concurrency or --request-rate, not both (cap a rate with --max-concurrency)"
        )
    if request_rate is not None:
        return [
            Load(request_rate=r, max_concurrency=max_concurrency)
            for r in _numbers(request_rate, float, "--request-rate")
        ]
    if max_concurrency is not None:
        raise click.BadParameter(
            "only applies with --request-rate; use --concurrency", param_hint="--max-concurrency"
        )
    return [Load(concurrency=c) for c in _numbers(concurrency or "1", int, "--concurrency")]


def _check_target(target: str, api: str, region: str | None, component: str | None) -> None:
    is_url = target.startswith(("http://", "https://"))
    if api == "sagemaker":
        if is_url:
            raise click.BadParameter(
                "with --api sagemaker, TARGET is an endpoint name, not a URL", param_hint="TARGET"
            )
        import boto3

        if region is None and boto3.session.Session().region_name is None:
            raise click.BadParameter(
                "no AWS region: give --region, or set AWS_REGION / AWS_DEFAULT_REGION",
                param_hint="--region",
            )
        return
    if not is_url:
        raise click.BadParameter(
            f"with --api {api}, TARGET is a server URL such as http://127.0.0.1:8080 "
            "(use --api sagemaker for an endpoint name)",
            param_hint="TARGET",
        )
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(target)
        port = parts.port
    except ValueError as exc:
        raise click.BadParameter(f"{target!r} is not a valid URL: {exc}", param_hint="TARGET") from None
    if not parts.hostname:
        raise click.BadParameter(f"{target!r} names no host", param_hint="TARGET")
    if port is not None and not 0 < port < 65536:
        raise click.BadParameter(f"{target!r}: port {port} is out of range", param_hint="TARGET")
    if region is not None or component is not None:
        raise click.UsageError("--region and --inference-component apply only to --api sagemaker")


def _next_steps(
    records: list[dict[str, Any]], failed: int, api: str, out: Path | None, plot_path: Path | None
) -> None:
    note("")
    if failed:
        first = next(e for r in records for e in r["errors"])
        note(f"{failed} request(s) failed; the first error: {first}")
        note("Check the server's log; lower --concurrency or raise the server's job_queue_size on 503s.")
    note("Next:")
    if out is None:
        note("  add --out results.json (and --plot results.png) to keep these figures")
    if not api.startswith("openai"):
        note("  compare with a peer on the same model: lmforge bench URL --api openai --model NAME ...")
    note("  metric definitions (vLLM's): docs/benchmarks.md")
