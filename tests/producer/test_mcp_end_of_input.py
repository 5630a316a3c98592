"""The MCP server's end of input, driven as raw JSON-RPC lines on its stdin (the SDK's client
never closes stdin while calls run).

- When stdin ended while calls were running, the server cancelled them and answered each
  -32000 "Connection closed", reports it had already written among them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import INITIALIZE

from .conftest import INITIALIZED, CliHost, mcp_answers, report_summaries, tool_call


def test_calls_running_when_stdin_ends_are_answered_with_their_results(
    workdir: Path, cli: CliHost
) -> None:
    calls = 40
    lines = [json.dumps(INITIALIZE), INITIALIZED]
    for n in range(calls):
        report = {"name": "report", "arguments": {"ok": True, "summary": f"r{n}"}}
        lines.append(tool_call(100 + n, json.dumps(report)))
    answers = {answer["id"]: answer for answer in mcp_answers(cli, lines)}
    assert sorted(answers) == [1, *range(100, 100 + calls)], sorted(answers)
    for n in range(calls):
        answer = answers[100 + n]
        assert "error" not in answer, answer
        assert answer["result"]["isError"] is False, answer
    assert sorted(report_summaries(workdir)) == sorted(f"r{n}" for n in range(calls))
