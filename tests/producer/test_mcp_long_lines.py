"""A line over the MCP server's limit is answered with an error naming the limit, dropped as
it arrives, and the server goes on with the next line.

The server kept a line until its newline, so a client that wrote megabytes without one grew
the server without bound, and the request was never answered until the line ended. Driven
with raw lines, as a hand-written client writes them (the SDK's client never writes such a
line), as in `test_mcp_repeated_keys`.
"""

from __future__ import annotations

import json
from pathlib import Path
from queue import Queue
from typing import IO, Any

from tests.conftest import INITIALIZE

from .conftest import CliHost, tool_call

MIB = 1024 * 1024
MAX_LINE_BYTES = 2 * MIB  # as documented (docs/producer.md)
LIMIT_WORDS = f"a line over the {MAX_LINE_BYTES}-byte limit"


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def _write(pipe: IO[bytes], data: bytes) -> None:
    pipe.write(data)
    pipe.flush()


def _report(ident: int, summary: str) -> bytes:
    arguments = json.dumps({"ok": True, "summary": summary})
    return (tool_call(ident, f'{{"name":"report","arguments":{arguments}}}') + "\n").encode()


def _started(server: Any, answers: Queue[dict[str, Any]]) -> None:
    _write(
        server.stdin,
        json.dumps(INITIALIZE).encode()
        + b'\n{"jsonrpc":"2.0","method":"notifications/initialized"}\n',
    )
    assert answers.get(timeout=60)["id"] == 1


def test_a_line_without_end_is_answered_dropped_and_the_next_line_served(
    workdir: Path, cli: CliHost
) -> None:
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        _started(server, answers)
        before = _peak_rss_bytes(server.pid)
        head = tool_call(7, '{"name":"report","arguments":{"ok":true,"summary":"')
        _write(server.stdin, head.encode() + b"x" * (4 * MIB))
        # Answered while the line is still coming, for the id it named before the cut.
        refused = answers.get(timeout=60)
        assert refused["id"] == 7, refused
        assert refused["error"]["code"] == -32600
        assert LIMIT_WORDS in refused["error"]["message"]
        for _ in range(44):  # the rest of the line, megabytes more: read and dropped
            _write(server.stdin, b"x" * MIB)
        _write(server.stdin, b'"}}}\n' + _report(8, "after the long line"))
        served = answers.get(timeout=60)
        assert served["id"] == 8 and served["result"]["isError"] is False, served
        grown = _peak_rss_bytes(server.pid) - before
        assert grown < 24 * MIB, f"the server grew by {grown} bytes reading one long line"
        assert answers.empty()  # the dropped rest of the line was not read as a message
    reports = (workdir / "reports" / "reports.jsonl").read_text().splitlines()
    assert [json.loads(line)["summary"] for line in reports] == ["after the long line"]


def test_an_id_the_cut_hides_is_answered_as_null_and_short_lines_pass(cli: CliHost) -> None:
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        _started(server, answers)
        # The id comes after the field the cut falls in: it cannot be read.
        padding = b" " * (MAX_LINE_BYTES + 10)
        _write(server.stdin, b'{"jsonrpc":"2.0","method":"tools/list","params":{' + padding)
        _write(server.stdin, b'},"id":9}\n')
        refused = answers.get(timeout=60)
        assert refused["id"] is None and LIMIT_WORDS in refused["error"]["message"], refused
        # A line under the limit, however long, is read as before.
        under = b'{"jsonrpc":"2.0","id":10,' + b" " * (MAX_LINE_BYTES - 100)
        _write(server.stdin, under + b'"method":"tools/list"}\n')
        listed = answers.get(timeout=60)
        assert listed["id"] == 10 and "report" in {t["name"] for t in listed["result"]["tools"]}
        # A line over the limit that is not an object at all.
        _write(server.stdin, b"[" * (MAX_LINE_BYTES + 1) + b"\n")
        refused = answers.get(timeout=60)
        assert refused["id"] is None and LIMIT_WORDS in refused["error"]["message"], refused
        _write(server.stdin, _report(11, "still served"))
        assert answers.get(timeout=60)["result"]["isError"] is False
