"""How an agent's movements read on a card: the wording of the activity rows.

`bridge.track.activity` keeps the facts (event kind, tool name, the agent's own text); this
module words them, redacts the agent's text and bounds each row to one short line. The times
of the rows are formatted by the card composer (`format_at`), never here.
"""

from __future__ import annotations

from typing import Final

from taskcard.bridge.compose.redact import redact
from taskcard.bridge.track.activity import Movement
from taskcard.producers.task_card.contract import cut_line, one_line

ROW_CHARS: Final = 100

_FIXED: Final = {
    "agent.start": "agent started",
    "turn.start": "turn started",
    "turn.end": "turn ended",
    "wait.end": "resumed",
}


def movement_words(movement: Movement) -> str:
    """The movement in words, before redaction and shortening."""
    kind = movement.kind
    if kind in _FIXED:
        return _FIXED[kind]
    if kind == "agent.exit":
        return "agent exited" if movement.code is None else f"agent exited (code {movement.code})"
    if kind == "wait.start":
        return f"waiting: {movement.detail}" if movement.detail else "waiting"
    if kind == "tool.start":
        name = movement.name or "tool"
        return f"{name}: {movement.detail}" if movement.detail else name
    if kind == "tool.end":
        name = movement.name or "tool"
        outcome = "done" if movement.ok is not False else "failed"
        if movement.duration_s is not None:
            return f"{name} {outcome} in {movement.duration_s:.1f} s"
        return f"{name} {outcome}"
    return movement.detail or kind


def movement_text(movement: Movement) -> str:
    """One redacted line of at most `ROW_CHARS` characters: what a card shows."""
    return cut_line(redact(one_line(movement_words(movement))), ROW_CHARS)
