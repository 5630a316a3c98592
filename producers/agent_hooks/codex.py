"""Codex's `notify` program payload to activity events: pure, table-tested.

Codex runs the configured `notify` command with one JSON argument after each turn. The only
type it sends is `agent-turn-complete` (with `thread-id`, `turn-id`, `cwd`, `input-messages`,
`last-assistant-message`, and in newer versions `client`). It marks the end of a turn, so it
becomes `turn.end` and counts as a completed turn for reminders (preceded by a `turn.origin`
when `TASKCARD_ORIGIN` is set, see `runner.with_origin`). Nothing of the messages is
copied: they are the agent's conversation, not public lines. Codex reads nothing back from
this program, so task card wakes reach a Codex agent through the MCP results instead.

Codex's lifecycle hooks (hooks.json) send a JSON payload on stdin whose fields are Claude
Code's (`hook_event_name`, `session_id`, `cwd`, `transcript_path`, `tool_name`,
`tool_use_id`, `stop_hook_active`, `source`, `agent_id`, ...; plus `turn_id` and `model`),
so `claude_code.decide` maps them (`runner._codex_hook`). The differences, handled there:
no token usage (the transcript is Codex's own format); nothing printed (Codex reads plain
text on stdout at `SessionStart` and `UserPromptSubmit` as context for the model, and JSON as
a decision), so no inbox delivery either; and since `notify` and the `Stop` hook both end a
turn, each `turn_id` ends a turn (and counts for reminders) only the first time either
reports it. Codex sends no `SessionEnd` or `Notification`; its newer `StopFailure` maps as
Claude Code's, but `init codex` does not register it (nor `PreCompact`, `PostCompact`,
`SubagentStart`, `SubagentStop`): a Codex that predates an event may refuse the file.
Its `Interrupt` hook (the person stopped the turn) is Codex's own: it ends the turn as
interrupted (`interrupt_decision`); it is not registered either, for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskcard.producers.agent_hooks.claude_code import Event, HookDecision


def interrupt_decision(waiting: str | None) -> HookDecision:
    """Codex's `Interrupt` hook (the person stopped the turn; no `Stop` follows): the turn
    ends as interrupted, as an interrupted tool call ends a Claude Code turn. Not a completed
    turn for reminders."""
    events: list[Event] = [] if waiting is None else [("wait.end", {"reason": waiting})]
    events += [("turn.end", {"error": "interrupted"}), ("text", {"text": "turn interrupted"})]
    return HookDecision(events, None, completed_turn=False)


def codex_events(payload: Mapping[str, Any]) -> tuple[list[Event], bool]:
    """The events for one payload, and whether it completed a turn."""
    if payload.get("type") == "agent-turn-complete":
        return [("turn.end", {})], True
    return [], False
