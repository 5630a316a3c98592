"""What the system fails or refuses around the inbox, outside the reads of its folders, is
said as those are (`read_failed`): the file, the cause and the fix, on every way in (the
command line as a subprocess, the `inbox` MCP tool over stdio, the Python API). It was
"cannot read the inbox: [Errno 28] No space left on device: 'taken'" (a folder a claim
creates), "... Input/output error: '/path'" (the workdir itself), and, for `--peek` whose
output could not be written (a full disk, a closed pipe), "cannot read the inbox" too.

The system's failures are made on demand by a `taskcard` whose `os.mkdir` (or `os.open`)
of a name fails (`failing`): no file system fails on demand, and as root no folder refuses
a write.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.inbox import InboxReadFailed, InboxWriteFailed, claim_all, peek
from tests.conftest import TASKCARD_MODULE, failing_open, mcp_session

from .conftest import queue

READ_FIX = "nothing is wrong with the name: call again, and if it keeps failing, check the file"
WRITE_FIX = "move what is in the way aside or make it writable"

# `taskcard` whose `os.mkdir` of a name in NAMES fails with ENOSPC.
_FAILING_MKDIR = """
import errno, os, sys
NAMES = {names!r}
real_mkdir = os.mkdir
def failing(path, *args, **kwargs):
    if os.fspath(path) in NAMES:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    return real_mkdir(path, *args, **kwargs)
os.mkdir = failing
from taskcard.bridge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def failing_mkdir(*names: str) -> tuple[str, ...]:
    return (sys.executable, "-c", _FAILING_MKDIR.format(names=names))


def inbox(
    taskcard: tuple[str, ...], workdir: Path, *args: str, stdout: Any = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*taskcard, "inbox", "--workdir", str(workdir), *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def queued(workdir: Path) -> Path:
    """A workdir with one message queued and no `taken/` yet (a first claim creates it)."""
    queue(workdir, "m1", "hello")
    (workdir / "inbox" / "taken").rmdir()
    return workdir


async def test_a_folder_a_claim_cannot_create_is_named_with_the_cause_and_the_fix(
    queued: Path, runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = f"cannot write inbox/taken/ (No space left on device); {WRITE_FIX}"
    done = inbox(failing_mkdir("taken"), queued)
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr == f"taskcard inbox: {said}\n"
    async with mcp_session(queued, runtime_dir, failing_mkdir("taken")) as session:
        result = await session.call_tool("inbox", {})
    assert result.structured_content == {
        "status": "failed",
        "code": "write_failed",
        "message": said,
    }
    real_mkdir = os.mkdir

    def full(path: Any, *args: Any, **kwargs: Any) -> None:
        if path == "taken":  # the system's call, not ours: no room left
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", full)
    with pytest.raises(InboxWriteFailed) as raised:
        claim_all(queued, "mcp")
    assert str(raised.value) == said
    assert [path.name for path in (queued / "inbox" / "queued").iterdir()] == ["m1.json"]


async def test_a_workdir_the_system_fails_to_read_is_named_with_the_errno_and_the_fix(
    queued: Path, runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = f"{queued}: cannot read it (Input/output error, EIO); {READ_FIX}"
    for args in ((), ("--peek",)):
        done = inbox(failing_open(str(queued), reads_only=True), queued, *args)
        assert (done.returncode, done.stdout) == (1, ""), done
        assert done.stderr.startswith(f"taskcard inbox: {said}"), done.stderr
    async with mcp_session(
        queued, runtime_dir, failing_open(str(queued), reads_only=True)
    ) as session:
        for arguments in ({}, {"peek": True}):
            result = await session.call_tool("inbox", arguments)
            assert result.structured_content == {
                "status": "failed",
                "code": "read_failed",
                "message": f"{said} system that holds it",
            }
    real_open = os.open

    def failing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == str(queued):  # the system failing, not our code
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing)
    for call in (peek, lambda folder: claim_all(folder, "mcp")):
        with pytest.raises(InboxReadFailed) as raised:
            call(queued)
        assert str(raised.value).startswith(said), raised.value
    monkeypatch.undo()
    async with mcp_session(queued, runtime_dir) as session:  # read once the system reads it
        result = await session.call_tool("inbox", {"peek": True})
    assert isinstance(result.structured_content, dict), result
    assert [m["id"] for m in result.structured_content["messages"]] == ["m1"]


@pytest.mark.parametrize("args", [("--peek",), ("--peek", "--json")])
def test_a_peek_whose_output_cannot_be_written_says_so(queued: Path, args: tuple[str, ...]) -> None:
    """`--peek > /dev/full` said "cannot read the inbox: [Errno 28] No space left on
    device": the inbox was read; its output could not be written. Said as a claim's is."""
    with open("/dev/full", "w") as full:
        done = inbox(TASKCARD_MODULE, queued, *args, stdout=full)
    assert done.returncode == 141, done.stderr
    assert done.stderr == (
        "taskcard inbox: cannot write the output (No space left on device); --peek claims"
        " nothing: all stay queued\n"
    )
    assert [path.name for path in (queued / "inbox" / "queued").iterdir()] == ["m1.json"]
