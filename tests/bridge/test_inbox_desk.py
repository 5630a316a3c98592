"""The inbox desk's bookkeeping: a card change looks only at its agent's open messages, and
closed messages leave memory once they are history (a long-running service that relayed many
messages must not keep, or scan, every one of them)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from taskcard.bridge.config import InboxConfig
from taskcard.bridge.inbox.writer import InboxRefused, InboxWriter
from taskcard.bridge.run.inbox_desk import (
    KEEP_CLOSED_S,
    OWED_AGENTS,
    OWED_LOOK_S,
    OWED_WAKE_CURSOR,
    REPORTS_CUT_LINE,
    InboxDesk,
    _stored_tries,
    _stored_wake,
    _wake_ident,
    joined_report_wakes,
    owed_tries_cursor,
    status_key,
)
from taskcard.bridge.schedule.scheduler import RouteScheduler
from taskcard.bridge.store.redis import RedisStore, connect
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.bridge.track.activity import ActivitySummary
from taskcard.channels.base import ChatRef
from taskcard.producers.reports.contract import MAX_TEXT_CHARS, Ack, inbox_message
from tests.bridge.test_scheduler import ScriptedChannel, settle, started, store  # noqa: F401

CHAT = ChatRef("-100")


def clocked_desk(
    store: SqliteStore | RedisStore,  # noqa: F811
    scheduler: RouteScheduler,
    channel: ScriptedChannel,
    workdirs: dict[str, Path],
    now: list[datetime],
    *,
    shared: bool = False,
) -> InboxDesk:
    """A desk on the fake channel whose clock is `now[0]`, its agents always running;
    `shared`: one instance of a cluster on a store the others share."""
    return InboxDesk(
        InboxConfig(max_messages=100),
        store,
        scheduler,
        {"fake": channel},
        workdirs,
        clock=lambda: now[0],
        activity=lambda _agent: ActivitySummary(state="running"),
        zone=lambda _channel, _chat: UTC,
        render=lambda ch, view: ch.render_card(view),
        shared=shared,
    )


class Desks:
    """What a test of a desk starts from: each agent's workdir made under `tmp_path`, the
    fake channel, a started scheduler on `store` and a clock at 2026-12-01 09:00 UTC
    (`now[0]`, moved by the test); `desk()` makes a desk on them (`clocked_desk`)."""

    def __init__(
        self,
        tmp_path: Path,
        store: SqliteStore | RedisStore,  # noqa: F811
        scheduler: RouteScheduler,
        channel: ScriptedChannel,
        agents: Iterable[str],
    ) -> None:
        self.store, self.scheduler, self.channel = store, scheduler, channel
        self.workdirs = {agent: tmp_path / agent for agent in agents}
        for workdir in self.workdirs.values():
            workdir.mkdir()
        self.now = [datetime(2026, 12, 1, 9, 0, tzinfo=UTC)]

    def desk(self) -> InboxDesk:
        return clocked_desk(self.store, self.scheduler, self.channel, self.workdirs, self.now)

    def cluster(self, stores: list[RedisStore]) -> list[InboxDesk]:
        """One desk per instance of a cluster, each on its own connection (`stores`)."""
        return [
            clocked_desk(shared, self.scheduler, self.channel, self.workdirs, self.now, shared=True)
            for shared in stores
        ]


async def desks(
    tmp_path: Path,
    store: SqliteStore | RedisStore,  # noqa: F811
    *agents: str,
) -> Desks:
    """`Desks` for `agents`, on a scheduler started on `store`."""
    channel = ScriptedChannel()
    return Desks(tmp_path, store, await started(store, channel), channel, agents)


ClusterDesks = Callable[..., Awaitable[tuple[list[RedisStore], Desks]]]


@pytest.fixture
async def cluster_desks(tmp_path: Path, redis_url: str) -> AsyncIterator[ClusterDesks]:
    """`cluster_desks(count, *agents)`: `count` connections to one new key prefix on the
    test Redis, and `Desks` for `agents` on a scheduler started on the first (`Desks.cluster`
    makes their desks); the scheduler stopped and the connections closed after the test."""
    made: list[tuple[list[RedisStore], Desks]] = []

    async def make(count: int, *agents: str) -> tuple[list[RedisStore], Desks]:
        prefix = f"test-{uuid.uuid4().hex}"
        stores = [RedisStore(connect(redis_url), prefix) for _ in range(count)]
        made.append((stores, await desks(tmp_path, stores[0], *agents)))
        return made[-1]

    yield make
    for stores, each in made:
        await each.scheduler.stop()
        for shared in stores:
            shared.close()


async def test_closed_messages_leave_memory_after_a_day_and_open_ones_stay(
    tmp_path: Path,
    store: SqliteStore,  # noqa: F811
) -> None:
    made = await desks(tmp_path, store, "a", "b")
    scheduler, now, desk = made.scheduler, made.now, made.desk()
    desk.channel_ready("fake")
    for agent in ("a", "a", "b"):
        assert desk.queue("fake", CHAT, agent, "ann", f"hello {agent}") is None
    records = {r.message_id: r for r in store.inbox_messages(0)}
    first_a, second_a = (i for i, r in records.items() if r.agent_id == "a")
    (only_b,) = (i for i, r in records.items() if r.agent_id == "b")
    assert desk.open_messages() == 3

    desk.on_acks("a", [Ack(first_a, now[0], "hook")])
    desk.on_acks("b", [Ack(first_a, now[0], "hook")])  # another agent's id: not b's to close
    assert desk.open_messages() == 2
    await settle(scheduler)
    delivered = status_key(records[first_a])
    assert scheduler.message_id(delivered) is not None

    now[0] += timedelta(seconds=KEEP_CLOSED_S - 60)
    desk.refresh()  # the timer: a day has not passed since it closed
    assert scheduler.message_id(delivered) is not None

    now[0] += timedelta(seconds=120)
    desk.refresh()
    assert scheduler.message_id(delivered) is None  # its status message is history
    desk.on_acks("a", [Ack(first_a, now[0], "hook")])  # a late duplicate ack: ignored
    assert desk.open_messages() == 2  # the open ones are kept however old
    for message_id in (second_a, only_b):
        assert scheduler.message_id(status_key(records[message_id])) is not None

    assert "latest message to a was cancelled" in desk.cancel_latest("fake", CHAT, "ann")
    assert desk.open_messages() == 1
    desk.remove_agent("b")
    assert desk.open_messages() == 0
    await settle(scheduler)
    await scheduler.stop()


async def test_loaded_history_is_forgotten_by_closing_time_not_queueing_time(
    tmp_path: Path,
    store: SqliteStore,  # noqa: F811
) -> None:
    """After a restart the store gives messages back in queueing order. A message queued
    first but closed late used to sit at the front of the closed ones and hold back every
    message behind it that closed early: their status messages stayed in memory past a day."""
    (tmp_path / "a").mkdir()
    channel = ScriptedChannel()
    now = [datetime(2026, 12, 1, 9, 0, tzinfo=UTC)]

    async def start_desk() -> tuple[InboxDesk, RouteScheduler]:
        scheduler = await started(store, channel)
        desk = clocked_desk(store, scheduler, channel, {"a": tmp_path / "a"}, now)
        desk.load()
        desk.channel_ready("fake")
        return desk, scheduler

    desk, scheduler = await start_desk()
    assert desk.queue("fake", CHAT, "a", "ann", "slow one") is None
    now[0] += timedelta(hours=1)
    assert desk.queue("fake", CHAT, "a", "ann", "quick one") is None
    slow, quick = (r.message_id for r in store.inbox_messages(0))
    now[0] += timedelta(minutes=1)
    desk.on_acks("a", [Ack(quick, now[0], "hook")])
    quick_closed = now[0]
    now[0] += timedelta(hours=19)
    desk.on_acks("a", [Ack(slow, now[0], "hook")])
    slow_closed = now[0]
    await settle(scheduler)
    await scheduler.stop()

    desk, scheduler = await start_desk()  # the restart: both come back from the store
    await settle(scheduler)
    records = {r.message_id: r for r in store.inbox_messages(0)}
    quick_key, slow_key = status_key(records[quick]), status_key(records[slow])
    assert scheduler.message_id(quick_key) is not None
    assert scheduler.message_id(slow_key) is not None

    now[0] = quick_closed + timedelta(seconds=KEEP_CLOSED_S + 60)
    desk.refresh()  # the timer: a day since the quick one closed, not since the slow one
    assert scheduler.message_id(quick_key) is None
    assert scheduler.message_id(slow_key) is not None

    now[0] = slow_closed + timedelta(seconds=KEEP_CLOSED_S + 60)
    desk.refresh()
    assert scheduler.message_id(slow_key) is None
    await scheduler.stop()


async def test_an_ack_dated_in_the_future_does_not_hold_back_the_forgetting_of_others(
    tmp_path: Path,
    store: SqliteStore,  # noqa: F811
) -> None:
    """An ack's time is the agent side's word (any parsable time before year 9000). One dated
    centuries ahead was kept as the message's closing time, at the front of the closed ones,
    and every message closed after it stayed in memory for good: a day later it is history
    like the others, and the ones behind it go too."""
    (tmp_path / "a").mkdir()
    channel = ScriptedChannel()
    scheduler = await started(store, channel)
    now = [datetime(2026, 12, 1, 9, 0, tzinfo=UTC)]
    desk = clocked_desk(store, scheduler, channel, {"a": tmp_path / "a"}, now)
    desk.channel_ready("fake")
    assert desk.queue("fake", CHAT, "a", "ann", "dated ahead") is None
    assert desk.queue("fake", CHAT, "a", "ann", "dated now") is None
    ahead, behind = (r.message_id for r in store.inbox_messages(0))
    desk.on_acks("a", [Ack(ahead, datetime(8999, 1, 1, tzinfo=UTC), "hook")])
    desk.on_acks("a", [Ack(behind, now[0], "hook")])
    await settle(scheduler)
    records = {r.message_id: r for r in store.inbox_messages(0)}
    keys = [status_key(records[message_id]) for message_id in (ahead, behind)]
    assert all(scheduler.message_id(key) is not None for key in keys)

    now[0] += timedelta(seconds=KEEP_CLOSED_S + 60)
    desk.refresh()
    assert [scheduler.message_id(key) for key in keys] == [None, None]
    await scheduler.stop()


async def test_an_ack_read_late_is_forgotten_by_its_own_time_not_behind_later_ones(
    tmp_path: Path,
    store: SqliteStore,  # noqa: F811
) -> None:
    """An ack the desk reads late (the agent wrote it long before) carries its own, earlier
    time. It used to be queued behind the messages closed in the meantime, so it stayed in
    memory until they were forgotten; it goes a day after its own time."""
    (tmp_path / "a").mkdir()
    channel = ScriptedChannel()
    scheduler = await started(store, channel)
    start = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    now = [start]
    desk = clocked_desk(store, scheduler, channel, {"a": tmp_path / "a"}, now)
    desk.channel_ready("fake")
    assert desk.queue("fake", CHAT, "a", "ann", "acked early, read late") is None
    assert desk.queue("fake", CHAT, "a", "ann", "acked and read at ten") is None
    early, later = (r.message_id for r in store.inbox_messages(0))
    now[0] = start + timedelta(hours=10)
    desk.on_acks("a", [Ack(later, now[0], "hook")])
    now[0] = start + timedelta(hours=11)
    desk.on_acks("a", [Ack(early, start + timedelta(minutes=1), "hook")])
    await settle(scheduler)
    records = {r.message_id: r for r in store.inbox_messages(0)}
    early_key, later_key = status_key(records[early]), status_key(records[later])

    now[0] = start + timedelta(minutes=2, seconds=KEEP_CLOSED_S)
    desk.refresh()
    assert scheduler.message_id(early_key) is None  # a day after its own ack
    assert scheduler.message_id(later_key) is not None

    now[0] = start + timedelta(hours=10, seconds=KEEP_CLOSED_S + 60)
    desk.refresh()
    assert scheduler.message_id(later_key) is None
    await scheduler.stop()


HEAD = "Read report #1: taskcard reports --after 0\nw reported (#1): ok."


@pytest.mark.parametrize(
    ("queued", "text", "joined"),
    [
        # Room for both: the queued text whole.
        (HEAD, "w reported (#2): ok.", HEAD),
        # No room: its head lines stay, the rest is cut.
        (HEAD + "\n" + "x" * 3500, "y" * 900, HEAD + "\n" + REPORTS_CUT_LINE),
        # Cut before: cut again at the same place, never a second cut line.
        (HEAD + "\n" + REPORTS_CUT_LINE + "\n" + "y" * 900, "z" * 3890, REPORTS_CUT_LINE),
        (
            HEAD + "\n" + REPORTS_CUT_LINE + "\n" + "y" * 900,
            "z" * 3000,
            HEAD + "\n" + REPORTS_CUT_LINE,
        ),
        # A head line too long for the room: the cut line alone.
        ("x" * 3000 + "\nmore", "y" * 2000, REPORTS_CUT_LINE),
        # The new text alone nearly fills a message: no joining.
        (HEAD, "y" * (MAX_TEXT_CHARS - 10), None),
    ],
)
def test_a_report_wake_joined_to_the_next_is_cut_to_fit_one_message(
    queued: str, text: str, joined: str | None
) -> None:
    assert joined_report_wakes(queued, text) == joined
    if joined is not None:
        assert len(joined) + 1 + len(text) <= MAX_TEXT_CHARS


async def test_a_busy_childs_signals_spend_no_tries_of_a_broken_inbox_and_all_arrive(
    tmp_path: Path,
    store: SqliteStore,  # noqa: F811
) -> None:
    """Wakes owed to an inbox that cannot be written are tried again when their backoff has
    passed. Each new signal tried them too, and itself after them: two tries a signal, and a
    child signalling 13 times used up the 24 tries meant to last an hour and a half, so
    every owed wake was dropped. Signals meanwhile wait behind the owed ones untried, and
    all of them are queued once the inbox works."""
    made = await desks(tmp_path, store, "lead", "child")
    now, desk = made.now, made.desk()
    desk.channel_ready("fake")
    (tmp_path / "lead" / "inbox").write_text("in the way\n")
    for episode in range(40):
        desk.wake("lead", "child", f"e{episode}", f"child signalled {episode}")
        now[0] += timedelta(seconds=0.1)
    assert desk.problems["lead"].startswith("inbox:"), desk.problems
    (tmp_path / "lead" / "inbox").unlink()
    now[0] += timedelta(seconds=30)
    assert desk.retry_wakes() == ["lead"]
    queued = (tmp_path / "lead" / "inbox" / "queued").glob("*.json")
    said = sorted(json.loads(path.read_text())["text"] for path in queued)
    assert said == sorted(f"child signalled {n}" for n in range(40)), said
    assert "lead" not in desk.problems


def _owed_row(**fields: object) -> str:
    row: dict[str, object] = {
        "child": "worker",
        "episode": "signal:report:1:5",
        "text": "worker reported",
        "report": True,
        "withdrawn": None,
        "seq": 3,
        **fields,
    }
    return json.dumps(row)


OWED_KEY = 'owed-wake:["lead", "worker:signal:report:1:5"]'


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("owed-wake:not json", _owed_row(), "not JSON of the expected shape"),
        ('owed-wake:["lead", "a", "b"]', _owed_row(), "not JSON of the expected shape"),
        ('owed-wake:["gone", "worker:signal:report:1:5"]', _owed_row(), "its agent is not served"),
        ('owed-wake:[7, "worker:signal:report:1:5"]', _owed_row(), "its agent is not served"),
        (OWED_KEY, "[]", "not an object"),
        (OWED_KEY, _owed_row(child=""), "no child or episode"),
        (OWED_KEY, _owed_row(episode=5), "no child or episode"),
        (OWED_KEY, _owed_row(child="other"), "its key does not name its child and episode"),
        (OWED_KEY, _owed_row(text=""), "no text, or one longer than a message"),
        (OWED_KEY, _owed_row(text="x" * 70_000), "no text, or one longer than a message"),
        (OWED_KEY, _owed_row(report="yes"), "no report flag or order"),
        (OWED_KEY, _owed_row(seq=True), "no report flag or order"),
        (OWED_KEY, _owed_row(withdrawn="../x"), "a withdrawn wake that is no message id"),
        # Nested past the parser's depth (RecursionError): it stopped the start.
        ("owed-wake:" + "[" * 100_000, _owed_row(), "not JSON of the expected shape"),
        (OWED_KEY, "[" * 100_000, "not JSON of the expected shape"),
    ],
)
def test_an_owed_wake_in_the_store_not_as_written_is_skipped_saying_why(
    key: str, value: str, why: str
) -> None:
    assert _stored_wake(key, value, {"lead"}) == why


def test_an_owed_wake_in_the_store_as_written_is_taken_up() -> None:
    parent, notice, wake = _stored_wake(OWED_KEY, _owed_row(withdrawn="wake_ab"), {"lead"})
    assert (parent, notice) == ("lead", "worker:signal:report:1:5")
    assert (wake.child_id, wake.text, wake.report, wake.withdrawn, wake.seq) == (
        "worker",
        "worker reported",
        True,
        "wake_ab",
        3,
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (0, 0.0)),
        ('{"tries": 3, "due_s": 1700000000.5}', (3, 1700000000.5)),
        ('{"tries": 24, "due_s": 1}', (0, 0.0)),  # as many as drop them: not written so
        ('{"tries": -1, "due_s": 1}', (0, 0.0)),
        ('{"tries": 1.5, "due_s": 1}', (0, 0.0)),
        ('{"tries": 1, "due_s": "soon"}', (0, 0.0)),
        ('{"tries": 1, "due_s": NaN}', (0, 0.0)),
        ('{"tries": 1}', (0, 0.0)),
        ("[1, 2]", (0, 0.0)),
        ("{", (0, 0.0)),
        ('{"tries": ' + "[" * 100_000, (0, 0.0)),
    ],
)
def test_the_stored_tries_of_owed_wakes_are_taken_only_as_written(
    value: str | None, expected: tuple[int, float]
) -> None:
    assert _stored_tries("lead", value) == expected


async def test_a_look_removing_an_agent_as_another_instance_owes_it_a_wake_keeps_it(
    tmp_path: Path,
    store: SqliteStore,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two instances of a cluster on one store. `holder` holds lead's lease; lead is in the
    set of agents that owe wakes with its row of tries, left by an earlier recovery. The
    holder's look reads the set (lead in it) and the owed rows (none of lead's); then the
    other instance's wake to lead fails and is kept in the store; then the look goes on. It
    keeps lead in the set, and its next look queues the wake once lead's inbox works. It
    removed lead and its row of tries: the wake was left in the store, and no look found it.
    The interleaving is made by running the other instance's wake inside the holder's read
    of the owed rows, the store itself as it is."""
    lead, worker = tmp_path / "lead", tmp_path / "worker"
    for workdir in (lead, worker):
        workdir.mkdir()
    channel = ScriptedChannel()
    scheduler = await started(store, channel)
    now = [datetime(2026, 12, 1, 9, 0, tzinfo=UTC)]

    def desk() -> InboxDesk:
        return InboxDesk(
            InboxConfig(max_messages=100),
            store,
            scheduler,
            {"fake": channel},
            {"lead": lead, "worker": worker},
            clock=lambda: now[0],
            activity=lambda _agent: ActivitySummary(state="running"),
            zone=lambda _channel, _chat: UTC,
            render=lambda ch, view: ch.render_card(view),
            shared=True,
        )

    holder, other = desk(), desk()
    holder.take_agent("lead")
    holder.retry_wakes()  # the first look: nothing owed
    await asyncio.sleep(0)
    store.add_to_set(OWED_AGENTS, ["lead"])  # an earlier recovery's, its wake queued since
    store.set_cursor(owed_tries_cursor("lead"), json.dumps({"tries": 1, "due_s": 0}))
    (lead / "inbox").write_text("not a folder\n")
    cursor_keys = store.cursor_keys

    def read_then_the_other_writes(prefix: str) -> list[str]:
        found = cursor_keys(prefix)
        if prefix == OWED_WAKE_CURSOR:
            monkeypatch.setattr(store, "cursor_keys", cursor_keys)
            other.wake("lead", "worker", "signal:done:1", "worker is done")
        return found

    monkeypatch.setattr(store, "cursor_keys", read_then_the_other_writes)
    now[0] += timedelta(seconds=OWED_LOOK_S + 1)
    holder.retry_wakes()
    assert store.cursor_keys(OWED_WAKE_CURSOR), "the other instance's wake is owed"
    assert store.set_members(OWED_AGENTS) == ["lead"]
    (lead / "inbox").unlink()
    for _ in range(3):
        await asyncio.sleep(0)
        now[0] += timedelta(seconds=OWED_LOOK_S + 1)
        holder.retry_wakes()
    assert [p.name for p in (lead / "inbox" / "queued").iterdir()] != []
    assert store.cursor_keys(OWED_WAKE_CURSOR) == []
    await scheduler.stop()


class _Stopped(BaseException):
    """The service stopped here (raised where a stop would cut the desk short)."""


@pytest.mark.parametrize(
    ("stop_at", "expected"),
    [
        ("owed row", ["child reported 1", "child reported 2"]),
        ("note deleted", ["child reported 1\nchild reported 2"]),
    ],
)
async def test_a_stop_as_a_wake_carrying_one_taken_back_is_owed_loses_no_report(
    stop_at: str,
    expected: list[str],
    tmp_path: Path,
    store: SqliteStore,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """child's first report wakes lead. Its second takes that wake back to carry it; the
    new wake cannot be written, nor the one taken back put back (the inbox refuses), and the
    service stops. Stopped as the owed wake's row is written, the next start puts the first
    wake back into `queued/` and owes the second, queued alone; stopped as the note of the
    take back is deleted, the owed wake carries both, and the first is not put back too.
    Each report reaches lead once. The note was deleted, and the second wake's notice
    failed, before the owed row was written: the first report stayed in `cancelled/`, the
    second was never owed; and a note left beside the owed row put the first back though
    the owed wake carried it. The inbox's refusals and the stop are made by raising where
    they would happen."""
    made = await desks(tmp_path, store, "lead", "child")
    channel, scheduler, now, workdirs = made.channel, made.scheduler, made.now, made.workdirs
    first = made.desk()
    first.load()
    first.wake("lead", "child", "report:1", "child reported 1", report=True)
    inbox = tmp_path / "lead" / "inbox"
    assert len(list((inbox / "queued").iterdir())) == 1

    def refused(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    def moved_back_refused(*_args: object) -> bool:
        raise InboxRefused("inbox/cancelled cannot be moved back")

    set_cursor, delete_cursors = store.set_cursor, store.delete_cursors

    def stop_at_owed_row(key: str, value: str) -> None:
        if stop_at == "owed row" and key.startswith(OWED_WAKE_CURSOR):
            raise _Stopped
        set_cursor(key, value)

    def stop_at_note(keys: Iterable[str]) -> None:
        keys = list(keys)
        notes = [store.get_cursor(k) for k in keys if k.startswith("report-wake:")]
        if stop_at == "note deleted" and any(len(json.loads(n or "[]")) == 3 for n in notes):
            raise _Stopped  # the note of a take back: the wake taken back and its carrier
        delete_cursors(keys)

    with monkeypatch.context() as faults:
        faults.setattr(InboxWriter, "queue", refused)
        faults.setattr(InboxWriter, "restore", moved_back_refused)
        faults.setattr(store, "set_cursor", stop_at_owed_row)
        faults.setattr(store, "delete_cursors", stop_at_note)
        with pytest.raises(_Stopped):
            first.wake("lead", "child", "report:2", "child reported 2", report=True)
    assert list((inbox / "queued").iterdir()) == []  # taken back, in `cancelled/`
    second = clocked_desk(store, scheduler, channel, workdirs, now)
    second.load()
    now[0] += timedelta(hours=1)
    second.retry_wakes()
    texts = sorted(json.loads(p.read_text())["text"] for p in (inbox / "queued").iterdir())
    assert texts == expected, texts
    assert list((inbox / "cancelled").iterdir()) == []
    await scheduler.stop()


def report_wake_texts(inbox: Path) -> list[str]:
    """The texts of the wakes queued in `inbox`, sorted."""
    return sorted(json.loads(p.read_text())["text"] for p in (inbox / "queued").iterdir())


def before_queued_row_written(shared: RedisStore, row: str, then: Callable[[], None]) -> list[str]:
    """Run `then` once, just before `shared` writes `row` as a wake still queued (a row of
    two items, a wake id and its text), by whichever call writes it (`set_cursor`, or
    `replace_cursor_if` comparing first); the rows so written, to check it came."""
    set_cursor, replace_cursor_if = shared.set_cursor, shared.replace_cursor_if
    seen: list[str] = []

    def first(key: str, value: str | None) -> None:
        if key == row and value is not None and len(json.loads(value)) == 2 and not seen:
            seen.append(value)
            then()

    def set_after(key: str, value: str) -> None:
        first(key, value)
        set_cursor(key, value)

    def replace_after(key: str, expected: str, value: str | None) -> bool:
        first(key, value)
        return replace_cursor_if(key, expected, value)

    shared.set_cursor = set_after  # type: ignore[method-assign]
    shared.replace_cursor_if = replace_after  # type: ignore[method-assign]
    return seen


async def test_a_lease_gained_keeps_the_report_wake_row_a_live_writer_rewrote_after_its_read(
    tmp_path: Path, cluster_desks: ClusterDesks
) -> None:
    """Two instances on a real Redis. `writer` serves worker and wakes lead for its reports;
    `gainer` gains lead's lease as worker's second report is written: the writer has taken
    the first wake back (noted in the store with the wake to carry it) and queued that
    carrier, and is about to note the carrier as worker's wake still queued. The gainer reads
    the note, the writer rewrites it, then the gainer finds the carrier queued and is done
    with the note. It leaves the writer's row: worker's third report, written by an instance
    that took worker's lease since (the writer's memory gone), joins the carrier, and lead
    has one wake with the three reports. The gainer deleted the row without looking: the
    third report got a wake of its own. The writer runs in a thread held at its rewrite, the
    gainer's read of the rows lets it go on and waits for it: no timing."""
    stores, made = await cluster_desks(3, "lead", "worker")
    writer, gainer, successor = made.cluster(stores)
    writer.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    at_rewrite, gainer_read = threading.Event(), threading.Event()

    def held_at_rewrite() -> None:  # the carrier about to be noted as still queued
        at_rewrite.set()
        assert gainer_read.wait(60), "the gainer never read the rows"

    before_queued_row_written(stores[0], row, held_at_rewrite)
    second = threading.Thread(
        target=writer.wake,
        args=("lead", "worker", "report:2", "worker reported 2"),
        kwargs={"report": True},
    )
    second.start()
    assert at_rewrite.wait(60), "the writer never queued its carrier"
    note = stores[1].get_cursor(row)
    assert note is not None and len(json.loads(note)) == 3, note
    get_cursors = stores[1].get_cursors

    def read_then_the_writer_rewrites(keys: Iterable[str]) -> dict[str, str]:
        found = get_cursors(keys)
        if row in found:
            gainer_read.set()
            second.join(60)
            assert not second.is_alive(), "the writer never finished"
        return found

    stores[1].get_cursors = read_then_the_writer_rewrites  # type: ignore[method-assign]
    gainer.take_agent("lead")
    assert gainer_read.is_set(), "the gainer never read the note"
    [queued] = (tmp_path / "lead" / "inbox" / "queued").iterdir()
    carrier = json.loads(queued.read_text())
    assert carrier["text"] == "worker reported 1\nworker reported 2"
    assert json.loads(stores[2].get_cursor(row) or "null") == [carrier["id"], carrier["text"]]
    successor.wake("lead", "worker", "report:3", "worker reported 3", report=True)
    assert report_wake_texts(tmp_path / "lead" / "inbox") == [
        "worker reported 1\nworker reported 2\nworker reported 3"
    ]


async def test_a_report_wake_row_written_since_the_start_takes_back_only_a_wake(
    tmp_path: Path,
    store: SqliteStore,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A row written after the start (another version, a hand) notes a person's text
    waiting in lead's inbox as worker's report wake still queued. worker's report wakes lead
    alone: the text stays queued as it was, and the row is named once and replaced by the
    new wake's. The text was withdrawn, folded into the wake and deleted."""
    made = await desks(tmp_path, store, "lead", "worker")
    scheduler, now, workdirs, desk = made.scheduler, made.now, made.workdirs, made.desk()
    desk.load()
    person = inbox_message(
        ident="m_" + "1" * 20,
        kind="message",
        text="never mind the docs",
        channel="fake",
        chat_id="-100",
        thread_id=None,
        user="7",
        queued_at=now[0],
    )
    InboxWriter(workdirs["lead"]).queue(person)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    store.set_cursor(row, json.dumps([person["id"], person["text"]]))
    desk.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    inbox = workdirs["lead"] / "inbox"
    assert report_wake_texts(inbox) == ["never mind the docs", "worker reported 1"]
    assert (inbox / "queued" / f"{person['id']}.json").is_file()
    assert caplog.text.count("report wake row") == 1, caplog.text
    assert "a person's message" in caplog.text
    assert json.loads(store.get_cursor(row) or "null")[1] == "worker reported 1"
    await scheduler.stop()


async def test_report_wake_rows_not_keyed_by_two_names_are_named_once_in_a_cluster(
    tmp_path: Path, cluster_desks: ClusterDesks, caplog: pytest.LogCaptureFixture
) -> None:
    """Two instances on a real Redis gain lead's lease one after the other, the second
    inside the first's read of the report-wake rows (both read them before either acts).
    The rows whose keys do not name two agents are named once in the cluster, by the
    instance whose delete took them, and deleted; the good rows stay: worker's wake still
    queued in lead's inbox, and a take back noted in the inbox of another parent, not
    theirs to look at. Such rows were skipped without a word at every lease gained, and kept
    for good."""
    stores, made = await cluster_desks(2, "lead", "worker")
    first, second = made.cluster(stores)
    wake = "wake_" + "a" * 24
    bad = {
        "report-wake:" + json.dumps(["lead", "worker", "x"]): json.dumps([wake, "text"]),
        "report-wake:" + json.dumps([["lead"], "worker"]): json.dumps([wake, "text", wake]),
        "report-wake:" + json.dumps(["", "worker"]): json.dumps([wake, "text"]),
        "report-wake:not json": json.dumps([wake, "text", wake]),
    }
    good = {
        "report-wake:" + json.dumps(["lead", "worker"]): json.dumps([wake, "text"]),
        "report-wake:" + json.dumps(["elsewhere", "worker"]): json.dumps([wake, "text", wake]),
    }
    for key, value in {**bad, **good}.items():
        stores[0].set_cursor(key, value)
    get_cursors = stores[0].get_cursors

    def read_then_the_other_gains(keys: Iterable[str]) -> dict[str, str]:
        found = get_cursors(keys)
        if found.keys() >= bad.keys():
            stores[0].get_cursors = get_cursors  # type: ignore[method-assign]
            second.take_agent("lead")
        return found

    stores[0].get_cursors = read_then_the_other_gains  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        first.take_agent("lead")
    assert stores[0].get_cursors([*bad, *good]) == good
    named = [r.getMessage() for r in caplog.records if "report wake row" in r.getMessage()]
    assert len(named) == len(bad), named
    assert all("does not name two agents" in line for line in named), named


async def test_an_instance_forgetting_a_report_wake_row_deletes_none_written_after_its_read(
    tmp_path: Path, cluster_desks: ClusterDesks
) -> None:
    """Three instances on a real Redis. `old` wakes lead for worker's first report, and
    its fleet then loses worker (a reload) while `new`, which gained worker's lease, is
    already writing: `new` writes worker's second report between `old`'s read of the
    report-wake row and its delete, taking the first wake back and queueing one that
    carries both. `old` deletes only the row it read, so the newer row stays, and
    worker's third report, written by a third instance with no memory of the pair,
    joins that wake: lead has one wake with the three reports. Deleted without a
    compare, the row `new` wrote was gone, and the third report got a wake of its own.
    The second report is written inside `old`'s read: no timing."""
    stores, made = await cluster_desks(3, "lead", "worker")
    old, new, successor = made.cluster(stores)
    old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    get_cursor = stores[0].get_cursor
    written: list[str | None] = []

    def read_then_the_new_holder_writes(key: str) -> str | None:
        found = get_cursor(key)
        if key == row:
            stores[0].get_cursor = get_cursor  # type: ignore[method-assign]
            new.wake("lead", "worker", "report:2", "worker reported 2", report=True)
            written.append(stores[1].get_cursor(row))
        return found

    stores[0].get_cursor = read_then_the_new_holder_writes  # type: ignore[method-assign]
    old.remove_agent("worker")
    assert written, "old never read the row"
    assert stores[2].get_cursor(row) == written[0]
    successor.wake("lead", "worker", "report:3", "worker reported 3", report=True)
    assert report_wake_texts(tmp_path / "lead" / "inbox") == [
        "worker reported 1\nworker reported 2\nworker reported 3"
    ]


async def test_a_report_read_as_another_instance_writes_the_pair_leaves_that_row(
    tmp_path: Path, cluster_desks: ClusterDesks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three instances on a real Redis. `old` wakes lead for worker's first report; then,
    running its last turn as worker's lease moves to `new`, it reads the report-wake row
    for worker's second report, and `new` writes worker's third in between (it takes the
    first wake back into one carrying both), after which lead's inbox refuses `old`'s wake
    (owed). `old` replaces the row with its note of a take back only while the row holds
    what it read: it takes nothing back, the row `new` wrote stays, and worker's fourth
    report, written by a third instance, joins that wake. Deleted then noted without a
    compare, the row was gone and the fourth report got a wake of its own. The third
    report is written inside `old`'s read, and the refusal made by raising where it would
    happen: no timing."""
    stores, made = await cluster_desks(3, "lead", "worker")
    old, new, successor = made.cluster(stores)
    old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    get_cursor = stores[0].get_cursor

    def refused(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as faults:

        def read_then_the_new_holder_writes(key: str) -> str | None:
            found = get_cursor(key)
            if key == row:
                stores[0].get_cursor = get_cursor  # type: ignore[method-assign]
                new.wake("lead", "worker", "report:3", "worker reported 3", report=True)
                faults.setattr(InboxWriter, "queue", refused)
            return found

        stores[0].get_cursor = read_then_the_new_holder_writes  # type: ignore[method-assign]
        old.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    assert "lead" in old.problems  # owed, to be written again once the inbox works
    successor.wake("lead", "worker", "report:4", "worker reported 4", report=True)
    assert report_wake_texts(tmp_path / "lead" / "inbox") == [
        "worker reported 1\nworker reported 3\nworker reported 4"
    ]


async def test_an_instance_serving_a_child_again_joins_the_wake_another_wrote_meanwhile(
    tmp_path: Path, cluster_desks: ClusterDesks
) -> None:
    """Two instances on a real Redis take turns at worker's lease. `first` wakes lead for
    worker's first report and loses the lease; `second` gains it, and worker's second
    report takes that wake back and queues one carrying both; `first` gains the lease
    again, and worker's third report joins that wake: lead has one wake with the three
    reports. `first` took its memory of the first wake for worker's wake still queued over
    the store's row: it found that wake gone and queued the third report alone."""
    stores, made = await cluster_desks(2, "lead", "worker")
    first, second = made.cluster(stores)
    first.take_agent("worker")
    first.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    first.drop_agent("worker")
    second.take_agent("worker")
    second.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    second.drop_agent("worker")
    first.take_agent("worker")
    first.wake("lead", "worker", "report:3", "worker reported 3", report=True)
    assert report_wake_texts(tmp_path / "lead" / "inbox") == [
        "worker reported 1\nworker reported 2\nworker reported 3"
    ]


async def test_an_instance_that_gained_the_parent_and_then_the_child_joins_the_newer_wake(
    tmp_path: Path, cluster_desks: ClusterDesks
) -> None:
    """Three instances on a real Redis. `stopped` wakes lead for worker's first report and
    stops as worker's second report takes that wake back (the note of the take back is in
    the store, the wake in lead's `cancelled/`, its carrier never written). `first` gains
    lead's lease and puts the wake back; `second`, serving worker, takes it back again into
    the wake of worker's third report; `first` then gains worker's lease too, and worker's
    fourth report joins `second`'s wake: lead has one wake with the reports. `first` took
    the wake it had put back for worker's wake still queued: it found it gone and queued
    the fourth report alone."""
    stores, made = await cluster_desks(3, "lead", "worker")
    stopped, first, second = made.cluster(stores)
    stopped.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    ident, text = json.loads(stores[0].get_cursor(row) or "null")
    stores[0].set_cursor(row, json.dumps([ident, text, _wake_ident("worker:report:2")]))
    assert InboxWriter(made.workdirs["lead"]).cancel(ident)
    first.take_agent("lead")
    assert report_wake_texts(tmp_path / "lead" / "inbox") == ["worker reported 1"]
    second.take_agent("worker")
    second.wake("lead", "worker", "report:3", "worker reported 3", report=True)
    first.take_agent("worker")
    first.wake("lead", "worker", "report:4", "worker reported 4", report=True)
    assert report_wake_texts(tmp_path / "lead" / "inbox") == [
        "worker reported 1\nworker reported 3\nworker reported 4"
    ]


async def test_a_wake_owed_with_the_one_it_took_back_leaves_a_row_written_since(
    tmp_path: Path, cluster_desks: ClusterDesks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three instances on a real Redis. `old` wakes lead for worker's first report; its
    wake for the second takes that one back, and lead's inbox refuses both it and the
    first moved back, so the wake is owed carrying the two. As `old` writes that owed row,
    `new`, which gained worker's lease, writes worker's third report (the inbox works for
    it): it finds `old`'s note of the take back, whose wake the owed row in Redis carries
    (put back, the first report would reach lead twice), deletes the note, and the third
    goes alone, its wake the row. `old` then deletes its note only while it is the row, so
    `new`'s stays, and worker's fourth report, written by a third instance, joins that
    wake. Deleted without a compare, the row was gone and the fourth went alone. The
    third report is written inside `old`'s write of its owed row, the refusals made by
    raising where they would happen: no timing."""
    stores, made = await cluster_desks(3, "lead", "worker")
    old, new, successor = made.cluster(stores)
    old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    refusing = [True]
    queue, restore = InboxWriter.queue, InboxWriter.restore

    def queue_refused(writer: InboxWriter, message: dict[str, object]) -> None:
        if refusing[0]:
            raise OSError(28, "No space left on device")
        queue(writer, message)

    def restore_refused(writer: InboxWriter, ident: str) -> bool:
        if refusing[0]:
            raise InboxRefused("inbox/cancelled cannot be moved back")
        return restore(writer, ident)

    set_cursor = stores[0].set_cursor

    def owed_then_the_new_holder_writes(key: str, value: str) -> None:
        set_cursor(key, value)
        if key.startswith(OWED_WAKE_CURSOR):
            stores[0].set_cursor = set_cursor  # type: ignore[method-assign]
            refusing[0] = False
            new.wake("lead", "worker", "report:3", "worker reported 3", report=True)
            refusing[0] = True

    with monkeypatch.context() as faults:
        faults.setattr(InboxWriter, "queue", queue_refused)
        faults.setattr(InboxWriter, "restore", restore_refused)
        stores[0].set_cursor = owed_then_the_new_holder_writes  # type: ignore[method-assign]
        old.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    assert stores[0].set_cursor == set_cursor, "old never wrote its owed row"
    successor.wake("lead", "worker", "report:4", "worker reported 4", report=True)
    assert report_wake_texts(tmp_path / "lead" / "inbox") == [
        "worker reported 3\nworker reported 4"
    ]


async def test_a_report_finding_a_take_back_a_stop_left_carries_the_wake_taken_back(
    tmp_path: Path, cluster_desks: ClusterDesks
) -> None:
    """Two instances on a real Redis. `stopped` wakes lead for worker's first report and
    stops as worker's second report takes that wake back (the note of the take back is in
    the store, the wake in lead's `cancelled/`, its carrier never written). lead's lease
    stays where it was; `new` gains worker's lease, and worker's third report puts the
    first wake back and takes it again: lead has one wake with the first and third
    reports, and nothing is left in `cancelled/`. The report deleted the note and went
    alone, the first wake left in `cancelled/` for good."""
    stores, made = await cluster_desks(2, "lead", "worker")
    stopped, new = made.cluster(stores)
    stopped.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    ident, text = json.loads(stores[0].get_cursor(row) or "null")
    stores[0].set_cursor(row, json.dumps([ident, text, _wake_ident("worker:report:2")]))
    inbox = tmp_path / "lead" / "inbox"
    assert InboxWriter(made.workdirs["lead"]).cancel(ident)
    new.take_agent("worker")
    new.wake("lead", "worker", "report:3", "worker reported 3", report=True)
    assert report_wake_texts(inbox) == ["worker reported 1\nworker reported 3"]
    assert list((inbox / "cancelled").iterdir()) == []


async def test_a_wake_queued_as_another_instance_writes_the_pair_leaves_that_row(
    tmp_path: Path, cluster_desks: ClusterDesks
) -> None:
    """Three instances on a real Redis. `old` wakes lead for worker's first report, and its
    wake for the second takes that one back and is queued; before `old` notes it as
    worker's wake still queued, `new`, which gained worker's lease, writes worker's third
    report: it finds `old`'s note of the take back with its carrier queued, is done with
    the note, and its wake goes alone, noted as the wake still queued. `old` then writes
    its row only while its note is the row, so `new`'s stays, and worker's fourth report,
    written by a third instance, joins the third. Written over without a compare, the
    fourth joined the first two and the third stayed alone, out of order. The third report
    is written inside `old`'s write of its row: no timing."""
    stores, made = await cluster_desks(3, "lead", "worker")
    old, new, successor = made.cluster(stores)
    old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    written = before_queued_row_written(
        stores[0],
        row,
        lambda: new.wake("lead", "worker", "report:3", "worker reported 3", report=True),
    )
    old.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    assert written, "old never wrote its row"
    successor.wake("lead", "worker", "report:4", "worker reported 4", report=True)
    assert report_wake_texts(tmp_path / "lead" / "inbox") == [
        "worker reported 1\nworker reported 2",
        "worker reported 3\nworker reported 4",
    ]


async def test_a_wake_put_back_as_another_instance_writes_the_pair_leaves_that_row(
    tmp_path: Path, cluster_desks: ClusterDesks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three instances on a real Redis. `old` wakes lead for worker's first report; lead's
    inbox refuses its wake for the second, which took the first back, and `old` is to move
    the first back to `queued/` (owing the second), noting it as worker's wake still queued
    first. Before that note, `new`, which gained worker's lease, writes worker's third
    report (the inbox works for it): it finds `old`'s note of the take back, its carrier
    not in the inbox, and its wake carries the first, noted as the wake still queued.
    `old` then writes its row only while its note is the row, so `new`'s stays (and the
    first is not moved back beside the wake carrying it), and worker's fourth report,
    written by a third instance, joins the first and the third. Written over without a
    compare, the fourth joined the first alone. The third report is written inside
    `old`'s write of its row, the refusal made by raising where it would happen: no
    timing."""
    stores, made = await cluster_desks(3, "lead", "worker")
    old, new, successor = made.cluster(stores)
    old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    refusing = [True]
    queue = InboxWriter.queue

    def queue_refused(writer: InboxWriter, message: dict[str, object]) -> None:
        if refusing[0]:
            raise OSError(28, "No space left on device")
        queue(writer, message)

    def the_new_holder_writes() -> None:
        refusing[0] = False
        new.wake("lead", "worker", "report:3", "worker reported 3", report=True)
        refusing[0] = True

    with monkeypatch.context() as faults:
        faults.setattr(InboxWriter, "queue", queue_refused)
        written = before_queued_row_written(stores[0], row, the_new_holder_writes)
        old.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    assert written == [json.dumps([_wake_ident("worker:report:1"), "worker reported 1"])]
    assert "lead" in old.problems  # the second is owed
    successor.wake("lead", "worker", "report:4", "worker reported 4", report=True)
    inbox = tmp_path / "lead" / "inbox"
    assert report_wake_texts(inbox) == ["worker reported 1\nworker reported 3\nworker reported 4"]
    assert list((inbox / "cancelled").iterdir()) == []


@pytest.mark.parametrize("first_queued", [True, False], ids=["a-wake-queued", "none-queued"])
async def test_a_wake_going_alone_as_another_instance_writes_the_pair_leaves_that_row(
    tmp_path: Path, cluster_desks: ClusterDesks, first_queued: bool
) -> None:
    """Three instances on a real Redis. `old`, running its last turn as worker's lease
    moves to `new`, reads the report-wake row for worker's second report, and `new` writes
    worker's third in between: it takes back the wake of worker's first report into one
    carrying both (`a-wake-queued`), or, with none queued, its wake goes alone. `old`
    finds the row not as it read it, takes nothing back, and its wake goes alone; it then
    notes that wake only while the row is as it left it, so `new`'s stays and worker's
    fourth report, written by a third instance, joins the third. Written over without a
    compare, the fourth joined the second and the third stayed without it. The third
    report is written inside `old`'s read: no timing."""
    stores, made = await cluster_desks(3, "lead", "worker")
    old, new, successor = made.cluster(stores)
    if first_queued:
        old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    get_cursor = stores[0].get_cursor

    def read_then_the_new_holder_writes(key: str) -> str | None:
        found = get_cursor(key)
        if key == row:
            stores[0].get_cursor = get_cursor  # type: ignore[method-assign]
            new.wake("lead", "worker", "report:3", "worker reported 3", report=True)
        return found

    stores[0].get_cursor = read_then_the_new_holder_writes  # type: ignore[method-assign]
    old.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    assert stores[0].get_cursor == get_cursor, "old never read the row"
    successor.wake("lead", "worker", "report:4", "worker reported 4", report=True)
    third = "worker reported 1\nworker reported 3" if first_queued else "worker reported 3"
    assert report_wake_texts(tmp_path / "lead" / "inbox") == sorted(
        ["worker reported 2", f"{third}\nworker reported 4"]
    )


async def test_an_owed_wake_queued_as_another_instance_owes_it_carrying_more_loses_no_report(
    tmp_path: Path, cluster_desks: ClusterDesks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two instances on a real Redis. lead's inbox refuses `old`'s wake for worker's
    second report (the first, taken back, is moved back to `queued/`), so the second is
    owed; `new` gains lead's lease and takes it up, and `old`, running its last turn, tries
    it again too. As `old` reads worker's wake still queued, `new` tries it (the inbox
    refusing it): it takes the first back, can move it back no more, and owes the second
    carrying the first, its row rewritten so, the first left in `cancelled/`. `old`'s
    wake, the second alone, is queued (the inbox works again), and `old` deletes the row
    only while it is the wake it wrote: finding the rewritten row, it moves the first back
    to `queued/`, then deletes the row. lead has both reports. Deleted without a compare,
    `new` found no row, took the wake for queued, and the first report stayed in
    `cancelled/`, which no agent reads. `new`'s try runs inside `old`'s read, the refusals
    raised where they would happen: no timing."""
    stores, made = await cluster_desks(2, "lead", "worker")
    old, new = made.cluster(stores)
    old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    refusing = {"queue": True, "restore": False}
    queue, restore = InboxWriter.queue, InboxWriter.restore

    def queue_refused(writer: InboxWriter, message: dict[str, object]) -> None:
        if refusing["queue"]:
            raise OSError(28, "No space left on device")
        queue(writer, message)

    def restore_refused(writer: InboxWriter, ident: str) -> bool:
        if refusing["restore"]:
            raise InboxRefused("inbox/cancelled cannot be moved back")
        return restore(writer, ident)

    monkeypatch.setattr(InboxWriter, "queue", queue_refused)
    monkeypatch.setattr(InboxWriter, "restore", restore_refused)
    old.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    inbox = tmp_path / "lead" / "inbox"
    assert report_wake_texts(inbox) == ["worker reported 1"]  # moved back; the second owed
    new.take_agent("lead")
    made.now[0] += timedelta(hours=1)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    owed = OWED_WAKE_CURSOR + json.dumps(["lead", "worker:report:2"])
    get_cursor = stores[0].get_cursor

    def read_then_the_new_holder_tries(key: str) -> str | None:
        found = get_cursor(key)
        if key == row:
            stores[0].get_cursor = get_cursor  # type: ignore[method-assign]
            refusing["restore"] = True
            new.retry_wakes()
            refusing.update(queue=False, restore=False)
            rewritten = json.loads(stores[1].get_cursor(owed) or "null")
            assert rewritten["withdrawn"] == _wake_ident("worker:report:1"), rewritten
        return found

    stores[0].get_cursor = read_then_the_new_holder_tries  # type: ignore[method-assign]
    old.retry_wakes()
    assert stores[0].get_cursor == get_cursor, "old never read worker's wake still queued"
    new.retry_wakes()
    assert report_wake_texts(inbox) == ["worker reported 1", "worker reported 2"]
    assert list((inbox / "cancelled").iterdir()) == []


async def test_a_wake_put_back_as_another_instance_carries_it_reaches_the_parent_once(
    tmp_path: Path, cluster_desks: ClusterDesks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two instances on a real Redis. `old` wakes lead for worker's first report; its wake
    for the second takes that one back, and lead's inbox refuses it. Before `old` moves the
    first back, `new`, which gained worker's lease, writes worker's third report: it finds
    `old`'s note of the take back, its carrier not in the inbox, and its wake carries the
    first. `old` moves the first back only once it has replaced its note with the first as
    worker's wake still queued: finding the note taken over, it leaves the first to `new`,
    and its second is owed alone. lead reads the first report once. Moved back without a
    look, the first was queued again beside the wake carrying it. `new`'s report is written
    inside `old`'s refused write, the refusal raised where it happens: no timing."""
    stores, made = await cluster_desks(2, "lead", "worker")
    old, new = made.cluster(stores)
    old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    queue = InboxWriter.queue
    refused: list[str] = []

    def refused_once_as_new_writes(writer: InboxWriter, message: dict[str, object]) -> None:
        if message["id"] == _wake_ident("worker:report:2") and not refused:
            refused.append(str(message["id"]))
            new.wake("lead", "worker", "report:3", "worker reported 3", report=True)
            raise OSError(28, "No space left on device")
        queue(writer, message)

    monkeypatch.setattr(InboxWriter, "queue", refused_once_as_new_writes)
    old.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    assert refused, "old never wrote its second wake"
    assert "lead" in old.problems  # the second is owed
    inbox = tmp_path / "lead" / "inbox"
    assert report_wake_texts(inbox) == ["worker reported 1\nworker reported 3"]
    made.now[0] += timedelta(hours=1)
    old.retry_wakes()
    texts = report_wake_texts(inbox)
    assert "\n".join(texts).count("worker reported 1") == 1, texts
    assert "worker reported 2" in "\n".join(texts), texts
    assert list((inbox / "cancelled").iterdir()) == []


async def test_a_lease_gained_as_the_wake_taken_back_is_moved_back_leaves_it_noted(
    tmp_path: Path, cluster_desks: ClusterDesks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three instances on a real Redis. `old` wakes lead for worker's first report; lead's
    inbox refuses its wake for the second, which took the first back, and `old` moves the
    first back to `queued/`. Just then `new` gains lead's lease and reads `old`'s note of
    the take back, whose wake is not in `cancelled/` any more. worker's third report,
    written by a third instance, joins the first: the first stays noted as worker's wake
    still queued. The note was deleted (the wake it named not found to move back) before
    `old` replaced it, and the third report went alone. `new` gains the lease inside
    `old`'s move back, the refusal raised where it happens: no timing."""
    stores, made = await cluster_desks(3, "lead", "worker")
    old, new, successor = made.cluster(stores)
    old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    queue, restore = InboxWriter.queue, InboxWriter.restore
    moved: list[str] = []

    def queue_refused(writer: InboxWriter, message: dict[str, object]) -> None:
        if message["id"] == _wake_ident("worker:report:2"):
            raise OSError(28, "No space left on device")
        queue(writer, message)

    def moved_back_then_new_gains(writer: InboxWriter, ident: str) -> bool:
        done = restore(writer, ident)
        if not moved:
            moved.append(ident)
            new.take_agent("lead")
        return done

    monkeypatch.setattr(InboxWriter, "queue", queue_refused)
    monkeypatch.setattr(InboxWriter, "restore", moved_back_then_new_gains)
    old.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    assert moved == [_wake_ident("worker:report:1")]
    successor.wake("lead", "worker", "report:3", "worker reported 3", report=True)
    assert report_wake_texts(tmp_path / "lead" / "inbox") == [
        "worker reported 1\nworker reported 3"
    ]


async def test_a_lease_gained_keeps_noted_a_wake_its_writer_moved_back_before_it_stopped(
    tmp_path: Path, cluster_desks: ClusterDesks
) -> None:
    """Three instances on a real Redis. `stopped` wakes lead for worker's first report;
    lead's inbox refused its wake for the second, which took the first back, and `stopped`
    moved the first back to `queued/` and stopped before it replaced its note of the take
    back (an instance of the version before this one moved first and noted after). `new`
    gains lead's lease: the wake the note names is not in `cancelled/`, and it stays noted
    as worker's wake still queued, so worker's third report, written by a third instance,
    joins it. The note was deleted as a wake not found, and the third report went alone."""
    stores, made = await cluster_desks(3, "lead", "worker")
    stopped, new, successor = made.cluster(stores)
    stopped.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    ident, text = json.loads(stores[0].get_cursor(row) or "null")
    stores[0].set_cursor(row, json.dumps([ident, text, _wake_ident("worker:report:2")]))
    new.take_agent("lead")
    assert json.loads(stores[1].get_cursor(row) or "null") == [ident, text]
    successor.wake("lead", "worker", "report:3", "worker reported 3", report=True)
    assert report_wake_texts(tmp_path / "lead" / "inbox") == [
        "worker reported 1\nworker reported 3"
    ]


async def test_a_take_back_its_wake_refused_to_move_back_is_carried_by_the_next_report(
    tmp_path: Path, cluster_desks: ClusterDesks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two instances on a real Redis. `stopped` wakes lead for worker's first report and
    stops as worker's second report takes that wake back (the note of the take back in the
    store, the wake in lead's `cancelled/`, its carrier never written). lead's inbox
    refuses to move anything out of `cancelled/`. `new` gains lead's lease: the wake stays
    where it is, and the note stays for whoever comes next. `new` then gains worker's
    lease, and worker's third report carries the first: lead has one wake with both, and
    nothing is left in `cancelled/` (deleting there works). The report deleted the note
    its move back had left and went alone, the first report in `cancelled/` for good."""
    stores, made = await cluster_desks(2, "lead", "worker")
    stopped, new = made.cluster(stores)
    stopped.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    row = "report-wake:" + json.dumps(["lead", "worker"])
    ident, text = json.loads(stores[0].get_cursor(row) or "null")
    note = json.dumps([ident, text, _wake_ident("worker:report:2")])
    stores[0].set_cursor(row, note)
    assert InboxWriter(made.workdirs["lead"]).cancel(ident)

    def restore_refused(_writer: InboxWriter, _ident: str) -> bool:
        raise InboxRefused("inbox/cancelled cannot be moved back")

    monkeypatch.setattr(InboxWriter, "restore", restore_refused)
    new.take_agent("lead")
    assert stores[1].get_cursor(row) == note
    new.take_agent("worker")
    new.wake("lead", "worker", "report:3", "worker reported 3", report=True)
    inbox = tmp_path / "lead" / "inbox"
    assert report_wake_texts(inbox) == ["worker reported 1\nworker reported 3"]
    assert list((inbox / "cancelled").iterdir()) == []


async def test_an_owed_wake_found_queued_as_another_instance_owes_it_carrying_more_loses_none(
    tmp_path: Path, cluster_desks: ClusterDesks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three instances on a real Redis owe lead the wake of worker's second report (lead's
    inbox refused it at `old`; worker's first is queued). `new` tries it: it takes the
    first back, and lead's inbox refuses both the wake and the first's move back, so `new`
    owes the second carrying the first, rewriting the row (the first left in
    `cancelled/`). Meanwhile `third`, which read worker's wake still queued before `new`
    took it back, takes nothing back and queues the second alone (the inbox works for it),
    deleting the row as it knew it, before `new` writes its own. `old` then finds the second
    in the inbox, and deletes the row only while it holds the wake as `old` knows it:
    finding `new`'s, it moves the first back to `queued/` first. lead has both reports.
    Deleted without a look, the first stayed in `cancelled/`, which no agent reads. `new`
    runs in a thread held at its refused write until `third` is done; no timing."""
    stores, made = await cluster_desks(3, "lead", "worker")
    old, new, third = made.cluster(stores)
    old.wake("lead", "worker", "report:1", "worker reported 1", report=True)
    second = _wake_ident("worker:report:2")
    queue, restore = InboxWriter.queue, InboxWriter.restore
    refusing: list[threading.Thread | None] = [None]

    def queue_refused(writer: InboxWriter, message: dict[str, object]) -> None:
        if message["id"] == second and refusing[0] in (None, threading.current_thread()):
            if refusing[0] is not None:
                at_write.set()
                assert third_done.wait(60), "third never finished"
            raise OSError(28, "No space left on device")
        queue(writer, message)

    def restore_refused(writer: InboxWriter, ident: str) -> bool:
        if refusing[0] is threading.current_thread():
            raise InboxRefused("inbox/cancelled cannot be moved back")
        return restore(writer, ident)

    monkeypatch.setattr(InboxWriter, "queue", queue_refused)
    monkeypatch.setattr(InboxWriter, "restore", restore_refused)
    old.wake("lead", "worker", "report:2", "worker reported 2", report=True)
    assert "lead" in old.problems  # the second owed, the first moved back
    new.take_agent("lead")
    third.take_agent("lead")
    made.now[0] += timedelta(hours=1)
    at_write, third_done = threading.Event(), threading.Event()
    trying = threading.Thread(target=new.retry_wakes)
    refusing[0] = trying
    row = "report-wake:" + json.dumps(["lead", "worker"])
    get_cursor = stores[2].get_cursor

    def read_then_new_takes_it_back(key: str) -> str | None:
        found = get_cursor(key)
        if key == row:
            stores[2].get_cursor = get_cursor  # type: ignore[method-assign]
            trying.start()
            assert at_write.wait(60), "new never wrote its wake"
        return found

    stores[2].get_cursor = read_then_new_takes_it_back  # type: ignore[method-assign]
    third.retry_wakes()
    third_done.set()
    trying.join(60)
    assert not trying.is_alive(), "new never finished"
    owed = OWED_WAKE_CURSOR + json.dumps(["lead", "worker:report:2"])
    rewritten = json.loads(stores[0].get_cursor(owed) or "null")
    assert rewritten["withdrawn"] == _wake_ident("worker:report:1"), rewritten
    old.retry_wakes()
    inbox = tmp_path / "lead" / "inbox"
    assert report_wake_texts(inbox) == ["worker reported 1", "worker reported 2"]
    assert list((inbox / "cancelled").iterdir()) == []
