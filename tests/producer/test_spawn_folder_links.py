"""`taskcard spawn --workdir` and `--parent-workdir` through a symbolic link that leads
nowhere name the link as the user typed it, and that it leads nowhere.

Both were resolved before the check, so the refusal named the link's far end ("'/elsewhere/
gone' is not a directory"), a path the user never typed, with no word of the link. Driven
as a user runs it: `taskcard spawn` as a process, from the folder the names start at.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _spawn(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "taskcard.bridge.cli", "spawn", "--parent", "boss"]
    return subprocess.run(
        [*command, "--reason", "split the work", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


FIXES = {
    "--workdir": "create the child's working directory first",
    "--parent-workdir": "give the parent's working directory, or leave it out",
}


@pytest.mark.parametrize("option", FIXES)
def test_a_folder_that_is_a_dangling_link_is_named_as_typed(tmp_path: Path, option: str) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "gone-link").symlink_to(tmp_path / "moved")
    folders = {"--workdir": "real", "--parent-workdir": "real", option: "gone-link"}
    done = _spawn(tmp_path, *(part for pair in folders.items() for part in pair))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"taskcard spawn: argument {option}: gone-link is a symbolic link that leads nowhere"
        f" (to {tmp_path / 'moved'}, which does not exist); {FIXES[option]}; see `taskcard spawn"
        " --help`\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gone-link", "real"]


@pytest.mark.parametrize("option", FIXES)
def test_a_dangling_folder_link_on_the_way_is_named(tmp_path: Path, option: str) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "team").symlink_to(tmp_path / "moved")
    folders = {"--workdir": "real", "--parent-workdir": "real", option: "team/child"}
    done = _spawn(tmp_path, *(part for pair in folders.items() for part in pair))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"taskcard spawn: argument {option}: team/child is not a directory: the symbolic link"
        f" {tmp_path / 'team'} on its path leads nowhere (to {tmp_path / 'moved'}, which does"
        f" not exist); {FIXES[option]}; see `taskcard spawn --help`\n"
    )
