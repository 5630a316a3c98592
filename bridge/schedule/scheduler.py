"""The route scheduler: one resident message per route, paced within the platforms' limits.

A *route* is (channel, chat, forum thread, agent). Routes that share a chat share a *lane*:
one worker task per chat that performs at most one request at a time, so a route never has
more than one request in flight and the chat's limit is honoured. Each route keeps only the
latest desired message (latest wins: a burst collapses into its final state), and the lane
serves routes round-robin, so residents sharing a chat share its limit fairly.

What a route does with its desired message:

- no resident yet: send one, persist its id at once, pin it when the route asks;
- otherwise edit it in place; `NotModified` counts as success;
- `MessageGone`: forget the id and send one replacement (never for a rate-limited edit);
- `RateLimited`: pause exactly the named scope for `retry_after` (also across restarts), keep
  the message pending, send nothing in that scope meanwhile. A pin or a delete answered so
  pauses its scope too (on Telegram the chat: its edits wait as well, on purpose, since the
  429 says "this chat, wait", and asking on during the window makes the wait grow, while a
  held edit loses nothing), and is itself put off to the window's end, when the route comes
  back for it by itself. Pins and deletes, which spend only the bot's (the app's) budget,
  also wait for a pause of their chat's scopes that another request drew (`_pause_left_s`);
- `Forbidden`: disable the route with the reason; other routes carry on;
- `Transient`: retry with capped exponential backoff; `Permanent`: give up on those bytes;
- a send whose answer was lost (`OutcomeUnknown`, or a crash mid-send) on a platform that
  cannot deduplicate sends may have posted a copy: it is counted in the store *before* the
  request goes out, retried once, and after that no send of the route is tried for the
  channel's `ambiguous_send_hold_s` (so each such episode leaves at most one extra copy).

Committed state (fingerprint, time) advances only after the platform accepted the request.
Short text messages use the same lanes and limits, taking turns with cards: notices are
pulled from the notice outbox (`bridge.notices.outbox`, which owns their life and records their
outcome), command replies are queued here (unsent ones collapse; with `keep_replies` the
unsent ones are kept in the store until sent, so a stop after the command's update was
confirmed does not lose its answer: the next start sends it once its channel is ready; on a
platform that cannot deduplicate sends it is marked unsure before its request goes out, and a
start after a kill in the middle leaves it, as the outbox leaves such a notice).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import types
import uuid
from collections import deque
from collections.abc import (
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from taskcard.bridge.notices.outbox import NoticeOutbox, QueuedNotice
from taskcard.bridge.schedule.admission import AdmissionQueue, catch_up
from taskcard.bridge.schedule.ratelimit import (
    DEFAULT_MAX_PAUSE_S,
    Admission,
    Limiter,
    RateLimiter,
)
from taskcard.bridge.schedule.routes import LaneKey as LaneKey
from taskcard.bridge.schedule.routes import RouteKey as RouteKey
from taskcard.bridge.schedule.routes import chat_scope as chat_scope
from taskcard.bridge.store.sqlite import (
    ReadAhead,
    ResidentRecord,
    StateStore,
    in_batches,
    stored_time,
)
from taskcard.channels.aio import Backoff, wait_first
from taskcard.channels.base import (
    Channel,
    ChatRef,
    Operation,
    Outgoing,
    RateScope,
    ReplyTo,
    counted,
)
from taskcard.channels.errors import (
    AppUnavailable,
    ChannelError,
    CredentialsRejected,
    Forbidden,
    MessageGone,
    NotModified,
    OutcomeUnknown,
    Permanent,
    RateLimited,
    Transient,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# The requests inside each rate window at the last stop (see `Scheduler._keep_recent_requests`).
RECENT_REQUESTS_CURSOR = "ratelimit:recent"
# The command replies not sent yet (see `keep_replies`).
PENDING_REPLIES_CURSOR = "replies:pending"
# A route's card the platform refused for good, kept for `taskcard status` until a later card
# of the route goes through: `{"reason": text, "at": epoch seconds}` under this prefix and the
# route's store key (which ends with the agent's id, so a departed agent's is forgotten too).
CARD_REFUSED_PREFIX = "card-refused:"
MAX_REFUSAL_CHARS = 500
# The apps a platform refuses as a whole for now (`AppUnavailable`), kept for `taskcard status`
# until a request of the channel goes through: `{scope: {"reason": text, "at": epoch}}`.
APP_UNAVAILABLE_CURSOR = "app-unavailable"
# "resident message N created": the first of a burst at INFO at once, the others of the next
# minute at DEBUG and counted in one INFO line at its end (a start of 10,000 agents wrote
# 10,000 lines, about 2-4% of the start's CPU; bench/RESULTS.md, 2026-12-04).
CREATED_SUMMARY_S = 60.0


def card_refused_key(route: str) -> str:
    """The store key of the refusal kept for the route whose store key is `route`."""
    return CARD_REFUSED_PREFIX + route


def parse_app_unavailable(raw: str | None) -> dict[str, tuple[str, float | None]]:
    """The apps held as unavailable, by their scope: the reason and since when (epoch
    seconds, None when unreadable); {} when none is kept or the value is not this shape."""
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    found: dict[str, tuple[str, float | None]] = {}
    for scope, entry in data.items():
        if isinstance(entry, dict) and isinstance(entry.get("reason"), str):
            at = entry.get("at")
            usable = isinstance(at, int | float) and not isinstance(at, bool) and at == at
            found[scope] = (entry["reason"], float(at) if usable and at is not None else None)
    return found


def parse_card_refused(raw: str | None, route: str) -> tuple[str, float | None] | None:
    """The refusal kept for the route whose store key is `route` (its reason and when, in
    epoch seconds), or None: none kept, or a value this release cannot read. A start that is
    no time a date can show (`1e308`, text, edited by hand) is unknown, with one warning as
    the store gives for its other values: the reason is still worth showing."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("reason"), str):
        return None
    at = data.get("at")
    since = None if isinstance(at, str) else stored_time(at)
    if since is None:
        log.warning(
            "the start of the refusal of card %s holds %.40r, not a time; it is taken as unknown",
            route[:200],
            at,
        )
    return data["reason"], since


def card_refusal_marked(raw: str | None) -> bool:
    """Whether the refusal kept as `raw` (see `parse_card_refused`) was told in its chat by
    the short card: a start in the middle of the run of refusals does not tell it again."""
    try:
        data = json.loads(raw or "")
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("marked") is True


@dataclass
class _Resident:
    key: RouteKey
    pin: bool
    message_id: str | None
    committed: str | None
    disabled: str | None
    desired: Outgoing | None = None
    failed: str | None = None  # fingerprint the platform rejected for good
    # The refusal the store keeps for `taskcard status` (None: none kept), and whether this
    # route keeps one at all (a /tell status message is not listed there).
    refusal: str | None = None
    refused_at: float | None = None  # when it began (epoch seconds), kept while it lasts
    keeps_refusal: bool = True
    # The short card saying the latest one was refused (`refusal_marker`), while it is the
    # one desired or shown: the chat is told once per refusal run, until a card goes through.
    marker: Outgoing | None = None
    marked: bool = False  # the marker of this refusal run was shown
    stale_id: str | None = None  # a replaced message still to delete (persisted)
    send_key: str | None = None  # the same for every retry of one intended send
    # Attempts made with `send_key` (one restored from before a restart counts): after a
    # repeated attempt the platform may answer with the first post and its older bytes.
    send_attempts: int = 0
    unsure_sends: int = 0  # sends begun without a known outcome (see MAX_UNSURE_SENDS)
    unsure_at: float | None = None  # wall-clock start of the latest one
    retry_at: float = 0.0  # per-route backoff: not before this (monotonic) time
    failures: int = 0  # failed attempts in a row, for the backoff
    release: bool = False  # once `desired` is shown, let go of the message (see `submit`)
    last: bool = False  # `desired` is the resident's last word: an edit only (see `submit`)
    paced: bool = False  # requests spread at the chat's pace rather than in bursts (a board)
    pin_owed: bool = False  # `pin` turned on while a message was shown: pin that one
    pin_at: float = 0.0  # an owed pin goes no sooner than this (monotonic): a 429's window
    pin_failures: int = 0  # pins failed for now in a row, for the backoff
    # The message the store holds as owing its pin (see `RouteScheduler._owe_pin`).
    pin_saved: str | None = None
    # The delete of `stale_id` was put off by a 429 (or a pause of its chat): the route comes
    # back for it at `delete_at` (monotonic), whether or not its card changes meanwhile. Also
    # set at start for a copy the last run left undeleted (`stale_message_id` in the store).
    delete_owed: bool = False
    delete_at: float = 0.0
    reply_to: ReplyTo | None = None  # the command this resident answers (a /tell status)
    id_unsaved: bool = False  # the store did not take `message_id`: written at the next turn
    # `reshow` came while a request of the route was on its way (see `RouteScheduler.reshow`).
    reshown_in_flight: bool = False

    @property
    def card_pending(self) -> bool:
        """The latest card is not shown yet (and was not refused for good)."""
        return (
            self.desired is not None
            and self.desired.fingerprint != self.committed
            and self.desired.fingerprint != self.failed
        )

    @property
    def pin_pending(self) -> bool:
        return self.pin_owed and self.message_id is not None

    @property
    def delete_pending(self) -> bool:
        return self.delete_owed and self.stale_id is not None and self.message_id is not None

    @property
    def pending(self) -> bool:
        """The route has work: its card, an owed pin, or a put-off delete."""
        if self.disabled is not None:
            return False
        # Asked several times per change: the pin's and the delete's properties only when
        # one is owed at all (most often neither), and `card_pending` spelled out (a frame).
        desired = self.desired
        return (
            desired is not None
            and desired.fingerprint != self.committed
            and desired.fingerprint != self.failed
        ) or ((self.pin_owed or self.delete_owed) and (self.pin_pending or self.delete_pending))

    def due_at(self) -> float:
        """When the route's next turn may go (monotonic): its backoff, and for a pin or a
        delete a 429 put off, the end of that window."""
        if not (self.pin_owed or self.delete_owed):
            return self.retry_at  # its card's turn, or none: the backoff (most often)
        times = []
        if self.card_pending:
            times.append(self.retry_at)
        if self.pin_pending:
            times.append(max(self.retry_at, self.pin_at))
        if self.delete_pending:
            times.append(max(self.retry_at, self.delete_at))
        return min(times, default=self.retry_at)


def _already_shown(resident: _Resident, message: Outgoing, in_flight: bool) -> bool:
    """Whether `message` is what the resident shows now, with nothing on its way that could
    replace it: then it need not be kept. (With a newer card waiting or a delivery in flight,
    the latest is kept as before: it must win over the bytes on their way.)"""
    return (
        not in_flight
        and resident.desired is None
        and not resident.release
        and resident.message_id is not None
        and message.fingerprint == resident.committed
    )


@dataclass
class _Reply:
    """A command reply: collapsed to the latest of its `collapse_key` while unsent, kept in
    the store until sent when the scheduler keeps replies. `collapse_key` names who asked
    and what (None when not known: a reply kept by a version that did not record it)."""

    chat: ChatRef
    message: Outgoing
    idempotency_key: str
    reply_to: ReplyTo | None = None
    retry_at: float = 0.0
    failures: int = 0
    collapse_key: str | None = None
    # As the store keeps it (see `_kept_reply`): kept again with `unsure` set before a send
    # that may post it without an answer (see `RouteScheduler._reply_sending`).
    entry: dict[str, Any] = field(default_factory=dict)


_Text = _Reply | QueuedNotice


class SharedReplies(Protocol):
    """Where a cluster keeps its unsent command replies, each under its idempotency key,
    for whichever instance runs on when this one stops (see `bridge.cluster.replies`)."""

    def keep(self, key: str, entry: dict[str, Any]) -> None:
        """Keep one reply (as `_kept_reply` reads it) as this instance's."""
        ...

    async def mark(self, key: str, entry: dict[str, Any]) -> None:
        """Keep one reply as `entry` (marked `unsure`) before its send, after the writes of
        `key` asked for before; raises when the store did not take it."""
        ...

    def forget(self, key: str) -> None:
        """The reply was sent, refused for good or replaced."""
        ...


def _thread(reply: _Reply) -> str | None:
    """The thread a reply goes to when its `chat` does not name it (see `ReplyTo`)."""
    return None if reply.reply_to is None else reply.reply_to.thread_id


def _kept_reply(key: str, entry: object) -> _Reply | None:
    """A reply as `RouteScheduler.submit_reply` keeps it in the store, or None when the entry
    is not one (each field of the type it is written with)."""
    if not isinstance(entry, dict):
        return None
    ids = (str, int)
    answered = entry.get("reply_to")
    fields_ok = (
        isinstance(entry.get("channel"), str)
        and isinstance(entry.get("chat_id"), ids)
        and isinstance(entry.get("thread_id"), str | None)
        and isinstance(entry.get("text"), str)
        and isinstance(entry.get("payload"), dict)
        and isinstance(entry.get("fingerprint"), str)
        and isinstance(entry.get("collapse_key"), str | None)
    )
    answered_ok = answered is None or (
        isinstance(answered, list)
        and len(answered) == 2  # [message id, thread id]
        and isinstance(answered[0], ids)
        and isinstance(answered[1], str | None)
    )
    if not (fields_ok and answered_ok):
        return None
    return _Reply(
        ChatRef(str(entry["chat_id"]), entry["thread_id"]),
        Outgoing(entry["text"], entry["payload"], entry["fingerprint"]),
        key,
        None if answered is None else ReplyTo(str(answered[0]), answered[1]),
        collapse_key=entry.get("collapse_key"),
        entry=entry,
    )


def _unsure_reply(entry: object) -> bool:
    """Whether a kept reply's send had begun, on a platform that cannot deduplicate sends,
    when its instance stopped: it may be in the chat, and it is never sent again."""
    return isinstance(entry, dict) and entry.get("unsure") is True


class _RouteQueue:
    """The routes waiting in a lane, in round-robin order, with a set beside the order: asking
    whether a route waits already (every change asks) costs one look-up however many wait,
    where a scan of the deque cost one comparison per waiting route, which made a burst in a
    chat with many routes quadratic."""

    __slots__ = ("_members", "_order")

    def __init__(self) -> None:
        self._order: deque[RouteKey] = deque()
        self._members: set[RouteKey] = set()

    def __contains__(self, key: object) -> bool:
        return key in self._members

    def __iter__(self) -> Iterator[RouteKey]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def append(self, key: RouteKey) -> None:
        """`key` at the end, unless it waits already (a route waits once)."""
        if key not in self._members:
            self._members.add(key)
            self._order.append(key)

    def remove(self, key: RouteKey) -> None:
        self._order.remove(key)
        self._members.discard(key)

    def to_front(self, key: RouteKey) -> None:
        """`key`, waiting already, takes the next turn (see `RouteScheduler.go_next`)."""
        if key in self._members:
            self._order.remove(key)
            self._order.appendleft(key)


class _Waits:
    """Whether an awaited coroutine suspended its task (`awaited`): it yielded to the event
    loop, which runs every callback and task that was ready before it resumes the task. A
    lane's request that waited for its answer has so let every other ready task run; only
    one that did not (a channel that answered at once) yields at its end.

    Told by passing the coroutine's yields through (each resumption costs a few steps of
    this generator), not by a callback queued when the request starts (`call_soon`), which
    cost a turn of the loop of its own on every request: the loop's next turn ran that
    callback alone, before the answer could be there."""

    __slots__ = ("suspended",)

    def __init__(self) -> None:
        self.suspended = False

    @types.coroutine
    def awaited(self, coroutine: Coroutine[Any, Any, _T]) -> Generator[Any, Any, _T]:
        # Named for the SIGUSR1 dump (`bridge.run.stackdump`), which follows it to show where
        # the request waits: a generator driving a coroutine by hand has no `gi_yieldfrom`.
        driven = coroutine
        send, throw = driven.send, driven.throw
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                yielded = send(value) if error is None else throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            self.suspended = True
            value, error = None, None
            try:
                value = yield yielded
            except GeneratorExit:
                driven.close()
                raise
            except BaseException as caught:  # a cancellation: passed on to the coroutine
                error = caught


class _Wake:
    """A lane's wake-up: `asyncio.Event`'s `set`, `clear`, `is_set` and `wait`, for the one
    task that waits on it (the lane's own). Every change sets it and the lane waits on it
    after every delivery: `Event` keeps a list of waiters and finds its loop through a lock
    at each wait, which cost about 40 bytecodes a change more than this one future.

    Why a change wakes the lane for the loop's next turn rather than starting the lane's
    step in the turn that queued it (a turn less; one turn added to each change measured
    about 260 bytecodes more): a task goes on only in a turn after the future it waits for
    is done, and a new task's first step too, so a step started outside the lane's task
    would have to be driven by hand to its end, `asyncio.Task` written again. Python 3.12's
    `asyncio.eager_task_factory` starts a task's first step at once; the service runs on
    3.11."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        """Until `set` (at once when it is set already)."""
        if self._set:
            return
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None


@dataclass
class _Lane:
    channel: str
    chat_id: str
    routes: _RouteQueue = field(default_factory=_RouteQueue)
    replies: deque[_Reply] = field(default_factory=deque)
    wake: _Wake = field(default_factory=_Wake)
    failures: int = 0  # unexpected lane failures in a row, for the backoff
    task: asyncio.Task[None] | None = None
    text_turn: bool = True  # texts and cards alternate, so neither starves the other
    text_in_flight: bool = False
    route_in_flight: RouteKey | None = None
    # The lane's key, made once: asked several times per change (the chat never changes).
    key: LaneKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.key = LaneKey(self.channel, self.chat_id)


# The chats whose catch-up the scheduler keeps (`RouteScheduler._admit`); past this many, the
# ones kept are dropped and worked out again as they come.
KEPT_CATCH_UPS = 10_000

# Sends of one resident that may each have posted a copy before the route holds: the first
# send and one retry.
MAX_UNSURE_SENDS = 2


class _NotRecorded(Exception):
    """The state store did not take what a send must leave behind before it goes out
    (`Scheduler._before_send`); its argument names the store's error type. Nothing was
    sent."""


def pace_s(scopes: Sequence[RateScope]) -> float:
    """The spacing that spends a request's scopes at their sustained rate (0: no scope).

    A sliding window of 20 per 60 s lets 20 requests go at once and then none for a minute:
    for a resident that changes all the time (a board in a busy group) that is a minute of
    staleness after every burst. Spaced by period / max_calls of its slowest scope, the same
    budget gives one request every 3 s, and no window ever fills.
    """
    return max((scope.period_s / scope.max_calls for scope in scopes), default=0.0)


def unsure_send_wait_s(
    unsure_sends: int, unsure_at: float | None, now: float, hold_s: float | None
) -> float:
    """Seconds before a resident may be sent again (0: now), given its unanswered sends.

    `hold_s` None: the channel deduplicates sends, so a retry is always safe. Below
    `MAX_UNSURE_SENDS` the retry goes at once. At the bound, the route waits `hold_s` from the
    start of the latest unanswered send (never longer, should the wall clock step back);
    once that has passed a new episode may begin.
    """
    if hold_s is None or unsure_sends < MAX_UNSURE_SENDS or unsure_at is None:
        return 0.0
    return max(0.0, min(hold_s, unsure_at + hold_s - now))


class RoutesAhead:
    """The store's rows of many routes about to be added (each one's resident and kept
    refusal), read in one batch each and taken route by route (see `ReadAhead`): at start,
    every route of the fleet; clustered, every route of the agents one lease renewal gained."""

    __slots__ = ("records", "refusals")

    def __init__(self, store: StateStore, keys: Iterable[RouteKey]) -> None:
        routes = [key.store_key for key in keys]
        self.records: ReadAhead[str, ResidentRecord] = ReadAhead(
            store.residents_of, store.resident, routes
        )
        self.refusals: ReadAhead[str, str] = ReadAhead(
            store.get_cursors, store.get_cursor, map(card_refused_key, routes)
        )


class RouteScheduler:
    """Owns every lane task; `start()` then `submit`/`send_reply`, then `stop()`."""

    def __init__(
        self,
        channels: Mapping[str, Channel],
        store: StateStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_backoff_s: float = 60.0,
        max_pause_s: float = DEFAULT_MAX_PAUSE_S,
        outbox: NoticeOutbox | None = None,
        limiter: Limiter | None = None,
        on_credentials_rejected: Callable[[str, ChannelError], None] | None = None,
        keep_replies: bool = False,
        shared_replies: SharedReplies | None = None,
        refusal_marker: Callable[[RouteKey], Outgoing | None] | None = None,
    ) -> None:
        """`outbox`: where the lanes take notices from (None: this scheduler sends none).
        `on_credentials_rejected(channel, error)`: a platform refused the channel's
        credentials (a revoked token); the caller stops using that channel.
        `keep_replies`: unsent command replies are kept in the store, and the next start
        sends them (`channel_ready`). `shared_replies`: clustered, they are kept there
        instead, and the instance that takes them over sends them (`adopt_replies`).
        `refusal_marker(route)`: the short card shown in place of one the platform refused
        for good (None: none for that route), so the chat does not go on showing an older
        card as if it were the latest."""
        self._channels = channels
        self._refusal_marker = refusal_marker
        self._on_credentials_rejected = on_credentials_rejected
        self._store = store
        self._clock = clock
        self._wall = wall_clock
        self._pause_unsaved = False  # a pause the store refused, said once until one is saved
        # The scopes of apps the platform refuses as a whole for now, with the reason said
        # (once, until a request of the channel goes through again).
        # Those an earlier run kept (reason ""): said again if still so, cleared once not.
        try:
            kept = parse_app_unavailable(store.get_cursor(APP_UNAVAILABLE_CURSOR))
        except Exception:
            kept = {}  # the store's own warning says it; status then shows none
        self._unavailable: dict[str, str] = dict.fromkeys(kept, "")
        # The latest pin refusal said for each chat (channel, chat id), so it is said once.
        self._pins_refused: dict[tuple[str, str], str] = {}
        self._backoff = Backoff(initial_s=min(1.0, max_backoff_s), max_s=max_backoff_s)
        # Shared by several instances when clustered; in memory otherwise.
        self._limiter = limiter or RateLimiter(clock, max_pause_s=max_pause_s)
        # Chats waiting for room in a shared scope (the bot's budget) take turns.
        self._admission = AdmissionQueue(self._limiter, clock)
        # Each chat's catch-up (`admission.catch_up` of its channel's scopes for a send
        # there), worked out once per channel and chat: a channel's limits stay as built for
        # its life. Bounded as the channels bound their own kept scopes.
        # (Keyed by the chat's fields, hashed in C, not by the `ChatRef`, whose hash is not.)
        self._catch_ups: dict[tuple[Channel, str, str | None], int] = {}
        self._residents: dict[RouteKey, _Resident] = {}
        # Routes of channels whose messages end with the process (the console) added since
        # this process started: what the store holds for them then names a panel of this run.
        self._added: set[RouteKey] = set()
        self._lanes: dict[LaneKey, _Lane] = {}
        self._closing = asyncio.Event()
        self._started = False
        # Unsent command replies as the store keeps them, by idempotency key (None: not kept),
        # and those of the last run waiting for their channel to be ready.
        self._kept_replies: dict[str, dict[str, Any]] | None = {} if keep_replies else None
        self._held_replies: list[tuple[str, _Reply]] = []
        self._shared_replies = shared_replies
        self._ready: set[str] = set()  # channels `channel_ready` named
        # A request was admitted since the windows were last kept (see `keep_windows`).
        self._windows_changed = False
        self._created_summary: asyncio.TimerHandle | None = None
        self._created_more = 0
        self._record_failing = False  # a card shown could not be recorded (see `_record`)
        self._outbox = outbox
        if outbox is not None:
            outbox.on_queued = self._wake_lane

    # Configuration ---------------------------------------------------------------------

    def add_route(
        self,
        key: RouteKey,
        *,
        pin: bool = False,
        paced: bool = False,
        reply_to: ReplyTo | None = None,
        keeps_refusal: bool = True,
        ahead: RoutesAhead | None = None,
    ) -> None:
        """`paced`: the route's requests are spread at its chat's sustained rate (`pace_s`)
        instead of spending the chat's window in bursts; for a resident that changes all the
        time, such as a board. `reply_to`: the command the resident answers; its message is
        posted as a reply to it (see `Channel.send`). `keeps_refusal`: a card the platform
        refuses for good is kept in the store for `taskcard status` (see `_keep_refusal`).
        `ahead`: the route's rows read ahead with others' (`read_ahead`)."""
        self._add_route(
            key,
            pin=pin,
            paced=paced,
            reply_to=reply_to,
            keeps_refusal=keeps_refusal,
            record=(
                self._store.resident(key.store_key)
                if ahead is None
                else ahead.records.take(key.store_key)
            ),
            kept=None if ahead is None else ahead.refusals,
        )

    def read_ahead(self, keys: Iterable[RouteKey]) -> RoutesAhead:
        """What the store keeps for the routes of `keys` (their residents, kept refusals),
        read in one batch each for `add_route` to take route by route."""
        return RoutesAhead(self._store, keys)

    def add_routes(self, routes: Iterable[tuple[RouteKey, bool]], *, paced: bool = False) -> None:
        """`add_route` of each (key, pin), with what the store keeps for them (the resident,
        a kept refusal) read in batches: at start, every route of the fleet is added at once,
        and one read per route per batch is most of the store's work then."""
        for batch in in_batches(routes):
            ahead = self.read_ahead(key for key, _ in batch)
            for key, pin in batch:
                self._add_route(
                    key,
                    pin=pin,
                    paced=paced,
                    record=ahead.records.take(key.store_key),
                    kept=ahead.refusals,
                )

    def _add_route(
        self,
        key: RouteKey,
        *,
        pin: bool,
        paced: bool,
        record: ResidentRecord | None,
        reply_to: ReplyTo | None = None,
        keeps_refusal: bool = True,
        kept: ReadAhead[str, str] | None = None,
    ) -> None:
        """`add_route` with the route's record as the store keeps it (`kept`: its refusal
        read ahead, see `add_routes`)."""
        channel = self._channels.get(key.channel)
        if channel is not None and not channel.messages_outlive_process:
            if key not in self._added:
                record = None  # an earlier run's panel is gone with its process: send anew
            self._added.add(key)
        self._residents[key] = _Resident(
            key=key,
            pin=pin,
            paced=paced,
            message_id=record.message_id if record else None,
            committed=record.fingerprint if record else None,
            # A restart gives a disabled route one more chance: the bot may be back.
            disabled=None,
            # A send interrupted by a crash is retried with the same key, so a platform that
            # deduplicates (Feishu) answers with the message it already posted.
            send_key=record.send_key if record else None,
            send_attempts=1 if record and record.send_key else 0,
            # Counted before each send: one cut short by a crash is among them.
            unsure_sends=record.unsure_sends if record else 0,
            unsure_at=record.unsure_at if record else None,
            stale_id=record.stale_message_id if record else None,
            reply_to=reply_to,
            keeps_refusal=keeps_refusal,
            # A pin the last run put off, saw fail for now, or was stopped in the middle of.
            pin_owed=bool(
                pin and record and record.message_id and record.pin_owed_id == record.message_id
            ),
            pin_saved=record.pin_owed_id if record else None,
            # A copy the last run replaced but did not get to delete (the delete was put off
            # by a 429 or a pause, failed for now, or a stop came first): the store keeps it
            # until it is deleted, so it goes as soon as the limits and any stored pause
            # allow, without waiting for the route's next delivery (which may never come).
            delete_owed=bool(
                record
                and record.message_id
                and record.stale_message_id
                and record.stale_message_id != record.message_id
            ),
        )
        resident = self._residents[key]
        if keeps_refusal:
            # A refusal the last run kept stays until a card of the route goes through, and
            # so does whether the chat was told of it (the short card is shown once a run).
            resident.refusal, resident.refused_at, resident.marked = self._kept_refusal(key, kept)
        if (resident.pin_owed or resident.delete_pending) and key.channel in self._ready:
            self._enqueue(resident)  # else once the channel is (`channel_ready`)
        if record and record.disabled_reason:
            self._store.set_disabled(key.store_key, None)
        if record and record.committed_at is not None:
            # The windows are in memory; seed them with the last accepted request so a quick
            # restart does not spend a chat's whole window again at once.
            age_s = self._wall() - record.committed_at
            if channel is not None and 0 <= age_s < 3600:
                scopes = channel.rate_scopes(key.chat, "edit", record.message_id)
                self._limiter.seed(scopes, self._clock() - age_s)

    def set_pin(self, key: RouteKey, pin: bool) -> None:
        """The route's `pin` changed (a reload): a resident message already shown is pinned
        on the route's next turn, and later ones as they are sent. Turning it off pins no
        more; the message pinned before stays pinned until a person unpins it."""
        resident = self._residents.get(key)
        if resident is None or resident.pin == pin:
            return
        resident.pin = pin
        resident.pin_owed = pin and resident.message_id is not None
        self._owe_pin(resident, resident.message_id if resident.pin_owed else None)
        if resident.pin_owed:
            self._enqueue(resident)

    def settled(self, key: RouteKey, *, in_flight_only: bool = False) -> bool:
        """Whether nothing of the route is in flight (and, unless `in_flight_only`, nothing
        waits to go out): it may be removed without losing its last edit."""
        resident = self._residents.get(key)
        if resident is None:
            return True
        lane = self._lanes.get(key.lane)
        if lane is not None and lane.route_in_flight == key:
            return False
        return in_flight_only or not resident.pending

    def remove_route(self, key: RouteKey) -> None:
        """Forget a route closed while serving (check `settled` first); what the store holds
        about its resident stays, so a route opened again edits the same message."""
        self._residents.pop(key, None)
        lane = self._lanes.get(key.lane)
        if lane is not None and key in lane.routes:
            lane.routes.remove(key)

    def has_message(self, key: RouteKey) -> bool:
        resident = self._residents.get(key)
        return resident is not None and resident.message_id is not None

    def message_id(self, key: RouteKey) -> str | None:
        """The id of the route's resident message, None before it was sent."""
        resident = self._residents.get(key)
        return None if resident is None else resident.message_id

    def reshow(self, key: RouteKey) -> None:
        """Deliver the route's next card even if the platform already shows those bytes: its
        chat moved, and the edit that follows finds the old message gone (one replacement).

        A request of the route on its way meanwhile may have been taken by the old chat just
        before the move: its answer must not count the card as shown (it shows, frozen, where
        nobody follows any more), so the route's next turn delivers the card again, whether
        the request was an edit or the first send. A message known to live in the new chat
        already (`Channel.posted_after_move`: the route learned the move itself, from a
        refused request, and posted its replacement there) is not shown again: the edit
        would be refused as "not modified"."""
        resident = self._residents.get(key)
        if resident is None:
            return
        if self._in_flight(key):
            resident.reshown_in_flight = True
        channel = self._channels.get(key.channel)
        shown = resident.message_id
        if shown is not None and not (
            channel is not None and channel.posted_after_move(key.chat, shown)
        ):
            resident.committed = None

    def lane_idle(self, lane_key: LaneKey) -> bool:
        """Whether the chat's lane has nothing waiting and nothing on its way (a card, a
        pin or delete, a reply, a notice): a last edit that can wait goes in then, so no live
        card of the chat queues behind it, or past its bound ahead of them (`go_next`; see
        `Service._held_edit_may_go`)."""
        if self._outbox is not None and self._outbox.depth(lane_key):
            return False
        lane = self._lanes.get(lane_key)
        if lane is None:
            return True
        if lane.route_in_flight is not None or lane.text_in_flight or lane.replies:
            return False
        residents = self._residents
        return not any(key in residents and residents[key].pending for key in lane.routes)

    def go_next(self, key: RouteKey) -> None:
        """The route's pending edit takes the next turn of its lane, ahead of the routes
        waiting there (round-robin goes on after it): for a last edit that waited for the
        lane to be idle past its bound (`Service._held_edit_may_go`). Nothing when the route
        has nothing waiting. Its request is admitted and paced as any other."""
        lane = self._lanes.get(key.lane)
        if lane is not None:
            lane.routes.to_front(key)

    def lane_pace_s(self, lane_key: LaneKey) -> float:
        """The chat's pace: the spacing that spends a message there at the sustained rate of
        its slowest scope (`pace_s`; 3 s in a Telegram group at 20 a minute, 0 for a channel
        that names no limit or is not served here)."""
        channel = self._channels.get(lane_key.channel)
        if channel is None:
            return 0.0
        return pace_s(channel.rate_scopes(ChatRef(lane_key.chat_id), "send", None))

    def disabled_reason(self, key: RouteKey) -> str | None:
        resident = self._residents.get(key)
        return None if resident is None else resident.disabled

    def enable(self, key: RouteKey) -> None:
        resident = self._residents.get(key)
        if resident is not None and resident.disabled is not None:
            resident.disabled = None
            self._store.set_disabled(key.store_key, None)
            self._enqueue(resident)

    def is_idle(self) -> bool:
        """True when no route has pending bytes and no text waits (for shutdown and tests)."""
        if self._outbox is not None and not self._outbox.idle():
            return False
        return not any(r.pending for r in self._residents.values()) and not any(
            lane.replies or lane.text_in_flight for lane in self._lanes.values()
        )

    def lane_depths(self) -> dict[LaneKey, int]:
        """Per lane: routes with undelivered bytes plus queued texts (replies and notices)."""
        depths = {key: len(lane.replies) for key, lane in self._lanes.items()}
        if self._outbox is not None:
            for lane in self._outbox.lanes():
                depths[lane] = depths.get(lane, 0) + self._outbox.depth(lane)
        for resident in self._residents.values():
            if resident.pending:
                depths[resident.key.lane] = depths.get(resident.key.lane, 0) + 1
        return depths

    # Lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        now_wall = self._wall()
        for scope, until in self._store.pauses().items():
            if until > now_wall:
                # A state file from before the cap (or a clock jump) may hold a pause that
                # ends in decades: bounded like a fresh one, and the bound is persisted.
                applied = self._limiter.pause(scope, until - now_wall)
                if applied < until - now_wall:
                    log.warning(
                        "a stored rate-limit pause of %s ran %.0fs more; capped to %.0fs",
                        scope,
                        until - now_wall,
                        applied,
                    )
                    self._store.set_pause(scope, now_wall + applied)
                log.info("honouring a rate-limit pause from before the restart: %s", scope)
        self._seed_recent_requests(now_wall)
        self._load_replies()

    async def stop(self, grace_s: float = 35.0) -> None:
        """Finish requests in flight (up to `grace_s`), then end every lane task.

        The grace covers a send at the channels' request timeout plus its fallback: a send
        cancelled after the platform accepted it would lose the new message id.
        """
        self._closing.set()
        for lane in self._lanes.values():
            lane.wake.set()
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        if tasks:
            _, still_running = await asyncio.wait(tasks, timeout=grace_s)
            for task in still_running:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._keep_recent_requests()
        self._summarise_created()
        await self._admission.close()
        await self._limiter.close()

    def keep_windows(self) -> None:
        """Store the rate windows when a request was admitted since they were last stored;
        the service calls it on its timer, before the store commits its batched writes, so
        the windows go in the same transaction. (Kept only at a clean stop, a restart after a
        SIGKILL knew only each resident's last edit, and its first requests drew a 429.)"""
        if self._windows_changed:
            self._windows_changed = False
            self._keep_recent_requests()

    def _keep_recent_requests(self) -> None:
        """Store the requests still inside their windows (wall-clock times), for a restart.

        Seeded only from each resident's last edit, a run started right after this one took
        a group that this run had just filled for free, and the platform answered 429."""
        recent = self._limiter.recent()
        if recent is None:
            return  # the shared windows outlive this process
        offset = self._wall() - self._clock()
        windows = [
            {
                "scope": scope.key,
                "max_calls": scope.max_calls,
                "period_s": scope.period_s,
                "at": [round(at + offset, 3) for at in times],
            }
            for scope, times in recent.items()
        ]
        try:
            self._store.set_cursor(RECENT_REQUESTS_CURSOR, json.dumps(windows))
        except Exception as error:  # a stop on a failing disk: the next run seeds less
            log.warning("could not keep the rate windows for the next start: %s", error)

    def _seed_recent_requests(self, now_wall: float) -> None:
        """Fill the windows with the requests the last run stored at its stop."""
        raw = self._store.get_cursor(RECENT_REQUESTS_CURSOR)
        if not raw:
            return
        try:
            windows = json.loads(raw)
            scopes = [
                (
                    RateScope(str(w["scope"]), int(w["max_calls"]), float(w["period_s"])),
                    [float(at) for at in w["at"]],
                )
                for w in windows
            ]
        except (ValueError, TypeError, KeyError, OverflowError) as error:
            # Edited by hand: `1e999` reads as infinity, which no count of calls is.
            log.warning("ignoring the stored rate windows of the last run (%s)", error)
            return
        offset = self._clock() - now_wall
        for scope, times in scopes:
            for at in times:
                if 0 <= now_wall - at < scope.period_s:
                    self._limiter.seed([scope], at + offset)

    # Work --------------------------------------------------------------------------------

    def submit(
        self, key: RouteKey, message: Outgoing, *, release: bool = False, last: bool = False
    ) -> None:
        """Make `message` the latest desired content of the route's resident message.

        `release`: `message` is the resident's last word (a card retired beside a board):
        once it is shown, the route lets go of the message, which stays in the chat as it is,
        and a later `submit` sends a new one. Without a message to edit, nothing is sent.
        `last`: `message` is the last edit of a route that closes (its agent retired, its
        chat no longer follows it): it edits the message there or nothing, and a message
        found gone is not replaced, since nobody follows the route any more. The message
        stays the route's, so a route opened again edits it back.
        """
        resident = self._residents.get(key)
        if resident is None:
            return  # not served here (see remove_route)
        resident.release = release
        resident.last = last
        # The fingerprint first: a new card (most often) is not the one shown, whatever is in
        # flight, and asking the lane would be for nothing.
        if message.fingerprint == resident.committed and _already_shown(
            resident, message, self._in_flight(key)
        ):
            resident.desired = None  # the fingerprint is enough (see `_commit`)
            return
        resident.desired = message
        if resident.pending:
            self._enqueue(resident)

    def _in_flight(self, key: RouteKey) -> bool:
        lane = self._lanes.get(key.lane)
        return lane is not None and lane.route_in_flight == key

    def send_reply(
        self,
        channel: str,
        chat: ChatRef,
        message: Outgoing,
        reply_to: ReplyTo | None = None,
        *,
        collapse_key: str | None = None,
    ) -> None:
        """Queue a command reply in the chat's lane, posted as a reply to `reply_to`.

        Unsent replies with the same `collapse_key` in a chat (and thread) collapse into the
        latest: a person repeating `/taskcard` cannot spend the chat's whole budget. The
        service keys a reply by who asked and with which command, so another person's answer,
        or the same person's answer to another command (a `/tell` refused beside a
        `/taskcard`), is never replaced, even when the commands arrive together (one batch
        of Telegram updates). (Notices come from the outbox instead.)
        """
        lane = self._lane(channel, chat.chat_id)
        thread = None if reply_to is None else reply_to.thread_id
        for stale in [
            r
            for r in lane.replies
            if r.chat == chat and _thread(r) == thread and r.collapse_key == collapse_key
        ]:
            lane.replies.remove(stale)
            self._forget_reply(stale, save=False)
        entry = {
            "channel": channel,
            "chat_id": chat.chat_id,
            "thread_id": chat.thread_id,
            "text": message.text,
            "payload": message.payload,
            "fingerprint": message.fingerprint,
            "reply_to": None if reply_to is None else [reply_to.message_id, reply_to.thread_id],
            "collapse_key": collapse_key,
        }
        reply = _Reply(
            chat,
            message,
            f"reply:{uuid.uuid4().hex}",
            reply_to,
            collapse_key=collapse_key,
            entry=entry,
        )
        lane.replies.append(reply)
        # Kept before the caller goes on: the command's update is confirmed after this.
        self._keep_reply(reply, entry)
        lane.wake.set()

    def _keep_reply(self, reply: _Reply, entry: dict[str, Any]) -> bool:
        """Keep `reply` as `entry` in the store (or the cluster's hash) until it is sent;
        False when the store did not take it."""
        if self._kept_replies is not None:
            self._kept_replies[reply.idempotency_key] = entry
            return self._save_replies()
        if self._shared_replies is not None:
            self._shared_replies.keep(reply.idempotency_key, entry)
        return True

    async def _reply_sending(self, reply: _Reply) -> str | None:
        """Its request is about to go out on a platform that cannot deduplicate sends: keep
        it marked `unsure` first, so that a stop or a kill before the answer leaves it unsent
        by the next start (or by the instance taking it over), as a notice is (at most once).
        When the store did not take the mark, why (it is not sent now), and it stays kept as
        it was: left marked, the next save of another reply wrote the mark of a reply never
        sent, and a start after a kill then dropped it."""
        unsure = {**reply.entry, "unsure": True}
        key = reply.idempotency_key
        if self._kept_replies is not None:
            before = self._kept_replies.get(key)
            self._kept_replies[key] = unsure
            if self._save_replies(at_once=True):
                return None
            if before is None:
                del self._kept_replies[key]
            else:
                self._kept_replies[key] = before
            return "not saved"
        if self._shared_replies is not None:
            try:  # in Redis before the request, after the writes of the reply queued earlier
                await self._shared_replies.mark(key, unsure)
            except Exception as error:
                return type(error).__name__  # not its text: a Redis error's can quote a key
        return None

    def _reply_not_sent(self, reply: _Reply) -> None:
        """The platform answered without posting it: kept as unsent again, for a restart."""
        self._keep_reply(reply, reply.entry)

    def channel_ready(self, channel: str) -> None:
        """`channel` can send: the replies the last run left unsent in it go out now, and
        the pins and deletes it left owed."""
        self._ready.add(channel)
        for resident in self._residents.values():
            if resident.key.channel == channel and (
                resident.pin_pending or resident.delete_pending
            ):
                self._enqueue(resident)
        held, self._held_replies = self._held_replies, []
        for name, reply in held:
            if name != channel:
                self._held_replies.append((name, reply))
                continue
            lane = self._lane(name, reply.chat.chat_id)
            lane.replies.append(reply)
            lane.wake.set()

    def adopt_replies(self, kept: Mapping[str, Any]) -> None:
        """Clustered: the replies an instance that stopped or died left unsent (idempotency
        key -> entry), taken over by this one, which sends them now or once their channel
        is ready. An entry this version cannot read is logged and dropped."""
        for key, entry in kept.items():
            if _unsure_reply(entry):
                log.warning(
                    "a command reply a stopped instance was sending may have been posted"
                    " (no answer came); not sent again (%s)",
                    key,
                )
                if self._shared_replies is not None:
                    self._shared_replies.forget(key)
                continue
            reply = _kept_reply(key, entry)
            name = str(entry["channel"]) if reply is not None else ""
            if reply is None or name not in self._channels:
                log.warning("ignoring the unsent command reply %s of a stopped instance", key)
                if self._shared_replies is not None:
                    self._shared_replies.forget(key)
                continue
            log.info("sending a command reply a stopped instance left unsent (chat %s)", reply.chat)
            if name in self._ready:
                lane = self._lane(name, reply.chat.chat_id)
                lane.replies.append(reply)
                lane.wake.set()
            else:
                self._held_replies.append((name, reply))

    def _forget_reply(self, reply: _Reply, *, save: bool = True) -> None:
        """`reply` was sent, refused for good or replaced: the store need not keep it."""
        if self._shared_replies is not None:
            self._shared_replies.forget(reply.idempotency_key)
        if self._kept_replies is None:
            return
        if self._kept_replies.pop(reply.idempotency_key, None) is not None and save:
            self._save_replies()

    def _save_replies(self, *, at_once: bool = False) -> bool:
        """Write the kept replies; `at_once`: on disk now or not at all (a reply's mark)."""
        assert self._kept_replies is not None
        try:
            with self._store.at_once() if at_once else nullcontext():
                self._store.set_cursor(PENDING_REPLIES_CURSOR, json.dumps(self._kept_replies))
        except Exception as error:  # a reply kept to be sent still goes out (a stop before
            # a later save loses it); one whose mark was not taken is not sent now
            log.warning("could not keep the unsent command replies: %s", error)
            return False
        return True

    def _load_replies(self) -> None:
        """The replies the last run left unsent, held until their channel is ready."""
        if self._kept_replies is None:
            return
        raw = self._store.get_cursor(PENDING_REPLIES_CURSOR)
        if not raw:
            return
        try:
            kept = json.loads(raw)
        except ValueError as error:
            log.warning("ignoring the unsent command replies of the last run (%s)", error)
            kept = {}
        if not isinstance(kept, dict):
            log.warning("ignoring the unsent command replies of the last run (not an object)")
            kept = {}
        for key, entry in kept.items():
            # One by one: an entry edited by hand (a topic that is no id) is left out alone,
            # instead of failing at every send and holding up the chat's other answers.
            reply = _kept_reply(key, entry)
            if _unsure_reply(entry):
                log.warning(
                    "a command reply the last run was sending may have been posted (it"
                    " stopped before the answer came); not sent again (%s)",
                    key,
                )
            elif reply is None:
                log.warning("ignoring the unsent command reply %s of the last run: unreadable", key)
            elif entry["channel"] in self._channels:
                self._held_replies.append((entry["channel"], reply))
                self._kept_replies[reply.idempotency_key] = entry
        self._save_replies()

    def _wake_lane(self, lane_key: LaneKey) -> None:
        """The outbox queued a notice in this lane."""
        self._lane_at(lane_key).wake.set()

    def _enqueue(self, resident: _Resident) -> None:
        lane = self._lane_at(resident.key.lane)
        # A route in flight gets its place back (at the tail) when its turn ends: queuing it
        # now would give it two turns in one round, ahead of residents still waiting.
        if resident.key not in lane.routes and resident.key != lane.route_in_flight:
            lane.routes.append(resident.key)
        lane.wake.set()

    def _lane(self, channel: str, chat_id: str) -> _Lane:
        return self._lane_at(LaneKey(channel, chat_id))

    def _lane_at(self, key: LaneKey) -> _Lane:
        """The chat's lane, made (and its task started) when it has none."""
        lane = self._lanes.get(key)
        if lane is None:
            lane = _Lane(key.channel, key.chat_id)
            self._lanes[lane.key] = lane
        if lane.task is None and not self._closing.is_set():
            lane.task = asyncio.create_task(self._run_lane(lane), name=f"lane {key}")
        return lane

    async def _run_lane(self, lane: _Lane) -> None:
        while not self._closing.is_set():
            try:
                await self._lane_step(lane)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug or an unexpected answer must not freeze this chat for good: log it,
                # put every pending route of the chat back, back off, carry on.
                log.exception("lane %s:%s: unexpected failure", lane.channel, lane.chat_id)
                for resident in self._residents.values():
                    key = resident.key
                    if key.lane == lane.key and resident.pending and key not in lane.routes:
                        lane.routes.append(key)
                lane.failures += 1
                await self._wait(None, self._backoff.delay_s(lane.failures))

    async def _lane_step(self, lane: _Lane) -> None:
        """One request of the lane, or a wait for work. A step that did not wait ends by
        giving the other lanes and the loop their turn (`asyncio.sleep(0)`): one step at a
        time. A step that waits has given them theirs, so it does not yield again (a yield
        at the start of every step cost a turn of the loop more for each change), and nor
        does a request that waited for its answer (`_Waits`): only one that ended without
        letting the loop go round (a channel that answered at once) yields."""
        now = self._clock()
        # Most lanes have no reply queued: no generator is made to find none.
        text: _Text | None = self._due_reply(lane, now) if lane.replies else None
        if text is None and self._outbox is not None:
            text = self._outbox.next_due(lane.key, now)
        key = None
        if text is None or not lane.text_turn:
            key = self._next_route(lane, now)
        if key is not None:
            lane.text_turn = True
            lane.route_in_flight = key
            waits = _Waits()
            try:
                await waits.awaited(self._deliver_route(key))
            finally:
                lane.route_in_flight = None
                resident = self._residents.get(key)  # removed meanwhile: not served here
                if resident is not None and resident.pending and key not in lane.routes:
                    lane.routes.append(key)
            lane.failures = 0
            if not waits.suspended:
                await asyncio.sleep(0)  # the turn of the others, unless they had it (see above)
            return
        if text is not None:
            lane.text_turn = False
            self._take(lane, text)  # off the queue while in flight: never coalesced away
            lane.text_in_flight = True
            waits = _Waits()
            try:
                await waits.awaited(self._deliver_text(lane, text))
            finally:
                lane.text_in_flight = False
            lane.failures = 0
            if not waits.suspended:
                await asyncio.sleep(0)  # the turn of the others, unless they had it (see above)
            return
        lane.wake.clear()
        due = [self._residents[k].due_at() for k in lane.routes if self._residents[k].pending]
        if lane.replies:
            due += [r.retry_at for r in lane.replies]
        if self._outbox is not None:
            due += self._outbox.retry_times(lane.key)
        if not due:
            # The usual idle wait (after every delivery), `_wait`'s without its frame, which
            # each suspension and resumption passed through: `stop` sets every lane's wake.
            if not self._closing.is_set():
                await lane.wake.wait()
            return
        if min(due) <= self._clock():
            await asyncio.sleep(0)  # the turn of the others (see above)
            return
        await self._wait(lane.wake, max(0.0, min(due) - self._clock()))

    def _next_route(self, lane: _Lane, now: float) -> RouteKey | None:
        """The first route in round-robin order that has work and is not backing off."""
        for key in list(lane.routes):
            resident = self._residents[key]
            if not resident.pending:
                lane.routes.remove(key)
            elif resident.due_at() <= now:
                lane.routes.remove(key)
                return key
        return None

    @staticmethod
    def _due_reply(lane: _Lane, now: float) -> _Reply | None:
        return next((r for r in lane.replies if r.retry_at <= now), None)

    def _take(self, lane: _Lane, text: _Text) -> None:
        if isinstance(text, _Reply):
            lane.replies.remove(text)
        elif self._outbox is not None:
            self._outbox.take(text)

    def _put_back(self, lane: _Lane, text: _Text, *, front: bool) -> None:
        """A text not sent this time goes back in its queue (at the head keeps its order)."""
        if isinstance(text, _Reply):
            if front:
                lane.replies.appendleft(text)
            else:
                lane.replies.append(text)
        elif self._outbox is not None:
            self._outbox.put_back(text, front=front)

    def _retry_later(self, item: _Resident | _Reply | QueuedNotice, reason: str) -> None:
        """Per-item capped exponential backoff: the rest of the chat keeps going meanwhile."""
        item.failures += 1
        delay_s = self._backoff.delay_s(item.failures)
        item.retry_at = self._clock() + delay_s
        log.warning("%s; retrying in %.0fs", reason, delay_s)

    async def _wait(self, event: _Wake | None, timeout_s: float | None) -> None:
        """Sleep until `event` is set, the timeout passes, or the scheduler closes."""
        if event is None:
            await wait_first(self._closing, timeout_s=timeout_s)
            return
        # A lane's own event is enough: `stop` sets every lane's too. Awaited directly, an
        # idle lane's wait creates no waiter tasks (it happens after every delivery).
        if self._closing.is_set() or event.is_set():
            return
        if timeout_s is None:  # the usual idle wait: no timer to arm and cancel
            await event.wait()
            return
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass

    async def _admit(
        self, channel: Channel, chat: ChatRef, op: Operation, mid: str | None
    ) -> Admission | None:
        """Wait until every scope of the request has room, in turn with the other chats
        that wait for a scope they share (see `bridge.schedule.admission`); None when
        closing."""
        if self._closing.is_set():
            return None
        scopes = channel.rate_scopes(chat, op, mid)
        kept_as = (channel, chat.chat_id, chat.thread_id)
        behind = self._catch_ups.get(kept_as)
        if behind is None:
            if len(self._catch_ups) >= KEPT_CATCH_UPS:
                self._catch_ups.clear()
            behind = catch_up(channel.rate_scopes(chat, "send", None))
            self._catch_ups[kept_as] = behind
        admitted = await self._admission.admit(
            (channel.name, chat.chat_id), scopes, self._closing, behind
        )
        if admitted is not None:
            self._windows_changed = True
        return admitted

    async def paused_s(self, scopes: Sequence[str]) -> float:
        """Seconds left of the longest pause over any of `scopes` (0: none), a pause stored
        by an earlier run or drawn by another instance included: a channel's start waits
        for the pauses over its `Channel.start_scopes`."""
        return await self._limiter.paused_s(scopes)

    def rate_limited(self, error: RateLimited, where: str) -> float:
        """A request made outside the lanes (a channel's start) drew a 429: pause the scope
        it names, here and in the store, as for the lanes' own; returns the seconds applied."""
        return self._rate_limited(error, where)

    def _rate_limited(self, error: RateLimited, where: str) -> float:
        """Pause the scope the platform named for its `retry_after` (bounded), here and in
        the store; returns the seconds applied."""
        applied = self._limiter.pause(error.scope, error.retry_after_s)
        if isinstance(error, AppUnavailable):
            self._app_unavailable(error, where, applied)
        elif applied < error.retry_after_s:
            log.warning(
                "rate limited in %s: the platform asked for %gs; pausing scope %s for the"
                " maximum of %.0fs (limits.max_pause_s)",
                where,
                error.retry_after_s,
                error.scope,
                applied,
            )
        else:
            log.warning(
                "rate limited in %s: pausing scope %s for %.1fs", where, error.scope, applied
            )
        self._save_pause(error.scope, self._wall() + applied)
        return applied

    def _app_unavailable(self, error: AppUnavailable, where: str, applied_s: float) -> None:
        """The platform refuses the whole app: said once with its cause and fix (then only
        each try again, at DEBUG), and kept for `taskcard status` until the app works."""
        if self._unavailable.get(error.scope) == error.reason:
            log.debug("in %s the app is still refused; trying again in %.0fs", where, applied_s)
            return
        self._unavailable[error.scope] = error.reason
        log.error(
            "%s; every route of it is held (nothing is refused for good) and tried again in"
            " %.0fs, then less and less often, until it works (first seen in %s)",
            error.reason,
            applied_s,
            where,
        )
        self._save_unavailable()

    def _app_works(self, channel: Channel, chat: ChatRef) -> None:
        """A request of `channel` went through: an app held as unavailable works again.
        (Its scope is among those a send to any chat of the channel spends.)"""
        spent = {scope.key for scope in channel.rate_scopes(chat, "send", None)}
        back = [s for s in self._unavailable if s in spent]
        for scope in back:
            del self._unavailable[scope]
            log.warning("channel %s: the platform takes the app's requests again", channel.name)
        if back:
            self._save_unavailable()

    def _save_unavailable(self) -> None:
        """What `_unavailable` holds, in the store for `taskcard status` (a store that fails
        costs only that: the log said it)."""
        try:
            kept = parse_app_unavailable(self._store.get_cursor(APP_UNAVAILABLE_CURSOR))
            value = {
                scope: {
                    "reason": reason or kept.get(scope, ("", None))[0],
                    "at": kept.get(scope, ("", None))[1] or self._wall(),
                }
                for scope, reason in self._unavailable.items()
            }
            self._store.set_cursor(APP_UNAVAILABLE_CURSOR, json.dumps(value) if value else "")
        except Exception as error:
            log.warning("the unavailable app could not be recorded for taskcard status: %s", error)

    def _save_pause(self, scope: str, until_epoch: float) -> None:
        """Keep the pause in the store, for a restart (and, clustered, the other instances'
        statuses). It already holds this run's requests (the limiter has it), so a store that
        fails (a Redis gone, a full disk) costs only that: one warning while it lasts, and
        serving goes on, as for the store's other failures."""
        try:
            self._store.set_pause(scope, until_epoch)
        except Exception as error:
            if not self._pause_unsaved:
                log.warning(
                    "the rate-limit pause could not be saved (%s: %s); this run keeps to it,"
                    " a restart inside it may ask once before its end",
                    type(error).__name__,
                    error,
                )
                self._pause_unsaved = True
            return
        if self._pause_unsaved:
            log.info("rate-limit pauses are saved again")
            self._pause_unsaved = False

    async def _pause_left_s(
        self, channel: Channel, chat: ChatRef, op: Operation, mid: str
    ) -> float:
        """Seconds left of a pause over the chat: a pin or a delete waits for it too.

        Their own scopes are the bot's or the app's only (they do not spend the chat's
        budget of messages), but a 429 answered to any request naming the chat says: this
        chat, wait. So they wait for a pause of the scopes of a send there as well, and go
        out only once it has ended. The limiter is the one book of pauses: clustered, it
        knows those another instance drew too."""
        scopes = (*channel.rate_scopes(chat, op, mid), *channel.rate_scopes(chat, "send", None))
        return await self._limiter.paused_s(dict.fromkeys(scope.key for scope in scopes))

    async def _deliver_route(self, key: RouteKey) -> None:
        resident = self._residents[key]
        channel = self._channels[key.channel]
        resident.reshown_in_flight = False  # only a `reshow` during this turn counts
        if resident.id_unsaved and resident.message_id is not None:
            message_id = resident.message_id
            if not self._record(key, lambda: self._store.set_message_id(key.store_key, message_id)):
                self._retry_later(resident, f"route {key}: message {message_id} not recorded yet")
                return
            resident.id_unsaved = False
        if resident.pin_pending and resident.pin_at <= self._clock():
            resident.pin_owed = False  # a card waiting too goes on the route's next turn
            if not await self._pin(channel, resident, resident.message_id):
                self._replace_gone(resident)
            return
        if not resident.card_pending:
            # Only a pin or a delete a 429 put off: the pin's window has not ended (the turn
            # came for its card or its delete), or the delete is due now.
            if resident.delete_pending:
                await self._delete_stale(channel, resident)
            return
        op: Operation = "edit" if resident.message_id else "send"
        if op == "send" and (resident.release or resident.last):
            resident.desired, resident.release = None, False  # nothing left to retire
            return
        if op == "send" and self._send_held(channel, resident):
            return
        reservation = await self._admit(channel, key.chat, op, resident.message_id)
        if reservation is None:
            return
        if resident.paced:  # the next request of the route no sooner than its pace allows
            spacing_s = pace_s(channel.rate_scopes(key.chat, op, resident.message_id))
            resident.retry_at = max(resident.retry_at, self._clock() + spacing_s)
        # Latest wins: take the newest bytes after any wait.
        message = resident.desired
        if message is None or resident.disabled is not None or not resident.card_pending:
            reservation.complete()
            return
        try:
            if resident.message_id is not None:
                await channel.edit(key.chat, resident.message_id, message)
                self._commit(resident, message)
            else:
                await self._send_resident(channel, resident, message)
            if self._unavailable:
                self._app_works(channel, key.chat)
        except NotModified:
            self._commit(resident, message)
        except MessageGone as error:
            if resident.message_id is None:
                self._retry_later(resident, f"route {key}: the send was refused ({error})")
                return
            if resident.last:
                # A last word for nobody: not posted anew (a route opened again finds the
                # message gone with its first card, and replaces it then).
                log.info("route %s: message %s is gone; its last edit is dropped", key, error)
                resident.desired = None
                return
            self._replace_gone(resident)
        except RateLimited as error:
            self._rate_limited(error, key.store_key)
        except Forbidden as error:
            resident.disabled = error.reason
            self._store.set_disabled(key.store_key, error.reason)
            log.error("route %s disabled: %s", key, error.reason)
        except Transient as error:
            self._retry_later(resident, f"route {key}: transient failure ({error})")
            return
        except _NotRecorded as error:
            self._retry_later(
                resident,
                f"route {key}: not sent: the state store did not take the record a send needs"
                f" first ({error})",
            )
            return
        except CredentialsRejected as error:
            resident.failed = message.fingerprint  # shown again after a restart
            if self._on_credentials_rejected is not None:
                self._on_credentials_rejected(key.channel, error)
            else:
                log.error("route %s: %s", key, error)
        except Permanent as error:
            resident.failed = message.fingerprint
            if message is resident.marker:
                log.error("route %s: the platform refused even the short card: %s", key, error)
            else:
                log.error("route %s: the platform refused this card for good: %s", key, error)
                self._keep_refusal(resident, str(error))
                self._show_marker(resident)
        except Exception:
            # Not a platform answer we know: keep the card pending and retry later.
            log.exception("route %s: unexpected failure", key)
            self._retry_later(resident, f"route {key}")
            return
        finally:
            reservation.complete()
        resident.failures = 0
        if resident.stale_id is not None and resident.message_id is not None:
            await self._delete_stale(channel, resident)

    def _send_held(self, channel: Channel, resident: _Resident) -> bool:
        """True (and the route set to come back later) while its unanswered sends are at the
        bound: each may have posted a copy, and the platform cannot tell us."""
        wait_s = unsure_send_wait_s(
            resident.unsure_sends, resident.unsure_at, self._wall(), channel.ambiguous_send_hold_s
        )
        if wait_s <= 0:
            return False
        resident.retry_at = self._clock() + wait_s
        log.warning(
            "route %s: %s got no answer (each may have posted a copy); no further send for %.0fs",
            resident.key,
            counted(resident.unsure_sends, "send", "sends"),
            wait_s,
        )
        return True

    def _count_unsure(self, channel: Channel, resident: _Resident, change: int) -> None:
        """Record a send the platform answered with an error (`change` -1): nothing was
        posted. A send about to go out is counted by `_before_send`."""
        counted = self._unsure_after(channel, resident, change)
        if counted is not None:
            self._store.set_unsure_sends(resident.key.store_key, *counted)

    def _unsure_after(
        self, channel: Channel, resident: _Resident, change: int
    ) -> tuple[int, float | None] | None:
        """The resident's count of sends without an answer after `change` (+1: one about to
        go out), with its time; None where a lost answer cannot leave a copy (not counted)."""
        if channel.ambiguous_send_hold_s is None:
            return None
        if change > 0:
            if resident.unsure_sends >= MAX_UNSURE_SENDS:
                resident.unsure_sends = 0  # the hold has passed: a new episode
            resident.unsure_at = self._wall()
        resident.unsure_sends = max(0, resident.unsure_sends + change)
        return resident.unsure_sends, resident.unsure_at

    def _before_send(self, channel: Channel, resident: _Resident) -> None:
        """Persist, before the request, what a crash in the middle of it must leave behind:
        a new send's idempotency key and the count of sends without an answer, in one write
        (one transaction per send instead of two, bench/RESULTS.md "start-up").

        `_NotRecorded` when the state store did not take it (a Redis out of memory or turned
        into a replica): the send must not go out then, and the resident is left as it was,
        so a send that never went out is not counted as one without an answer (two of those
        held the card for `ambiguous_send_hold_s`, as if copies might show)."""
        before = (
            resident.send_key,
            resident.send_attempts,
            resident.unsure_sends,
            resident.unsure_at,
        )
        new_key = None
        if resident.send_key is None:
            new_key = resident.send_key = f"{resident.key}:{uuid.uuid4().hex}"
        resident.send_attempts += 1
        unsure = self._unsure_after(channel, resident, +1)
        if new_key is None and unsure is None:
            return
        try:
            self._store.before_send(resident.key.store_key, new_key, unsure)
        except Exception as error:
            (
                resident.send_key,
                resident.send_attempts,
                resident.unsure_sends,
                resident.unsure_at,
            ) = before
            raise _NotRecorded(type(error).__name__) from error  # not its text: it can quote a key

    async def _send_resident(
        self, channel: Channel, resident: _Resident, message: Outgoing
    ) -> None:
        key = resident.key
        self._before_send(channel, resident)
        try:
            message_id = await channel.send(
                key.chat, message, idempotency_key=resident.send_key, reply_to=resident.reply_to
            )
        except OutcomeUnknown:
            raise  # it may have posted: it stays counted
        except ChannelError:
            self._count_unsure(channel, resident, -1)  # an answer: nothing was posted
            raise
        repeated = resident.send_attempts > 1
        resident.send_key, resident.send_attempts = None, 0
        resident.unsure_sends = 0  # the store resets it with the id
        resident.message_id = message_id
        resident.id_unsaved = not self._record(
            key, lambda: self._store.set_message_id(key.store_key, message_id)
        )
        self._log_created(key, message_id)
        self._remember_sent(channel, message_id)
        if resident.stale_id == message_id:
            resident.stale_id = None  # some platforms reuse ids: never delete the new one
            self._store.replace_message(key.store_key, message_id=message_id)
        if resident.pin:
            resident.pin_owed = False
            if not await self._pin(channel, resident, message_id):
                # Gone as soon as posted: the chat moved meanwhile (the refused pin taught
                # it), and the post shows, frozen, where nobody follows any more.
                self._replace_gone(resident)
                return
        if repeated or resident.id_unsaved:
            # A repeated attempt may have been answered with the first post, showing older
            # bytes: leave the route pending so its next turn edits the message. An id the
            # store did not take is written again at that turn (a restart without it would
            # post a second message).
            resident.committed = None
            return
        self._commit(resident, message)

    def _log_created(self, key: RouteKey, message_id: str) -> None:
        """Log a new resident: at INFO when none was created in the last minute, else at
        DEBUG and counted for the minute's summary (`CREATED_SUMMARY_S`)."""
        if self._created_summary is None:
            log.info("route %s: resident message %s created", key, message_id)
            self._created_summary = asyncio.get_running_loop().call_later(
                CREATED_SUMMARY_S, self._summarise_created
            )
            return
        self._created_more += 1
        log.debug("route %s: resident message %s created", key, message_id)

    def _summarise_created(self) -> None:
        """One INFO line for the residents logged at DEBUG since the last one at INFO."""
        if self._created_summary is not None:
            self._created_summary.cancel()  # a no-op when it is what runs
            self._created_summary = None
        more, self._created_more = self._created_more, 0
        if more:
            log.info(
                "%s created since the last such line (each is logged at DEBUG)",
                counted(more, "more resident message", "more resident messages"),
            )

    async def _pin(self, channel: Channel, resident: _Resident, message_id: str | None) -> bool:
        """Pin the route's resident. False when the platform answers that the message is
        gone (deleted, or its chat moved): the caller sends one replacement, pinned in turn.
        A 429, or a pause of the chat running, puts the pin off to the window's end, and a
        failure for now to a backoff: the route comes back for it then (`_Resident.pin_at`).
        The pin is owed in the store from before the request until it is done (or refused
        for good), so a restart in between pins the message too. Any other failure leaves
        the message shown unpinned."""
        key = resident.key
        if message_id is None:
            return True
        self._owe_pin(resident, message_id)
        wait_s = await self._pause_left_s(channel, key.chat, "pin", message_id)
        if wait_s > 0:
            self._put_off_pin(resident, wait_s)
            return True
        reservation = await self._admit(channel, key.chat, "pin", message_id)
        if reservation is None:
            return True  # stopping: still owed, in the store too
        try:
            await channel.pin(key.chat, message_id)
        except RateLimited as error:
            self._put_off_pin(resident, self._rate_limited(error, f"{key} (pin)"))
            return True
        except Transient as error:
            resident.pin_failures += 1
            log.warning("route %s: could not pin the resident message for now: %s", key, error)
            self._put_off_pin(resident, self._backoff.delay_s(resident.pin_failures))
            return True
        except MessageGone as error:
            log.info("route %s: could not pin message %s: %s", key, message_id, error)
            self._owe_pin(resident, None)  # its replacement is pinned in turn
            return False
        except ChannelError as error:
            # Said once per chat and reason: a chat whose settings keep the bot from pinning
            # refuses the pin of each card (each agent's, each replacement) alike.
            where = (key.channel, key.chat.chat_id)
            said = self._pins_refused.get(where) == str(error)
            self._pins_refused[where] = str(error)
            (log.debug if said else log.warning)(
                "route %s: could not pin the resident message: %s%s",
                key,
                error,
                "" if said else " (said once for the chat's routes while it lasts)",
            )
        else:
            self._pins_refused.pop((key.channel, key.chat.chat_id), None)
        finally:
            reservation.complete()
        resident.pin_failures = 0
        self._owe_pin(resident, None)
        return True

    def _owe_pin(self, resident: _Resident, message_id: str | None) -> None:
        """Keep in the store which message still owes its pin (None: none), so the next run
        pins it even when no new message is posted. Written only when it changes: a pin is
        rare, but every message posted on a pinned route costs these two writes."""
        if resident.pin_saved == message_id:
            return
        key = resident.key
        if self._record(key, lambda: self._store.set_pin_owed(key.store_key, message_id)):
            resident.pin_saved = message_id

    def _put_off_pin(self, resident: _Resident, wait_s: float) -> None:
        resident.pin_owed = True
        resident.pin_at = max(resident.pin_at, self._clock() + wait_s)
        log.info("route %s: pinning its message again in %.1fs", resident.key, wait_s)

    def _replace_gone(self, resident: _Resident) -> None:
        """The resident's message is gone: the route's next turn posts one replacement, and the
        old id is kept (persisted) to delete the copy that may still show."""
        log.warning(
            "route %s: message %s is gone; sending one replacement",
            resident.key,
            resident.message_id,
        )
        resident.stale_id = resident.message_id
        resident.message_id = None
        resident.committed = None
        self._store.replace_message(resident.key.store_key, stale_message_id=resident.stale_id)

    async def _delete_stale(self, channel: Channel, resident: _Resident) -> None:
        """Remove the copy a replacement superseded (it may still show, frozen); kept and tried
        again after the route's next delivery while the platform cannot answer. The store
        holds the copy's id until it is deleted, so the next start deletes it too."""
        key, stale = resident.key, resident.stale_id
        assert stale is not None
        wait_s = max(
            await self._pause_left_s(channel, key.chat, "delete", stale),
            resident.delete_at - self._clock() if resident.delete_owed else 0.0,
        )
        if wait_s > 0:
            self._put_off_delete(resident, wait_s)
            return
        reservation = await self._admit(channel, key.chat, "delete", stale)
        if reservation is None:
            return
        try:
            await channel.delete(key.chat, stale)
        except RateLimited as error:
            self._put_off_delete(resident, self._rate_limited(error, f"{key} (delete)"))
            return
        except Transient as error:
            # Tried again after the route's next delivery (not in a loop while it fails).
            resident.delete_owed = False
            log.info("route %s: deleting the replaced message failed for now: %s", key, error)
            return
        except ChannelError as error:
            log.info("route %s: the replaced message %s stays: %s", key, stale, error)
        finally:
            reservation.complete()
        resident.stale_id, resident.delete_owed = None, False
        self._store.replace_message(key.store_key, message_id=resident.message_id)

    def _put_off_delete(self, resident: _Resident, wait_s: float) -> None:
        """The delete goes after the window a 429 opened (or a pause of its chat): the route
        comes back for it then, even if its card does not change meanwhile."""
        resident.delete_owed = True
        resident.delete_at = max(resident.delete_at, self._clock() + wait_s)
        log.info("route %s: deleting the replaced message in %.1fs", resident.key, wait_s)

    def _commit(self, resident: _Resident, message: Outgoing) -> None:
        channel = self._channels[resident.key.channel]
        if resident.reshown_in_flight and not (
            resident.message_id is not None
            and channel.posted_after_move(resident.key.chat, resident.message_id)
        ):
            # The chat moved while this request was on its way, and the old chat may have
            # taken it: what it showed stays behind there. The card stays pending; its next
            # turn finds that message gone and posts one replacement in the new chat. (A
            # request for a message known to live in the new chat counts as shown: shown
            # again, it would be an edit refused as "not modified".)
            log.info(
                "route %s: its chat moved while the card was being delivered; showing it again",
                resident.key,
            )
            return
        resident.committed = message.fingerprint
        key = resident.key
        self._record(
            key, self._store.set_committed, key.store_key, message.fingerprint, self._wall()
        )
        if message is resident.marker:
            resident.marked = True  # the refusal run goes on: `taskcard status` keeps it
            if resident.refusal:
                self._save_refusal(resident, resident.refusal, resident.refused_at)
        else:
            resident.marker, resident.marked = None, False
            if resident.refusal is not None:
                self._clear_refusal(resident)
        if resident.release and resident.desired is message:
            log.info("route %s: resident message %s retired", resident.key, resident.message_id)
            resident.release = False
            resident.desired = resident.committed = resident.message_id = None
            self._record(
                resident.key, lambda: self._store.set_message_id(resident.key.store_key, None)
            )
        elif resident.desired is message:
            # Shown: keep its fingerprint, not its bytes (~1 KB a resident, ~10 MB at 10,000).
            # Nothing sends it again: a gone message is noticed by the edit of a newer card,
            # which is the replacement, and a repeated send skips this commit.
            resident.desired = None

    def _show_marker(self, resident: _Resident) -> None:
        """The chat is told its card was refused: a short card replaces the older one it
        shows, once per refusal run (a card that goes through ends the run), unless a newer
        card is already waiting to be tried."""
        if resident.marked or self._refusal_marker is None or not resident.keeps_refusal:
            return
        if resident.card_pending or resident.last or resident.release:
            return
        marker = self._refusal_marker(resident.key)
        if marker is None:
            return
        resident.marker = resident.desired = marker
        if resident.card_pending:
            self._enqueue(resident)

    def _kept_refusal(
        self, key: RouteKey, kept: ReadAhead[str, str] | None = None
    ) -> tuple[str | None, float | None, bool]:
        """The reason and the start of the refusal the store keeps for the route (None: none;
        a reason of "" when the store cannot be read now, so that the route's next card shown
        clears any there), and whether the chat was shown the short card of it. One read per
        route added, as `resident` is: a restart, a reload, a lease taken over; never per
        card."""
        try:
            cursor = card_refused_key(key.store_key)
            raw = self._store.get_cursor(cursor) if kept is None else kept.take(cursor)
            refusal = parse_card_refused(raw, key.store_key)
        except Exception:
            return "", None, False
        if refusal is None:
            return None, None, False
        return *refusal, card_refusal_marked(raw)

    def _keep_refusal(self, resident: _Resident, reason: str) -> None:
        """Keep in the store that the platform refused the route's card for good, and why, for
        `taskcard status`: the chat goes on showing the card before it, and the log alone
        said so. Written once per reason (a card refused at each change writes nothing more)
        and cleared by `_commit` when a later card of the route goes through."""
        reason = reason[:MAX_REFUSAL_CHARS]
        if not resident.keeps_refusal or resident.refusal == reason:
            return
        # Open already (a reason worded anew, such as an entity error's byte offset): it
        # began when its first refusal came.
        began = resident.refused_at if resident.refusal is not None else None
        began = self._wall() if began is None else began
        if self._save_refusal(resident, reason, began):
            resident.refusal, resident.refused_at = reason, began

    def _save_refusal(self, resident: _Resident, reason: str, began: float | None) -> bool:
        """Write the route's refusal as `_kept_refusal` reads it; False when the store failed."""
        value = json.dumps({"reason": reason, "at": began, "marked": resident.marked})
        try:
            self._store.set_cursor(card_refused_key(resident.key.store_key), value)
        except Exception as error:
            log.warning(
                "route %s: the refusal could not be kept for taskcard status (%s)",
                resident.key,
                type(error).__name__,  # not its text: a Redis error's can quote a key
            )
            return False
        return True

    def _clear_refusal(self, resident: _Resident) -> None:
        """A card of the route went through: the refusal kept for it is over."""
        try:
            self._store.delete_cursors([card_refused_key(resident.key.store_key)])
        except Exception:
            return  # tried again at the route's next card
        resident.refusal = resident.refused_at = None
        log.info("route %s: the platform takes its cards again", resident.key)

    def _record(self, key: RouteKey, write: Callable[..., None], *args: object) -> bool:
        """Record what the platform took (`write(*args)`: the arguments passed rather than
        a closure made for each card); False when the state store failed (a shared Redis
        that answers too late): one warning while it lasts, not a traceback at each card. A
        fingerprint lost so is written with the route's next change (a restart before that
        edits once more, and the platform answers "not modified"); a message id is written
        again at the route's next turn (`_Resident.id_unsaved`)."""
        try:
            write(*args)
        except Exception as error:
            if not self._record_failing:
                self._record_failing = True
                log.warning(
                    "route %s: the platform took the card, but the state store did not take"
                    " its record (%s); it is written again later",
                    key,
                    type(error).__name__,  # not its text: a Redis error's can quote a key
                )
            return False
        if self._record_failing:
            self._record_failing = False
            log.info("the state store takes the cards' records again")
        return True

    async def _deliver_text(self, lane: _Lane, text: _Text) -> None:
        channel = self._channels[lane.channel]
        chat = text.chat if isinstance(text, _Reply) else text.ref.route.chat
        reservation = await self._admit(channel, chat, "send", None)
        if reservation is None:
            self._put_back(lane, text, front=True)
            return
        if isinstance(text, QueuedNotice) and self._outbox and not self._outbox.wanted(text):
            reservation.complete()  # people silenced the route while it waited
            return
        key = text.idempotency_key if isinstance(text, _Reply) else text.ref.idempotency_key
        reply_to = text.reply_to if isinstance(text, _Reply) else None
        where = f"{lane.channel}:{chat}"
        # A notice on a platform that cannot deduplicate sends goes at most once (see the
        # outbox): recorded `unsure` before the request, `pending` again on an answer.
        outbox = self._outbox
        once = text if isinstance(text, QueuedNotice) and outbox is not None else None
        if once is not None and outbox is not None and channel.ambiguous_send_hold_s is not None:
            try:
                marked = outbox.sending(once)
            except Exception as error:
                reservation.complete()
                self._retry_later(
                    text,
                    f"{where}: the state store did not take the notice's send"
                    f" ({type(error).__name__})",  # not its text: a Redis error's can quote a key
                )
                self._put_back(lane, text, front=False)
                return
            if not marked:  # another instance has it (or it was withdrawn): dropped here
                reservation.complete()
                return
        else:
            once = None
        # The same for a command's answer (see `_reply_sending`).
        reply_once = (
            text if isinstance(text, _Reply) and channel.ambiguous_send_hold_s is not None else None
        )
        if reply_once is not None and (refused := await self._reply_sending(reply_once)):
            reservation.complete()
            self._retry_later(
                text, f"{where}: the state store did not take the reply's send ({refused})"
            )
            self._put_back(lane, text, front=False)
            return
        try:
            message_id = await channel.send(
                chat, text.message, idempotency_key=key, reply_to=reply_to
            )
        except RateLimited as error:
            self._not_sent(outbox, once, reply_once)
            self._put_back(lane, text, front=True)
            self._rate_limited(error, where)
            return
        except OutcomeUnknown as error:
            if once is not None and outbox is not None:
                # It may be in the chat: a copy is worse than a notice missing.
                log.warning("%s: a notice may have been posted (%s); not sent again", where, error)
                outbox.abandon(once)  # recorded unsure before the request: it stays so
                return
            if reply_once is not None:
                # The same rule for a command's answer: the person can ask again, and a
                # platform that cannot deduplicate a send would show the answer twice.
                log.warning("%s: a reply may have been posted (%s); not sent again", where, error)
                self._forget_reply(reply_once)
                return
            self._retry_later(text, f"{where}: transient failure ({error})")
            self._put_back(lane, text, front=False)
            return
        except Transient as error:
            self._not_sent(outbox, once, reply_once)
            self._retry_later(text, f"{where}: transient failure ({error})")
            self._put_back(lane, text, front=False)
            return
        except CredentialsRejected as error:
            # Not this notice's fault: it stays pending in the store, and a restart with
            # valid credentials sends it (marked failed, it was lost with the old token).
            self._not_sent(outbox, once, reply_once)
            if self._on_credentials_rejected is not None:
                self._on_credentials_rejected(lane.channel, error)
            else:
                log.error("%s: a notice or reply was refused: %s", where, error)
            return
        except ChannelError as error:
            log.error("%s: a notice or reply was refused: %s", where, error)
            if isinstance(text, QueuedNotice) and self._outbox is not None:
                self._outbox.done(text, "failed")
            if isinstance(text, _Reply):
                self._forget_reply(text)
            return
        except BaseException:
            if once is not None and outbox is not None:
                outbox.abandon(once)  # it may have gone: it stays unsure
            elif reply_once is not None:
                pass  # it may have gone: kept unsure, the next start does not send it
            else:
                self._put_back(lane, text, front=True)
            raise
        finally:
            reservation.complete()
        if self._unavailable:
            self._app_works(channel, chat)
        if isinstance(text, QueuedNotice) and self._outbox is not None:
            self._outbox.done(text, "delivered", message_id)
        if isinstance(text, _Reply):
            self._forget_reply(text)
        self._remember_sent(channel, message_id)

    def _not_sent(
        self, outbox: NoticeOutbox | None, once: QueuedNotice | None, reply: _Reply | None
    ) -> None:
        """The platform answered without posting a notice or reply sent at most once: pending
        again."""
        if outbox is not None and once is not None:
            outbox.not_sent(once)
        if reply is not None:
            self._reply_not_sent(reply)

    def _remember_sent(self, channel: Channel, message_id: str) -> None:
        """Keep the id of a message just posted where a reply does not say who wrote the
        message replied to (see `Channel.replies_name_author`). Best effort: the message is
        out either way, and a store that fails now only makes a reply to it need a mention."""
        if channel.replies_name_author:
            return
        try:
            self._store.remember_sent(channel.name, message_id, self._wall())
        except Exception as error:
            log.warning(
                "%s: could not record that message %s is the service's (%s); a command"
                " replying to it needs the bot's mention",
                channel.name,
                message_id,
                type(error).__name__,
            )
