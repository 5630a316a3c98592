"""The MCP form: the SDK's stdio client drives `taskcard mcp` (start, inspect, remove)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, stdio_client

from producers.task_card.envelope import ACTIONS

from .conftest import STATIC_RENDERER, CliHost, write_renderer


async def test_an_mcp_client_starts_inspects_and_removes_a_watch(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "producers.task_card.cli",
            "mcp",
            "--workdir",
            str(workdir),
            "--runtime-dir",
            str(cli.runtime_dir),
        ],
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = (await session.list_tools()).tools
        assert [tool.name for tool in tools] == ["task_card", "ledger"]
        schema = tools[0].input_schema
        assert schema["properties"]["action"]["enum"] == list(ACTIONS)
        assert schema["additionalProperties"] is False

        async def call(arguments: dict[str, object]) -> tuple[dict[str, object], bool]:
            result = await session.call_tool("task_card", arguments)
            text = result.content[0].text  # type: ignore[union-attr]
            return json.loads(text), result.is_error

        started, error = await call(
            {"action": "start", "input": {"renderer_path": "r.py"}, "reasoning": "mcp test"}
        )
        assert (started["status"], started["watch_id"], error) == ("watching", "tc_1", False)
        inspected, _ = await call(
            {"action": "inspect", "input": {"watch_id": "tc_1"}, "reasoning": "check"}
        )
        assert inspected["last_body"] == "# Work\nsteady body\n"
        refused, error = await call({"action": "start", "input": {}, "reasoning": "again"})
        assert error is True and "input.renderer_path" in str(refused["message"])
        removed, _ = await call({"action": "remove", "input": {}, "reasoning": "done"})
        assert (removed["status"], removed["body_removed"]) == ("removed", True)
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
