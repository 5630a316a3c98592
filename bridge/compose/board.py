"""The board: one resident message for a whole chat, a line per agent (pure functions).

In a group that follows many agents, one card per agent shares the chat's few messages a
minute among all of them, so each card goes minutes stale. A board spends that budget on one
message instead: every change lands in it at the chat's pace (the scheduler's latest-wins
coalescing makes a burst of changes one edit).

A line says, in plain text: the agent and its state, marks for what needs a person (a
renderer error, files the service refused to read or failed to handle, the refresh limit
reached, waiting for a person), the first line of its card
and its last movement with the time. Lines that need people come first (the most urgent mark
first), then by state (moving agents before resting ones), then by agent id, so a line only
moves when its agent's situation changes. Everything agent-written is scrubbed (pattern
redaction here, the service's own secrets through `scrub`) *before* it is cut to its bound,
so a cut never leaves half a secret that the scrubbing can no longer recognise.

`fit_board` cuts the board to a platform's size by dropping lines from the end (the least
urgent ones) and counting them, so the reader knows how many are not shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, tzinfo
from typing import Any, cast, get_args

from taskcard.bridge.compose.activity import movement_words as activity_movement_words
from taskcard.bridge.compose.redact import redact
from taskcard.bridge.compose.view import format_at
from taskcard.bridge.track.monitor import ActivitySummary, CardState
from taskcard.channels.base import AgentState, BoardLine, BoardMark, BoardView, counted
from taskcard.producers.task_card.contract import cut_line, one_line

# Bounds of the agent-written parts of a line, in characters: a line stays short enough
# that a Telegram board shows a few dozen agents, whatever an agent writes.
HEADLINE_MAX_CHARS = 80
MOVEMENT_MAX_CHARS = 60

_MARK_RANK: dict[BoardMark, int] = {"error": 0, "problems": 1, "limit": 2, "waiting": 3}
_STATE_RANK: dict[AgentState, int] = {
    "running": 0,
    "no output": 1,
    "waiting": 2,
    "idle": 3,
    "unknown": 4,
    "exited": 5,
}
# Markdown that only decorates a line: list and quote markers, heading hashes, emphasis.
_LINE_MARKERS = re.compile(r"^\s*(?:#{1,6}\s+|>\s*|[-*+]\s+(?:\[[ xX]\]\s+)?|\d{1,9}[.)]\s+)+")
_EMPHASIS = re.compile(r"(\*\*|__|\*|`+|~~)")


@dataclass(frozen=True)
class BoardEntry:
    """What the board knows of one agent: its card and its activity, as last read, and
    whether the service has problems with its files (`problems`: files refused, a stage that
    failed, an inbox it cannot write; its own card words them)."""

    agent_id: str
    card: CardState
    activity: ActivitySummary
    problems: bool = False


def board_marks(
    card: CardState, activity: ActivitySummary, problems: bool = False
) -> tuple[BoardMark, ...]:
    """What about this agent needs a person, most urgent first (empty: nothing); `problems`:
    the service has problems with the agent's files (see `BoardEntry`)."""
    marks: list[BoardMark] = []
    if card.error_code is not None:
        marks.append("error")
    if problems:
        marks.append("problems")
    if card.exhausted:
        marks.append("limit")
    if activity.state == "waiting":
        marks.append("waiting")
    return tuple(marks)


def needs_attention(card: CardState, activity: ActivitySummary, problems: bool = False) -> bool:
    """Whether the agent gets its own card beside the board (see `board_marks`): the card
    says what the line only marks (the renderer's error, which files and how to fix them)."""
    return bool(board_marks(card, activity, problems))


def card_headline(body: str | None, scrub: Callable[[str], str] = str) -> str | None:
    """The first line of a card body with text in it, as plain text: decorations dropped,
    whitespace collapsed, secrets removed, cut to `HEADLINE_MAX_CHARS` (None: no text)."""
    if body is None:
        return None
    for raw in body.splitlines():
        line = one_line(_EMPHASIS.sub("", _LINE_MARKERS.sub("", one_line(raw))))
        if line and not set(line) <= set("-=_|:~ "):  # a rule or table border says nothing
            return cut_line(scrub(redact(line)), HEADLINE_MAX_CHARS)
    return None


def movement_text(
    activity: ActivitySummary, now: datetime, zone: tzinfo, scrub: Callable[[str], str] = str
) -> str | None:
    """`last: <movement> (<time>)`, the movement scrubbed and cut (None: none reported)."""
    last = activity.last_movement
    if last is None:
        return None
    return _movement_line(_movement_words(activity, scrub), last.at, now, zone)


def _movement_words(activity: ActivitySummary, scrub: Callable[[str], str]) -> str:
    last = activity.last_movement
    words = "" if last is None else one_line(activity_movement_words(last))
    return cut_line(scrub(redact(words)), MOVEMENT_MAX_CHARS)


def _movement_line(words: str, at: datetime, now: datetime, zone: tzinfo) -> str:
    return f"last: {words} ({format_at(at, now, zone)})"


@dataclass(frozen=True)
class BoardFacts:
    """One agent's line before the time of day is written into it: everything agent-written
    already scrubbed and cut, so it may be handed to another process (a cluster's instance
    that composes the chat's board) as it is."""

    agent_id: str
    state: AgentState
    marks: tuple[BoardMark, ...]
    headline: str | None
    movement: str | None  # the words of the last movement ...
    movement_at: datetime | None  # ... and when it happened
    started: bool  # a card or activity was seen: the board may appear
    unobserved: bool = False  # clustered: no instance serves the agent now (`unobserved`)


def board_facts(entry: BoardEntry, scrub: Callable[[str], str] = str) -> BoardFacts:
    headline = card_headline(entry.card.body, scrub) if entry.card.status == "active" else None
    if headline is None and entry.card.status == "inactive":
        headline = "card stopped"
    last = entry.activity.last_movement
    return BoardFacts(
        agent_id=entry.agent_id,
        state=entry.activity.state,
        marks=board_marks(entry.card, entry.activity, entry.problems),
        headline=headline,
        movement=None if last is None else _movement_words(entry.activity, scrub),
        movement_at=None if last is None else last.at,
        started=entry.card.status != "none" or entry.activity.state != "unknown",
    )


def facts_record(facts: BoardFacts) -> dict[str, Any]:
    """`facts` as JSON-ready values (for the other instances of a cluster)."""
    at = facts.movement_at
    return {
        "agent_id": facts.agent_id,
        "state": facts.state,
        "marks": list(facts.marks),
        "headline": facts.headline,
        "movement": facts.movement,
        "movement_at": None if at is None else at.timestamp(),
        "started": facts.started,
    }


def unobserved(facts: BoardFacts) -> BoardFacts:
    """The last facts of an agent no instance serves now (its instance died): its state is
    not known any more and neither are its marks; what it last showed stays, with when it
    last moved, and the line says it is not observed."""
    return replace(facts, state="unknown", marks=(), unobserved=True)


def facts_from_record(data: Mapping[str, Any]) -> BoardFacts | None:
    """The facts `facts_record` gave; None for a record this version cannot read (marks it
    does not know are left out)."""
    try:
        agent_id, state, marks = data["agent_id"], data["state"], data["marks"]
        headline, movement, at = data["headline"], data["movement"], data["movement_at"]
        started = data["started"]
        if not isinstance(agent_id, str) or state not in get_args(AgentState):
            return None
        if not isinstance(marks, list):
            return None
        # A mark a later release added is left out, not the line: the agent stays listed.
        marks = [mark for mark in marks if isinstance(mark, str) and mark in get_args(BoardMark)]
        if not all(v is None or isinstance(v, str) for v in (headline, movement)):
            return None
        if not isinstance(started, bool):
            return None
        if at is not None and (isinstance(at, bool) or not isinstance(at, int | float)):
            return None
        when = None if at is None else datetime.fromtimestamp(at, UTC)
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        return None
    return BoardFacts(
        agent_id=agent_id,
        state=cast(AgentState, state),
        marks=tuple(cast(list[BoardMark], marks)),
        headline=headline,
        movement=movement,
        movement_at=when,
        started=started,
    )


def facts_line(
    facts: BoardFacts, now: datetime, zone: tzinfo = UTC, orchestrator: str | None = None
) -> BoardLine:
    """`orchestrator`: the chat's orchestrator, whose line says so."""
    movement = None
    if facts.movement is not None and facts.movement_at is not None:
        movement = _movement_line(facts.movement, facts.movement_at, now, zone)
    return BoardLine(
        agent_id=facts.agent_id,
        state=facts.state,
        marks=facts.marks,
        headline=facts.headline,
        movement=movement,
        unobserved=facts.unobserved,
        orchestrator=orchestrator is not None and facts.agent_id == orchestrator,
    )


def board_line(
    entry: BoardEntry, now: datetime, zone: tzinfo = UTC, scrub: Callable[[str], str] = str
) -> BoardLine:
    return facts_line(board_facts(entry, scrub), now, zone)


def line_order(line: BoardLine) -> tuple[int, int, str]:
    """Sort key: the most urgent mark first, then moving before resting, then the id."""
    urgency = min((_MARK_RANK[mark] for mark in line.marks), default=len(_MARK_RANK))
    return urgency, _STATE_RANK.get(line.state, len(_STATE_RANK)), line.agent_id


def board_summary(lines: Sequence[BoardLine]) -> str:
    """`N agents · K need people · 3 running · 2 idle`: counts over every line, shown or not."""
    parts = [counted(len(lines), "agent", "agents")]
    attention = sum(1 for line in lines if line.marks)
    if attention:
        parts.append(counted(attention, "needs people", "need people"))
    counts: dict[AgentState, int] = {}
    for line in lines:
        counts[line.state] = counts.get(line.state, 0) + 1
    for state in sorted(counts, key=lambda s: _STATE_RANK.get(s, len(_STATE_RANK))):
        parts.append(f"{counts[state]} {state}")
    return " · ".join(parts)


def compose_board(
    entries: Sequence[BoardEntry],
    *,
    hidden: bool,
    now: datetime,
    zone: tzinfo = UTC,
    scrub: Callable[[str], str] = str,
    orchestrator: str | None = None,
) -> BoardView:
    """The whole board of one chat, uncut (see `fit_board`); `orchestrator`: the chat's
    orchestrator, whose line says so."""
    return compose_facts(
        [board_facts(entry, scrub) for entry in entries],
        hidden=hidden,
        now=now,
        zone=zone,
        orchestrator=orchestrator,
    )


def compose_facts(
    facts: Sequence[BoardFacts],
    *,
    hidden: bool,
    now: datetime,
    zone: tzinfo = UTC,
    orchestrator: str | None = None,
) -> BoardView:
    """The whole board of one chat from its agents' facts, uncut (see `fit_board`)."""
    lines = sorted((facts_line(item, now, zone, orchestrator) for item in facts), key=line_order)
    return BoardView(summary=board_summary(lines), lines=tuple(lines), hidden=hidden)


def fit_board(view: BoardView, fits: Callable[[BoardView], bool]) -> BoardView:
    """The longest head of `view`'s lines for which `fits` holds, the rest counted in
    `omitted`. `fits` is the platform's measure (monotonic: fewer lines never grow the
    message); with no line fitting, the board keeps only its summary and the count."""
    if view.hidden or fits(view):
        return view
    lines = view.lines
    low, high = 0, len(lines) - 1  # `high` lines are known not to fit whole
    best = replace(view, lines=(), omitted=len(lines))
    while low <= high:
        middle = (low + high) // 2
        candidate = replace(view, lines=lines[:middle], omitted=len(lines) - middle)
        if fits(candidate):
            best, low = candidate, middle + 1
        else:
            high = middle - 1
    return best
