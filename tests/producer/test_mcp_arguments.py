"""Argument names the MCP tools do not know: a clear error naming the field, for every tool.

Driven with the SDK's real stdio client against `taskcard mcp`. An argument named `self`
used to reach `Reports.add` as a keyword, clash with the method's own `self`, and come back
as "ok: required" although `ok` was given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, stdio_client

from taskcard.producers.reports import ReportError, Reports

from .conftest import CliHost
from .test_mcp import server_for

# One valid-looking call per tool; each test adds a stray argument to it.
VALID_CALLS: dict[str, dict[str, Any]] = {
    "task_card": {"action": "settings", "input": {}, "reasoning": "check"},
    "ledger": {"command": "heartbeat", "task_id": "t1"},
    "report": {"ok": True, "summary": "done"},
    "spawn": {"child_workdir": "child", "reason": "lint"},
    "inbox": {"peek": True},
}


async def test_a_stray_argument_is_refused_by_every_tool_naming_it(
    workdir: Path, cli: CliHost
) -> None:
    (workdir / "child").mkdir()
    async with (
        stdio_client(server_for(workdir, cli)) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == set(VALID_CALLS), "every tool of the server is covered here"
        for name, arguments in VALID_CALLS.items():
            for stray in ("self", "cls", "arguments", "colour"):
                result = await session.call_tool(name, {**arguments, stray: 1})
                content = result.structured_content
                assert result.is_error and isinstance(content, dict), (name, stray)
                assert content["message"].startswith(f"{stray}: not a field of {name}"), content
        # Nothing was recorded by the refused calls; a clean report still works.
        assert not (workdir / "reports").exists()
        assert not (workdir / "child" / "lineage.json").exists()
        result = await session.call_tool("report", {"ok": True})
        assert not result.is_error and isinstance(result.structured_content, dict)
        assert result.structured_content["seq"] == 1
        missing = await session.call_tool("report", {"summary": "no outcome"})
        assert isinstance(missing.structured_content, dict)
        assert missing.structured_content["message"].startswith("ok: required")


@pytest.mark.parametrize("stray", ["self", "colour"])
def test_the_python_api_names_a_stray_report_field(workdir: Path, stray: str) -> None:
    with pytest.raises(ReportError, match=f"^{stray}: not a report field"):
        Reports(workdir).add(ok=True, **{stray: 1})


LONG = "x" * 100_000
# A call per tool with a long value where a short one belongs, and the field it must name.
LONG_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("task_card", {"action": "inspect", "input": {"watch_id": LONG}, "reasoning": "r"}, "watch_id"),
    (
        "task_card",
        {"action": "start", "input": {"renderer_path": LONG}, "reasoning": "r"},
        "renderer_path",
    ),
    (
        "task_card",
        {
            "action": "start",
            "input": {"renderer_path": "r.py", "interval_s": LONG},
            "reasoning": "r",
        },
        "input.interval_s",
    ),
    ("task_card", {"action": LONG[:5000], "input": {}, "reasoning": "r"}, "action"),
    ("ledger", {"command": "init", "task_id": LONG, "purpose": "p"}, "task_id"),
    ("ledger", {"command": LONG}, "command"),
    ("spawn", {"child_workdir": LONG, "reason": "lint"}, "child_workdir"),
    ("spawn", {"child_workdir": "missing/" + LONG[:200], "reason": "lint"}, "child_workdir"),
]


async def test_a_long_value_is_named_not_echoed_whole(workdir: Path, cli: CliHost) -> None:
    """A 100,000-character id or path came back whole in the error, twice in the result (its
    text and its structured content), and a child folder name too long for the system was
    "cannot write lineage.json": the error names the field and quotes the start of the value."""
    async with (
        stdio_client(server_for(workdir, cli)) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for name, arguments, field in LONG_VALUES:
            result = await session.call_tool(name, arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), (name, field)
            assert content["message"].startswith(f"{field}: "), content["message"][:200]
            assert len(content["message"]) < 1000, (field, content["message"][:200])
    assert not (workdir / "taskcard" / "watch.json").exists()
    assert not (workdir / "ledger").exists()
