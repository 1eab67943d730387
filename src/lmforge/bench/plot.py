"""A PNG of benchmark results: throughput and latencies against concurrency (or request rate),
one line per series (e.g. lmforge and a peer). matplotlib is imported here only, with the Agg
backend, so the rest of ``lmforge bench`` needs no display and no matplotlib."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PANELS = (
    ("output_throughput", None, "output tokens/s"),
    ("ttft_ms", "p50", "TTFT p50 (ms)"),
    ("itl_ms", "p50", "ITL p50 (ms)"),
    ("e2el_ms", "p50", "end-to-end latency p50 (ms)"),
)


def x_value(record: Mapping[str, Any]) -> tuple[str, float]:
    config = record["config"]
    if config.get("request_rate") is not None:
        return "request rate (req/s)", float(config["request_rate"])
    return "concurrency", float(config["concurrency"])


def plot(series: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, title: str = "") -> Path:
    """Draw ``series`` (label -> run records) into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    xlabel = "concurrency"
    for ax, (key, stat, name) in zip(axes.flat, PANELS, strict=True):
        for label, records in series.items():
            points = []
            for rec in records:
                xlabel, x = x_value(rec)
                value = rec[key] if stat is None else rec[key].get(stat)
                if value is not None:
                    points.append((x, float(value)))
            points.sort()
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        xs = [x_value(rec)[1] for records in series.values() for rec in records]
        if xs and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(set(xs)), [f"{x:g}" for x in sorted(set(xs))])
            ax.minorticks_off()
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        if len(series) > 1:
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
