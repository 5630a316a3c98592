"""The route scheduler against a scripted in-memory channel (a fake of the platform edge).

These tests check the scheduler's own promises: latest wins, round-robin fairness inside a
chat, sliding-window limits never exceeded, 429 pauses, replacement of a gone message, a
disabled route not stopping the others, and persistence of resident ids.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest

from taskcard.bridge.notices.outbox import NoticeOutbox
from taskcard.bridge.schedule.scheduler import (
    PENDING_REPLIES_CURSOR,
    LaneKey,
    RouteKey,
    RouteScheduler,
    _Resident,
    _Waits,
    _Wake,
    unsure_send_wait_s,
)
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.channels.base import (
    CardView,
    Channel,
    ChatRef,
    CommandSink,
    Operation,
    Outgoing,
    RateScope,
    ReplyTo,
)
from taskcard.channels.errors import (
    Forbidden,
    MessageGone,
    NotModified,
    OutcomeUnknown,
    RateLimited,
    Transient,
)


class ScriptedChannel(Channel):
    """Keeps messages like a chat would; errors can be queued per operation."""

    name = "fake"

    def __init__(self, per_chat: RateScope | None = None) -> None:
        self.messages: dict[str, str] = {}
        self.calls: list[tuple[float, str, str, str]] = []  # (time, op, chat, text)
        self.errors: dict[str, deque[Exception]] = {
            "send": deque(),
            "edit": deque(),
            "delete": deque(),
        }
        self.uneditable: set[str] = set()  # shown, but too old to edit (Feishu's 14 days)
        self.per_chat = per_chat
        self.delay_s = 0.001  # how long the platform takes to answer
        self._next = 1

    async def start(self, on_command: CommandSink) -> None:
        return None

    async def stop(self) -> None:
        return None

    def render_card(self, view: CardView) -> Outgoing:
        return Outgoing.build(view.body or "", {})

    def render_text(self, text: str) -> Outgoing:
        return Outgoing.build(text, {})

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        if self.per_chat is None:
            return ()
        return (
            RateScope(f"fake:chat:{chat.chat_id}", self.per_chat.max_calls, self.per_chat.period_s),
        )

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        await asyncio.sleep(self.delay_s)
        self.calls.append((time.monotonic(), "send", chat.chat_id, message.text))
        if self.errors["send"]:
            raise self.errors["send"].popleft()
        message_id = str(self._next)
        self._next += 1
        self.messages[message_id] = message.text
        return message_id

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        await asyncio.sleep(self.delay_s)
        self.calls.append((time.monotonic(), "edit", chat.chat_id, message.text))
        if self.errors["edit"]:
            raise self.errors["edit"].popleft()
        if message_id not in self.messages or message_id in self.uneditable:
            raise MessageGone("gone")
        if self.messages[message_id] == message.text:
            raise NotModified("same")
        self.messages[message_id] = message.text

    async def delete(self, chat: ChatRef, message_id: str) -> None:
        if self.errors["delete"]:
            raise self.errors["delete"].popleft()
        self.messages.pop(message_id, None)

    async def pin(self, chat: ChatRef, message_id: str) -> None:
        self.calls.append((time.monotonic(), "pin", chat.chat_id, message_id))


def outbox_of(store: SqliteStore, channel: Channel, *keys: RouteKey) -> NoticeOutbox:
    """A notice outbox over `channel` with `keys` as its routes; never folds, never quiet."""
    outbox = NoticeOutbox(
        store,
        {"fake": channel},
        render=lambda _channel, value: text(value),
        scrub=lambda value: value,
        max_per_minute=60,
        quiet=lambda _key: False,
        clock=time.time,
    )
    for key in keys:
        outbox.add_route(key)
    return outbox


async def started(
    store: SqliteStore,
    channel: Channel,
    *keys: RouteKey,
    outbox: NoticeOutbox | None = None,
    **options: float,
) -> RouteScheduler:
    """A started scheduler over `channel` with `keys` as its routes (notices from `outbox`)."""
    scheduler = RouteScheduler({"fake": channel}, store, outbox=outbox, **options)
    for key in keys:
        scheduler.add_route(key)
    await scheduler.start()
    return scheduler


def queue_notices(store: SqliteStore, outbox: NoticeOutbox, key: RouteKey, count: int) -> None:
    """`count` notices recorded pending for `key`, then queued as the channel gets ready (the
    way a restart finds them)."""
    for i in range(count):
        store.add_notice(key.store_key, f"n{i}", f"notice {i}", "pending")
    outbox.channel_ready("fake")


class DedupingChannel(ScriptedChannel):
    """Answers a repeated idempotency key with the message first posted under it (Feishu's
    `uuid`); optionally loses the answer to the very first send after posting it."""

    def __init__(self, *, lose_first_answer: bool = False) -> None:
        super().__init__()
        self.by_key: dict[str, str] = {}
        self._lose_next_answer = lose_first_answer

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        if idempotency_key in self.by_key:
            return self.by_key[idempotency_key]
        message_id = await super().send(chat, message)
        if idempotency_key is not None:
            self.by_key[idempotency_key] = message_id
        if self._lose_next_answer:
            self._lose_next_answer = False
            raise Transient("read timeout after the message was posted")
        return message_id


def text(value: str) -> Outgoing:
    return Outgoing.build(value, {})


async def settle(scheduler: RouteScheduler, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not scheduler.is_idle():
        assert time.monotonic() < deadline, "scheduler did not settle"
        await asyncio.sleep(0.01)


@pytest.fixture
def store(tmp_path: Path) -> SqliteStore:
    db = SqliteStore.in_dir(tmp_path)
    yield db  # type: ignore[misc]
    db.close()


async def test_pin_set_on_a_shown_resident_pins_it_once_beside_a_waiting_card(
    store: SqliteStore,
) -> None:
    """`pin` turned on (a reload) pins the message already shown, once, and the card waiting
    at that moment still goes out; turned off, a replacement is not pinned."""
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("1"), "builder")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    scheduler.submit(key, text("v2"))
    scheduler.set_pin(key, True)
    scheduler.set_pin(key, True)  # unchanged: nothing more
    await settle(scheduler)
    assert [(op, what) for _, op, _, what in channel.calls] == [
        ("send", "v1"),
        ("pin", "1"),
        ("edit", "v2"),
    ]
    assert channel.messages == {"1": "v2"}

    scheduler.set_pin(key, False)
    channel.uneditable.add("1")  # the next edit finds the message gone: a replacement
    scheduler.submit(key, text("v3"))
    await settle(scheduler)
    assert [op for _, op, _, _ in channel.calls[3:]] == ["edit", "send"]
    await scheduler.stop()


async def test_send_then_edit_in_place_and_latest_wins(store: SqliteStore) -> None:
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("1"), "builder")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    for i in range(2, 50):
        scheduler.submit(key, text(f"v{i}"))
    await settle(scheduler)
    await scheduler.stop()
    assert list(channel.messages.values()) == ["v49"]
    assert [c[1] for c in channel.calls].count("send") == 1
    assert len(channel.calls) < 49, "a burst must collapse into few edits"
    record = store.resident(str(key))
    assert record is not None and record.message_id == "1"
    assert record.fingerprint == text("v49").fingerprint


async def test_restart_edits_the_same_message(store: SqliteStore) -> None:
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("1"), "builder")
    first = RouteScheduler({"fake": channel}, store)
    first.add_route(key)
    await first.start()
    first.submit(key, text("before"))
    await settle(first)
    await first.stop()
    second = RouteScheduler({"fake": channel}, store)
    second.add_route(key)
    await second.start()
    second.submit(key, text("after"))
    await settle(second)
    await second.stop()
    assert channel.messages == {"1": "after"}
    assert [c[1] for c in channel.calls] == ["send", "edit"]


async def test_window_never_exceeded_and_fair_share(store: SqliteStore) -> None:
    window = RateScope("unused", max_calls=4, period_s=0.4)
    channel = ScriptedChannel(per_chat=window)
    scheduler = RouteScheduler({"fake": channel}, store)
    keys = [RouteKey("fake", ChatRef("-100"), f"agent{i}") for i in range(6)]
    for key in keys:
        scheduler.add_route(key)
    await scheduler.start()
    for round_no in range(5):
        for key in keys:
            scheduler.submit(key, text(f"{key.agent_id} r{round_no}"))
        await asyncio.sleep(0.05)
    await settle(scheduler)
    await scheduler.stop()
    times = sorted(c[0] for c in channel.calls)
    for i in range(len(times) - window.max_calls):
        assert times[i + window.max_calls] - times[i] >= window.period_s * 0.99
    shown = sorted(channel.messages.values())
    assert shown == sorted(f"{k.agent_id} r4" for k in keys), "every final state lands"
    # Fairness: every agent got its first message out before any agent got a third request.
    first_sends = [c for c in channel.calls if c[1] == "send"]
    assert len(first_sends) == len(keys)
    last_first_send = max(c[0] for c in first_sends)
    per_agent_before: dict[str, int] = {}
    for when, _, _, body in channel.calls:
        if when < last_first_send:
            agent = body.split()[0]
            per_agent_before[agent] = per_agent_before.get(agent, 0) + 1
    assert max(per_agent_before.values(), default=0) <= 1


async def test_rate_limited_pauses_scope_and_persists(store: SqliteStore) -> None:
    channel = ScriptedChannel(per_chat=RateScope("x", 100, 1.0))
    key = RouteKey("fake", ChatRef("5"), "a")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    channel.errors["edit"].append(RateLimited(0.5, "fake:chat:5"))
    scheduler.submit(key, text("v2"))
    await asyncio.sleep(0.1)
    scheduler.submit(key, text("v3"))
    await settle(scheduler)
    await scheduler.stop()
    edits = [c for c in channel.calls if c[1] == "edit"]
    assert len(edits) == 2, "the limited edit is retried once with the latest bytes"
    assert edits[1][0] - edits[0][0] >= 0.45
    assert edits[1][3] == "v3"
    assert [c[1] for c in channel.calls].count("send") == 1, "never a new message on 429"
    assert "fake:chat:5" in store.pauses()


async def test_gone_message_replaced_once(store: SqliteStore) -> None:
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("5"), "a")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    channel.messages.clear()  # a person deleted it
    scheduler.submit(key, text("v2"))
    await settle(scheduler)
    scheduler.submit(key, text("v3"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"2": "v3"}
    assert [c[1] for c in channel.calls] == ["send", "edit", "send", "edit"]
    record = store.resident(str(key))
    assert record is not None and record.message_id == "2"


async def test_forbidden_disables_one_route_only(store: SqliteStore) -> None:
    channel = ScriptedChannel()
    scheduler = RouteScheduler({"fake": channel}, store)
    kicked = RouteKey("fake", ChatRef("1"), "a")
    fine = RouteKey("fake", ChatRef("2"), "a")
    scheduler.add_route(kicked)
    scheduler.add_route(fine)
    await scheduler.start()
    channel.errors["send"].append(Forbidden("bot was kicked from the group chat"))
    scheduler.submit(kicked, text("k1"))
    await settle(scheduler)
    scheduler.submit(fine, text("f1"))
    scheduler.submit(kicked, text("k2"))
    await settle(scheduler)
    await scheduler.stop()
    assert list(channel.messages.values()) == ["f1"]
    assert scheduler.disabled_reason(kicked) == "bot was kicked from the group chat"
    record = store.resident(str(kicked))
    assert record is not None and record.disabled_reason == "bot was kicked from the group chat"


async def test_replacement_with_a_reused_id_is_not_deleted(store: SqliteStore) -> None:
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("5"), "a")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    channel.messages.clear()
    channel._next = 1  # a platform (or a fresh fake) that hands out the same id again
    scheduler.submit(key, text("v2"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"1": "v2"}


async def test_an_unexpected_exception_does_not_freeze_the_chat(store: SqliteStore) -> None:
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("5"), "a")
    scheduler = await started(store, channel, key, max_backoff_s=0.2)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    channel.errors["edit"].append(BrokenPipeError("stdout went away"))
    scheduler.submit(key, text("v2"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"1": "v2"}


async def test_notices_and_cards_take_turns(store: SqliteStore) -> None:
    channel = ScriptedChannel(per_chat=RateScope("x", 2, 0.3))
    key = RouteKey("fake", ChatRef("-7"), "a")
    outbox = outbox_of(store, channel, key)
    scheduler = await started(store, channel, key, outbox=outbox)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    queue_notices(store, outbox, key, 6)
    scheduler.submit(key, text("v2"))
    await settle(scheduler)
    await scheduler.stop()
    order = [c[3] for c in channel.calls[1:]]
    assert order.index("v2") <= 1, f"the card waited behind the notices: {order}"
    assert sorted(o for o in order if o.startswith("notice")) == [f"notice {i}" for i in range(6)]
    assert store.pending_notices() == []


async def test_unsent_command_replies_collapse_to_the_latest(store: SqliteStore) -> None:
    channel = ScriptedChannel(per_chat=RateScope("x", 1, 0.3))
    scheduler = RouteScheduler({"fake": channel}, store)
    await scheduler.start()
    chat = ChatRef("-9")
    for i in range(5):
        scheduler.send_reply("fake", chat, text(f"reply {i}"))
    await settle(scheduler)
    await scheduler.stop()
    sent = [c[3] for c in channel.calls]
    assert sent[-1] == "reply 4"
    assert len(sent) <= 2


async def test_unsent_replies_collapse_per_key_never_across_keys(
    store: SqliteStore,
) -> None:
    channel = ScriptedChannel(per_chat=RateScope("x", 1, 0.3))
    scheduler = RouteScheduler({"fake": channel}, store)
    await scheduler.start()
    chat = ChatRef("-9")
    for i in range(3):
        for person in ("ann", "bob"):
            scheduler.send_reply("fake", chat, text(f"{person} {i}"), collapse_key=person)
    await settle(scheduler)
    await scheduler.stop()
    sent = [c[3] for c in channel.calls]
    assert "ann 2" in sent and "bob 2" in sent, sent
    assert len(sent) <= 4


async def test_a_send_interrupted_by_a_crash_reuses_its_key(store: SqliteStore) -> None:
    channel = DedupingChannel()
    key = RouteKey("fake", ChatRef("5"), "a")
    # The state a SIGKILL leaves between the platform accepting a send and the id landing.
    store.set_send_key(str(key), "fake:5::a:crashed")
    channel.by_key["fake:5::a:crashed"] = await channel.send(ChatRef("5"), text("old bytes"))
    scheduler = RouteScheduler({"fake": channel}, store)
    scheduler.add_route(key)
    await scheduler.start()
    scheduler.submit(key, text("new bytes"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"1": "new bytes"}, "no duplicate, and the content is current"
    record = store.resident(str(key))
    assert record is not None and record.message_id == "1" and record.send_key is None


async def test_a_route_changed_while_in_flight_waits_for_its_next_turn(
    store: SqliteStore,
) -> None:
    channel = ScriptedChannel()
    channel.delay_s = 0.2
    scheduler = RouteScheduler({"fake": channel}, store)
    a, b, c = (RouteKey("fake", ChatRef("-3"), name) for name in ("a", "b", "c"))
    for key in (a, b, c):
        scheduler.add_route(key)
    await scheduler.start()
    scheduler.submit(a, text("a 1"))
    scheduler.submit(b, text("b 1"))
    await asyncio.sleep(0.05)  # "a 1" is in flight
    scheduler.submit(a, text("a 2"))
    scheduler.submit(c, text("c 1"))  # c started waiting before a's second change is served
    await settle(scheduler)
    await scheduler.stop()
    assert [call[3] for call in channel.calls] == ["a 1", "b 1", "c 1", "a 2"]


async def test_a_failing_route_does_not_starve_its_chat(store: SqliteStore) -> None:
    channel = ScriptedChannel()
    a, b = RouteKey("fake", ChatRef("-4"), "a"), RouteKey("fake", ChatRef("-4"), "b")
    scheduler = await started(store, channel, a, b, max_backoff_s=30.0)
    channel.errors["send"].extend(Transient("down") for _ in range(3))
    scheduler.submit(a, text("a 1"))  # takes the three failures, then backs off for long
    await asyncio.sleep(0.05)
    scheduler.submit(b, text("b 1"))
    deadline = time.monotonic() + 10
    while "b 1" not in channel.messages.values():
        assert time.monotonic() < deadline, "b waited behind a's backoff"
        await asyncio.sleep(0.01)
    await scheduler.stop(grace_s=1)


class AtOnceChannel(ScriptedChannel):
    """Answers every request without ever letting the event loop go round (no await that
    suspends), as a channel that answers from memory would; `on_edit` runs at each edit."""

    def __init__(self, on_edit: Callable[[str], None]) -> None:
        super().__init__()
        self.on_edit = on_edit

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        self.calls.append((time.monotonic(), "send", chat.chat_id, message.text))
        message_id = str(self._next)
        self._next += 1
        self.messages[message_id] = message.text
        return message_id

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        self.calls.append((time.monotonic(), "edit", chat.chat_id, message.text))
        self.messages[message_id] = message.text
        self.on_edit(chat.chat_id)


async def test_a_chat_whose_requests_never_wait_still_lets_other_chats_take_turns(
    store: SqliteStore,
) -> None:
    # Chat -1's card changes again at each of its edits (300 in all), and its channel answers
    # without the loop going round: its lane must still yield after each request, so chat
    # -2's card, submitted meanwhile, goes out among the first few requests, not after all
    # of chat -1's.
    busy, other = RouteKey("fake", ChatRef("-1"), "busy"), RouteKey("fake", ChatRef("-2"), "b")
    edits = 0

    def again(chat_id: str) -> None:
        nonlocal edits
        if chat_id == "-1" and edits < 300:
            edits += 1
            scheduler.submit(busy, text(f"busy {edits}"))

    channel = AtOnceChannel(again)
    scheduler = await started(store, channel, busy, other)
    scheduler.submit(busy, text("busy 0"))
    await wait_for(lambda: "busy 0" in channel.messages.values(), "the busy chat's first card")
    scheduler.submit(busy, text("busy go"))
    scheduler.submit(other, text("other 1"))
    await wait_for(lambda: edits >= 300, "the busy chat's edits")
    await settle(scheduler)
    await scheduler.stop()
    order = [call[3] for call in channel.calls]
    assert order.index("other 1") < 10, order[:20]


async def test_the_stale_copy_of_a_replaced_card_is_deleted_later(store: SqliteStore) -> None:
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("5"), "a")
    scheduler = await started(store, channel, key, max_backoff_s=0.2)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    channel.uneditable.add("1")  # still shown, but too old to edit
    channel.errors["delete"].append(Transient("delete timed out"))
    scheduler.submit(key, text("v2"))
    await settle(scheduler)
    assert channel.messages == {"1": "v1", "2": "v2"}
    record = store.resident(str(key))
    assert record is not None and record.stale_message_id == "1", "kept to delete later"
    scheduler.submit(key, text("v3"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"2": "v3"}
    record = store.resident(str(key))
    assert record is not None and record.stale_message_id is None


async def test_a_retried_send_that_had_posted_is_edited_to_the_latest(
    store: SqliteStore,
) -> None:
    channel = DedupingChannel(lose_first_answer=True)
    key = RouteKey("fake", ChatRef("5"), "a")
    scheduler = await started(store, channel, key, max_backoff_s=0.2)
    scheduler.submit(key, text("v1"))
    await asyncio.sleep(0.1)
    scheduler.submit(key, text("v2"))  # changes during the backoff
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"1": "v2"}


async def test_notices_beyond_the_queue_bound_are_sent_without_a_restart(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import taskcard.bridge.notices.outbox

    monkeypatch.setattr(taskcard.bridge.notices.outbox, "MAX_QUEUED", 2)
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("-8"), "a")
    outbox = outbox_of(store, channel, key)
    scheduler = await started(store, channel, key, outbox=outbox)
    queue_notices(store, outbox, key, 6)
    await settle(scheduler)
    deadline = time.monotonic() + 10
    while store.pending_notices():
        assert time.monotonic() < deadline, "deferred notices were never sent"
        await asyncio.sleep(0.01)
    await scheduler.stop()
    assert sorted(c[3] for c in channel.calls) == [f"notice {i}" for i in range(6)]


async def test_suppressed_notices_are_withdrawn_from_the_queue(store: SqliteStore) -> None:
    channel = ScriptedChannel(per_chat=RateScope("x", 1, 0.5))
    key = RouteKey("fake", ChatRef("-6"), "a")
    outbox = outbox_of(store, channel, key)
    scheduler = await started(store, channel, key, outbox=outbox)
    queue_notices(store, outbox, key, 4)
    await asyncio.sleep(0.1)  # the first one is on its way
    outbox.suppress([key])
    await settle(scheduler)
    await scheduler.stop()
    assert [c[3] for c in channel.calls] == ["notice 0"]
    assert store.pending_notices() == []


@pytest.mark.parametrize(
    ("unsure", "since", "now", "hold", "expected"),
    [
        (5, 100.0, 100.0, None, 0.0),  # the platform deduplicates: always safe
        (0, None, 100.0, 600.0, 0.0),  # the first send
        (1, 100.0, 100.0, 600.0, 0.0),  # the one retry
        (2, 100.0, 100.0, 600.0, 600.0),  # then the hold
        (2, 100.0, 400.0, 600.0, 300.0),
        (2, 100.0, 700.0, 600.0, 0.0),  # the hold has passed: a new episode
        (3, 100.0, 50.0, 600.0, 600.0),  # the wall clock stepped back: never longer
    ],
)
def test_unsure_send_wait(
    unsure: int, since: float | None, now: float, hold: float | None, expected: float
) -> None:
    assert unsure_send_wait_s(unsure, since, now, hold) == expected


class AnswerLosingChannel(ScriptedChannel):
    """Like Telegram: cannot deduplicate sends, and loses the answers of the next
    `lose_answers` sends after posting them."""

    ambiguous_send_hold_s = 600.0

    def __init__(self) -> None:
        super().__init__()
        self.lose_answers = 0

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        message_id = await super().send(chat, message)
        if self.lose_answers:
            self.lose_answers -= 1
            raise OutcomeUnknown("connection closed before the answer")
        return message_id


async def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_what_a_send_must_leave_behind_is_one_transaction_before_it(
    tmp_path: Path, statements: list[str]
) -> None:
    """The key and the unsure count of a send go to the store in one transaction before the
    request (they were two): a crash in the middle of it finds both, and a new resident
    costs one write fewer (bench/RESULTS.md, start-up). A retry writes the count alone."""
    ran = statements
    store = SqliteStore.in_dir(tmp_path / "state")
    channel = AnswerLosingChannel()
    channel.lose_answers = 1
    key = RouteKey("fake", ChatRef("5"), "a")
    mono = [1000.0]
    try:
        scheduler = await started(store, channel, key, clock=lambda: mono[0])
        ran.clear()
        scheduler.submit(key, text("v1"))
        await wait_for(lambda: len(channel.calls) == 1, "the first send")
        lost = store.resident(str(key))
        assert lost is not None and lost.send_key and lost.unsure_sends == 1, "both on disk"
        mono[0] += 5  # past the backoff
        scheduler.submit(key, text("v2"))
        await wait_for(lambda: scheduler.message_id(key) is not None, "the retry answered")
        await scheduler.stop()
    finally:
        store.close()
    transactions: list[list[str]] = []
    for statement in ran:
        if statement.startswith("BEGIN"):
            transactions.append([])
        elif transactions:
            transactions[-1].append(statement)
    # The trace shows each statement with its values: "SET send_key = 'fake:5::a:...'".
    writes = [
        " ".join(t)
        for t in transactions
        if any(re.match(r"UPDATE residents SET (send_key|unsure_sends) =", s) for s in t)
    ]
    assert len(writes) == 2, writes
    first, retry = writes
    assert re.search(r"SET send_key = '[^']+', unsure_sends = 1,", first), first
    assert "send_key" not in retry and "unsure_sends = 2," in retry, "the key is kept"
    store_after = SqliteStore.in_dir(tmp_path / "state")
    try:
        record = store_after.resident(str(key))
    finally:
        store_after.close()
    assert record is not None and record.message_id is not None and record.send_key is None


async def test_an_unanswered_send_is_retried_once_then_held(store: SqliteStore) -> None:
    channel = AnswerLosingChannel()
    channel.lose_answers = 2
    mono, wall = [1000.0], [1e9]
    a, b = RouteKey("fake", ChatRef("5"), "a"), RouteKey("fake", ChatRef("5"), "b")
    scheduler = await started(
        store, channel, a, b, clock=lambda: mono[0], wall_clock=lambda: wall[0]
    )

    def sends() -> int:
        return sum(1 for call in channel.calls if call[1] == "send")

    scheduler.submit(a, text("a v1"))
    await wait_for(lambda: sends() == 1, "the first send")
    mono[0] += 5  # past the backoff
    scheduler.submit(a, text("a v2"))
    await wait_for(lambda: sends() == 2, "the one retry")
    mono[0] += 60
    scheduler.submit(a, text("a v3"))
    scheduler.submit(b, text("b v1"))  # served after a's turn in the same chat
    await wait_for(lambda: "b v1" in channel.messages.values(), "the other route")
    assert sends() == 3 and sorted(channel.messages.values()) == ["a v1", "a v2", "b v1"]
    record = store.resident(str(a))
    assert record is not None and record.message_id is None and record.unsure_sends == 2

    mono[0] += 600
    wall[0] += 600
    scheduler.submit(a, text("a v4"))
    await wait_for(lambda: "a v4" in channel.messages.values(), "a send after the hold")
    await scheduler.stop()
    record = store.resident(str(a))
    assert record is not None and record.message_id is not None and record.unsure_sends == 0


async def test_a_released_resident_shows_its_last_word_then_a_new_message(
    store: SqliteStore,
) -> None:
    """A card retired beside a board: edited once more, then let go (also in the store), so
    the next content is a new message; with nothing to edit, a release sends nothing."""
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("1"), "builder")
    never_shown = RouteKey("fake", ChatRef("1"), "quiet")
    scheduler = await started(store, channel, key, never_shown)
    scheduler.submit(key, text("needs people"))
    await settle(scheduler)
    scheduler.submit(key, text("resolved"), release=True)
    scheduler.submit(never_shown, text("resolved too"), release=True)
    await settle(scheduler)
    assert channel.messages == {"1": "resolved"}
    assert not scheduler.has_message(key)
    record = store.resident(str(key))
    assert record is not None and record.message_id is None
    scheduler.submit(key, text("needs people again"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"1": "resolved", "2": "needs people again"}
    assert [c[1] for c in channel.calls] == ["send", "edit", "send"]


async def test_a_newer_submit_cancels_a_pending_release(store: SqliteStore) -> None:
    channel = ScriptedChannel()
    channel.delay_s = 0.05
    key = RouteKey("fake", ChatRef("1"), "builder")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    scheduler.submit(key, text("resolved"), release=True)
    scheduler.submit(key, text("needs people again"))  # before the release went out
    await settle(scheduler)
    await scheduler.stop()
    assert scheduler.has_message(key)
    assert channel.messages == {"1": "needs people again"}


async def test_a_last_edit_edits_its_message_or_nothing_and_keeps_it_for_a_return(
    store: SqliteStore,
) -> None:
    """The last edit of a route that closes (its chat no longer follows the agent): shown by
    an edit; a message found gone is not posted anew, nor is one never sent; the message
    stays the route's, so a later card edits it again."""
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("1"), "builder")
    gone = RouteKey("fake", ChatRef("1"), "deleted")
    never_shown = RouteKey("fake", ChatRef("1"), "quiet")
    scheduler = await started(store, channel, key, gone, never_shown)
    scheduler.submit(key, text("running"))
    scheduler.submit(gone, text("running too"))
    await settle(scheduler)
    del channel.messages["2"]  # a person deleted it
    scheduler.submit(key, text("no longer followed"), last=True)
    scheduler.submit(gone, text("no longer followed"), last=True)
    scheduler.submit(never_shown, text("no longer followed"), last=True)
    await settle(scheduler)
    assert channel.messages == {"1": "no longer followed"}
    assert [c[1] for c in channel.calls] == ["send", "send", "edit", "edit"]
    assert scheduler.settled(key) and scheduler.settled(gone) and scheduler.settled(never_shown)
    scheduler.submit(key, text("followed again"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"1": "followed again"}
    record = store.resident(str(key))
    assert record is not None and record.message_id == "1"


class GatedChannel(ScriptedChannel):
    """Holds every send until `gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        self.waiting += 1
        await self.gate.wait()
        return await super().send(chat, message)


async def test_a_lane_is_idle_only_with_nothing_waiting_and_nothing_on_its_way(
    store: SqliteStore,
) -> None:
    channel = GatedChannel()
    key = RouteKey("fake", ChatRef("1"), "builder")
    other = RouteKey("fake", ChatRef("2"), "builder")
    scheduler = await started(store, channel, key, other)
    assert scheduler.lane_idle(key.lane) and scheduler.lane_idle(other.lane)
    scheduler.submit(key, text("v1"))
    assert not scheduler.lane_idle(key.lane)  # waiting
    assert scheduler.lane_idle(other.lane)
    await wait_for(lambda: channel.waiting == 1, "the send on its way")
    assert not scheduler.lane_idle(key.lane)  # on its way
    channel.gate.set()
    await settle(scheduler)
    assert scheduler.lane_idle(key.lane)
    scheduler.send_reply("fake", key.chat, text("an answer"))
    assert not scheduler.lane_idle(key.lane)  # a reply waits
    await settle(scheduler)
    await scheduler.stop()
    assert scheduler.lane_idle(key.lane)


async def test_a_route_sent_next_takes_its_lanes_next_turn_ahead_of_those_waiting(
    store: SqliteStore,
) -> None:
    """`go_next` (a start's last edit that waited past its bound for an idle lane): the
    route goes right after the request on its way, before the routes queued ahead of it,
    and round-robin goes on after it."""
    channel = GatedChannel()
    a, b, c = (RouteKey("fake", ChatRef("1"), name) for name in ("a", "b", "c"))
    scheduler = await started(store, channel, a, b, c)
    for key in (a, b, c):
        scheduler.submit(key, text(f"{key.agent_id} 1"))
    await wait_for(lambda: channel.waiting == 1, "a's send on its way")
    scheduler.go_next(c)
    scheduler.go_next(RouteKey("fake", ChatRef("2"), "a"))  # no lane: nothing to do
    channel.gate.set()
    await settle(scheduler)
    await scheduler.stop()
    assert [call[3] for call in channel.calls] == ["a 1", "c 1", "b 1"]


@pytest.mark.parametrize(
    ("per_chat", "lane", "pace_s"),
    [
        (RateScope("chat", 20, 60.0), LaneKey("fake", "1"), 3.0),  # a Telegram group
        (RateScope("chat", 5, 1.0), LaneKey("fake", "1"), 0.2),
        (None, LaneKey("fake", "1"), 0.0),  # no limit named
        (RateScope("chat", 20, 60.0), LaneKey("other", "1"), 0.0),  # not served here
    ],
)
async def test_a_lanes_pace_is_its_slowest_scopes_sustained_spacing(
    store: SqliteStore, per_chat: RateScope | None, lane: LaneKey, pace_s: float
) -> None:
    scheduler = RouteScheduler({"fake": ScriptedChannel(per_chat)}, store)
    assert scheduler.lane_pace_s(lane) == pytest.approx(pace_s)


async def test_a_shown_card_is_kept_as_its_fingerprint_only(store: SqliteStore) -> None:
    """Memory: a resident holds no copy of the card it shows; a gone message is still replaced
    by the next card, and the same card again sends nothing."""
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("7"), "a")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    assert scheduler._residents[key].desired is None, "the shown card must not be kept"
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    assert scheduler._residents[key].desired is None
    channel.messages.clear()  # a person deleted it
    scheduler.submit(key, text("v2"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"2": "v2"}
    assert [c[1] for c in channel.calls] == ["send", "edit", "send"]


class PanelChannel(ScriptedChannel):
    """A channel whose messages end with the process (the console's panels)."""

    messages_outlive_process = False


async def test_a_route_added_again_edits_its_panel_of_this_run(store: SqliteStore) -> None:
    # A route closed and opened again while serving (a reload that drops an agent, then one
    # that brings it back) sent a second panel and left the first one showing the old card:
    # only an earlier run's panels are gone.
    channel = PanelChannel()
    key = RouteKey("fake", ChatRef("1"), "builder")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("before"))
    await settle(scheduler)
    scheduler.remove_route(key)
    scheduler.add_route(key)
    scheduler.submit(key, text("after"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"1": "after"}
    assert [c[1] for c in channel.calls] == ["send", "edit"]
    restarted = await started(store, channel, key)  # a new process: its panel is new
    restarted.submit(key, text("after"))
    await settle(restarted)
    await restarted.stop()
    assert [c[1] for c in channel.calls] == ["send", "edit", "send"]


class BotWidePinChannel(ScriptedChannel):
    """Pins and deletes spend no budget of the chat's, as on Telegram (the bot's only)."""

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        if operation in ("pin", "delete"):
            return ()
        return super().rate_scopes(chat, operation, message_id)


async def test_a_pin_waits_for_a_pause_another_route_of_its_chat_drew(
    store: SqliteStore,
) -> None:
    """A 429 on one route's edit pauses the chat: another route's pin, whose own scopes do
    not include the chat's, goes out only once that window has ended, and then by itself."""
    channel = BotWidePinChannel(per_chat=RateScope("x", 100, 1.0))
    a, b = RouteKey("fake", ChatRef("5"), "a"), RouteKey("fake", ChatRef("5"), "b")
    scheduler = await started(store, channel, a, b)
    scheduler.submit(a, text("a1"))
    scheduler.submit(b, text("b1"))
    await settle(scheduler)
    channel.errors["edit"].append(RateLimited(1.0, "fake:chat:5"))
    channel.delay_s = 0.3
    scheduler.submit(a, text("a2"))
    deadline = time.monotonic() + 30
    while scheduler.settled(a, in_flight_only=True):
        assert time.monotonic() < deadline, "the edit never went"
        await asyncio.sleep(0.005)
    scheduler.set_pin(b, True)  # queued while the edit is on its way: b's turn comes first
    await settle(scheduler)
    await scheduler.stop()
    limited_at = next(at for at, op, _, _ in channel.calls if op == "edit")
    pins = [at for at, op, _, _ in channel.calls if op == "pin"]
    assert len(pins) == 1 and pins[0] >= limited_at + 1.0


async def test_a_put_off_delete_that_then_fails_for_now_waits_for_the_next_delivery(
    store: SqliteStore,
) -> None:
    """The delete of a replaced copy draws a 429, is tried again after the window by itself,
    and fails for now: it is kept for the route's next delivery, not tried in a loop."""
    channel = ScriptedChannel()
    key = RouteKey("fake", ChatRef("5"), "a")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    channel.uneditable.add("1")
    channel.errors["delete"].extend([RateLimited(0.2, "fake:chat:5"), Transient("down")])
    scheduler.submit(key, text("v2"))
    await settle(scheduler)
    assert not channel.errors["delete"], "the delete was tried again after the window"
    assert "1" in channel.messages, "the copy stays until the next delivery"
    scheduler.submit(key, text("v3"))
    await settle(scheduler)
    await scheduler.stop()
    assert channel.messages == {"2": "v3"}


class MovedChatChannel(ScriptedChannel):
    """Posts where its chat moved: ids qualified by the new chat, as Telegram's supergroup
    messages after an upgrade."""

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        plain = await super().send(chat, message, idempotency_key=idempotency_key)
        self.messages[f"{plain}@new"] = self.messages.pop(plain)
        return f"{plain}@new"

    def posted_after_move(self, chat: ChatRef, message_id: str) -> bool:
        return message_id.endswith("@new")


async def test_a_card_already_in_the_chat_a_move_led_to_is_not_shown_again(
    store: SqliteStore,
) -> None:
    """The news of the chat's move comes after the route posted its card where the chat is
    now: showing it again would be an edit with the same bytes, refused as "not modified"."""
    channel = MovedChatChannel()
    key = RouteKey("fake", ChatRef("5"), "a")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    scheduler.reshow(key)
    scheduler.submit(key, text("v1"))
    await settle(scheduler)
    await scheduler.stop()
    assert [op for _, op, _, _ in channel.calls] == ["send"]


async def test_a_card_posted_where_the_chat_moved_while_the_news_came_counts_as_shown(
    store: SqliteStore,
) -> None:
    """The news of the move comes while the route's send is on its way, and the send went
    where the chat is now: its answer counts the card as shown (no edit follows)."""
    channel = MovedChatChannel()
    channel.delay_s = 0.3
    key = RouteKey("fake", ChatRef("5"), "a")
    scheduler = await started(store, channel, key)
    scheduler.submit(key, text("v1"))
    deadline = time.monotonic() + 30
    while scheduler.settled(key, in_flight_only=True):
        assert time.monotonic() < deadline, "the send never went"
        await asyncio.sleep(0.005)
    scheduler.reshow(key)
    await settle(scheduler)
    await scheduler.stop()
    assert [op for _, op, _, _ in channel.calls] == ["send"]


async def test_a_lane_request_passed_through_for_its_waits_keeps_results_errors_and_cancels() -> (
    None
):
    """A lane's request runs inside `_Waits.awaited`, which passes its yields through to
    tell whether it let the loop go round: its result, its exceptions and a cancellation
    (the service stopping mid-request) must reach it and come back as without the wrapper."""

    async def answers(wait: bool) -> str:
        if wait:
            await asyncio.sleep(0.01)
        return "done"

    quick, slow = _Waits(), _Waits()
    assert await quick.awaited(answers(False)) == "done" and not quick.suspended
    assert await slow.awaited(answers(True)) == "done" and slow.suspended

    async def fails() -> None:
        await asyncio.sleep(0)
        raise Transient("the channel said no")

    with pytest.raises(Transient, match="the channel said no"):
        await _Waits().awaited(fails())

    cleaned: list[str] = []
    started = asyncio.Event()

    async def hangs() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("the request's own cleanup ran")

    async def lane() -> None:
        await _Waits().awaited(hangs())

    task = asyncio.create_task(lane())
    await asyncio.wait_for(started.wait(), 30.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["the request's own cleanup ran"]

    # A cancellation while the request only yields (no future to carry it): passed in.
    spinning = asyncio.Event()

    async def spins() -> str:
        for _ in range(100_000):
            spinning.set()
            await asyncio.sleep(0)
        return "never cancelled"

    async def spinning_lane() -> str:
        return await _Waits().awaited(spins())

    spinner = asyncio.create_task(spinning_lane())
    await asyncio.wait_for(spinning.wait(), 30.0)
    spinner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await spinner

    waiting = asyncio.Event()

    async def swallows() -> str:
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "stopped cleanly"
        return "never"

    async def lane_that_stops() -> str:
        return await _Waits().awaited(swallows())

    inner = asyncio.create_task(lane_that_stops())
    await asyncio.wait_for(waiting.wait(), 30.0)
    inner.cancel()
    assert await inner == "stopped cleanly"


def test_a_residents_work_and_its_due_time_follow_the_plain_rules() -> None:
    """`pending` and `due_at` (asked several times per change, with shortcuts for a route
    that owes no pin and no delete) answer as the rules they stand for, in every case."""
    import itertools

    shown = Outgoing("shown", {}, "f-shown")
    newer = Outgoing("newer", {}, "f-newer")
    cases = itertools.product(
        (None, shown, newer),  # desired
        (None, "f-newer"),  # failed
        (None, "7"),  # message_id
        (None, "6"),  # stale_id
        (False, True),  # pin_owed
        (False, True),  # delete_owed
        (None, "gone"),  # disabled
    )
    for desired, failed, message_id, stale_id, pin_owed, delete_owed, disabled in cases:
        resident = _Resident(
            RouteKey("telegram", ChatRef("-1"), "a"), False, message_id, "f-shown", disabled
        )
        resident.desired, resident.failed, resident.stale_id = desired, failed, stale_id
        resident.pin_owed, resident.delete_owed = pin_owed, delete_owed
        resident.retry_at, resident.pin_at, resident.delete_at = 5.0, 9.0, 7.0
        card = desired is not None and desired.fingerprint not in ("f-shown", failed)
        pin = pin_owed and message_id is not None
        delete = delete_owed and stale_id is not None and message_id is not None
        assert resident.pending is (disabled is None and (card or pin or delete))
        times = [5.0] * card + [9.0] * pin + [7.0] * delete
        assert resident.due_at() == min(times, default=5.0)


async def test_a_burst_of_new_residents_is_one_info_line_and_a_count(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A start that creates thousands of residents wrote a line for each at INFO; now the
    first is named at INFO, the rest at DEBUG, and their count at INFO (at the minute's end
    or, as here, at the stop)."""
    channel = ScriptedChannel()
    keys = [RouteKey("fake", ChatRef(f"-{chat}"), f"a{chat}") for chat in range(1, 6)]
    with caplog.at_level(logging.DEBUG, logger="taskcard.bridge.schedule.scheduler"):
        scheduler = await started(store, channel, *keys)
        for key in keys:
            scheduler.submit(key, text(f"card of {key}"))
        await settle(scheduler)
        await scheduler.stop()
    created = [r for r in caplog.records if "created" in r.getMessage()]
    at_info = [r.getMessage() for r in created if r.levelno == logging.INFO]
    assert len(at_info) == 2, at_info
    assert re.fullmatch(r"route fake:-\d::a\d: resident message \d+ created", at_info[0])
    assert at_info[1].startswith("4 more resident messages created since the last such line")
    assert sum(r.levelno == logging.DEBUG for r in created) == 4


async def test_a_lanes_wake_behaves_as_an_event_for_its_one_waiter() -> None:
    """Set before the wait: no suspension. Set while waiting: the waiter resumes, once. A
    wait cancelled (a timeout, the lane's stop) leaves the wake usable."""
    wake = _Wake()
    wake.set()
    wake.set()
    assert wake.is_set()
    await wake.wait()  # at once
    wake.clear()
    assert not wake.is_set()
    waiting = asyncio.create_task(wake.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    wake.set()
    wake.set()  # a second set while the waiter has not run yet changes nothing
    await asyncio.wait_for(waiting, timeout=5)
    wake.clear()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await wake.wait()
    waiting = asyncio.create_task(wake.wait())
    await asyncio.sleep(0)
    wake.set()
    await asyncio.wait_for(waiting, timeout=5)


class SendScopesCountingChannel(ScriptedChannel):
    """Counts the chats whose scopes for a send are asked for (a first send, a catch-up)."""

    def __init__(self) -> None:
        super().__init__(per_chat=RateScope("fake", 1000, 1.0))
        self.send_scopes_of: list[ChatRef] = []

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        if operation == "send":
            self.send_scopes_of.append(chat)
        return super().rate_scopes(chat, operation, message_id)


async def test_a_chats_catch_up_is_worked_out_once_per_channel_and_chat(
    store: SqliteStore,
) -> None:
    """Each request's turn needs its chat's catch-up, from the channel's scopes for a send
    there: asked once per chat (and topic), not at every edit."""
    channel = SendScopesCountingChannel()
    keys = [
        RouteKey("fake", ChatRef("1"), "a"),
        RouteKey("fake", ChatRef("1", "7"), "b"),
        RouteKey("fake", ChatRef("2"), "c"),
    ]
    scheduler = await started(store, channel, *keys)
    for key in keys:
        scheduler.submit(key, text(f"{key.agent_id} first"))
    await settle(scheduler)
    assert {chat for chat in channel.send_scopes_of} == {key.chat for key in keys}
    channel.send_scopes_of.clear()
    for round_ in range(3):
        for key in keys:
            scheduler.submit(key, text(f"{key.agent_id} v{round_}"))
        await settle(scheduler)
    await scheduler.stop()
    assert [c[1] for c in channel.calls].count("edit") == 9
    assert channel.send_scopes_of == []


async def test_a_reply_whose_mark_the_store_refused_is_not_left_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A kept command reply on a platform that cannot deduplicate sends is marked unsure in
    the state before its request goes out. When the store refused the mark the reply was not
    sent, but it stayed marked in memory: the next save (of another reply) wrote the mark,
    and a start after a kill then left the reply, never sent, as one that may have been
    posted. The entry it had is put back. (SQLite keeps a write it could not make for later
    rather than raising, so this store refuses the kept replies' writes itself.)"""
    store = SqliteStore.in_dir(tmp_path / "state")
    refusing = True
    write = store.set_cursor

    def set_cursor(key: str, value: str) -> None:
        if refusing and key == PENDING_REPLIES_CURSOR:
            raise OSError("refused")
        write(key, value)

    monkeypatch.setattr(store, "set_cursor", set_cursor)
    channel = AnswerLosingChannel()
    mono = [1000.0]
    try:
        scheduler = RouteScheduler(
            {"fake": channel}, store, clock=lambda: mono[0], keep_replies=True
        )
        await scheduler.start()
        scheduler.channel_ready("fake")
        scheduler.send_reply("fake", ChatRef("5"), text("first"), collapse_key="a")
        refusal = "the state store did not take the reply's send"
        await wait_for(lambda: bool(channel.calls) or refusal in caplog.text, "a send or not")
        assert not channel.calls, "sent without its mark"
        refusing = False
        scheduler.send_reply("fake", ChatRef("5"), text("second"), collapse_key="b")
        await wait_for(lambda: len(channel.calls) == 1, "the second sent")
        kept = json.loads(store.get_cursor(PENDING_REPLIES_CURSOR) or "{}")
        (first,) = kept.values()
        assert first["text"] == "first" and "unsure" not in first, "never sent: not unsure"
        await scheduler.stop()
        # A start after a kill (the first one's retry still a second away) sends it.
        again = RouteScheduler({"fake": channel}, store, keep_replies=True)
        await again.start()
        again.channel_ready("fake")
        await wait_for(lambda: len(channel.calls) == 2, "the first sent by the next start")
        await again.stop()
    finally:
        store.close()
    assert [call[3] for call in channel.calls] == ["second", "first"]
