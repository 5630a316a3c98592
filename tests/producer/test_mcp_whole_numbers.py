"""Integer fields of every MCP tool take a whole number written as a float (`2.0`).

JSON Schema counts `2.0` as an integer, and clients written in JavaScript send a whole number
that way; every tool refused it ("must be a whole number", "Input should be a valid
integer"), each in its own words. Driven with the SDK's real stdio client against `taskcard
mcp`, and with raw lines for the NaN and infinities the SDK's client cannot send.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import INITIALIZE

from .conftest import STATIC_RENDERER, CliHost, tool_call, write_renderer

# Every integer field of every tool, and a call that sets it (the value goes in `VALUE`).
VALUE = object()
CALLS: dict[tuple[str, str], dict[str, Any]] = {
    ("task_card", "input.max_refreshes"): {
        "action": "start",
        "input": {"renderer_path": "r.py", "max_refreshes": VALUE},
        "reasoning": "r",
    },
    ("ledger", "max_nudges"): {
        "command": "init",
        "task_id": "n",
        "purpose": "p",
        "max_nudges": VALUE,
    },
    ("ledger", "max_retries"): {
        "command": "init",
        "task_id": "r",
        "purpose": "p",
        "max_retries": VALUE,
    },
    ("ledger", "observed_bytes"): {
        "command": "download-observed",
        "task_id": "t",
        "name": "d",
        "observed_bytes": VALUE,
    },
    ("ledger", "expected_bytes"): {
        "command": "download-observed",
        "task_id": "t",
        "name": "e",
        "observed_bytes": 1,
        "expected_bytes": VALUE,
    },
    ("spawn", "max_depth"): {"child_workdir": "child", "reason": "lint", "max_depth": VALUE},
    ("reports", "after"): {"after": VALUE},
}


def with_value(arguments: dict[str, Any], value: object) -> dict[str, Any]:
    return {
        name: with_value(given, value)
        if isinstance(given, dict)
        else value
        if given is VALUE
        else given
        for name, given in arguments.items()
    }


def integer_fields(schema: dict[str, Any], where: str = "") -> set[str]:
    found = set()
    for name, spec in schema.get("properties", {}).items():
        if spec.get("type") == "integer":
            found.add(f"{where}{name}")
        elif spec.get("type") == "object":
            found |= integer_fields(spec, f"{where}{name}.")
    return found


async def test_every_integer_field_takes_a_whole_float_and_refuses_the_rest(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "child").mkdir()
    async with cli.mcp() as session:
        tools = (await session.list_tools()).tools
        listed = {
            (tool.name, field) for tool in tools for field in integer_fields(tool.input_schema)
        }
        assert listed == set(CALLS), "every integer field of every tool is covered here"
        created = await session.call_tool(
            "ledger", {"command": "init", "task_id": "t", "purpose": "p"}
        )
        assert not created.is_error, created.structured_content

        # Refused alike by every tool, naming the field; nothing is recorded.
        refusals = [
            (2.5, "must be a whole number, not 2.5; drop the fraction"),
            (True, "must be a whole number, not a boolean"),
            ("2", "must be a whole number, not text; give the number without quotes"),
        ]
        for (tool, field), arguments in CALLS.items():
            for value, words in refusals:
                result = await session.call_tool(tool, with_value(arguments, value))
                content = result.structured_content
                assert result.is_error and isinstance(content, dict), (tool, field, value)
                assert content["message"] == f"{field}: {words}", content
        assert not (workdir / "taskcard" / "watch.json").exists()
        assert not (workdir / "child" / "lineage.json").exists()

        # Taken, as the whole number it is.
        for (tool, field), arguments in CALLS.items():
            result = await session.call_tool(tool, with_value(arguments, 3.0))
            assert not result.is_error, (tool, field, result.structured_content)
        watch = json.loads((workdir / "taskcard" / "watch.json").read_text())
        assert watch["max_refreshes"] == 3
        lineage = json.loads((workdir / "child" / "lineage.json").read_text())
        assert lineage["depth"] == 1
        for task_id, limit in (("n", "max_nudges"), ("r", "max_retries")):
            shown = await session.call_tool("ledger", {"command": "show", "task_id": task_id})
            assert isinstance(shown.structured_content, dict)
            assert shown.structured_content["record"]["task"]["limits"][limit] == 3
        shown = await session.call_tool("ledger", {"command": "show", "task_id": "t"})
        assert isinstance(shown.structured_content, dict)
        downloads = shown.structured_content["record"]["observed"]["downloads"]
        assert {d["name"]: (d["observed_bytes"], d["expected_bytes"]) for d in downloads} == {
            "d": (3, None),
            "e": (1, 3),
        }
        # Still in range only: a whole float past the bound is refused as an int would be.
        refused = await session.call_tool(
            "spawn", {"child_workdir": "child", "reason": "lint", "max_depth": 33.0}
        )
        assert refused.is_error and isinstance(refused.structured_content, dict)
        assert refused.structured_content["message"] == "max_depth: must be 1..32"


def test_nan_and_infinities_are_refused_naming_the_field(workdir: Path, cli: CliHost) -> None:
    """A line with NaN, Infinity or 1e400 (a float too large, read as an infinity) reaches the
    tools as a float: it is refused as a whole number it is not."""
    (workdir / "child").mkdir()
    spawn = '{"name":"spawn","arguments":{"child_workdir":"child","reason":"x","max_depth":%s}}'
    ledger = (
        '{"name":"ledger","arguments":{"command":"download-observed","task_id":"t","name":"d",'
        '"observed_bytes":%s}}'
    )
    lines = [
        json.dumps(INITIALIZE),
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
        tool_call(2, spawn % "NaN"),
        tool_call(3, spawn % "-Infinity"),
        tool_call(4, ledger % "1e400"),
        tool_call(5, spawn % "2.0"),
    ]
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        server.stdin.write("".join(line + "\n" for line in lines).encode())
        server.stdin.flush()
        by_id = {answer["id"]: answer for answer in (answers.get(timeout=60) for _ in range(5))}
        expected = {
            2: "max_depth: must be a whole number, not NaN; give a finite whole number",
            3: "max_depth: must be a whole number, not -Infinity; give a finite whole number",
            4: "observed_bytes: must be a whole number, not Infinity; give a finite whole number",
        }
        for ident, message in expected.items():
            result = by_id[ident]["result"]
            assert result["isError"] is True, result
            assert result["structuredContent"]["message"] == message
        assert by_id[5]["result"]["isError"] is False, by_id[5]
        assert json.loads((workdir / "child" / "lineage.json").read_text())["depth"] == 1
