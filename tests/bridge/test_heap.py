"""The collector's start-up and serving settings (bridge/run/heap.py)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskcard.bridge.config import parse_config
from taskcard.bridge.run import heap
from taskcard.bridge.run.service import Service
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.bridge.watch.inotify import inotify_available

TIMEOUT_S = 30.0


@pytest.fixture
def restored_gc() -> Iterator[None]:
    """Each test leaves the collector as it found it (thresholds and frozen objects)."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_starting_makes_young_collections_rare(restored_gc: None) -> None:
    _, middle, old = gc.get_threshold()
    heap.starting()
    assert gc.get_threshold() == (heap.START_YOUNG, middle, old)


def test_settled_freezes_what_lives_and_serves_with_its_own_threshold(restored_gc: None) -> None:
    gc.unfreeze()
    survivor = [object() for _ in range(10)]
    heap.starting()
    heap.settled()
    assert gc.get_freeze_count() >= len(survivor)
    assert gc.get_threshold()[0] == heap.SERVE_YOUNG
    assert heap.SERVE_YOUNG < heap.START_YOUNG


def test_cycles_already_garbage_when_settling_are_freed_not_frozen(restored_gc: None) -> None:
    """A cycle the start-up left behind would, once frozen, never be collected: settling
    collects first, so only what is alive is moved out of the collector's view."""
    gc.unfreeze()
    heap.starting()  # no young collection can come before `settled` (far below its threshold)

    class Node:
        other: object = None

    first, second = Node(), Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    assert gone() is not None  # only the collector can free a cycle
    heap.settled()
    assert gone() is None


def test_a_frozen_object_is_still_freed_by_reference_counting(restored_gc: None) -> None:
    """Why freezing the start-up heap is safe: our objects are freed without the collector."""

    class Node:
        pass

    plain = Node()
    gone = weakref.ref(plain)
    gc.freeze()
    del plain
    assert gone() is None


@pytest.mark.parametrize(
    ("fleet", "backend"),
    [
        ("none", "inotify"),  # no agent at all: the first report is empty
        ("discovered", "auto"),  # a discovery root and no configured agent
        ("one", "watchfiles"),  # the fallback backend
    ],
)
async def test_the_service_settles_after_its_first_report_whatever_its_fleet(
    tmp_path: Path, restored_gc: None, fleet: str, backend: str
) -> None:
    """`settled` must be reached in every start, or the service would serve on with the
    start-up threshold and nothing frozen: it comes with the watcher's first report, which
    every start yields (even an empty one), before any watch is armed."""
    if backend == "inotify" and not inotify_available():
        pytest.skip("no inotify here")
    raw: dict[str, object] = {
        "console": {"enabled": False},
        "state_dir": "state",
        "watch": {"backend": backend},
    }
    if fleet == "discovered":
        (tmp_path / "root" / "found" / "taskcard").mkdir(parents=True)
        raw["discover"] = {"roots": ["root"]}
    if fleet == "one":
        raw["agents"] = [{"id": "a", "workdir": "a"}]
    config = parse_config(raw, base_dir=tmp_path)
    store = SqliteStore.in_dir(config.state_dir)
    service = Service(config, {}, store)
    heap.starting()
    stop = asyncio.Event()
    running = asyncio.create_task(service.run(stop))
    try:
        async with asyncio.timeout(TIMEOUT_S):
            while gc.get_threshold()[0] != heap.SERVE_YOUNG:
                assert not running.done(), running
                await asyncio.sleep(0.01)
        assert gc.get_freeze_count() > 0
    finally:
        stop.set()
        await running
        store.close()
