"""At-least-once delivery: a message is acknowledged only once its reader has it.

`taskcard inbox | head -1`, a pipe whose reader never reads, an MCP client that goes away
before reading its answer: every message the reader did not get stays claimable (queued
again), none is acknowledged, and no traceback is printed. Each drives the real command
through a real pipe or stdio.
"""

from __future__ import annotations

import fcntl
import json
import struct
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from taskcard.producers.inbox import claiming

from ..hooks.conftest import TASKCARD, run_taskcard
from .conftest import acks, names, queue

TIMEOUT_S = 120.0


def queue_three(workdir: Path) -> None:
    for n in range(3):
        queue(workdir, f"m{n}", f"text {n}\nits second line", queued_at=f"2026-01-01T00:00:0{n}Z")


def shell(command: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`command` run by a real shell, with `$1`... the args (`$0` is the taskcard command)."""
    return subprocess.run(
        ["sh", "-c", command, TASKCARD, *args],
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_inbox_piped_into_head_leaves_the_unread_messages_for_the_next_read(
    workdir: Path,
) -> None:
    """All three were claimed and acknowledged before any was printed: `head -1` showed the
    first line and the other two were never seen, nor offered again."""
    queue_three(workdir)
    done = shell('"$0" inbox --workdir "$1" | head -1', str(workdir))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"Message from ana in telegram chat -1001"), done.stdout
    assert b"Traceback" not in done.stderr, done.stderr
    assert [a["id"] for a in acks(workdir)] == ["m0"]
    assert names(workdir, "queued") == ["m1.json", "m2.json"]
    rest = run_taskcard("inbox", "--workdir", str(workdir))
    assert rest.returncode == 0, rest.stderr
    assert b"> text 0" not in rest.stdout
    assert b"> text 1" in rest.stdout and b"> text 2" in rest.stdout
    assert [a["id"] for a in acks(workdir)] == ["m0", "m1", "m2"]


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_a_reader_that_never_reads_gets_nothing_acknowledged(
    workdir: Path, json_flag: list[str]
) -> None:
    """`| true` exits without reading: whether the first write fails (EPIPE) or sits unread
    in the pipe, no message reached anyone, so all of them are queued again."""
    queue_three(workdir)
    done = shell('"$0" inbox --workdir "$1" $2 | true', str(workdir), *json_flag)
    assert b"Traceback" not in done.stderr, done.stderr
    assert acks(workdir) == []
    assert names(workdir, "queued") == ["m0.json", "m1.json", "m2.json"]
    assert names(workdir, "taken") == []
    again = run_taskcard("inbox", "--workdir", str(workdir), *json_flag)
    assert again.returncode == 0, again.stderr
    assert b"text 0" in again.stdout and b"text 2" in again.stdout
    assert [a["id"] for a in acks(workdir)] == ["m0", "m1", "m2"]


def test_the_broken_output_is_said_in_one_line_with_its_exit_status(workdir: Path) -> None:
    queue_three(workdir)
    done = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$0" inbox --workdir "$1" | true', TASKCARD, str(workdir)],
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 141, done.stderr
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("taskcard inbox: the reader closed the output"), lines
    assert lines[0].endswith("after 0 of 3 message(s); 3 queued again for the next read"), lines


def test_the_python_api_queues_again_what_the_caller_did_not_mark_delivered(
    workdir: Path,
) -> None:
    queue_three(workdir)
    with pytest.raises(RuntimeError), claiming(workdir, "inbox-cli") as claim:
        assert [m.id for m in claim.messages] == ["m0", "m1", "m2"]
        assert names(workdir, "queued") == []
        claim.delivered(claim.messages[0])
        raise RuntimeError("the reader died after the first message")
    assert [a["id"] for a in acks(workdir)] == ["m0"]
    assert names(workdir, "queued") == ["m1.json", "m2.json"]
    with claiming(workdir, "inbox-cli") as claim:
        assert [m.id for m in claim.messages] == ["m1", "m2"]
        claim.delivered(*claim.messages)
    assert [a["id"] for a in acks(workdir)] == ["m0", "m1", "m2"]
    assert names(workdir, "queued") == [] and len(names(workdir, "taken")) == 3


# --- MCP over stdio ---------------------------------------------------------------------


def mcp_args(workdir: Path, runtime_dir: Path) -> list[str]:
    return ["mcp", "--workdir", str(workdir), "--runtime-dir", str(runtime_dir)]


def send(server: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert server.stdin is not None
    server.stdin.write(json.dumps(message).encode() + b"\n")
    server.stdin.flush()


def unread(fd: int) -> int:
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def raw_client_call_then_close(workdir: Path, runtime_dir: Path, *, leave_unread: bool) -> bytes:
    """A hand-written stdio client: initialize, call `inbox`, then close its read end (at
    once, or once the answer sits unread in the pipe) and its stdin; the server's stderr."""
    server = subprocess.Popen(
        [TASKCARD, *mcp_args(workdir, runtime_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert server.stdout is not None and server.stdin is not None
    try:
        send(
            server,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"},
                },
            },
        )
        assert json.loads(server.stdout.readline())["id"] == 1
        send(server, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        send(
            server,
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "inbox", "arguments": {}},
            },
        )
        if leave_unread:  # the answer arrives, and the client dies without reading it
            fd = server.stdout.fileno()
            wait_until(lambda: unread(fd) > 0, "the answer in the pipe")
        server.stdout.close()
        server.stdin.close()
        assert server.wait(timeout=TIMEOUT_S) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        assert server.stderr is not None
        err = server.stderr.read()
        server.stderr.close()
    return err


@pytest.mark.parametrize("leave_unread", [False, True], ids=["closed-first", "left-unread"])
def test_an_mcp_answer_the_client_never_read_returns_its_messages_to_the_queue(
    workdir: Path, tmp_path: Path, leave_unread: bool
) -> None:
    """The call claimed and acknowledged the messages before its answer was written: a
    client gone by then lost them for good, and the chat said they were delivered."""
    queue_three(workdir)
    err = raw_client_call_then_close(workdir, tmp_path / "rt", leave_unread=leave_unread)
    assert b"Traceback" not in err, err
    assert acks(workdir) == []
    assert names(workdir, "queued") == ["m0.json", "m1.json", "m2.json"]
    assert names(workdir, "taken") == []


async def test_the_next_mcp_client_gets_what_the_last_one_never_read(
    workdir: Path, tmp_path: Path
) -> None:
    queue_three(workdir)
    raw_client_call_then_close(workdir, tmp_path / "rt", leave_unread=True)
    params = StdioServerParameters(command=TASKCARD, args=mcp_args(workdir, tmp_path / "rt"))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("inbox", {})
        assert isinstance(result.structured_content, dict)
        got = [m["id"] for m in result.structured_content["messages"]]
        assert got == ["m0", "m1", "m2"]
        # acknowledged once the client read the answer: the server learns it just after
        wait_until(lambda: len(acks(workdir)) == 3, "the acks")
        assert [a["via"] for a in acks(workdir)] == ["mcp"] * 3
        again = await session.call_tool("inbox", {})
        assert isinstance(again.structured_content, dict)
        assert again.structured_content["messages"] == []
    assert names(workdir, "queued") == []


def test_the_server_keeps_no_traceback_when_its_output_breaks(
    workdir: Path, tmp_path: Path
) -> None:
    """Its stderr says once that nothing more is written, and nothing else."""
    queue_three(workdir)
    err = raw_client_call_then_close(workdir, tmp_path / "rt", leave_unread=False)
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert lines, "the broken output is said"
    assert all(line.startswith("taskcard mcp: ") for line in lines), lines
