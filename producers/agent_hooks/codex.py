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

- The turn's token usage at `Stop` is read from Codex's own transcript, its rollout
  (`rollout_usage`, on the file's tail only). That is the turn's count so far: a turn
  that a stop hook made go on stops more than once under one turn id, so each stop writes
  what the turn's earlier stops have not (`runner._unwritten_usage`).
- Codex has no `PostToolUseFailure`: its `PostToolUse` carries the tool's result as
  `tool_response`, and for an MCP tool that is the MCP call result, whose `isError` says the
  tool failed (`tool_failed`); it then maps as Claude Code's failure. A shell command's
  `tool_response` is only its output text, with no exit code, so a command that exits
  non-zero still reads as done.
- The chat's queued texts are handed over as for Claude Code (`inbox_hook`): Codex reads
  `hookSpecificOutput.additionalContext` at `UserPromptSubmit` and `PostToolUse`, and a
  blocked stop's `reason`. Nothing else is printed (Codex takes plain text on stdout at
  `SessionStart` and `UserPromptSubmit` as context for the model); the card's wakes reach
  Codex through the MCP results.
- A `Stop` with `stop_hook_active` ends the turn as Claude Code's does (it ends a response
  a stop hook made Codex go on with). Codex runs the copy of the hook from each config
  layer, and each sees that stop: only the copy that first claims the response (its turn id
  and last message, `runner._response_of`) ends the turn.
- Since `notify` and the `Stop` hook both end a turn, each `turn_id` ends a turn (and counts
  for reminders, and has its usage written) only the first time either reports it.
- Its `Interrupt` hook (the person stopped the turn; no `Stop` follows) is Codex's own: it
  ends the turn as interrupted (`interrupt_decision`).

- Its `StopFailure` hook (the turn ended in an API error; no `Stop` follows) maps as Claude
  Code's: `turn.end` with the error's category (`error`, one of `rate_limit`, `overloaded`,
  `billing_error`, ...), and one line with `error_details` when the payload has them. It
  ends its turn id as a `Stop` would (once, whichever copy or `notify` reports it first).
  Nothing is printed: Codex reads a recovery (a retry with another model) from its stdout,
  which is the user's to choose.

`init codex` registers the events the adapter maps of those Codex documents: `SessionStart`,
`UserPromptSubmit`, `PreToolUse`, `PermissionRequest`, `PostToolUse`, `PreCompact`, `Stop`,
`StopFailure`, `Interrupt` (not `PostCompact`, `SubagentStart`, `SubagentStop`, which map to
nothing, nor `SessionEnd`: its one reason, `other`, cannot tell an exit from a `/clear`, after
which the session starts again, so a cleared session would read as exited). Codex sends no
`Notification` or `PostToolUseFailure`. A Codex that predates an event skips its key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, TypeGuard

from taskcard.producers.agent_hooks.claude_code import Event, HookDecision, wait_reason_of
from taskcard.producers.task_card.contract import MAX_COUNT

# The rollout events that open a turn (`turn_started` is the newer name of `task_started`).
_TURN_STARTS: Final = frozenset({"task_started", "turn_started"})


def interrupt_decision(waiting: str | None) -> HookDecision:
    """Codex's `Interrupt` hook (the person stopped the turn; no `Stop` follows): the turn
    ends as interrupted, as an interrupted tool call ends a Claude Code turn. Not a completed
    turn for reminders."""
    events: list[Event] = (
        [] if waiting is None else [("wait.end", {"reason": wait_reason_of(waiting)})]
    )
    events += [("turn.end", {"error": "interrupted"}), ("text", {"text": "turn interrupted"})]
    return HookDecision(events, None, completed_turn=False)


def tool_failed(payload: Mapping[str, Any]) -> bool:
    """A `PostToolUse` whose result says the tool failed: an MCP call result with `isError`."""
    result = payload.get("tool_response")
    return isinstance(result, dict) and (
        result.get("isError") is True or result.get("is_error") is True
    )


def codex_events(payload: Mapping[str, Any]) -> tuple[list[Event], bool]:
    """The events for one payload, and whether it completed a turn."""
    if payload.get("type") == "agent-turn-complete":
        return [("turn.end", {})], True
    return [], False


def _tokens(usage: object) -> tuple[int, int] | None:
    """Input and output tokens of one of Codex's token usage objects (its input count
    already holds the cached input), None unless both are whole counts."""
    if not isinstance(usage, dict):
        return None
    tokens_in, tokens_out = usage.get("input_tokens"), usage.get("output_tokens")
    if _count(tokens_in) and _count(tokens_out):
        return tokens_in, tokens_out
    return None


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def rollout_usage(lines: list[bytes]) -> tuple[int, int] | None:
    """Input and output tokens of the last turn in the lines of a Codex rollout (the session
    transcript that hook payloads name in `transcript_path`), None when none are known.

    Codex records `event_msg` lines of type `token_count` whose `info` holds the session's
    running total (`total_token_usage`) and the last model call's (`last_token_usage`); the
    same figures are often written twice. A turn opens with `task_started` (`turn_started`);
    in a rollout without those, with the person's `user_message`. The turn's usage is its
    last total less the total before its first call.
    """
    # Per opening kind: the total before the turn's first call, and its latest total.
    spans: dict[str, list[tuple[int, int] | None]] = {"turn": [None, None], "prompt": [None, None]}
    turn_marks = False
    for raw in lines:
        if b'"event_msg"' not in raw:  # most lines, and the biggest: not parsed
            continue
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        payload = entry.get("payload") if isinstance(entry, dict) else None
        if not isinstance(payload, dict) or entry.get("type") != "event_msg":
            continue
        kind = payload.get("type")
        if kind in _TURN_STARTS or kind == "user_message":
            turn_marks = turn_marks or kind in _TURN_STARTS
            spans["turn" if kind in _TURN_STARTS else "prompt"] = [None, None]
            continue
        info = payload.get("info") if kind == "token_count" else None
        total = _tokens(info.get("total_token_usage")) if isinstance(info, dict) else None
        if not isinstance(info, dict) or total is None:
            continue
        last = _tokens(info.get("last_token_usage")) or (0, 0)
        for span in spans.values():
            if span[0] is None:
                span[0] = (max(0, total[0] - last[0]), max(0, total[1] - last[1]))
            span[1] = total
    before, latest = spans["turn" if turn_marks else "prompt"]
    if before is None or latest is None:
        return None
    # Capped at what the activity log takes: an absurd count must not cost the turn's events.
    return (
        min(MAX_COUNT, max(0, latest[0] - before[0])),
        min(MAX_COUNT, max(0, latest[1] - before[1])),
    )
