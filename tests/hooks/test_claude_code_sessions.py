"""Several Claude Code sessions in one workdir (a `/fork` copy, `/branch`, a background
session) and stops that wait on background work, driven as Claude Code drives the hook."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from taskcard.bridge.track.activity import ActivityTracker
from taskcard.producers.task_card.contract import CardPaths
from taskcard.producers.task_card.turns import completed_turns

from .conftest import events, hook, kinds, run_taskcard

SESSIONS = Path("logs") / ".taskcard-hook-sessions.json"


def send(workdir: Path, session: object, name: str, **fields: object) -> None:
    data: dict[str, Any] = {"cwd": str(workdir), "hook_event_name": name, **fields}
    if session is not None:
        data["session_id"] = session
    done = hook(json.dumps(data).encode())
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b""), name


def state_of(workdir: Path) -> str:
    """The agent state the service reads from the activity log, now."""
    tracker = ActivityTracker()
    for line in (workdir / "logs" / "events.jsonl").read_bytes().splitlines():
        tracker.feed(line)
    return tracker.summary(datetime.now(UTC), no_output_after_s=600).state


def test_a_fork_neither_resets_nor_ends_the_card_of_the_session_at_work(workdir: Path) -> None:
    # The order a real host sends: the main session starts and works, `/fork` starts a
    # background copy in the same workdir, both work, the fork ends, then the main.
    send(workdir, "main", "SessionStart", source="startup")
    send(workdir, "main", "UserPromptSubmit", prompt="refactor the parser")
    send(workdir, "main", "PreToolUse", tool_name="Bash", tool_use_id="t1", tool_input={})
    send(workdir, "fork", "SessionStart", source="fork")
    assert kinds(workdir) == ["agent.start", "turn.start", "tool.start"]  # no reset
    assert state_of(workdir) == "running"
    send(workdir, "fork", "UserPromptSubmit", prompt="and write the docs")
    send(workdir, "fork", "PreToolUse", tool_name="Edit", tool_use_id="f1", tool_input={})
    send(workdir, "fork", "PostToolUse", tool_name="Edit", tool_use_id="f1", tool_input={})
    send(workdir, "fork", "Stop", stop_hook_active=False)
    # The fork's turn ended while the main's goes on: the card still reads busy.
    assert "turn.end" not in kinds(workdir)
    assert state_of(workdir) == "running"
    send(workdir, "main", "PostToolUse", tool_name="Bash", tool_use_id="t1", tool_input={})
    send(workdir, "fork", "SessionEnd", reason="other")
    assert "agent.exit" not in kinds(workdir)  # the main works on
    send(workdir, "main", "Stop", stop_hook_active=False)
    assert kinds(workdir)[-1] == "turn.end"
    assert state_of(workdir) == "idle"
    send(workdir, "main", "SessionEnd", reason="prompt_input_exit")
    assert kinds(workdir)[-1] == "agent.exit"  # the last live session: the agent exited
    assert state_of(workdir) == "exited"
    # Both completed turns count for the reminders.
    assert completed_turns(CardPaths(workdir)) == 2
    assert json.loads((workdir / SESSIONS).read_text()) == {}


def test_the_card_waits_while_one_session_waits_on_a_person(workdir: Path) -> None:
    send(workdir, "main", "SessionStart", source="startup")
    send(workdir, "fork", "SessionStart", source="fork")
    send(workdir, "main", "UserPromptSubmit", prompt="deploy")
    send(workdir, "main", "PermissionRequest", tool_name="Bash", tool_input={})
    assert state_of(workdir) == "waiting"
    # The fork's turn neither clears the main's wait nor ends the card's turn.
    send(workdir, "fork", "UserPromptSubmit", prompt="look around")
    send(workdir, "fork", "PreToolUse", tool_name="Read", tool_use_id="f1", tool_input={})
    send(workdir, "fork", "PostToolUse", tool_name="Read", tool_use_id="f1", tool_input={})
    send(workdir, "fork", "Stop", stop_hook_active=False)
    assert state_of(workdir) == "waiting"
    # The fork idle at its prompt does not make the busy card idle either.
    send(workdir, "main", "PostToolUse", tool_name="Bash", tool_use_id="b1", tool_input={})
    assert state_of(workdir) == "running"
    send(workdir, "fork", "Notification", notification_type="idle_prompt", message="waiting")
    assert state_of(workdir) == "running"
    send(workdir, "main", "Stop", stop_hook_active=False)
    assert state_of(workdir) == "idle"


def test_a_second_sessions_turn_keeps_the_chats_origin(workdir: Path) -> None:
    send(workdir, "main", "SessionStart", source="startup")
    send(workdir, "main", "UserPromptSubmit", prompt="work")
    send(workdir, "fork", "SessionStart", source="fork")
    data = {"session_id": "fork", "cwd": str(workdir), "hook_event_name": "UserPromptSubmit"}
    env = {**os.environ, "TASKCARD_ORIGIN": "telegram:12345"}
    done = run_taskcard("hook", "claude-code", stdin=json.dumps(data), env=env)
    assert done.returncode == 0, done.stderr
    assert events(workdir)[-1] == {**events(workdir)[-1], "kind": "turn.origin"}
    assert events(workdir)[-1]["origin"] == "telegram:12345"


def test_a_session_silent_for_hours_no_longer_holds_the_card(workdir: Path) -> None:
    # A fork killed before its SessionEnd: after STALE_AFTER_S it counts no more.
    send(workdir, "main", "SessionStart", source="startup")
    old = int(time.time()) - 7 * 3600
    live = json.loads((workdir / SESSIONS).read_text())
    (workdir / SESSIONS).write_text(json.dumps({**live, "killed": f"open {old}"}))
    send(workdir, "main", "UserPromptSubmit", prompt="go")
    send(workdir, "main", "Stop")
    send(workdir, "main", "SessionEnd", reason="logout")
    assert kinds(workdir) == ["agent.start", "turn.start", "turn.end", "agent.exit"]


def test_sessions_that_are_not_forks_are_written_as_one_agent_run_after_another(
    workdir: Path,
) -> None:
    # Only a start that says `fork` makes a session one to show beside the others: payloads
    # of several session ids without one are the agent's own events, written as they come.
    send(workdir, "s1", "SessionStart", source="startup")
    send(workdir, "s2", "UserPromptSubmit", prompt="work")
    send(workdir, "s3", "PreToolUse", tool_name="Bash", tool_use_id="t1", tool_input={})
    send(workdir, "s4", "PostToolUse", tool_name="Bash", tool_use_id="t1", tool_input={})
    send(workdir, "s5", "Stop", stop_hook_active=False)
    assert state_of(workdir) == "idle"
    send(workdir, "s6", "SessionEnd", reason="other")
    assert kinds(workdir) == [
        "agent.start",
        "turn.start",
        "tool.start",
        "tool.end",
        "turn.end",
        "agent.exit",
    ]


def test_the_card_exits_with_the_last_of_the_agent_and_its_fork(workdir: Path) -> None:
    send(workdir, "main", "SessionStart", source="startup")
    send(workdir, "fork", "SessionStart", source="fork")
    send(workdir, "fork", "UserPromptSubmit", prompt="go on alone")
    send(workdir, "main", "SessionEnd", reason="prompt_input_exit")
    assert "agent.exit" not in kinds(workdir)  # the fork works on
    assert state_of(workdir) == "running"
    send(workdir, "fork", "Stop", stop_hook_active=False)
    send(workdir, "fork", "SessionEnd", reason="other")
    assert kinds(workdir)[-2:] == ["turn.end", "agent.exit"]
    assert state_of(workdir) == "exited"


@pytest.mark.parametrize("source", ["startup", "resume", "clear"])
def test_a_session_started_afresh_takes_the_place_of_one_killed_mid_turn(
    workdir: Path, source: str
) -> None:
    # Claude Code killed in a turn (no SessionEnd), then started again: the new session's
    # card starts afresh and its stop reads idle, not "running" for hours.
    send(workdir, "old", "SessionStart", source="startup")
    send(workdir, "old", "UserPromptSubmit", prompt="work")
    send(workdir, "old", "PreToolUse", tool_name="Bash", tool_use_id="t1", tool_input={})
    send(workdir, "new", "SessionStart", source=source)
    send(workdir, "new", "UserPromptSubmit", prompt="go on")
    send(workdir, "new", "Stop", stop_hook_active=False)
    assert kinds(workdir)[3:] == ["agent.start", "turn.start", "turn.end"]
    assert state_of(workdir) == "idle"
    send(workdir, "new", "SessionEnd", reason="prompt_input_exit")
    assert kinds(workdir)[-1] == "agent.exit"
    assert state_of(workdir) == "exited"


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"other": "open 12", "x": 5, "y": "open 99999999999999999999"}',
        b"[1, 2]",
        b'{"big": "' + b"x" * 200_000 + b'"}',
    ],
    ids=["corrupt", "odd-values", "not-a-map", "huge"],
)
def test_a_broken_sessions_file_is_rebuilt_and_never_fails_the_hook(
    workdir: Path, content: bytes
) -> None:
    (workdir / "logs").mkdir()
    (workdir / SESSIONS).write_bytes(content)
    send(workdir, "main", "SessionStart", source="startup")
    send(workdir, "fork", "SessionStart", source="fork")
    send(workdir, "fork", "SessionEnd", reason="other")
    assert kinds(workdir) == ["agent.start"]
    assert list(json.loads((workdir / SESSIONS).read_text())) == ["main"]
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


def test_a_record_of_digits_of_other_scripts_loses_no_event(workdir: Path) -> None:
    # `str.isdigit` takes "²" and "١" for digits, and `int` refused them: every event of the
    # workdir was lost, with a traceback in the hook's log, until a session started afresh.
    (workdir / "logs").mkdir()
    records = {"a": "open \u00b2", "b": "idle 1\u0661", "c": "open 5 fork extra", "d": 7}
    (workdir / SESSIONS).write_text(json.dumps(records))
    send(workdir, "main", "UserPromptSubmit", prompt="go")
    send(workdir, "main", "Stop", stop_hook_active=False)
    assert kinds(workdir) == ["turn.start", "turn.end"]
    assert list(json.loads((workdir / SESSIONS).read_text())) == ["main"]
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


def test_payloads_without_a_usable_session_id_count_as_one_session(workdir: Path) -> None:
    send(workdir, "main", "SessionStart", source="startup")
    for odd in (None, 42, ["a"], "x" * 500, "bad id\n"):
        send(workdir, odd, "SessionStart", source="fork")
    assert kinds(workdir) == ["agent.start"]
    send(workdir, None, "SessionEnd", reason="other")
    send(workdir, "main", "SessionEnd", reason="other")
    assert kinds(workdir) == ["agent.start", "agent.exit"]
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


def test_many_sessions_keep_the_record_bounded(workdir: Path) -> None:
    for index in range(70):
        send(workdir, f"s{index}", "SessionStart", source="fork")
    kept = json.loads((workdir / SESSIONS).read_text())
    assert len(kept) == 64 and "s69" in kept and "s0" not in kept


SUBAGENT_TASK = {
    "id": "a1",
    "type": "subagent",
    "status": "running",
    "description": "review the parser",
    "agent_type": "code-reviewer",
}
SHELL_TASK = {
    "id": "b1",
    "type": "shell",
    "status": "running",
    "description": "serve the site",
    "command": "npm run dev",
}


def test_a_stop_waiting_on_its_background_work_is_not_the_end_of_the_turn(
    workdir: Path,
) -> None:
    # A Stop that lists a subagent still at work pauses the session until it reports back:
    # it read as a finished turn (idle), and the idle signal nudged the chats.
    send(workdir, "main", "SessionStart", source="startup")
    send(workdir, "main", "UserPromptSubmit", prompt="have the parser reviewed meanwhile")
    tasks = [SUBAGENT_TASK, {**SUBAGENT_TASK, "id": "a2", "type": "workflow"}, SHELL_TASK]
    send(workdir, "main", "Stop", stop_hook_active=False, background_tasks=tasks)
    assert "turn.end" not in kinds(workdir)
    assert events(workdir)[-1]["text"] == "working in the background (2 tasks)"
    assert state_of(workdir) == "running"
    assert completed_turns(CardPaths(workdir)) == 0
    # The work is done and wakes the session; its last stop lists none running (a finished
    # one listed by an older host does not count) and ends the turn.
    send(workdir, "main", "PreToolUse", tool_name="Bash", tool_use_id="t2", tool_input={})
    send(workdir, "main", "PostToolUse", tool_name="Bash", tool_use_id="t2", tool_input={})
    done = {**SUBAGENT_TASK, "status": "completed"}
    send(workdir, "main", "Stop", background_tasks=[done, SHELL_TASK], session_crons=[])
    assert kinds(workdir)[-1] == "turn.end"
    assert state_of(workdir) == "idle"
    assert completed_turns(CardPaths(workdir)) == 1


def test_a_lasting_shell_or_a_prompt_for_later_does_not_hold_the_turn(workdir: Path) -> None:
    # A dev server in the background, a monitor, a daily scheduled prompt: the session sits
    # at its prompt meanwhile, and the card must not read running all night.
    monitor = {"id": "m1", "type": "monitor", "status": "running", "server": "s", "tool": "t"}
    cron = {"id": "c1", "schedule": "0 9 * * 1-5", "recurring": True, "prompt": "standup"}
    send(workdir, "main", "UserPromptSubmit", prompt="start the dev server")
    send(workdir, "main", "Stop", background_tasks=[SHELL_TASK, monitor], session_crons=[cron])
    assert kinds(workdir) == ["turn.start", "turn.end"]
    assert state_of(workdir) == "idle"


@pytest.mark.parametrize("odd", ["shell", {"id": "b1"}, [1, "x", None], None])
def test_background_fields_of_another_shape_end_the_turn_as_before(
    workdir: Path, odd: object
) -> None:
    send(workdir, "main", "UserPromptSubmit", prompt="go")
    send(workdir, "main", "Stop", background_tasks=odd, session_crons=odd)
    assert kinds(workdir) == ["turn.start", "turn.end"]
