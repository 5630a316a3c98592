"""The service's half of talking to an agent: queue text in its inbox, follow the text's fate.

A person replies to an agent's resident message or writes `/tell AGENT TEXT`; the desk checks
the per-author rate, records the message, writes it into the agent's `inbox/queued/` (the one
place the service writes into a workdir, see `bridge.inbox.writer`) and answers with ONE
status message that is edited as the message moves: queued -> parked/unconfirmed ->
delivered, or failed / cancelled. That status message is a resident of the route scheduler
keyed by the message id (`inbox:<id>` in the agent slot of the route key), so it is paced by
the chat's lane, survives a restart (its id is in the store: edited, never sent again) and
needs no second delivery mechanism.

Wakes (`kind: "wake"`) are typed notices to a parent agent; they have no status message and
are written once per episode (the store refuses a known episode id). The reports of one child
that the parent has not taken yet travel in one wake: a new report takes the queued wake
back (the same rename race as a cancel) and queues one with both, so a burst of reports
wakes the parent once. A wake the parent took first is left alone, and the new one carries
only the new report. Which wake is still queued is kept in the store, so a restart between
two reports does not split them into two wakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import json
import logging
import math
import re
import secrets
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar, cast

from taskcard.bridge.config import InboxConfig
from taskcard.bridge.inbox.states import MessageState, message_state, state_line
from taskcard.bridge.inbox.writer import InboxRefused, InboxWriter, encode_message, why_refused
from taskcard.bridge.schedule.scheduler import RouteKey, RouteScheduler
from taskcard.bridge.store.base import OWED_AGENTS, StateFileError
from taskcard.bridge.store.sqlite import InboxRecord, StateStore
from taskcard.bridge.track.monitor import ActivitySummary
from taskcard.channels.aio import Backoff
from taskcard.channels.base import CardView, Channel, ChatRef, Outgoing, ReplyTo, counted
from taskcard.producers.inbox.contract import MESSAGE_ID, show_bidi
from taskcard.producers.reports.contract import (
    MAX_INBOX_MESSAGE_BYTES,
    MAX_TEXT_CHARS,
    Ack,
    inbox_message,
)
from taskcard.producers.task_card.contract import shows_text

log = logging.getLogger(__name__)
T = TypeVar("T")

STATUS_AGENT_PREFIX = "inbox:"
# Closed messages younger than this get their status message back after a restart (its last
# edit may not have gone out); older ones are history.
KEEP_CLOSED_S = 86_400.0
WAKE_ROUTE_PREFIX = "wake:"
# The store's cursor holding a child's report wake last queued for its parent, so the next
# report joins it also after a restart (in memory only, a restart split a burst in two).
REPORT_WAKE_CURSOR = "report-wake:"


def _report_wake_cursor(parent_id: str, child_id: str) -> str:
    return REPORT_WAKE_CURSOR + json.dumps([parent_id, child_id], ensure_ascii=False)


# Where a report wake too long to take one more report keeps only its head (the first
# report, with the orchestrator's pointer to read from there) and the newest report.
REPORTS_CUT_LINE = (
    "(reports in between left out: more came than one message holds; read them all with"
    " taskcard reports)"
)


def joined_report_wakes(queued: str, text: str) -> str | None:
    """The text of a report wake still queued (`queued`) that the next one (`text`)
    carries before its own, cut to fit one message: its head lines, then
    `REPORTS_CUT_LINE`; None when even the cut line and `text` do not fit (the next wake
    then goes alone). Without the cut, a child reporting faster than its parent took its
    wakes filled the parent's inbox with one full wake after another, hundreds a minute."""
    if len(queued) + 1 + len(text) <= MAX_TEXT_CHARS:
        return queued
    room = MAX_TEXT_CHARS - len(text) - len(REPORTS_CUT_LINE) - 2
    if room < 0:
        return None
    head = queued.split(REPORTS_CUT_LINE, 1)[0][: room + 1]
    head = head[: head.rfind("\n") + 1] if "\n" in head else ""
    return head + REPORTS_CUT_LINE


def status_key(record: InboxRecord) -> RouteKey:
    """The scheduler route of a message's status message."""
    return RouteKey(
        record.channel,
        ChatRef(record.chat_id, record.thread_id),
        STATUS_AGENT_PREFIX + record.message_id,
    )


def answered(record: InboxRecord) -> ReplyTo | None:
    """The command a message's status message answers, as the record keeps it."""
    if record.reply_to_id is None:
        return None
    return ReplyTo(record.reply_to_id, record.reply_thread_id)


def _thread(record: InboxRecord) -> str | None:
    """The thread the message was written in: the chat's (a Telegram forum topic) or the
    command's own (a Feishu topic or reply thread)."""
    return record.thread_id if record.thread_id is not None else record.reply_thread_id


NOTHING_TO_CANCEL = "You have no queued message here to cancel."


def latest_written(
    records: Iterable[InboxRecord],
    channel: str,
    chat: ChatRef,
    author: str | None,
    thread: str | None = None,
) -> InboxRecord | None:
    """The latest of the open `records` that `author` wrote where a cancel is: the same chat
    and thread (see `InboxDesk.cancel_latest`); None when there is none."""
    where = chat.thread_id if chat.thread_id is not None else thread
    mine = [
        r
        for r in records
        if r.outcome == "open"
        and r.author == author
        and (r.channel, r.chat_id, _thread(r)) == (channel, chat.chat_id, where)
    ]
    return max(mine, key=lambda r: r.queued_at) if mine else None


# A wake that could not be queued is written again after this backoff (per woken agent,
# reset when a write there works), and at most this many wait per agent.
WAKE_RETRY_FIRST_S = 5.0
WAKE_RETRY_MAX_S = 300.0
MAX_OWED_WAKES = 100
# Failed tries in a row after which an agent's owed wakes are dropped (about an hour and a
# half); the `⚠ inbox` problem stays until a write there works.
WAKE_RETRY_TRIES = 24
# The store's cursors holding the owed wakes, so a restart tries them again (kept in memory
# only, a restart forgot them and the agent was never woken for those signals): one per wake
# (`OWED_WAKE_CURSOR` + [parent, notice id]) and one per agent with its failed tries and when
# the next is due (`OWED_TRIES_CURSOR` + parent). The service's own state, not the agent's
# workdir: that is what failed.
OWED_WAKE_CURSOR = "owed-wake:"
OWED_TRIES_CURSOR = "owed-wake-tries:"
# Clustered, the store's set of the agents that owe wakes (`StateStore.add_to_set`), so that
# the look for wakes another instance left (`_look_for_owed`) reads the agents that owe
# some, not a row per agent served. An agent is added before its rows are written and again
# after: a stop in between leaves a member without rows, which the look removes. The look
# removes a member first and then reads its rows again, marking it again if another
# instance wrote some meanwhile (`_owe_none_shared`), so rows written while it removes are
# still named by a member. (`OWED_AGENTS`, in the store's module.) A member whose agent is
# held by no lease here is removed the same way once its agent owes nothing: an agent that
# left every fleet, or a member a hand wrote, stayed for good, read by every look.
# A wake recorded (its notice pending) but neither queued nor failed when the service
# stopped, as a stop during its write leaves it, is owed at the next start when it is younger
# than this (about the time its tries would have taken): the notice is recorded first, so
# the signal read again does not wake again. Older pending notices are left as they are.
CUT_SHORT_KEEP_S = 2 * 3600.0
# Clustered: how often an instance looks in the store for wakes owed to the agents whose
# lease it holds that another instance left there (its write failed, and it stopped since).
OWED_LOOK_S = 30.0
# Clustered: a member of `OWED_AGENTS` whose agent is not held here and had owed rows when a
# look read them (an agent another instance serves, or one no instance serves now, whose
# wakes a cluster keeps for its return) is looked at again only after this: the holder of
# its lease removes it once it owes nothing, and rows stay while nobody serves the agent.
OWED_ELSEWHERE_RECHECK_S = 3600.0
# Clustered: more members of `OWED_AGENTS` than a whole fleet of agents each owing wakes
# would make (the fleet of 10,000 agents the caps are worked out for) is named in the log
# once: every look of every instance reads the set whole.
OWED_AGENTS_PLAUSIBLE = 10_000
# What reading a stored row this desk did not write may raise: a row nested past the JSON
# parser's depth (a hand's, or a hostile writer's with the store's rights) raises
# RecursionError, which would stop the start or every lease taken with it.
_UNREADABLE = (ValueError, TypeError, RecursionError)


def _owed_wake_cursor(parent_id: str, notice_id: str) -> str:
    return OWED_WAKE_CURSOR + json.dumps([parent_id, notice_id], ensure_ascii=False)


def _wake_ident(notice_id: str) -> str:
    """The message id of the wake about a notice: the same at every try."""
    return "wake_" + hashlib.sha256(notice_id.encode()).hexdigest()[:24]


def _is_wake_ident(value: object) -> bool:
    """Whether `value` is a wake's message id as `_wake_ident` makes it (never a person's)."""
    return isinstance(value, str) and re.fullmatch(r"wake_[0-9a-f]{24}", value) is not None


class _ReportRow(NamedTuple):
    """One report-wake row as this desk writes it: the child's report wake still queued in
    the parent's inbox (`ident`, its text `body`), or, with `carrier`, one taken back for the
    wake `carrier` to carry too, noted until that wake is queued (`_take_back_report_wake`)."""

    parent_id: str
    child_id: str
    ident: str
    body: str
    carrier: str | None


_NOT_TWO_NAMES = "its key does not name two agents, the parent and the child"


def _report_row(key: str, value: str) -> _ReportRow | str:
    """The report-wake row `key` holding `value`, or what is wrong with it. The state is
    not the agent's, but another version or a hand may have written there: a row naming a
    person's message as the wake to take back would withdraw that message from the agent
    and fold its text into a wake, so only wake ids are ever taken."""
    try:
        names = json.loads(key[len(REPORT_WAKE_CURSOR) :])
    except _UNREADABLE:
        names = None
    if not (
        isinstance(names, list)
        and len(names) == 2
        and all(isinstance(name, str) and name for name in names)
    ):
        return _NOT_TWO_NAMES
    try:
        held = json.loads(value)
    except _UNREADABLE:
        held = None
    if not (isinstance(held, list) and len(held) in (2, 3) and isinstance(held[1], str)):
        return "it holds neither a wake still queued nor one taken back (a wake id and a text)"
    if not _is_wake_ident(held[0]):
        return "the message it names is no wake the service wrote (a person's message, say)"
    carrier = held[2] if len(held) == 3 else None
    if len(held) == 3 and not _is_wake_ident(carrier):
        return "the wake it names to carry the one taken back is no wake the service wrote"
    return _ReportRow(names[0], names[1], held[0], held[1], carrier)


def _say_bad_report_row(key: str, value: str, why: str) -> None:
    """Name a report-wake row this desk would not have written, once: it was just deleted."""
    log.warning(
        "report wake row %r skipped and deleted: %s; it held %r. Nothing to do: no message"
        " was moved for it (if a program of yours writes rows under report-wake: in the"
        " service's state, give them a prefix of their own)",
        key[:200],
        why,
        value[:200],
    )


def _owed_wakes_of(parent_id: str) -> str:
    """The start of the keys of every wake owed to `parent_id` (`_owed_wake_cursor`)."""
    return _owed_wake_cursor(parent_id, "")[: -len('""]')]


def owed_tries_cursor(parent_id: str) -> str:
    """Ends with `:<agent id>`, as `StateStore.forget_agent` finds an agent's cursors."""
    return OWED_TRIES_CURSOR + parent_id


class _FailedWake(NamedTuple):
    """A wake to write again: what `InboxDesk.wake` was given. `withdrawn`: the report wake
    it took back whose text it now carries (that wake could be neither moved back nor
    written again), deleted from `cancelled/` once this one is queued."""

    child_id: str
    episode: str
    text: str
    report: bool
    withdrawn: str | None = None
    seq: int = 0  # the order it became owed in, kept in the store


def _owed_row(wake: _FailedWake) -> str:
    """The store's row of an owed wake (`_stored_wake` reads it)."""
    return json.dumps(
        {
            "child": wake.child_id,
            "episode": wake.episode,
            "text": wake.text,
            "report": wake.report,
            "withdrawn": wake.withdrawn,
            "seq": wake.seq,
        },
        ensure_ascii=False,
    )


def _stored_wake(
    key: str, value: str, fleet: Collection[str]
) -> tuple[str, str, _FailedWake] | str:
    """(parent, notice id, wake) of one stored owed wake, or why it is not one this desk
    wrote (the state file is not the agent's, but another version or a hand may have
    written there): such an entry is skipped, never trusted."""
    try:
        parent_id, notice_id = json.loads(key[len(OWED_WAKE_CURSOR) :])
        data = json.loads(value)
    except _UNREADABLE:
        return "not JSON of the expected shape"
    if not isinstance(parent_id, str) or parent_id not in fleet:
        return "its agent is not served"
    if not isinstance(data, dict):
        return "not an object"
    child_id, episode, text = data.get("child"), data.get("episode"), data.get("text")
    report, withdrawn, seq = data.get("report"), data.get("withdrawn"), data.get("seq")
    if not (isinstance(child_id, str) and isinstance(episode, str) and child_id):
        return "no child or episode"
    if notice_id != f"{child_id}:{episode}":
        return "its key does not name its child and episode"
    if not isinstance(text, str) or not text or len(text) > MAX_INBOX_MESSAGE_BYTES:
        return "no text, or one longer than a message"
    if not isinstance(report, bool) or type(seq) is not int:
        return "no report flag or order"
    if withdrawn is not None and not (
        isinstance(withdrawn, str) and MESSAGE_ID.fullmatch(withdrawn)
    ):
        return "a withdrawn wake that is no message id"
    return parent_id, notice_id, _FailedWake(child_id, episode, text, report, withdrawn, seq)


def _stored_tries(parent_id: str, value: str | None) -> tuple[int, float]:
    """The failed tries and next due time (epoch seconds) of an agent's owed wakes as the
    store keeps them; none and now for an entry this desk would not have written (logged)."""
    if value is None:
        return 0, 0.0
    try:
        data = json.loads(value)
        tries, due_s = data["tries"], data["due_s"]
    except (*_UNREADABLE, KeyError):
        tries = due_s = None
    if (
        type(tries) is int
        and 0 <= tries < WAKE_RETRY_TRIES
        and isinstance(due_s, int | float)
        and math.isfinite(due_s)
    ):
        return tries, float(due_s)
    log.warning("agent %s: the stored tries of its owed wakes skipped: not as written", parent_id)
    return 0, 0.0


class OncePerTurn(Generic[T]):
    """What `read` returns, read once for every call until the event loop's next turn, then
    read again at the next call; read at every call when no loop runs (nothing to share
    the read with)."""

    __slots__ = ("_held", "_read", "_value")

    def __init__(self, read: Callable[[], T]) -> None:
        self._read = read
        self._value: T | None = None
        self._held = False

    def __call__(self) -> T:
        if self._held:
            return cast(T, self._value)
        value = self._read()
        try:
            asyncio.get_running_loop().call_soon(self._forget)
        except RuntimeError:
            return value
        self._value, self._held = value, True
        return value

    def _forget(self) -> None:
        self._value, self._held = None, False


@dataclass
class _WakeRetry:
    """The wakes one agent is owed, by notice id in the order they failed, and when the
    next try is due."""

    backoff: Backoff
    wakes: dict[str, _FailedWake] = field(default_factory=dict)
    due_s: float = 0.0
    next_seq: int = 0


@dataclass(frozen=True)
class _TakenBack:
    """A report wake withdrawn from `queued/` for the next wake to carry: its id, its text
    as it was queued (`whole`) and as the next wake carries it (`kept`, maybe cut), and the
    report-wake row noting the take back (`note`)."""

    ident: str
    whole: str
    kept: str
    note: str


class AuthorRate:
    """At most `max_messages` per `period_s` per (author, agent): a sliding window."""

    def __init__(self, max_messages: int, period_s: float) -> None:
        self._max = max_messages
        self._period_s = period_s
        self._sent: dict[tuple[str, str], deque[float]] = {}

    def allow(self, author: str, agent_id: str, now_s: float) -> bool:
        window = self._sent.setdefault((author, agent_id), deque())
        while window and window[0] <= now_s - self._period_s:
            window.popleft()
        if len(window) >= self._max:
            return False
        window.append(now_s)
        return True

    def give_back(self, author: str, agent_id: str, now_s: float) -> None:
        """Uncount the message `allow` let through at `now_s`: it was not queued after all."""
        window = self._sent.get((author, agent_id))
        if window and window[-1] == now_s:
            window.pop()


def _message_id(channel: str, chat: ChatRef, command: ReplyTo | None) -> str:
    """The id of a text queued by the command `command`: derived from the platform's id of
    the command's message, so that the command handled again (a Redis that took the record
    but answered too late, and the command is tried again) writes the same record instead of
    a second open one; random without one."""
    if command is None:
        return "m_" + secrets.token_hex(10)
    named = "\0".join((channel, chat.chat_id, command.message_id))
    return "m_" + hashlib.sha256(named.encode()).hexdigest()[:20]


class InboxDesk:
    """Owns the messages people sent agents and their status messages."""

    def __init__(
        self,
        config: InboxConfig,
        store: StateStore,
        scheduler: RouteScheduler,
        channels: Mapping[str, Channel],
        workdirs: Mapping[str, Path],
        *,
        clock: Callable[[], datetime],
        activity: Callable[[str], ActivitySummary],
        zone: Callable[[str, ChatRef], tzinfo],
        render: Callable[[Channel, CardView], Outgoing],
        shared: bool = False,
    ) -> None:
        """`shared`: the store is a cluster's, holding the messages of the other instances'
        agents too; those are theirs to show and close, and are left alone here."""
        self._config = config
        self._shared = shared
        self._store = store
        self._scheduler = scheduler
        self._channels = channels
        self._writers = {agent: InboxWriter(workdir) for agent, workdir in workdirs.items()}
        self._clock = clock
        self._activity = activity
        self._zone = zone
        self._render = render
        self._rate = AuthorRate(config.max_messages, config.period_s)
        self._records: dict[str, InboxRecord] = {}
        # The open messages of each agent, so a card change looks at that agent's own (none,
        # usually) instead of every message of the last day; closed ones in a heap by closing
        # time, dropped from memory once they are history (`KEEP_CLOSED_S`). A heap, not a
        # list in arrival order: messages close out of order (an ack read late carries its
        # own earlier time, the store answers in queueing order after a restart, the wall
        # clock may be set back), and the earliest must always come out first.
        self._open: dict[str, dict[str, None]] = {}
        self._closed: list[tuple[float, str]] = []
        self._ready: set[str] = set()
        # The store's messages of the last day, and its owed wakes by agent, each read
        # once for every call until the event loop's next turn: a lease renewal that gains
        # many agents takes them one by one, without reading (or parsing) every row again.
        self._shared_messages = OncePerTurn(self._read_shared_messages)
        self.problems: dict[str, str] = {}  # agent -> why its inbox cannot be written
        # (parent, child) -> the id and text of the report wake last queued (see the doc);
        # clustered, read only for the pairs written here (`_last_report_wake`)
        self._report_wakes: dict[tuple[str, str], tuple[str, str]] = {}
        self._wake_retries: dict[str, _WakeRetry] = {}  # agent -> the wakes it is owed
        self._stored_owed = OncePerTurn(self._read_owed)
        # The report-wake rows, read once for every lease gained in one turn (`take_agent`).
        self._report_rows = OncePerTurn(self._read_report_rows)
        self._loaded = False  # `load` ran: an agent added later takes up its owed wakes
        self._taken: set[str] = set()  # clustered: the agents whose lease is held here
        self._owed_looked_s = 0.0  # clustered: when `_look_for_owed` last looked
        self._owed_indexed = False  # clustered: the look added the agents owing before this
        self._set_refused: str | None = None  # why the store refused `OWED_AGENTS`, said once
        # Clustered: members of `OWED_AGENTS` not held here that had owed rows, and when
        # (`OWED_ELSEWHERE_RECHECK_S`); whether the set's size was named (`_say_owing_many`).
        self._owed_elsewhere: dict[str, float] = {}
        self._said_owing_many = False

    # Lifecycle -------------------------------------------------------------------------

    def load(self) -> None:
        """Take up the messages of the last day (after the scheduler started). Clustered,
        each agent's are taken up when its lease is gained instead (`take_agent`)."""
        if self._shared:
            return
        since = self._clock().timestamp() - KEEP_CLOSED_S
        for record in self._store.inbox_messages(since):
            if record.channel not in self._channels:
                continue
            self._keep(record)
            self._scheduler.add_route(
                status_key(record), reply_to=answered(record), keeps_refusal=False
            )
        for agent_id in {r.agent_id for r in self._records.values()} - set(self._writers):
            self.retire(agent_id, "the agent was removed")
        self._take_owed(self._writers)
        self._put_back_taken()
        self._take_cut_short()
        self._loaded = True

    def take_agent(self, agent_id: str) -> None:
        """Clustered: show `agent_id`'s messages from now on (its lease was gained here), as
        the shared store has them now.

        A standby used to take up every message of its configured agents at its start and
        show them, though another instance served them: one whose status message was still
        being sent had no id in the store yet, so the standby posted a second one (and it
        edited the others with what it knew at its start, not what the owner did since).
        Every agent taken in one lease renewal shares one read of the store."""
        if agent_id not in self._writers:
            return
        self._taken.add(agent_id)
        self._take_owed((agent_id,))
        self._put_back_taken(agent_id)
        for record in self._shared_messages():
            if record.agent_id != agent_id or record.channel not in self._channels:
                continue
            self._keep(record)
            self._scheduler.add_route(
                status_key(record), reply_to=answered(record), keeps_refusal=False
            )
            self._show(record)

    def drop_agent(self, agent_id: str) -> None:
        """Clustered: another instance shows `agent_id`'s messages now; forget them here
        (nothing is cancelled: the messages wait for the agent as before)."""
        for message_id in [m for m, r in self._records.items() if r.agent_id == agent_id]:
            record = self._records.pop(message_id)
            self._scheduler.remove_route(status_key(record))
        self._open.pop(agent_id, None)
        # Its owed wakes stay in the store for the instance that takes its lease.
        self._wake_retries.pop(agent_id, None)
        self._taken.discard(agent_id)

    def _read_shared_messages(self) -> list[InboxRecord]:
        """The store's messages of the last day (`_shared_messages`)."""
        return self._store.inbox_messages(self._clock().timestamp() - KEEP_CLOSED_S)

    def _read_owed(self) -> dict[str, list[tuple[str, _FailedWake]]]:
        """Every owed wake the store keeps, checked, by the agent it is owed to
        (`_stored_owed`). A row this desk would not have written is skipped and forgotten,
        logged once; one of an agent not served here is left to its server."""
        stored = self._store.get_cursors(self._store.cursor_keys(OWED_WAKE_CURSOR))
        by_agent: dict[str, list[tuple[str, _FailedWake]]] = {}
        skipped: list[str] = []
        for key, value in stored.items():
            parsed = _stored_wake(key, value, self._writers)
            if isinstance(parsed, str):
                if parsed != "its agent is not served":  # forgotten when it leaves for good
                    log.warning("owed wake %r skipped: %s", key[:200], parsed)
                    skipped.append(key)
                continue
            parent_id, notice_id, wake = parsed
            by_agent.setdefault(parent_id, []).append((notice_id, wake))
        self._store.delete_cursors(skipped)
        return by_agent

    def _take_owed(self, agents: Collection[str]) -> None:
        """Take up the wakes owed to `agents`' inboxes as the store keeps them (at start, or
        clustered when an agent's lease is gained here): tried when their stored backoff has
        passed, with the tries they have left, the same caps as ever. An entry this desk
        would not have written is skipped and forgotten, logged once: the start goes on."""
        stored = self._stored_owed()
        found = {agent: stored[agent] for agent in agents if agent in stored}
        if not found:
            return
        tries = self._store.get_cursors(owed_tries_cursor(parent) for parent in found)
        now_s = self._clock().timestamp()
        for parent_id, wakes in found.items():
            owed = self._wake_retries.get(parent_id)
            if owed is None:
                kept = tries.get(owed_tries_cursor(parent_id))
                attempts, due_s = _stored_tries(parent_id, kept)
                # due no later than a whole backoff from now: a clock set back, say
                owed = self._owed_to(parent_id, attempts, min(due_s, now_s + WAKE_RETRY_MAX_S))
            for notice_id, wake in wakes:
                owed.wakes.setdefault(notice_id, wake)
            ordered = sorted(owed.wakes.items(), key=lambda item: item[1].seq)
            owed.wakes = dict(ordered[-MAX_OWED_WAKES:])
            self._store.delete_cursors(
                _owed_wake_cursor(parent_id, notice_id)
                for notice_id, _ in ordered[:-MAX_OWED_WAKES]
            )
            owed.next_seq = max(owed.next_seq, ordered[-1][1].seq + 1)
            log.info(
                "agent %s: %s owed to its inbox taken up from the state",
                parent_id,
                counted(len(owed.wakes), "wake", "wakes"),
            )

    def _take_cut_short(self) -> None:
        """At start, alone on the state: owe the wakes whose write a stop cut short (see
        `CUT_SHORT_KEEP_S`). One whose file was queued after all is found in the inbox when
        it is tried (`_retry_wakes_of`), not written twice. It goes alone: whether it was a
        report's, to join the child's wake still queued, is not kept in the notice."""
        since = self._clock().timestamp() - CUT_SHORT_KEEP_S
        pending = [
            p
            for p in self._store.pending_notices()
            if p.route.startswith(WAKE_ROUTE_PREFIX) and p.created_at >= since
        ]
        for notice in sorted(pending, key=lambda p: p.created_at):
            parent_id = notice.route[len(WAKE_ROUTE_PREFIX) :]
            child_id, _, episode = notice.notice_id.partition(":")
            if parent_id not in self._writers or not (child_id and episode and notice.text):
                continue
            owed = self._owed_to(parent_id)
            if notice.notice_id not in owed.wakes:  # waiting behind owed ones: kept already
                wake = _FailedWake(child_id, episode, notice.text, report=False)
                self._keep_owed(owed, parent_id, notice.notice_id, wake)
                self._store_tries(parent_id, owed)  # every agent owed wakes has its row
                log.info(
                    "agent %s: the wake about %s cut short by a stop is owed", parent_id, child_id
                )

    def channel_ready(self, channel: str) -> None:
        self._ready.add(channel)
        for record in self._records.values():
            if record.channel == channel:
                self._show(record)

    # People's messages -----------------------------------------------------------------

    def accepts(self, agent_id: str) -> bool:
        return agent_id in self._writers

    def queue(
        self,
        channel: str,
        chat: ChatRef,
        agent_id: str,
        author: str | None,
        text: str,
        reply_to: ReplyTo | None = None,
        author_name: str | None = None,
        writer: str | None = None,
    ) -> str | None:
        """Queue `text` for `agent_id`; a short refusal for the person, or None when queued
        (the status message then says what happens, as a reply to `reply_to`). `author` is
        the person's id (None when the message names none), what the agent reads as the
        user; `author_name` the name such a message shows, for the agent only; `writer` who
        wrote it, for the rate and `/taskcard cancel` (`IncomingCommand.writer`; `author`
        when not given)."""
        writer = author if writer is None else writer
        now = self._clock()
        # Refusals of what was never queued (nothing to send, too long) come before the rate:
        # they write nothing, and must not cost the person one of their messages.
        if not shows_text(text):
            return f"Nothing to send: write the text after /tell {agent_id}."
        message_id = _message_id(channel, chat, reply_to)
        if message_id in self._records:
            # This command was queued already and is handled again (Redis took the record
            # but answered after the call's timeout): one record, one file, one status.
            self._show(self._records[message_id])
            return None
        message = inbox_message(
            ident=message_id,
            kind="message",
            # Both platforms' /tell and replies come here: the agent reads no direction
            # character a person's text holds, only where it was (`show_bidi`).
            text=show_bidi(text),
            channel=channel,
            chat_id=chat.chat_id,
            thread_id=chat.thread_id,
            user=author,
            queued_at=now,
            name=author_name,
        )
        if len(encode_message(message)) > MAX_INBOX_MESSAGE_BYTES:
            # Refused before anything is recorded: sending the same text again would fail the
            # same way, so the answer says what to do instead.
            return (
                f"Too long for {agent_id}: a message may take at most"
                f" {MAX_INBOX_MESSAGE_BYTES // 1024} KiB. Split it into shorter messages."
            )
        if not self._rate.allow(writer or "", agent_id, now.timestamp()):
            return (
                f"Too many messages to {agent_id}: at most {self._config.max_messages} in"
                f" {self._config.period_s:g} s per person. Wait a moment and send it again."
            )
        record = InboxRecord(
            message_id=message_id,
            agent_id=agent_id,
            channel=channel,
            chat_id=chat.chat_id,
            thread_id=chat.thread_id,
            author=writer,
            queued_at=now.timestamp(),
            reply_to_id=None if reply_to is None else reply_to.message_id,
            reply_thread_id=None if reply_to is None else reply_to.thread_id,
        )
        try:
            self._store.add_inbox_message(record)  # first: a crash after the write knows it
        except BaseException:
            # Nothing queued (a cluster's Redis refused it; the command is tried again once
            # Redis answers): the try must not cost the person one of their messages.
            self._rate.give_back(writer or "", agent_id, now.timestamp())
            raise
        self._keep(record)
        self._scheduler.add_route(
            status_key(record), reply_to=answered(record), keeps_refusal=False
        )
        try:
            self._writers[agent_id].queue(message)
        except (InboxRefused, OSError) as error:
            reason = why_refused(error)
            log.warning("agent %s: message %s not queued: %s", agent_id, record.message_id, reason)
            self.problems[agent_id] = f"inbox: {reason}"
            self._close(record, "failed", reason)
        else:
            self.problems.pop(agent_id, None)
            log.info("agent %s: message %s queued from %s", agent_id, record.message_id, channel)
        self._show(self._records[record.message_id])
        return None

    def cancel_latest(
        self, channel: str, chat: ChatRef, author: str | None, thread: str | None = None
    ) -> str:
        """`/taskcard cancel`: withdraw the author's latest message still in `queued/` that was
        written where the cancel is: the same chat and the same thread (a Telegram forum
        topic in `chat`; a Feishu topic or reply thread in `thread`), or the main flow."""
        record = latest_written(self._open_records(), channel, chat, author, thread)
        return NOTHING_TO_CANCEL if record is None else self.cancel(record)

    def cancel(self, record: InboxRecord) -> str:
        """Withdraw one open message (this desk's record of it when it has one) and say how
        that went."""
        record = self._records.get(record.message_id, record)
        if record.outcome == "cancelled":
            # Withdrawn here, but the shared store did not take the outcome (Redis failed),
            # and the command is handled again: it was cancelled, say so and record it.
            self._close(record, "cancelled", "withdrawn by its author")
            return f"Your latest message to {record.agent_id} was cancelled."
        writer = self._writers.get(record.agent_id)
        try:
            won = writer is not None and writer.cancel(record.message_id)
        except InboxRefused as error:
            log.warning(
                "agent %s: cancel of %s failed: %s", record.agent_id, record.message_id, error
            )
            won = False
        if won:
            self._close(record, "cancelled", "withdrawn by its author")
            return f"Your latest message to {record.agent_id} was cancelled."
        if writer is not None and writer.location(record.message_id) == "taken":
            # Claimed, not yet known delivered: its reader may still give it back.
            return (
                f"Too late to cancel: a reader of {record.agent_id} has taken your latest"
                " message. If it does not reach the agent, it is queued again, and"
                " /taskcard cancel withdraws it then."
            )
        return (
            f"Your latest message to {record.agent_id} could not be cancelled: it is no"
            " longer queued."
        )

    def shows_status(self, channel: str, message_ids: Iterable[str]) -> bool:
        """Whether one of `message_ids` is the status message of a text sent from `channel`."""
        wanted = set(message_ids)
        return any(
            record.channel == channel and self._scheduler.message_id(status_key(record)) in wanted
            for record in self._records.values()
        )

    def status_agent(self, channel: str, chat: ChatRef, message_ids: Iterable[str]) -> str | None:
        """The agent whose text's status message in `chat` is one of `message_ids`, or None.
        The status message is headed with the agent's line, as its card is: a reply to it is
        text for that agent. (Matched in the chat: Telegram numbers messages per chat.)"""
        wanted = set(message_ids)
        return next(
            (
                record.agent_id
                for record in self._records.values()
                if record.channel == channel
                and record.chat_id == chat.chat_id
                and self._scheduler.message_id(status_key(record)) in wanted
            ),
            None,
        )

    def add_agent(self, agent_id: str, workdir: Path) -> None:
        """Serve an agent's inbox (an agent joined the fleet, or its workdir changed)."""
        self._writers[agent_id] = InboxWriter(workdir)
        if self._loaded and not self._shared:  # clustered: when its lease is gained here
            self._take_owed((agent_id,))

    def forget_owed(self, agent_id: str) -> None:
        """Forget the wakes owed to an agent that left for good, also those in the store
        (`StateStore.forget_agent` does not find them: their keys end with a notice id)."""
        owed = self._wake_retries.pop(agent_id, None)
        if owed is None and self._store.get_cursor(owed_tries_cursor(agent_id)) is None:
            return  # owes none (the usual case): the store's cursors are not read through
        keys = self._store.cursor_keys(_owed_wakes_of(agent_id))
        self._store.delete_cursors([*keys, owed_tries_cursor(agent_id)])
        self._mark_owing([agent_id], owing=False)

    def remove_agent(self, agent_id: str, reason: str = "the agent was removed") -> None:
        """The agent left the fleet: its queued messages are cancelled, then it is forgotten."""
        self.retire(agent_id, reason)
        self._writers.pop(agent_id, None)
        # Its owed wakes stay in the store, for its return (`add_agent`) or until it is
        # forgotten for good (`forget_owed`).
        self._wake_retries.pop(agent_id, None)
        for key in [key for key in self._report_wakes if agent_id in key]:
            self._forget_report_wake(key)

    def retire(self, agent_id: str, reason: str = "the agent was removed") -> None:
        """Cancel every queued message of an agent that is gone."""
        writer = self._writers.get(agent_id)
        for record in self._open_records(agent_id):
            try:
                if writer is not None and not writer.cancel(record.message_id):
                    continue  # taken first: its ack decides
            except InboxRefused:
                pass
            self._close(record, "cancelled", reason)

    # What the agent side did -----------------------------------------------------------

    def on_acks(self, agent_id: str, acks: Iterable[Ack]) -> None:
        for ack in acks:
            record = self._records.get(ack.id)
            if record is None or record.agent_id != agent_id or record.outcome == "delivered":
                continue
            self._close(record, "delivered", ack.via, ack.at)

    def refresh(self, agent_id: str | None = None) -> None:
        """Show the current state of open messages (of one agent, or all: the timer, which
        also lets closed messages older than `KEEP_CLOSED_S` go from memory)."""
        if agent_id is not None and agent_id not in self._open:
            return  # no open message (asked on every change of the agent)
        for record in self._open_records(agent_id):
            self._show(record)
        if agent_id is None and self._closed:
            self._forget_history(self._clock().timestamp() - KEEP_CLOSED_S)

    def open_messages(self) -> int:
        return sum(len(ids) for ids in self._open.values())

    def _keep(self, record: InboxRecord) -> None:
        """Hold `record` (new, loaded or closed) and keep the indexes in step with it."""
        self._records[record.message_id] = record
        if record.outcome == "open":
            self._open.setdefault(record.agent_id, {})[record.message_id] = None
            return
        ids = self._open.get(record.agent_id)
        if ids is not None:
            ids.pop(record.message_id, None)
            if not ids:
                del self._open[record.agent_id]
        heapq.heappush(self._closed, (record.closed_at or record.queued_at, record.message_id))

    def _open_records(self, agent_id: str | None = None) -> list[InboxRecord]:
        """The open messages of one agent, or of all (a copy: showing may close some)."""
        if agent_id is not None:
            return [self._records[i] for i in self._open.get(agent_id, ())]
        return [self._records[i] for ids in self._open.values() for i in ids]

    def _forget_history(self, before: float) -> None:
        while self._closed and self._closed[0][0] < before:
            _, message_id = heapq.heappop(self._closed)
            record = self._records.get(message_id)
            # Closed again later (an ack after a cancel): its newer entry decides.
            if record is None or (record.closed_at or record.queued_at) >= before:
                continue
            key = status_key(record)
            if not self._scheduler.settled(key):
                # Its last edit goes out first: looked at again a day later.
                heapq.heappush(self._closed, (before + KEEP_CLOSED_S, message_id))
                continue
            del self._records[message_id]
            self._scheduler.remove_route(key)

    # Wakes -----------------------------------------------------------------------------

    def wake(
        self, parent_id: str, child_id: str, episode: str, text: str, *, report: bool = False
    ) -> None:
        """Write a typed notice about `child_id` into the parent's inbox, once per episode.
        `report`: it announces a report, which joins the child's report wake still queued.

        An inbox that cannot be written is one of the parent's problems, as for a person's
        text (`queue`): its card says what is wrong and how to fix it until a write there
        works again. Logged alone, nobody in the chat learned that the orchestrator or the
        parent was no longer woken. The wake is owed meanwhile (`retry_wakes`): lost, the
        parent learned of the child's signal only at its next one, if it had any."""
        writer = self._writers.get(parent_id)
        if writer is None:
            return
        route = WAKE_ROUTE_PREFIX + parent_id
        notice_id = f"{child_id}:{episode}"
        if not self._store.add_notice(route, notice_id, text, "pending"):
            return
        wake = _FailedWake(child_id, episode, text, report)
        owed = self._wake_retries.get(parent_id)
        if owed is not None:
            # The wakes owed go first, in their order: a report retried after a newer one
            # of the same child would join it after its own text. Tried only when their
            # backoff has passed: a busy child's signals would each spend a try, and the
            # tries allowed ran out in seconds instead of the hour and a half they give.
            if owed.due_s <= self._clock().timestamp():
                self._retry_wakes_of(parent_id, owed)
            if parent_id in self._wake_retries:  # still owed: this one waits behind them
                self._keep_owed(self._wake_retries[parent_id], parent_id, notice_id, wake)
                return
        self._write_wake(writer, parent_id, wake)

    def retry_wakes(self) -> list[str]:
        """Write again the wakes that could not be queued and whose backoff has passed; the
        agents whose problems this changed (their card and record are shown again). Looks
        only at the agents that owe a wake: nothing at all while every write worked
        (clustered, one read of the store every `OWED_LOOK_S`: `_look_for_owed`)."""
        if self._shared and self._taken:
            now_s = self._clock().timestamp()
            if not 0 <= now_s - self._owed_looked_s < OWED_LOOK_S:
                self._owed_looked_s = now_s
                self._look_for_owed()
        if not self._wake_retries:
            return []
        now_s = self._clock().timestamp()
        changed: list[str] = []
        for parent_id, owed in list(self._wake_retries.items()):
            if owed.due_s > now_s:
                continue
            before = self.problems.get(parent_id)
            self._retry_wakes_of(parent_id, owed)
            if self.problems.get(parent_id) != before:
                changed.append(parent_id)
        return changed

    def _look_for_owed(self) -> None:
        """Clustered: take up the wakes owed to agents whose lease is held here that another
        instance kept in the store. The instance whose write failed tries them itself, but
        stopped (or gone) it left them there until this one's next lease gain, maybe never.
        One read of the set of agents that owe wakes (`OWED_AGENTS`), whatever the number of
        agents held here: it read a row per agent held, ten thousand every 30 s for an idle
        fleet. Their wakes are read only when an agent held here owes some this instance
        does not know of; a member whose rows are gone (the wakes queued or dropped) goes,
        its row of tries first. So does a member whose agent is held by no lease here once
        its agent owes nothing (`_unheld_owing_none`): a member of an agent no instance
        serves stayed for good, the set growing with each, read whole at every look.

        The first look of a start adds the agents of this fleet whose wakes the store keeps
        (one read of every owed wake), so that those an earlier version kept without the
        set are found too."""
        try:
            if not self._owed_indexed:
                # Once, whatever comes of it: a store that refuses it read every owed row
                # again at every look.
                self._owed_indexed = True
                self._store.add_to_set(OWED_AGENTS, self._stored_owed())
            members = self._store.set_members(OWED_AGENTS)
            self._say_owing_many(len(members))
            agents = [a for a in members if a in self._taken and a not in self._wake_retries]
            if agents:
                self._take_owed(agents)
            done = [a for a in agents if a not in self._wake_retries]
            self._owe_none_shared([*done, *self._unheld_owing_none(members)])
            self._set_refused = None
        except StateFileError as error:  # the set's key holds another type, say
            self._say_set_refused(error)
        except Exception as error:
            # Looked at again in `OWED_LOOK_S`; the store's failure is its own business.
            log.warning("the wakes other instances owe were not read: %s", error)

    def _unheld_owing_none(self, members: Collection[str]) -> list[str]:
        """Clustered, the look: the `members` of `OWED_AGENTS` whose agent is held by no lease
        here and owes no wake in the store, by one read of the owed rows' keys, made only
        when a member not held here has not been looked at within
        `OWED_ELSEWHERE_RECHECK_S`: a member whose agent owes wakes that no instance serves
        (kept for its return) costs no read at each look."""
        now_s = self._clock().timestamp()
        if self._owed_elsewhere:
            present = set(members)
            self._owed_elsewhere = {
                agent: at for agent, at in self._owed_elsewhere.items() if agent in present
            }
        seen = self._owed_elsewhere
        unheld = [
            agent
            for agent in members
            if agent not in self._taken
            and not 0 <= now_s - seen.get(agent, -math.inf) < OWED_ELSEWHERE_RECHECK_S
        ]
        if not unheld:
            return []
        owing = self._agents_owing()
        self._owed_elsewhere.update((agent, now_s) for agent in unheld if agent in owing)
        return [agent for agent in unheld if agent not in owing]

    def _agents_owing(self) -> set[str]:
        """The agents the store keeps owed wakes for, by one read of the rows' keys whatever
        the number of agents asked about (a read of the keys of one agent's rows scans as
        many as a read of all of them)."""
        agents: set[str] = set()
        for key in self._store.cursor_keys(OWED_WAKE_CURSOR):
            try:
                parent_id, _ = json.loads(key[len(OWED_WAKE_CURSOR) :])
            except _UNREADABLE:
                continue  # not a row this desk writes: `_read_owed` names and forgets it
            if isinstance(parent_id, str):
                agents.add(parent_id)
        return agents

    def _owe_none_shared(self, done: Collection[str]) -> None:
        """Clustered, the look: `done` owed no wake in the store when it read it; each leaves
        `OWED_AGENTS`, then the rows are read again, and one whose wakes another instance
        wrote meanwhile is marked again, its row of tries kept. Removed after that instance
        marked it (it marks before and after its rows), the agent's wake was left in the
        store with no member naming it, and no look queued it."""
        if not done:
            return
        self._store.remove_from_set(OWED_AGENTS, done)
        owing = self._agents_owing()
        self._store.add_to_set(OWED_AGENTS, [agent for agent in done if agent in owing])
        self._store.delete_cursors(owed_tries_cursor(a) for a in done if a not in owing)
        unheld = sum(agent not in owing and agent not in self._taken for agent in done)
        if unheld:
            log.info(
                "%s removed from %s: no instance here serves them, and they owe no wake",
                counted(unheld, "agent", "agents"),
                self._store.set_shown(OWED_AGENTS),
            )

    def _say_owing_many(self, count: int) -> None:
        """Name `OWED_AGENTS` in the log once while it holds more than a fleet would make
        (`OWED_AGENTS_PLAUSIBLE`): every look of every instance reads it whole."""
        if count <= OWED_AGENTS_PLAUSIBLE:
            self._said_owing_many = False
            return
        if self._said_owing_many:
            return
        self._said_owing_many = True
        log.warning(
            "%s: %s agents are marked as owing wakes, more than %s (a whole fleet of"
            " agents each owing some), and every look of every instance reads them all. The"
            " looks remove those whose agents owe no wake; the others are agents whose"
            " wakes are kept in Redis while no instance serves them (a cluster keeps an"
            " agent's state for good). Give a program that adds members another key_prefix;"
            " for agents gone for good, stop the instances and delete their members and"
            " their owed-wake rows in the cursors",
            self._store.set_shown(OWED_AGENTS),
            f"{count:,}",
            f"{OWED_AGENTS_PLAUSIBLE:,}",
        )

    def _mark_owing(self, agents: Collection[str], *, owing: bool = True) -> None:
        """Add `agents` to `OWED_AGENTS` (or remove them: `owing` False); clustered only:
        the set serves only the look of a cluster (`_look_for_owed`), and alone on its
        state an instance never reads it (each mark was a write of the state for nothing).
        A store that refuses it (its key holds another type) is named in the log once: the
        owed wakes' rows are written all the same, and the wakes tried here as ever."""
        if not self._shared:
            return
        try:
            if owing:
                self._store.add_to_set(OWED_AGENTS, agents)
            else:
                self._store.remove_from_set(OWED_AGENTS, agents)
        except StateFileError as error:
            self._say_set_refused(error)
        else:
            self._set_refused = None

    def _say_set_refused(self, error: StateFileError) -> None:
        """Log why the store refused `OWED_AGENTS`, once until it is used again."""
        if str(error) != self._set_refused:
            self._set_refused = str(error)
            log.warning("the agents that owe wakes cannot be marked or read: %s", error)

    def _retry_wakes_of(self, parent_id: str, owed: _WakeRetry) -> None:
        """Write the wakes `parent_id` is owed, oldest first, until one fails (its backoff
        then grows) or none is left (the agent is forgotten here)."""
        writer = self._writers.get(parent_id)
        if writer is None:
            self._wake_retries.pop(parent_id, None)
            return
        for notice_id, wake in list(owed.wakes.items()):
            if (
                self._shared
                and self._store.get_cursor(_owed_wake_cursor(parent_id, notice_id)) is None
            ):
                # Clustered, the stored entry is the claim: another instance that owed it too
                # (it failed there, and this one took the agent's lease) queued or dropped it.
                del owed.wakes[notice_id]
                continue
            if writer.location(_wake_ident(notice_id)) != "missing":
                # Queued already: the service stopped after the write, before the row went
                # (a state disk that failed then holds the change back), or another instance
                # of a cluster wrote it. Written again, a wake the agent took came twice. In
                # `cancelled/`, a later wake took it back and carries it.
                self._forget_owed(writer, parent_id, owed, notice_id)
                continue
            if not self._write_wake(writer, parent_id, wake):
                return
        if self._wake_retries.pop(parent_id, None) is not None:
            self._owes_none(parent_id)
        log.info("agent %s: the wakes owed are queued", parent_id)

    def _forget_owed(
        self, writer: InboxWriter, parent_id: str, owed: _WakeRetry, notice_id: str
    ) -> None:
        """An owed wake found in the agent's inbox already: done, in memory and the store.
        Its row goes as a row of a wake queued here does (`_delete_owed_row`): clustered,
        another instance owing it too may have rewritten it carrying a report wake it took
        back and could not move back, which the wake found does not carry. Deleted without
        a look, those reports stayed in `cancelled/`."""
        wake = owed.wakes.pop(notice_id)
        aboard = [wake.withdrawn] if wake.withdrawn else []
        self._delete_owed_row(writer, parent_id, notice_id, wake, aboard)
        self._store.set_notice_state(WAKE_ROUTE_PREFIX + parent_id, notice_id, "delivered")
        log.info(
            "agent %s: the wake about %s owed is in its inbox already, not written again",
            parent_id,
            wake.child_id,
        )

    def _write_wake(self, writer: InboxWriter, parent_id: str, wake: _FailedWake) -> bool:
        """Queue one wake (recorded in the notices already); whether it was queued. One that
        is not is owed: written again with a backoff (`retry_wakes`), or before the next
        wake of the same agent, until it is queued or the agent leaves."""
        child_id, episode, text, report = wake.child_id, wake.episode, wake.text, wake.report
        route = WAKE_ROUTE_PREFIX + parent_id
        notice_id = f"{child_id}:{episode}"
        body, taken_back, left = text, None, None
        ident = _wake_ident(notice_id)
        if report:
            taken_back, left = self._take_back_report_wake(writer, parent_id, child_id, text, ident)
            if taken_back is not None:
                body = f"{taken_back.kept}\n{text}"
        try:
            writer.queue(self._wake_message(ident, child_id, body))
        except (InboxRefused, OSError) as error:
            reason = why_refused(error)
            log.warning("agent %s: wake about %s not queued: %s", parent_id, child_id, reason)
            self.problems[parent_id] = f"inbox: {reason}"
            # The reports the wake taken back carried are not lost with it: queued again,
            # or else carried by this wake when it is owed (left in `cancelled/`, they
            # reached the agent with none of the later wakes).
            carried = False
            if taken_back is not None and not self._put_back_report_wake(
                writer, parent_id, child_id, taken_back
            ):
                carried = True
                wake = wake._replace(text=body, withdrawn=taken_back.ident)
            # Each step only once the one before is in the store, so a stop between two
            # loses nothing: the owed row (carrying the wake taken back), then the note of
            # the take back goes (it is carried now: not put back at the next start), then
            # the notice is failed (pending, the next start owes it: `_take_cut_short`).
            # The note goes only while it is the row: clustered, another instance writing the
            # child's reports meanwhile (it gained the child's lease) may have replaced it
            # with its own wake still queued, which the child's next report joins.
            self._owe_wake(parent_id, notice_id, wake)
            if carried and taken_back is not None:
                cursor = _report_wake_cursor(parent_id, child_id)
                self._write_if_unchanged(cursor, taken_back.note, None)
            self._store.set_notice_state(route, notice_id, "failed")
            return False
        # The wakes taken back whose text travels in this one.
        aboard = {i for i in (taken_back.ident if taken_back else None, wake.withdrawn) if i}
        owed = self._wake_retries.get(parent_id)
        if owed is not None and owed.wakes.pop(notice_id, None) is not None:
            self._delete_owed_row(writer, parent_id, notice_id, wake, aboard)
        if owed is not None:
            owed.backoff.reset()
            if owed.wakes:
                owed.due_s = 0.0  # the inbox works again: the rest at the next tick
                self._store_tries(parent_id, owed)
            else:
                del self._wake_retries[parent_id]
                self._owes_none(parent_id)
        if parent_id not in self._wake_retries:
            self.problems.pop(parent_id, None)
        # Deleted from `cancelled/`: kept there, every report of a child left one more file
        # in its parent's inbox, thousands for an agent that reports many times a second.
        for withdrawn in aboard:
            with contextlib.suppress(InboxRefused, OSError):
                writer.discard_cancelled(withdrawn)
        if report:
            self._report_wakes[(parent_id, child_id)] = (ident, body)
            self._write_if_unchanged(
                _report_wake_cursor(parent_id, child_id), left, json.dumps([ident, body])
            )
        self._store.set_notice_state(route, notice_id, "delivered")
        log.info("agent %s: woken about %s (%s)", parent_id, child_id, episode)
        return True

    def _owe_wake(self, parent_id: str, notice_id: str, wake: _FailedWake) -> None:
        """Keep a wake that could not be queued for `retry_wakes`, the next try after the
        agent's backoff; at most `MAX_OWED_WAKES` per agent (the oldest dropped, logged)."""
        owed = self._owed_to(parent_id)
        self._keep_owed(owed, parent_id, notice_id, wake)
        if owed.backoff.attempts >= WAKE_RETRY_TRIES:
            log.error(
                "agent %s: %d wakes dropped: its inbox could not be written in %d tries",
                parent_id,
                len(owed.wakes),
                WAKE_RETRY_TRIES,
            )
            del self._wake_retries[parent_id]
            self._store.delete_cursors(
                [
                    *(_owed_wake_cursor(parent_id, dropped) for dropped in owed.wakes),
                    owed_tries_cursor(parent_id),
                ]
            )
            for dropped in owed.wakes:  # not taken for cut short at the next start
                self._store.set_notice_state(WAKE_ROUTE_PREFIX + parent_id, dropped, "failed")
            if not self._shared:  # clustered, another instance's may be left: see the look
                self._mark_owing([parent_id], owing=False)
            return
        owed.due_s = self._clock().timestamp() + owed.backoff.next_delay_s()
        self._store_tries(parent_id, owed)

    def _owed_to(self, parent_id: str, attempts: int = 0, due_s: float = 0.0) -> _WakeRetry:
        """The wakes `parent_id` is owed; when it is owed none yet, made with `attempts`
        failed tries and the next try due at `due_s` (epoch seconds)."""
        owed = self._wake_retries.get(parent_id)
        if owed is None:
            backoff = Backoff(
                initial_s=WAKE_RETRY_FIRST_S, max_s=WAKE_RETRY_MAX_S, attempts=attempts
            )
            owed = self._wake_retries[parent_id] = _WakeRetry(backoff, due_s=due_s)
        return owed

    def _owes_none(self, parent_id: str) -> None:
        """`parent_id` owes no wake here any more: its row of tries goes, then its mark in
        `OWED_AGENTS`. Clustered both stay: the row of tries is shared, and another instance
        may owe the agent wakes too; the holder of its lease removes them once no instance's
        wakes are left (`_look_for_owed`)."""
        if not self._shared:
            self._store.delete_cursors([owed_tries_cursor(parent_id)])
            self._mark_owing([parent_id], owing=False)

    def _keep_owed(
        self, owed: _WakeRetry, parent_id: str, notice_id: str, wake: _FailedWake
    ) -> None:
        """Add a wake to those `parent_id` is owed, in memory and in the store, at most
        `MAX_OWED_WAKES` (the oldest dropped, logged); its backoff is left as it is."""
        known = owed.wakes.get(notice_id)
        if known is None:
            wake = wake._replace(seq=owed.next_seq)
            owed.next_seq += 1
            self._mark_owing([parent_id])  # first: see `OWED_AGENTS`
        else:
            wake = wake._replace(seq=known.seq)
            if wake == known:
                return  # tried again and failed again: as it was stored
        owed.wakes[notice_id] = wake
        self._write_owed_row(parent_id, notice_id, wake)
        if known is None:
            self._mark_owing([parent_id])  # and after: see `_owe_none_shared`
        while len(owed.wakes) > MAX_OWED_WAKES:
            dropped = next(iter(owed.wakes))
            del owed.wakes[dropped]
            self._store.delete_cursors([_owed_wake_cursor(parent_id, dropped)])
            self._store.set_notice_state(WAKE_ROUTE_PREFIX + parent_id, dropped, "failed")
            log.warning(
                "agent %s: wake %s dropped: more than %d wait for its inbox",
                parent_id,
                dropped,
                MAX_OWED_WAKES,
            )

    def _write_owed_row(self, parent_id: str, notice_id: str, wake: _FailedWake) -> None:
        """The store's row of one owed wake (`_stored_wake` reads it)."""
        self._store.set_cursor(_owed_wake_cursor(parent_id, notice_id), _owed_row(wake))

    def _delete_owed_row(
        self,
        writer: InboxWriter,
        parent_id: str,
        notice_id: str,
        wake: _FailedWake,
        carried: Collection[str],
    ) -> None:
        """Delete the row of the owed `wake`, queued just now carrying the wakes taken back
        `carried`. Clustered, only while it holds `wake` as known here: another instance
        owing it too (it gained the agent's lease, this one running its last turn) may have
        tried it meanwhile, failed, and written it again carrying a report wake it took back
        and could not move back (`_FailedWake.withdrawn`, left in `cancelled/`), which the
        wake queued here does not carry. That wake is moved back to `queued/` first (alone:
        the child's next report does not join it). Deleted without a look, the other
        instance found no row, took the wake for queued, and those reports stayed in
        `cancelled/`, which no agent reads."""
        key = _owed_wake_cursor(parent_id, notice_id)
        if self._write_if_unchanged(key, _owed_row(wake), None):
            return
        stored = self._store.get_cursor(key)
        if stored is None:
            return
        parsed = _stored_wake(key, stored, self._writers)
        withdrawn = None if isinstance(parsed, str) else parsed[2].withdrawn
        if withdrawn is not None and withdrawn not in carried:
            try:
                writer.restore(withdrawn)
            except InboxRefused as error:
                log.warning(
                    "agent %s: the wake about %s taken back is left in its inbox's cancelled/: %s",
                    parent_id,
                    wake.child_id,
                    error,
                )
        self._write_if_unchanged(key, stored, None)

    def _store_tries(self, parent_id: str, owed: _WakeRetry) -> None:
        """Keep `parent_id`'s failed tries and next due time, for `_take_owed`; marked again
        as owing wakes after (a look elsewhere may have removed the mark meanwhile:
        `_owe_none_shared`)."""
        self._store.set_cursor(
            owed_tries_cursor(parent_id),
            json.dumps({"tries": owed.backoff.attempts, "due_s": owed.due_s}),
        )
        self._mark_owing([parent_id])

    def _take_back_report_wake(
        self, writer: InboxWriter, parent_id: str, child_id: str, text: str, carrier: str
    ) -> tuple[_TakenBack | None, str | None]:
        """The child's report wake still queued in the parent's inbox, withdrawn so that the
        next wake (`carrier`, its message id) carries it too (cut to fit:
        `joined_report_wakes`); None when there is none (the parent took it first), or when
        `text` alone nearly fills a message. And the pair's row as this left it (None: no
        row), for the carrier's row to replace only that (`_write_if_unchanged`): what was
        read, when another instance wrote the row since, so that the compare fails.

        The take back is noted in the store first, with its carrier, until the carrier is
        queued (or the wake put back, or owed with it): a stop in between left the wake in
        `cancelled/`, which no agent reads, and the next start puts it back
        (`_put_back_taken`).

        The row is replaced by the note, and the note deleted, only while it holds what
        was read (`_write_if_unchanged`): clustered, another instance may write the
        pair meanwhile (it gained the child's lease, this one running its last turn), and
        its row stays; this wake then takes nothing back and goes alone.

        A note of an earlier take back found here, its wake carried by no other (clustered:
        the instance that wrote it stopped before its carrier, and the parent's lease
        stayed where it was, so no lease gained put it back; or the move back was refused)
        is taken over: this wake carries the wake it names, from `cancelled/` as it is.
        Deleted, its reports stayed in `cancelled/` for good. So is the child's wake still
        queued that is found in `cancelled/` (the instance moving it back stopped between
        its note and the move, or the move was refused), unless a wake owed carries it."""
        cursor = _report_wake_cursor(parent_id, child_id)
        stored, last = self._last_report_wake((parent_id, child_id))
        if (
            stored is not None
            and last is not None
            and self._note_done(writer, cursor, stored, last)
        ):
            stored, last = self._last_report_wake((parent_id, child_id))
        kept = None if last is None else joined_report_wakes(last.body, text)
        if last is None or kept is None:
            # A row per pair ever seen was left behind; this wake writes its own.
            if stored and self._write_if_unchanged(cursor, stored, None):
                return None, None
            return None, stored
        note = json.dumps([last.ident, last.body, carrier])
        if not self._write_if_unchanged(cursor, stored, note):
            return None, stored
        try:
            taken = writer.cancel(last.ident) or (
                writer.location(last.ident) == "cancelled"
                and not self._carried_by_owed(parent_id, last.ident)
            )
        except InboxRefused:
            taken = False
        if not taken:
            return None, (None if self._write_if_unchanged(cursor, note, None) else note)
        return _TakenBack(last.ident, last.body, kept, note), note

    def _read_report_rows(self) -> dict[str, str]:
        """Every report-wake row the store keeps (`_report_rows`)."""
        return self._store.get_cursors(self._store.cursor_keys(REPORT_WAKE_CURSOR))

    def _put_back_taken(self, parent: str | None = None) -> None:
        """At start, alone on the state: a report wake taken back for a newer wake to carry
        (noted first, with that carrier: `_take_back_report_wake`) whose carrier was not
        written, the service having stopped in between, is moved back from `cancelled/` to
        `queued/`, and noted as the child's wake still queued, so its next report joins
        it; left there, no agent read its reports. The carrier, recorded but not written,
        is owed alone (`_take_cut_short`). When the carrier is in the inbox, it carries
        the wake taken back, which goes from `cancelled/` as it would have.

        Clustered, the same for the wakes taken back from `parent`'s inbox when its lease is
        gained here (`take_agent`; the rows of every lease gained in one turn read once):
        the instance that stopped mid-write left them as alone on its state, and the next
        report of the child read such a note as no wake to take back and dropped it, the
        reports left in `cancelled/` for good. An instance still writing the carrier (it
        serves the child, and lost no lease) then queues it beside the wake moved back:
        the agent reads those reports twice, rather than never.

        Each row is deleted or rewritten only while it still holds what was read
        (`_write_if_unchanged`): clustered, the instance writing the child's wakes
        may rewrite it meanwhile (its carrier queued, the row then names that wake as the
        one still queued), and that newer row must stay, or the child's next report does
        not join the wake queued."""
        for key, value in self._report_rows().items():
            row = _report_row(key, value)
            if isinstance(row, str) and not value and row != _NOT_TWO_NAMES:
                continue  # an earlier version's empty row: `forget_departed` drops it
            if isinstance(row, str):
                # Not what this desk writes: a person's message in `cancelled/`, named by a
                # hand's row, must stay there. The row is deleted, named once with what it
                # held (by the instance whose delete took it): kept, it was named at every
                # start, or, clustered, skipped by every lease gained and left for good.
                if self._write_if_unchanged(key, value, None):
                    _say_bad_report_row(key, value, row)
                continue
            if row.carrier is None or (parent is not None and row.parent_id != parent):
                continue  # the child's wake still queued: no take back noted
            self._put_back_note(key, value, row)

    def _put_back_note(self, key: str, value: str, row: _ReportRow) -> None:
        """`_put_back_taken` for one note of a take back, `row`, read as `value` from the
        report-wake row `key`. The wake it names is noted as the child's wake still queued
        first, in place of the note and only while that is the row, and moved back then:
        another instance may take the note over meanwhile (a child's report, another lease
        gained), and only one of them moves the wake. So a wake not found in `cancelled/`
        stays noted: its own writer, running its last turn, may have moved it back
        already (`_put_back_report_wake`), and the child's next report joins it. A move
        refused puts the note back, for the next lease gained or the child's next report
        (which carries that wake from `cancelled/`: `_take_back_report_wake`)."""
        parent_id, child_id, ident, body, carrier = row
        writer = self._writers.get(parent_id)
        if writer is None or carrier is None or self._note_done(writer, key, value, row):
            return
        queued = json.dumps([ident, body])
        if not self._write_if_unchanged(key, value, queued):
            return
        try:
            restored = writer.restore(ident)
        except InboxRefused as error:
            log.warning(
                "agent %s: the wake about %s taken back is left in its inbox's cancelled/: %s",
                parent_id,
                child_id,
                error,
            )
            self._write_if_unchanged(key, queued, value)
            return
        self._report_wakes[(parent_id, child_id)] = (ident, body)
        if restored:
            log.info(
                "agent %s: the wake about %s taken back by a wake a stop kept from being"
                " written is queued again",
                parent_id,
                child_id,
            )

    def _note_done(self, writer: InboxWriter, key: str, value: str, row: _ReportRow) -> bool:
        """Whether the wake a note of a take back (`row`, read as `value` from `key`) names
        is carried already: by a wake owed (a stop came before the note went; moved back
        or carried again, it reached the agent twice), or by the note's carrier, found in
        the inbox (the wake taken back then goes from `cancelled/`). The note then goes,
        only while it is the row. A row of the child's wake still queued is no note: False,
        without a read of the owed rows (a child's every report reads its row)."""
        if row.carrier is None:
            return False
        if not self._carried_by_owed(row.parent_id, row.ident):
            if writer.location(row.carrier) == "missing":
                return False
            with contextlib.suppress(InboxRefused, OSError):
                writer.discard_cancelled(row.ident)
        self._write_if_unchanged(key, value, None)
        return True

    def _carried_by_owed(self, parent_id: str, ident: str) -> bool:
        """Whether a wake owed to `parent_id` carries the report wake `ident` taken back:
        one owed here, or clustered one another instance owes (its row is written before
        its note of the take back goes: `_write_wake`)."""
        owed = self._wake_retries.get(parent_id)
        if owed is not None and any(w.withdrawn == ident for w in owed.wakes.values()):
            return True
        if not self._shared:
            return False
        rows = self._store.get_cursors(self._store.cursor_keys(_owed_wakes_of(parent_id)))
        for key, value in rows.items():
            parsed = _stored_wake(key, value, self._writers)
            if not isinstance(parsed, str) and parsed[2].withdrawn == ident:
                return True
        return False

    def _put_back_report_wake(
        self, writer: InboxWriter, parent_id: str, child_id: str, taken_back: _TakenBack
    ) -> bool:
        """The wake taken back for one that could not be queued, queued again as it was
        (moved back from `cancelled/`, else written again whole) and noted as the child's
        wake still queued, so the next report joins it; whether nothing is left for the
        failed wake to carry. Written again with the text cut for the failed wake, it lost
        the reports the cut left out.

        Noted first, in place of the note of the take back and only while that is the row,
        then moved: clustered, another instance may have taken the note over meanwhile (a
        child's report, a lease gained, finding it as a stop leaves one), and it carries
        that wake, or moved it back, itself. Moved back here too, the parent read those
        reports twice. A move refused puts the note back, for the failed wake to carry
        the wake taken back."""
        cursor = _report_wake_cursor(parent_id, child_id)
        queued = json.dumps([taken_back.ident, taken_back.whole])
        if not self._write_if_unchanged(cursor, taken_back.note, queued):
            return True
        try:
            restored = writer.restore(taken_back.ident)
            if not restored:
                writer.queue(self._wake_message(taken_back.ident, child_id, taken_back.whole))
        except (InboxRefused, OSError) as error:
            log.warning(
                "agent %s: the wake about %s taken back could not be queued again: %s",
                parent_id,
                child_id,
                error,
            )
            # Taken over since the note was replaced: the other instance carries it.
            return not self._write_if_unchanged(cursor, queued, taken_back.note)
        self._report_wakes[(parent_id, child_id)] = (taken_back.ident, taken_back.whole)
        return True

    def _write_if_unchanged(self, key: str, held: str | None, value: str | None) -> bool:
        """Set the row `key` to `value` (None: delete it), clustered only while it holds
        `held`, what this desk read or left there (None: no row); whether it did. Another
        instance may have written the row since (a lease moved, the old holder running its
        last turn, or both trying one owed wake), and its row must stay: written over or
        deleted, a child's next report joined an older wake, or reports another instance
        left in `cancelled/` for a wake to carry were never read (`StateStore.
        replace_cursor_if`; `change_cursor` writing only where there is none). Alone on the
        state, written whatever the row holds: there is no other writer, and a failing
        state disk holds back the write of what was left (compared, the row would not be
        written at all)."""
        if not self._shared:
            if value is None:
                self._store.delete_cursors([key])
            else:
                self._store.set_cursor(key, value)
            return True
        if held is not None:
            return self._store.replace_cursor_if(key, held, value)
        if value is None:
            return self._store.get_cursor(key) is None
        wrote = [False]

        def only_where_none(current: str | None) -> str:
            wrote[0] = current is None
            return value if current is None else current

        self._store.change_cursor(key, only_where_none)
        return wrote[0]

    def _last_report_wake(self, key: tuple[str, str]) -> tuple[str | None, _ReportRow | None]:
        """The store's row of (parent, child) as read, and what it holds: the report wake
        still queued, or a note of a take back (`_ReportRow.carrier`); None for a row this
        desk would not have written (deleted, named once: `_say_bad_report_row`). Alone on
        the state,
        the wake this desk last queued for the pair is taken from memory first: a state
        disk that fails holds the row's write back. Clustered, from the store alone: the
        memory is stale once another instance wrote the pair (it held the child's lease, or
        the parent's, for a while) and took that wake back since, and the child's next
        report, its take back finding nothing, went alone beside the wake still queued."""
        remembered = self._report_wakes.pop(key, None)
        cursor = _report_wake_cursor(*key)
        stored = self._store.get_cursor(cursor)
        if remembered is not None and not self._shared:
            return stored, _ReportRow(*key, *remembered, None)
        if not stored:
            return stored, None
        row = _report_row(cursor, stored)
        if isinstance(row, str):
            if self._write_if_unchanged(cursor, stored, None):
                _say_bad_report_row(cursor, stored, row)
            return None, None
        return stored, row

    def _forget_report_wake(self, key: tuple[str, str]) -> None:
        """Forget the report wake last queued for (parent, child), in memory and in the
        store: the row is deleted only while it holds what was read, so one another
        instance wrote in between (it gained the child's lease) stays."""
        self._report_wakes.pop(key, None)
        cursor = _report_wake_cursor(*key)
        stored = self._store.get_cursor(cursor)
        if stored is not None:
            self._write_if_unchanged(cursor, stored, None)

    def forget_departed(self, fleet: Collection[str]) -> int:
        """At start: forget the report-wake cursors of pairs whose parent or child is not
        in the fleet (removed from the config, no longer discovered), and those an earlier
        version left empty. Safe whenever: a cursor only lets the next report of the same
        child join the wake still queued; without it, that report gets a wake of its own
        and nothing is lost or said twice (each episode's wake is recorded in the notices,
        which stay). Returns how many were forgotten."""
        gone: list[str] = []
        for key in self._store.cursor_keys(REPORT_WAKE_CURSOR):
            try:
                parent, child = json.loads(key[len(REPORT_WAKE_CURSOR) :])
            except _UNREADABLE:
                continue  # not a key this desk writes: `_put_back_taken` names and deletes it
            if not (isinstance(parent, str) and isinstance(child, str)):
                continue  # nor this one
            if parent not in fleet or child not in fleet or not self._store.get_cursor(key):
                gone.append(key)
                self._report_wakes.pop((parent, child), None)
        self._store.delete_cursors(gone)
        return len(gone)

    def _wake_message(self, ident: str, child_id: str, text: str) -> dict[str, Any]:
        return inbox_message(
            ident=ident,
            kind="wake",
            text=text,
            channel="taskcard",
            chat_id=child_id,
            thread_id=None,
            user=None,
            queued_at=self._clock(),
        )

    # Status messages -------------------------------------------------------------------

    def _close(
        self, record: InboxRecord, outcome: str, reason: str | None, at: datetime | None = None
    ) -> None:
        # An ack's time is the agent side's word: one ahead of the clock is taken as now, or
        # it would sit at the front of the closed ones and hold back the forgetting of all
        # behind it (and stay in memory itself) until that time.
        now = self._clock()
        moment = (now if at is None else min(at, now)).timestamp()
        closed = replace(record, outcome=outcome, reason=reason, closed_at=moment)  # type: ignore[arg-type]
        self._keep(closed)
        self._store.set_inbox_outcome(record.message_id, closed.outcome, reason, moment)
        self._show(closed)

    def state_of(self, record: InboxRecord) -> MessageState:
        state, _ = message_state(
            record,
            self._activity(record.agent_id),
            self._clock(),
            self._config.unconfirmed_after_s,
        )
        return state

    def _show(self, record: InboxRecord) -> None:
        if record.channel not in self._ready or record.agent_id not in self._writers:
            return  # a removed agent's message (cancelled at `load`) has no card to show
        channel = self._channels[record.channel]
        chat = ChatRef(record.chat_id, record.thread_id)
        activity = self._activity(record.agent_id)
        now = self._clock()
        state, _ = message_state(record, activity, now, self._config.unconfirmed_after_s)
        line = state_line(record, state, activity, now, self._zone(record.channel, chat))
        view = CardView(agent_id=record.agent_id, state=activity.state, auto_rows=(line,))
        self._scheduler.submit(status_key(record), self._render(channel, view))
