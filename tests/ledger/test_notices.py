"""People notices for ledger notifications: typed fields only, unknown values left out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from taskcard.bridge.notices.text import notice_text
from taskcard.producers.task_card.contract import Notification, parse_notification


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
            " it needs a person to decide.\n"
            "Reply to this message to answer: your reply reaches the agent.",
        ),
        (
            note("ledger.blocked", task_id="../etc", kind="rm -rf", step="a b"),
            "⛔ bot: a task is blocked (unknown); it needs a person to decide.\n"
            "Reply to this message to answer: your reply reaches the agent.",
        ),
        (
            note("ledger.completed", task_id="t1", outcome="SUCCESS", card_retired=True),
            "🏁 bot: task t1 completed (outcome SUCCESS); its card is retired.",
        ),
        (
            note("ledger.completed", task_id="t1", outcome="<b>", card_retired="yes"),
            "🏁 bot: task t1 completed (outcome unknown).",
        ),
        (
            note("ledger.completed", task_id="t1", outcome="SUCCESS"),
            "🏁 bot: task t1 completed (outcome SUCCESS).",
        ),
        (note("ledger.nudge", task_id="t1"), None),
        (note("ledger.reconcile", task_id="t1"), None),
    ],
)
def test_ledger_notice_text(notification: Notification, expected: str | None) -> None:
    assert notice_text("bot", notification) == expected


def test_a_completion_says_the_card_is_retired_only_when_it_had_one_and_no_task_is_open(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "agent"
    workdir.mkdir()

    def run(*args: str) -> None:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "taskcard.bridge.cli",
                "ledger",
                *args,
                "--workdir",
                str(workdir),
            ],
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr

    def completion_notices() -> list[str | None]:
        lines = (workdir / ".notification" / "system.jsonl").read_bytes().splitlines()
        found = [parse_notification(line) for line in lines]
        return [
            notice_text("bot", n) for n in found if n is not None and n.source == "ledger.completed"
        ]

    run("init", "train", "--purpose", "Train", "--no-renderer")
    run("init", "ship", "--purpose", "Ship", "--no-renderer")
    run("checkpoint", "train", "--event-type", "STARTED")
    run("checkpoint", "ship", "--event-type", "TASK_COMPLETED", "--note", "shipped")
    run("supervise", "--apply-supervision")
    assert completion_notices() == ["🏁 bot: task ship completed (outcome SUCCESS)."]
    run("checkpoint", "train", "--event-type", "TASK_COMPLETED", "--note", "trained")
    run("supervise", "--apply-supervision")
    # The last open task, but the workdir has no card (no watch): it said "its card is
    # retired" all the same, to a chat still showing the card some other program wrote.
    # With a card, see test_supervise_finds_the_host_in_a_runtime_dir_written_with_a_tilde.
    assert completion_notices()[1:] == ["🏁 bot: task train completed (outcome SUCCESS)."]
