"""The SQLite store keeps shown-card fingerprints in memory for up to a timer tick.

The promise (module docstring of `bridge.store.sqlite`): `set_committed` is read back at once
by the same store and committed with the next other write, the next `retry_pending` or
`close`; every other resident write (message id, send key, unsure sends) is committed before
the call returns. A process killed in between loses only fingerprints. Each test looks at the
file through a second, independent connection, as a restarted service would.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import MAX_UNSAVED_COMMITS, STATE_FILE, SqliteStore, StateNotSaved

ROUTE = "telegram:-100:builder"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore.in_dir(tmp_path)
    yield opened
    opened.close()


def on_disk(
    tmp_path: Path, route: str = ROUTE, columns: str = "message_id, fingerprint"
) -> tuple[object, ...] | None:
    """The resident's `columns` (by default its message id and fingerprint) as another
    process would read them now."""
    db = sqlite3.connect(tmp_path / STATE_FILE)
    try:
        row = db.execute(f"SELECT {columns} FROM residents WHERE route = ?", (route,)).fetchone()
    finally:
        db.close()
    return None if row is None else tuple(row)


def test_message_id_is_on_disk_at_once_and_fingerprint_after_the_tick(
    store: SqliteStore, tmp_path: Path
) -> None:
    store.set_message_id(ROUTE, "41")
    store.set_committed(ROUTE, "fp-1", 100.0)
    assert on_disk(tmp_path) == ("41", None), "a kill now loses the fingerprint only"
    record = store.resident(ROUTE)
    assert record is not None
    assert (record.message_id, record.fingerprint, record.committed_at) == ("41", "fp-1", 100.0)
    assert [r.fingerprint for r in store.residents()] == ["fp-1"]
    assert store.retry_pending() is True
    assert on_disk(tmp_path) == ("41", "fp-1")


def test_a_later_write_keeps_the_order_of_writes(store: SqliteStore, tmp_path: Path) -> None:
    store.set_message_id(ROUTE, "41")
    store.set_committed(ROUTE, "fp-1", 100.0)
    store.set_message_id(ROUTE, None)  # retired: clears the fingerprint it was written after
    assert on_disk(tmp_path) == (None, None)
    store.retry_pending()
    assert on_disk(tmp_path) == (None, None), "the older fingerprint must not come back"


def test_a_fingerprint_of_an_unknown_route_creates_its_row(
    store: SqliteStore, tmp_path: Path
) -> None:
    store.set_committed(ROUTE, "fp-1", 100.0)
    record = store.resident(ROUTE)
    assert record is not None and record.fingerprint == "fp-1" and record.message_id is None
    store.retry_pending()
    assert on_disk(tmp_path) == (None, "fp-1")


def test_close_commits_what_is_kept(tmp_path: Path) -> None:
    store = SqliteStore.in_dir(tmp_path)
    store.set_message_id(ROUTE, "41")
    store.set_committed(ROUTE, "fp-2", 100.0)
    store.close()
    assert on_disk(tmp_path) == ("41", "fp-2")


def test_many_kept_fingerprints_are_committed_without_waiting(
    store: SqliteStore, tmp_path: Path
) -> None:
    routes = [f"telegram:-100:a{i:05}" for i in range(MAX_UNSAVED_COMMITS)]
    for route in routes:
        store.set_committed(route, f"fp-{route}", 100.0)
    assert on_disk(tmp_path, routes[0]) == (None, f"fp-{routes[0]}")
    assert on_disk(tmp_path, routes[-1]) == (None, f"fp-{routes[-1]}")


def test_a_send_written_while_the_file_is_locked_keeps_its_key_behind_a_later_count(
    store: SqliteStore, tmp_path: Path
) -> None:
    """`before_send` waits in the backlog while another process holds the file; the count
    the failed send writes after it must not take the key's place there."""
    holder = sqlite3.connect(tmp_path / STATE_FILE, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock (5 s wait)
        store.before_send(ROUTE, "k1", (1, 5.0))
        store.set_unsure_sends(ROUTE, 0, 5.0)  # the platform answered: nothing was posted
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.retry_pending(force=True) is True
    assert on_disk(tmp_path, columns="send_key, unsure_sends") == ("k1", 0)


def test_a_write_at_once_is_on_disk_or_raises_and_is_not_kept(
    store: SqliteStore, tmp_path: Path
) -> None:
    """A write in `at_once` (the mark a Telegram send needs first) that the locked file
    refuses raises and is never written later: kept, it let its send go out unmarked. The
    writes kept before it are written first once the file takes writes again."""
    store.add_notice(ROUTE, "n1", "text", "pending")
    holder = sqlite3.connect(tmp_path / STATE_FILE, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        store.set_message_id(ROUTE, "42")  # kept in the backlog
        for _ in range(2):  # the second fails without trying before the retry is due
            with pytest.raises(StateNotSaved), store.at_once():
                store.set_notice_state(ROUTE, "n1", "unsure")
        assert store.health() is not None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [n.notice_id for n in store.pending_notices()] == ["n1"]
    assert store.unsure_notices() == []
    assert store.retry_pending(force=True) is True
    assert store.health() is None and on_disk(tmp_path, columns="message_id") == ("42",)
    with store.at_once():
        store.set_notice_state(ROUTE, "n1", "unsure")
    reopened = SqliteStore.in_dir(tmp_path)
    try:
        assert [n.notice_id for n in reopened.unsure_notices()] == ["n1"]
    finally:
        reopened.close()
