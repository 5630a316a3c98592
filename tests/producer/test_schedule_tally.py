"""The fixed-rate tick grid and the refresh budget tally: pure tables, then real watches."""

from __future__ import annotations

import itertools
import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.contract import TALLY_FILE, CardPaths
from taskcard.producers.task_card.renderer import RunOutcome, RunRequest, run_renderer
from taskcard.producers.task_card.schedule import next_slot, slot_due
from taskcard.producers.task_card.tally import (
    MAX_TALLY_BYTES,
    RefreshTally,
    parse_tally,
    read_tally,
)

from .conftest import COUNTER_RENDERER, envelope, wait_for, write_renderer

MakeCard = Callable[..., TaskCard]


@pytest.mark.parametrize(
    ("origin", "interval_s", "last_slot", "now", "expected"),
    [
        # the first tick after the start render
        (0.0, 1.0, 0, 0.02, (1, 0)),
        # a 30 ms render: the next grid point, nothing skipped
        (0.0, 1.0, 1, 1.03, (2, 0)),
        # the render overran one grid point: that tick is skipped, not made up
        (0.0, 1.0, 1, 2.5, (3, 1)),
        # it ended exactly on a grid point: that tick runs at once
        (0.0, 1.0, 1, 2.0, (2, 0)),
        # a long stall skips every grid point it covered
        (0.0, 1.0, 1, 10.2, (11, 9)),
        # a clock read from before the last due time never moves the grid back
        (0.0, 1.0, 5, 3.0, (6, 0)),
        # other origins and intervals
        (100.0, 5.0, 3, 116.0, (4, 0)),
        (100.0, 5.0, 3, 126.0, (6, 2)),
    ],
)
def test_next_slot(
    origin: float, interval_s: float, last_slot: int, now: float, expected: tuple[int, int]
) -> None:
    assert next_slot(origin, interval_s, last_slot, now) == expected


def test_due_times_are_products_so_rounding_never_accumulates() -> None:
    assert slot_due(1000.0, 0.1, 1_000_000) == pytest.approx(1000.0 + 100_000.0, abs=1e-6)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"tc_7\n12\n13\n", 13),
        (b"tc_7\n12\n", 12),
        (b"tc_7\n12\n1", 12),  # a torn last line is not counted
        (b"tc_7\n", None),  # no count yet
        (b"tc_8\n12\n", None),  # another watch's tally
        (b"tc_7\n12\n-1\n", None),
        (b"tc_7\n12\n1e3\n", None),
        (b"tc_7\n12\n\xff\n", None),
        (b"tc_7\n12\n101\n", None),  # past the watch's ceiling
        (b"tc_7\n12\n9999999999\n", None),
        (b"", None),
    ],
)
def test_parse_tally(raw: bytes, expected: int | None) -> None:
    assert parse_tally(raw, "tc_7", ceiling=100) == expected


class DueRecorder:
    """The product's runner, plus the due time the product gave each tick."""

    def __init__(self) -> None:
        self.dues: list[float] = []

    def __call__(self, request: RunRequest, cancel: threading.Event) -> RunOutcome:
        if request.due is not None:
            self.dues.append(request.due)
        return run_renderer(request, cancel)


def test_a_render_that_overruns_skips_ticks_and_keeps_the_grid(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", "import time\ntime.sleep(1.5)\nprint('# slow card')\n")
    recorder = DueRecorder()
    card = make_card(runner=recorder)
    started = card.call(envelope("start", renderer_path="r.py", interval_s=1))
    assert started["status"] == "watching", started
    wait_for(lambda: len(recorder.dues) >= 3, 60)
    dues = list(recorder.dues)
    gaps = [later - earlier for earlier, later in itertools.pairwise(dues)]
    # every tick stands on the grid, and each 1.5 s render skipped at least one grid point
    assert all(abs(gap - round(gap)) < 1e-6 for gap in gaps), gaps
    assert all(round(gap) >= 2 for gap in gaps), gaps
    inspected = card.inspect("tc_1")
    assert inspected["ticks_skipped"] >= len(gaps)
    assert inspected["error"] is None


def test_spent_refreshes_go_to_the_tally_and_a_new_host_counts_them(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    card.call(envelope("start", renderer_path="r.py", interval_s=3600, max_refreshes=10))
    for _ in range(3):
        card.call(envelope("retry", watch_id="tc_1"))
    descriptor = json.loads((workdir / "taskcard" / "watch.json").read_text())
    assert descriptor["refreshes_used"] == 0  # written at start only
    assert (workdir / ".taskcard-host" / TALLY_FILE).read_bytes() == b"tc_1\n0\n1\n2\n3\n"
    card.close()
    resumed = make_card()
    assert resumed.inspect("tc_1")["refreshes_used"] == 3
    descriptor = json.loads((workdir / "taskcard" / "watch.json").read_text())
    assert descriptor["refreshes_used"] == 3  # the resume writes the merged count
    assert (workdir / ".taskcard-host" / TALLY_FILE).read_bytes() == b"tc_1\n3\n"
    resumed.call(envelope("stop", watch_id="tc_1"))
    assert not (workdir / ".taskcard-host" / TALLY_FILE).exists()


def two_refreshes_then_stopped(workdir: Path, make_card: MakeCard) -> None:
    """A watch (`tc_1`, 10 refreshes) that spent two, its host gone, and `watch.json` saying
    two as well: what a resuming host then reads from the tally is up to the caller."""
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    card.call(envelope("start", renderer_path="r.py", interval_s=3600, max_refreshes=10))
    for _ in range(2):
        card.call(envelope("retry", watch_id="tc_1"))
    card.close()
    descriptor_path = workdir / "taskcard" / "watch.json"
    descriptor = json.loads(descriptor_path.read_text())
    descriptor_path.write_text(json.dumps({**descriptor, "refreshes_used": 2}))


@pytest.mark.parametrize(
    ("tally", "expected_used"),
    [
        (b"tc_9\n7\n", 2),  # another watch's tally is ignored
        (b"tc_1\n1\n", 2),  # a lower count never gives budget back
        (b"tc_1\n99999\n", 2),  # past the ceiling: ignored
        (b"tc_1\n5\n", 5),
    ],
)
def test_a_new_host_trusts_the_tally_only_upward_and_for_its_own_watch(
    workdir: Path, make_card: MakeCard, tally: bytes, expected_used: int
) -> None:
    two_refreshes_then_stopped(workdir, make_card)
    (workdir / ".taskcard-host" / TALLY_FILE).write_bytes(tally)
    assert make_card().inspect("tc_1")["refreshes_used"] == expected_used


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_planted_tally_is_never_written_through_and_the_budget_stays_exact(
    workdir: Path, make_card: MakeCard, kind: str
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    planted = workdir / ".taskcard-host" / TALLY_FILE
    planted.parent.mkdir(parents=True, exist_ok=True)
    if kind == "folder":
        (planted / "inside").mkdir(parents=True)  # not empty: nothing can be renamed over it
    else:
        os.mkfifo(planted)  # replaced by the tally's atomic rename, never opened
    card = make_card()
    started = card.call(envelope("start", renderer_path="r.py", interval_s=3600))
    assert started["status"] == "watching", started
    for _ in range(2):
        assert card.call(envelope("retry", watch_id="tc_1"))["status"] == "watching"
    descriptor = json.loads((workdir / "taskcard" / "watch.json").read_text())
    if kind == "folder":
        assert planted.is_dir()
        assert descriptor["refreshes_used"] == 2  # the fallback: watch.json per refresh
    else:
        assert stat.S_ISREG(planted.lstat().st_mode)
        assert planted.read_bytes() == b"tc_1\n0\n1\n2\n"
    card.close()
    assert make_card().inspect("tc_1")["refreshes_used"] == 2


@pytest.mark.parametrize("kind", ["symlink_out", "fifo", "garbage", "nan", "huge_number", "huge"])
def test_a_hostile_tally_found_at_resume_is_ignored_and_replaced(
    workdir: Path, tmp_path: Path, make_card: MakeCard, kind: str
) -> None:
    two_refreshes_then_stopped(workdir, make_card)
    planted = workdir / ".taskcard-host" / TALLY_FILE
    planted.unlink()
    outside = tmp_path / "outside"
    outside.write_bytes(b"tc_1\n5\n")  # would count, if a link out of the workdir were read
    if kind == "symlink_out":
        planted.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(planted)  # opened for reading it would block the resume
    elif kind == "garbage":
        planted.write_bytes(b"tc_1\n\x00\xff<b>5</b>\n")
    elif kind == "nan":
        planted.write_bytes(b"tc_1\nNaN\n")
    elif kind == "huge_number":
        planted.write_bytes(b"tc_1\n" + b"9" * 400 + b"\n")
    else:
        planted.write_bytes(b"tc_1\n" + b"3\n" * 10_000 + b"5\n")  # past the size bound
    resumed = make_card()
    assert resumed.inspect("tc_1")["refreshes_used"] == 2
    assert resumed.call(envelope("retry", watch_id="tc_1"))["status"] == "watching"
    assert stat.S_ISREG(planted.lstat().st_mode)  # replaced by the host's own tally
    assert planted.read_bytes() == b"tc_1\n2\n3\n"
    assert outside.read_bytes() == b"tc_1\n5\n"  # never written through


def test_the_tally_restarts_before_it_passes_its_size_bound(workdir: Path) -> None:
    paths = CardPaths(workdir)
    tally = RefreshTally(paths, "tc_3", 0)
    try:
        for used in range(1, 5001):
            tally.record(used)
            assert (workdir / ".taskcard-host" / TALLY_FILE).stat().st_size <= MAX_TALLY_BYTES
    finally:
        tally.close()
    assert read_tally(paths, "tc_3", ceiling=5000) == 5000
