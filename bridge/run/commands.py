"""`/taskcard` arguments read as a typed command, and what each does to a chat's preferences.

Pure, so the table of what people may type is tested on its own; the service dispatches the
typed command (replies, suppressing notices, projecting the routes again). The arguments are a
chat member's text: anything not understood is `unknown`, and is never echoed back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from taskcard.bridge.store.sqlite import ChatPrefs

MIN_ROWS: Final = 1
MAX_ROWS: Final = 10
_ROWS_ARG: Final = re.compile(r"^[0-9]{1,2}$")  # ASCII digits only, not "٣"

TaskcardAction = Literal["state", "off", "on", "rows", "cancel", "board", "cards", "unknown"]


@dataclass(frozen=True)
class TaskcardCommand:
    """What `/taskcard ARGS` asks for; `rows` only with `action == "rows"`."""

    action: TaskcardAction
    rows: int | None = None


def parse_taskcard(args: str) -> TaskcardCommand:
    """`""`/`status`/`state`: show the state; `off`/`on`: hide/show the cards; `1`-`10`: that
    many activity rows; `cancel`: withdraw the author's latest message still queued for an
    agent; `board`/`cards`: one board for the chat, or one card per agent; anything else is
    unknown (case and surrounding space ignored)."""
    word = args.strip().lower()
    if word in ("", "status", "state"):
        return TaskcardCommand("state")
    if word == "off":
        return TaskcardCommand("off")
    if word == "on":
        return TaskcardCommand("on")
    if word == "cancel":
        return TaskcardCommand("cancel")
    if word in ("board", "cards"):
        return TaskcardCommand("board" if word == "board" else "cards")
    if _ROWS_ARG.match(word) and MIN_ROWS <= int(word) <= MAX_ROWS:
        return TaskcardCommand("rows", int(word))
    return TaskcardCommand("unknown")


def apply_to_prefs(command: TaskcardCommand, prefs: ChatPrefs) -> ChatPrefs:
    """The chat's preferences after `command` (unchanged for one that only asks)."""
    if command.action == "off":
        return ChatPrefs(hidden=True, activity_rows=prefs.activity_rows)
    if command.action == "on":
        return ChatPrefs(hidden=False, activity_rows=prefs.activity_rows)
    if command.action == "rows":
        return ChatPrefs(hidden=prefs.hidden, activity_rows=command.rows)
    return prefs
