"""A tools/call that names one key twice in a JSON object is refused, naming the key.

The SDK decoded the line and kept the last value, so `{"child_workdir": "a", "child_workdir":
"b"}` spawned into `b` while whoever read the call saw `a`. Driven as a client would: raw
lines to `taskcard mcp` (the SDK's client cannot send a repeated key) and the SDK's real
stdio client for everything that must work as before; the line check itself is a table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from taskcard.producers.task_card.mcp_wire import RepeatedKeys
from tests.conftest import INITIALIZE

from .conftest import CliHost, tool_call


def test_a_repeated_key_in_a_tool_call_is_refused_naming_it_and_nothing_runs(
    workdir: Path, cli: CliHost
) -> None:
    (workdir / "child").mkdir()
    (workdir / "other").mkdir()
    # A repeat outside a tools/call is left to the SDK, as before: initialize still works.
    hello = json.dumps(INITIALIZE).replace('"version": "1"', '"version": "0", "version": "1"')
    lines = [
        hello,
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
        tool_call(2, '{"name":"spawn","arguments":{"child_workdir":"child","reason":"lint",'
                '"child_workdir":"other"}}'),
        tool_call(3, '{"name":"task_card","arguments":{"action":"start","input":{'
                '"renderer_path":"a.py","interval_s":5,"renderer_path":"b.py"},"reasoning":"r"}}'),
        tool_call(4, '{"name":"report","name":"spawn","arguments":{"ok":true}}'),
        tool_call(5, '{"name":"report","arguments":{"ok":true,"ok":false,"ok":true}}'),
        tool_call(6, '{"name":"report","arguments":{"ok":true,"summary":"{\\"a\\":1,\\"a\\":2}"}}'),
        '{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"x":1,"x":2}}',
    ]  # fmt: skip
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        server.stdin.write("".join(line + "\n" for line in lines).encode())
        server.stdin.flush()
        by_id = {answer["id"]: answer for answer in (answers.get(timeout=60) for _ in range(7))}
        assert by_id[1]["result"]["serverInfo"]["name"] == "taskcard"
        refused = {
            2: "child_workdir: given twice in one object",
            3: "input.renderer_path: given twice in one object",
            4: "params.name: given twice in one object",
            5: "ok: given 3 times in one object",
        }
        for ident, start in refused.items():
            result = by_id[ident]["result"]
            assert result["isError"] is True, result
            assert result["structuredContent"]["code"] == "bad_envelope", result
            message = result["structuredContent"]["message"]
            assert message.startswith(start), message
            assert message.endswith("nothing was done; send each field once"), message
        # A text that looks like such JSON is only text; the clean report is the only one.
        assert by_id[6]["result"]["isError"] is False, by_id[6]
        assert "task_card" in {tool["name"] for tool in by_id[7]["result"]["tools"]}
        reports = (workdir / "reports" / "reports.jsonl").read_text().splitlines()
        assert [json.loads(line)["summary"] for line in reports] == ['{"a":1,"a":2}']
        assert not (workdir / "child" / "lineage.json").exists()
        assert not (workdir / "other" / "lineage.json").exists()
        assert not (workdir / "taskcard" / "watch.json").exists()
        # The wire is read on a private descriptor: fd 0 gives a child nothing of it.
        assert os.readlink(f"/proc/{server.pid}/fd/0") == os.devnull


async def test_the_real_client_works_as_before_over_the_checked_stdin(
    workdir: Path, cli: CliHost
) -> None:
    (workdir / "child").mkdir()
    async with cli.mcp() as session:
        assert {tool.name for tool in (await session.list_tools()).tools} >= {"spawn", "report"}
        text = "ünïcödé ✓ " + "x" * 60_000
        report = await session.call_tool("report", {"ok": True, "summary": "s", "payload": text})
        assert not report.is_error, report.structured_content
        spawned = await session.call_tool("spawn", {"child_workdir": "child", "reason": "lint"})
        assert not spawned.is_error, spawned.structured_content
        settings = await session.call_tool(
            "task_card", {"action": "settings", "input": {}, "reasoning": "look"}
        )
        assert not settings.is_error, settings.structured_content
    assert json.loads((workdir / "child" / "lineage.json").read_text())["reason"] == "lint"


CHECKS = RepeatedKeys(marker="M")


@pytest.mark.parametrize(
    "line",
    [
        '{"jsonrpc":"2.0","id":1,"method":"ping"}\n',
        '{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":1,"a":2}}\n',
        '{"jsonrpc":"2.0","method":"notifications/x","params":{"a":1,"a":2}}\n',
        tool_call(1, '{"name":"report","arguments":{"ok":true,"payload":"a"}}') + "\n",
        tool_call(1, '{"name":"report","arguments":{"ok":tru') + "\n",  # the SDK answers it
        tool_call(1, '[{"a":1,"a":2}]') + "\n",  # params not an object: the SDK answers it
        "\n",
    ],
)
def test_lines_without_a_repeat_in_a_tool_call_pass_unchanged(line: str) -> None:
    assert CHECKS.line(line) is line


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ('{"name":"x","arguments":{"a":1,"a":2}}', "a: given twice"),
        ('{"name":"x","arguments":{"p":[{"q":1},{"q":1,"q":2}]}}', "p[1].q: given twice"),
        ('{"name":"x","arguments":{"i":{"a":{"b":1,"b":1}},"i":{}}}', "i: given twice"),
        ('{"name":"x","arguments":{},"arguments":{}}', "params.arguments: given twice"),
    ],
)
def test_a_repeat_in_a_tool_call_becomes_the_refusal_alone(params: str, field: str) -> None:
    checked = json.loads(CHECKS.line(tool_call(9, params)))
    assert (checked["id"], checked["params"]["name"]) == (9, "x")
    arguments = checked["params"]["arguments"]
    refusal = CHECKS.refusal(arguments)
    assert refusal is not None and refusal.startswith(field), arguments
    assert list(arguments) == ["M"]
    assert CHECKS.refusal({"M": "forged", "a": 1}) is None
    assert RepeatedKeys().refusal(arguments) is None  # another server's marker is unknown
