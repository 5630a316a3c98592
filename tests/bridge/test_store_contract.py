"""The `StateStore` contract, run against every backend.

Written against the interface only, so a second backend runs the same class: add its name to
`BACKENDS` and teach the `backend` fixture to open it (a fresh, empty store per test, which
`reopen` opens again as a restarted service would). What a backend must keep across a restart
is checked by reopening; nothing here looks at SQLite itself.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import (
    STATE_FILE,
    ChatPrefs,
    InboxRecord,
    SeenChat,
    SqliteStore,
    StateStore,
)

BACKENDS = ["sqlite"]


@dataclass
class Backend:
    """How to open one backend's storage; every `open()` sees what earlier ones wrote."""

    name: str
    open: Callable[[], StateStore]


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", lambda: SqliteStore.in_dir(tmp_path / "state"))
    raise AssertionError(f"unknown store backend {request.param!r}")


@pytest.fixture
def store(backend: Backend) -> Iterator[StateStore]:
    opened = backend.open()
    yield opened
    opened.close()


ROUTE = "telegram:-100:7:builder"
OTHER = "feishu:oc_1::builder"


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
class TestStateStore:
    # Resident messages -----------------------------------------------------------------

    def test_an_unknown_route_has_no_resident(self, store: StateStore) -> None:
        assert store.resident(ROUTE) is None
        assert store.residents() == []

    def test_a_resident_id_and_its_commit(self, store: StateStore) -> None:
        store.set_message_id(ROUTE, "m1")
        store.set_committed(ROUTE, "fp1", 1000.5)
        record = store.resident(ROUTE)
        assert record is not None
        assert (record.message_id, record.fingerprint, record.committed_at) == ("m1", "fp1", 1000.5)
        assert [r.route for r in store.residents()] == [ROUTE]

    def test_a_new_id_forgets_the_committed_fingerprint(self, store: StateStore) -> None:
        store.set_message_id(ROUTE, "m1")
        store.set_committed(ROUTE, "fp1", 1000.0)
        store.set_message_id(ROUTE, "m2")
        record = store.resident(ROUTE)
        assert record is not None and (record.message_id, record.fingerprint) == ("m2", None)

    def test_a_send_key_is_kept_until_the_id_is_known(self, store: StateStore) -> None:
        store.set_send_key(ROUTE, "k1")
        store.set_unsure_sends(ROUTE, 2, 1234.0)
        record = store.resident(ROUTE)
        assert record is not None
        assert (record.send_key, record.unsure_sends, record.unsure_at) == ("k1", 2, 1234.0)
        store.set_message_id(ROUTE, "m1")  # the outcome is known: nothing is unsure
        record = store.resident(ROUTE)
        assert record is not None and (record.send_key, record.unsure_sends) == (None, 0)

    def test_forgetting_the_id_keeps_the_unsure_count(self, store: StateStore) -> None:
        store.set_unsure_sends(ROUTE, 1, 50.0)
        store.set_message_id(ROUTE, None)
        record = store.resident(ROUTE)
        assert record is not None and (record.message_id, record.unsure_sends) == (None, 1)

    def test_a_replacement_and_the_message_it_supersedes(self, store: StateStore) -> None:
        store.set_message_id(ROUTE, "m1")
        store.set_committed(ROUTE, "fp1", 1.0)
        store.replace_message(ROUTE, stale_message_id="m1")
        record = store.resident(ROUTE)
        assert record is not None
        assert (record.message_id, record.stale_message_id, record.fingerprint) == (
            None,
            "m1",
            None,
        )
        store.replace_message(ROUTE, message_id="m2")  # the stale one was deleted
        record = store.resident(ROUTE)
        assert record is not None and (record.message_id, record.stale_message_id) == ("m2", None)

    def test_a_disabled_route_and_its_reason(self, store: StateStore) -> None:
        store.set_disabled(ROUTE, "bot removed from the chat")
        record = store.resident(ROUTE)
        assert record is not None and record.disabled_reason == "bot removed from the chat"
        store.set_disabled(ROUTE, None)
        record = store.resident(ROUTE)
        assert record is not None and record.disabled_reason is None

    def test_routes_do_not_share_records(self, store: StateStore) -> None:
        store.set_message_id(ROUTE, "m1")
        store.set_message_id(OTHER, "om_1")
        first, second = store.resident(ROUTE), store.resident(OTHER)
        assert first is not None and second is not None
        assert (first.message_id, second.message_id) == ("m1", "om_1")

    # Preferences -----------------------------------------------------------------------

    def test_preferences_default_and_round_trip(self, store: StateStore) -> None:
        scope = "telegram:-100:7"
        assert store.prefs(scope) == ChatPrefs()
        store.set_prefs(scope, ChatPrefs(hidden=True, activity_rows=4))
        assert store.prefs(scope) == ChatPrefs(hidden=True, activity_rows=4)
        store.set_prefs(scope, ChatPrefs(hidden=False, activity_rows=None))
        assert store.prefs(scope) == ChatPrefs()
        assert store.prefs("telegram:-100:") == ChatPrefs()  # the chat without the topic

    # Notices ---------------------------------------------------------------------------

    def test_a_notice_is_recorded_once(self, store: StateStore) -> None:
        assert store.add_notice(ROUTE, "n1", "first", "pending") is True
        assert store.add_notice(ROUTE, "n1", "again", "pending") is False
        assert store.add_notice(OTHER, "n1", "same id, other route", "pending") is True
        assert [(p.route, p.notice_id, p.text) for p in store.pending_notices(ROUTE)] == [
            (ROUTE, "n1", "first")
        ]

    def test_pending_notices_in_recording_order_per_route(self, store: StateStore) -> None:
        for notice_id in ("a", "b", "c"):
            store.add_notice(ROUTE, notice_id, notice_id, "pending")
        store.add_notice(OTHER, "x", "x", "pending")
        store.add_notice(ROUTE, "quiet", "quiet", "suppressed")
        assert [p.notice_id for p in store.pending_notices(ROUTE)] == ["a", "b", "c"]
        assert {p.notice_id for p in store.pending_notices()} == {"a", "b", "c", "x"}

    @pytest.mark.parametrize("state", ["delivered", "failed", "suppressed"])
    def test_a_final_state_leaves_the_pending_list(self, store: StateStore, state: str) -> None:
        store.add_notice(ROUTE, "n1", "text", "pending")
        store.set_notice_state(ROUTE, "n1", state)  # type: ignore[arg-type]
        assert store.pending_notices() == []
        assert store.notice_counts() == {state: 1}

    def test_notice_counts_by_state(self, store: StateStore) -> None:
        store.add_notice(ROUTE, "a", "a", "pending")
        store.add_notice(ROUTE, "b", "b", "folded")
        store.add_notice(ROUTE, "c", "c", "folded")
        store.add_notice(OTHER, "d", "d", "pending")
        store.set_notice_state(OTHER, "d", "delivered")
        assert store.notice_counts() == {"pending": 1, "folded": 2, "delivered": 1}

    # Offsets, cursors, pauses ----------------------------------------------------------

    def test_offsets_per_agent_and_file(self, store: StateStore) -> None:
        assert store.get_offset("a", "notifications") is None
        store.set_offset("a", "notifications", 11, 2048)
        store.set_offset("b", "notifications", 12, 7)
        store.set_offset("a", "notifications", 13, 0)  # rotated: a new inode from its start
        assert store.get_offset("a", "notifications") == (13, 0)
        assert store.get_offset("b", "notifications") == (12, 7)

    def test_cursors(self, store: StateStore) -> None:
        assert store.get_cursor("telegram:update_offset") is None
        store.set_cursor("telegram:update_offset", "42")
        store.set_cursor("telegram:update_offset", "43")
        assert store.get_cursor("telegram:update_offset") == "43"

    def test_cursors_by_prefix_and_deleted(self, store: StateStore) -> None:
        store.set_cursor('report-wake:["a","b"]', "x")
        store.set_cursor('report-wake:["a","c*"]', "y")
        store.set_cursor("report-wakeful", "z")  # another prefix's start, not this one's
        store.set_cursor("agent-health:a", "[]")
        both = ['report-wake:["a","b"]', 'report-wake:["a","c*"]']
        assert store.cursor_keys('report-wake:["') == both
        assert store.cursor_keys("rep*") == []  # a plain prefix, not a pattern
        store.delete_cursors(['report-wake:["a","b"]', "never-set"])
        assert store.get_cursor('report-wake:["a","b"]') is None
        assert store.cursor_keys("report-wake:") == ['report-wake:["a","c*"]']
        assert store.get_cursor("agent-health:a") == "[]"
        store.delete_cursors([])

    def test_pauses_by_scope(self, store: StateStore) -> None:
        store.set_pause("telegram:bot", 2_000_000_000.0)
        store.set_pause("telegram:chat:-100", 1_900_000_000.5)
        store.set_pause("telegram:bot", 2_000_000_100.0)
        assert store.pauses() == {
            "telegram:bot": 2_000_000_100.0,
            "telegram:chat:-100": 1_900_000_000.5,
        }

    # Chats seen ------------------------------------------------------------------------

    def test_a_chat_seen_again_keeps_its_known_title(self, store: StateStore) -> None:
        store.record_chat(SeenChat("telegram", "-100", "7", "Builds", 10.0))
        store.record_chat(SeenChat("telegram", "-100", "7", None, 20.0))
        store.record_chat(SeenChat("feishu", "oc_1", None, "Ops", 15.0))
        assert store.seen_chats() == [
            SeenChat("telegram", "-100", "7", "Builds", 20.0),
            SeenChat("feishu", "oc_1", None, "Ops", 15.0),
        ]

    # Across a restart ------------------------------------------------------------------

    def test_everything_survives_a_restart(self, backend: Backend) -> None:
        store = backend.open()
        store.set_message_id(ROUTE, "m1")
        store.set_committed(ROUTE, "fp1", 99.0)
        store.set_prefs("telegram:-100:7", ChatPrefs(hidden=True))
        store.add_notice(ROUTE, "n1", "owed", "pending")
        store.add_notice(ROUTE, "n2", "sent", "pending")
        store.set_notice_state(ROUTE, "n2", "delivered")
        store.set_offset("a", "notifications", 5, 10)
        store.set_cursor("k", "v")
        store.set_pause("telegram:bot", 2_000_000_000.0)
        store.record_chat(SeenChat("telegram", "-100", None, "Builds", 1.0))
        store.close()
        again = backend.open()  # as the next run of the service finds it
        try:
            record = again.resident(ROUTE)
            assert record is not None and (record.message_id, record.fingerprint) == ("m1", "fp1")
            assert again.prefs("telegram:-100:7") == ChatPrefs(hidden=True)
            assert [p.notice_id for p in again.pending_notices()] == ["n1"]
            assert again.add_notice(ROUTE, "n2", "sent", "pending") is False
            assert again.get_offset("a", "notifications") == (5, 10)
            assert again.get_cursor("k") == "v"
            assert again.pauses() == {"telegram:bot": 2_000_000_000.0}
            assert [c.chat_id for c in again.seen_chats()] == ["-100"]
        finally:
            again.close()

    def test_a_healthy_store_has_nothing_waiting(self, store: StateStore) -> None:
        store.set_cursor("k", "v")
        assert store.health() is None
        assert store.retry_pending(force=True) is True


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_message_to_an_agent_keeps_the_command_it_answers(backend: Backend) -> None:
    record = InboxRecord(
        "m_1",
        "builder",
        "feishu",
        "oc_1",
        None,
        "ou_1",
        1000.0,
        reply_to_id="om_7",
        reply_thread_id="omt_a",
    )
    opened = backend.open()
    opened.add_inbox_message(record)
    opened.close()
    again = backend.open()
    assert again.inbox_messages(0.0) == [record]
    again.close()


def test_a_state_file_from_before_the_answered_command_is_taken_up(tmp_path: Path) -> None:
    # Its inbox table lacks the command's columns: they are added, its messages are kept.
    SqliteStore.in_dir(tmp_path).close()
    db = sqlite3.connect(tmp_path / STATE_FILE)
    db.execute("ALTER TABLE inbox DROP COLUMN reply_to_id")
    db.execute("ALTER TABLE inbox DROP COLUMN reply_thread_id")
    db.execute(
        "INSERT INTO inbox (message_id, agent_id, channel, chat_id, queued_at, outcome)"
        " VALUES ('m_0', 'builder', 'telegram', '-100', 5.0, 'open')"
    )
    db.commit()
    db.close()
    readonly = SqliteStore.in_dir(tmp_path, readonly=True)
    [old] = readonly.inbox_messages(0.0)
    assert old.reply_to_id is None
    readonly.close()
    store = SqliteStore.in_dir(tmp_path)
    store.add_inbox_message(replace(old, message_id="m_1", reply_to_id="om_1"))
    assert [r.reply_to_id for r in store.inbox_messages(0.0)] == [None, "om_1"]
    store.close()


def test_a_state_file_from_before_the_notices_agents_is_taken_up(tmp_path: Path) -> None:
    # It has no table of whose notice each message is: a read-only open (`taskcard status`)
    # finds none, and the service's open adds the table and keeps the rest.
    SqliteStore.in_dir(tmp_path).close()
    db = sqlite3.connect(tmp_path / STATE_FILE)
    db.execute("DROP TABLE notice_messages")
    db.execute("INSERT INTO cursors (key, value) VALUES ('k', 'v')")
    db.commit()
    db.close()
    readonly = SqliteStore.in_dir(tmp_path, readonly=True)
    assert readonly.notice_agent("telegram", "-100", ["57"], 1000.0) is None
    readonly.close()
    store = SqliteStore.in_dir(tmp_path)
    assert store.get_cursor("k") == "v"
    store.remember_notice("telegram", "-100", "57", "builder", 1000.0)
    assert store.notice_agent("telegram", "-100", ["57"], 1000.0) == "builder"
    store.close()
