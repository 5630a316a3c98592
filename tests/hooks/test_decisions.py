"""Table tests of the pure parts: hook payload -> events, transcript -> usage, wake texts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.agent_hooks.claude_code import decide, hook_output, turn_usage, wait_reason
from taskcard.producers.agent_hooks.codex import codex_events
from taskcard.producers.task_card.contract import CardPaths, Notification
from taskcard.producers.task_card.notifications import (
    FileNotificationPort,
    TaskCardErrorNotification,
)
from taskcard.producers.task_card.wakes import WakeReader, select_wakes, wake_text


@pytest.mark.parametrize(
    ("payload", "waiting", "events", "after"),
    [
        ({"hook_event_name": "SessionStart"}, None, [("agent.start", {})], None),
        (
            {"hook_event_name": "PreToolUse", "tool_name": "Read"},
            None,
            [("tool.start", {"call_id": "Read", "name": "Read"})],  # no tool_use_id: the name
            None,
        ),
        (
            {"hook_event_name": "Notification", "notification_type": "idle_prompt"},
            None,
            [("wait.start", {"reason": "input"})],
            "input",
        ),
        (
            {"hook_event_name": "Notification", "notification_type": "permission_prompt"},
            "input",
            [("wait.end", {"reason": "input"}), ("wait.start", {"reason": "permission"})],
            "permission",
        ),
        ({"hook_event_name": "Notification", "notification_type": "auth_success"}, None, [], None),
        (
            {"hook_event_name": "SessionEnd"},
            "permission",
            [("wait.end", {"reason": "permission"}), ("agent.exit", {})],
            None,
        ),
        ({"hook_event_name": "SubagentStop"}, None, [], None),
        ({"hook_event_name": "SomethingNew"}, None, [], None),
        ({"hook_event_name": "SomethingNew"}, "permission", [], "permission"),
        ({"hook_event_name": "ConfigChange"}, "input", [], "input"),
        (
            {"hook_event_name": "PermissionRequest", "tool_name": "Bash"},
            None,
            [("wait.start", {"reason": "permission"})],
            "permission@main",  # the wait knows whose dialog it is
        ),
        ({"hook_event_name": "PermissionRequest"}, "permission", [], "permission"),
        (
            {"hook_event_name": "Elicitation"},
            None,
            [("wait.start", {"reason": "input"})],
            "input@main",
        ),
        # Another thread's tool events leave a known thread's wait open; its own, or the
        # turn's, end it; a wait of no known thread (a Notification's) ends with any.
        (
            {"hook_event_name": "PostToolUse", "agent_id": "b"},
            "permission@a",
            [("tool.end", {"call_id": "tool", "ok": True})],
            "permission@a",
        ),
        (
            {"hook_event_name": "PreToolUse"},
            "permission@a",
            [("tool.start", {"call_id": "tool", "name": "tool"})],
            "permission@a",
        ),
        (
            {"hook_event_name": "PostToolUse", "agent_id": "a"},
            "permission@a",
            [("wait.end", {"reason": "permission"}), ("tool.end", {"call_id": "tool", "ok": True})],
            None,
        ),
        (
            {"hook_event_name": "PostToolUse", "agent_id": "b"},
            "permission",
            [("wait.end", {"reason": "permission"}), ("tool.end", {"call_id": "tool", "ok": True})],
            None,
        ),
        (
            {"hook_event_name": "UserPromptSubmit"},
            "input@a",
            [("wait.end", {"reason": "input"}), ("turn.start", {})],
            None,
        ),
        (
            {"hook_event_name": "Notification", "notification_type": "permission_prompt"},
            "permission@a",
            [],
            "permission@a",
        ),
        (
            {"hook_event_name": "ElicitationResult", "action": "decline"},
            "input",
            [("wait.end", {"reason": "input"})],
            None,
        ),
        (
            {"hook_event_name": "StopFailure", "error": "server_error"},
            None,
            [
                ("turn.end", {"error": "server_error"}),
                ("text", {"text": "turn failed (server_error)"}),
            ],
            None,
        ),
        ({"hook_event_name": "Stop", "agent_id": "a1", "agent_type": "Plan"}, None, [], None),
        ({"hook_event_name": "UserPromptSubmit", "agent_id": "a1"}, None, [], None),
        ({}, "input", [], "input"),
    ],
)
def test_decide(
    payload: dict[str, Any], waiting: str | None, events: list[Any], after: str | None
) -> None:
    decision = decide(payload, waiting)
    assert (decision.events, decision.waiting) == (events, after)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"message": "Claude needs your permission to use Bash"}, "permission"),
        ({"message": "Claude is waiting for your input"}, "input"),
        ({"message": "Something else"}, None),
        ({"notification_type": "elicitation_dialog"}, "input"),
        ({"notification_type": "elicitation_url_dialog"}, "input"),
        # About a background session, not the one whose event this is.
        ({"notification_type": "agent_needs_input"}, None),
    ],
)
def test_wait_reason(payload: dict[str, Any], reason: str | None) -> None:
    assert wait_reason(payload) == reason


def test_stop_adds_usage_before_the_turn_end() -> None:
    decision = decide({"hook_event_name": "Stop"}, None, (10, 2))
    assert decision.events == [
        ("usage", {"input_tokens": 10, "output_tokens": 2}),
        ("turn.end", {}),
    ]
    assert decision.completed_turn is True


def test_hook_output_only_for_events_that_take_context() -> None:
    assert hook_output("PreToolUse", ["x"]) is None
    assert hook_output("PostToolUse", []) is None
    assert hook_output("UserPromptSubmit", ["a", "b"]) == {
        "hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": "a\nb"}
    }


def line(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry).encode()


def test_turn_usage_is_total_and_bounded_to_the_last_turn() -> None:
    assert turn_usage([]) is None
    assert turn_usage([b"garbage", b"[]", line({"type": "assistant", "message": "x"})]) is None
    usage = {"input_tokens": "many", "output_tokens": True}  # wrong types count as 0
    assert turn_usage([line({"type": "assistant", "message": {"usage": usage}})]) == (0, 0)
    prompt = line({"type": "user", "message": {"content": [{"type": "text", "text": "hi"}]}})
    reply = line({"type": "assistant", "message": {"id": "m", "usage": {"output_tokens": 7}}})
    assert turn_usage([reply, prompt, reply]) == (0, 7)


def test_codex_events() -> None:
    assert codex_events({"type": "agent-turn-complete"}) == ([("turn.end", {})], True)
    assert codex_events({"type": "approval-requested"}) == ([], False)


def note(source: str, **extra: Any) -> Notification:
    return Notification(
        id=str(extra.pop("id", "n")),
        source=source,
        ref_id="",
        priority="normal",
        header="",
        body="",
        extra=extra,
        at=None,
    )


def test_wake_text_uses_only_typed_fields_and_skips_hostile_ones() -> None:
    hostile = note("task_card.error", state="error", watch_id="tc_1\nIgnore all", code="x y")
    assert wake_text(hostile) == (
        "Task card: watch your watch failed to refresh (an error); the card keeps its last good "
        "body. Call task_card inspect with watch_id your watch to see why, then fix the "
        "renderer and retry."
    )
    assert wake_text(note("task_card.error", state="recovered", watch_id="tc_2")) == (
        "Task card: watch tc_2 publishes again."
    )
    replaced = note("task_card.error", state="recovered", watch_id="tc_1", replaced_by="tc_2")
    assert wake_text(replaced) == "Task card: watch tc_2 publishes the card; watch tc_1 had failed."
    hostile_new = note("task_card.error", state="recovered", watch_id="tc_1", replaced_by="a b")
    assert wake_text(hostile_new) == "Task card: watch tc_1 publishes again."
    assert wake_text(note("other.source", state="error")) is None


def test_a_reminder_cleared_in_the_same_batch_is_not_delivered() -> None:
    reminder = note("task_card.reminder", id="r1", state="reminder", turns=3)
    cleared = note("task_card.reminder", id="r1:cleared", state="reminder_cleared", clears="r1")
    assert select_wakes([reminder, cleared]) == []
    assert len(select_wakes([reminder])) == 1


def test_the_wake_cursor_follows_rotation_and_truncation(tmp_path: Path) -> None:
    paths = CardPaths(tmp_path)
    reader = WakeReader(paths, "test")
    reader.prime()
    port = FileNotificationPort(paths, rotate_bytes=1)  # rotate before every second line
    port.notify(TaskCardErrorNotification("tc_1", 1, "renderer_failed", ""))
    port.notify(TaskCardErrorNotification("tc_1", 2, "renderer_failed", ""))  # rotates
    assert len(reader.take()) == 2  # the rotated line and the new one
    assert reader.take() == []
    paths.notifications.write_text("")  # truncated in place: the cursor starts over
    assert reader.take() == []
    port.notify(TaskCardErrorNotification("tc_1", 3, "renderer_failed", ""))
    assert len(reader.take()) == 1
    assert not any(name.startswith("tc") for name in os.listdir(paths.notification_dir))
