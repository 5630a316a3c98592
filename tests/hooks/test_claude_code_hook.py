"""`taskcard hook claude-code`, driven as Claude Code drives it: one payload on stdin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from taskcard.bridge.track.activity import ActivityTracker
from taskcard.producers.task_card.contract import CardPaths
from taskcard.producers.task_card.notifications import (
    FileNotificationPort,
    TaskCardErrorNotification,
    TaskCardLimitNotification,
)
from taskcard.producers.task_card.turns import completed_turns

from .conftest import FIXTURES, TASKCARD, events, hook, kinds, payload, run_taskcard

SESSION = [
    "01_session_start.json",
    "02_user_prompt_submit.json",
    "03_pre_tool_use.json",
    "04_post_tool_use.json",
    "05_pre_tool_use_edit.json",
    "06_notification_permission.json",
    "07_post_tool_use_failure.json",
    "08_pre_compact.json",
    "09_subagent_stop.json",
    "10_stop.json",
    "11_session_end.json",
]


def test_a_recorded_session_becomes_the_activity_log(workdir: Path) -> None:
    shutil.copy(FIXTURES / "claude_code" / "transcript.jsonl", workdir / "transcript.jsonl")
    for name in SESSION:
        done = hook(payload(name, workdir))
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b""), name
    assert kinds(workdir) == [
        "agent.start",
        "turn.start",
        "tool.start",
        "tool.end",
        "tool.start",
        "wait.start",
        "wait.end",
        "tool.end",
        "text",
        "usage",
        "turn.end",
        "agent.exit",
    ]
    log = events(workdir)
    assert {k: log[2][k] for k in ("call_id", "name")} == {"call_id": "toolu_01ABC", "name": "Bash"}
    assert (log[3]["call_id"], log[3]["ok"]) == ("toolu_01ABC", True)
    assert (log[5]["reason"], log[6]["reason"]) == ("permission", "permission")
    assert (log[7]["call_id"], log[7]["ok"]) == ("toolu_02DEF", False)
    # The last turn only; one API message counted once; cached prompt tokens are input.
    assert (log[9]["input_tokens"], log[9]["output_tokens"]) == (6300, 200)
    assert all(event["ts"].endswith("Z") for event in log)
    assert "command" not in json.dumps(log)  # a tool's input never reaches the log
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


def test_a_compaction_in_the_middle_of_a_turn_keeps_the_turn_running(workdir: Path) -> None:
    # Claude Code ends a compaction with SessionStart (source "compact"), often mid-turn; an
    # agent.start there dropped the running turn and the card read "at prompt".
    def send(name: str, **fields: object) -> None:
        data = {"session_id": "s1", "cwd": str(workdir), "hook_event_name": name, **fields}
        assert hook(json.dumps(data).encode()).returncode == 0

    send("SessionStart", source="startup")
    send("UserPromptSubmit", prompt="refactor the parser")
    send("PreCompact", trigger="auto", custom_instructions="")
    send("SessionStart", source="compact")
    send("PreToolUse", tool_name="Bash", tool_use_id="t2", tool_input={})
    assert kinds(workdir) == ["agent.start", "turn.start", "text", "tool.start"]
    tracker = ActivityTracker()
    for line in (workdir / "logs" / "events.jsonl").read_bytes().splitlines():
        tracker.feed(line)
    summary = tracker.summary(datetime.now(UTC), no_output_after_s=600)
    assert summary.state == "running" and summary.turn_started_at is not None
    send("SessionStart", source="resume")  # a resumed session is a new start
    assert kinds(workdir)[-1] == "agent.start"


def test_clear_restarts_the_conversation_without_an_exit(workdir: Path) -> None:
    # `/clear` sends SessionEnd (reason "clear") and then SessionStart (source "clear"); the
    # process never exited, so no agent.exit (which signals "exited without a report").
    def send(name: str, **fields: object) -> None:
        data = {"session_id": "s1", "cwd": str(workdir), "hook_event_name": name, **fields}
        assert hook(json.dumps(data).encode()).returncode == 0

    send("SessionStart", source="startup")
    send("SessionEnd", reason="clear")
    send("SessionStart", source="clear")
    send("SessionEnd", reason="prompt_input_exit")
    assert kinds(workdir) == ["agent.start", "agent.start", "agent.exit"]


def test_stop_without_a_transcript_still_ends_the_turn(workdir: Path) -> None:
    hook(payload("10_stop.json", workdir, transcript_path=str(workdir / "missing.jsonl")))
    assert kinds(workdir) == ["turn.end"]


def test_the_stop_after_another_stop_hook_made_claude_go_on_ends_the_turn(workdir: Path) -> None:
    """A stop hook of the user's blocks the first stop; Claude goes on (a tool call) and
    stops again, with `stop_hook_active`. That second stop was taken for "Claude goes on" and
    wrote nothing, so the card read the tool's turn as running until the next prompt."""
    shutil.copy(FIXTURES / "claude_code" / "transcript.jsonl", workdir / "transcript.jsonl")
    for name in ("02_user_prompt_submit.json", "10_stop.json", "03_pre_tool_use.json"):
        assert hook(payload(name, workdir)).returncode == 0, name
    assert hook(payload("04_post_tool_use.json", workdir)).returncode == 0
    done = hook(payload("10_stop.json", workdir, stop_hook_active=True))
    assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir)[-2:] == ["usage", "turn.end"]
    assert kinds(workdir).count("turn.end") == 2
    assert completed_turns(CardPaths(workdir)) == 1  # one turn for reminders, not two


def test_workdir_option_overrides_the_payload_cwd(workdir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    hook(payload("02_user_prompt_submit.json", elsewhere), "--workdir", str(workdir))
    assert kinds(workdir) == ["turn.start"]
    assert kinds(elsewhere) == []


def test_task_card_wakes_reach_the_agent_once_as_additional_context(workdir: Path) -> None:
    port = FileNotificationPort(CardPaths(workdir))
    port.notify(TaskCardErrorNotification("tc_1", 1, "renderer_failed", "x"))  # before: old
    assert hook(payload("01_session_start.json", workdir)).stdout == b""
    assert hook(payload("02_user_prompt_submit.json", workdir)).stdout == b""
    port.notify(TaskCardErrorNotification("tc_1", 2, "renderer_timeout", "slow"))
    assert hook(payload("03_pre_tool_use.json", workdir)).stdout == b""  # no context there
    woken = hook(payload("04_post_tool_use.json", workdir))
    assert woken.returncode == 0
    output = json.loads(woken.stdout)
    assert output["hookSpecificOutput"]["hookEventName"] == "PostToolUse"
    context = output["hookSpecificOutput"]["additionalContext"]
    assert "watch tc_1 failed to refresh (renderer_timeout)" in context
    assert "slow" not in context  # built from typed fields, not the line's free text
    assert hook(payload("04_post_tool_use.json", workdir)).stdout == b""  # once
    port.notify(TaskCardLimitNotification("tc_1", 50))
    prompt = json.loads(hook(payload("02_user_prompt_submit.json", workdir)).stdout)
    assert prompt["hookSpecificOutput"]["hookEventName"] == "UserPromptSubmit"
    assert "used all 50 refreshes" in prompt["hookSpecificOutput"]["additionalContext"]


@pytest.mark.parametrize(
    ("budget", "words"),
    [(50, "used all 50 refreshes and stopped"), (1, "used all 1 refresh and stopped")],
)
def test_the_limit_wake_counts_the_refreshes_in_agreement(
    workdir: Path, budget: int, words: str
) -> None:
    hook(payload("01_session_start.json", workdir))
    FileNotificationPort(CardPaths(workdir)).notify(TaskCardLimitNotification("tc_1", budget))
    prompt = json.loads(hook(payload("02_user_prompt_submit.json", workdir)).stdout)
    assert f"watch tc_1 {words}" in prompt["hookSpecificOutput"]["additionalContext"]
    lines = (workdir / ".notification" / "system.jsonl").read_text().splitlines()
    (limit,) = [json.loads(line) for line in lines]
    assert limit["body"] == f"Watch tc_1 {words}.", limit


@pytest.mark.parametrize(("turns", "quiet"), [(2, "2 turns"), (1, "1 turn")])
def test_stop_events_count_turns_and_the_reminder_comes_back_to_the_agent(
    workdir: Path, turns: int, quiet: str
) -> None:
    (workdir / "taskcard").mkdir(exist_ok=True)
    (workdir / "taskcard" / "taskcard.json").write_text(f'{{"reminder_turns": {turns}}}')
    hook(payload("01_session_start.json", workdir))
    for _ in range(turns):
        hook(payload("02_user_prompt_submit.json", workdir))
        hook(payload("10_stop.json", workdir))
    lines = (workdir / ".notification" / "system.jsonl").read_text().splitlines()
    (reminder,) = [json.loads(line) for line in lines]
    assert (reminder["source"], reminder["extra"]["turns"]) == ("task_card.reminder", turns)
    assert reminder["header"] == "Task Card reminder"  # the manual's name for it
    assert reminder["body"].startswith(f"{quiet} without a task card update:"), reminder
    told = json.loads(hook(payload("02_user_prompt_submit.json", workdir)).stdout)
    context = told["hookSpecificOutput"]["additionalContext"]
    # The agent is told by the name the manual and SKILL.md give it, and what to check.
    assert f"Task Card reminder: {quiet} passed without a card update" in context
    assert "absent or stale" in context


def test_a_wait_closes_with_the_next_event_of_its_session_only(workdir: Path) -> None:
    hook(payload("06_notification_permission.json", workdir))
    hook(payload("02_user_prompt_submit.json", workdir, session_id="other"))
    hook(payload("06_notification_permission.json", workdir))  # the same wait: no new line
    hook(payload("03_pre_tool_use.json", workdir))
    assert kinds(workdir) == ["wait.start", "turn.start", "wait.end", "tool.start"]


def test_a_broken_payload_never_fails_the_agent_and_is_logged(workdir: Path) -> None:
    for raw in (b"", b"{not json", b"[1, 2]", b"\xff\xfe", json.dumps({"cwd": 5}).encode()):
        done = hook(raw, "--workdir", str(workdir))
        assert (done.returncode, done.stdout) == (0, b"")
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    # The {"cwd": 5} one has --workdir, so its cwd is fine, but it names no event.
    assert log.count("HookInputError") == 5
    assert log.count("hook_event_name: missing") == 1
    assert events(workdir) == []


def test_a_payload_without_usable_cwd_exits_0_and_prints_nothing(tmp_path: Path) -> None:
    for data in ({"hook_event_name": "Stop"}, {"hook_event_name": "Stop", "cwd": "/nonexist"}):
        done = hook(json.dumps(data).encode())
        assert (done.returncode, done.stdout) == (0, b"")
        assert done.stderr.startswith(b"taskcard hook claude-code: ")  # no workdir log to write to


def test_a_hook_command_with_options_this_version_lacks_still_exits_0(workdir: Path) -> None:
    # Exit code 2 from a Claude Code hook blocks: a Stop hook would keep the session going
    # with the usage text as its instruction. The mistake goes to stderr only.
    stop = json.dumps(payload("10_stop.json", workdir, transcript_path="")).encode()
    for extra in (["--verbose"], ["stray"], ["--workdir"]):
        done = hook(stop, *extra)
        assert (done.returncode, done.stdout) == (0, b""), extra
        assert len(done.stderr.splitlines()) == 1 and b"--help`" in done.stderr, done.stderr
    bare = run_taskcard("hook")
    assert (bare.returncode, bare.stdout) == (0, b"")
    codex = run_taskcard("hook", "codex", "--verbose", json.dumps({"cwd": str(workdir)}))
    assert codex.returncode == 0
    # An option before the command (`taskcard --verbose hook ...`) exited 2 all the same.
    for host in ("claude-code", "codex"):
        done = run_taskcard("--verbose", "hook", host, stdin=stop)
        assert (done.returncode, done.stdout) == (0, b""), host
        assert len(done.stderr.splitlines()) == 1 and b"--verbose" in done.stderr
    assert run_taskcard("ledger", "show", "--verbose").returncode == 2  # other commands: usage


def test_an_unwritable_log_never_fails_the_agent(workdir: Path) -> None:
    (workdir / "logs").write_text("a file where the folder should be")
    done = hook(payload("02_user_prompt_submit.json", workdir))
    assert (done.returncode, done.stdout) == (0, b"")


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_transcript_that_is_not_a_file_never_hangs_the_hook(workdir: Path, kind: str) -> None:
    transcript = workdir / "transcript.jsonl"
    if kind == "fifo":
        os.mkfifo(transcript)
    elif kind == "device":
        transcript.symlink_to("/dev/zero")
    else:
        transcript.mkdir()
    done = hook(payload("10_stop.json", workdir))  # the run itself times out after 120 s
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    assert kinds(workdir)[-1] == "turn.end"


def state_of(workdir: Path) -> str:
    """The agent state the service reads from the activity log, now."""
    tracker = ActivityTracker()
    for line in (workdir / "logs" / "events.jsonl").read_bytes().splitlines():
        tracker.feed(line)
    return tracker.summary(datetime.now(UTC), no_output_after_s=600).state


def test_a_turn_that_ends_in_an_api_error_ends_and_says_why(workdir: Path) -> None:
    # Claude Code sends StopFailure, not Stop, when a turn dies of an API error; before, the
    # turn stayed open and the card read "running" (then "unknown") until the next prompt.
    shutil.copy(FIXTURES / "claude_code" / "transcript.jsonl", workdir / "transcript.jsonl")
    hook(payload("01_session_start.json", workdir))
    hook(payload("02_user_prompt_submit.json", workdir))
    assert state_of(workdir) == "running"
    done = hook(payload("12_stop_failure.json", workdir))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")  # no decision printed
    assert kinds(workdir)[-3:] == ["usage", "turn.end", "text"]
    assert events(workdir)[-1]["text"] == (
        "turn failed (rate_limit): 429 Too Many Requests: rate limit reached for requests"
    )
    assert events(workdir)[-2]["error"] == "rate_limit"  # the category, for the idle signal
    assert "secret plan" not in (workdir / "logs" / "events.jsonl").read_text()
    assert state_of(workdir) == "idle"
    # The older shape (error_type, error_message), a long detail, and no detail at all.
    hook(payload("12_stop_failure.json", workdir, error="x" * 20, error_details="y " * 400))
    assert len(events(workdir)[-1]["text"]) <= 200
    # A key the cut would have halved is left out whole: the service redacts a key by its
    # whole shape, so half of one would have been shown.
    key = "sk-ant-api03-" + "k" * 60
    hook(payload("12_stop_failure.json", workdir, error="x", error_details="y " * 80 + key))
    text = events(workdir)[-1]["text"]
    assert (len(text) <= 200, text.endswith("y …"), "sk-" in text) == (True, True, False)
    words = "word " * 60
    hook(payload("12_stop_failure.json", workdir, error="x", error_details=words))
    assert events(workdir)[-1]["text"].endswith("word word …")
    hook(payload("12_stop_failure.json", workdir, error=None, error_details=None))
    assert events(workdir)[-1]["text"] == "turn failed (unknown)"
    old = {"error_type": "server_error", "error_message": "overloaded", "error": "529"}
    hook(payload("12_stop_failure.json", workdir, error_details=None, **old))
    assert events(workdir)[-1]["text"] == "turn failed (server_error): overloaded"
    hook(payload("12_stop_failure.json", workdir, error="bad\nline ✗", error_details=None))
    assert events(workdir)[-2]["error"] == "unknown"  # not a category word: never shown
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


def test_a_permission_dialog_is_a_wait_until_the_session_moves_on(workdir: Path) -> None:
    hook(payload("02_user_prompt_submit.json", workdir))
    hook(payload("13_permission_request.json", workdir))
    hook(payload("06_notification_permission.json", workdir))  # the same dialog: one wait
    assert kinds(workdir) == ["turn.start", "wait.start"]
    assert state_of(workdir) == "waiting"
    # Events that can fire while the dialog is open, or that this version does not know,
    # leave it open (before, any event closed it and the card read "running").
    for name in ("ConfigChange", "FileChanged", "SubagentStart", "TaskCreated", "NewIn2027"):
        hook(payload("13_permission_request.json", workdir, hook_event_name=name))
    hook(payload("09_subagent_stop.json", workdir))
    assert kinds(workdir) == ["turn.start", "wait.start"]
    assert "rm -rf" not in (workdir / "logs" / "events.jsonl").read_text()
    hook(payload("04_post_tool_use.json", workdir))  # allowed: the tool ran
    assert kinds(workdir)[-2:] == ["wait.end", "tool.end"]
    assert state_of(workdir) == "running"
    hook(payload("13_permission_request.json", workdir))
    hook(payload("13_permission_request.json", workdir, hook_event_name="PermissionDenied"))
    assert kinds(workdir)[-2:] == ["wait.start", "wait.end"]


def test_an_mcp_elicitation_waits_for_the_person_until_its_result(workdir: Path) -> None:
    hook(payload("02_user_prompt_submit.json", workdir))
    hook(payload("14_elicitation.json", workdir))
    assert events(workdir)[-1] == {**events(workdir)[-1], "kind": "wait.start", "reason": "input"}
    assert "credentials" not in (workdir / "logs" / "events.jsonl").read_text()
    hook(payload("15_elicitation_result.json", workdir))
    assert kinds(workdir) == ["turn.start", "wait.start", "wait.end"]
    assert "alice" not in (workdir / "logs" / "events.jsonl").read_text()


def test_a_subagent_never_starts_or_ends_the_turn_that_runs_it(workdir: Path) -> None:
    hook(payload("01_session_start.json", workdir))
    hook(payload("02_user_prompt_submit.json", workdir))
    sub = {"agent_id": "agent-7f3a", "agent_type": "Explore"}
    hook(payload("16_subagent_post_tool_use.json", workdir, hook_event_name="PreToolUse"))
    hook(payload("16_subagent_post_tool_use.json", workdir))
    for name in ("Stop", "SessionStart", "SessionEnd", "UserPromptSubmit"):
        hook(payload("10_stop.json", workdir, hook_event_name=name, **sub))
    hook(payload("12_stop_failure.json", workdir, **sub))
    assert kinds(workdir) == ["agent.start", "turn.start", "tool.start", "tool.end", "text"]
    assert events(workdir)[-1]["text"].startswith("a subagent's turn failed (rate_limit)")
    assert state_of(workdir) == "running"
    # An --agent session's main thread has agent_type but no agent_id: its stop is the turn's.
    hook(payload("10_stop.json", workdir, transcript_path="", agent_type="reviewer"))
    assert kinds(workdir)[-1] == "turn.end"


def test_an_interrupted_tool_ends_the_turn_that_no_stop_will_end(workdir: Path) -> None:
    # Esc during a tool: PostToolUseFailure with is_interrupt, and Claude Code runs no Stop
    # hook after an interrupt; the card read "running", then "unknown", until the next prompt.
    hook(payload("02_user_prompt_submit.json", workdir))
    hook(payload("07_post_tool_use_failure.json", workdir))  # a plain failure: turn goes on
    assert state_of(workdir) == "running"
    hook(payload("07_post_tool_use_failure.json", workdir, is_interrupt=True, agent_id="a1"))
    assert state_of(workdir) == "running"  # a subagent's call: the parent's turn goes on
    hook(payload("07_post_tool_use_failure.json", workdir, is_interrupt=True))
    assert kinds(workdir)[-3:] == ["tool.end", "turn.end", "text"]
    assert events(workdir)[-2]["error"] == "interrupted"
    assert events(workdir)[-1]["text"] == "turn interrupted"
    assert state_of(workdir) == "idle"


def test_resume_switches_the_conversation_without_an_exit(workdir: Path) -> None:
    # An interactive /resume ends the current conversation with SessionEnd (reason "resume")
    # and starts the other with SessionStart (source "resume"): the process never exited.
    hook(payload("01_session_start.json", workdir))
    hook(payload("11_session_end.json", workdir, reason="resume"))
    hook(payload("01_session_start.json", workdir, source="resume"))
    assert kinds(workdir) == ["agent.start", "agent.start"]
    hook(payload("11_session_end.json", workdir, reason="logout"))
    assert kinds(workdir)[-1] == "agent.exit"


def test_an_answered_elicitation_notification_ends_the_input_wait(workdir: Path) -> None:
    # As init installs the hooks (Notification, no Elicitation events): the dialog's
    # notification opens the wait and the answer's notification closes it.
    def notification(kind: str) -> dict[str, object]:
        return payload("06_notification_permission.json", workdir, notification_type=kind)

    hook(payload("02_user_prompt_submit.json", workdir))
    hook(notification("elicitation_dialog"))
    hook(notification("auth_success"))
    assert kinds(workdir) == ["turn.start", "wait.start"]
    hook(notification("elicitation_response"))
    assert kinds(workdir) == ["turn.start", "wait.start", "wait.end"]
    assert state_of(workdir) == "running"
    hook(notification("permission_prompt"))
    hook(notification("elicitation_complete"))  # not an input wait: the dialog stays open
    assert state_of(workdir) == "waiting"


def test_a_url_elicitation_notification_waits_for_the_person(workdir: Path) -> None:
    # The hooks reference lists `elicitation_url_dialog`: an MCP server asks the person to open
    # a URL in the browser (a sign-in) and the session waits for them, as for its form. It
    # was read as an unrelated notification, so the card went on showing the agent at work.
    def notification(kind: str) -> dict[str, object]:
        return payload("06_notification_permission.json", workdir, notification_type=kind)

    hook(payload("02_user_prompt_submit.json", workdir))
    hook(notification("elicitation_url_dialog"))
    assert kinds(workdir) == ["turn.start", "wait.start"]
    assert events(workdir)[-1]["reason"] == "input"
    assert state_of(workdir) == "idle"  # the agent waits for the person's input
    hook(notification("elicitation_complete"))
    assert kinds(workdir)[-1] == "wait.end"
    assert state_of(workdir) == "running"


def test_an_absurd_token_count_in_the_transcript_still_ends_the_turn(workdir: Path) -> None:
    """The activity log refuses counts past 10**15 (the service reads them as unknown), so
    the hook caps them: the turn's `usage` and `turn.end` are both written."""
    huge = 10**18
    entries = [
        {"type": "user", "message": {"role": "user", "content": "go"}},
        {
            "type": "assistant",
            "message": {"id": "m1", "usage": {"input_tokens": huge, "output_tokens": 5}},
        },
    ]
    transcript = workdir / "transcript.jsonl"
    transcript.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    hook(payload("10_stop.json", workdir, transcript_path=str(transcript)))
    assert kinds(workdir) == ["usage", "turn.end"]
    assert events(workdir)[0]["input_tokens"] == 10**15


def error_notice(watch_id: str = "tc_9", code: str = "renderer_failed") -> dict[str, object]:
    """A task card's error notice, as a line of `.notification/system.jsonl`."""
    return {
        "id": "task_card.error:tc_9:1:renderer_failed",
        "channel": "system",
        "ref_id": "tc_9",
        "source": "task_card.error",
        "priority": "high",
        "header": "h",
        "body": "b",
        "extra": {"state": "error", "watch_id": watch_id, "code": code},
        "at": "2026-01-01T00:00:00Z",
    }


def test_a_notice_whose_ids_end_in_a_line_break_wakes_without_them(workdir: Path) -> None:
    """A notice line in `.notification/system.jsonl` (the agent's folder: any program there
    may write it) whose watch id and error code end in a line break: the wake names neither,
    and says "your watch" and "an error" as for any id it does not take. Both passed, as the
    pattern ended in `$`, and the wake the agent reads broke its sentence across lines."""
    notices = workdir / ".notification"
    notices.mkdir()
    (notices / "system.jsonl").write_text("")
    assert hook(payload("01_session_start.json", workdir)).returncode == 0
    line = error_notice(watch_id="tc_9\n", code="renderer_failed\n")
    with open(notices / "system.jsonl", "a") as out:
        out.write(json.dumps(line) + "\n")
    woken = hook(payload("04_post_tool_use.json", workdir))
    assert woken.returncode == 0, woken.stderr
    context = json.loads(woken.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "watch your watch failed to refresh (an error)" in context, context
    assert "tc_9" not in context and "renderer_failed" not in context, context


def test_notices_linked_from_outside_the_workdir_never_wake_the_agent(
    workdir: Path, tmp_path: Path
) -> None:
    """`.notification/system.jsonl` (or its rotated `.1`) planted as a link to a file outside
    the workdir: the hook reads nothing through it, as no writer writes through it."""
    outside = tmp_path / "elsewhere.jsonl"
    foreign = error_notice()
    outside.write_text("")
    notices = workdir / ".notification"
    notices.mkdir()
    (notices / "system.jsonl").symlink_to(outside)
    assert hook(payload("01_session_start.json", workdir)).returncode == 0
    outside.write_text(json.dumps(foreign) + "\n")
    woken = hook(payload("04_post_tool_use.json", workdir))
    assert woken.returncode == 0, woken.stderr
    assert b"tc_9" not in woken.stdout
    # The rotated file linked out, read when the current one appears: refused the same way.
    (notices / "system.jsonl").unlink()
    (notices / "system.jsonl.1").symlink_to(outside)
    port = FileNotificationPort(CardPaths(workdir))
    port.notify(TaskCardErrorNotification("tc_1", 1, "renderer_timeout", "slow"))
    woken = hook(payload("04_post_tool_use.json", workdir))
    assert woken.returncode == 0, woken.stderr
    context = json.loads(woken.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "watch tc_1 failed to refresh (renderer_timeout)" in context
    assert "tc_9" not in context
    # A foreign id behind the link does not hide the workdir's own notice of that id.
    port.notify(TaskCardErrorNotification("tc_9", 1, "renderer_failed", "x"))
    lines = (notices / "system.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines][-1] == foreign["id"]


@pytest.mark.parametrize("folder", [".notification", "logs"])
def test_side_folders_linked_out_of_the_workdir_get_nothing_written_into_them(
    workdir: Path, tmp_path: Path, folder: str
) -> None:
    """The hooks keep locks, turn counts, wake cursors and session maps beside the activity
    log and the notices; a link out of the workdir at those folders made them create files
    there (the appends alone were refused)."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (workdir / folder).symlink_to(outside)
    for name in SESSION:
        assert hook(payload(name, workdir)).returncode == 0, name
    assert list(outside.iterdir()) == []


def test_a_lock_file_planted_as_a_link_is_never_followed(workdir: Path, tmp_path: Path) -> None:
    target = tmp_path / "created-elsewhere"
    (workdir / ".notification" / "cursors").mkdir(parents=True)
    (workdir / ".notification" / ".turns.lock").symlink_to(target)
    (workdir / ".notification" / "cursors" / ".claude-code.json.lock").symlink_to(target)
    (workdir / "logs").mkdir()
    (workdir / "logs" / ".taskcard-hook-waits.json.lock").symlink_to(target)
    for name in SESSION:
        assert hook(payload(name, workdir)).returncode == 0, name
    assert not target.exists()


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_planted_hook_log_never_hangs_the_hook_nor_is_written_through(
    workdir: Path, tmp_path: Path, kind: str
) -> None:
    """`logs/taskcard-hook.log` was opened with a plain `open`: a named pipe there held every
    hook that had something to log (the agent's turn with it), a link was appended through."""
    log = workdir / "logs" / "taskcard-hook.log"
    log.parent.mkdir()
    outside = tmp_path / "dotfile"
    outside.write_text("keep me\n")
    if kind == "fifo":
        os.mkfifo(log)
    else:
        log.symlink_to(outside)
    done = hook(b"not json", "--workdir", str(workdir))  # run_taskcard's timeout: no hang
    assert done.returncode == 0
    assert b"payload is not JSON" in done.stderr  # said where it can be seen instead
    assert outside.read_text() == "keep me\n"


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to count the opens")
def test_a_wake_opens_each_notices_file_once(workdir: Path, tmp_path: Path) -> None:
    """A hook that hands over the card's notices opened `system.jsonl` twice (once to look at
    its inode and size, once to read it), each open resolving the path again to keep it inside
    the workdir; after a rotation, `system.jsonl.1` twice too. One open each does both."""
    port = FileNotificationPort(CardPaths(workdir))
    port.notify(TaskCardErrorNotification("tc_1", 1, "renderer_failed", "x"))
    assert hook(payload("01_session_start.json", workdir)).returncode == 0
    port.notify(TaskCardErrorNotification("tc_1", 2, "renderer_timeout", "slow"))
    notices = workdir / ".notification" / "system.jsonl"
    os.replace(notices, notices.with_name("system.jsonl.1"))  # the writer's rotation
    port.notify(TaskCardLimitNotification("tc_1", 50))
    trace = tmp_path / "trace.txt"
    raw = json.dumps(payload("04_post_tool_use.json", workdir)).encode()
    strace = ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", str(trace)]
    command = [*strace, TASKCARD, "hook", "claude-code"]
    woken = subprocess.run(command, input=raw, capture_output=True, timeout=120, check=False)
    assert woken.returncode == 0, woken.stderr
    context = json.loads(woken.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "failed to refresh (renderer_timeout)" in context  # from the rotated file
    assert "used all 50 refreshes" in context  # from the current one
    opens = [line for line in trace.read_text().splitlines() if "open" in line]
    for name in ("system.jsonl", "system.jsonl.1"):
        assert sum(f'/{name}"' in line for line in opens) == 1, name


def test_fields_of_the_wrong_json_type_get_a_clear_line_and_lose_nothing(workdir: Path) -> None:
    """An event name given as a list made the hook log a `TypeError` traceback, and a
    `SessionEnd` whose reason was a list lost the agent's exit: each is now read for what it
    can say (no known reason: the process ended)."""
    done = hook(payload("10_stop.json", workdir, hook_event_name=["Stop"]))
    assert (done.returncode, done.stdout) == (0, b"")
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    assert "hook_event_name must be the event's name as a string" in log
    assert "Traceback" not in log
    assert events(workdir) == []
    done = hook(payload("11_session_end.json", workdir, reason=["clear"]))
    assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir) == ["agent.exit"]
    assert "Traceback" not in (workdir / "logs" / "taskcard-hook.log").read_text()


def test_a_lone_surrogate_in_a_payload_string_still_records_the_event(workdir: Path) -> None:
    """`"\\ud800"` is valid JSON, but no UTF-8 line of the activity log can carry it: the
    tool's start was lost, with a traceback in the hook log. It is read as U+FFFD."""
    raw = json.dumps(payload("03_pre_tool_use.json", workdir)).replace(
        '"tool_name": "Bash"', '"tool_name": "Bash\\ud800"'
    )
    assert "\\ud800" in raw
    done = hook(raw.encode())
    assert (done.returncode, done.stdout) == (0, b"")
    (start,) = events(workdir)
    assert (start["kind"], start["name"]) == ("tool.start", "Bash\ufffd")
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


@pytest.mark.parametrize("host", ["claude-code", "codex"])
@pytest.mark.parametrize("start", [b"", b"\xef\xbb\xbf"])
def test_a_byte_that_is_not_utf8_in_a_payload_still_records_the_event(
    workdir: Path, host: str, start: bytes
) -> None:
    """One byte that is not UTF-8 (in the last message, a tool's output) lost the whole
    event: a `Stop` never ended the turn, and the card read "running". It is read as U+FFFD,
    also after a byte-order mark (which then made the text "not JSON")."""
    raw = json.dumps(payload("10_stop.json", workdir, last_assistant_message="MARK")).encode()
    raw = start + raw.replace(b"MARK", b"caf\xe9 \xff\xfe")
    done = run_taskcard("hook", host, stdin=raw)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["turn.end"]
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


@pytest.mark.parametrize("host", ["claude-code", "codex"])
@pytest.mark.parametrize("digits", [4301, 5000, 100_000])
def test_a_number_too_long_for_python_in_a_field_never_used_still_records_the_event(
    workdir: Path, host: str, digits: int
) -> None:
    """JSON sets no size on a number; Python reads at most 4,300 digits. One longer number in
    a field the hook never uses (a tool's input) made the whole payload "not JSON", and the
    turn's end was lost. It is read as its digits."""
    data = payload("10_stop.json", workdir, tool_input={"n": "BIG"}, count="BIG")
    raw = json.dumps(data).replace('"BIG"', "9" * digits).encode()
    done = run_taskcard("hook", host, stdin=raw)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["turn.end"]
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


@pytest.mark.parametrize("host", ["claude-code", "codex"])
@pytest.mark.parametrize("depth", [5000, 100_000])
@pytest.mark.parametrize("field", ["tool_input", "not_a_field_of_any_host"])
@pytest.mark.parametrize(("opens", "inner", "closes"), [("[", "", "]"), ('{"a": ', "1", "}")])
def test_a_value_nested_deeper_than_python_reads_still_records_the_event(
    workdir: Path, host: str, depth: int, field: str, opens: str, inner: str, closes: str
) -> None:
    """Python's JSON reader recurses: past about 990 levels of arrays or objects in one field
    (a tool's input) the whole payload was "not JSON", and the turn's end was lost. The
    fields the hook reads are near the top; a part nested that deep is left out."""
    data = payload("10_stop.json", workdir, **{field: "DEEP"})
    deep = opens * depth + inner + closes * depth
    raw = json.dumps(data).replace('"DEEP"', deep).encode()
    done = run_taskcard("hook", host, stdin=raw)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["turn.end"]
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


@pytest.mark.parametrize("host", ["claude-code", "codex"])
def test_a_deep_payload_with_a_string_left_open_is_refused_without_a_stall(
    workdir: Path, host: str
) -> None:
    """Not JSON: deep brackets, then a string never closed, full of escaped quotes. Reading
    past the depth Python's reader takes scanned the rest again from each quote: a megabyte
    held the hook (and the agent's turn) for an hour. It is refused at once, in one line."""
    raw = b'{"a": ' + b"[" * 1000 + b'"' + b'\\"' * 500_000
    done = run_taskcard("hook", host, "--workdir", str(workdir), stdin=raw)  # 120 s at most
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    assert "payload is not JSON" in log and "Traceback" not in log


@pytest.mark.parametrize("host", ["claude-code", "codex"])
def test_a_tool_name_and_id_of_megabytes_write_a_short_line_that_still_pairs(
    workdir: Path, host: str
) -> None:
    """A tool's name and id went whole into its lines of the activity log: megabytes, where
    the service reads the log in bounded steps, so those lines (and the ones before them in
    a step) never reached the card. The name is cut, the id kept as its digest: the start
    and the end of the call still pair, and another call's id stays apart."""
    name, call = "N" * 3_000_000, "I" * 3_000_000
    for event, call_id in (("PreToolUse", call), ("PreToolUse", call + "2"), ("PostToolUse", call)):
        data = {
            **payload("03_pre_tool_use.json", workdir),
            "hook_event_name": event,
            "tool_name": name,
            "tool_use_id": call_id,
        }
        done = run_taskcard("hook", host, stdin=json.dumps(data))
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    lines = (workdir / "logs" / "events.jsonl").read_text().splitlines()
    assert all(len(line) < 1000 for line in lines)
    first, second, end = events(workdir)
    assert [first["kind"], second["kind"], end["kind"]] == ["tool.start", "tool.start", "tool.end"]
    assert first["name"] == "N" * 256
    assert first["call_id"] == end["call_id"] != second["call_id"]
    assert first["call_id"].startswith("sha256:")
    short = {
        **payload("03_pre_tool_use.json", workdir),
        "tool_use_id": "toolu_01",
        "tool_name": "Bash",
    }
    assert run_taskcard("hook", host, stdin=json.dumps(short)).returncode == 0
    assert (events(workdir)[-1]["call_id"], events(workdir)[-1]["name"]) == ("toolu_01", "Bash")


def test_a_tool_call_nested_deeper_than_python_reads_still_counts_in_the_usage(
    workdir: Path,
) -> None:
    """The transcript holds each tool call's input: a line deeper than Python's reader takes
    was skipped, with the usage it carried, and the turn's tokens came out short (or none)."""
    deep = "[" * 5000 + "]" * 5000
    call = {
        "type": "assistant",
        "message": {
            "id": "msg_1",
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": "DEEP"}],
            "usage": {"input_tokens": 100, "output_tokens": 80},
        },
    }
    prompt = {"type": "user", "message": {"role": "user", "content": "Run the tests"}}
    lines = [json.dumps(prompt), json.dumps(call).replace('"DEEP"', deep)]
    (workdir / "transcript.jsonl").write_text("\n".join(lines) + "\n")
    done = hook(payload("10_stop.json", workdir))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    usage, end = events(workdir)
    assert (usage["kind"], end["kind"]) == ("usage", "turn.end")
    assert (usage["input_tokens"], usage["output_tokens"]) == (100, 80)


def test_a_subagent_id_of_any_length_keeps_its_wait(workdir: Path) -> None:
    """The saved wait carries the subagent's id; one longer than the waits file's read limit
    made the file unreadable, which lost every open wait. A huge id is kept as its digest."""
    huge = "x" * 100_000

    def send(name: str, **fields: object) -> None:
        data = {"session_id": "s1", "cwd": str(workdir), "hook_event_name": name, **fields}
        done = hook(data)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b""), name

    send("PermissionRequest", agent_id=huge, tool_name="Bash", tool_input={"command": "make"})
    send("PostToolUse", agent_id="b", tool_name="Read", tool_use_id="tb")
    assert kinds(workdir) == ["wait.start", "tool.end"]
    send("PostToolUse", agent_id=huge, tool_name="Bash", tool_use_id="ta")
    assert kinds(workdir)[2:] == ["wait.end", "tool.end"]


def test_a_subagents_permission_wait_outlasts_another_subagents_work(workdir: Path) -> None:
    """Two subagents at work at once: one's permission dialog opened a wait, and the other's
    next tool result ended it while the dialog was still open (the card read "running",
    and stayed so once the other was done). Only the waiting thread's moving on, or the
    turn's, ends it now."""

    def send(name: str, **fields: object) -> None:
        data = {"session_id": "s1", "cwd": str(workdir), "hook_event_name": name, **fields}
        done = hook(data)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b""), name

    send("PreToolUse", agent_id="a", tool_name="Bash", tool_use_id="ta")
    send("PermissionRequest", agent_id="a", tool_name="Bash", tool_input={"command": "make"})
    send("PreToolUse", agent_id="b", tool_name="Read", tool_use_id="tb")
    send("PostToolUse", agent_id="b", tool_name="Read", tool_use_id="tb")
    assert kinds(workdir) == ["tool.start", "wait.start", "tool.start", "tool.end"]
    send("PostToolUse", agent_id="a", tool_name="Bash", tool_use_id="ta")  # granted, ran
    assert kinds(workdir)[4:] == ["wait.end", "tool.end"]
    # The main thread's dialog: a subagent's work leaves it open, the turn's stop ends it.
    send("PermissionRequest", tool_name="Edit")
    send("PostToolUse", agent_id="b", tool_name="Read", tool_use_id="tc")
    send("Stop", stop_hook_active=False)
    assert kinds(workdir)[6:] == ["wait.start", "tool.end", "wait.end", "turn.end"]


@pytest.mark.parametrize("kind", ["folder", "fifo", "link out"])
@pytest.mark.parametrize(
    ("planted", "written"),
    [
        ("logs", False),
        ("logs/events.jsonl", False),
        ("logs/.taskcard-hook-waits.json.lock", True),
        (".notification", True),
    ],
)
def test_a_file_of_the_hooks_planted_over_says_which_in_one_line(
    workdir: Path, tmp_path: Path, planted: str, written: bool, kind: str
) -> None:
    """Something else where a hook's file belongs (a folder, a pipe, a link out of the
    workdir) is a problem of the workdir, not a bug: one line naming the file, no traceback;
    and one that holds only bookkeeping (the waits' lock, the notices) costs no event (a
    planted waits lock lost every event)."""
    path = workdir / planted
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "folder":  # or a file, where a folder belongs
        path.write_text("a file") if planted in ("logs", ".notification") else path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
    done = hook(payload("10_stop.json", workdir, transcript_path=""))
    assert (done.returncode, done.stdout) == (0, b"")
    log = workdir / "logs" / "taskcard-hook.log"
    said = done.stderr.decode() + (log.read_text() if log.is_file() else "")
    assert "Traceback" not in said
    lines = [line for line in said.splitlines() if planted in line]
    assert len(lines) == 1 and "cannot write the hook's files" in lines[0], said
    recorded = kinds(workdir) if (workdir / "logs" / "events.jsonl").is_file() else []
    assert recorded == (["turn.end"] if written else [])
    if kind == "link out":
        assert not list((tmp_path / "elsewhere").iterdir())


def test_a_folder_planted_at_the_waits_file_names_it_and_keeps_the_event(workdir: Path) -> None:
    """The waits are written back by a rename over their file: a folder there made the hook
    log the temporary file's name (not the one in the way) and say the event may be missing,
    though it was written."""
    waits = workdir / "logs" / ".taskcard-hook-waits.json"
    waits.mkdir(parents=True)
    done = hook(payload("13_permission_request.json", workdir))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["wait.start"]
    (line,) = (workdir / "logs" / "taskcard-hook.log").read_text().splitlines()
    assert f"cannot write the hook's files: {waits}: " in line
    assert line.endswith("the event is written without its session's wait")


@pytest.mark.parametrize("raw", [b"", b"  \n"])
def test_an_empty_stdin_says_where_the_payload_comes_from(workdir: Path, raw: bytes) -> None:
    done = hook(raw, "--workdir", str(workdir))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    assert "no payload: Claude Code passes the hook's JSON on stdin" in log
    assert "Traceback" not in log and events(workdir) == []


# What a hook's run must not import: the service, its configuration and the capability's
# models cost an agent host about 0.3 s of CPU on every tool call, twice per call.
_SERVICE_MODULES = (
    "taskcard.bridge.run.service",
    "taskcard.bridge.config",
    "taskcard.producers.task_card.capability",
    "pydantic",
)
_IMPORTED_BY_A_HOOK = """\
import contextlib, json, sys
from taskcard.bridge.cli import main
with contextlib.redirect_stdout(sys.stderr):
    code = main(["hook", sys.argv[1]])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize(
    ("host", "name"),
    [("claude-code", "03_pre_tool_use.json"), ("claude-code", "10_stop.json"), ("codex", "")],
)
def test_a_hooks_run_imports_none_of_the_service(workdir: Path, host: str, name: str) -> None:
    """A hook builds only its own command: the rest of the command line imported the whole
    service for every tool call."""
    data = payload(name, workdir) if name else payload("10_stop.json", workdir)
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTED_BY_A_HOOK, host],
        input=json.dumps(data).encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["code"] == 0
    assert kinds(workdir), "the event was recorded"
    assert not [module for module in _SERVICE_MODULES if module in result["modules"]], result


@pytest.mark.parametrize(
    ("stdin", "said"),
    [
        (b'{"hook_event_name": "Stop", "cwd": "/tm', "ends before the object is complete"),
        (b'{"hook_event_name": "Stop"} {"x": 1}', "extra data at line 1, column 29"),
        (b'{"hook_event_name": "Stop", "cwd": /tmp}', "expecting value at line 1, column 36"),
        (b'["Stop"]', "not a JSON object (the top level is an array)"),
        (b'"Stop"', "not a JSON object (the top level is a string)"),
        (b'{"hook_event_name": "Stop", "cwd": 5}', "cwd must be the session's folder"),
        (b'{"hook_event_name": "Stop", "cwd": " "}', "cwd must be the session's folder"),
        (b'{"hook_event_name": "Stop"}', "the payload has no cwd"),
    ],
)
def test_an_unusable_payload_is_told_by_where_it_went_wrong(stdin: bytes, said: str) -> None:
    """A payload that was not JSON was told only as `payload is not JSON (JSONDecodeError)`,
    and a `cwd` of the wrong type as `the payload has no cwd`: neither says what to fix."""
    done = hook(stdin)
    assert done.returncode == 0 and done.stdout == b""
    line = done.stderr.decode()
    assert said in line and line.rstrip().endswith(("nothing written", "(pass --workdir)")), line
    assert "Traceback" not in line and line.count("\n") == 1


@pytest.mark.parametrize("named", [{}, {"hook_event_name": ""}, {"hook_event_name": " "}])
def test_a_payload_naming_no_event_is_logged_not_ignored(
    workdir: Path, named: dict[str, str]
) -> None:
    """A payload without its event's name was dropped without a word: nothing on the card,
    nothing in the log, only an empty `logs/` folder to show the hook had run."""
    done = hook({"session_id": "s1", "cwd": str(workdir), **named})
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    assert "hook_event_name: missing or empty" in log and "nothing written" in log, log
    assert events(workdir) == []
