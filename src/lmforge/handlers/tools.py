"""OpenAI tool calling and structured output: request shapes and the grammar a request implies (the
tool calls are read back from the generated text by :mod:`lmforge.handlers.tool_calls`).

What lmforge serves (the same on every engine, since the constraint is a grammar the engine follows):

* ``response_format``: ``text``; ``json_object`` (any JSON object); ``json_schema`` (the schema).
* ``tools`` with ``tool_choice``: a named function (the reply is that function's arguments, as JSON
  that follows its ``parameters`` schema), ``required`` (a JSON array of one or more calls of the
  given functions, ``[{"name": ..., "parameters": {...}}]``, the shape vLLM uses), or ``none``.
  ``auto`` (the default with tools) lets the model decide; it needs the model family's tool-call
  syntax (``option.enable_auto_tool_choice`` and ``option.tool_call_parser``, read by
  :mod:`lmforge.handlers.reply_parsing`), and is a 400 saying so where the server has none.

The chat template receives ``tools`` (templates that know tools render them for the model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lmforge.engines.protocol import StructuredOutput
from lmforge.errors import BadRequestError
from lmforge.handlers.request_common import STRICT
from lmforge.handlers.tool_calls import ToolCallMode

MAX_TOOLS = 128
FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]


class FunctionDefinition(BaseModel):
    model_config = STRICT
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDefinition


class _NamedFunction(BaseModel):
    model_config = STRICT
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: _NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
Tools = Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)]


def template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """``tools`` as the chat template receives them (None: no tools)."""
    return [t.model_dump(exclude_none=True) for t in tools] if tools else None


class TextFormat(BaseModel):
    model_config = STRICT
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = STRICT
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: FunctionName
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


@dataclass(frozen=True)
class Constraint:
    """The grammar a request asks the engine for, and the request field it came from (what a 400 for
    it names: ``response_format``, ``response_format.json_schema.schema`` or ``tools``)."""

    output: StructuredOutput
    field: str


def parse_json_schema(schema: Any, param: str) -> str:
    """A request's JSON schema as canonical JSON text (a JSON object, or a 400 naming ``param``)."""
    if not isinstance(schema, dict):
        raise BadRequestError(f"{param}: a JSON schema must be a JSON object", param=param)
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def _arguments_schema(function: FunctionDefinition) -> dict[str, Any]:
    # no parameters schema: any JSON object of arguments
    return function.parameters if function.parameters is not None else {"type": "object"}


def tool_plan(
    tools: list[Tool] | None, choice: ToolChoice | None, parallel: bool | None, *, auto: bool = False
) -> tuple[ToolCallMode | None, Constraint | None]:
    """What a chat request's ``tools`` and ``tool_choice`` ask for: the mode a forced call is read in,
    and the grammar the text must follow (None for both: a plain answer, or with ``auto`` enabled
    (``option.enable_auto_tool_choice``) a reply whose calls the tool-call parser reads)."""
    if choice is not None and not tools and choice != "none":
        raise BadRequestError("tool_choice needs tools", param="tool_choice")
    if not tools or choice == "none":
        return None, None
    if choice is None or choice == "auto":
        if auto:
            return None, None
        raise BadRequestError(
            'tool_choice "auto" (the default when tools are given) needs the model\'s tool-call syntax: '
            "the server sets option.enable_auto_tool_choice=true and option.tool_call_parser; or name "
            'the function ({"type": "function", "function": {"name": ...}}) or send tool_choice "required"',
            param="tool_choice",
        )
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise BadRequestError("tools: function names must be unique", param="tools")
    if isinstance(choice, NamedToolChoice):
        wanted = next((t.function for t in tools if t.function.name == choice.function.name), None)
        if wanted is None:
            raise BadRequestError(
                f"tool_choice names {choice.function.name!r}, which is not among tools ({', '.join(names)})",
                param="tool_choice",
            )
        schema = parse_json_schema(_arguments_schema(wanted), "tools")
        return ToolCallMode(named=wanted.name), Constraint(StructuredOutput("json_schema", schema), "tools")
    # "required": an array of calls, each one of the tools with its own arguments
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [t.function.name]},
                    "parameters": _arguments_schema(t.function),
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    array: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
    if parallel is False:
        array["maxItems"] = 1
    constraint = Constraint(StructuredOutput("json_schema", parse_json_schema(array, "tools")), "tools")
    return ToolCallMode(named=None), constraint


def response_format_constraint(
    fmt: TextFormat | JsonObjectFormat | JsonSchemaFormat | None,
) -> Constraint | None:
    """The grammar ``response_format`` asks for (None for text)."""
    if fmt is None or isinstance(fmt, TextFormat):
        return None
    if isinstance(fmt, JsonObjectFormat) or fmt.json_schema.schema_ is None:
        return Constraint(StructuredOutput("json_object"), "response_format")
    param = "response_format.json_schema.schema"
    schema = parse_json_schema(fmt.json_schema.schema_, param)
    return Constraint(StructuredOutput("json_schema", schema), param)
