"""The notice outbox: a notice's whole life, from the producer's notification to its outcome.

Every notice is recorded in the state store before anything is sent, in one of the states
`pending` (to be sent), `folded` (over the route's cap, counted into a summary owed later,
see `NoticeGate`), `suppressed` (people hid the cards there, or the route is disabled: never
sent), then `delivered` or `failed`. On a platform that cannot deduplicate sends (Telegram:
sendMessage takes no idempotency key) a notice is sent at most once: it is recorded `unsure`
*before* its request goes out, set back to `pending` when the platform answers that it did
not post it, and stays `unsure` when no answer came (a lost connection, an answer slower
than the timeout, a crash or kill in the middle): it may be in the chat, and a second copy
is worse than a missing one, so neither a retry nor a restart sends it again. The outbox owns
every store call for notices and the queues the scheduler's lanes pull from:

- `notify` records a notification for each route of its agent and queues what is pending;
- `send_due_summaries` records and queues the summary of folded notices when it is due;
- `suppress` withdraws every unsent notice of routes people silenced (also one in flight),
  and `withdraw` those of routes a reload removed;
- `routes_lost` takes the queued notices of routes whose agent another instance serves now
  out of the lanes (clustered: that instance queues them from the store);
- `channel_ready` queues what a restart left pending, once the channel can send;
- a lane asks `next_due` for its next notice, `take`s it, asks whether it is still
  `wanted`, marks it `sending`, and reports the outcome with
  `delivered` (with the id of the message posted, kept with the notice's agent so that a
  reply to it reaches that agent), `failed` or `put_back` (rate limited, transient failure,
  shutting down).

Clustered, two instances can hold the same pending notice in their lanes: the one that lost
the agent's lease queued it before, the one that took the lease over read it from the store.
So the `unsure` mark is conditional: a send begins only by turning the notice from `pending`
to `unsure` in one step of the store (`StateStore.mark_notice_unsure`), which one instance
wins; the other drops it. The same keeps a notice people silenced from going out.

A lane's queue is bounded (`MAX_QUEUED`): beyond it notices wait in the store (`pending`) and
are queued again once the lane has room, so a flood cannot grow memory. Command replies are
not notices (they are not persisted) and never pass through here.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from taskcard.bridge.notices.text import (
    FoldedNotices,
    NoticeGate,
    notice_kind,
    notice_text,
    summary_text,
)
from taskcard.bridge.schedule.routes import LaneKey, RouteKey
from taskcard.bridge.store.sqlite import NoticeState, ReadAhead, StateStore, in_batches
from taskcard.channels.base import Channel, Outgoing
from taskcard.producers.task_card.contract import Notification

log = logging.getLogger(__name__)

# Notices queued in one chat beyond this wait in the store (state "pending") for room.
MAX_QUEUED: Final = 100

NoticeOutcome = Literal["delivered", "failed"]


@dataclass(frozen=True)
class NoticeRef:
    """One notice of one route: its identity in the store and on the platform."""

    route: RouteKey
    notice_id: str

    @property
    def idempotency_key(self) -> str:
        """The same for every attempt, so a platform that deduplicates sends posts it once."""
        return f"{self.route.store_key}:{self.notice_id}"


@dataclass
class QueuedNotice:
    """A notice waiting in (or taken from) its lane, rendered for its channel."""

    ref: NoticeRef
    message: Outgoing
    retry_at: float = 0.0  # the scheduler's backoff: not before this (monotonic) time
    failures: int = 0


@dataclass
class _LaneQueue:
    items: deque[QueuedNotice]
    deferred: bool = False  # notices were left in the store when the queue was full


# Where a route's open fold episode is saved (the route's store key follows).
FOLDED_CURSOR_PREFIX = "notices:folded:"


def _folded_cursor(key: RouteKey) -> str:
    """Where a route's open fold episode is saved, so its summary survives a restart."""
    return FOLDED_CURSOR_PREFIX + key.store_key


class NoticeOutbox:
    """Owns the notices of one service: store records, fold gate, lane queues, outcomes.

    `render(channel, text)` renders a (scrubbed) text for a channel; `scrub` removes the
    configured secrets from a text before it is stored; `quiet(route)` says whether people
    hid the cards of the route or its delivery is disabled; `clock` gives epoch seconds.
    """

    def __init__(
        self,
        store: StateStore,
        channels: Mapping[str, Channel],
        *,
        render: Callable[[Channel, str], Outgoing],
        scrub: Callable[[str], str],
        max_per_minute: int,
        quiet: Callable[[RouteKey], bool],
        clock: Callable[[], float],
        serves: Callable[[RouteKey], bool] = lambda key: True,
    ) -> None:
        self._store = store
        self._channels = channels
        self._render = render
        self._scrub = scrub
        self._quiet = quiet
        # Clustered: only routes of agents this instance holds the lease of are sent from here.
        self._serves = serves
        self._clock = clock
        self._gate = NoticeGate(max_per_minute)
        self._routes: dict[str, RouteKey] = {}
        self._ready: set[str] = set()
        self._lanes: dict[LaneKey, _LaneQueue] = {}
        self._known: set[NoticeRef] = set()  # queued or in flight
        self._withdrawn: set[NoticeRef] = set()  # suppressed while in flight
        # Marked `unsure` by this run, whose `not_sent` the store did not take: still ours.
        self._left_unsure: set[NoticeRef] = set()
        # Called with a lane that has a new notice; the scheduler wakes (or starts) it.
        self.on_queued: Callable[[LaneKey], None] = lambda lane: None

    # Routes and channels -----------------------------------------------------------------

    def add_route(self, key: RouteKey) -> None:
        """Know a route; a fold episode saved before a restart still owes its summary."""
        self._add_route(key, self._store.get_cursor)

    def add_routes(self, keys: Iterable[RouteKey]) -> None:
        """`add_route` of each, the saved fold episodes read in batches (at start: every
        route of the fleet)."""
        store = self._store
        for batch in in_batches(keys):
            saved = ReadAhead(store.get_cursors, store.get_cursor, map(_folded_cursor, batch))
            for key in batch:
                self._add_route(key, saved.take)

    def _add_route(self, key: RouteKey, get_cursor: Callable[[str], str | None]) -> None:
        self._routes[key.store_key] = key
        saved = FoldedNotices.from_json(get_cursor(_folded_cursor(key)))
        if saved is not None:
            self._gate.restore(key.store_key, saved)

    def forget_route(self, key: RouteKey) -> None:
        """Forget a route whose agent left the fleet for good (its rows in the store go
        with the agent's, see `StateStore.forget_agent`)."""
        self._routes.pop(key.store_key, None)
        self._gate.forget(key.store_key)

    def channel_ready(self, channel: str) -> None:
        """The channel can send: queue what is pending for its routes (from before a restart,
        or recorded while it was starting)."""
        if not self._ready:
            self._prune_unsure(None)  # what outlived its keep while the service was down
        self._ready.add(channel)
        self._queue_pending(lambda key: key.channel == channel)

    def channel_lost(self, channel: str) -> None:
        """The channel can no longer send (its credentials were refused): its notices stay
        pending in the store, unsent, until a restart makes it ready again."""
        self._ready.discard(channel)
        for lane, queue in self._lanes.items():
            if lane.channel == channel:
                self._known.difference_update(item.ref for item in queue.items)
                queue.items.clear()

    def route_ready(self, key: RouteKey) -> None:
        """This instance serves `key` from now on: queue what is pending for it (left by the
        instance that served it before)."""
        if key.channel in self._ready:
            self._queue_pending(lambda other: other == key)

    def routes_ready(self, keys: Iterable[RouteKey]) -> None:
        """`route_ready` of each of `keys`, with one read of the pending notices for all of
        them (clustered: the routes of every agent one lease renewal gained)."""
        wanted = {key for key in keys if key.channel in self._ready}
        if wanted:
            self._queue_pending(wanted.__contains__)

    def _queue_pending(self, wanted: Callable[[RouteKey], bool]) -> None:
        for pending in self._store.pending_notices():
            key = self._routes.get(pending.route)
            if key is not None and wanted(key) and self._serves(key):
                self._queue(NoticeRef(key, pending.notice_id), pending.text)

    # Recording ---------------------------------------------------------------------------

    def notify(self, routes: Iterable[RouteKey], agent_id: str, notification: Notification) -> None:
        """Record the agent's notification for each of its routes; queue what may be sent."""
        text = notice_text(agent_id, notification)
        if text is None:
            return
        self.announce(routes, notification.id, text, notice_kind(notification) or "")

    def announce(self, routes: Iterable[RouteKey], notice_id: str, text: str, kind: str) -> None:
        """Record one notice (built from typed fields) for each route, once per `notice_id`
        (idempotent across restarts); `kind` counts it in a fold summary."""
        text = self._scrub(text)  # stored scrubbed: stored texts are rendered again later
        now_s = self._clock()
        for key in routes:
            route_id = key.store_key
            state = self._initial_state(key)
            if state == "pending" and not self._gate.allows(route_id, now_s):
                state = "folded"  # over the route's cap: counted into the owed summary
            if not self._store.add_notice(route_id, notice_id, text, state):
                continue  # already recorded (idempotent): neither sent nor counted again
            if state == "folded":
                folded = self._gate.fold(route_id, kind, now_s)
                self._store.set_cursor(_folded_cursor(key), folded.to_json())
            elif state == "pending":
                self._gate.record(route_id, now_s)
                self._queue(NoticeRef(key, notice_id), text)

    def send_due_summaries(self) -> None:
        """One summary notice for each route whose folded notices are due (see NoticeGate)."""
        for route_id, folded in self._gate.due(self._clock()):
            key = self._routes.get(route_id)
            if key is None:
                continue
            text = self._scrub(summary_text(key.agent_id, folded.counts))
            state = self._initial_state(key)
            # Recorded before the episode is cleared: a crash in between finds the same id.
            if self._store.add_notice(route_id, folded.summary_id, text, state) and (
                state == "pending"
            ):
                self._queue(NoticeRef(key, folded.summary_id), text)
            self._store.set_cursor(_folded_cursor(key), "")

    def suppress(self, routes: Iterable[RouteKey]) -> int:
        """Withdraw every unsent notice of these routes (people asked for quiet): queued ones
        leave their lane, and all are recorded as suppressed, never to be sent. Returns how
        many pending notices were recorded suppressed."""
        keys = set(routes)
        removed: set[NoticeRef] = set()
        for queue in self._lanes.values():
            for item in [i for i in queue.items if i.ref.route in keys]:
                queue.items.remove(item)
                removed.add(item.ref)
                self._known.discard(item.ref)
        count = 0
        for key in keys:
            for notice in self._store.pending_notices(key.store_key):
                self._store.set_notice_state(key.store_key, notice.notice_id, "suppressed")
                count += 1
                ref = NoticeRef(key, notice.notice_id)
                if ref not in removed and ref in self._known:
                    self._withdrawn.add(ref)  # taken by a lane, waiting for its turn
        # In flight and recorded `unsure` (see `sending`): should the platform answer that it
        # did not post it, it is recorded suppressed then (`not_sent`), not pending.
        self._withdrawn.update(ref for ref in self._known - removed if ref.route in keys)
        return count

    def withdraw(self, routes: Iterable[RouteKey]) -> int:
        """The routes went (a reload removed them): every unsent notice of theirs is withdrawn
        as `suppress` does, their fold episode goes without its summary, and they are
        forgotten here, so that nothing more is sent to a chat that no longer follows their
        agent. Returns how many pending notices were recorded suppressed (one in flight
        already is its send's, see `suppress`)."""
        keys = set(routes)
        if not keys:
            return 0
        withdrawn = self.suppress(keys)
        self._store.delete_cursors([_folded_cursor(key) for key in keys])
        for key in keys:
            self.forget_route(key)
        return withdrawn

    def routes_lost(self, routes: Iterable[RouteKey]) -> int:
        """This instance no longer serves these routes (clustered: another instance holds
        their agent's lease now): their queued notices leave the lanes and stay pending in
        the store, for that instance; one a lane took already is refused by `wanted`, and
        one whose send began is that send's. Returns how many left the lanes."""
        keys = set(routes)
        removed = 0
        for queue in self._lanes.values():
            for item in [i for i in queue.items if i.ref.route in keys]:
                queue.items.remove(item)
                self._known.discard(item.ref)
                removed += 1
        return removed

    def _initial_state(self, key: RouteKey) -> NoticeState:
        return "suppressed" if self._quiet(key) else "pending"

    def _queue(self, ref: NoticeRef, text: str) -> None:
        key = ref.route
        if key.channel not in self._ready or ref in self._known:
            return  # sent once the channel is ready (`channel_ready` reads the store)
        queue = self._lanes.setdefault(key.lane, _LaneQueue(deque()))
        if len(queue.items) >= MAX_QUEUED:
            log.warning("%s: too many queued notices; notice %s deferred", key.lane, ref.notice_id)
            queue.deferred = True  # it stays pending in the store; queued again with room
            return
        channel = self._channels[key.channel]
        queue.items.append(QueuedNotice(ref, self._render(channel, text)))
        self._known.add(ref)
        self.on_queued(key.lane)

    # The lanes' side ---------------------------------------------------------------------

    def next_due(self, lane: LaneKey, now: float) -> QueuedNotice | None:
        """The lane's first notice not backing off at `now` (monotonic), or None."""
        queue = self._lanes.get(lane)
        if queue is None:
            return None
        if queue.deferred and len(queue.items) < MAX_QUEUED // 2:
            self._refill(lane, queue)
        return next((item for item in queue.items if item.retry_at <= now), None)

    def retry_times(self, lane: LaneKey) -> list[float]:
        """When the lane's queued notices may go (for the lane's sleep)."""
        queue = self._lanes.get(lane)
        return [item.retry_at for item in queue.items] if queue else []

    def take(self, item: QueuedNotice) -> None:
        """Off the queue while in flight: never withdrawn from under a request."""
        self._lanes[item.ref.route.lane].items.remove(item)

    def wanted(self, item: QueuedNotice) -> bool:
        """False when people silenced the route while the notice waited for its turn, or
        when this instance no longer serves it (clustered: the lease of its agent moved;
        the instance holding it now sends it)."""
        if item.ref in self._withdrawn:
            self._withdrawn.discard(item.ref)
            self._known.discard(item.ref)
            return False
        if not self._serves(item.ref.route):
            self._known.discard(item.ref)
            self._left_unsure.discard(item.ref)
            log.info(
                "%s: notice %s not sent from here: another instance serves agent %s now",
                item.ref.route.channel,
                item.ref.notice_id,
                item.ref.route.agent_id,
            )
            return False
        return True

    def put_back(self, item: QueuedNotice, *, front: bool) -> None:
        """Not sent this time (rate limited, failing for now, shutting down): queue it again,
        at the head to keep the order, or at the tail behind the rest while it backs off."""
        queue = self._lanes.setdefault(item.ref.route.lane, _LaneQueue(deque()))
        if front:
            queue.items.appendleft(item)
        else:
            queue.items.append(item)

    def sending(self, item: QueuedNotice) -> bool:
        """Its request is about to go out on a platform that cannot deduplicate sends: record
        it `unsure` first, so that a crash before the answer leaves it unsent by a restart
        (at most once). Raises when the store cannot take it or keeps it to write later (a
        full disk, a locked state file): then it is not sent now. False when it is no longer
        pending in the store (clustered: the instance that took its agent over sent it, or
        is sending it): then it is dropped here, never sent from this instance."""
        ref = item.ref
        key = ref.route
        with self._store.at_once():
            if ref in self._left_unsure:  # marked by this run, its `not_sent` lost: ours
                self._store.set_notice_state(key.store_key, ref.notice_id, "unsure")
                self._left_unsure.discard(ref)
                return True
            if self._store.mark_notice_unsure(key.store_key, ref.notice_id):
                return True
        self._known.discard(ref)
        self._withdrawn.discard(ref)
        log.info(
            "%s: notice %s not sent from here: it is no longer pending in the state store"
            " (another instance sent it or is sending it, or it was withdrawn)",
            key.channel,
            ref.notice_id,
        )
        return False

    def not_sent(self, item: QueuedNotice) -> None:
        """The platform answered that it did not post it (rate limited, failing, refused
        credentials): `pending` again, to be sent later (also by a restart). Best effort: a
        store that fails now leaves it `unsure`, and only this run sends it again."""
        key = item.ref.route
        state: NoticeState = "suppressed" if item.ref in self._withdrawn else "pending"
        try:
            self._store.set_notice_state(key.store_key, item.ref.notice_id, state)
            self._left_unsure.discard(item.ref)
        except Exception as error:
            self._left_unsure.add(item.ref)
            log.warning(
                "%s: notice %s could not be recorded as unsent (%s); a restart does not send it",
                key.channel,
                item.ref.notice_id,
                type(error).__name__,
            )

    def abandon(self, item: QueuedNotice) -> None:
        """No answer came to its send (or the service stopped in the middle): it stays
        `unsure` in the store, as `sending` recorded it, and is never sent again."""
        self._known.discard(item.ref)
        self._withdrawn.discard(item.ref)
        self._left_unsure.discard(item.ref)
        self._prune_unsure(item.ref.route.store_key)

    def _prune_unsure(self, route: str | None) -> None:
        """Keep the unsure notices of `route` (of all when None) to their bound
        (`UNSURE_KEEP_PER_ROUTE`, `UNSURE_KEEP_S`); best effort, tried again at the next."""
        try:
            self._store.prune_unsure_notices(self._clock(), route)
        except Exception as error:
            log.warning(
                "could not forget the oldest unsure notices (%s); tried again later",
                type(error).__name__,  # not its text: a Redis error's can quote a key
            )

    def done(
        self, item: QueuedNotice, outcome: NoticeOutcome, message_id: str | None = None
    ) -> None:
        """The platform's final answer for this notice; `message_id`, the message it posted."""
        self._known.discard(item.ref)
        self._withdrawn.discard(item.ref)  # silenced while in flight: it went all the same
        self._left_unsure.discard(item.ref)
        key = item.ref.route
        self._store.set_notice_state(key.store_key, item.ref.notice_id, outcome)
        if outcome == "delivered" and message_id is not None:
            self._remember_message(key, message_id)

    def _remember_message(self, key: RouteKey, message_id: str) -> None:
        """Keep whose notice `message_id` is, so that a reply to it reaches that agent. Best
        effort: the notice is out either way, and a store that fails now only leaves a
        reply to it unanswered, as a reply to any message of the service's but a card."""
        try:
            self._store.remember_notice(
                key.channel, key.chat.chat_id, message_id, key.agent_id, self._clock()
            )
        except Exception as error:
            log.warning(
                "%s: could not record that message %s is a notice about %s (%s); a reply to"
                " it reaches no agent",
                key.channel,
                message_id,
                key.agent_id,
                type(error).__name__,
            )

    def depth(self, lane: LaneKey) -> int:
        queue = self._lanes.get(lane)
        return len(queue.items) if queue else 0

    def lanes(self) -> list[LaneKey]:
        return list(self._lanes)

    def idle(self) -> bool:
        """No notice is queued in any lane."""
        return not any(queue.items for queue in self._lanes.values())

    def _refill(self, lane: LaneKey, queue: _LaneQueue) -> None:
        """Queue notices that were left in the store while the lane's queue was full."""
        queue.deferred = False
        for pending in self._store.pending_notices():
            key = self._routes.get(pending.route)
            if key is not None and key.lane == lane and self._serves(key):
                self._queue(NoticeRef(key, pending.notice_id), pending.text)
