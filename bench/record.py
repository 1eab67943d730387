"""The one record format of bench/results: every ``<name>.json`` a scenario writes carries, beside its
raw figures, a ``report`` object, which is all that bench.report reads to put the result on
docs/performance.md:

``order``
    where its section goes on the page (scenarios number themselves: :data:`ORDER`)
``title``
    the section's heading
``body``
    the section: a list of blocks, ``{"text": markdown}`` or ``{"table": {"head": [...], "rows": [[...]]}}``
``summary``
    rows of the page's summary table: ``{"scenario", "figure", "target", "ratio"}`` (ratio >= 1: met)
``compare``
    rows of the tiny-model vs real-weights table: ``{"model": "tiny"|"real", "rows": [[figure, value]]}``

A scenario builds the object with :func:`section` from the markdown it renders out of its own figures
(its ``report(result)``), and writes the file with :func:`write`. Findings written by hand about a
result (``notes``, ``compare_notes``: what a change was worth, what a run found) are data of that
result: a scenario renders them into its section, and :func:`write` keeps those of the file it
replaces when the new result brings none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

Result = dict[str, Any]

#: the place of each scenario's sections on the page (a model variant adds 1, 2, ...)
ORDER = {
    "serving_throughput": 100,
    "streaming_ceiling": 200,
    "batching": 300,
    "cold_start": 400,
    "lmi_dist_attention": 500,
    "frontend_overhead": 600,
    "vllm_bench_parity": 700,
    "engines": 800,
    "soak": 900,
    "lm_eval_parity": 1000,
    "lora": 1100,
    "sessions": 1200,
    "routing": 1300,
    "cpu_linear": 1400,
    "scale_out": 1500,
    "images": 1600,
    "gpu_smoke": 1700,
    "gpu_roofline": 1800,
    "quant_kernels": 1900,
    "quantized": 2000,
    "speculative": 2100,
}

#: hand-written findings a rerun keeps (see the module's docstring)
KEPT = ("notes", "compare_notes")

_CELL = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _CELL.split(line.strip())[1:-1]]


def blocks(markdown: str) -> list[dict[str, Any]]:
    """Markdown -> text and table blocks (a table: consecutive lines starting with ``|``, the second
    one its ``| --- |`` separator)."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    lines = markdown.strip("\n").split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: "):
            if "\n".join(text).strip():
                out.append({"text": "\n".join(text).strip("\n")})
            text = []
            head = _cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append({"table": {"head": head, "rows": rows}})
            continue
        text.append(lines[i])
        i += 1
    if "\n".join(text).strip():
        out.append({"text": "\n".join(text).strip("\n")})
    return out


def table(head: list[str], rows: list[list[str]]) -> str:
    line = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
    return "\n".join([line(head), "| " + " | ".join("---" for _ in head) + " |", *map(line, rows)])


def render(body: list[dict[str, Any]]) -> str:
    """A section's blocks -> markdown."""
    parts = []
    for b in body:
        if "table" in b:
            parts.append(table(b["table"]["head"], b["table"]["rows"]))
        else:
            parts.append(b["text"])
    return "\n\n".join(parts)


def summary_row(scenario: str, value: float, target: float, unit: str = "x") -> dict[str, Any]:
    """A summary row for a ratio that meets its target at >= ``target``."""
    return {
        "scenario": scenario,
        "figure": f"{value:.2f}{unit}",
        "target": f">= {target}{unit}",
        "ratio": value / target,
    }


def section(
    order: int,
    markdown: str,
    summary: list[dict[str, Any]] | None = None,
    compare: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``report`` object of a result from its section's markdown (which starts with ``## title``)."""
    head, _, rest = markdown.strip("\n").partition("\n")
    if not head.startswith("## "):
        raise ValueError(f"a section starts with its '## ' heading, not {head!r}")
    out: dict[str, Any] = {"order": order, "title": head[3:].strip(), "body": blocks(rest)}
    if summary:
        out["summary"] = summary
    if compare and compare.get("rows"):
        out["compare"] = compare
    return out


def write(out: Path, result: Result, make_section: Callable[[Result], dict[str, Any]]) -> None:
    """Write ``result`` with its ``report`` object to ``out``, keeping the hand-written findings
    (:data:`KEPT`) of the file it replaces where the new result has none."""
    if out.exists():
        try:
            old = json.loads(out.read_text())
        except ValueError:
            old = {}
        for key in KEPT:
            if key not in result and old.get(key):
                result[key] = old[key]
                print(f"{out.name}: kept the {key} of the result it replaces (edit them in the file)")
    result["report"] = make_section(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
