"""The `ledger` tool on `taskcard mcp`, driven by the MCP SDK's stdio client."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, stdio_client


async def test_an_mcp_client_keeps_a_ledger(workdir: Path) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="tclm"))
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "taskcard.bridge.cli",
            "mcp",
            "--workdir",
            str(workdir),
            "--runtime-dir",
            str(runtime),
        ],
    )
    try:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            schema = tools["ledger"].input_schema
            assert schema["type"] == "object" and schema["required"] == ["command"]
            assert not {"oneOf", "anyOf", "allOf"} & set(schema)
            assert len(schema["properties"]["event_type"]["enum"]) == 10

            async def call(**arguments: object) -> tuple[dict[str, object], bool]:
                result = await session.call_tool("ledger", arguments)
                text = result.content[0].text  # type: ignore[union-attr]
                return json.loads(text), bool(result.is_error)

            created, error = await call(
                command="init", task_id="t", purpose="Sync", steps=["pull", "push"]
            )
            assert (created["status"], created["truth_state"], error) == ("ok", "NO_TRUTH", False)
            moved, _ = await call(
                command="checkpoint", task_id="t", event_type="STEP_COMPLETED", step="pull"
            )
            assert moved["next_gate"] == "complete step push"
            rendered, _ = await call(command="render")
            assert "step: 2 of 2 (`push`, pending)" in str(rendered["markdown"])
            refused, error = await call(command="checkpoint", task_id="t", event_type="CHECKPOINT")
            assert error is True and str(refused["message"]).startswith("event_type:")
            refused, error = await call(command="owner-reply", task_id="t", reply="B")
            assert error is True and str(refused["message"]).startswith("reason:")
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    assert (workdir / "ledger" / "long-task-ledger.json").is_file()
