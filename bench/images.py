"""Image figures: sizes, cold build, rebuild after a change to ``src/`` only, and start-up of the
container vs the same server as a host process.

For each flavour built here (cpu, vllm-cpu; the GPU flavours need a GPU machine):

* ``cold_build_s``: ``lmforge container build FLAVOUR`` in an image store of its own (podman
  ``--root``) that holds only the base image: every layer, every pip download through the building
  machine's package index;
* ``size_bytes``: what the engine reports for the image;
* ``rebuild_src_s``: a second build after one line of ``src/`` changed (a copy of the tree, so the
  checkout is untouched): the dependency layers must come from the cache;
* ``start``: time from ``run`` (podman/docker) to ``/ping`` 200 on the tiny model, vs the same
  server started as a host process (``python -m lmforge.container.entrypoint serve``), median of
  ``--repeats`` interleaved starts each, and their ratio (goal: container <= 1.2x).

Goals (issue 13): cpu <= 1.5 GB, vllm-cpu <= 4 GB, rebuild <= 60 s, start ratio <= 1.2.

Usage: python -m bench.images [--flavours cpu,vllm-cpu] [--repeats 5] [--out bench/results/images.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import record
from lmforge.bench.results import machine, versions
from lmforge.container.base import build_base
from lmforge.container.build import build_flavour, resolve_base
from lmforge.container.engine import ContainerEngine, EngineError, detect
from lmforge.container.flavours import load_flavour
from lmforge.process import free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = record.RESULTS
NAME = "images"
GOALS = {"cpu_size_gb": 1.5, "vllm_cpu_size_gb": 4.0, "rebuild_src_s": 60.0, "start_ratio": 1.2}
ENV = {"OMP_NUM_THREADS": "1", "OPTION_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _wait_ping(port: int, timeout: float = 300.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic()
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"/ping on {port} never answered 200")


def container_start(engine: ContainerEngine, image: str, model: Path) -> float:
    """Seconds from ``run`` to /ping 200 (the published port, as SageMaker maps 8080)."""
    port = free_port()
    name = f"lmforge-bench-{port}"
    args = engine.argv(*engine.run_args(), "--detach", "--name", name, "--shm-size", "1g")
    args += ["--publish", f"127.0.0.1:{port}:8080", "--volume", f"{model}:/opt/ml/model:ro"]
    args += [f"--env={k}={v}" for k, v in ENV.items()]
    started = time.monotonic()
    subprocess.run([*args, image, "serve"], check=True, capture_output=True)
    try:
        return _wait_ping(port) - started
    finally:
        engine.stop(name, 30)
        engine.remove_container(name)


def process_start(model: Path) -> float:
    """Seconds from starting the same entrypoint as a host process to /ping 200."""
    port = free_port()
    env = {**os.environ, **ENV, "SAGEMAKER_BIND_TO_PORT": str(port), "LMFORGE_HOST": "127.0.0.1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmforge.container.entrypoint", "serve", str(model)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return _wait_ping(port) - started
    finally:
        proc.terminate()
        proc.wait(30)


def _tree_copy(dest: Path) -> Path:
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("src", "templates", "containers"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def measure_flavour(engine: ContainerEngine, name: str, model: Path, repeats: int) -> dict[str, Any]:
    tag = f"localhost/lmforge-bench/{name}:cold"
    _say(f"== {name}: cold build (--no-cache)")
    cold = build_flavour(name, engine, _say, tag=tag, no_cache=True)
    out: dict[str, Any] = {
        "flavour": name,
        "base_image": cold.base_image,
        "cold_build_s": round(cold.seconds, 1),
        "size_bytes": cold.size_bytes,
        "size_gb": round(cold.size_bytes / 1e9, 3),
    }
    with tempfile.TemporaryDirectory() as tmp:
        tree = _tree_copy(Path(tmp))
        probe = tree / "src" / "lmforge" / "container" / "__init__.py"
        probe.write_text(probe.read_text() + f"# rebuild probe {time.time()}\n")
        _say(f"== {name}: rebuild after a one-line change in src/")
        again = build_flavour(name, engine, _say, tag=tag, root=tree)
        out["rebuild_src_s"] = round(again.seconds, 1)
    if name == "cpu":
        containers, processes = [], []
        for i in range(repeats):
            _say(f"== {name}: start {i + 1}/{repeats} (container, then host process)")
            containers.append(container_start(engine, tag, model))
            processes.append(process_start(model))
        c, p = statistics.median(containers), statistics.median(processes)
        out["start"] = {
            "container_s": [round(x, 2) for x in containers],
            "process_s": [round(x, 2) for x in processes],
            "container_median_s": round(c, 2),
            "process_median_s": round(p, 2),
            "ratio": round(c / p, 3),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flavours", default="cpu,vllm-cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / f"{NAME}.json")
    args = parser.parse_args(argv)
    main_engine = detect(args.engine)
    flavours = [f.strip() for f in args.flavours.split(",") if f.strip()]
    bases = {resolve_base(main_engine, load_flavour(f), None)[0] for f in flavours}
    if any(not main_engine.image_exists(b) for b in bases):
        bases = {build_base(main_engine, _say)}
    from lmforge.models.example import write_example_model

    results = []
    with tempfile.TemporaryDirectory(prefix="lmforge-bench-images-", ignore_cleanup_errors=True) as tmp:
        model = write_example_model(Path(tmp) / "model")
        # podman: a store of its own, holding only the base images, so that "cold" is cold and the
        # rebuild finds exactly the layers the cold build made (docker: --no-cache in its own store)
        engine = main_engine.with_store(Path(tmp) / "store") if main_engine.kind == "podman" else main_engine
        for base in bases:
            if engine is not main_engine:
                archive = Path(tmp) / "base.tar"
                main_engine.save(base, archive)
                engine.run_cli(["load", "--input", str(archive)], what=f"loading {base}")
                archive.unlink()
        try:
            for name in flavours:
                results.append(measure_flavour(engine, name, model, args.repeats))
        finally:
            if engine is not main_engine:  # the folder goes with the temporary directory
                try:
                    engine.run_cli(["rmi", "--all", "--force"], what="emptying the bench's image store")
                except EngineError as exc:
                    _say(f"warning: {exc}")
    by = {r["flavour"]: r for r in results}
    checks = {}
    if "cpu" in by:
        checks["cpu_size_gb"] = by["cpu"]["size_gb"] <= GOALS["cpu_size_gb"]
        checks["start_ratio"] = by["cpu"]["start"]["ratio"] <= GOALS["start_ratio"]
    if "vllm-cpu" in by:
        checks["vllm_cpu_size_gb"] = by["vllm-cpu"]["size_gb"] <= GOALS["vllm_cpu_size_gb"]
    checks["rebuild_src_s"] = all(r["rebuild_src_s"] <= GOALS["rebuild_src_s"] for r in results)
    result = {
        "name": NAME,
        "command": ["python", "-m", "bench.images", *(argv if argv is not None else sys.argv[1:])],
        "engine": {"kind": main_engine.kind, "version": main_engine.version(), "separate_store": True},
        "machine": machine(),
        "versions": versions(),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "goals": GOALS,
        "flavours": results,
        "met": checks,
        # summary ratio for docs/performance.md: the worst figure relative to its goal (>= 1 is met)
        "ratio": round(
            min(
                [GOALS["rebuild_src_s"] / max(r["rebuild_src_s"], 1e-9) for r in results]
                + ([GOALS["start_ratio"] / by["cpu"]["start"]["ratio"]] if "cpu" in by else [])
                + ([GOALS["cpu_size_gb"] / by["cpu"]["size_gb"]] if "cpu" in by else [])
                + ([GOALS["vllm_cpu_size_gb"] / by["vllm-cpu"]["size_gb"]] if "vllm-cpu" in by else [])
            ),
            3,
        ),
    }
    record.write(args.out, result, section)
    print(report(result))
    return 0


def report(result: dict[str, Any]) -> str:
    """The markdown section for docs/performance.md."""
    goals = result["goals"]
    lines = [
        "## Container images (`bench/images.py`, `make bench-images`)",
        "",
        f"Built with {result['engine']['kind']} {result['engine']['version']} on the base named per row, in "
        "an image store of the benchmark's own that holds only that base: cold = the first build (every pip "
        "download through the building machine's index), rebuild = the next build after a one-line change "
        "in `src/`. Start = `run` to `/ping` 200 on the tiny model vs the same entrypoint "
        f"as a host process (median). Goals: cpu <= {goals['cpu_size_gb']} GB, vllm-cpu <= "
        f"{goals['vllm_cpu_size_gb']} GB, rebuild <= {goals['rebuild_src_s']:.0f} s, start ratio <= "
        f"{goals['start_ratio']}. Result: `bench/results/{result['name']}.json`.",
        "",
        "| flavour | size | cold build | rebuild after src/ change | start: container / process |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in result["flavours"]:
        start = r.get("start")
        start_text = (
            f"{start['container_median_s']:.2f} s / {start['process_median_s']:.2f} s "
            f"= **{start['ratio']:.2f}x**"
            if start
            else "-"
        )
        lines.append(
            f"| {r['flavour']} | **{r['size_gb']:.2f} GB** | {r['cold_build_s']:.0f} s | "
            f"**{r['rebuild_src_s']:.0f} s** | {start_text} |"
        )
    met = result["met"]
    lines += ["", "Goals: " + ", ".join(f"{k} {'met' if v else '**missed**'}" for k, v in met.items()) + "."]
    return "\n".join(lines) + "\n"


def section(result: dict[str, Any]) -> dict[str, Any]:
    what = "image size, rebuild and start goals / measured, worst"
    summary = [record.summary_row(f"Images ({what})", result["ratio"], float(result.get("target", 1.0)))]
    return record.section(record.ORDER["images"], report(result), summary)


if __name__ == "__main__":
    raise SystemExit(main())
