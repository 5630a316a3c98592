"""The activity fold: `logs/events.jsonl` lines in, the automatic slot's facts out.

Facts only: which kind of movement happened when, with the typed fields it carried (a tool's
name, a wait's reason, an exit code). How a movement reads for people, and the redaction of
the agent's text in it, is `bridge.compose.activity`'s job: one place words text for people.
The agent state comes only from these events and their timestamps, never from card refreshes
(see docs/architecture.md, "File contracts").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from taskcard.bridge.track.status import StateFacts, agent_state
from taskcard.channels.base import AgentState
from taskcard.producers.task_card.contract import (
    ActivityEvent,
    count_field,
    duration_field,
    int_field,
    parse_event,
    shows_text,
    turn_error_word,
)

MAX_RECENT: Final = 10
# An agent's free text kept per movement; rows show far less (bounds memory, not meaning).
MAX_DETAIL_CHARS: Final = 4096
_MAX_OPEN_CALLS: Final = 256


@dataclass(frozen=True)
class Movement:
    """One thing the agent visibly did, as the typed fields of its event.

    `kind` is the event kind (`tool.end`, `wait.start`, ...); `name` a tool's name (None when
    the event named none); `detail` the agent's own text (a tool summary, a wait reason, a
    `text` event); `code`, `ok`, `duration_s` an exit code, a tool's outcome and duration.
    """

    kind: str
    at: datetime
    name: str | None = None
    detail: str | None = None
    code: int | None = None
    ok: bool | None = None
    duration_s: float | None = None


@dataclass(frozen=True)
class ActivitySummary:
    """The automatic slot's facts, decided only from the activity log and its timestamps."""

    state: AgentState = "unknown"
    last_movement: Movement | None = None
    turn_started_at: datetime | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    recent: tuple[Movement, ...] = ()  # newest first
    skipped_lines: int = 0
    state_valid_until: datetime | None = None
    last_event_at: datetime | None = None
    state_since: datetime | None = None
    # Facts the signals are decided from (bridge.notices.signals).
    agent_started_at: datetime | None = None
    exited_at: datetime | None = None
    turn_ended_at: datetime | None = None
    # Why the latest turn ended without finishing (`turn.end` `error`), when it says so.
    turn_error: str | None = None


def _text(value: object) -> str | None:
    """A non-blank text field of an agent record, bounded; anything else is unset."""
    if not isinstance(value, str) or not shows_text(value):
        return None
    return value[:MAX_DETAIL_CHARS]


class ActivityTracker:
    """Folds activity events into the facts of the automatic slot.

    Transitions follow line order; silence is measured from the newest timestamp seen.
    """

    # Thousands live at once, one per agent: slots, and no container until there is something
    # to hold (an empty bounded deque costs over 600 bytes).
    __slots__ = (
        "_after_start",
        "_calls",
        "_exited_at",
        "_last_event_at",
        "_recent",
        "_started_at",
        "_tokens",
        "_turn_ended_at",
        "_turn_error",
        "_turn_started_at",
        "_turns_after_start",
        "_waiting_reason",
        "_waiting_since",
        "origins",
        "skipped_lines",
    )

    def __init__(self) -> None:
        self.skipped_lines = 0
        self._exited_at: datetime | None = None
        self._turn_started_at: datetime | None = None
        self._turn_ended_at: datetime | None = None
        self._turn_error: str | None = None
        self._waiting_since: datetime | None = None
        self._waiting_reason: str | None = None
        self._started_at: datetime | None = None
        self._after_start = False  # any event since the latest `agent.start`
        self._turns_after_start = False  # any turn fact since it (a shell has none)
        self._last_event_at: datetime | None = None
        self._recent: tuple[Movement, ...] = ()  # newest first, at most MAX_RECENT
        # Origins (`turn.start` origin / `turn.origin`) not yet taken by the service, the
        # latest MAX_RECENT.
        self.origins: list[tuple[str, datetime]] = []
        self._tokens: tuple[int, int] | None = None
        self._calls: dict[str, str | None] = {}

    def feed(self, line: bytes) -> None:
        if not line.strip():
            return
        event = parse_event(line)
        if event is None:
            self.skipped_lines += 1
            return
        self.apply(event)

    def apply(self, event: ActivityEvent) -> None:
        if self._last_event_at is None or event.ts > self._last_event_at:
            self._last_event_at = event.ts
        if event.kind != "agent.start":
            self._after_start = True
        if event.kind in ("turn.start", "turn.end"):
            self._turns_after_start = True
        movement = self._transition(event)
        if movement is not None:
            self._recent = (movement, *self._recent[: MAX_RECENT - 1])

    def _transition(self, event: ActivityEvent) -> Movement | None:
        fields = event.fields
        kind, at = event.kind, event.ts
        if kind == "agent.start":
            self._exited_at = None
            self._started_at = at
            self._after_start = self._turns_after_start = False
            self._turn_started_at = self._turn_ended_at = self._waiting_since = None
            self._turn_error = None
            self._tokens = None
            return Movement(kind, at)
        if kind == "agent.exit":
            self._exited_at = at
            self._waiting_since = None
            return Movement(kind, at, code=int_field(fields.get("code")))
        if kind in ("turn.start", "turn.origin") and isinstance(fields.get("origin"), str):
            self.origins.append((fields["origin"], event.ts))
            del self.origins[:-MAX_RECENT]
        if kind == "turn.start":
            self._turn_started_at, self._turn_ended_at = at, None
            self._turn_error = None
            self._waiting_since = None
            self._tokens = None
            return Movement(kind, at)
        if kind == "turn.end":
            self._turn_ended_at = at
            self._turn_error = turn_error_word(fields.get("error"))
            self._waiting_since = None
            return Movement(kind, at)
        if kind == "wait.start":
            self._waiting_since = at
            reason = fields.get("reason")
            self._waiting_reason = reason if isinstance(reason, str) else None
            return Movement(kind, at, detail=_text(fields.get("reason")))
        if kind == "wait.end":
            self._waiting_since = None
            return Movement(kind, at)
        if kind == "tool.start":
            if self._turn_ended_at is not None and at > self._turn_ended_at:
                # Output after the declared end: a new turn began, though no `turn.start`
                # said so (a tool is only called inside a turn). Not idle, not the old error.
                self._turn_started_at, self._turn_ended_at = at, None
                self._turn_error = None
            name = _text(fields.get("name"))
            call_id = fields.get("call_id")
            if isinstance(call_id, str):
                if len(self._calls) >= _MAX_OPEN_CALLS:
                    self._calls.pop(next(iter(self._calls)))
                self._calls[call_id] = name
            return Movement(kind, at, name=name, detail=_text(fields.get("summary")))
        if kind == "tool.end":
            call_id = fields.get("call_id")
            name = self._calls.pop(call_id, None) if isinstance(call_id, str) else None
            return Movement(
                kind,
                at,
                name=name,
                ok=fields.get("ok") is not False,
                duration_s=duration_field(fields.get("duration_s")),
            )
        if kind == "text":
            text = _text(fields.get("text"))
            return None if text is None else Movement(kind, at, detail=text)
        if kind == "usage":
            tokens_in = count_field(fields.get("input_tokens"))
            tokens_out = count_field(fields.get("output_tokens"))
            if tokens_in is None and tokens_out is None:
                # Nothing countable (negative, text, absent): a malformed line, not a claim
                # that the turn used no tokens.
                self.skipped_lines += 1
                return None
            before = self._tokens or (0, 0)
            self._tokens = (before[0] + (tokens_in or 0), before[1] + (tokens_out or 0))
            return None
        return None

    def summary(
        self, now: datetime, no_output_after_s: float, start_silence_s: float = 30.0
    ) -> ActivitySummary:
        state, since, valid_until = agent_state(
            self.facts(), now, no_output_after_s, start_silence_s
        )
        return ActivitySummary(
            state=state,
            last_movement=self._recent[0] if self._recent else None,
            turn_started_at=self._turn_started_at,
            tokens_in=self._tokens[0] if self._tokens else None,
            tokens_out=self._tokens[1] if self._tokens else None,
            recent=self._recent,
            skipped_lines=self.skipped_lines,
            state_valid_until=valid_until,
            last_event_at=self._last_event_at,
            state_since=since,
            agent_started_at=self._started_at,
            exited_at=self._exited_at,
            turn_ended_at=self._turn_ended_at,
            turn_error=self._turn_error,
        )

    def facts(self) -> StateFacts:
        return StateFacts(
            exited_at=self._exited_at,
            waiting_since=self._waiting_since,
            waiting_reason=self._waiting_reason,
            started_at=self._started_at,
            after_start=self._after_start,
            turns_after_start=self._turns_after_start,
            turn_started_at=self._turn_started_at,
            turn_ended_at=self._turn_ended_at,
            last_event_at=self._last_event_at,
        )
