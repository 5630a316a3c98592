"""The service's read of a workdir ledger: total, inside the workdir, never blocking."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from taskcard.bridge.compose.view import compose_view
from taskcard.bridge.follow.safe_read import WorkdirFiles
from taskcard.bridge.track.ledger import LedgerView, ledger_row
from taskcard.bridge.track.monitor import ActivitySummary, CardState
from taskcard.producers.ledger.contract import LEDGER_DIR, LEDGER_FILE
from taskcard.producers.ledger.store import DEFAULT_LEDGER, Ledger

LEDGER_NAME = f"{LEDGER_DIR}/{LEDGER_FILE}"


def test_no_ledger_no_row(workdir: Path) -> None:
    assert LedgerView().summary(WorkdirFiles("a", workdir)) is None
    assert ledger_row(None) is None


def test_state_and_next_gate(workdir: Path) -> None:
    ledger = Ledger(workdir / DEFAULT_LEDGER)
    ledger.init("train-7", "p", ["prep", "train"])
    view, files = LedgerView(), WorkdirFiles("a", workdir)
    assert (
        ledger_row(view.summary(files))
        == "ledger train-7: NOT_STARTED · 0/2 steps done · next: unknown"
    )
    ledger.checkpoint("train-7", "STEP_COMPLETED", step="prep")
    assert ledger_row(view.summary(files)) == (
        "ledger train-7: RUNNING · 1/2 steps done · next: complete step train"
    )


def test_a_broken_or_hostile_file_shows_unknown(workdir: Path) -> None:
    path = workdir / DEFAULT_LEDGER
    path.parent.mkdir()
    for content in (
        b"{broken",
        b"[]",
        b'{"tasks": {"t": {"task": {}, "derived": {"workflow": 3}}}}',
    ):
        path.write_bytes(content)
        os.utime(path, ns=(len(content), len(content)))
        assert (
            ledger_row(LedgerView().summary(WorkdirFiles("a", workdir)))
            == "ledger: unknown · next: unknown"
        )
    path.write_bytes(
        b'{"tasks": {"t": {"task": {"task_id": "x/../y"}, '
        b'"derived": {"workflow": "RUNNING", "next_gate": "rm -rf /"}}}}'
    )
    assert (
        ledger_row(LedgerView().summary(WorkdirFiles("a", workdir)))
        == "ledger: RUNNING · next: unknown"
    )


def test_symlinks_out_of_the_workdir_are_not_followed(workdir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    Ledger(outside / DEFAULT_LEDGER).init("secret", "p")
    (workdir / "ledger").symlink_to(outside / "ledger")
    assert (
        ledger_row(LedgerView().summary(WorkdirFiles("a", workdir)))
        == "ledger: unknown · next: unknown"
    )
    os.unlink(workdir / "ledger")
    (workdir / "ledger").mkdir()
    (workdir / DEFAULT_LEDGER).symlink_to(outside / DEFAULT_LEDGER)
    assert (
        ledger_row(LedgerView().summary(WorkdirFiles("a", workdir)))
        == "ledger: unknown · next: unknown"
    )


def test_a_fifo_does_not_block_and_is_a_listed_problem(workdir: Path) -> None:
    (workdir / "ledger").mkdir()
    os.mkfifo(workdir / DEFAULT_LEDGER)
    files = WorkdirFiles("a", workdir)
    assert ledger_row(LedgerView().summary(files)) == "ledger: unknown · next: unknown"
    assert "named pipe" in files.problems["ledger/long-task-ledger.json"]


def test_a_symlink_out_is_a_listed_problem(workdir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    Ledger(outside / DEFAULT_LEDGER).init("secret", "p")
    (workdir / "ledger").mkdir()
    (workdir / DEFAULT_LEDGER).symlink_to(outside / DEFAULT_LEDGER)
    files = WorkdirFiles("a", workdir)
    assert ledger_row(LedgerView().summary(files)) == "ledger: unknown · next: unknown"
    assert "outside" in files.problems["ledger/long-task-ledger.json"]
    os.unlink(workdir / DEFAULT_LEDGER)
    assert LedgerView().summary(files) is None
    assert files.problems == {}, "a problem that went away leaves the list"


def test_symlinks_that_stay_inside_the_workdir_are_followed(workdir: Path) -> None:
    Ledger(workdir / "real" / DEFAULT_LEDGER).init("inside-7", "p", ["prep"])
    (workdir / "ledger").mkdir()
    (workdir / DEFAULT_LEDGER).symlink_to(workdir / "real" / DEFAULT_LEDGER)
    files = WorkdirFiles("a", workdir)
    assert ledger_row(LedgerView().summary(files)) == (
        "ledger inside-7: NOT_STARTED · 0/1 steps done · next: unknown"
    )
    os.unlink(workdir / DEFAULT_LEDGER)
    os.rmdir(workdir / "ledger")
    (workdir / "ledger").symlink_to(workdir / "real" / "ledger")
    row = ledger_row(LedgerView().summary(files))
    assert row is not None and row.startswith("ledger inside-7")
    assert files.problems == {}


def test_the_row_is_in_the_automatic_slot() -> None:
    view = compose_view(
        "a",
        CardState(),
        ActivitySummary(),
        hidden=False,
        activity_rows=3,
        now=datetime(2026, 1, 1, tzinfo=UTC),
        ledger_line="ledger t: BLOCKED · next: decision on block OTHER",
    )
    assert "ledger t: BLOCKED · next: decision on block OTHER" in view.auto_rows


def test_absurd_step_counts_are_unknown(workdir: Path) -> None:
    path = workdir / DEFAULT_LEDGER
    path.parent.mkdir()
    for steps in ("1" + "0" * 4200, "-3", "2.5", "true", "1e400"):
        derived = f'"workflow": "RUNNING", "steps_done": {steps}, "step_count": {steps}'
        path.write_text(
            '{"tasks": {"t": {"task": {"task_id": "x"}, "derived": {' + derived + "}}}}"
        )
        os.utime(path, ns=(len(steps), len(steps)))
        row = ledger_row(LedgerView().summary(WorkdirFiles("a", workdir)))
        assert row == "ledger x: RUNNING · next: unknown", steps


def test_refresh_looks_only_when_the_ledger_is_named(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    view, files = LedgerView(), WorkdirFiles("a", workdir)
    looks: list[str] = []
    stat = WorkdirFiles.stat

    def counted(self: WorkdirFiles, path: str) -> os.stat_result | None:
        looks.append(path)
        return stat(self, path)

    monkeypatch.setattr(WorkdirFiles, "stat", counted)
    assert view.current(files) is None and len(looks) == 1  # first composition looks
    assert view.current(files) is None and len(looks) == 1  # later ones do not
    assert view.refresh(files, frozenset({"taskcard/taskcard.md"})) is False
    assert len(looks) == 1  # the watcher named another file: no look
    ledger = Ledger(workdir / DEFAULT_LEDGER)
    ledger.init("train-7", "p", ["prep", "train"])
    assert view.refresh(files, frozenset({LEDGER_NAME})) is True
    assert ledger_row(view.current(files)) == (
        "ledger train-7: NOT_STARTED · 0/2 steps done · next: unknown"
    )
    assert view.refresh(files, frozenset({LEDGER_NAME})) is False  # same file: no change
    ledger.checkpoint("train-7", "STEP_COMPLETED", step="prep")
    assert view.refresh(files, None) is True  # a rescan looks at everything
    assert "RUNNING" in (ledger_row(view.current(files)) or "")
    (workdir / DEFAULT_LEDGER).unlink()
    assert view.refresh(files, frozenset({LEDGER_NAME})) is True
    assert view.current(files) is None


def test_agents_sharing_a_workdir_each_see_the_change(workdir: Path) -> None:
    """Two agents on one workdir: each refresh told of the ledger says it changed (one
    cache for the workdir answered "unchanged" to the second agent, whose card then kept
    the old row); a forgotten agent looks again."""
    view = LedgerView()
    first, second = WorkdirFiles("a", workdir), WorkdirFiles("b", workdir)
    assert view.current(first) is None and view.current(second) is None
    Ledger(workdir / DEFAULT_LEDGER).init("train-7", "p", ["prep", "train"])
    assert view.refresh(first, frozenset({LEDGER_NAME})) is True
    assert view.refresh(second, frozenset({LEDGER_NAME})) is True
    assert view.current(first) == view.current(second) is not None
    (workdir / DEFAULT_LEDGER).unlink()
    view.forget(first)
    assert view.current(first) is None  # looked again
    assert view.current(second) is not None  # not told yet
