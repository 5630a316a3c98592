"""First-sight offsets are kept in memory for up to a timer tick, like fingerprints.

The promise (module docstring of `bridge.store.sqlite`, docs/architecture.md): an offset taken
at an agent's first sight is read back at once by the same store and committed with the next
other write, the next `retry_pending` or `close`, many in one transaction. A kill before that
loses the first sight only: the next start takes it again, and nothing delivered is replayed,
because the offset written after a delivery commits the kept one first. A "kill" here is a
second store opened on the same file while the first one is abandoned without `close`, as a
restarted service after SIGKILL would open it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import MAX_UNSAVED_COMMITS, STATE_FILE, SqliteStore
from taskcard.bridge.track.monitor import NOTIFICATIONS_OFFSET, AgentMonitor
from taskcard.producers.task_card.contract import CardPaths, append_jsonl_line


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore.in_dir(tmp_path)
    yield opened
    opened.close()


def on_disk(tmp_path: Path, agent_id: str = "a", name: str = "reports") -> tuple[int, int] | None:
    """(inode, offset) as another process would read them now."""
    db = sqlite3.connect(tmp_path / STATE_FILE)
    try:
        row = db.execute(
            "SELECT inode, offset FROM offsets WHERE agent_id = ? AND name = ?", (agent_id, name)
        ).fetchone()
    finally:
        db.close()
    return None if row is None else (row[0], row[1])


def test_a_first_offset_is_read_back_at_once_and_on_disk_after_the_tick(
    store: SqliteStore, tmp_path: Path
) -> None:
    store.set_first_offset("a", "reports", 7, 100)
    assert store.get_offset("a", "reports") == (7, 100)
    assert on_disk(tmp_path) is None, "a kill now loses the first sight only"
    assert store.retry_pending() is True
    assert on_disk(tmp_path) == (7, 100)


def test_the_offset_after_a_delivery_commits_the_first_one_before_it(
    store: SqliteStore, tmp_path: Path
) -> None:
    store.set_first_offset("a", "reports", 7, 100)
    store.set_first_offset("b", "reports", 8, 5)
    store.set_offset("a", "reports", 7, 180)  # lines 100..180 delivered
    assert on_disk(tmp_path) == (7, 180), "never the older first sight over the newer offset"
    assert on_disk(tmp_path, "b") == (8, 5), "the same transaction saved every kept offset"
    store.retry_pending()
    assert on_disk(tmp_path) == (7, 180)
    assert store.get_offset("a", "reports") == (7, 180)


def test_any_other_write_commits_the_kept_offsets(store: SqliteStore, tmp_path: Path) -> None:
    store.set_first_offset("a", "acks", 3, 0)
    store.set_message_id("telegram:-100:a", "41")
    assert on_disk(tmp_path, name="acks") == (3, 0)


def test_close_commits_the_kept_offsets(tmp_path: Path) -> None:
    store = SqliteStore.in_dir(tmp_path)
    store.set_first_offset("a", "reports", 0, 0)
    store.close()
    assert on_disk(tmp_path) == (0, 0)


def test_a_cold_start_commits_its_first_offsets_in_batches(
    store: SqliteStore, tmp_path: Path
) -> None:
    agents = [f"a{i:05}" for i in range(MAX_UNSAVED_COMMITS)]
    for agent_id in agents:
        store.set_first_offset(agent_id, "reports", 1, 10)
    assert on_disk(tmp_path, agents[0]) == (1, 10)
    assert on_disk(tmp_path, agents[-1]) == (1, 10)


def notify(paths: CardPaths, ident: str) -> None:
    append_jsonl_line(
        paths.notifications,
        {
            "id": ident,
            "source": "task_card.error",
            "channel": "system",
            "ref_id": "tc_1",
            "priority": "high",
            "header": "h",
            "body": "b",
            "extra": {"state": "error"},
            "at": "2026-05-01T11:00:00Z",
        },
    )


def monitor(paths: CardPaths, store: SqliteStore) -> AgentMonitor:
    return AgentMonitor("a", paths.workdir, store, clock=lambda: datetime(2026, 5, 1, tzinfo=UTC))


def test_a_kill_before_the_tick_takes_the_first_sight_again_and_replays_nothing(
    tmp_path: Path,
) -> None:
    paths = CardPaths(tmp_path / "agent")
    state = tmp_path / "state"
    state.mkdir()
    notify(paths, "history")
    killed = SqliteStore.in_dir(state)
    assert monitor(paths, killed).refresh().notifications == ()
    assert on_disk(state, name=NOTIFICATIONS_OFFSET) is None
    # Killed before the tick; a line appended in that second counts as history after restart.
    notify(paths, "in-the-lost-second")
    restarted = SqliteStore.in_dir(state)
    try:
        again = monitor(paths, restarted)
        assert again.refresh().notifications == ()
        assert again.card.error_code is not None, "history still gives the card's health"
        notify(paths, "after")
        assert [n.id for n in again.refresh().notifications] == ["after"]
    finally:
        restarted.close()
        killed.close()


def test_a_kill_after_a_delivery_keeps_its_offset(tmp_path: Path) -> None:
    paths = CardPaths(tmp_path / "agent")
    state = tmp_path / "state"
    state.mkdir()
    killed = SqliteStore.in_dir(state)
    first = monitor(paths, killed)
    first.refresh()
    notify(paths, "n1")
    assert [n.id for n in first.refresh().notifications] == ["n1"]
    first.commit()  # the delivery's offset, committed at once with the first sight before it
    notify(paths, "n2")
    restarted = SqliteStore.in_dir(state)
    try:
        assert [n.id for n in monitor(paths, restarted).refresh().notifications] == ["n2"]
    finally:
        restarted.close()
        killed.close()
