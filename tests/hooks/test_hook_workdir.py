"""Where a hook writes: the folder `--workdir` names, else the payload's `cwd` exactly (not
a parent that looks like an agent's: a fresh agent nested in another's workdir would have its
events credited to the outer one). A hook still exits 0 and prints nothing to the host when
it cannot write: the reason is one line on stderr."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .conftest import TASKCARD, hook, kinds, payload, run_taskcard


def _codex(cwd: Path) -> str:
    return json.dumps(
        {"type": "agent-turn-complete", "turn-id": "1", "cwd": str(cwd), "input-messages": []}
    )


def test_without_workdir_the_payloads_cwd_is_the_workdir_even_nested(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    (outer / "taskcard").mkdir(parents=True)  # an agent's workdir...
    inner = outer / "child"
    inner.mkdir()  # ...holding a fresh agent's, which has nothing yet
    done = hook(payload("02_user_prompt_submit.json", inner))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(inner) == ["turn.start"]
    assert not (outer / "logs").exists()
    codex = run_taskcard("hook", "codex", _codex(inner))
    assert (codex.returncode, codex.stdout) == (0, b"")
    assert kinds(inner) == ["turn.start", "turn.end"]


def test_a_cwd_that_is_no_folder_gets_nothing_written(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    done = hook(payload("02_user_prompt_submit.json", missing))
    assert (done.returncode, done.stdout) == (0, b"")
    assert b"not a directory" in done.stderr
    assert not missing.exists()


def test_workdir_option_is_the_configuration_and_is_used_as_given(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    done = hook(payload("02_user_prompt_submit.json", tmp_path), "--workdir", str(project))
    assert (done.returncode, done.stderr) == (0, b"")
    assert kinds(project) == ["turn.start"]
    assert not (tmp_path / "logs").exists()
    missing = hook(payload("02_user_prompt_submit.json", project), "--workdir", str(tmp_path / "x"))
    assert missing.returncode == 0 and b"not a directory" in missing.stderr
    assert not (tmp_path / "x").exists()


def test_a_cwd_that_is_not_absolute_gets_nothing_written(tmp_path: Path) -> None:
    """The hosts send the session's absolute folder; `..` or `~` was read from the hook's own
    folder, and the events went into a folder of no agent (`/`, the home folder)."""
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    for cwd in ("../..", "~", "."):
        data = {**payload("02_user_prompt_submit.json", tmp_path), "cwd": cwd}
        done = subprocess.run(
            [TASKCARD, "hook", "claude-code"],
            input=json.dumps(data).encode(),
            cwd=here,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert (done.returncode, done.stdout) == (0, b""), cwd
        assert b"is not an absolute path; nothing written (pass --workdir)" in done.stderr
        codex = run_taskcard("hook", "codex", "--only-in", str(tmp_path), json.dumps(data))
        assert (codex.returncode, codex.stdout, codex.stderr) == (0, b"", b"")
    assert not list(tmp_path.rglob("events.jsonl"))


@pytest.mark.parametrize("host", ["claude-code", "codex"])
@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("/tmp/two\nlines", b"'/tmp/two\\nlines' is not a directory"),
        ("/" + "a" * 100_000, b"(100001 characters) cannot be used (File name too long)"),
        ("/" + "a/" * 3000, b"(6001 characters) cannot be used (File name too long)"),
    ],
)
def test_a_cwd_that_cannot_be_shown_as_given_is_said_on_one_short_line(
    tmp_path: Path, host: str, name: str, shown: bytes
) -> None:
    """The reason is one line: a cwd with a line break broke it in two, and one too long to
    open came back whole (100 KB on stderr), as a file the hook could not write."""
    data = {**payload("02_user_prompt_submit.json", tmp_path), "cwd": name}
    done = run_taskcard("hook", host, stdin=json.dumps(data))
    assert (done.returncode, done.stdout) == (0, b"")
    assert done.stderr.count(b"\n") == 1 and len(done.stderr) < 500, done.stderr[:500]
    assert shown in done.stderr and b"Traceback" not in done.stderr
    assert not list(tmp_path.rglob("events.jsonl"))


@pytest.mark.parametrize("host", ["claude-code", "codex"])
@pytest.mark.parametrize("name", ["/tmp/a\0b", "\0/tmp", "/tmp/\0"])
def test_a_cwd_holding_a_nul_character_is_named_as_such(
    tmp_path: Path, host: str, name: str
) -> None:
    """A NUL character in `cwd` was called "not an absolute path" (at its start) or "not a
    usable path; give the full path" (further on): neither named what was wrong with it."""
    data = {**payload("02_user_prompt_submit.json", tmp_path), "cwd": name}
    done = run_taskcard("hook", host, stdin=json.dumps(data))
    assert (done.returncode, done.stdout) == (0, b"")
    (line,) = done.stderr.decode().splitlines()
    shown = json.dumps(name)
    assert line == (
        f"taskcard hook {host}: the payload's cwd {shown} holds a NUL character, which no path"
        " can; nothing written (send the session's folder, or pass --workdir)"
    )
    assert not list(tmp_path.rglob("events.jsonl"))
