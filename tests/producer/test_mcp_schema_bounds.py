"""The bounds the MCP tools list are the bounds their servers enforce.

Driven with the SDK's real stdio client against `taskcard mcp`: for every bounded field, a value
at the listed bound is valid for the schema and accepted by the server, and a value past it is
invalid for the schema and refused by the server with a message naming the field. The ledger
listed `minimum: 0` and no ceiling for limits the store refuses past ten years or 1000 (and a
`nudge_after_sec` of 0 it refuses), no length for its ids and texts; `report` and `spawn` listed
no length for `role`, `reason`, `provider` or `parent`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema

from .conftest import CliHost

Arguments = Callable[[Any, int], dict[str, Any]]


def _init(field: str) -> Arguments:
    return lambda value, n: {"command": "init", "task_id": f"t{n}", "purpose": "p", field: value}


# (tool, field, the call that carries the value: a fresh task or child for every call)
BOUNDED: list[tuple[str, str, Arguments]] = [
    *(
        ("ledger", field, _init(field))
        for field in (
            "nudge_after_sec",
            "timeout_sec",
            "heartbeat_every_sec",
            "renotify_sec",
            "external_max_wait_sec",
            "max_nudges",
            "max_retries",
        )
    ),
    ("ledger", "task_id", lambda v, n: {"command": "init", "task_id": v, "purpose": "p"}),
    ("ledger", "purpose", lambda v, n: {"command": "init", "task_id": f"t{n}", "purpose": v}),
    ("ledger", "note", lambda v, n: {"command": "heartbeat", "task_id": "base", "note": v}),
    (
        "ledger",
        "reason",
        lambda v, n: {
            "command": "block",
            "task_id": "base",
            "kind": "OTHER",
            "reason": v,
            "safe_next_step": "wait",
        },
    ),
    (
        "ledger",
        "max_wait_sec",
        lambda v, n: {
            "command": "external-job",
            "task_id": "base",
            "job_id": f"j{n}",
            "status": "running",
            "provider": "p",
            "max_wait_sec": v,
        },
    ),
    (
        "ledger",
        "observed_bytes",
        lambda v, n: {
            "command": "download-observed",
            "task_id": "base",
            "name": f"d{n}",
            "observed_bytes": v,
        },
    ),
    (
        "ledger",
        "expected_bytes",
        lambda v, n: {
            "command": "download-observed",
            "task_id": "base",
            "name": f"e{n}",
            "observed_bytes": 0,
            "expected_bytes": v,
        },
    ),
    ("report", "summary", lambda v, n: {"ok": True, "summary": v}),
    ("report", "role", lambda v, n: {"ok": True, "role": v}),
    ("spawn", "child_workdir", lambda v, n: {"child_workdir": v, "reason": "r"}),
    ("spawn", "reason", lambda v, n: {"child_workdir": f"child{n}", "reason": v}),
    (
        "spawn",
        "provider",
        lambda v, n: {"child_workdir": f"child{n}", "reason": "r", "provider": v},
    ),
    ("spawn", "parent", lambda v, n: {"child_workdir": f"child{n}", "reason": "r", "parent": v}),
    (
        "spawn",
        "max_depth",
        lambda v, n: {"child_workdir": f"child{n}", "reason": "r", "max_depth": v},
    ),
]


def _values(prop: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """Values at the listed bounds, and values past them."""
    if prop["type"] == "string" and "maxLength" not in prop:  # a path: only its minimum
        assert prop["minLength"] == 1, prop
        return [], [""]
    if prop["type"] == "string":
        past = ["a" * (prop["maxLength"] + 1)]
        if prop.get("minLength", 0) > 0:
            past.append("")
        return ["a" * prop["maxLength"]], past
    assert "minimum" in prop, prop
    past = [prop["minimum"] - 1]
    if "maximum" not in prop:
        return [prop["minimum"] + 1], past
    high = prop["maximum"]
    past.append(high + 1 if prop["type"] == "integer" else high * 2)
    return [high], past


async def test_every_listed_bound_is_the_bound_the_server_enforces(
    workdir: Path, cli: CliHost
) -> None:
    for n in range(200):  # a child folder of its own for every spawn (spawned once)
        (workdir / f"child{n}").mkdir()
    counter = itertools.count()
    async with cli.mcp() as session:
        schemas = {tool.name: tool.input_schema for tool in (await session.list_tools()).tools}
        base = await session.call_tool(
            "ledger", {"command": "init", "task_id": "base", "purpose": "p"}
        )
        assert not base.is_error, base.structured_content
        for tool, field, arguments in BOUNDED:
            schema = schemas[tool]
            inside, past = _values(schema["properties"][field])
            for value in inside:
                call = arguments(value, next(counter))
                jsonschema.validate(call, schema)
                result = await session.call_tool(tool, call)
                assert not result.is_error, (tool, field, result.structured_content)
            for value in past:
                call = arguments(value, next(counter))
                assert not jsonschema.Draft202012Validator(schema).is_valid(call), (field, value)
                result = await session.call_tool(tool, call)
                content = result.structured_content
                assert result.is_error and isinstance(content, dict), (tool, field, value)
                assert content["message"].startswith(f"{field}:"), (tool, field, content)
