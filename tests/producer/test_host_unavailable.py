"""`host_unavailable`, the code `task_card` answers when no task card host can be reached or
started, or the host is closed, driven the ways a user meets it: over MCP, the runtime
folder replaced by a file under a running `taskcard mcp` (the next call cannot start a host
there); from Python, a `TaskCard` called after it was closed. It had no test."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from taskcard.producers.task_card.capability import TaskCard

from .conftest import CliHost, envelope
from .test_mcp_tool_failure_codes import call


def _folder_to_file(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.write_text("not a folder\n")  # as a cleanup script might leave it


def _file_to_folder(file: Path) -> None:
    file.unlink()
    file.mkdir(mode=0o700)


async def test_a_runtime_folder_the_host_cannot_use_is_host_unavailable(
    cli: CliHost, runtime_dir: Path
) -> None:
    inspect = envelope("inspect", watch_id="w1")
    async with cli.mcp() as session:
        _folder_to_file(runtime_dir)
        try:
            code, message = await call(session, "task_card", inspect)
        finally:
            _file_to_folder(runtime_dir)
        assert code == "host_unavailable", message
        assert message.startswith(
            f"task card host unavailable: runtime dir {runtime_dir} is not a directory;"
        ), message
        assert "set TASKCARD_RUNTIME_DIR (or --runtime-dir) to a private directory" in message
        # With the folder back, the same server starts a host, which answers the call itself.
        answered = (await session.call_tool("task_card", inspect)).structured_content
        assert answered is not None and answered["code"] == "unknown_watch", answered


def test_a_closed_task_card_answers_host_unavailable(
    make_card: Callable[..., TaskCard],
) -> None:
    card = make_card()
    card.close()
    result = card.call(envelope("stop", watch_id="w1"))
    assert result["status"] == "failed" and result["code"] == "host_unavailable", result
    assert "this task card host was closed; open a new TaskCard" in result["message"], result
