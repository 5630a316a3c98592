"""The refusals `taskcard mcp` makes itself carry a `code`, as every other failed result does.

A tool call with a field its tool does not name, a fraction where a whole number belongs, an
unknown tool or a workdir deleted under the server was answered `{"status": "failed",
"message": ...}` alone, while a `task_card` envelope the host's schema refused carried `"code":
"bad_envelope"`: a program had to read the words to tell them apart. Driven with the SDK's
real stdio client against `taskcard mcp`, and `taskcard tool` as a process for the same
envelope.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .conftest import CliHost


def refused(result: Any) -> dict[str, Any]:
    content = result.structured_content
    assert result.is_error and isinstance(content, dict), result
    assert json.loads(result.content[0].text) == content  # the text says the same
    assert set(content) == {"status", "code", "message"}, content
    assert content["status"] == "failed", content
    return content


async def test_the_servers_own_refusals_carry_a_code_and_name_the_fix(
    workdir: Path, cli: CliHost
) -> None:
    envelope = {"action": "settings", "input": {}, "reasoning": "r", "colour": "red"}
    async with cli.mcp() as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        for tool in listed.values():  # the listing says results may carry it
            assert tool.output_schema is not None
            assert "code" in tool.output_schema["properties"], tool.name
        root = refused(await session.call_tool("task_card", envelope))
        assert root["code"] == "bad_envelope", root
        assert root["message"].startswith("colour: not a field of task_card; remove it"), root
        ledger = refused(await session.call_tool("ledger", {"command": "status", "colour": 1}))
        assert ledger["code"] == "bad_envelope", ledger
        assert ledger["message"].startswith("colour: not a field of ledger; remove it"), ledger
        spawn = {"child_workdir": "child", "reason": "lint", "max_depth": 2.5}
        fraction = refused(await session.call_tool("spawn", spawn))
        assert fraction["code"] == "bad_envelope", fraction
        assert fraction["message"].startswith("max_depth: must be a whole number"), fraction
        unknown = refused(await session.call_tool("tasks", {}))
        assert unknown["code"] == "unknown_tool", unknown
        assert unknown["message"] == (
            "unknown tool 'tasks'; call one this server has: "
            "task_card, ledger, report, reports, spawn, inbox"
        )
        shutil.rmtree(workdir)
        gone = refused(await session.call_tool("report", {"ok": True, "summary": "s"}))
        assert gone["code"] == "workdir_gone", gone
        assert "restart the server with an existing --workdir" in gone["message"], gone


def test_taskcard_tool_gives_the_same_code_for_an_unknown_root_field(cli: CliHost) -> None:
    envelope = {"action": "settings", "input": {}, "reasoning": "r", "colour": "red"}
    done = cli.run("tool", json.dumps(envelope))
    assert done.returncode == 2, done
    assert json.loads(done.stdout)["code"] == "bad_envelope", done.stdout
