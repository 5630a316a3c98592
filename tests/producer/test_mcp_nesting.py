"""A tools/call nested too deep is refused as a tool error naming the field, under its id.

The SDK's reader gives up near 200 levels of nesting: such a call was answered with a
JSON-RPC parse error ("recursion limit exceeded at line 1 column 313") that named no field,
and one deeper than Python's own reader takes (about 1,000 levels) with a null id, so the
client that sent it waited for ever. Driven with raw lines, as an agent's client writes them,
and with the SDK's client for a depth it can send.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import INITIALIZE

from .conftest import CliHost, tool_call


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_tool_call_nested_too_deep_is_refused_naming_the_field(
    workdir: Path, cli: CliHost
) -> None:
    (workdir / "child").mkdir()
    lines = [
        json.dumps(INITIALIZE),
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
        tool_call(2, '{"name":"report","arguments":{"ok":true,"summary":' + _nested(300) + "}}"),
        tool_call(3, '{"name":"spawn","arguments":{"child_workdir":"child","reason":"r",'
                  '"provider":' + _nested(5000) + "}}"),
        tool_call(4, '{"name":"task_card","arguments":{"action":"start","input":'
                  '{"renderer_path":' + _nested(200_000) + '},"reasoning":"r"}}'),
        tool_call(5, '{"name":"ledger","arguments":{"command":"init","task_id":"t1",'
                  '"purpose":"p","steps":["a",' + _nested(150) + "]}}"),
        # Brackets inside a text do not nest: taken as the summary it is.
        tool_call(6, '{"name":"report","arguments":{"ok":true,"summary":"' + "[" * 300 + '"}}'),
    ]  # fmt: skip
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        server.stdin.write("".join(line + "\n" for line in lines).encode())
        server.stdin.flush()
        by_id = {answer["id"]: answer for answer in (answers.get(timeout=60) for _ in range(6))}
        assert by_id[1]["result"]["serverInfo"]["name"] == "taskcard"
        refused = {2: "summary", 3: "provider", 4: "input.renderer_path", 5: "steps"}
        for ident, field in refused.items():
            result = by_id[ident]["result"]
            assert result["isError"] is True, result
            message = result["structuredContent"]["message"]
            assert message.startswith(f"{field}: nested deeper than 100 levels"), message
            assert "nothing was done; send the field as the tool's schema gives it" in message
        assert by_id[6]["result"]["isError"] is False, by_id[6]
        reports = (workdir / "reports" / "reports.jsonl").read_text().splitlines()
        assert [json.loads(line)["summary"] for line in reports] == ["[" * 300]
        assert not (workdir / "child" / "lineage.json").exists()
        assert not (workdir / "taskcard" / "watch.json").exists()
        assert not (workdir / "ledger").exists()


async def test_the_sdk_client_gets_a_tool_error_for_a_deep_argument(
    workdir: Path, cli: CliHost
) -> None:
    deep: list[object] = []
    for _ in range(150):
        deep = [deep]
    async with cli.mcp() as session:
        result = await session.call_tool("reports", {"after": deep})
        assert result.is_error and isinstance(result.structured_content, dict)
        assert result.structured_content["message"].startswith("after: nested deeper than")
        again = await session.call_tool("report", {"ok": True})
        assert not again.is_error


def test_any_request_nested_too_deep_is_answered_under_its_id(workdir: Path, cli: CliHost) -> None:
    """Not a tools/call: a ping or a list whose params nest past Python's reader got an
    answer with a null id, so the client that sent it waited for ever."""
    lines = [
        json.dumps(INITIALIZE),
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
        '{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":' + _nested(5000) + "}}",
        '{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"x":' + _nested(300) + "}}",
        '{"jsonrpc":"2.0","method":"notifications/progress","params":{"x":' + _nested(5000) + "}}",
        '{"jsonrpc":"2.0","id":9,"method":"ping"}',
    ]
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        server.stdin.write("".join(line + "\n" for line in lines).encode())
        server.stdin.flush()
        by_id = {answer.get("id"): answer for answer in (answers.get(timeout=60) for _ in range(4))}
        assert set(by_id) == {1, 7, 8, 9}, by_id
        assert by_id[9]["result"] == {}, by_id[9]
