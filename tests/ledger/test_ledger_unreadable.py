"""A ledger that cannot be read says which file, why and what to do, from the Python API
and the MCP `ledger` tool alike, in the words of `taskcard ledger --ledger`.

The store said "ledger PATH: cannot read it (Too many levels of symbolic links)" (or "(Not a
directory)", "(Input/output error)") and nothing more: the command line looks at its
`--ledger` first and named the link or the file on the way with the fix, while the API and
MCP, which have no option to look at, got the bare system words. Driven through `Ledger` and
the SDK's real stdio client against `taskcard mcp`; EIO comes from a server process whose
`os.open` fails for the ledger's name (no file system fails on demand, FUSE aside).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.ledger import Ledger, LedgerError
from taskcard.producers.ledger.store import DEFAULT_LEDGER
from tests.conftest import failing_open, mcp_session

# `taskcard` whose `os.open` of a path ending in the default ledger's name fails with EIO.
FAULTY_TASKCARD = failing_open(str(DEFAULT_LEDGER))

EIO_WORDS = (
    ": cannot read it (Input/output error, EIO); nothing is wrong with the name: call again,"
    " and if it keeps failing, check the file system that holds it"
)


def _unreadable(workdir: Path, kind: str) -> str:
    """Makes the workdir's ledger unreadable in the way `kind` names; what the error says
    after the ledger's path."""
    folder = (workdir / DEFAULT_LEDGER).parent
    if kind == "loop":
        folder.mkdir()
        (workdir / DEFAULT_LEDGER).symlink_to(DEFAULT_LEDGER.name)
        return (
            f" is a symbolic link that goes round a loop of symbolic links (to"
            f" {DEFAULT_LEDGER.name}); fix the links, or give the file itself"
        )
    folder.write_text("mine\n")
    return f" goes through a file as if it were a folder ({folder} is a file); give a path"


@pytest.mark.parametrize("kind", ["loop", "file on the way"])
def test_the_api_says_which_file_why_and_the_fix(workdir: Path, kind: str) -> None:
    said = _unreadable(workdir, kind)
    path = workdir / DEFAULT_LEDGER
    for inside in (workdir, None):
        with pytest.raises(LedgerError) as raised:
            Ledger(path, inside=inside).read()
        assert str(raised.value).startswith(f"ledger {path}{said}"), raised.value


def test_the_api_says_an_io_error_with_its_errno_and_the_fix(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = workdir / DEFAULT_LEDGER
    real_open = os.open

    def failing(name: Any, *args: Any, **kwargs: Any) -> int:
        if os.fspath(name).endswith(str(DEFAULT_LEDGER)):
            raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(name))
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing)  # the system, not our code, fails
    with pytest.raises(LedgerError) as raised:
        Ledger(path, inside=workdir).read()
    assert str(raised.value) == f"ledger {path}{EIO_WORDS}"


@pytest.mark.parametrize("kind", ["loop", "file on the way", "EIO"])
async def test_the_mcp_ledger_tool_says_which_file_why_and_the_fix(
    workdir: Path, runtime_dir: Path, kind: str
) -> None:
    taskcard: tuple[str, ...] = (sys.executable, "-m", "taskcard.bridge.cli")
    if kind == "EIO":
        said = EIO_WORDS
        taskcard = FAULTY_TASKCARD
    else:
        # The tool takes no path: a file on the way is moved aside, not another path given.
        said = _unreadable(workdir, kind).replace("give a path", "move that file aside")
    path = workdir / DEFAULT_LEDGER  # tmp_path is resolved already, as the server resolves
    async with mcp_session(workdir, runtime_dir, taskcard) as session:
        result = await session.call_tool("ledger", {"command": "show", "task_id": "t1"})
    content = result.structured_content
    assert result.is_error and isinstance(content, dict), result
    assert content["message"].startswith(f"ledger {path}{said}"), content
    # The system's failure, or the file's own problem: told apart by the code.
    assert content["code"] == ("read_failed" if kind == "EIO" else "unusable_file"), content


def test_the_command_line_exits_1_for_an_io_error_and_2_for_the_files_own_problem(
    workdir: Path,
) -> None:
    """An EIO is the system failing, not input to mend: exit 1, as a failed write is and as
    the exit codes table says (it exited 2, the code of bad input). `/proc/self/mem` is a
    regular file whose read at offset 0 fails with EIO in every process, no root needed."""
    taskcard = (sys.executable, "-m", "taskcard.bridge.cli", "ledger")
    where = ("--workdir", str(workdir))
    for command in ("show", "render"):
        done = subprocess.run(
            [*taskcard, command, *where, "--ledger", "/proc/self/mem"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done
        assert done.stderr == f"taskcard ledger: ledger /proc/self/mem{EIO_WORDS}\n", done.stderr
    # An EIO at the default ledger, from a `taskcard` whose `os.open` fails for its name.
    done = subprocess.run(
        [*FAULTY_TASKCARD, "ledger", "show", *where],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert done.stderr.endswith(f"{DEFAULT_LEDGER}{EIO_WORDS}\n"), done.stderr
    said = _unreadable(workdir, "loop")  # the file's own problem: still exit 2
    done = subprocess.run(
        [*taskcard, "show", *where], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done
    assert said in done.stderr, done.stderr
