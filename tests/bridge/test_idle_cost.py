"""Cost grows with change, not with size: the periodic work of the service (the timer, the
watcher's safety-net rescan) is measured by counting what it touches, with injected clocks,
for fleets of different sizes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from taskcard.bridge.config import parse_config
from taskcard.bridge.deliver.registry import build_channels
from taskcard.bridge.run.service import Service
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.bridge.track.due import DueAgents
from taskcard.bridge.watch.watcher import FleetWatcher, sweep_slices

TIMEOUT_S = 30.0


class Counted(float):
    """A due time that counts how often the heap compares it."""

    comparisons = 0

    def __lt__(self, other: object) -> bool:
        Counted.comparisons += 1
        return float(self) < float(other)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        Counted.comparisons += 1
        return float(self) == float(other)  # type: ignore[arg-type]

    __hash__ = float.__hash__


def test_due_agents_come_out_in_time_order_and_superseded_times_are_skipped() -> None:
    due = DueAgents()
    due.set("late", 30.0)
    due.set("early", 10.0)
    due.set("moved", 5.0)
    due.set("moved", 50.0)  # its earlier time no longer counts
    due.set("gone", 1.0)
    due.discard("gone")
    assert due.next_due() == 10.0
    assert due.pop_due(9.0) == []
    assert due.pop_due(30.0) == ["early", "late"]
    assert len(due) == 1 and due.next_due() == 50.0
    assert due.pop_due(100.0) == ["moved"]
    assert due.pop_due(1e9) == [] and due.next_due() is None


def test_the_heap_stays_bounded_when_due_times_keep_moving() -> None:
    due = DueAgents()
    for step in range(10_000):
        due.set(f"agent{step % 10}", float(step))
    assert len(due) == 10
    assert len(due._heap) <= 2 * len(due) + 16


@pytest.mark.parametrize("fleet", [1_000, 20_000])
def test_popping_due_agents_costs_in_proportion_to_them_not_to_the_fleet(fleet: int) -> None:
    due = DueAgents()
    for index in range(fleet):
        due.set(f"waiting{index}", Counted(3600.0 + index))  # due in an hour and later
    for index in range(5):
        due.set(f"due{index}", Counted(float(index)))
    Counted.comparisons = 0
    assert due.pop_due(Counted(10.0)) == [f"due{index}" for index in range(5)]
    # Five pops from a heap of 20,000 take about 5 * 2 * log2(20,000) comparisons; a scan of
    # the fleet would take one per agent.
    assert Counted.comparisons < 400, Counted.comparisons
    Counted.comparisons = 0
    assert due.pop_due(Counted(11.0)) == []
    assert Counted.comparisons <= 2  # nothing due: one look at the head


class CountingClock:
    def __init__(self, now: datetime) -> None:
        self.now = now
        self.calls = 0

    def __call__(self) -> datetime:
        self.calls += 1
        return self.now


@pytest.mark.parametrize("fleet", [100, 3_000])
def test_a_timer_tick_refreshes_only_due_agents(tmp_path: Path, fleet: int) -> None:
    agents = [{"id": f"agent{i}", "workdir": f"w/agent{i}"} for i in range(fleet)]
    config = parse_config(
        {"agents": agents, "console": {"enabled": False}, "state_dir": "state"},
        base_dir=tmp_path,
    )
    store = SqliteStore.in_dir(config.state_dir)
    clock = CountingClock(datetime(2026, 3, 4, 12, 0, tzinfo=UTC))
    service = Service(config, {}, store, clock=clock)
    refreshed: list[str] = []
    service._refresh = refreshed.append  # type: ignore[method-assign,assignment]
    later = (clock.now + timedelta(minutes=5)).timestamp()
    for index in range(fleet):  # every agent running: each has a time it turns "no output"
        service._due.set(f"agent{index}", later + index)
    for index in (3, 7, 11):
        service._due.set(f"agent{index}", (clock.now - timedelta(seconds=1)).timestamp())
    clock.calls = 0
    service._timer_tick()
    assert sorted(refreshed) == ["agent11", "agent3", "agent7"]
    assert clock.calls <= 2, "the clock is read per tick, never per agent"
    refreshed.clear()
    service._timer_tick()
    assert refreshed == []
    store.close()


@pytest.mark.parametrize(
    ("agents", "interval_s", "step_s", "sizes"),
    [
        (10, 300.0, 1.0, [1] * 10),  # fewer agents than steps: one a step
        (1_000, 300.0, 1.0, [4] * 100 + [3] * 200),  # 300 steps per round
        (5, 0.2, 1.0, [5]),  # a round shorter than a step: everyone at once
        (0, 300.0, 1.0, [0]),
    ],
)
def test_the_rescan_round_is_dealt_out_evenly(
    agents: int, interval_s: float, step_s: float, sizes: list[int]
) -> None:
    ids = [f"a{index:04d}" for index in range(agents)]
    slices = sweep_slices(ids, interval_s, step_s)
    assert [len(s) for s in slices] == sizes
    assert set().union(*slices) == set(ids)


async def test_the_rescan_reports_a_slice_a_step_and_everyone_once_a_round(
    tmp_path: Path,
) -> None:
    workdirs = {f"a{index:02d}": tmp_path / f"a{index:02d}" for index in range(40)}
    watcher = FleetWatcher(workdirs, rescan_interval_s=0.8, sweep_step_s=0.2)
    batches: list[frozenset[str]] = []

    async def collect() -> None:
        async for batch in watcher.changes():
            batches.append(batch)
            if len(batches) >= 12:
                return

    await asyncio.wait_for(collect(), TIMEOUT_S)
    everyone = set(workdirs)
    # First everyone (start), then everyone once the watcher is armed, then the slices.
    slices = [batch for batch in batches if batch != everyone]
    assert len(slices) >= 8
    assert all(len(batch) == 10 for batch in slices), [len(b) for b in slices]
    assert set().union(*slices[:4]) == everyone, "each agent comes round once per round"


class CountedRoutes(list):  # type: ignore[type-arg]
    """The service's route list, counting the walks over it."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        CountedRoutes.walks += 1
        return super().__iter__()


@pytest.mark.parametrize("fleet", [100, 3_000])
def test_a_timer_tick_walks_no_route_list(tmp_path: Path, fleet: int) -> None:
    # Every route of a large fleet is configured (one group with all agents); the tick
    # looks only at the routes a turn's origin opened, of which there are none here.
    agents = [{"id": f"agent{i}", "workdir": f"w/agent{i}"} for i in range(fleet)]
    config = parse_config(
        {
            "agents": agents,
            "console": {"enabled": False},
            "state_dir": "state",
            "telegram": {"token_env": "TC_TOKEN", "routes": [{"chat_id": -100, "agents": ["*"]}]},
        },
        base_dir=tmp_path,
    )
    store = SqliteStore.in_dir(config.state_dir)
    channels = build_channels(config, store, {"TC_TOKEN": "1:T"})
    service = Service(config, channels, store, clock=CountingClock(datetime(2026, 3, 4, 12)))
    assert len(service._routes) == fleet
    service._routes = CountedRoutes(service._routes)
    CountedRoutes.walks = 0
    service._timer_tick()
    service._timer_tick()
    assert CountedRoutes.walks == 0
    store.close()
