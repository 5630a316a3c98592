"""A tools/call whose line holds bytes that are not UTF-8 is refused, naming the field.

The server read stdin as the SDK does, replacing such bytes with U+FFFD, so a report summary
sent as Latin-1 was stored as `"ok \\ufffd"` and answered as a success: the text people read
was not the one sent, and nobody was told. `taskcard tool` and `taskcard report` refuse such
bytes; over MCP they are now refused the same way. Driven with raw lines (the SDK's client
only sends UTF-8), as in `test_mcp_repeated_keys`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import INITIALIZE

from .conftest import CliHost, tool_call


def test_bytes_that_are_not_utf8_in_a_tool_call_are_refused_naming_the_field(
    workdir: Path, cli: CliHost
) -> None:
    (workdir / "child").mkdir()
    lines = [
        json.dumps(INITIALIZE).encode(),
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        tool_call(2, '{"name":"report","arguments":{"ok":true,"summary":"caf\xe9"}}')
        .encode("latin-1"),
        tool_call(3, '{"name":"spawn","arguments":{"child_workdir":"child","reason":"split \xff"}}')
        .encode("latin-1"),
        tool_call(4, '{"name":"task_card","arguments":{"action":"start","input":'
                '{"renderer_path":"r\xe9.py"},"reasoning":"r"}}').encode("latin-1"),
        tool_call(5, '{"name":"report","arguments":{"ok":true,"r\xf4le":"x"}}').encode("latin-1"),
        # Not a tool call: read as before (the bytes replaced), and answered.
        b'{"jsonrpc":"2.0","id":6,"method":"tools/list","params":{"_meta":{"x":"\xff"}}}',
        tool_call(7, '{"name":"report","arguments":{"ok":true,"summary":"caf\u00e9"}}').encode(),
    ]  # fmt: skip
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        server.stdin.write(b"".join(line + b"\n" for line in lines))
        server.stdin.flush()
        by_id = {answer["id"]: answer for answer in (answers.get(timeout=60) for _ in range(7))}
        assert by_id[1]["result"]["serverInfo"]["name"] == "taskcard"
        refused = {2: "summary", 3: "reason", 4: "input.renderer_path", 5: "r\ufffdle"}
        for ident, field in refused.items():
            result = by_id[ident]["result"]
            assert result["isError"] is True, result
            message = result["structuredContent"]["message"]
            assert message.startswith(f"{field}: not valid UTF-8"), message
            assert message.endswith("nothing was done; send UTF-8 text"), message
        assert "report" in {tool["name"] for tool in by_id[6]["result"]["tools"]}
        # Only the clean call did anything: one report, its text as sent.
        assert by_id[7]["result"]["isError"] is False, by_id[7]
        reports = (workdir / "reports" / "reports.jsonl").read_text().splitlines()
        assert [json.loads(line)["summary"] for line in reports] == ["caf\u00e9"]
        assert not (workdir / "child" / "lineage.json").exists()
        assert not (workdir / "taskcard" / "watch.json").exists()
