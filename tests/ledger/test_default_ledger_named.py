"""The default ledger (`ledger/long-task-ledger.json` in the workdir) when it cannot be a
ledger file: named as the workdir's default ledger, with a fix that fits it. The refusal said
`--ledger: ...` and, for a folder at its name, "or leave --ledger out for" the very path it
refused, to a user who had typed no `--ledger`. Driven as a user runs it: `taskcard ledger`
as a process, without the option."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = {
    "init": ["init", "t1", "--purpose", "p", "--no-renderer"],
    "checkpoint": ["checkpoint", "t1", "--event-type", "STARTED"],
    "show": ["show"],
}


def _block(workdir: Path, kind: str) -> str:
    """Put `kind` in the default ledger's way; the words that follow its name."""
    if kind == "file on the way":
        (workdir / "ledger").write_text("")
        return (
            f"goes through a file as if it were a folder ({workdir / 'ledger'} is a file);"
            " move that file aside, or give another ledger file with --ledger"
        )
    if kind == "folder at its name":
        (workdir / "ledger" / "long-task-ledger.json").mkdir(parents=True)
        return (
            "is a folder, not a regular file; move it aside (the ledger is a file there), or"
            " give another ledger file with --ledger"
        )
    (workdir / "ledger").symlink_to("gone")
    return "cannot be reached: the symbolic link"


@pytest.mark.parametrize("kind", ["file on the way", "folder at its name", "dangling link"])
@pytest.mark.parametrize("command", COMMANDS)
def test_the_default_ledger_is_named_as_such_not_as_the_option(
    workdir: Path, command: str, kind: str
) -> None:
    words = _block(workdir, kind)
    before = sorted(os.listdir(workdir))
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "ledger", *COMMANDS[command],
         "--workdir", str(workdir)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    default = workdir / "ledger" / "long-task-ledger.json"
    head = f"taskcard ledger: the workdir's default ledger {default} "
    assert done.stderr.startswith(head + words), done.stderr
    assert "--ledger:" not in done.stderr and "leave --ledger out" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert sorted(os.listdir(workdir)) == before
