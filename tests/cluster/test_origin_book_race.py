"""Clustered, the origin route book is one document every instance changes. Two instances
changing their own routes at the same moment each read the document, then wrote it back with
their change: the write that came second dropped the first one's change (a route opened by a
turn never shown, a route closed by `/taskcard off` open again). Two processes, each an
instance's book on its own store client, change their own routes as fast as they can at once,
against a real `redis-server` and against one SQLite file; no change may be lost."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from taskcard.bridge.run.origins import ORIGIN_ROUTES_CURSOR, OriginBook
from taskcard.bridge.schedule.scheduler import RouteKey
from taskcard.bridge.store.base import StateStore
from taskcard.bridge.store.redis import RedisStore, connect
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.channels.base import ChatRef
from tests.e2e.harness import ROOT

# Routes each instance opens; it closes every other one right after opening the next.
ROUTES = 150

# One instance's book: it opens its routes (`<name><i>`) one after another and closes each
# even one once the next is open, as turns and `/taskcard off` would, then stops.
INSTANCE = """
import sys
from pathlib import Path

from taskcard.bridge.run.origins import OriginBook
from taskcard.bridge.schedule.scheduler import RouteKey
from taskcard.channels.base import ChatRef

backend, where, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if backend == "redis":
    from taskcard.bridge.store.redis import RedisStore, connect

    url, prefix = where.split(" ")
    store = RedisStore(connect(url), prefix)
else:
    from taskcard.bridge.store.sqlite import SqliteStore

    store = SqliteStore(Path(where))
book = OriginBook(store, shared=True)
print("ready", flush=True)
sys.stdin.readline()  # both instances go at once
keys = [RouteKey("telegram", ChatRef("-100"), f"{name}{i}") for i in range(count)]
for i, key in enumerate(keys):
    book.open(key, 1000.0 + i)
    if i % 2:
        book.close(keys[i - 1], 2000.0 + i)
store.close()
"""


def open_store(backend: str, where: str) -> StateStore:
    if backend == "redis":
        url, prefix = where.split(" ")
        return RedisStore(connect(url), prefix)
    return SqliteStore(Path(where))


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_two_instances_changing_their_own_origin_routes_at_once_lose_no_change(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "redis":
        where = f"{request.getfixturevalue('redis_url')} test-{uuid.uuid4().hex}"
    else:
        where = str(tmp_path / "state.sqlite3")
    open_store(backend, where).close()  # the SQLite file is made once, before both open it
    instances = [
        subprocess.Popen(
            [sys.executable, "-c", INSTANCE, backend, where, name, str(ROUTES)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        for instance in instances:
            assert instance.stdout is not None and instance.stdout.readline() == "ready\n", (
                instance.communicate(timeout=60)[1]
            )
        for instance in instances:
            assert instance.stdin is not None
            instance.stdin.write("go\n")
            instance.stdin.flush()
        for instance in instances:
            _, errors = instance.communicate(timeout=240)
            assert instance.returncode == 0, errors
    finally:
        for instance in instances:
            if instance.poll() is None:
                instance.kill()
                instance.communicate()
    store = open_store(backend, where)
    try:
        stored = json.loads(store.get_cursor(ORIGIN_ROUTES_CURSOR) or "[]")
    finally:
        store.close()
    found = {entry["agent"]: entry["closed_at"] is None for entry in stored}
    wanted = {f"{name}{i}": i % 2 == 1 for name in ("a", "b") for i in range(ROUTES)}
    wrong = sorted(agent for agent, is_open in wanted.items() if found.get(agent) != is_open)
    assert not wrong, (
        f"{len(wrong)} of {len(wanted)} routes are not as their instance left them"
        f" (lost changes): {wrong[:10]}"
    )


def test_a_change_kept_while_the_file_was_locked_is_made_on_the_book_as_stored_then(
    tmp_path: Path,
) -> None:
    """A change the SQLite store keeps for a retry (another process held the file) is made
    on the book as stored when it is written: the other instance's route, saved meanwhile,
    stays, and so does the change, behind a later one of the same book."""
    path = tmp_path / "state.sqlite3"
    store, elsewhere = SqliteStore(path), SqliteStore(path)
    ours, later, theirs = (RouteKey("telegram", ChatRef("-100"), a) for a in ("a", "b", "c"))
    book = OriginBook(store, shared=True)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process holds the file (a 5 s wait)
        assert book.open(ours, 100.0)
        assert store.health() is not None, "kept for a retry"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert OriginBook(elsewhere, shared=True).open(theirs, 105.0)  # another instance's
    assert book.open(later, 110.0)
    assert store.retry_pending(force=True)
    assert OriginBook(elsewhere).open_routes() == [theirs, ours, later]
    store.close()
    elsewhere.close()


def test_changes_kept_while_the_file_is_locked_wait_as_one_write_and_none_is_lost(
    tmp_path: Path,
) -> None:
    """Routes opened and closed while another process holds the file wait as one write of
    the book, not one each (the backlog grew with every change); when the lock goes each
    is in the book as stored then, beside the route another instance saved meanwhile."""
    path = tmp_path / "state.sqlite3"
    store, elsewhere = SqliteStore(path), SqliteStore(path)
    keys = [RouteKey("telegram", ChatRef("-100"), f"a{i}") for i in range(20)]
    theirs = RouteKey("telegram", ChatRef("-100"), "theirs")
    book = OriginBook(store, shared=True)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process holds the file (a 5 s wait)
        for at, key in enumerate(keys):
            assert book.open(key, 100.0 + at)
        book.close(keys[0], 200.0)
        assert not store.retry_pending(force=True)  # still locked: counts what waits
        health = store.health()
        assert health is not None and health.waiting_writes == 1, health
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert OriginBook(elsewhere, shared=True).open(theirs, 300.0)  # another instance's
    assert store.retry_pending(force=True)
    assert OriginBook(elsewhere).open_routes() == [theirs, *keys[1:]]
    store.close()
    elsewhere.close()


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_a_book_an_earlier_version_saved_keeps_its_routes_through_a_change(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The book is the same document as before, changed in place: an upgrade keeps the
    routes it holds, open and closed (with their closing time)."""
    if backend == "redis":
        where = f"{request.getfixturevalue('redis_url')} test-{uuid.uuid4().hex}"
    else:
        where = str(tmp_path / "state.sqlite3")
    saved, shut, new = (RouteKey("telegram", ChatRef("-100"), a) for a in ("old", "shut", "new"))
    store = open_store(backend, where)
    try:
        entry = {"channel": "telegram", "chat_id": "-100", "thread_id": None, "opened_at": 50.0}
        store.set_cursor(
            ORIGIN_ROUTES_CURSOR,
            json.dumps(
                [
                    {**entry, "agent": "old", "closed_at": None},
                    {**entry, "agent": "shut", "closed_at": 60.0},
                ]
            ),
        )
        assert OriginBook(store, shared=True).open(new, 100.0)
        assert OriginBook(store).open_routes() == [saved, new]
        assert not OriginBook(store).open(shut, 55.0), "written before it was closed"
    finally:
        store.close()
