"""`taskcard report --payload NAME` with an empty NAME, or one holding terminal controls.

An empty name was read as `.`, the current folder, and refused as "cannot read  (Is a
directory)" about a folder nobody named; a name holding an escape sequence was printed raw
in the refusal, acting on the terminal that showed it. Driven as a person at a shell.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TASKCARD = str(Path(sys.executable).parent / "taskcard")


def _report(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TASKCARD, "report", "--workdir", str(workdir), "--ok", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_payload_name_is_refused_naming_the_option(workdir: Path, empty: str) -> None:
    done = _report(workdir, "--payload", empty)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "taskcard report: --payload: is empty; give the file to read, or - for stdin\n"
    )
    assert not (workdir / "reports").exists()


def test_a_payload_name_with_controls_is_shown_escaped(workdir: Path) -> None:
    done = _report(workdir, "--payload", "notes\x1b[2J.txt")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "taskcard report: --payload: cannot read 'notes\\x1b[2J.txt' (No such file or directory)\n"
    )
    assert not (workdir / "reports").exists()


@pytest.mark.parametrize("kind", ["dangling", "folder link", "loop"])
def test_a_payload_behind_a_broken_link_says_the_link(
    workdir: Path, tmp_path: Path, kind: str
) -> None:
    """A payload named through a link that leads nowhere was "No such file or directory"
    about a name `ls` shows, and one in a loop of links Python's "Too many levels of
    symbolic links" with no fix. Each names the link (and where it points) and the fix."""
    gone = tmp_path / "gone"
    if kind == "dangling":
        named = workdir / "notes.md"
        named.symlink_to(gone)
        says = f"{named} is a symbolic link that leads nowhere (to {gone}, which does not exist)"
    elif kind == "folder link":
        (workdir / "out").symlink_to(gone)
        named = workdir / "out" / "notes.md"
        says = (
            f"{named} cannot be read: the symbolic link {workdir / 'out'} on its path leads"
            f" nowhere (to {gone}, which does not exist)"
        )
    else:
        named = workdir / "a.md"
        named.symlink_to("b.md")
        (workdir / "b.md").symlink_to("a.md")
        says = (
            f"{named} is a symbolic link that goes round a loop of symbolic links (to b.md);"
            " fix the links, or name the file itself"
        )
    done = _report(workdir, "--summary", "s", "--payload", str(named))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith(f"taskcard report: --payload: {says}"), done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert not (workdir / "reports").exists()


def test_a_payload_name_with_an_unexpanded_tilde_is_read_from_home(
    workdir: Path, tmp_path: Path
) -> None:
    """`--payload=~/notes.md` reaches the command as typed (no shell expands a `~` after
    `=`): it was "No such file or directory" about a file that is there."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.md").write_text("all green\n")
    done = subprocess.run(
        [TASKCARD, "report", "--workdir", str(workdir), "--ok", "--payload=~/notes.md"],
        cwd=workdir,
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (workdir / "reports" / "payloads" / "1.txt").read_text() == "all green\n"
    done = _report(workdir, "--summary", "s", "--payload", "~no-such-user-x/notes.md")
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        "taskcard report: --payload: ~no-such-user-x/notes.md cannot be expanded (no such"
        " user); give the full path\n"
    )


@pytest.mark.parametrize("under", ["notes.txt/x", "notes.txt/x/y.md"])
def test_a_payload_under_a_file_names_the_file(workdir: Path, under: str) -> None:
    """A payload named under a regular file was "cannot read notes.txt/x (Not a directory)",
    naming no file; it is said as the other path options say it (`file_path_problem`)."""
    (workdir / "notes.txt").write_text("mine\n")
    done = _report(workdir, "--summary", "s", "--payload", under)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        f"taskcard report: --payload: {under} goes through a file as if it were a folder"
        f" ({workdir / 'notes.txt'} is a file); give a path in a folder\n"
    )
    assert (workdir / "notes.txt").read_text() == "mine\n"
    assert not (workdir / "reports").exists()
