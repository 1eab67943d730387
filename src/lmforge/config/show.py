"""Text renderings of the configuration: ``lmforge config show`` and docs/configuration.md."""

from __future__ import annotations

import json
import typing
from typing import Any

from lmforge.config import sources
from lmforge.config.schema import ServingConfig, properties_keys
from lmforge.config.sources import ResolvedConfig


def _value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def render_config(resolved: ResolvedConfig) -> str:
    config = resolved.config
    rows = [("key", "value", "source")]
    for key, name in properties_keys().items():
        rows.append((key, _value(getattr(config, name)), str(resolved.provenance[key])))
    for key, value in sorted(resolved.extra_options.items()):
        rows.append((f"option.{key}", value, "unknown key, passed to the backend"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"model folder: {config.model_dir or '-'}"]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    for warning in resolved.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def _bounds(metadata: list[Any]) -> str:
    out = ""
    for m in metadata:
        for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(m, attr, None)
            if value is not None:
                out += f"{op}{value}"
    return out


def _pretty_type(name: str) -> str:
    """A short type for the docs table, e.g. ``int>=1 | max``."""
    info = ServingConfig.model_fields[name]
    parts = []
    for arg in typing.get_args(info.annotation) if typing.get_origin(info.annotation) else (info.annotation,):
        if arg is type(None):
            continue
        if typing.get_origin(arg) is typing.Literal:
            parts.append(" \\| ".join(str(a) for a in typing.get_args(arg)))
        elif typing.get_origin(arg) is typing.Annotated:
            inner, *meta = typing.get_args(arg)
            parts.append(inner.__name__ + _bounds([m for f in meta for m in getattr(f, "metadata", [f])]))
        else:
            parts.append(getattr(arg, "__name__", str(arg)).replace("typing.", ""))
    top = _bounds(info.metadata)
    return " \\| ".join(p + top if p in ("int", "float") else p for p in parts)


PRECEDENCE = (sources.__doc__ or "").split("\n\n", 1)[1].strip()


def render_reference_markdown() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `lmforge.config.ServingConfig` (`tests/unit/test_config_schema.py` keeps this file",
        "equal to it). Set keys in the model folder's `serving.properties` (Java properties syntax) or",
        "through LMI's environment variables.",
        "",
        "| key | type | default | description |",
        "| --- | --- | --- | --- |",
    ]
    for key, name in properties_keys().items():
        info = ServingConfig.model_fields[name]
        lines.append(f"| `{key}` | {_pretty_type(name)} | `{_value(info.default)}` | {info.description} |")
    lines += [
        "",
        'Unknown `option.*` keys give a warning (with a "did you mean" hint) and are passed to the',
        "backend; an invalid value stops the server with a message naming the file and line (or the",
        "environment variable), the key, the value and what was expected.",
        "",
        "## Precedence",
        "",
        PRECEDENCE,
        "",
    ]
    return "\n".join(lines)
