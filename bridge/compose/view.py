"""The composer: one agent's card state and activity to the channel-neutral `CardView`.

Pure: the same inputs give the same view, so whether a resident message needs an edit is
decided by comparing views, and the rules are table-tested. Times are absolute ("since 14:02
UTC") rather than relative ("3 min ago"): a relative time would change every minute and force
an edit that carries no news. Every time on a card goes through `format_at`, in the route's
time zone, so one card never mixes two formats or two zones.

Automatic rows, most important first (a channel drops rows from the end to fit):
state line, last movement, token usage, card health, then recent activity.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, tzinfo
from zoneinfo import ZoneInfo

from taskcard.bridge.compose.activity import movement_text
from taskcard.bridge.compose.redact import redact
from taskcard.bridge.track.activity import ActivitySummary
from taskcard.bridge.track.monitor import CardState
from taskcard.channels.base import CardView
from taskcard.producers.reports.contract import Lineage
from taskcard.producers.task_card.contract import cut_line, one_line, shown_body


def route_zone(name: str) -> tzinfo:
    """The route's configured IANA zone (validated with the configuration)."""
    return UTC if name == "UTC" else ZoneInfo(name)


def format_at(moment: datetime, now: datetime, zone: tzinfo = UTC) -> str:
    """The one format of a time on a card: `HH:MM ZONE` on the day of `now` in that zone,
    `YYYY-MM-DD HH:MM ZONE` otherwise. ZONE is the zone's abbreviation at that moment
    (`UTC`, `CET`, `CEST`) or its offset where it has none (`+08`).

    What it shows changes at most once a minute: each whole minute is worked out once
    (`_minute_at`, the last 2,048 minutes and zones kept, a day and a half of one zone),
    not converted and formatted again for every time on every card (`strftime` was half of
    the composer's time). A minute in which the zone's offset is not a whole number of
    minutes, or changes, is formatted directly (`_direct_at`)."""
    shown = _minute_at(math.floor(moment.timestamp()) // 60, zone)
    if shown is None:
        return _direct_at(moment, now, zone)
    day, short, full = shown
    today = _minute_at(math.floor(now.timestamp()) // 60, zone)
    if today is None:
        return _direct_at(moment, now, zone)
    return short if today[0] == day else full


def _direct_at(moment: datetime, now: datetime, zone: tzinfo) -> str:
    """`format_at` worked out without the cache."""
    moment, today = moment.astimezone(zone), now.astimezone(zone)
    label = moment.tzname() or moment.strftime("%z")
    if moment.date() == today.date():
        return f"{moment:%H:%M} {label}"
    return f"{moment:%Y-%m-%d %H:%M} {label}"


@functools.lru_cache(maxsize=2048)
def _minute_at(minute: int, zone: tzinfo) -> tuple[date, str, str] | None:
    """The day, `HH:MM ZONE` and `YYYY-MM-DD HH:MM ZONE` of the whole minute that begins
    `minute` * 60 seconds after the epoch, in `zone`; None unless every second of it shows
    alike there (the zone's offset a whole number of minutes, the same at its first and
    last second, and so the same label: true of every zone today, not of some zones' old
    local mean times)."""
    first = datetime.fromtimestamp(minute * 60, zone)
    last = datetime.fromtimestamp(minute * 60 + 59, zone)
    offset, label = first.utcoffset(), first.tzname()
    if (
        offset is None
        or offset.total_seconds() % 60
        or last.utcoffset() != offset
        or last.tzname() != label
    ):
        return None
    day, short = first.date(), f"{first:%H:%M} {label or first.strftime('%z')}"
    return day, short, f"{day.isoformat()} {short}"


def format_tokens(count: int) -> str:
    if count < 1_000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1_000:.1f}k"
    return f"{count / 1_000_000:.2f}M"


def state_row(activity: ActivitySummary, now: datetime, zone: tzinfo = UTC) -> str:
    state, since = activity.state, activity.state_since
    turn = activity.turn_started_at
    if state == "running":
        return f"▶ running, turn since {format_at(turn, now, zone)}" if turn else "▶ running"
    if state == "no output":
        started = activity.agent_started_at
        row = "⏸ no output"
        return row + (f" since it started at {format_at(started, now, zone)}" if started else "")
    if state == "at prompt":
        return f"⌨ at the prompt since {format_at(since, now, zone)}" if since else "⌨ at prompt"
    if state == "waiting":
        return (
            f"⏳ waiting for a person since {format_at(since, now, zone)}"
            if since
            else "⏳ waiting"
        )
    if state == "idle":
        return f"💤 idle since {format_at(since, now, zone)}" if since else "💤 idle"
    if state == "exited":
        return f"⏹ exited at {format_at(since, now, zone)}" if since else "⏹ exited"
    if since is not None and turn is not None:
        return (
            f"❔ state unknown: quiet since {format_at(since, now, zone)} in a turn begun"
            f" {format_at(turn, now, zone)}; work cannot be told from silence"
        )
    if since is not None:
        return f"❔ state unknown: started {format_at(since, now, zone)}, nothing said yet"
    if activity.last_event_at is not None:
        # Tool calls or texts without an agent.start or turn.start (a script writing only
        # those): the log has activity, it tells no state.
        return "❔ state unknown: no session or turn start reported"
    return "❔ state unknown: no activity reported"


LINEAGE_REASON_CHARS = 120


def lineage_row(lineage: Lineage | None, redactor: Callable[[str], str] = redact) -> str | None:
    """Who created this agent and why (`lineage.json`), the reason redacted and cut.

    Redacted whole before the cut, with `redactor` (the service's, which knows its own
    secrets): the row is scrubbed again later, but a secret cut in two is no longer found."""
    if lineage is None:
        return None
    reason = cut_line(redactor(one_line(lineage.reason)), LINEAGE_REASON_CHARS)
    parent = cut_line(redactor(one_line(lineage.parent)), 64)
    return f"↳ spawned by {parent}: {reason}"


def movement_row(activity: ActivitySummary, now: datetime, zone: tzinfo = UTC) -> str | None:
    movement = activity.last_movement
    if movement is None:
        return None
    return f"last: {movement_text(movement)} ({format_at(movement.at, now, zone)})"


def tokens_row(activity: ActivitySummary) -> str | None:
    if activity.tokens_in is None and activity.tokens_out is None:
        return None
    scope = "this turn" if activity.state in ("running", "unknown", "waiting") else "last turn"
    return (
        f"tokens {scope}: {format_tokens(activity.tokens_in or 0)} in,"
        f" {format_tokens(activity.tokens_out or 0)} out"
    )


def health_row(card: CardState, now: datetime, zone: tzinfo = UTC) -> str | None:
    parts: list[str] = []
    if card.status == "active" and card.body_changed_at is not None:
        parts.append(f"card updated {format_at(card.body_changed_at, now, zone)}")
    if card.error_code is not None:
        # No code: the card hears only an episode's first error (one notice per episode), and
        # the renderer may fail otherwise since; the error notice names that first code.
        since = f" since {format_at(card.error_since, now, zone)}" if card.error_since else ""
        parts.append(f"⚠ renderer error{since}")
    if card.exhausted:
        parts.append("refresh budget used up")
    return "; ".join(parts) if parts else None


def body_slot(card: CardState, now: datetime, zone: tzinfo = UTC) -> tuple[str | None, str | None]:
    """The programmable slot: (redacted body, note about the card)."""
    if card.status == "active" and card.body is not None:
        return redact(shown_body(card.body)), None
    if card.status == "inactive":
        when = (
            f" at {format_at(card.status_changed_at, now, zone)}" if card.status_changed_at else ""
        )
        reason = ": refresh budget used up" if card.exhausted else ""
        return None, f"The task card stopped{when}{reason}."
    return None, "No task card is published."


def compose_view(
    agent_id: str,
    card: CardState,
    activity: ActivitySummary,
    *,
    hidden: bool,
    activity_rows: int,
    now: datetime,
    zone: tzinfo = UTC,
    ledger_line: str | None = None,
    lineage: Lineage | None = None,
    redactor: Callable[[str], str] = redact,
    problems: Sequence[str] = (),
) -> CardView:
    """The view of one agent for one route, its times in the route's `zone` (`ledger_line`:
    the workdir ledger's state row; `redactor` for the lineage's free texts; `problems`: what
    is wrong with the agent's files as the service words it, each naming the file and the
    fix, shown right under the state so a card cut short still says it).

    A `hidden` view carries the agent and its state alone: its chat shows the one-line
    hidden notice, so the body is neither redacted nor passed on to be rendered."""
    if hidden:
        return CardView(agent_id=agent_id, state=activity.state, hidden=True)
    rows = [state_row(activity, now, zone)]
    if problems:  # most often none, nor recent rows below: no generator made for nothing
        rows.extend(f"⚠ {problem}" for problem in problems)
    for row in (
        lineage_row(lineage, redactor),
        movement_row(activity, now, zone),
        ledger_line,
        tokens_row(activity),
        health_row(card, now, zone),
    ):
        if row is not None:
            rows.append(row)
    # The newest movement is already the "last:" row.
    recent = activity.recent[1 : 1 + max(0, activity_rows)]
    if recent:
        rows.extend(f"· {format_at(m.at, now, zone)} {movement_text(m)}" for m in recent)
    if activity.skipped_lines:
        rows.append(f"activity log: {activity.skipped_lines} unreadable lines skipped")
    body, note = body_slot(card, now, zone)
    return CardView(
        agent_id=agent_id,
        state=activity.state,
        auto_rows=tuple(rows),
        body=body,
        body_note=note,
        hidden=hidden,
        kept_rows=1 + len(problems),  # a long card still says what is wrong with its files
    )
