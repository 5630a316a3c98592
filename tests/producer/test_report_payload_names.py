"""`taskcard report --payload NAME` with an empty NAME, or one holding terminal controls.

An empty name was read as `.`, the current folder, and refused as "cannot read  (Is a
directory)" about a folder nobody named; a name holding an escape sequence was printed raw
in the refusal, acting on the terminal that showed it. Driven as a person at a shell.
"""

from __future__ import annotations

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
