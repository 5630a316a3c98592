"""A workdir whose host holds its lock but does not answer on its socket (its socket was
removed by a cleaner of the runtime folder; the same for a stopped or stuck host). A call
started a host, which was refused (exit 3, the workdir is held), and then waited its minute
and said "no task card host answered", exit 4, as if none ran. Now the command exits 3
naming the holder's pid and program and the fix, and MCP answers `workdir_held` in the same
words, not a timeout's."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import STATIC_RENDERER, CliHost, envelope, write_renderer


@pytest.fixture
def silent_host(workdir: Path, cli: CliHost) -> Iterator[int]:
    """A host with a live watch (it never idles out) whose socket is gone: its pid; ended
    with SIGTERM after the test, as its user is told to."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    started = cli.json("card", "start", "r.py", "--interval-s", "3600")
    assert started["status"] == "watching", started
    pid = cli.host_pid()
    assert pid is not None
    cli.paths.socket.unlink()
    yield pid
    os.kill(pid, signal.SIGTERM)


def _names_the_holder(message: str, pid: int, cli: CliHost) -> None:
    assert f"a task_card host holds {cli.paths.workdir} (pid {pid}: " in message, message
    assert "task_card/cli.py)" in message, message
    assert "did not answer on its socket" in message, message
    assert f"end it (kill {pid}) and call again" in message, message
    assert "no task card host answered" not in message, message


def test_a_command_meeting_a_silent_holder_exits_3_naming_it(
    cli: CliHost, silent_host: int
) -> None:
    pid = silent_host
    done = cli.run("card", "inspect", "tc_1", timeout_s=240)
    assert done.returncode == 3, done.stderr
    _names_the_holder(done.stderr, pid, cli)
    assert done.stderr.count("\n") == 1, done.stderr


async def test_an_mcp_call_meeting_a_silent_holder_is_workdir_held(
    cli: CliHost, silent_host: int
) -> None:
    pid = silent_host
    async with cli.mcp() as session:
        answer = await session.call_tool("task_card", envelope("inspect", watch_id="tc_1"))
    result = answer.structured_content
    assert answer.is_error and result is not None, answer
    assert result["code"] == "workdir_held", result
    _names_the_holder(result["message"], pid, cli)


def test_host_detach_meeting_a_silent_holder_says_why_it_exits_3(
    cli: CliHost, silent_host: int
) -> None:
    """`taskcard host --detach` exited 3 without a word: the refused host's reason went to
    its log. Now it names the holder at once (a host still starting may yet answer)."""
    pid = silent_host
    done = cli.run("host", "--detach", timeout_s=240)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("taskcard host: a task_card host holds "), done.stderr
    assert f"(pid {pid}: " in done.stderr and "does not answer on its socket" in done.stderr
    assert f"end it (kill {pid}) and call again" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
