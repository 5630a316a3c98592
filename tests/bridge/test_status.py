"""The agent state table (bridge.track.status.agent_state), one row per rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from taskcard.bridge.track.status import StateFacts, agent_state

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


CASES = [
    ("nothing at all", StateFacts(), at(0), "unknown"),
    ("exited wins", StateFacts(exited_at=at(5), waiting_since=at(1)), at(6), "exited"),
    (
        "consent prompt",
        StateFacts(waiting_since=at(1), waiting_reason="permission", turn_started_at=at(0)),
        at(999),
        "waiting",
    ),
    (
        "waiting for input is idle",
        StateFacts(waiting_since=at(1), waiting_reason="input", turn_started_at=at(0)),
        at(2),
        "idle",
    ),
    ("fresh start in its grace", StateFacts(started_at=at(0)), at(29), "unknown"),
    ("start and silence", StateFacts(started_at=at(0)), at(30), "no output"),
    (
        "open turn that moves",
        StateFacts(
            started_at=at(0),
            after_start=True,
            turns_after_start=True,
            turn_started_at=at(1),
            last_event_at=at(50),
        ),
        at(100),
        "running",
    ),
    (
        "open turn silent too long",
        StateFacts(turn_started_at=at(1), last_event_at=at(2), after_start=True),
        at(2 + 300),
        "unknown",
    ),
    (
        "turn declared finished",
        StateFacts(turn_started_at=at(1), turn_ended_at=at(9), last_event_at=at(9)),
        at(5000),
        "idle",
    ),
    (
        "a shell: spoke, no turn",
        StateFacts(started_at=at(0), after_start=True, last_event_at=at(3)),
        at(5000),
        "at prompt",
    ),
    (
        "events without start or turns",
        StateFacts(after_start=True, last_event_at=at(3)),
        at(5000),
        "unknown",
    ),
]


@pytest.mark.parametrize(("name", "facts", "now", "state"), CASES, ids=[c[0] for c in CASES])
def test_state_table(name: str, facts: StateFacts, now: datetime, state: str) -> None:
    assert agent_state(facts, now, no_output_after_s=300, start_silence_s=30)[0] == state


def test_running_holds_until_the_silence_floor() -> None:
    facts = StateFacts(turn_started_at=at(0), last_event_at=at(10), after_start=True)
    state, since, until = agent_state(facts, at(20), 300, 30)
    assert (state, since, until) == ("running", at(0), at(310))
