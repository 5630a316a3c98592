"""A `--ledger` path in the ledger's refusals is one escaped line, cut when too long.

The ledger's messages printed the path as given: one holding a line break broke the refusal
into two lines, one holding an escape sequence acted on the terminal that showed it (the
workdir and runtime dir are shown escaped since 816ed0a), and a name of 5,000 characters
came back whole in "cannot write ...". Driven as a user runs it: `taskcard ledger` as a process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _ledger(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "ledger", *args, "--workdir", str(workdir)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("name", ["a\x1b[2Jb", "a\nb"])
def test_a_ledger_path_with_controls_is_shown_escaped(workdir: Path, name: str) -> None:
    (workdir / name).mkdir()  # a folder where the ledger file belongs
    done = _ledger(workdir, "heartbeat", "t1", "--ledger", name)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"taskcard ledger: --ledger: {name!r} is a folder, not a regular file; give the"
        " ledger's file (relative paths start at the workdir), or leave --ledger out for"
        " ledger/long-task-ledger.json\n"
    )


def test_a_ledger_path_too_long_to_open_is_cut(workdir: Path) -> None:
    name = "y" * 5000
    done = _ledger(workdir, "init", "t1", "--purpose", "p", "--no-renderer", "--ledger", name)
    assert done.returncode != 0 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "(File name too long)" in done.stderr
    assert "y" * 4097 not in done.stderr
    assert "characters)" in done.stderr  # the cut says how long the name was


@pytest.mark.parametrize("name", ["w\x1b[2Jx", "w\nx"])
def test_a_workdir_with_controls_is_shown_escaped_where_the_ledger_leads_out(
    tmp_path: Path, name: str
) -> None:
    """The refusal of a ledger folder linked out of the workdir names the workdir too: one
    holding an escape sequence or a line break is shown escaped there, as in the path before
    it, not raw (which acted on the terminal, or broke the refusal in two)."""
    workdir = tmp_path / name
    workdir.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (workdir / "ledger").symlink_to(tmp_path / "elsewhere")
    done = _ledger(workdir, "show")
    assert (done.returncode, done.stdout) == (2, "")
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "\x1b" not in done.stderr
    assert f"leads out of the workdir {str(workdir)!r} through a symlink" in done.stderr
    assert "the ledger/ folder or the file" in done.stderr


@pytest.mark.parametrize("name", ["w\x1b[2Jx", "w\nx"])
def test_a_planted_ledger_lock_is_named_escaped(tmp_path: Path, name: str) -> None:
    """A link planted at the ledger's lock is refused naming the lock, escaped as the
    ledger's own path is (it was printed raw)."""
    workdir = tmp_path / name
    (workdir / "ledger").mkdir(parents=True)
    lock = workdir / "ledger" / "long-task-ledger.json.lock"
    lock.symlink_to(tmp_path / "nowhere")
    done = _ledger(workdir, "heartbeat", "t1")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"taskcard ledger: ledger lock {str(lock)!r}: a symlink")
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_folder_at_the_ledger_lock_is_refused_as_a_named_pipe_is(
    tmp_path: Path, kind: str
) -> None:
    """A named pipe at the lock exited 2 with "a symlink or not a regular file; remove it", a
    folder there 1 with "cannot write ... (Is a directory)": the same fault, now said alike."""
    workdir = tmp_path / "w"
    (workdir / "ledger").mkdir(parents=True)
    lock = workdir / "ledger" / "long-task-ledger.json.lock"
    lock.mkdir() if kind == "folder" else os.mkfifo(lock)
    done = _ledger(workdir, "init", "t1", "--purpose", "p", "--no-renderer")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"taskcard ledger: ledger lock {lock}: a symlink or not a regular file; only"
        " taskcard creates it, so remove it (it is made again)\n"
    )
