"""The `StateStore` contract, checked on every backend: the embedded SQLite file and the
shared Redis. A behaviour the service relies on (a notice recorded once, a replacement that
clears the fingerprint, prefs and cursors across a reopen) must be the same on both."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from taskcard.bridge.store.base import (
    READ_BATCH,
    UNSURE_KEEP_PER_ROUTE,
    UNSURE_KEEP_S,
    ChatPrefs,
    InboxRecord,
    SeenChat,
    StateStore,
)
from taskcard.bridge.store.redis import CLAIM_AFTER, TURN_MS, RedisStore, connect
from taskcard.bridge.store.sqlite import SqliteStore

Opener = Callable[[], StateStore]


@pytest.fixture(params=["sqlite", "redis"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """A function that opens the same store again (a restart of the service)."""
    opened: list[StateStore] = []
    if request.param == "sqlite":

        def open_store() -> StateStore:
            opened.append(SqliteStore.in_dir(tmp_path))
            return opened[-1]
    else:
        url = request.getfixturevalue("redis_url")
        prefix = f"test-{uuid.uuid4().hex}"

        def open_store() -> StateStore:
            opened.append(RedisStore(connect(url), prefix))
            return opened[-1]

    yield open_store
    for store in opened:
        store.close()


def test_resident_fields_round_trip_and_survive_a_reopen(opener: Opener) -> None:
    store = opener()
    assert store.resident("r1") is None
    store.set_send_key("r1", "k1")
    store.set_unsure_sends("r1", 2, 100.5)
    record = store.resident("r1")
    assert record is not None and record.send_key == "k1" and record.unsure_sends == 2
    assert record.unsure_at == 100.5 and record.message_id is None
    store.set_message_id("r1", "42")
    store.set_committed("r1", "fp", 123.25)
    store.set_disabled("r1", "kicked")
    again = opener().resident("r1")
    assert again is not None
    assert (again.message_id, again.fingerprint, again.committed_at) == ("42", "fp", 123.25)
    assert again.send_key is None and again.unsure_sends == 0, "an id settles the send"
    assert again.disabled_reason == "kicked"
    store.set_disabled("r1", None)
    assert [r.route for r in store.residents()] == ["r1"]
    assert store.residents()[0].disabled_reason is None


def test_what_a_send_leaves_behind_is_written_in_one_call(opener: Opener) -> None:
    """`before_send`: the key and the unsure count together, each left as it is when not
    given; a later single write of either field still wins, and an id settles both."""
    store = opener()
    store.before_send("r", "k1", (1, 10.5))
    record = store.resident("r")
    assert record is not None
    assert (record.send_key, record.unsure_sends, record.unsure_at) == ("k1", 1, 10.5)
    store.before_send("r", None, (2, 20.0))  # a retry: the key kept
    store.before_send("r", None, None)  # nothing to write
    record = opener().resident("r")
    assert record is not None
    assert (record.send_key, record.unsure_sends, record.unsure_at) == ("k1", 2, 20.0)
    store.before_send("r", "k2", None)  # a channel that does not count
    store.set_unsure_sends("r", 1, None)
    record = store.resident("r")
    assert record is not None
    assert (record.send_key, record.unsure_sends, record.unsure_at) == ("k2", 1, None)
    store.set_message_id("r", "7")
    record = store.resident("r")
    assert record is not None and (record.send_key, record.unsure_sends) == (None, 0)


def test_forgetting_the_id_clears_the_fingerprint(opener: Opener) -> None:
    store = opener()
    store.set_message_id("r", "1")
    store.set_committed("r", "fp", 1.0)
    store.set_message_id("r", None)
    record = store.resident("r")
    assert record is not None and record.message_id is None and record.fingerprint is None


def test_replace_message_keeps_the_fingerprint_only_for_the_same_id(opener: Opener) -> None:
    store = opener()
    store.set_message_id("r", "1")
    store.set_committed("r", "fp", 1.0)
    store.replace_message("r", message_id="1", stale_message_id="0")
    record = store.resident("r")
    assert record is not None and record.fingerprint == "fp" and record.stale_message_id == "0"
    store.set_send_key("r", "k")
    store.replace_message("r", stale_message_id="1")
    record = store.resident("r")
    assert record is not None
    assert (record.message_id, record.fingerprint, record.stale_message_id) == (None, None, "1")
    assert record.send_key is None, "the replacement is a new send with a new key"
    store.set_send_key("r", "k2")
    store.replace_message("r", message_id="2")
    record = store.resident("r")
    assert record is not None and record.stale_message_id is None and record.send_key == "k2"


def test_an_owed_pin_is_kept_across_a_reopen_until_it_is_done(opener: Opener) -> None:
    store = opener()
    store.set_message_id("r", "1")
    store.set_pin_owed("r", "1")
    record = opener().resident("r")
    assert record is not None and (record.message_id, record.pin_owed_id) == ("1", "1")
    store.set_pin_owed("r", None)
    record = opener().resident("r")
    assert record is not None and record.pin_owed_id is None


def test_prefs_default_and_round_trip(opener: Opener) -> None:
    store = opener()
    assert store.prefs("telegram:1:") == ChatPrefs()
    store.set_prefs("telegram:1:", ChatPrefs(hidden=True, activity_rows=4))
    assert opener().prefs("telegram:1:") == ChatPrefs(hidden=True, activity_rows=4)


def test_a_notice_is_recorded_once_and_leaves_pending_by_state(opener: Opener) -> None:
    store = opener()
    assert store.add_notice("r", "n1", "first", "pending")
    assert not store.add_notice("r", "n1", "again", "pending"), "idempotent by (route, id)"
    assert store.add_notice("r", "n2", "second", "pending")
    assert store.add_notice("other", "n1", "elsewhere", "suppressed")
    pending = opener().pending_notices("r")
    assert [(p.notice_id, p.text) for p in pending] == [("n1", "first"), ("n2", "second")]
    assert [p.route for p in store.pending_notices()] == ["r", "r"]
    store.set_notice_state("r", "n1", "delivered")
    assert [p.notice_id for p in store.pending_notices()] == ["n2"]
    assert store.notice_counts() == {"delivered": 1, "pending": 1, "suppressed": 1}


def test_unsure_notices_are_listed_with_when_their_send_began(opener: Opener) -> None:
    """For `taskcard status`: what may be missing from a chat, and since when."""
    store = opener()
    for notice_id in ("n1", "n2", "n3"):
        assert store.add_notice("r", notice_id, f"text of {notice_id}", "pending")
    assert store.add_notice("other", "n1", "elsewhere", "pending")
    before = time.time()
    store.set_notice_state("r", "n2", "unsure")
    store.set_notice_state("other", "n1", "unsure")
    store.set_notice_state("r", "n3", "unsure")
    store.set_notice_state("r", "n3", "pending")  # answered without posting: pending again
    unsure = opener().unsure_notices("r")
    assert [(u.notice_id, u.text) for u in unsure] == [("n2", "text of n2")]
    assert unsure[0].since is not None and before - 1 <= unsure[0].since <= time.time() + 1
    assert sorted(u.route for u in store.unsure_notices()) == ["other", "r"]
    store.forget_agent("other", routes=["other"])
    assert [u.route for u in store.unsure_notices()] == ["r"]


def test_a_send_begins_only_from_pending_once(opener: Opener) -> None:
    """`mark_notice_unsure`: clustered, two instances can hold the same pending notice
    queued (the lease of its agent moved); one step turns it from `pending` to `unsure`, so
    the second to begin its send is refused and never posts it again."""
    store, other = opener(), opener()  # two instances on one store
    assert store.add_notice("r", "n1", "text of n1", "pending")
    assert store.mark_notice_unsure("r", "n1")
    assert not other.mark_notice_unsure("r", "n1"), "the first began its send"
    assert [u.notice_id for u in other.unsure_notices("r")] == ["n1"]
    assert other.pending_notices() == [] and other.notice_counts() == {"unsure": 1}
    store.set_notice_state("r", "n1", "pending")  # answered without posting: pending again
    assert other.mark_notice_unsure("r", "n1"), "pending again: a send may begin"
    assert not store.mark_notice_unsure("r", "n1")
    for state in ("delivered", "failed", "suppressed", "folded"):
        assert store.add_notice("r", state, f"a notice {state}", "pending")
        store.set_notice_state("r", state, state)  # type: ignore[arg-type]
        assert not other.mark_notice_unsure("r", state), f"{state}: never sent again"
    assert not store.mark_notice_unsure("r", "never-recorded")
    assert not store.mark_notice_unsure("other", "n1"), "another route's id"
    assert opener().notice_counts() == {
        "unsure": 1,
        "delivered": 1,
        "failed": 1,
        "suppressed": 1,
        "folded": 1,
    }


def test_offsets_cursors_and_pauses(opener: Opener) -> None:
    store = opener()
    assert store.get_offset("a", "notifications") is None
    store.set_offset("a", "notifications", 7, 1024)
    store.set_cursor("telegram:update_offset", "99")
    store.set_pause("telegram:bot", 1234.5)
    again = opener()
    assert again.get_offset("a", "notifications") == (7, 1024)
    assert again.get_cursor("telegram:update_offset") == "99"
    assert again.get_cursor("missing") is None
    assert again.pauses()["telegram:bot"] == 1234.5


def test_a_cursor_is_changed_from_the_value_it_holds(opener: Opener) -> None:
    """`change_cursor` hands the change the stored value (None when not set, "" when set
    empty) and keeps what it returns, across a reopen."""
    store = opener()
    seen: list[str | None] = []

    def add_a(value: str | None) -> str:
        seen.append(value)
        return (value or "") + "a"

    store.change_cursor("doc", add_a)
    store.change_cursor("doc", add_a)
    assert opener().get_cursor("doc") == "aa"
    store.set_cursor("doc", "")
    store.change_cursor("doc", add_a)
    assert seen == [None, "a", ""]
    assert opener().get_cursor("doc") == "a"


def test_a_cursor_is_replaced_or_deleted_only_while_it_holds_the_value_read(
    opener: Opener,
) -> None:
    """`replace_cursor_if` writes or deletes only while the cursor holds the value expected
    (not while unset, nor set empty when something else was expected), and says whether it
    did; a later reopen sees the outcome."""
    store = opener()
    assert not store.replace_cursor_if("note", "old", "new")
    assert not store.replace_cursor_if("note", "old", None)
    assert store.get_cursor("note") is None
    store.set_cursor("note", "old")
    assert not store.replace_cursor_if("note", "other", None)
    assert not store.replace_cursor_if("note", "", "new")
    assert opener().get_cursor("note") == "old"
    assert store.replace_cursor_if("note", "old", "")
    assert opener().get_cursor("note") == ""
    assert store.replace_cursor_if("note", "", "newer")
    store.change_cursor("note", lambda value: f"{value}!")  # its version still works
    assert store.replace_cursor_if("note", "newer!", None)
    assert opener().get_cursor("note") is None
    assert store.cursor_keys("no") == []


def test_a_cursor_change_is_made_again_on_a_write_that_came_in_between(redis_url: str) -> None:
    """Another instance writing the cursor between the read and the write of a change: the
    change is made again on what that instance wrote, never written over it."""
    prefix = f"test-{uuid.uuid4().hex}"
    store, other = RedisStore(connect(redis_url), prefix), RedisStore(connect(redis_url), prefix)
    store.set_cursor("doc", "x")
    seen: list[str | None] = []

    def add_y(value: str | None) -> str:
        seen.append(value)
        if len(seen) == 1:
            other.set_cursor("doc", f"{value}o")
        return f"{value}y"

    try:
        store.change_cursor("doc", add_y)
        assert seen == ["x", "xo"]
        assert other.get_cursor("doc") == "xoy"
    finally:
        store.close()
        other.close()


def _older_write(store: RedisStore, value: str) -> None:
    """What an older version's `change_cursor` writes: the value alone, no version."""
    store.client.hset(store.key("cursors"), "doc", value)


def test_a_cursor_an_older_version_stored_is_changed_from_its_value(redis_url: str) -> None:
    """A cursor without a version (written by an older version) is compared by its value:
    an older write between the read and the write of a change is seen; once changed, the
    cursor has its version."""
    store = RedisStore(connect(redis_url), f"test-{uuid.uuid4().hex}")
    _older_write(store, "x")
    seen: list[str | None] = []

    def add_y(value: str | None) -> str:
        seen.append(value)
        if len(seen) == 1:
            _older_write(store, f"{value}o")
        return f"{value}y"

    try:
        store.change_cursor("doc", add_y)
        assert seen == ["x", "xo"]
        assert store.get_cursor("doc") == "xoy"
        assert store.client.get(store.key("cursor-version", "doc")) is not None
        store.change_cursor("doc", lambda value: f"{value}z")
        assert store.get_cursor("doc") == "xoyz"
    finally:
        store.close()


def test_an_older_instance_alive_writing_without_the_version_is_not_written_over(
    redis_url: str,
) -> None:
    """While a live instance has not listed itself as writing versions (an older version, in
    `P:instances` alone), a change compares the value: that instance's write between the read
    and the write is seen, though the version did not move. Once only instances of this
    version live, the version alone decides."""
    store = RedisStore(connect(redis_url), f"test-{uuid.uuid4().hex}")
    far = 10**13  # listed until long after the test (epoch ms)
    store.client.zadd(store.key("instances"), {"new#1": far, "old#2": far})
    # A newer instance listed as versioned alone (its live listing refused, or a stale
    # entry): the lists were compared by their counts, two each, and the older one was hidden.
    store.client.zadd(store.key("versioned"), {"new#1": far, "new#3": far})
    store.change_cursor("doc", lambda value: "x")  # stored with a version
    seen: list[str | None] = []

    def add_y(value: str | None) -> str:
        seen.append(value)
        if len(seen) == 1:
            _older_write(store, f"{value}o")
        return f"{value}y"

    try:
        store.change_cursor("doc", add_y)
        assert seen == ["x", "xo"]
        assert store.get_cursor("doc") == "xoy"
    finally:
        store.close()


def test_a_versioned_listing_of_another_type_counts_as_an_older_instance_live(
    redis_url: str,
) -> None:
    """`P:versioned` holding another type (something else on the prefix): Redis refuses the
    listing, which cannot vouch for the live instances; the change compares the value, so an
    older instance's write between the read and the write is seen."""
    store = RedisStore(connect(redis_url), f"test-{uuid.uuid4().hex}")
    store.client.zadd(store.key("instances"), {"old#2": 10**13})
    store.client.set(store.key("versioned"), "not a sorted set")
    store.change_cursor("doc", lambda value: "x")
    seen: list[str | None] = []

    def add_y(value: str | None) -> str:
        seen.append(value)
        if len(seen) == 1:
            _older_write(store, f"{value}o")
        return f"{value}y"

    try:
        store.change_cursor("doc", add_y)
        assert seen == ["x", "xo"]
        assert store.get_cursor("doc") == "xoy"
    finally:
        store.close()


def against_a_writer_without_pause(
    store: RedisStore, hog: RedisStore, change: Callable[[str | None], str]
) -> int:
    """`store.change_cursor("doc", change)` while `hog` changes "doc" without pause (adding an
    "h") from a thread; the cursor then holds the change once and every one of `hog`'s, and
    no turn is left. How many changes `hog` made."""
    stop, hog_writes, failures = threading.Event(), [0], []

    def write_without_pause() -> None:
        try:
            while not stop.is_set():
                hog.change_cursor("doc", lambda value: f"{value or ''}h")
                hog_writes[0] += 1
        except Exception as error:  # a failure in the thread fails the test
            failures.append(error)

    thread = threading.Thread(target=write_without_pause)
    thread.start()
    try:
        while hog_writes[0] < 5 and thread.is_alive():
            time.sleep(0.001)
        store.change_cursor("doc", change)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not failures
    assert not thread.is_alive()
    stored = store.get_cursor("doc") or ""
    assert stored.count("v") == 1
    assert stored.count("h") == hog_writes[0]  # the other writer lost nothing either
    assert store.client.exists(store.key("cursor-turn", "doc")) == 0
    return hog_writes[0]


@pytest.mark.parametrize("older_live", [False, True], ids=["by-version", "by-value"])
def test_a_writer_that_keeps_losing_to_one_writing_without_pause_takes_its_turn(
    redis_url: str, older_live: bool
) -> None:
    """One instance changes the cursor without pause while another's change takes longer
    than the first's whole try: every write of the first landed inside the second's try,
    which lost each race and gave up (`CursorContended`), its change never made. The second
    now takes the cursor's turn after a few lost tries, the first waits for it, and both keep
    every change. By the version, and by the value (an older instance listed as live)."""
    prefix = f"test-{uuid.uuid4().hex}"
    store, hog = RedisStore(connect(redis_url), prefix), RedisStore(connect(redis_url), prefix)
    if older_live:
        store.client.zadd(store.key("instances"), {"old#2": 10**13})

    def slow_add_v(value: str | None) -> str:
        time.sleep(0.02)  # several of the other writer's whole tries
        return f"{value or ''}v"

    try:
        written = against_a_writer_without_pause(store, hog, slow_add_v)
        assert written > 5  # it wrote on after the turn was given back
    finally:
        store.close()
        hog.close()


def test_a_turn_left_by_a_writer_that_stopped_holds_the_others_only_until_it_lapses(
    redis_url: str,
) -> None:
    """A writer that took the cursor's turn and stopped before writing (killed, its host
    gone) leaves the turn behind: the others wait until it lapses, then change the cursor;
    nothing is written while it is held."""
    store = RedisStore(connect(redis_url), f"test-{uuid.uuid4().hex}")
    turn = store.key("cursor-turn", "doc")
    store.change_cursor("doc", lambda value: "x")
    store.client.set(turn, "a writer that stopped", px=300)
    seen: list[str | None] = []

    def add_y(value: str | None) -> str:
        seen.append(value)
        assert store.client.exists(turn) == 0, "changed while another writer held the turn"
        return f"{value}y"

    try:
        store.change_cursor("doc", add_y)
        assert store.get_cursor("doc") == "xy"
        assert seen == ["x"]
    finally:
        store.close()


def test_a_writer_whose_turn_lapses_during_a_slow_change_still_writes_it(redis_url: str) -> None:
    """A writer that took the cursor's turn and then took longer than the turn lasts (a
    loaded host): nobody else wrote meanwhile, so its change is written. It watched its own
    turn, whose lapse refused its write at every try until it gave up, the change unmade."""
    prefix = f"test-{uuid.uuid4().hex}"
    store, other = RedisStore(connect(redis_url), prefix), RedisStore(connect(redis_url), prefix)
    store.change_cursor("doc", lambda value: "x")
    calls: list[str | None] = []

    def add_s(value: str | None) -> str:
        calls.append(value)
        if len(calls) <= CLAIM_AFTER:  # another writer wins each of the first tries
            other.change_cursor("doc", lambda value: f"{value}o")
        else:  # under its turn now: slower than the turn lasts
            time.sleep(TURN_MS / 1000 + 0.3)
        return f"{value}s"

    try:
        store.change_cursor("doc", add_s)
        assert store.get_cursor("doc") == "x" + "o" * CLAIM_AFTER + "s"
        assert len(calls) == CLAIM_AFTER + 1
    finally:
        store.close()
        other.close()


def test_a_writer_whose_turn_lapsed_and_lost_to_one_that_waited_takes_the_turn_again(
    redis_url: str,
) -> None:
    """The turn's writer took longer than the turn lasts, and the writer that waited for it
    wrote once it lapsed. That loss was taken for one to an older release, which knows no
    turns: the slow writer gave up taking turns, lost every race to the other from then on,
    and gave up with its change unmade. It takes the turn again, and writes."""
    prefix = f"test-{uuid.uuid4().hex}"
    store, hog = RedisStore(connect(redis_url), prefix), RedisStore(connect(redis_url), prefix)
    store.change_cursor("doc", lambda value: "x")
    calls = [0]

    def add_v(value: str | None) -> str:
        calls[0] += 1
        # Under its first turn, slower than the turn lasts; else slower than the other
        # writer's whole try, so that it wins only under a turn.
        time.sleep(TURN_MS / 1000 + 0.2 if calls[0] == CLAIM_AFTER + 1 else 0.02)
        return f"{value}v"

    try:
        against_a_writer_without_pause(store, hog, add_v)
    finally:
        store.close()
        hog.close()


@pytest.mark.parametrize("lapse_ms", [None, 3_600_000], ids=["no-lapse", "an-hour"])
def test_a_turn_no_writer_could_have_set_is_ignored_and_cleared(
    redis_url: str, lapse_ms: int | None
) -> None:
    """A turn key with no lapse, or a longer one than any writer sets (written by hand, or
    restored), held every change of the cursor for good."""
    store = RedisStore(connect(redis_url), f"test-{uuid.uuid4().hex}")
    turn = store.key("cursor-turn", "doc")
    store.client.set(turn, "not a writer's", px=lapse_ms)
    try:
        store.change_cursor("doc", lambda value: "x")
        store.change_cursor("doc", lambda value: f"{value}y")
        assert store.get_cursor("doc") == "xy"
        assert store.client.exists(turn) == 0
    finally:
        store.close()


def test_a_writer_beaten_under_its_turn_by_an_older_release_gives_the_turn_back(
    redis_url: str,
) -> None:
    """During a rolling update an instance of an older release, which knows no turns, can
    still write while a writer holds the turn. That writer gives the turn back then, and does
    not take it again: the writers of this release waiting for it were held up at each try."""
    store = RedisStore(connect(redis_url), f"test-{uuid.uuid4().hex}")
    store.client.zadd(store.key("instances"), {"old#2": 10**13})  # an older release is live
    turn = store.key("cursor-turn", "doc")
    _older_write(store, "x")
    held: list[int] = []

    def add_y(value: str | None) -> str:
        held.append(store.client.exists(turn))
        if len(held) <= CLAIM_AFTER + 2:
            _older_write(store, f"{value}o")
        return f"{value}y"

    try:
        store.change_cursor("doc", add_y)
        assert store.get_cursor("doc") == "x" + "o" * (CLAIM_AFTER + 2) + "y"
        assert held == [0] * CLAIM_AFTER + [1] + [0, 0]
    finally:
        store.close()


def test_batch_reads_answer_as_the_single_reads_do(opener: Opener) -> None:
    """`residents_of`, `get_offsets` and `get_cursors` (the service's reads at start, for
    every agent at once) give what `resident`, `get_offset` and `get_cursor` give for each
    key, over more keys than one batch names, across a reopen, and with what a store keeps
    in memory before committing it (first-sight offsets, fingerprints)."""
    store = opener()
    agents = [f"a{i}" for i in range(READ_BATCH + 150)]
    for i, agent in enumerate(agents[::3]):
        store.set_offset(agent, "notifications", i + 1, 10 * i)
        store.set_cursor(f"agent-health:{agent}", '["error"]')
        store.set_message_id(f"telegram:-100::{agent}", str(i))
    store.set_offset(agents[1], "reports", 4, 44)  # one file of an agent, not the others
    store.set_cursor("empty", "")
    store.set_send_key("telegram:-100::sending", "k1")
    store.set_unsure_sends("telegram:-100::sending", 2, 5.5)
    for reader in (store, opener()):  # as written, then as the next start finds it
        pairs = [(a, name) for a in agents for name in ("notifications", "reports")]
        offsets = reader.get_offsets([*pairs, ("a0", "notifications")])  # asked twice: once
        assert offsets == {
            pair: found for pair in pairs if (found := reader.get_offset(*pair)) is not None
        }
        assert offsets[("a3", "notifications")] == (2, 10) and offsets[("a1", "reports")] == (4, 44)
        keys = [f"agent-health:{a}" for a in agents] + ["empty", "never-set"]
        cursors = reader.get_cursors(keys)
        assert cursors == {k: v for k in keys if (v := reader.get_cursor(k)) is not None}
        assert cursors["empty"] == "" and len(cursors) == len(agents[::3]) + 1
        routes = [f"telegram:-100::{a}" for a in agents] + ["telegram:-100::sending"]
        residents = reader.residents_of(routes)
        assert residents == {r: found for r in routes if (found := reader.resident(r)) is not None}
        assert residents["telegram:-100::sending"].unsure_sends == 2
        assert len(residents) == len(agents[::3]) + 1
    assert (store.get_offsets([]), store.get_cursors([]), store.residents_of([])) == ({}, {}, {})
    store.set_first_offset("new", "notifications", 9, 90)  # SQLite keeps it uncommitted a while
    store.set_committed("telegram:-100::a0", "fp", 7.0)  # and the fingerprint likewise
    store.set_committed("telegram:-100::fresh", "fp2", 8.0)
    assert store.get_offsets([("new", "notifications")]) == {("new", "notifications"): (9, 90)}
    shown = store.residents_of(["telegram:-100::a0", "telegram:-100::fresh"])
    assert shown["telegram:-100::a0"] == store.resident("telegram:-100::a0")
    assert shown["telegram:-100::a0"].fingerprint == "fp"
    assert shown["telegram:-100::fresh"] == store.resident("telegram:-100::fresh")


def test_seen_chats_keep_a_known_title(opener: Opener) -> None:
    store = opener()
    store.record_chat(SeenChat("telegram", "-1", None, "Ops", 10.0))
    store.record_chat(SeenChat("telegram", "-1", None, None, 20.0))
    store.record_chat(SeenChat("feishu", "oc_1", None, "Team", 15.0))
    chats = opener().seen_chats()
    assert [(c.chat_id, c.title, c.last_seen) for c in chats] == [
        ("-1", "Ops", 20.0),
        ("oc_1", "Team", 15.0),
    ]


def test_messages_the_service_sent_are_known_by_channel_across_a_reopen(opener: Opener) -> None:
    store = opener()
    assert not store.sent_any("feishu", ["om_1"], 1000.0)
    store.remember_sent("feishu", "om_1", 1000.0)
    again = opener()
    assert again.sent_any("feishu", ["om_0", "om_1"], 1001.0)
    assert not again.sent_any("telegram", ["om_1"], 1001.0), "another channel's id"
    assert not again.sent_any("feishu", ["om_2"], 1001.0)
    assert not again.sent_any("feishu", [], 1001.0)


def test_whose_notice_a_message_is_is_known_in_its_chat_across_a_reopen(opener: Opener) -> None:
    # Telegram numbers messages per chat: the same id in another chat is another message.
    store = opener()
    assert store.notice_agent("telegram", "-100", ["57"], 1000.0) is None
    store.remember_notice("telegram", "-100", "57", "builder", 1000.0)
    store.remember_notice("feishu", "oc_1", "om_9", "tester", 1000.0)
    again = opener()
    assert again.notice_agent("telegram", "-100", ["56", "57"], 1001.0) == "builder"
    assert again.notice_agent("telegram", "-200", ["57"], 1001.0) is None, "another chat"
    assert again.notice_agent("feishu", "-100", ["57"], 1001.0) is None, "another channel"
    assert again.notice_agent("feishu", "oc_1", ["om_9"], 1001.0) == "tester"
    assert again.notice_agent("feishu", "oc_1", [], 1001.0) is None


def test_of_several_notices_replied_to_the_first_named_wins(opener: Opener) -> None:
    # The ids of a reply come most telling first; both stores answer alike (one kept the
    # newest notice, the other the first id).
    store = opener()
    store.remember_notice("telegram", "-100", "57", "builder", 1000.0)
    store.remember_notice("telegram", "-100", "58", "tester", 1001.0)
    again = opener()
    assert again.notice_agent("telegram", "-100", ["57", "58"], 1002.0) == "builder"
    assert again.notice_agent("telegram", "-100", ["58", "57"], 1002.0) == "tester"
    assert again.notice_agent("telegram", "-100", ["56", "58", "57"], 1002.0) == "tester"


def test_an_agent_that_left_is_forgotten_and_nothing_of_another(opener: Opener) -> None:
    """Everything kept for one agent goes, in every chat; an agent whose id ends the same
    way, or is a prefix of it, keeps all of its own."""
    store = opener()
    mine = ["telegram:-100:7:gone", "feishu:oc_1::gone"]
    theirs = ["telegram:-100:7:stays", "telegram:-100:7:notgone", "telegram:-100:7:gone.2"]
    for route in mine + theirs:
        store.set_message_id(route, f"m-{route}")
        store.set_committed(route, "fp", 1.0)
        assert store.add_notice(route, "n1", f"text of {route}", "pending")
    assert store.add_notice("wake:gone", "child:1", "a wake", "pending")
    assert store.add_notice("wake:stays", "child:1", "a wake", "delivered")
    for agent in ("gone", "stays", "gone.2"):
        store.set_offset(agent, "notifications", 1, 10)
        store.set_first_offset(agent, "acks", 2, 20)
        store.add_inbox_message(
            InboxRecord(f"msg-{agent.replace('.', '')}", agent, "telegram", "-100", None, "u", 5.0)
        )
    store.set_cursor("notices:folded:telegram:-100:7:gone", "{}")
    store.set_cursor("notices:folded:telegram:-100:7:stays", "{}")
    store.set_cursor("agent-health:gone", "[]")
    store.set_cursor("agent-health:gone.2", "[]")
    assert store.offset_agents() == {"gone", "stays", "gone.2"}

    store.forget_agent(
        "gone",
        routes=["wake:gone"],
        cursors=["agent-health:gone"],
        cursor_prefixes=["notices:folded:"],
    )
    for again in (store, opener()):  # what went stays gone after a restart
        assert [r.route for r in again.residents()] == sorted(theirs)
        assert {n.route for n in again.pending_notices()} == set(theirs)
        assert again.get_offset("gone", "notifications") is None
        assert again.get_offset("gone", "acks") is None
        assert again.get_offset("gone.2", "acks") == (2, 20)
        assert again.offset_agents() == {"stays", "gone.2"}
        assert sorted(r.agent_id for r in again.inbox_messages(0.0)) == ["gone.2", "stays"]
        assert again.cursor_keys("notices:folded:") == ["notices:folded:telegram:-100:7:stays"]
        assert again.cursor_keys("agent-health:") == ["agent-health:gone.2"]
        assert again.notice_counts() == {"pending": 3, "delivered": 1}
    # Recorded again later (the agent came back after all): a fresh start, not a duplicate.
    assert store.add_notice(mine[0], "n1", "again", "pending")
    store.forget_agent("never-seen")


def test_a_shared_first_claim_is_kept_for_every_instance(redis_url: str) -> None:
    prefix = f"test-{uuid.uuid4().hex}"
    first, second = RedisStore(connect(redis_url), prefix), RedisStore(connect(redis_url), prefix)
    try:
        assert first.first_claim("cancel:x:1", "m_a", 60) == "m_a"
        assert second.first_claim("cancel:x:1", "m_b", 60) == "m_a"
        assert second.first_claim("cancel:x:2", "", 60) == ""
        assert first.first_claim("cancel:x:2", "m_c", 60) == "", "an empty decision is one"
    finally:
        first.close()
        second.close()


def test_redis_batch_reads_skip_a_bad_value_and_name_a_key_of_another_type(
    redis_url: str,
) -> None:
    """Read in a batch as alone: an offset that does not parse is absent (the good ones beside
    it are read), a resident key holding another type is `WrongKeyType` naming the key."""
    import redis as redis_py

    from taskcard.bridge.store.redis import WrongKeyType

    prefix = f"test-{uuid.uuid4().hex}"
    store = RedisStore(connect(redis_url), prefix)
    client = redis_py.Redis.from_url(redis_url, decode_responses=True)
    try:
        store.set_offset("good", "notifications", 3, 30)
        client.hset(f"{prefix}:offsets", json.dumps(["bad", "notifications"]), "garbage")
        pairs = [("good", "notifications"), ("bad", "notifications")]
        assert store.get_offsets(pairs) == {("good", "notifications"): (3, 30)}
        assert store.get_offset("bad", "notifications") is None
        store.set_message_id("ok", "1")
        client.set(f"{prefix}:res:odd", "a string")
        with pytest.raises(WrongKeyType) as alone:
            store.resident("odd")
        with pytest.raises(WrongKeyType) as batched:
            store.residents_of(["ok", "odd"])
        assert str(batched.value) == str(alone.value)
        assert f"{prefix}:res:odd is a string, not the hash" in str(batched.value)
    finally:
        client.close()
        store.close()


def test_a_set_of_names_keeps_each_member_once_across_a_reopen(opener: Opener) -> None:
    """`add_to_set`, `set_members`, `remove_from_set`: the agents that owe wakes, read in one
    call whatever else the store keeps; one set's members are not another's."""
    store = opener()
    assert store.set_members("owed-wakes") == []
    store.add_to_set("owed-wakes", ["lead", "a:b", "lead"])
    store.add_to_set("owed-wakes", ["z"])
    store.add_to_set("other", ["lead"])
    store.add_to_set("owed-wakes", [])
    store.set_cursor("owed-wake-tries:x", "{}")
    assert opener().set_members("owed-wakes") == ["a:b", "lead", "z"]
    store.remove_from_set("owed-wakes", ["lead", "never-added"])
    store.remove_from_set("owed-wakes", [])
    assert opener().set_members("owed-wakes") == ["a:b", "z"]
    assert store.set_members("other") == ["lead"]


def test_redis_set_members_skip_odd_ones_named_once(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A member no instance writes (not UTF-8, or huge: a hand's, or a hostile writer's with
    the Redis user's rights) is left out, the others read; each is named once in the log,
    a huge one by its start only."""
    import redis as redis_py

    prefix = f"test-{uuid.uuid4().hex}"
    store = RedisStore(connect(redis_url), prefix)
    client = redis_py.Redis.from_url(redis_url)
    try:
        store.add_to_set("owed-wakes", ["lead"])
        client.sadd(f"{prefix}:set:owed-wakes", b"\xff\xfe", b"H" * 100_000)
        for _ in range(3):
            assert store.set_members("owed-wakes") == ["lead"]
        lines = [r.getMessage() for r in caplog.records if prefix in r.getMessage()]
        assert len(lines) == 2, lines
        assert any("is not UTF-8" in line for line in lines), lines
        [huge] = [line for line in lines if "longer than" in line]
        assert "(100000 bytes)" in huge and len(huge) < 1000, huge
    finally:
        client.close()
        store.close()


def test_a_redis_refusal_is_told_with_what_to_do(redis_url: str) -> None:
    """What the command path logs when Redis fails: the trouble and the fix, from the
    answers a real Redis gives (never the error's own text, which can quote a key)."""
    import redis as redis_py

    from taskcard.bridge.store.redis import redis_trouble

    client = redis_py.Redis.from_url(redis_url)
    key = f"trouble-{uuid.uuid4().hex[:8]}"
    client.set(key, "a string")
    try:
        with pytest.raises(redis_py.RedisError) as wrong:
            client.hget(key, "field")
        assert "WRONGTYPE" in redis_trouble(wrong.value) and "key_prefix" in redis_trouble(
            wrong.value
        )
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        try:
            with pytest.raises(redis_py.RedisError) as oom:
                client.set(key, "more")
        finally:
            client.config_set("maxmemory", 0)
        assert "(OOM)" in redis_trouble(oom.value) and "maxmemory" in redis_trouble(oom.value)
    finally:
        client.delete(key)
        client.close()
    assert "(READONLY)" in redis_trouble(redis_py.ReadOnlyError("replica"))
    assert "primary" in redis_trouble(redis_py.ReadOnlyError("replica"))
    assert "(ConnectionError)" in redis_trouble(redis_py.ConnectionError("x:6379"))
    assert "(NOREPLICAS)" in redis_trouble(redis_py.ResponseError("NOREPLICAS Not enough"))


def test_a_wrong_type_met_inside_a_script_is_known_as_one_on_every_redis(redis_url: str) -> None:
    """The reads that every instance repeats go through scripts (`capped_hash`). Redis 7
    passes a command's WRONGTYPE out of a script as it is; Redis 6.2, which the operators
    guide supports, wraps it ("ERR Error running script ..."), and the checks for WRONGTYPE
    that looked at the start of the answer took a key of another type for a failure of
    Redis: a command waited in line behind it instead of on its own."""
    import redis as redis_py

    from taskcard.bridge.store.redis import answered, capped_hash, redis_trouble

    client = redis_py.Redis.from_url(redis_url)
    key = f"trouble-{uuid.uuid4().hex[:8]}"
    client.set(key, "a string")
    try:
        with pytest.raises(redis_py.ResponseError) as real:
            capped_hash(client, key, 1024, 100, 1 << 20)
    finally:
        client.delete(key)
        client.close()
    # Redis 6.2's answer as redis-py raises it (the leading "ERR " taken off), and as sent.
    older = (
        "Error running script (call to f_6c0cf1f3a6b95ee4a6ef0bbd6ed8da9b0ee4d5bf):"
        " @user_script:7: WRONGTYPE Operation against a key holding the wrong kind of value"
    )
    for error in (
        real.value,
        redis_py.ResponseError(older),
        redis_py.ResponseError("ERR " + older),
        redis_py.ResponseError("WRONGTYPE Operation against a key"),
    ):
        assert answered(error, "WRONGTYPE"), error
        assert "(WRONGTYPE)" in redis_trouble(error), error
    for other in (
        redis_py.ResponseError("Error running script (call to f_1): @user_script:3: NOPERM x"),
        redis_py.ResponseError("ERR unknown command 'WRONGTYPE'"),
        redis_py.ResponseError("NOPERM this user has no permissions to access the 'WRONGTYPE' key"),
    ):
        assert not answered(other, "WRONGTYPE"), other


def test_a_field_over_the_cap_is_named_with_a_fix_that_finds_it(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A script hands over the first 200 bytes of the name of a field it leaves out: the
    log's fix said `HDEL KEY <those 200 bytes>`, which deletes nothing. A name shown whole
    still gets its `HDEL`; one cut short, or with a space, how to find it by its start."""
    import redis as redis_py

    from taskcard.bridge.store.redis import capped_fields, capped_hash

    client = redis_py.Redis.from_url(redis_url)
    key = f"over-{uuid.uuid4().hex[:8]}"
    long_name, spaced = "n" * 300, "two words"
    client.hset(key, mapping={long_name: "x" * 2000, spaced: "x" * 2000, "short": "x" * 2000})
    client.hset(key, "fine", "ok")
    try:
        with caplog.at_level(logging.WARNING):
            found = capped_fields(key, capped_hash(client, key, 1000, 100, 1 << 20), 1000, 100, 1)
    finally:
        client.delete(key)
        client.close()
    assert found == {"fine": "ok"}
    lines = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    [cut] = [line for line in lines if "nnnn" in line]
    assert "(its start)" in cut and f"HSCAN {key} 0 MATCH {'n' * 40}*" in cut, cut
    assert f"HDEL {key} n" not in cut, cut
    [with_space] = [line for line in lines if spaced in line]
    assert f"HSCAN {key} 0 MATCH two*" in with_space, with_space
    [short] = [line for line in lines if "field short " in line]
    assert f"(HDEL {key} short)" in short, short


def test_unsure_notices_are_kept_to_their_bound(opener: Opener) -> None:
    """Notices recorded `unsure` were never forgotten: a route whose answers kept getting
    lost grew its list, and every `taskcard status` read of it, without end. Each route
    keeps its newest `UNSURE_KEEP_PER_ROUTE`, for `UNSURE_KEEP_S`; other notices stay."""
    store = opener()
    many = [f"n{i:03}" for i in range(UNSURE_KEEP_PER_ROUTE + 3)]
    for route, ids in (("busy", many), ("calm", ["c1", "c2"])):
        for notice_id in ids:
            assert store.add_notice(route, notice_id, f"text {notice_id}", "pending")
            store.set_notice_state(route, notice_id, "unsure")
    store.add_notice("calm", "sent", "delivered one", "pending")
    store.set_notice_state("calm", "sent", "delivered")
    now = time.time()
    store.prune_unsure_notices(now, "calm")  # another route's count is left alone
    assert len(store.unsure_notices("busy")) == len(many)
    store.prune_unsure_notices(now)
    store = opener()  # as a restart reads it
    assert [n.notice_id for n in store.unsure_notices("busy")] == many[3:], "the newest kept"
    assert [n.notice_id for n in store.unsure_notices("calm")] == ["c1", "c2"]
    assert store.notice_counts().get("unsure") == UNSURE_KEEP_PER_ROUTE + 2
    assert not store.add_notice("calm", "sent", "delivered one", "pending"), "still known"
    # A forgotten one is failed, never taken as new again: read again, it would be sent twice.
    assert not store.add_notice("busy", many[0], f"text {many[0]}", "pending"), "forgotten"
    assert store.notice_counts() == {
        "unsure": UNSURE_KEEP_PER_ROUTE + 2,
        "failed": 3,
        "delivered": 1,
    }
    store.prune_unsure_notices(now + UNSURE_KEEP_S + 60, "calm")  # the age bound: every route
    assert store.unsure_notices() == []
    total = len(many) + 2
    assert store.notice_counts() == {"delivered": 1, "failed": total}
    assert store.pending_notices() == []
