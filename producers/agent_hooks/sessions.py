"""Several Claude Code sessions in one workdir, shown on its one card: pure decisions.

A `/fork` copy, `--fork-session`, `/branch` or a background session (`/bg`, `claude --bg`)
runs the project's hooks with the same workdir as the session it came from, so the events of
both land in one activity log. The hooks keep which sessions are live there, by `session_id`
(`SESSIONS_FILE`, one record per session: whether its turn is open, and when it was last
heard from), and write each session's events so that the card tells the truth about them all:

- The card starts with the first live session and exits with the last: a session's
  `agent.start` is left out while another session is live (it would reset the card of an agent
  at work), and its `agent.exit` too (the chats would read that the agent exited).
- The card is busy while any session works: a session's `turn.start` is left out while another
  session's turn is open (the card is running already; a new start would clear another
  session's open wait), its origin kept as a `turn.origin`; its `turn.end` is left out while
  another session's turn is open (the card would read idle, and nudge the chats, while work
  goes on).
- The card waits while one session waits on a person for a decision (a permission): a
  session's `wait.end` is left out while another session's such wait is open. A session
  idle at its prompt (an input wait) while another works does not make the card idle: that
  `wait.start` is left out while another session's turn is open.
- A session's turn opens with its `turn.start` or a `tool.start` (as the card reads them) and
  closes with its `turn.end`; its `SessionEnd` (any reason) removes it. A session not heard
  from for `STALE_AFTER_S` is taken as gone (a process killed before its `SessionEnd`) and
  counts no more; its next event makes it live again.
- A session that starts afresh (a `SessionStart` of any source but `fork`, or `compact`,
  which goes on in the same session) takes the place of every session known before it: the
  one it replaces ended by `/clear` or was killed before its `SessionEnd` (a crash, a
  restart), and kept as live its open turn would hold the new session's card at "running"
  for hours. A session still at work is live again at its next event.

A payload without a usable `session_id` counts as one session of its own (`-`). A record that
cannot be read (a corrupt or oversized file, a value of another shape) is dropped and the
file rebuilt from the next events, never an error; the file keeps the newest 64 sessions.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Final

from taskcard.producers.agent_hooks.claude_code import Event, wait_reason_of

SESSIONS_FILE: Final = ".taskcard-hook-sessions.json"
STALE_AFTER_S: Final = 6 * 3600
# How often a live session's record is written again while nothing else about it changes.
_REFRESH_S: Final = 60
_OPEN: Final = "open"
_IDLE: Final = "idle"
# The reason of a wait that asks the person for a decision, not for the next prompt.
_INPUT: Final = "input"


def _parse(record: str, now: int) -> tuple[bool, int] | None:
    """(turn open, last heard from) of a live session's record, None when it is not one (of
    another shape, or stale, or from a clock far ahead)."""
    state, _, seen_text = record.partition(" ")
    if state not in (_OPEN, _IDLE) or not seen_text.isdigit() or len(seen_text) > 12:
        return None
    seen = int(seen_text)
    if abs(now - seen) > STALE_AFTER_S:
        return None
    return state == _OPEN, seen


def merge(
    events: list[Event],
    key: str,
    ended: bool,
    sessions: MutableMapping[str, str],
    waits: Mapping[str, str],
    now: int,
    afresh: bool = False,
) -> list[Event]:
    """`events` of session `key` as the card is to see them beside the other live sessions
    (see the module's rules), and `sessions` updated: `key` heard from now, or removed when
    `ended` (its `SessionEnd`). Records that are not live are removed, and when the session
    starts `afresh`, every other."""
    live = {
        name: parsed
        for name, record in sessions.items()
        if (not afresh or name == key) and (parsed := _parse(record, now))
    }
    for name in [name for name in sessions if name not in live]:
        del sessions[name]
    others = {name: is_open for name, (is_open, _) in live.items() if name != key}
    others_open = any(others.values())
    others_deciding = any(
        wait_reason_of(wait) != _INPUT for name, wait in waits.items() if name in others
    )
    kept: list[Event] = []
    is_open = live[key][0] if key in live else False
    for kind, fields in events:
        is_open = _open_after(kind, is_open)
        if kind in ("agent.start", "agent.exit") and others:
            continue
        if kind == "turn.start" and others_open:
            origin: Any = fields.get("origin")
            if isinstance(origin, str):
                kept.append(("turn.origin", {"origin": origin}))
            continue
        if kind == "turn.end" and others_open:
            continue
        if kind == "wait.start" and fields.get("reason") == _INPUT and others_open:
            continue
        if kind == "wait.end" and others_deciding:
            continue
        kept.append((kind, fields))
    before = live.get(key)
    if ended:
        sessions.pop(key, None)
    elif before is None or before[0] != is_open or now - before[1] >= _REFRESH_S:
        # Written when it changes, or to say it is still live: not at every tool call.
        sessions.pop(key, None)  # re-added last: the newest are kept
        sessions[key] = f"{_OPEN if is_open else _IDLE} {now}"
    return kept


def _open_after(kind: str, is_open: bool) -> bool:
    """Whether a session's turn is open after one of its events, as the card reads them."""
    if kind in ("turn.start", "tool.start"):
        return True
    if kind in ("turn.end", "agent.start", "agent.exit"):
        return False
    return is_open
