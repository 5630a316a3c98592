"""Claude Code hook payloads to activity events: pure decisions, table-tested.

Mapping (hook event -> activity kinds):

- `SessionStart` -> `agent.start`; `SessionEnd` -> `agent.exit`. Not a `SessionStart` with
  source `compact`: Claude Code sends it when a compaction ends, often in the middle of a
  turn, and an `agent.start` there would drop the running turn (the card read "at prompt").
  Nor a `SessionEnd` with reason `clear`: `/clear` ends the conversation, not the process,
  and its `SessionStart` (source `clear`) follows; an `agent.exit` would tell the chats the
  agent exited without a report.
- `UserPromptSubmit` -> `turn.start`.
- `PreToolUse` -> `tool.start` (call_id = `tool_use_id`, name = `tool_name`); no summary, as
  a tool's input may hold secrets. `PostToolUse` / `PostToolUseFailure` -> `tool.end` with
  `ok` true / false.
- `Notification` of a permission prompt -> `wait.start` reason `permission`; of an input
  prompt (idle prompt, elicitation dialog) -> `wait.start` reason `input`; other
  notifications change nothing. The wait ends (`wait.end`) with the next event of that
  session, whatever it is.
- `Stop` -> `usage` (the turn's tokens, when the transcript has them) then `turn.end`; it is
  also the completed turn that reminders count. A `Stop` with `stop_hook_active` means
  another stop hook made Claude go on, so the turn has not ended yet: nothing then.
- `SubagentStop` -> nothing: the `Task` tool call that ran the subagent already shows as a
  tool start and end in the parent session.
- `PreCompact` -> `text` "compacting the conversation": it can take a while, and the card
  should not look stuck on the last tool meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from taskcard.producers.task_card.contract import open_regular

Event = tuple[str, dict[str, Any]]

# Events after which Claude Code reads `hookSpecificOutput.additionalContext`.
CONTEXT_EVENTS: Final = frozenset({"UserPromptSubmit", "PostToolUse"})
TRANSCRIPT_TAIL_BYTES: Final = 4_000_000
_INPUT_PROMPTS: Final = frozenset({"idle_prompt", "elicitation_dialog"})


@dataclass(frozen=True)
class HookDecision:
    """What one payload means: the events to append, and the session's wait afterwards."""

    events: list[Event]
    waiting: str | None
    completed_turn: bool


def _text(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    return value if isinstance(value, str) and value else None


def wait_reason(payload: Mapping[str, Any]) -> str | None:
    """`permission` or `input` for a notification that blocks on a person, else None."""
    kind = _text(payload, "notification_type")
    if kind == "permission_prompt":
        return "permission"
    if kind in _INPUT_PROMPTS:
        return "input"
    if kind is not None:
        return None
    message = (_text(payload, "message") or "").lower()  # hosts before notification_type
    if "permission" in message:
        return "permission"
    if "waiting for your input" in message:
        return "input"
    return None


def decide(
    payload: Mapping[str, Any],
    waiting: str | None,
    usage: tuple[int, int] | None = None,
) -> HookDecision:
    """The events for one hook payload, given the session's open wait (if any)."""
    name = payload.get("hook_event_name")
    events: list[Event] = []
    if name == "Notification":
        reason = wait_reason(payload)
        if reason is None or reason == waiting:
            return HookDecision([], waiting, completed_turn=False)
        if waiting is not None:
            events.append(("wait.end", {"reason": waiting}))
        events.append(("wait.start", {"reason": reason}))
        return HookDecision(events, reason, completed_turn=False)
    if waiting is not None and name is not None:
        events.append(("wait.end", {"reason": waiting}))
    tool = _text(payload, "tool_name") or "tool"
    call_id = _text(payload, "tool_use_id") or tool
    completed = False
    if name == "SessionStart":
        if payload.get("source") != "compact":  # the same session goes on after compacting
            events.append(("agent.start", {}))
    elif name == "SessionEnd":
        if payload.get("reason") != "clear":  # /clear: the process goes on, restarted next
            events.append(("agent.exit", {}))
    elif name == "UserPromptSubmit":
        events.append(("turn.start", {}))
    elif name == "PreToolUse":
        events.append(("tool.start", {"call_id": call_id, "name": tool}))
    elif name in ("PostToolUse", "PostToolUseFailure"):
        events.append(("tool.end", {"call_id": call_id, "ok": name == "PostToolUse"}))
    elif name == "Stop" and payload.get("stop_hook_active") is not True:
        if usage is not None:
            events.append(("usage", {"input_tokens": usage[0], "output_tokens": usage[1]}))
        events.append(("turn.end", {}))
        completed = True
    elif name == "PreCompact":
        events.append(("text", {"text": "compacting the conversation"}))
    return HookDecision(events, None if name is not None else waiting, completed)


def hook_output(event_name: object, wakes: list[str]) -> dict[str, Any] | None:
    """The JSON Claude Code reads from stdout, or None to print nothing."""
    if not wakes or event_name not in CONTEXT_EVENTS:
        return None
    return {
        "hookSpecificOutput": {
            "hookEventName": event_name,
            "additionalContext": "\n".join(wakes),
        }
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _is_prompt(entry: Mapping[str, Any]) -> bool:
    """A person's prompt (the start of a turn), not a tool result fed back to the model."""
    if entry.get("type") != "user":
        return False
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return True
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "text" for block in content
    )


def turn_usage(lines: list[bytes]) -> tuple[int, int] | None:
    """Input and output tokens of the last turn in transcript lines, None when none are known.

    Input counts the cached prompt tokens too (created and read), since the turn consumed
    them. One API message is written as several lines (one per content block) repeating its
    usage, so each message id counts once, with its last line's figures.
    """
    per_message: dict[str, tuple[int, int]] = {}
    for raw in lines:
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if not isinstance(entry, dict):
            continue
        if _is_prompt(entry):
            per_message.clear()
            continue
        message = entry.get("message")
        if entry.get("type") != "assistant" or not isinstance(message, dict):
            continue
        usage = message.get("usage")
        if not isinstance(usage, dict):
            continue
        tokens_in = sum(
            _count(usage.get(key))
            for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        ident = message.get("id")
        key = ident if isinstance(ident, str) else f"line{len(per_message)}"
        per_message[key] = (tokens_in, _count(usage.get("output_tokens")))
    if not per_message:
        return None
    return (
        sum(tokens for tokens, _ in per_message.values()),
        sum(tokens for _, tokens in per_message.values()),
    )


def read_transcript_usage(path: object) -> tuple[int, int] | None:
    """`turn_usage` of the transcript's tail (bounded), None when it cannot be read."""
    if not isinstance(path, str) or not path:
        return None
    try:
        with open_regular(Path(path)) as handle:  # a pipe there must not hang the hook
            size = handle.seek(0, 2)
            start = max(0, size - TRANSCRIPT_TAIL_BYTES)
            handle.seek(start)
            data = handle.read(TRANSCRIPT_TAIL_BYTES)
    except (OSError, ValueError):
        return None
    lines = data.splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # the first line of a tail is likely cut
    return turn_usage(lines)
