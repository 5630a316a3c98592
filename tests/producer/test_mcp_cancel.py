"""A `start` the MCP client cancels: before it commits it leaves nothing behind.

The client cancels by `notifications/cancelled` (the SDK's client sends one when the caller
stops waiting) and gets no answer. The server used to let the start run on in the host, and
a watch the agent was never told of appeared on the card. Now the cancellation reaches the
host: a start still in its first render stops there and creates no watch. Driven with the
SDK's real stdio client against `taskcard mcp`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from .conftest import POLL_TIMEOUT_S, CliHost, pid_alive, wait_for, write_renderer

# Says it runs (its pid), then waits for the test to let it print a card.
HELD_RENDERER = """
import os, pathlib, time
here = pathlib.Path(__file__).resolve().parent
(here / "render.pid").write_text(str(os.getpid()))
deadline = time.monotonic() + 600  # a failed test never leaves it running for good
while not (here / "release").exists():
    if not here.exists() or time.monotonic() > deadline:
        raise SystemExit("never released")
    time.sleep(0.05)
print("# Work\\nreleased")
"""
START = {"action": "start", "input": {"renderer_path": "held.py"}, "reasoning": "show progress"}


async def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await anyio.sleep(0.05)


async def test_a_start_cancelled_in_its_first_render_leaves_no_watch(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "held.py", HELD_RENDERER)
    # A first render may take the whole timeout: without the cancellation reaching the
    # host, the held renderer would outlive the wait below by minutes.
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_text('{"timeout_s": 300}')
    pid_file = workdir / "render.pid"
    async with cli.mcp() as session:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.call_tool, "task_card", START)
            await eventually(pid_file.exists, "the first render to run")
            tasks.cancel_scope.cancel()  # the client sends notifications/cancelled
        pid = int(pid_file.read_text())
        await eventually(lambda: not pid_alive(pid), "the cancelled first render to stop")
        assert not (workdir / "taskcard" / "watch.json").exists()
        status = workdir / "taskcard" / "status"
        assert not status.exists() or status.read_bytes() != b"active"

        # Nothing is left to say "already active": the retried start makes the watch.
        pid_file.unlink()
        (workdir / "release").write_text("")
        # The cancelled start answers once its render is reaped; until then a start is
        # refused as busy, and a caller calls again, as its message says.
        deadline = time.monotonic() + 60
        while True:
            again = await session.call_tool("task_card", START)
            content = again.structured_content
            if not (isinstance(content, dict) and content.get("code") == "busy"):
                break
            assert time.monotonic() < deadline, f"still busy after 60 s: {content}"
            await anyio.sleep(0.1)
        assert not again.is_error and isinstance(content, dict), content
        assert content["status"] == "watching", content
        assert status.read_bytes() == b"active"
        removed = await session.call_tool(
            "task_card", {"action": "remove", "input": {}, "reasoning": "done"}
        )
        assert not removed.is_error, removed.structured_content


def test_a_cli_start_killed_in_its_first_render_leaves_no_watch(
    workdir: Path, cli: CliHost
) -> None:
    """The command line's client going away is the same hangup: `taskcard tool` stopped
    while the first render runs makes no watch (a watch it never reported came up)."""
    write_renderer(workdir, "held.py", HELD_RENDERER)
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_text('{"timeout_s": 300}')
    pid_file = workdir / "render.pid"
    command = [sys.executable, "-m", "taskcard.bridge.cli", "tool", json.dumps(START)]
    command += ["--workdir", str(workdir), "--runtime-dir", str(cli.runtime_dir)]
    client = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(pid_file.exists)
        client.send_signal(signal.SIGTERM)
        client.wait(timeout=60)
        pid = int(pid_file.read_text())
        wait_for(lambda: not pid_alive(pid))
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert not (workdir / "taskcard" / "watch.json").exists()
    pid_file.unlink()
    (workdir / "release").write_text("")
    assert cli.json("tool", json.dumps(START))["status"] == "watching"
    removal = {**START, "action": "remove", "input": {}}
    assert cli.json("tool", json.dumps(removal))["status"] == "removed"
