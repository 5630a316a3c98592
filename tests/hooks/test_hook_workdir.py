"""Where a hook writes when it is not told: only into an agent workdir that holds the cwd.

A Claude Code payload's `cwd` is where the session stands when the hook fires (it follows a
`cd`), and Codex runs one `notify` program for every session of the user. Taken as the
workdir, it made the hook create `logs/` and `.notification/` in any folder (`/etc`, run as
root). A hook still exits 0 and prints nothing to the host: a refusal is one line on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import hook, kinds, payload, run_taskcard


def _codex(cwd: Path) -> str:
    return json.dumps(
        {"type": "agent-turn-complete", "turn-id": "1", "cwd": str(cwd), "input-messages": []}
    )


def test_a_cwd_in_no_agent_workdir_gets_nothing_written(tmp_path: Path) -> None:
    plain = tmp_path / "some-repo"
    (plain / "logs").mkdir(parents=True)  # a project's own logs/ does not make it an agent's
    for name in ("01_session_start.json", "02_user_prompt_submit.json", "10_stop.json"):
        done = hook(payload(name, plain))
        assert (done.returncode, done.stdout) == (0, b""), name
        assert str(plain) in done.stderr.decode() and "--workdir" in done.stderr.decode()
    codex = run_taskcard("hook", "codex", _codex(plain))
    assert (codex.returncode, codex.stdout) == (0, b"")
    assert "in no agent workdir" in codex.stderr.decode()
    assert sorted(p.name for p in plain.rglob("*")) == ["logs"]


def test_a_cwd_below_an_agent_workdir_writes_into_that_workdir(workdir: Path) -> None:
    sub = workdir / "src" / "pkg"
    sub.mkdir(parents=True)
    done = hook(payload("02_user_prompt_submit.json", sub))
    assert (done.returncode, done.stderr) == (0, b"")
    assert kinds(workdir) == ["turn.start"]
    assert not (sub / "logs").exists() and not (workdir / "src" / "logs").exists()


def test_workdir_option_is_the_configuration_and_is_used_as_given(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    done = hook(payload("02_user_prompt_submit.json", tmp_path), "--workdir", str(project))
    assert (done.returncode, done.stderr) == (0, b"")
    assert kinds(project) == ["turn.start"]
    missing = hook(payload("02_user_prompt_submit.json", project), "--workdir", str(tmp_path / "x"))
    assert missing.returncode == 0 and b"not a directory" in missing.stderr
    assert not (tmp_path / "x").exists()


def test_init_codex_marks_its_workdir_so_the_global_notify_writes_there(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    before = run_taskcard("hook", "codex", _codex(project))
    assert before.returncode == 0 and not (project / "logs").exists()
    config = tmp_path / "codex" / "config.toml"
    init = run_taskcard("init", "codex", "--workdir", str(project), "--config", str(config))
    assert init.returncode == 0, init.stderr
    assert b"events.jsonl: created" in init.stdout
    done = run_taskcard("hook", "codex", _codex(project))
    assert (done.returncode, done.stderr) == (0, b"")
    assert kinds(project) == ["turn.end"]
