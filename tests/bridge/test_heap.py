"""The collector's start-up and serving settings (bridge/run/heap.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from taskcard.bridge.run import heap


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


def test_a_frozen_object_is_still_freed_by_reference_counting(restored_gc: None) -> None:
    """Why freezing the start-up heap is safe: our objects are freed without the collector."""

    class Node:
        pass

    plain = Node()
    gone = weakref.ref(plain)
    gc.freeze()
    del plain
    assert gone() is None
