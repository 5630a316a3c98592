"""People notices for ledger notifications: typed fields only, unknown values left out."""

from __future__ import annotations

from typing import Any

import pytest

from taskcard.bridge.notices.text import notice_text
from taskcard.producers.task_card.contract import Notification


def note(source: str, **extra: Any) -> Notification:
    return Notification(
        id="k",
        source=source,
        ref_id="t",
        priority="high",
        header="h /secret",
        body="b sk-1",
        extra=extra,
        at=None,
    )


@pytest.mark.parametrize(
    ("notification", "expected"),
    [
        (
            note("ledger.blocked", task_id="t1", kind="MISSING_ACCESS", step="train"),
            "⛔ bot: task t1 is blocked at step train (MISSING_ACCESS);"
            " it needs a person to decide.",
        ),
        (
            note("ledger.blocked", task_id="../etc", kind="rm -rf", step="a b"),
            "⛔ bot: a task is blocked (unknown); it needs a person to decide.",
        ),
        (
            note("ledger.completed", task_id="t1", outcome="SUCCESS"),
            "🏁 bot: task t1 completed (outcome SUCCESS); its card is retired.",
        ),
        (
            note("ledger.completed", task_id="t1", outcome="<b>"),
            "🏁 bot: task t1 completed (outcome unknown); its card is retired.",
        ),
        (note("ledger.nudge", task_id="t1"), None),
        (note("ledger.reconcile", task_id="t1"), None),
    ],
)
def test_ledger_notice_text(notification: Notification, expected: str | None) -> None:
    assert notice_text("bot", notification) == expected
