"""Notices for people are built from typed fields only and never leak header or body."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from taskcard.bridge.notices.text import FoldedNotices, NoticeGate, notice_text, summary_text
from taskcard.producers.task_card.contract import Notification, parse_notification

LEAKY_HEADER = "renderer said: /home/alice/secret/path token=abc"
LEAKY_BODY = "Traceback ... sk-abcdefghijklmnopqrstuvwx"


def note(source: str, ref_id: str = "tc_3", **extra: Any) -> Notification:
    return Notification(
        id=f"{source}:{ref_id}:1",
        source=source,
        ref_id=ref_id,
        priority="high",
        header=LEAKY_HEADER,
        body=LEAKY_BODY,
        extra=extra,
        at=datetime(2026, 1, 1, tzinfo=UTC),
    )


CASES: list[tuple[Notification, str | None]] = [
    (
        note("task_card.error", state="error", code="renderer_timeout"),
        "⚠️ builder: task card error (watch tc_3): the renderer took longer than its time"
        " limit [renderer_timeout]. The last good card stays shown.",
    ),
    (
        note("task_card.error", state="error", code="renderer_nonzero_exit"),
        "⚠️ builder: task card error (watch tc_3): the renderer exited with an error"
        " [renderer_nonzero_exit]. The last good card stays shown.",
    ),
    (
        note("task_card.error", state="error", code="something_new"),
        "⚠️ builder: task card error (watch tc_3): the card could not be refreshed."
        " The last good card stays shown.",
    ),
    (
        note("task_card.error", state="recovered"),
        "✅ builder: task card recovered (watch tc_3): its renderer works again.",
    ),
    (
        note("task_card.error", state="recovered", replaced_by="tc_4"),
        "✅ builder: task card publishes again: watch tc_4 replaced watch tc_3, which had failed.",
    ),
    (
        note("task_card.error", state="recovered", replaced_by="tc 4 <b>"),
        "✅ builder: task card recovered (watch tc_3): its renderer works again.",
    ),
    (
        note("task_card.limit", state="limit", max_refreshes=1000),
        "⏹ builder: task card stopped (watch tc_3): refresh budget used up after 1000 refreshes.",
    ),
    (
        note("task_card.limit", ref_id="", state="limit"),
        "⏹ builder: task card stopped: refresh budget used up.",
    ),
    *[
        (
            note("task_card.limit", state="limit", max_refreshes=odd),
            "⏹ builder: task card stopped (watch tc_3): refresh budget used up.",
        )
        for odd in (10**4096, -5, 0, 10**7, True, 2.5, float("inf"), float("nan"), "50", [3])
    ],
    (
        note("task_card.limit", ref_id="", state="limit", watch_id=10**4200, max_refreshes=1.0),
        "⏹ builder: task card stopped: refresh budget used up after 1 refresh.",
    ),
    (note("task_card.reminder", state="reminder"), None),
    (note("something.else", state="error", code="renderer_timeout"), None),
    (note("task_card.error", state="weird"), None),
]


@pytest.mark.parametrize(("notification", "expected"), CASES)
def test_notice_text(notification: Notification, expected: str | None) -> None:
    assert notice_text("builder", notification) == expected


@pytest.mark.parametrize(
    "code", ["body_too_large", "write_failed", "watch_crash", "renderer_failed"]
)
def test_every_stable_code_has_a_plain_description(code: str) -> None:
    text = notice_text("a", note("task_card.error", state="error", code=code))
    assert text is not None
    assert f"[{code}]" in text
    assert "could not be refreshed" not in text


def test_header_body_and_odd_ids_never_leak() -> None:
    hostile = note(
        "task_card.error", ref_id="/etc/passwd token=abc", state="error", code="<b>x</b>"
    )
    text = notice_text("builder", hostile)
    assert text is not None
    for fragment in ("/home", "token", "sk-", "passwd", "<b>", "Traceback"):
        assert fragment not in text


def test_from_a_wire_line() -> None:
    line = (
        b'{"id":"task_card.limit:tc_9:50","source":"task_card.limit","channel":"system",'
        b'"ref_id":"tc_9","priority":"normal","header":"h","body":"b",'
        b'"extra":{"state":"limit","max_refreshes":50,"watch_id":"tc_9"},'
        b'"at":"2026-01-01T00:00:00Z"}'
    )
    parsed = parse_notification(line)
    assert parsed is not None
    assert notice_text("ops", parsed) == (
        "⏹ ops: task card stopped (watch tc_9): refresh budget used up after 50 refreshes."
    )


def run_gate(gate: NoticeGate, arrivals: list[tuple[float, str]]) -> list[str]:
    """Feed notices (time, kind) through the gate as the service does; what the chat gets."""
    shown: list[str] = []
    for now_s, kind in arrivals:
        for _route, folded in gate.due(now_s):
            shown.append(summary_text("builder", folded.counts))
        if gate.allows("r", now_s):
            gate.record("r", now_s)
            shown.append(kind)
        else:
            gate.fold("r", kind, now_s)
    return shown


def test_a_burst_shows_the_cap_then_one_summary() -> None:
    gate = NoticeGate(max_per_minute=3, settle_s=5.0)
    burst = [(0.01 * n, "error") for n in range(9)] + [(0.2, "recovery")] * 3
    shown = run_gate(gate, [*burst, (10.0, "probe-due")])
    assert shown[:3] == ["error"] * 3
    assert shown[3] == (
        "📦 9 more from builder: 6 errors, 3 recoveries"
        " (folded into one message to keep this chat readable)."
    )


@pytest.mark.parametrize(
    ("max_per_minute", "period_s", "minutes"),
    [(1, 1.0, 3), (5, 0.5, 4), (10, 2.0, 5), (3, 30.0, 6)],
)
def test_any_minute_shows_at_most_cap_plus_one_summary(
    max_per_minute: int, period_s: float, minutes: int
) -> None:
    """A steady stream of notices: in every sliding minute, cap notices and one summary."""
    gate = NoticeGate(max_per_minute, settle_s=5.0)
    times: list[float] = []
    counted = 0
    now_s = 0.0
    while now_s < minutes * 60:
        for _route, folded in gate.due(now_s):
            times.append(now_s)
            counted += sum(folded.counts.values())
        if gate.allows("r", now_s):
            gate.record("r", now_s)
            times.append(now_s)
            counted += 1
        else:
            gate.fold("r", "error", now_s)
        now_s += period_s
    for start in times:
        assert sum(1 for t in times if start <= t < start + 60) <= max_per_minute + 1
    # Nothing is lost: what was shown or summarised, plus what is still folded, is everything.
    still_folded = sum(f.counts.get("error", 0) for _r, f in gate.due(now_s + 3600))
    assert counted + still_folded == int(minutes * 60 / period_s + 0.5)


def test_no_summary_while_nothing_was_folded() -> None:
    gate = NoticeGate(max_per_minute=2)
    assert run_gate(gate, [(0.0, "error"), (30.0, "error"), (61.0, "error")]) == ["error"] * 3
    assert gate.due(500.0) == []


def test_a_restored_episode_is_summarised_with_a_stable_id() -> None:
    saved = FoldedNotices({"error": 4, "stop": 1}, first_s=100.0, last_s=101.0)
    loaded = FoldedNotices.from_json(saved.to_json())
    assert loaded == saved
    gate = NoticeGate(max_per_minute=2)
    gate.restore("r", loaded)
    assert not gate.allows("r", 102.0)  # the owed summary comes first
    ((route, due),) = gate.due(200.0)
    assert (route, due.summary_id) == ("r", saved.summary_id)
    assert summary_text("b", due.counts).startswith("📦 5 more from b: 4 errors, 1 stop ")


@pytest.mark.parametrize(
    "saved", [None, "", "{", "[]", '{"counts": {}}', '{"counts": {"error": true}}', '{"counts": 3}']
)
def test_unusable_saved_episodes_are_ignored(saved: str | None) -> None:
    assert FoldedNotices.from_json(saved) is None


def test_a_forgotten_route_owes_no_summary_and_starts_a_fresh_window() -> None:
    """A route whose agent left for good is forgotten: its open fold episode owes nothing,
    and the gate keeps no window for it."""
    gate = NoticeGate(max_per_minute=1, settle_s=5.0)
    gate.record("r", 0.0)
    assert not gate.allows("r", 1.0)
    gate.fold("r", "error", 1.0)
    gate.forget("r")
    assert gate.due(120.0) == []
    assert gate.allows("r", 2.0), "a route seen again starts afresh"
    gate.forget("never-seen")
