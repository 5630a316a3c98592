"""Claude Code forks in one workdir, shown on its one card: pure decisions.

A `/fork` copy, `--fork-session` or `/branch` runs the project's hooks with the same workdir
as the session it came from, so the events of both land in one activity log. Its
`SessionStart` says so (`source: fork`). The hooks keep the sessions live there, by
`session_id` (`SESSIONS_FILE`, one record per session: whether its turn is open, whether it
is a fork, and when it was last heard from), and write each session's events so that the
card tells the truth about the agent and its forks:

- A fork neither starts nor ends the card: its `agent.start` and `agent.exit` are left out
  while another session is live (the first would reset the card of an agent at work, the
  second tell the chats that the agent exited).
- The card is busy while the agent or a fork works: a session's `turn.start` is left out
  while another's turn is open (the card is running already; a new start would clear the
  other's open wait), its origin kept as a `turn.origin`; its `turn.end` is left out while
  another's turn is open (the card would read idle, and nudge the chats, while work goes on).
- The card waits while one of them waits on a person for a decision (a permission): a
  session's `wait.end` is left out while another's such wait is open. One idle at its prompt
  (an input wait) while another works does not make the card idle: that `wait.start` is left
  out while another's turn is open.
- Sessions that are not forks are the agent itself, one after the other, and their events are
  written as they come, as with one session: the rules above hold between a fork and the
  others, never between two sessions that are not forks. A session that starts afresh (a
  `SessionStart` of any source but `fork`, or `compact`, which goes on in the same session)
  starts a new run of the agent: the sessions known before it are forgotten (one killed
  before its `SessionEnd` would hold the card). A second terminal, a nested `claude -p`, or a
  fork of a version that called it `resume` is therefore the agent starting again, as the
  hooks have always read it.
- A session's turn opens with its `turn.start` or a `tool.start` (as the card reads them) and
  closes with its `turn.end`; its `SessionEnd` (any reason) removes it. A session not heard
  from for `STALE_AFTER_S` is taken as gone (a process killed before its `SessionEnd`) and
  counts no more; its next event makes it live again (a fork then as a session of its own).

A payload without a usable `session_id` counts as one session of its own (`-`). A record that
cannot be read (a corrupt or oversized file, a value of another shape) is dropped and the
file rebuilt from the next events, never an error; the file keeps the newest 64 sessions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any, Final, NamedTuple

from taskcard.producers.agent_hooks.claude_code import Event, wait_reason_of

SESSIONS_FILE: Final = ".taskcard-hook-sessions.json"
STALE_AFTER_S: Final = 6 * 3600
# How often a live session's record is written again while nothing else about it changes.
_REFRESH_S: Final = 60
_OPEN: Final = "open"
_IDLE: Final = "idle"
# The reason of a wait that asks the person for a decision, not for the next prompt.
_INPUT: Final = "input"


_FORK: Final = "fork"
_SEEN = re.compile(r"[0-9]{1,12}")


class _Session(NamedTuple):
    """A live session's record: whether its turn is open, when it was last heard from, and
    whether it is a fork (its start said `source: fork`)."""

    is_open: bool
    seen: int
    fork: bool

    def record(self) -> str:
        fork = f" {_FORK}" if self.fork else ""
        return f"{_OPEN if self.is_open else _IDLE} {self.seen}{fork}"


def _parse(record: object, now: int) -> _Session | None:
    """A live session's record, None when it is not one (of another shape, or stale, or from
    a clock far ahead)."""
    if not isinstance(record, str):
        return None
    parts = record.split(" ")
    if (
        len(parts) not in (2, 3)
        or parts[0] not in (_OPEN, _IDLE)
        or not _SEEN.fullmatch(parts[1])
        or parts[2:] not in ([], [_FORK])
    ):
        return None
    seen = int(parts[1])
    if abs(now - seen) > STALE_AFTER_S:
        return None
    return _Session(parts[0] == _OPEN, seen, len(parts) == 3)


def merge(
    events: list[Event],
    key: str,
    ended: bool,
    sessions: MutableMapping[str, str],
    waits: Mapping[str, str],
    now: int,
    source: object = None,
) -> list[Event]:
    """`events` of session `key` as the card is to see them beside the other live sessions
    (see the module's rules), and `sessions` updated: `key` heard from now, or removed when
    `ended` (its `SessionEnd`). `source` is its `SessionStart`'s source when the events are
    of one. Records that are not live are removed, and every other when it starts afresh."""
    afresh = source is not None and source not in (_FORK, "compact")
    live = {
        name: parsed
        for name, record in sessions.items()
        if (not afresh or name == key) and (parsed := _parse(record, now))
    }
    for name in [name for name in sessions if name not in live]:
        del sessions[name]
    before = live.get(key)
    fork = source == _FORK or (before is not None and before.fork and not afresh)
    # A fork is shown beside every other session; the agent's own sessions beside forks only.
    others = {
        name: session.is_open
        for name, session in live.items()
        if name != key and (fork or session.fork)
    }
    others_open = any(others.values())
    others_deciding = any(
        wait_reason_of(wait) != _INPUT for name, wait in waits.items() if name in others
    )
    kept: list[Event] = []
    is_open = before.is_open if before is not None else False
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
    if ended:
        sessions.pop(key, None)
    elif before is None or before.is_open != is_open or now - before.seen >= _REFRESH_S:
        # Written when it changes, or to say it is still live: not at every tool call.
        sessions.pop(key, None)  # re-added last: the newest are kept
        sessions[key] = _Session(is_open, now, fork).record()
    return kept


def _open_after(kind: str, is_open: bool) -> bool:
    """Whether a session's turn is open after one of its events, as the card reads them."""
    if kind in ("turn.start", "tool.start"):
        return True
    if kind in ("turn.end", "agent.start", "agent.exit"):
        return False
    return is_open
