"""`manual` and `settings` only read: whichever way they come in (`taskcard tool`, `taskcard
card`, MCP over stdio with the SDK's client), they answer without starting a host and leave
the workdir exactly as it was, as the manual says (`manual` "does not enter the watch
manager"; SHOW "never creates or changes taskcard/taskcard.json, never runs the one-time
migration"). A watch a killed host left is resumed by the next call that needs a host.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from mcp import types

from .conftest import STATIC_RENDERER, CliHost, write_renderer

Snapshot = dict[str, tuple[str, int, int, str]]


def snapshot(root: Path) -> Snapshot:
    """Every name under `root` (links not followed): its kind, mode, mtime and content."""
    found: Snapshot = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            info = path.lstat()
            kind = "dir" if path.is_dir() and not path.is_symlink() else "other"
            digest = ""
            if path.is_file() and not path.is_symlink():
                kind, digest = "file", hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(root))] = (kind, info.st_mode, info.st_mtime_ns, digest)
    return found


def no_taskcard_folder(workdir: Path) -> None:
    del workdir


def legacy_settings(workdir: Path) -> None:
    """What the first `start` migrates into taskcard/taskcard.json: SHOW only previews it."""
    (workdir / "telegram").mkdir()
    (workdir / "telegram" / "taskcard.json").write_text('{"max_refreshes": 300}\n')


def owner_settings(workdir: Path) -> None:
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_text('{"interval_s": 7}\n')


WORKDIRS = {
    "no taskcard folder": no_taskcard_folder,
    "legacy settings": legacy_settings,
    "owner settings": owner_settings,
}
EXPECTED_MAX_REFRESHES = {
    "no taskcard folder": 2000,
    "legacy settings": 300,
    "owner settings": 2000,
}


def manual_text() -> str:
    return resources.files("taskcard.producers.task_card").joinpath("SKILL.md").read_text("utf-8")


def check_answers(kind: str, workdir: Path, manual: dict[str, Any], shown: dict[str, Any]) -> None:
    """The answers as a host gave them: the manual's text, the five rows and the document."""
    assert manual == {"action": "manual", "status": "ok", "manual": manual_text()}
    assert (shown["action"], shown["status"]) == ("settings", "ok"), shown
    assert shown["settings_path"] == str(workdir.resolve() / "taskcard" / "taskcard.json")
    rows = {row["key"]: row for row in shown["settings"]}
    assert list(rows) == [
        "interval-s",
        "timeout-s",
        "max-refreshes",
        "reminder-turns",
        "max-body-chars",
    ]
    assert rows["max-refreshes"]["current"] == EXPECTED_MAX_REFRESHES[kind]
    assert rows["interval-s"]["current"] == (7 if kind == "owner settings" else 5.0)
    if kind == "legacy settings":
        assert "legacy telegram/taskcard.json" in rows["max-refreshes"]["comment"]


def no_host(cli: CliHost, runtime_dir: Path) -> None:
    """Nothing was started for the workdir: no lock, socket or log in the runtime folder."""
    assert sorted(os.listdir(runtime_dir)) == []
    assert cli.host_pid() is None


@pytest.mark.parametrize("kind", list(WORKDIRS))
def test_tool_and_card_answer_manual_and_settings_without_a_host_or_a_write(
    kind: str, workdir: Path, runtime_dir: Path, cli: CliHost
) -> None:
    WORKDIRS[kind](workdir)
    before = snapshot(workdir)
    calls = []
    for action in ("manual", "settings"):
        envelope = json.dumps({"action": action, "input": {}, "reasoning": "look"})
        done = cli.run("tool", envelope)
        assert done.returncode == 0, done.stderr
        calls.append(json.loads(done.stdout))
    check_answers(kind, workdir, *calls)
    # The summary a caller may ask for is the host's too.
    summarized = {"action": "settings", "input": {}, "reasoning": "look", "summarize": True}
    assert cli.json("tool", json.dumps(summarized))["summary"] == "settings: ok"
    # `card` gives the same answers (it never used a host for these).
    check_answers(kind, workdir, cli.json("card", "manual"), cli.json("card", "settings"))
    assert snapshot(workdir) == before
    no_host(cli, runtime_dir)


@pytest.mark.parametrize("kind", list(WORKDIRS))
async def test_mcp_answers_manual_and_settings_without_a_host_or_a_write(
    kind: str, workdir: Path, runtime_dir: Path, cli: CliHost
) -> None:
    WORKDIRS[kind](workdir)
    async with cli.mcp() as session:
        # The server's own wake cursor is written when it starts; the calls write nothing.
        before = snapshot(workdir)
        answers = []
        for action in ("manual", "settings"):
            envelope = {"action": action, "input": {}, "reasoning": "look"}
            result: types.CallToolResult = await session.call_tool("task_card", envelope)
            assert not result.is_error, result.structured_content
            assert isinstance(result.structured_content, dict)
            answers.append(result.structured_content)
        check_answers(kind, workdir, *answers)
        assert snapshot(workdir) == before
    assert "taskcard" not in os.listdir(workdir) or kind == "owner settings"
    no_host(cli, runtime_dir)


def test_settings_do_not_resume_a_watch_a_killed_host_left(
    workdir: Path, runtime_dir: Path, cli: CliHost
) -> None:
    """A watch.json left behind is resumed by the next call that needs a host (`inspect`
    here), not by a look at the settings or the manual."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["status"] == "watching"
    cli.shutdown()  # stops as a killed host would leave it: watch.json stays
    for name in os.listdir(runtime_dir):
        (runtime_dir / name).unlink()
    before = snapshot(workdir)
    for action in ("manual", "settings"):
        envelope = json.dumps({"action": action, "input": {}, "reasoning": "look"})
        assert cli.run("tool", envelope).returncode == 0
    assert snapshot(workdir) == before
    no_host(cli, runtime_dir)
    assert cli.json("card", "inspect", "tc_1")["status"] == "watching"


async def test_settings_through_a_card_folder_linked_out_of_the_workdir_are_refused(
    workdir: Path, tmp_path: Path, runtime_dir: Path, cli: CliHost
) -> None:
    """`taskcard/` planted as a link to another folder: its settings are not this workdir's,
    and nothing is read through it. Every caller says so as for the calls a host answers
    (`tool` and `card` exit 2 naming the folder, MCP a failed result); answered without a
    host, `tool` and MCP read the other folder's taskcard.json as this workdir's."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "taskcard.json").write_text('{"interval_s": 7}\n')
    (workdir / "taskcard").symlink_to(other)
    refusal = f"{workdir / 'taskcard'} is a symlink that leads out of the workdir"
    envelope = {"action": "settings", "input": {}, "reasoning": "look"}
    for command in (("tool", json.dumps(envelope)), ("card", "settings")):
        done = cli.run(*command)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert refusal in done.stderr
        assert '"current": 7' not in done.stdout
    async with cli.mcp() as session:
        result: types.CallToolResult = await session.call_tool("task_card", envelope)
    assert result.is_error
    assert isinstance(result.structured_content, dict)
    assert refusal in result.structured_content["message"], result.structured_content
    no_host(cli, runtime_dir)


@pytest.mark.parametrize("action", ["manual", "settings"])
def test_manual_and_settings_work_from_a_folder_holding_the_runtime_folder(
    runtime_dir: Path, action: str
) -> None:
    """`taskcard card manual` and `card settings` use no host, so a runtime folder inside the
    default workdir `.` (a shell in the home folder with `TASKCARD_RUNTIME_DIR=~/rt`) is no
    concern of theirs: they were refused with exit 2 "is inside the workdir", as a call that
    puts its host's lock and socket there is (and still is)."""
    here = runtime_dir  # short: the folder the command runs in, the default workdir
    env = {**os.environ, "TASKCARD_RUNTIME_DIR": str(here / "rt")}
    before = snapshot(here)
    for command in (["card", action], ["tool", json.dumps(envelope_of(action))]):
        done = subprocess.run(
            [sys.executable, "-m", "taskcard.bridge.cli", *command],
            cwd=here, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", done.stderr
    assert snapshot(here) == before  # no runtime folder made, nothing written
    inspect = ["card", "inspect", "w1"]  # a call a host answers: still refused, naming it
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", *inspect],
        cwd=here, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "TASKCARD_RUNTIME_DIR" in done.stderr and "is inside the workdir" in done.stderr


def envelope_of(action: str) -> dict[str, Any]:
    return {"action": action, "input": {}, "reasoning": "look"}
