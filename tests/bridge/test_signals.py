"""Which signal is due (bridge.notices.signals.due_signals), one row per rule."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from taskcard.bridge.notices.signals import SignalFacts, due_signals, report_signal
from taskcard.producers.reports.contract import Report

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def report(seconds: float, **fields: object) -> Report:
    base = Report(
        seq=1, at=at(seconds), ok=True, verdict=None, role=None, channel="cli", summary=None
    )
    return replace(base, **fields)  # type: ignore[arg-type]


BASE = SignalFacts(
    agent_id="builder",
    state="running",
    card_live=True,
    card_since=at(0),
    started_at=at(0),
    exited_at=None,
    turn_started_at=at(1),
    turn_ended_at=None,
    last_event_at=at(10),
    latest_report=None,
)

CASES: list[tuple[str, SignalFacts, float, list[str], str]] = [
    ("busy and recent: nothing", BASE, 100, [], ""),
    (
        "exited owing a report",
        replace(BASE, exited_at=at(50), state="exited"),
        60,
        ["exited"],
        "without a report",
    ),
    (
        "exited after reporting",
        replace(BASE, exited_at=at(50), state="exited", latest_report=report(40)),
        60,
        [],
        "",
    ),
    (
        "a report from before the start does not count",
        replace(BASE, exited_at=at(50), state="exited", latest_report=report(-5)),
        60,
        ["exited"],
        "",
    ),
    (
        "silent start",
        replace(BASE, state="no output", turn_started_at=None, last_event_at=at(0)),
        31,
        ["no output"],
        "nothing was stopped",
    ),
    ("quiet below the floor", BASE, 10 + 179, [], ""),
    (
        "inferred silence",
        replace(BASE, state="unknown"),
        10 + 180,
        ["idle"],
        "Please check on it",
    ),
    (
        "turn declared finished",
        replace(BASE, state="idle", turn_ended_at=at(10)),
        10 + 600,
        ["idle"],
        "declared its turn finished 10 minutes ago",
    ),
    (
        "turn ended in an API error",
        replace(BASE, state="idle", turn_ended_at=at(10), turn_error="rate_limit"),
        10 + 600,
        ["idle"],
        "builder's turn ended in an error (rate_limit) 10 minutes ago, and it has not reported",
    ),
    (
        "turn interrupted",
        replace(BASE, state="idle", turn_ended_at=at(10), turn_error="interrupted"),
        10 + 600,
        ["idle"],
        "builder's turn was interrupted 10 minutes ago",
    ),
    (
        "no host reads it",
        replace(
            BASE,
            state="unknown",
            started_at=None,
            turn_started_at=None,
            last_event_at=None,
        ),
        180,
        ["idle"],
        "could not report",
    ),
    (
        "reported in this turn",
        replace(BASE, state="idle", turn_ended_at=at(10), latest_report=report(5)),
        10 + 600,
        [],
        "",
    ),
    (
        "no live card",
        replace(BASE, state="idle", card_live=False, turn_ended_at=at(10)),
        999,
        [],
        "",
    ),
    ("waiting for consent", replace(BASE, state="waiting"), 999, [], ""),
    # A shell at its prompt has no turn: never idle, so never "idle without a report".
    (
        "a shell at its prompt",
        replace(BASE, state="at prompt", turn_started_at=None, last_event_at=at(0)),
        999,
        [],
        "",
    ),
]


@pytest.mark.parametrize(
    ("quiet_s", "words"),
    [(5, "5 seconds"), (1, "1 second"), (59, "59 seconds"), (60, "1 minute"), (150, "2 minutes")],
)
def test_a_low_idle_floor_says_seconds_not_a_minute(quiet_s: float, words: str) -> None:
    """`signals.idle_floor_s` may be 5: five quiet seconds were worded "1 minute"."""
    facts = replace(BASE, state="idle", turn_ended_at=at(10))
    due, _ = due_signals(facts, at(10 + quiet_s), idle_floor_s=1)
    assert f"declared its turn finished {words} ago" in due[0].text


@pytest.mark.parametrize(
    ("name", "facts", "now_s", "kinds", "words"), CASES, ids=[c[0] for c in CASES]
)
def test_due_signals(
    name: str, facts: SignalFacts, now_s: float, kinds: list[str], words: str
) -> None:
    due, _ = due_signals(facts, at(now_s), idle_floor_s=180)
    assert [signal.kind for signal in due] == kinds
    if words:
        assert words in due[0].text


def test_idle_sentences_never_accuse_without_a_fact() -> None:
    silence, _ = due_signals(replace(BASE, state="unknown"), at(400), 180)
    no_host, _ = due_signals(
        replace(BASE, started_at=None, turn_started_at=None, last_event_at=None), at(400), 180
    )
    for signal in (*silence, *no_host):
        assert "finished" not in signal.text and "abandon" not in signal.text


def test_an_episode_has_one_id_and_the_floor_says_when() -> None:
    first, next_due = due_signals(BASE, at(100), 180)
    assert first == [] and next_due == at(190)
    a, _ = due_signals(replace(BASE, state="unknown"), at(200), 180)
    b, _ = due_signals(replace(BASE, state="unknown"), at(900), 180)
    assert a[0].episode == b[0].episode  # the same silence: announced once
    c, _ = due_signals(replace(BASE, state="unknown", last_event_at=at(500)), at(900), 180)
    assert c[0].episode != a[0].episode  # it moved, then went quiet again: a new episode


def test_report_notice_has_typed_fields_and_a_redacted_cut_summary() -> None:
    signal = report_signal(
        "builder",
        report(
            0,
            seq=7,
            ok=False,
            verdict="rejected",
            role="reviewer",
            summary="token=supersecret123456 " + "x" * 1000,
        ),
    )
    assert signal.episode == f"signal:report:7:{int(at(0).timestamp() * 1000)}"
    assert signal.text.startswith(
        "📋 builder reported (#7): failed, verdict rejected, as reviewer."
    )
    assert "supersecret123456" not in signal.text
    assert len(signal.text) < 400


@pytest.mark.parametrize(("life_s", "launch"), [(0, True), (3, True), (29, True), (30, False)])
def test_an_exit_soon_after_the_start_is_told_as_a_failed_launch(
    life_s: float, launch: bool
) -> None:
    """An agent that died seconds after it started owing a report was told as one that left
    its work unreported; it more likely never launched, and the notice says so, with how long
    it lived. From 30 s on, the plain sentence."""
    facts = replace(BASE, exited_at=at(life_s), state="exited")
    [signal], _ = due_signals(facts, at(60), idle_floor_s=180)
    assert signal.text.startswith("⏹ builder exited without a report")
    if launch:
        assert f"{life_s} s after it started" in signal.text
        assert "may have failed to launch" in signal.text
    else:
        assert signal.text == "⏹ builder exited without a report."
