"""The composer as a table: card state and activity in, channel-neutral view out."""

from __future__ import annotations

import random
from dataclasses import FrozenInstanceError, fields, replace
from datetime import UTC, datetime, timedelta

import pytest

from taskcard.bridge.compose.view import compose_view, format_at, format_tokens, route_zone
from taskcard.bridge.track.activity import ActivitySummary, Movement
from taskcard.bridge.track.monitor import CardState
from taskcard.channels.base import CardView

NOW = datetime(2026, 3, 4, 15, 30, tzinfo=UTC)


def at(hour: int, minute: int, day: int = 4) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC)


ACTIVE = CardState(status="active", body="**Build** 3/10 steps", body_changed_at=at(15, 20))
RUNNING = ActivitySummary(
    state="running",
    state_since=at(15, 0),
    turn_started_at=at(15, 0),
    last_movement=Movement("tool.start", at(15, 28), name="pytest", detail="tests/"),
    last_event_at=at(15, 28),
    recent=(
        Movement("tool.start", at(15, 28), name="pytest", detail="tests/"),
        Movement("text", at(15, 20), detail="read README"),
        Movement("turn.start", at(15, 10)),
    ),
)

CASES: list[tuple[str, CardState, ActivitySummary, int, CardView]] = [
    (
        "running with card",
        ACTIVE,
        RUNNING,
        3,
        CardView(
            agent_id="builder",
            state="running",
            auto_rows=(
                "▶ running, turn since 15:00 UTC",
                "last: pytest: tests/ (15:28 UTC)",
                "card updated 15:20 UTC",
                "· 15:20 UTC read README",
                "· 15:10 UTC turn started",
            ),
            body="**Build** 3/10 steps",
        ),
    ),
    (
        "one activity row",
        ACTIVE,
        RUNNING,
        1,
        CardView(
            agent_id="builder",
            state="running",
            auto_rows=(
                "▶ running, turn since 15:00 UTC",
                "last: pytest: tests/ (15:28 UTC)",
                "card updated 15:20 UTC",
                "· 15:20 UTC read README",
            ),
            body="**Build** 3/10 steps",
        ),
    ),
    (
        "no card, no activity",
        CardState(),
        ActivitySummary(),
        3,
        CardView(
            agent_id="builder",
            state="unknown",
            auto_rows=("❔ state unknown: no activity reported",),
            body=None,
            body_note="No task card is published.",
        ),
    ),
    (
        "tools reported, no session or turn",
        CardState(),
        ActivitySummary(
            last_movement=Movement("tool.start", at(15, 28), name="pytest"),
            last_event_at=at(15, 28),
            recent=(Movement("tool.start", at(15, 28), name="pytest"),),
        ),
        3,
        CardView(
            agent_id="builder",
            state="unknown",
            # It said "no activity reported" right above the tool it reported.
            auto_rows=(
                "❔ state unknown: no session or turn start reported",
                "last: pytest (15:28 UTC)",
            ),
            body=None,
            body_note="No task card is published.",
        ),
    ),
    (
        "stopped card after budget, idle agent with tokens",
        CardState(
            status="inactive",
            body="old body",
            body_changed_at=at(14, 0),
            status_changed_at=at(14, 5),
            exhausted=True,
        ),
        ActivitySummary(state="idle", state_since=at(14, 10), tokens_in=12_345, tokens_out=678),
        3,
        CardView(
            agent_id="builder",
            state="idle",
            auto_rows=(
                "💤 idle since 14:10 UTC",
                "tokens last turn: 12.3k in, 678 out",
                "refresh budget used up",
            ),
            body=None,
            body_note="The task card stopped at 14:05 UTC: refresh budget used up.",
        ),
    ),
    (
        "came up and said nothing",
        CardState(),
        ActivitySummary(state="no output", state_since=at(15, 0), agent_started_at=at(15, 0)),
        3,
        CardView(
            agent_id="builder",
            state="no output",
            auto_rows=("⏸ no output since it started at 15:00 UTC",),
            body=None,
            body_note="No task card is published.",
        ),
    ),
    (
        "a shell at its prompt",
        CardState(),
        ActivitySummary(state="at prompt", state_since=at(15, 0)),
        3,
        CardView(
            agent_id="builder",
            state="at prompt",
            auto_rows=("⌨ at the prompt since 15:00 UTC",),
            body=None,
            body_note="No task card is published.",
        ),
    ),
    (
        "error episode on an older day, silent turn unknown, skipped lines",
        replace(ACTIVE, error_code="renderer_timeout", error_since=at(23, 50, day=3)),
        ActivitySummary(
            state="unknown",
            state_since=at(15, 0),
            turn_started_at=at(14, 0),
            last_event_at=at(15, 0),
            skipped_lines=2,
        ),
        3,
        CardView(
            agent_id="builder",
            state="unknown",
            auto_rows=(
                "❔ state unknown: quiet since 15:00 UTC in a turn begun 14:00 UTC;"
                " work cannot be told from silence",
                # No code: the card hears only the first of an episode (F2).
                "card updated 15:20 UTC; ⚠ renderer error since 2026-03-03 23:50 UTC",
                "activity log: 2 unreadable lines skipped",
            ),
            body="**Build** 3/10 steps",
        ),
    ),
    (
        "waiting and exited",
        ACTIVE,
        ActivitySummary(state="waiting", state_since=at(15, 25), tokens_in=5, tokens_out=1),
        3,
        CardView(
            agent_id="builder",
            state="waiting",
            auto_rows=(
                "⏳ waiting for a person since 15:25 UTC",
                "tokens this turn: 5 in, 1 out",
                "card updated 15:20 UTC",
            ),
            body="**Build** 3/10 steps",
        ),
    ),
    (
        "exited",
        CardState(),
        ActivitySummary(state="exited", state_since=at(15, 1)),
        3,
        CardView(
            agent_id="builder",
            state="exited",
            auto_rows=("⏹ exited at 15:01 UTC",),
            body_note="No task card is published.",
        ),
    ),
]


@pytest.mark.parametrize(
    ("card", "activity", "rows", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_compose_view(
    card: CardState, activity: ActivitySummary, rows: int, expected: CardView
) -> None:
    view = compose_view("builder", card, activity, hidden=False, activity_rows=rows, now=NOW)
    assert view == expected


def test_body_is_redacted() -> None:
    card = replace(ACTIVE, body="deploy with token=abc123secret now")
    view = compose_view("b", card, RUNNING, hidden=False, activity_rows=3, now=NOW)
    assert view.body == "deploy with token=[redacted] now"


def test_a_hidden_view_carries_no_body_to_render() -> None:
    # The chat shows the one-line notice: the body is not composed for it at all.
    card = replace(ACTIVE, body="deploy with token=abc123secret now")
    view = compose_view("b", card, RUNNING, hidden=True, activity_rows=3, now=NOW)
    assert view == CardView(agent_id="b", state=RUNNING.state, hidden=True)


def test_view_does_not_change_with_the_clock_alone() -> None:
    first = compose_view("b", ACTIVE, RUNNING, hidden=False, activity_rows=3, now=NOW)
    later = compose_view("b", ACTIVE, RUNNING, hidden=False, activity_rows=3, now=at(15, 59))
    assert first == later


@pytest.mark.parametrize(
    ("count", "text"), [(0, "0"), (999, "999"), (1_000, "1.0k"), (2_500_000, "2.50M")]
)
def test_format_tokens(count: int, text: str) -> None:
    assert format_tokens(count) == text


def test_format_at_uses_utc() -> None:
    from datetime import timedelta, timezone

    local = datetime(2026, 3, 4, 17, 0, tzinfo=timezone(timedelta(hours=2)))
    assert format_at(local, NOW) == "15:00 UTC"


@pytest.mark.parametrize(
    ("moment", "zone", "text"),
    [
        (at(15, 0), "UTC", "15:00 UTC"),
        (at(15, 0), "Europe/Berlin", "16:00 CET"),
        (datetime(2026, 7, 4, 15, 0, tzinfo=UTC), "Europe/Berlin", "2026-07-04 17:00 CEST"),
        (at(15, 0), "Asia/Shanghai", "23:00 CST"),
        (at(15, 0), "Asia/Dubai", "19:00 +04"),
        # Another day in the route's zone: the date is shown.
        (at(15, 0, day=3), "UTC", "2026-03-03 15:00 UTC"),
        (at(23, 0, day=3), "Asia/Tokyo", "2026-03-04 08:00 JST"),
    ],
)
def test_format_at_in_the_route_zone(moment: datetime, zone: str, text: str) -> None:
    # NOW is 15:30 UTC on the 4th: in Tokyo that is the 5th, so the 4th gets its date.
    assert format_at(moment, NOW, route_zone(zone)) == text


def _format_directly(moment: datetime, now: datetime, zone: str) -> str:
    """format_at's rule worked out for one moment, with nothing remembered."""
    here, today = moment.astimezone(route_zone(zone)), now.astimezone(route_zone(zone))
    label = here.tzname() or here.strftime("%z")
    shown = f"{here:%H:%M} {label}"
    return shown if here.date() == today.date() else f"{here:%Y-%m-%d} {shown}"


def test_format_at_is_never_stale_across_seconds_minutes_days_and_zones() -> None:
    # format_at remembers each whole minute it worked out: a moment a second later (a new
    # minute), the same moment seen on another day, or in another zone must still be told
    # as it is. Compared with the format worked out directly, moment by moment.
    start = datetime(2026, 3, 4, 23, 58, 58, 900_000, tzinfo=UTC)
    for step in range(0, 200):
        moment = start + timedelta(milliseconds=250 * step)  # across 23:59 and midnight
        for now in (moment, moment + timedelta(hours=1), moment - timedelta(days=1)):
            for zone in ("UTC", "Asia/Tokyo", "America/Los_Angeles"):
                assert format_at(moment, now, route_zone(zone)) == _format_directly(
                    moment, now, zone
                )
    assert format_at(start, start) == "23:58 UTC"
    assert format_at(start + timedelta(seconds=2), start) == "23:59 UTC"
    assert format_at(start + timedelta(seconds=62), start) == "2026-03-05 00:00 UTC"


@pytest.mark.parametrize(
    ("zone", "around"),
    [
        ("UTC", datetime(2026, 3, 4, 23, 55, tzinfo=UTC)),  # midnight
        ("Asia/Kolkata", datetime(2026, 3, 4, 18, 25, tzinfo=UTC)),  # +05:30, its midnight
        ("Asia/Kathmandu", datetime(2026, 3, 4, 18, 10, tzinfo=UTC)),  # +05:45, its midnight
        ("Europe/Berlin", datetime(2026, 3, 29, 0, 55, tzinfo=UTC)),  # CET to CEST
        ("America/New_York", datetime(2026, 11, 1, 5, 55, tzinfo=UTC)),  # EDT to EST
        # offsets with seconds (local mean times): a whole minute of UTC is no whole local
        # minute there, so those minutes are not remembered
        ("Europe/Amsterdam", datetime(1935, 6, 1, 22, 35, tzinfo=UTC)),  # +01:19:32
        ("Africa/Monrovia", datetime(1970, 6, 1, 0, 40, tzinfo=UTC)),  # -00:44:30
    ],
)
def test_format_at_at_minute_boundaries(zone: str, around: datetime) -> None:
    # The last and first instants of each minute for ten minutes, and seconds in between,
    # each seen from its own minute, the minute after and the day before and after.
    for minute in range(10):
        for offset in (-0.001, 0, 0.001, 27.999, 28, 28.5, 29, 59.999):
            moment = around + timedelta(minutes=minute, seconds=offset)
            for now in (moment, moment + timedelta(minutes=1), moment + timedelta(days=1)):
                assert format_at(moment, now, route_zone(zone)) == _format_directly(
                    moment, now, zone
                ), (moment, now, zone)


def test_format_at_with_more_minutes_than_it_keeps() -> None:
    # 10,000 agents each showing their own past minutes (turn start, activity, card
    # updated): far more minutes than format_at keeps, visited in a shuffled order twice,
    # every one still told as it is.
    now = datetime(2026, 3, 4, 12, 0, 30, tzinfo=UTC)
    moments = [now - timedelta(minutes=minute, seconds=minute % 60) for minute in range(10_000)]
    order = list(range(len(moments))) * 2
    random.Random(13).shuffle(order)
    for zone in ("UTC", "Europe/Berlin"):
        for index in order[:12_000]:
            moment = moments[index]
            assert format_at(moment, now, route_zone(zone)) == _format_directly(moment, now, zone)


def test_every_time_on_a_card_uses_the_route_zone_and_one_format() -> None:
    view = compose_view(
        "b",
        ACTIVE,
        RUNNING,
        hidden=False,
        activity_rows=3,
        now=NOW,
        zone=route_zone("America/New_York"),
    )
    assert view.auto_rows == (
        "▶ running, turn since 10:00 EST",
        "last: pytest: tests/ (10:28 EST)",
        "card updated 10:20 EST",
        "· 10:20 EST read README",
        "· 10:10 EST turn started",
    )


def test_error_codes_never_reach_the_card() -> None:
    from taskcard.bridge.notices.text import safe_error_code

    assert safe_error_code(None) == "unknown"
    # The card names no code (only an episode's first reaches it); the notice names that one.
    for code in ("renderer_timeout", "/home/a/.ssh key"):
        card = replace(ACTIVE, error_code=code, error_since=at(15, 25))
        view = compose_view("builder", card, RUNNING, hidden=False, activity_rows=3, now=NOW)
        health = " ".join(view.auto_rows)
        assert "⚠ renderer error since 15:25 UTC" in health
        assert code not in health and ".ssh" not in health


def test_a_card_state_with_a_new_body_keeps_every_other_field() -> None:
    # `with_body` copies the fields instead of `dataclasses.replace` (every card change makes
    # one), past `__init__`: each field set to a value of its own, so a field not carried
    # makes the two differ, and an `__init__` that came to do more than set the fields (a
    # `__post_init__`) would be skipped there.
    values = {field.name: f"value of {field.name}" for field in fields(CardState)}
    state = CardState(**values)  # type: ignore[arg-type]
    at = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)
    moved = state.with_body("new body", at)
    assert moved == replace(state, body="new body", body_changed_at=at)
    assert vars(moved) == vars(replace(state, body="new body", body_changed_at=at))
    assert state.body == "value of body"  # the original is untouched
    assert not hasattr(CardState, "__post_init__")
    with pytest.raises(FrozenInstanceError):
        moved.body = "changed"  # type: ignore[misc]
