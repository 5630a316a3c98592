"""At start the service reads what the store keeps for every agent in a few batches: per
agent, the offsets of its three followed files, its health, and per route the resident, a
kept refusal and a saved fold episode. Read one by one, that was seven statements per agent
(bench/RESULTS.md, "start-up cost per agent"). Counted here with SQLite's own trace of the
statements the store runs; a state that cannot be read in a batch is read one key at a time,
which fails where and as it did before."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskcard.bridge.config import parse_config
from taskcard.bridge.deliver.registry import build_channels
from taskcard.bridge.run.service import Service
from taskcard.bridge.store.base import READ_BATCH, OffsetsAhead, ReadAhead
from taskcard.bridge.store.sqlite import STATE_FILE, SqliteStore
from tests.e2e.harness import eventually

# The statements that read one agent's or one route's row.
PER_KEY_READS = (
    "SELECT inode, offset FROM offsets WHERE",
    "SELECT * FROM residents WHERE route =",
    "SELECT value FROM cursors WHERE key =",
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore.in_dir(tmp_path)
    yield opened
    opened.close()


async def test_a_start_reads_the_agents_state_in_batches_not_per_agent(
    tmp_path: Path, statements: list[str]
) -> None:
    fleet = READ_BATCH + 100  # two batches of each read
    agents = [{"id": f"agent{i}", "workdir": f"w/agent{i}"} for i in range(fleet)]
    for agent in agents:
        (tmp_path / agent["workdir"]).mkdir(parents=True)
    config = parse_config(
        {"agents": agents, "console": {"enabled": True}, "state_dir": "state"}, base_dir=tmp_path
    )
    store = SqliteStore.in_dir(config.state_dir)
    try:
        service = Service(config, build_channels(config, store, {}), store)
        stop = asyncio.Event()
        serving = asyncio.create_task(service.run(stop))
        # Every agent's first sight of its three files is committed within a timer tick.
        await eventually(
            lambda: sum(s.startswith("INSERT INTO offsets") for s in statements) >= 3 * fleet,
            timeout_s=120,
            what="the first-sight offsets of every agent",
        )
        stop.set()
        await serving
    finally:
        store.close()
    single = [s for s in statements if s.startswith(PER_KEY_READS)]
    batched = [s for s in statements if " IN (" in s and s.startswith("SELECT")]
    # A batch of 500 agents and one of 100 for each of the five reads (offsets, health, fold
    # episodes, residents, refusals): read one by one, they were seven per agent. The single
    # reads left are the service's own cursors and the chat's board, once per start.
    assert len(batched) == 10, [s[:72] for s in batched]
    assert len(single) <= 10, [s[:72] for s in single]


def test_a_batch_that_cannot_be_read_leaves_each_key_to_be_read_alone(
    store: SqliteStore, tmp_path: Path
) -> None:
    store.set_cursor("agent-health:a", '["error"]')
    ahead = ReadAhead(store.get_cursors, store.get_cursor, ["agent-health:a", "agent-health:b"])
    assert ahead.take("agent-health:a") == '["error"]' and ahead.take("agent-health:b") is None
    # The table gone under the store (a damaged file): the batch fails, and each read then
    # fails as a single read does, at the place it is made.
    other = sqlite3.connect(tmp_path / STATE_FILE)
    other.execute("DROP TABLE cursors")
    other.commit()
    other.close()
    broken = ReadAhead(store.get_cursors, store.get_cursor, ["agent-health:a"])
    with pytest.raises(sqlite3.OperationalError, match="no such table: cursors"):
        broken.take("agent-health:a")

    def refused(keys: object) -> dict[str, str]:
        raise sqlite3.OperationalError("database is locked")

    alone = ReadAhead(refused, {"k": "v"}.get, ["k", "x"])
    assert alone.take("k") == "v" and alone.take("x") is None


def test_an_offset_read_ahead_is_taken_once_and_never_after_a_write(store: SqliteStore) -> None:
    store.set_offset("a", "notifications", 1, 10)
    store.set_offset("b", "reports", 2, 20)
    offsets = OffsetsAhead(store)
    with offsets.reading_ahead([("a", "notifications"), ("b", "reports"), ("c", "reports")]):
        assert offsets.get_offset("a", "notifications") == (1, 10)
        store.set_offset("a", "notifications", 1, 15)  # taken once already: read alone now
        assert offsets.get_offset("a", "notifications") == (1, 15)
        offsets.set_offset("b", "reports", 2, 25)
        assert offsets.get_offset("b", "reports") == (2, 25)
        offsets.set_first_offset("c", "reports", 3, 0)
        assert offsets.get_offset("c", "reports") == (3, 0)
    store.set_offset("b", "reports", 2, 30)
    assert offsets.get_offset("b", "reports") == (2, 30), "outside the block: the store's"
