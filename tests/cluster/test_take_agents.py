"""An agent whose take-over fails part-way (its state could not be read in full) is not kept
half served: it is let go again, so the next lease renewal takes it whole, reading what the
instance before left pending for it. Kept, it was skipped as already taken at every later
renewal, and the notices left pending for it were never sent."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from taskcard.bridge.config import parse_config
from taskcard.bridge.deliver.registry import build_channels
from taskcard.bridge.run.service import Service
from taskcard.bridge.store.sqlite import PendingNotice, SqliteStore
from tests.e2e.harness import eventually


async def test_an_agent_whose_take_over_failed_half_way_is_taken_whole_next_time(
    tmp_path: Path,
) -> None:
    (tmp_path / "w" / "a").mkdir(parents=True)
    config = parse_config(
        {
            "agents": [{"id": "a", "workdir": "w/a"}, {"id": "b", "workdir": "w/b"}],
            "console": {"enabled": True},
            "state_dir": "state",
        },
        base_dir=tmp_path,
    )
    store = SqliteStore.in_dir(config.state_dir)
    reads: list[str] = []
    real = store.pending_notices

    def failing() -> list[PendingNotice]:
        reads.append("failed")
        raise sqlite3.OperationalError("disk I/O error")

    def counted() -> list[PendingNotice]:
        reads.append("read")
        return real()

    try:
        service = Service(config, build_channels(config, store, {}), store, clustered=True)
        stop = asyncio.Event()
        serving = asyncio.create_task(service.run(stop))
        await eventually(lambda: "console" in service._ready_channels, what="the console")
        store.pending_notices = failing  # type: ignore[method-assign]
        failed = service.take_agents(["a"])
        assert list(failed) == ["a"] and "disk I/O error" in str(failed["a"])
        assert not service._serves("a"), "not kept half served"
        store.pending_notices = counted  # type: ignore[method-assign]
        assert service.take_agents(["a", "b"]) == {}
        assert reads == ["failed", "failed", "read"], "the retry reads the pending notices"
        assert service._serves("a") and service._serves("b")
        stop.set()
        await serving
    finally:
        store.close()
