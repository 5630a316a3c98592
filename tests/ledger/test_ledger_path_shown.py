"""A `--ledger` path in the ledger's refusals is one escaped line, cut when too long.

The ledger's messages printed the path as given: one holding a line break broke the refusal
into two lines, one holding an escape sequence acted on the terminal that showed it (the
workdir and runtime dir are shown escaped since 816ed0a), and a name of 5,000 characters
came back whole in "cannot write ...". Driven as a user runs it: `taskcard ledger` as a process.
"""

from __future__ import annotations

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
    shown = repr(str(workdir / name))
    assert done.stderr == (
        f"taskcard ledger: ledger {shown}: cannot read it (a folder, not a regular file;"
        " replace it with a file)\n"
    )


def test_a_ledger_path_too_long_to_open_is_cut(workdir: Path) -> None:
    name = "y" * 5000
    done = _ledger(workdir, "init", "t1", "--purpose", "p", "--no-renderer", "--ledger", name)
    assert done.returncode != 0 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "(File name too long)" in done.stderr
    assert "y" * 4097 not in done.stderr
    assert "characters)" in done.stderr  # the cut says how long the name was
