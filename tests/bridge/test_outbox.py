"""The notice outbox alone: what is recorded in which state, what a lane gets, and outcomes.

The scheduler tests and the e2e flood and restart tests show the same through a platform; here
each step of a notice's life is checked against the real store, with time injected."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from taskcard.bridge.notices.outbox import NoticeOutbox, QueuedNotice
from taskcard.bridge.schedule.routes import LaneKey, RouteKey
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
from taskcard.producers.task_card.contract import SOURCE_ERROR, Notification

GROUP = ChatRef("-100", "7")
KEY = RouteKey("rec", GROUP, "a")
LANE = LaneKey("rec", "-100")


class TextOnly(Channel):
    """Renders texts; the outbox never sends, so requests are not expected."""

    name = "rec"

    async def start(self, on_command: CommandSink) -> None: ...
    async def stop(self) -> None: ...
    def render_card(self, view: CardView) -> Outgoing:
        raise AssertionError("the outbox renders no card")

    def render_text(self, text: str) -> Outgoing:
        return Outgoing.build(text, {})

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        return ()

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        raise AssertionError("the outbox sends nothing itself")

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None: ...
    async def delete(self, chat: ChatRef, message_id: str) -> None: ...
    async def pin(self, chat: ChatRef, message_id: str) -> None: ...


def error(notice_id: str, code: str = "renderer_timeout") -> Notification:
    return Notification(
        id=notice_id,
        source=SOURCE_ERROR,
        ref_id="tc_1",
        priority="high",
        header="ignored header",
        body="ignored body with token=abc",
        extra={"state": "error", "code": code},
        at=None,
    )


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore.in_dir(tmp_path)
    yield opened
    opened.close()


def make(
    store: SqliteStore,
    *,
    quiet: bool = False,
    per_minute: int = 5,
    serves: Callable[[RouteKey], bool] = lambda key: True,
    clock: Clock | None = None,
) -> NoticeOutbox:
    outbox = NoticeOutbox(
        store,
        {"rec": TextOnly()},
        render=lambda channel, text: channel.render_text(text),
        scrub=lambda text: text.replace("secret", "[redacted]"),
        max_per_minute=per_minute,
        quiet=lambda key: quiet,
        clock=clock or Clock(),
        serves=serves,
    )
    outbox.add_route(KEY)
    return outbox


def test_a_notice_is_recorded_and_queued_once_the_channel_is_ready(store: SqliteStore) -> None:
    outbox = make(store)
    woken: list[LaneKey] = []
    outbox.on_queued = woken.append
    outbox.notify([KEY], "a", error("n1"))
    assert [p.notice_id for p in store.pending_notices()] == ["n1"]
    assert outbox.next_due(LANE, 0.0) is None  # the channel is not ready yet
    outbox.channel_ready("rec")
    item = outbox.next_due(LANE, 0.0)
    assert item is not None and item.ref.notice_id == "n1" and woken == [LANE]
    assert "task card error" in item.message.text and "ignored" not in item.message.text
    assert item.ref.idempotency_key == "rec:-100:7:a:n1"


def test_the_same_notification_is_never_recorded_twice(store: SqliteStore) -> None:
    outbox = make(store)
    outbox.channel_ready("rec")
    outbox.notify([KEY], "a", error("n1"))
    outbox.notify([KEY], "a", error("n1"))
    assert outbox.depth(LANE) == 1


def test_a_quiet_route_records_its_notices_as_suppressed(store: SqliteStore) -> None:
    outbox = make(store, quiet=True)
    outbox.channel_ready("rec")
    outbox.notify([KEY], "a", error("n1"))
    assert store.notice_counts() == {"suppressed": 1}
    assert outbox.idle()


def test_notices_over_the_cap_are_folded_into_one_summary(store: SqliteStore) -> None:
    outbox = make(store, per_minute=2)
    outbox.channel_ready("rec")
    for index in range(5):
        outbox.notify([KEY], "a", error(f"n{index}"))
    assert store.notice_counts() == {"pending": 2, "folded": 3}
    assert outbox.depth(LANE) == 2


def test_an_outcome_is_recorded(store: SqliteStore) -> None:
    outbox = make(store)
    outbox.channel_ready("rec")
    outbox.notify([KEY], "a", error("n1"))
    outbox.notify([KEY], "a", error("n2", code="renderer_crashed"))
    first = outbox.next_due(LANE, 0.0)
    assert first is not None
    outbox.take(first)
    outbox.done(first, "delivered")
    second = outbox.next_due(LANE, 0.0)
    assert second is not None
    outbox.take(second)
    outbox.done(second, "failed")
    assert store.notice_counts() == {"delivered": 1, "failed": 1}
    assert outbox.idle()


def test_a_notice_put_back_keeps_its_place_or_waits_its_backoff(store: SqliteStore) -> None:
    outbox = make(store)
    outbox.channel_ready("rec")
    outbox.notify([KEY], "a", error("n1"))
    outbox.notify([KEY], "a", error("n2", code="renderer_crashed"))
    first = outbox.next_due(LANE, 0.0)
    assert isinstance(first, QueuedNotice)
    outbox.take(first)
    outbox.put_back(first, front=True)  # rate limited: still first
    assert outbox.next_due(LANE, 0.0) is first
    outbox.take(first)
    first.retry_at = 10.0
    outbox.put_back(first, front=False)  # failing for now: behind, and not before 10
    second = outbox.next_due(LANE, 0.0)
    assert second is not None and second.ref.notice_id == "n2"
    assert outbox.retry_times(LANE) == [0.0, 10.0]


def test_suppressing_withdraws_queued_and_in_flight_notices(store: SqliteStore) -> None:
    outbox = make(store)
    outbox.channel_ready("rec")
    outbox.notify([KEY], "a", error("n1"))
    outbox.notify([KEY], "a", error("n2", code="renderer_crashed"))
    in_flight = outbox.next_due(LANE, 0.0)
    assert in_flight is not None
    outbox.take(in_flight)
    outbox.suppress([KEY])
    assert outbox.idle()
    assert outbox.wanted(in_flight) is False  # the lane drops it after its wait
    assert store.notice_counts() == {"suppressed": 2}


def test_a_notice_sent_at_most_once_is_unsure_until_answered(store: SqliteStore) -> None:
    outbox = make(store)
    outbox.channel_ready("rec")
    outbox.notify([KEY], "a", error("n1"))
    item = outbox.next_due(LANE, 0.0)
    assert item is not None
    outbox.take(item)
    outbox.sending(item)  # recorded before the request: a crash now leaves it unsent
    assert store.notice_counts() == {"unsure": 1} and store.pending_notices() == []
    outbox.not_sent(item)  # the platform answered that it posted nothing: pending again
    assert [p.notice_id for p in store.pending_notices()] == ["n1"]
    outbox.put_back(item, front=True)
    outbox.take(item)
    outbox.sending(item)
    outbox.abandon(item)  # no answer: it may be in the chat, never sent again
    assert store.notice_counts() == {"unsure": 1} and outbox.idle()


def test_a_notice_silenced_while_its_send_is_unsure_is_not_pending_again(
    store: SqliteStore,
) -> None:
    outbox = make(store)
    outbox.channel_ready("rec")
    outbox.notify([KEY], "a", error("n1"))
    item = outbox.next_due(LANE, 0.0)
    assert item is not None
    outbox.take(item)
    outbox.sending(item)
    outbox.suppress([KEY])
    outbox.not_sent(item)  # answered without posting: people silenced it meanwhile
    outbox.put_back(item, front=True)
    assert store.notice_counts() == {"suppressed": 1}
    assert outbox.wanted(item) is False


def test_a_restart_queues_what_was_left_pending(store: SqliteStore) -> None:
    store.add_notice(KEY.store_key, "old", "left over from the last run", "pending")
    store.add_notice("rec:-100:7:someone-else", "x", "not our route", "pending")
    outbox = make(store)
    outbox.channel_ready("rec")
    item = outbox.next_due(LANE, 0.0)
    assert item is not None and item.message.text == "left over from the last run"
    assert outbox.depth(LANE) == 1


def test_a_full_lane_defers_to_the_store_and_refills(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import taskcard.bridge.notices.outbox

    monkeypatch.setattr(taskcard.bridge.notices.outbox, "MAX_QUEUED", 2)
    outbox = make(store, per_minute=60)
    outbox.channel_ready("rec")
    for index in range(4):
        outbox.notify([KEY], "a", error(f"n{index}", code=f"c{index}"))
    assert outbox.depth(LANE) == 2
    assert len(store.pending_notices()) == 4
    for _ in range(4):
        item = outbox.next_due(LANE, 0.0)
        assert item is not None
        outbox.take(item)
        outbox.done(item, "delivered")
    assert store.pending_notices() == []


def test_of_two_instances_that_queued_a_notice_one_sends_it(store: SqliteStore) -> None:
    """Clustered, the instance that lost an agent's lease still had its notice queued when
    the one taking over queued it from the store: the send begins only from `pending`, so
    the second to begin drops it instead of posting it again."""
    first = make(store)
    first.channel_ready("rec")
    first.notify([KEY], "a", error("n1"))
    second = make(store)
    second.channel_ready("rec")  # reads what is pending: the same notice
    mine, theirs = first.next_due(LANE, 0.0), second.next_due(LANE, 0.0)
    assert mine is not None and theirs is not None and mine.ref == theirs.ref
    second.take(theirs)
    assert second.sending(theirs) is True
    first.take(mine)
    assert first.sending(mine) is False, "the other instance has it: not sent from here"
    assert first.idle() and store.notice_counts() == {"unsure": 1}
    second.done(theirs, "delivered")
    assert store.notice_counts() == {"delivered": 1}
    first.route_ready(KEY)  # served here again later: nothing of it is queued again
    assert first.idle()


def test_a_send_whose_unsent_answer_the_store_missed_still_goes_from_this_run(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`not_sent` could not record it pending again: it stays `unsure` in the store (no
    other instance or restart sends it), and this run, which marked it, still may."""
    outbox = make(store)
    outbox.channel_ready("rec")
    outbox.notify([KEY], "a", error("n1"))
    item = outbox.next_due(LANE, 0.0)
    assert item is not None
    outbox.take(item)
    assert outbox.sending(item)
    with monkeypatch.context() as patched:

        def refuse(*args: object) -> None:
            raise OSError("disk full")

        patched.setattr(store, "set_notice_state", refuse)
        outbox.not_sent(item)
    assert store.notice_counts() == {"unsure": 1}
    outbox.put_back(item, front=True)
    outbox.take(item)
    assert outbox.sending(item) is True
    outbox.done(item, "delivered")
    assert store.notice_counts() == {"delivered": 1}


def test_the_notices_of_an_agent_served_elsewhere_now_leave_the_lanes(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease moved: queued notices leave the lanes, one a lane took is not wanted, and
    a lane refilled from the store takes none of them; all stay pending for the instance
    serving the agent now, and come back here once this one serves it again."""
    import taskcard.bridge.notices.outbox

    monkeypatch.setattr(taskcard.bridge.notices.outbox, "MAX_QUEUED", 2)
    served = {KEY}
    outbox = make(store, per_minute=60, serves=served.__contains__)
    outbox.channel_ready("rec")
    for index in range(4):
        outbox.notify([KEY], "a", error(f"n{index}", code=f"c{index}"))
    taken = outbox.next_due(LANE, 0.0)
    assert taken is not None
    outbox.take(taken)
    served.clear()
    assert outbox.routes_lost([KEY]) == 1
    assert outbox.next_due(LANE, 0.0) is None, "the refill takes no route served elsewhere"
    assert outbox.wanted(taken) is False
    assert outbox.idle() and len(store.pending_notices()) == 4
    served.add(KEY)
    outbox.routes_ready([KEY])
    assert outbox.depth(LANE) == 2, "queued again, the lane's bound kept"


def test_withdrawing_a_route_a_reload_removed(store: SqliteStore) -> None:
    """Its queued, taken and folded notices never go, nor a summary of the folded ones."""
    clock = Clock()
    outbox = make(store, per_minute=2, clock=clock)
    outbox.channel_ready("rec")
    for index in range(4):
        outbox.notify([KEY], "a", error(f"n{index}", code=f"c{index}"))
    taken = outbox.next_due(LANE, 0.0)
    assert taken is not None
    outbox.take(taken)
    assert store.notice_counts() == {"pending": 2, "folded": 2}
    assert store.cursor_keys("notices:folded:") != [], "a summary is owed"
    assert outbox.withdraw([KEY]) == 2
    assert outbox.idle() and outbox.wanted(taken) is False
    assert store.notice_counts() == {"suppressed": 2, "folded": 2}
    assert store.cursor_keys("notices:folded:") == []
    clock.now += 3600
    outbox.send_due_summaries()
    assert outbox.idle() and store.pending_notices() == []
    again = make(store, clock=clock)  # a restart, or a reload routing it again
    again.channel_ready("rec")
    again.send_due_summaries()
    assert again.idle()
