"""`--ledger PATH` of every `ledger` command: a name that cannot be a ledger file is a usage
error (exit 2) naming the option and the fix, and nothing is written.

Behind a symbolic link that leads nowhere, `ledger show` said the ledger had no task and
`ledger init` replaced the user's link with a file; `~` was not expanded (a folder named `~`
appeared in the workdir); a path under a regular file was the system's "cannot write ...
(File exists)", exit 1. Driven as a user runs it: `taskcard ledger` as a process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Each command with the least it needs besides the ledger to get as far as the ledger.
COMMANDS = {
    "init": ["init", "t1", "--purpose", "p", "--no-renderer"],
    "checkpoint": ["checkpoint", "t1", "--event-type", "STARTED"],
    "block": ["block", "t1", "--reason", "r"],
    "external-job": ["external-job", "t1", "--job-id", "j", "--status", "running"],
    "download-observed": ["download-observed", "t1", "--name", "d", "--bytes", "1"],
    "owner-reply": ["owner-reply", "t1", "--reply", "A"],
    "heartbeat": ["heartbeat", "t1"],
    "show": ["show"],
    "render": ["render"],
    "supervise": ["supervise"],
}


def _ledger(
    workdir: Path, args: list[str], ledger: str, home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if home is not None:
        env["HOME"] = str(home)
    command = [sys.executable, "-m", "taskcard.bridge.cli", "ledger", *args]
    return subprocess.run(
        [*command, "--workdir", str(workdir), f"--ledger={ledger}"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _refused(done: subprocess.CompletedProcess[str], words: str) -> None:
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == f"taskcard ledger: --ledger: {words}\n"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_ledger_behind_a_dangling_link_is_named_as_one(workdir: Path, command: str) -> None:
    (workdir / "mine.json").symlink_to("gone/ledger.json")
    done = _ledger(workdir, COMMANDS[command], "mine.json")
    _refused(
        done,
        "mine.json is a symbolic link that leads nowhere (to gone/ledger.json, which does not"
        " exist); restore what it points to, or fix the link",
    )
    assert os.readlink(workdir / "mine.json") == "gone/ledger.json"  # the link is left alone
    assert sorted(os.listdir(workdir)) == ["mine.json"]


def test_a_dangling_folder_link_on_the_way_is_named(workdir: Path) -> None:
    (workdir / "ledgers").symlink_to(workdir / "moved")
    done = _ledger(workdir, COMMANDS["init"], "ledgers/l.json")
    _refused(
        done,
        f"ledgers/l.json cannot be reached: the symbolic link {workdir / 'ledgers'} on its path"
        f" leads nowhere (to {workdir / 'moved'}, which does not exist); restore what it points"
        " to, or fix the link",
    )
    assert sorted(os.listdir(workdir)) == ["ledgers"]


@pytest.mark.parametrize("command", ["init", "show", "heartbeat"])
def test_a_ledger_in_a_loop_of_links_is_said_as_one(workdir: Path, command: str) -> None:
    (workdir / "loop.json").symlink_to("loop.json")
    done = _ledger(workdir, COMMANDS[command], "loop.json")
    _refused(
        done,
        "loop.json is a symbolic link that goes round a loop of symbolic links (to loop.json);"
        " fix the links, or give the file itself",
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_a_ledger_under_a_file_is_a_usage_error(workdir: Path, command: str) -> None:
    (workdir / "notes.txt").write_text("mine\n")
    done = _ledger(workdir, COMMANDS[command], "notes.txt/ledger.json")
    _refused(
        done,
        f"notes.txt/ledger.json goes through a file as if it were a folder ({workdir}/notes.txt"
        " is a file); give a path in a folder",
    )
    assert (workdir / "notes.txt").read_text() == "mine\n"


def test_a_ledger_under_home_is_expanded(tmp_path: Path, workdir: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    done = _ledger(workdir, COMMANDS["init"], "~/tasks.json", home=home)
    assert done.returncode == 0, done.stderr
    assert (home / "tasks.json").is_file()
    assert not (workdir / "~").exists()
    shown = _ledger(workdir, COMMANDS["show"], "~/tasks.json", home=home)
    assert shown.returncode == 0, shown.stderr
    assert '"task_id": "t1"' in shown.stdout


@pytest.mark.parametrize("command", ["init", "show"])
def test_a_ledger_under_an_unknown_user_is_a_usage_error(workdir: Path, command: str) -> None:
    done = _ledger(workdir, COMMANDS[command], "~no-such-user-of-taskcard/l.json")
    _refused(
        done,
        "~no-such-user-of-taskcard/l.json cannot be expanded (no such user); give the full path",
    )
    assert os.listdir(workdir) == []


@pytest.mark.parametrize("kind", ["folder", "named pipe"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_ledger_that_is_no_file_is_refused_and_nothing_is_made(
    workdir: Path, command: str, kind: str
) -> None:
    """Named as the option and what the name is, as every other --ledger refusal: it was the
    store's "ledger PATH: cannot read it (a folder, not a regular file; replace it with a
    file)", without the option, and with a fix that undid the user's folder. The refusal was
    right, but every command that writes left `led.lock` beside the name."""
    if kind == "folder":
        (workdir / "led").mkdir()
    else:
        os.mkfifo(workdir / "led")
    # `block` refuses a missing --kind before it looks at the ledger.
    kind_given = ["--kind", "OTHER"] if command == "block" else []
    done = _ledger(workdir, [*COMMANDS[command], *kind_given], "led")
    what = "a folder" if kind == "folder" else "a named pipe"
    _refused(
        done,
        f"led is {what}, not a regular file; give the ledger's file (relative paths start at"
        " the workdir), or leave --ledger out for ledger/long-task-ledger.json",
    )
    assert os.listdir(workdir) == ["led"]
