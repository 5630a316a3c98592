"""Codex's `notify` program payload to activity events: pure, table-tested.

Codex runs the configured `notify` command with one JSON argument after each turn. The only
type it sends is `agent-turn-complete` (with `thread-id`, `turn-id`, `cwd`, `input-messages`,
`last-assistant-message`, and in newer versions `client`). It marks the end of a turn, so it
becomes `turn.end` and counts as a completed turn for reminders (preceded by a `turn.origin`
when `TASKCARD_ORIGIN` is set, see `runner.with_origin`). Nothing of the messages is
copied: they are the agent's conversation, not public lines. Codex reads nothing back from
this program, so task card wakes reach a Codex agent through the MCP results instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskcard.producers.agent_hooks.claude_code import Event


def codex_events(payload: Mapping[str, Any]) -> tuple[list[Event], bool]:
    """The events for one payload, and whether it completed a turn."""
    if payload.get("type") == "agent-turn-complete":
        return [("turn.end", {})], True
    return [], False
