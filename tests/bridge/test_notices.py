"""Notices for people are built from typed fields only and never leak header or body."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from bridge.notices.text import notice_text
from producers.task_card.contract import Notification, parse_notification

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
        "✅ builder: task card recovered (watch tc_3); it is refreshing again.",
    ),
    (
        note("task_card.limit", state="limit", max_refreshes=1000),
        "⏹ builder: task card stopped (watch tc_3): refresh budget used up after 1000 refreshes.",
    ),
    (
        note("task_card.limit", ref_id="", state="limit"),
        "⏹ builder: task card stopped: refresh budget used up.",
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
