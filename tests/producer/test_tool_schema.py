"""Every tool schema the MCP server lists stays in the subset the major agent hosts load.

Anthropic's API refuses combinators at the top of a tool's input schema; Gemini's function
declarations take an OpenAPI subset (no `$ref`, `const`, `oneOf`/`allOf`/`not`, type lists
or `additionalProperties`); OpenAI wants an object at the root. One walker checks all of it.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from taskcard.producers.task_card.envelope import ACTIONS
from taskcard.producers.task_card.mcp_server import TOOLS

ALLOWED_KEYS = {
    "type",
    "properties",
    "required",
    "enum",
    "description",
    "items",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "title",
}
ALLOWED_TYPES = {"object", "string", "number", "integer", "boolean", "array"}


def rejected_constructs(schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every place where a major host would refuse the schema."""
    problems: list[str] = []
    problems += [f"{path}.{key}" for key in schema if key not in ALLOWED_KEYS]
    kind = schema.get("type")
    if not isinstance(kind, str) or kind not in ALLOWED_TYPES:
        problems.append(f"{path}.type={kind!r}")
    for name, sub in schema.get("properties", {}).items():
        problems += rejected_constructs(sub, f"{path}.properties.{name}")
    if "items" in schema:
        problems += rejected_constructs(schema["items"], f"{path}.items")
    for name in schema.get("required", []):
        if name not in schema.get("properties", {}):
            problems.append(f"{path}.required names unknown {name!r}")
    return problems


def test_the_walker_catches_what_hosts_reject() -> None:
    bad = {
        "type": "object",
        "oneOf": [],
        "properties": {
            "a": {"type": ["string", "null"]},
            "b": {"$ref": "#/$defs/B"},
            "c": {"type": "object", "additionalProperties": False},
            "d": {"const": 1},
        },
    }
    assert rejected_constructs(bad) == [
        "$.oneOf",
        "$.properties.a.type=['string', 'null']",
        "$.properties.b.$ref",
        "$.properties.b.type=None",
        "$.properties.c.additionalProperties",
        "$.properties.d.const",
        "$.properties.d.type=None",
    ]


@pytest.mark.parametrize("tool", TOOLS, ids=lambda tool: tool.name)
def test_every_listed_input_schema_loads_in_every_major_host(tool: Any) -> None:
    schema = tool.input_schema
    assert schema["type"] == "object"
    assert rejected_constructs(schema) == []
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("tool", TOOLS, ids=lambda tool: tool.name)
def test_every_output_schema_is_an_object_schema(tool: Any) -> None:
    assert tool.output_schema["type"] == "object"
    jsonschema.Draft202012Validator.check_schema(tool.output_schema)


def test_task_card_input_schema_describes_the_envelope() -> None:
    (tool,) = [tool for tool in TOOLS if tool.name == "task_card"]
    properties = tool.input_schema["properties"]
    assert properties["action"]["enum"] == list(ACTIONS)
    assert set(properties) == {"action", "input", "reasoning", "summarize"}
    assert properties["input"]["type"] == "object"
