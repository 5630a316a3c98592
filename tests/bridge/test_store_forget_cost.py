"""Forgetting one departed agent costs the SQLite store its own rows' work, not the fleet's.

Agents that left together are forgotten one after another on the service's event loop (at
most `FORGET_PER_TICK` a second), so each forgetting must not read every other agent's
residents, notices and cursors. The work is counted in SQLite virtual-machine steps (the
progress handler), never timed: forgetting the same agent beside ten times as many other
agents' rows takes about the same number of steps.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from taskcard.bridge.store.sqlite import SqliteStore


def fleet_store(tmp_path: Path, others: int) -> SqliteStore:
    """A store holding `others` agents' rows besides those of the agent `gone`."""
    store = SqliteStore.in_dir(tmp_path)
    for agent in [f"a{n}" for n in range(others)] + ["gone"]:
        for chat in ("-100", "-200"):
            store.set_message_id(f"telegram:{chat}::{agent}", "7")
        store.add_notice(f"telegram:-100::{agent}", "n-1", "text", "pending")
        store.set_offset(agent, "card.json", 1, 10)
        store.set_cursor(f"notices:folded:telegram:-100::{agent}", "1")
    store.retry_pending()
    return store


def steps_to_forget(store: SqliteStore) -> int:
    """SQLite VM steps `forget_agent("gone")` takes (its write is committed at once)."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    db: sqlite3.Connection = store._db  # the store's one connection: where the work runs
    db.set_progress_handler(count, 1)
    try:
        store.forget_agent(
            "gone",
            routes=["wake:gone"],
            cursors=["departed:gone"],
            cursor_prefixes=["notices:folded:"],
        )
    finally:
        db.set_progress_handler(None, 1)
    return steps


def test_forgetting_one_agent_does_not_grow_with_the_other_agents_rows(tmp_path: Path) -> None:
    few, many = fleet_store(tmp_path / "few", 100), fleet_store(tmp_path / "many", 1000)
    try:
        small, large = steps_to_forget(few), steps_to_forget(many)
        # Its rows went, the others' stayed.
        for store, others in ((few, 100), (many, 1000)):
            assert store.resident("telegram:-100::gone") is None
            assert store.pending_notices("telegram:-100::gone") == []
            assert store.get_offset("gone", "card.json") is None
            assert store.get_cursor("notices:folded:telegram:-100::gone") is None
            assert len(store.residents()) == 2 * others
            assert len(store.pending_notices()) == others
            assert store.get_offset("a7", "card.json") == (1, 10)
            assert store.get_cursor("notices:folded:telegram:-100::a7") == "1"
    finally:
        few.close()
        many.close()
    # A scan of every route would take about ten times the steps beside ten times the rows;
    # the index on the routes' last part keeps it to the agent's own (a B-tree's depth
    # may add a level).
    assert large < 1.5 * small, (small, large)
