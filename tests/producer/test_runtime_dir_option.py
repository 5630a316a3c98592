"""An empty `--runtime-dir` is a usage error naming it, for every command that reaches a host.

It meant the default runtime folder without a word: a script passing `--runtime-dir "$DIR"`
with `DIR` unset started, or talked to, a host in `/tmp/taskcard-UID` (or
`$XDG_RUNTIME_DIR/taskcard`) instead of the one it named, and `card start` in two such scripts
reported "already runs" for a host nobody asked for. An empty `--workdir` and `--config` are
refused alike. Driven as a person at a shell: `taskcard` as a process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = [
    ["card", "settings"],
    ["card", "start", "r.py"],
    ["card", "inspect", "tc_1"],
    ["tool", '{"action": "settings", "input": {}, "reasoning": "r"}'],
    ["host"],
    ["mcp"],
    ["ledger", "supervise"],
]


@pytest.mark.parametrize("empty", ["", "  "])
@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_an_empty_runtime_dir_is_a_usage_error_naming_it(
    workdir: Path, tmp_path: Path, command: list[str], empty: str
) -> None:
    (workdir / "r.py").write_text('print("# Work")\n')
    default = tmp_path / "default-runtime"
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", *command, "--runtime-dir", empty],
        cwd=workdir,
        env={**os.environ, "TASKCARD_RUNTIME_DIR": str(default)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    prog = "taskcard " + " ".join(command[:2] if command[0] in ("card", "ledger") else command[:1])
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        f"{prog}: argument --runtime-dir: is empty; give a private directory for the hosts'"
        f" sockets and locks, or leave the option out for the default; see `{prog} --help`"
    ]
    assert not default.exists()  # no host was started in the default folder
