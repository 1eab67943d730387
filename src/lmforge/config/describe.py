"""Descriptions derived from :class:`~lmforge.config.schema.ServingConfig`'s annotations: the
properties keys, the type labels of the docs table and the "expected ..." part of error messages."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import annotated_types
from pydantic.fields import FieldInfo

from lmforge.config.schema import ALIASES, ServingConfig


def properties_keys() -> dict[str, str]:
    """properties key -> field name, for every field set by a properties key (in schema order)."""
    out: dict[str, str] = {}
    for name, info in ServingConfig.model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and "key" in extra:
            out[str(extra["key"])] = name
    return out


# --- type descriptions (error messages and the docs), derived from the annotations ---------------


@dataclass(frozen=True)
class _Alternative:
    kind: Literal["int", "float", "bool", "str", "object", "choice"]
    bounds: tuple[tuple[str, Any], ...] = ()
    choices: tuple[str, ...] = ()


_BOUND_OPS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _bounds(metadata: list[Any]) -> tuple[tuple[str, Any], ...]:
    out: list[tuple[str, Any]] = []
    for item in metadata:
        for m in item.metadata if isinstance(item, FieldInfo) else [item]:
            if isinstance(
                m, annotated_types.Ge | annotated_types.Gt | annotated_types.Le | annotated_types.Lt
            ):
                out.extend((op, getattr(m, attr)) for attr, op in _BOUND_OPS if hasattr(m, attr))
    return tuple(out)


def _alternatives(name: str) -> list[_Alternative]:
    info = ServingConfig.model_fields[name]
    annotation: Any = info.annotation
    outer: list[Any] = list(info.metadata)  # pydantic moves a top-level Annotated's metadata here
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args: tuple[Any, ...] = typing.get_args(annotation)
    else:
        args = (annotation,)
    out: list[_Alternative] = []
    for arg in args:
        if arg is type(None):
            continue
        metadata = list(outer)
        if typing.get_origin(arg) is Annotated:
            arg, *inner = typing.get_args(arg)
            metadata += inner
        if typing.get_origin(arg) is Literal:
            out.append(_Alternative("choice", choices=tuple(str(a) for a in typing.get_args(arg))))
        elif arg is bool:
            out.append(_Alternative("bool"))
        elif arg is int:
            out.append(_Alternative("int", bounds=_bounds(metadata)))
        elif arg is float:
            out.append(_Alternative("float", bounds=_bounds(metadata)))
        elif arg is str:
            out.append(_Alternative("str"))
        elif typing.get_origin(arg) is dict:
            out.append(_Alternative("object"))
        else:
            raise TypeError(f"no description for the type of {name}: {arg!r}")
    return out


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def type_label(name: str) -> str:
    """A short type for the docs table, e.g. ``int >= 1 | max``."""
    parts: list[str] = []
    for alt in _alternatives(name):
        if alt.kind == "choice":
            parts.extend(alt.choices)
        elif alt.kind == "object":
            parts.append("JSON object")
        else:
            parts.append(
                " ".join([alt.kind, " and ".join(f"{op} {_num(v)}" for op, v in alt.bounds)]).strip()
            )
    return " | ".join(parts)


def expectation(name: str) -> str:
    """What a value of the field must look like, for error messages: ``an integer >= 1 or 'max'``."""
    parts: list[str] = []
    for alt in _alternatives(name):
        bounds = " and ".join(f"{op} {_num(v)}" for op, v in alt.bounds)
        if alt.kind == "int":
            parts.append(f"an integer {bounds}".rstrip())
        elif alt.kind == "float":
            parts.append(f"a number {bounds}".rstrip())
        elif alt.kind == "bool":
            parts.append("a boolean (true/false, 1/0, yes/no)")
        elif alt.kind == "str":
            parts.append("a string")
        elif alt.kind == "object":
            parts.append("a JSON object")
        elif len(alt.choices) == 1:
            parts.append(repr(alt.choices[0]))
        else:
            text = "one of " + ", ".join(alt.choices)
            aliases = ALIASES.get(name)
            if aliases:
                text += " (or " + ", ".join(f"{a} for {c}" for a, c in aliases.items()) + ")"
            parts.append(text)
    return " or ".join(parts)
