"""The state store's interface and its value types, shared by every backend.

`StateStore` is the seam: `SqliteStore` (one file, the embedded default) and `RedisStore` (shared
by several `taskcard serve` instances) implement it. Calls are synchronous: each is one small
statement on a local file or a loopback round trip, cheaper than a thread hop.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Generic, Literal, TypeVar

log = logging.getLogger(__name__)

# How many keys one batch read names (`residents_of`, `get_offsets`, `get_cursors`): a
# statement's parameters stay far below SQLite's limit, and a caller reading ahead for
# thousands of agents holds this many values at a time, not all of them.
READ_BATCH: Final = 500

# How long the service remembers a message it posted on a platform whose replies do not say
# who wrote the message replied to (Feishu), so a command written as a reply to it counts as
# addressed to the bot: a month, beyond the 14 days Feishu lets a message be edited, after
# which a card's next change posts a new message (remembered anew).
SENT_KEEP_S = 30 * 86_400.0

# How many notices recorded `unsure` a route keeps (the newest), and for how long, for
# `taskcard status` and the `taskcard_notices` gauge: each is a notice that may be missing
# from its chat, which an operator looks at within days; older ones are forgotten (their ids
# with them), so that a route whose path to the Bot API drops answers for weeks does not
# grow its list, and every status read of it, without end. The time is the month a reply
# to a notice is still read as text for its agent (`SENT_KEEP_S`).
UNSURE_KEEP_PER_ROUTE = 100
UNSURE_KEEP_S = SENT_KEEP_S

# "unsure": a send that may have posted it (the request went out, no answer came back, or the
# service stopped in the middle) on a platform that cannot deduplicate sends: never sent again.
NoticeState = Literal["pending", "delivered", "suppressed", "failed", "folded", "unsure"]


@dataclass(frozen=True)
class ResidentRecord:
    """What the store knows about one route's resident message."""

    route: str
    message_id: str | None
    fingerprint: str | None
    committed_at: float | None
    disabled_reason: str | None
    send_key: str | None = None  # idempotency key of a send that may be in flight
    stale_message_id: str | None = None  # a replaced message still to delete
    # Sends of this resident begun and not answered (each may have posted a copy), and when
    # the latest began; counted before each send so that a SIGKILL mid-send counts too.
    unsure_sends: int = 0
    unsure_at: float | None = None
    # The message whose pin is still owed (put off by a 429, failed for now, or cut short by
    # a stop): pinned by the next run too. Owed only while it is still `message_id`.
    pin_owed_id: str | None = None
    # The fields whose stored value could not be read (text where a time belongs, a time no
    # date can show): each reads as None, and `taskcard status` says it is unreadable.
    unreadable: frozenset[str] = frozenset()


InboxOutcome = Literal["open", "delivered", "failed", "cancelled"]


@dataclass(frozen=True)
class InboxRecord:
    """A message people sent an agent through its inbox, and where it ended.

    `outcome` is "open" while the file waits in `inbox/queued/` (the finer states people see,
    queued/parked/unconfirmed, are derived from the agent's activity and never stored).
    """

    message_id: str
    agent_id: str
    channel: str
    chat_id: str
    thread_id: str | None
    # Who wrote it (`IncomingCommand.writer`): a person's id, or a key of a channel's post
    # (`name:`/`chat:`) that no id equals; `/taskcard cancel` withdraws only its writer's.
    author: str | None
    queued_at: float
    outcome: InboxOutcome = "open"
    reason: str | None = None  # why it failed or was cancelled; via which host it arrived
    closed_at: float | None = None
    # The command its status message answers: that message's id and, where the chat does not
    # name it (a Feishu topic or reply thread), its thread. Kept so that a status first sent
    # after a restart still goes to the thread and the command, and so that `/taskcard cancel`
    # finds the author's messages of that thread only.
    reply_to_id: str | None = None
    reply_thread_id: str | None = None


@dataclass(frozen=True)
class ChatPrefs:
    """Preferences people set with `/taskcard` in one chat (and forum topic)."""

    hidden: bool = False
    activity_rows: int | None = None


@dataclass(frozen=True)
class PendingNotice:
    route: str
    notice_id: str
    text: str
    created_at: float


@dataclass(frozen=True)
class UnsureNotice:
    """A notice recorded `unsure` (see `NoticeState`), and since when (its send began)."""

    route: str
    notice_id: str
    text: str
    since: float | None


class StateFileError(Exception):
    """The state file cannot be used; the message is one line naming the file and the fix."""


class StateNotSaved(Exception):
    """A write made in `StateStore.at_once` that could not be committed now (a full disk,
    another process holding the file locked); the message says why, and nothing was kept."""


class StateFileLocked(StateFileError):
    """The state file cannot be written because another process holds it locked (an
    instance still exiting, a sqlite3 shell in a transaction): it may pass by itself."""


@dataclass(frozen=True)
class StateHealth:
    """A running fault of state writes: since when, why, and how many writes wait."""

    failing_since: float
    reason: str
    waiting_writes: int


@dataclass(frozen=True)
class SeenChat:
    """A chat (and forum topic) the bot received a command from, routed or not."""

    channel: str
    chat_id: str
    thread_id: str | None
    title: str | None
    last_seen: float  # 0.0 (long ago) when unreadable
    unreadable: frozenset[str] = frozenset()  # as `ResidentRecord.unreadable`


class StateStore(ABC):
    """Everything the service must remember across restarts."""

    @abstractmethod
    def close(self) -> None: ...

    def retry_pending(self, *, force: bool = False) -> bool:
        """Retry writes that failed (when due, or now with `force`); True when none wait."""
        del force
        return True

    def health(self) -> StateHealth | None:
        """The running write fault, or None when every write so far is committed."""
        return None

    @contextmanager
    def at_once(self) -> Iterator[None]:
        """Writes in this block are committed when they return, or raise (`StateNotSaved`
        from a store that otherwise keeps a failed write to retry it): the mark of a send
        that must go at most once, which the send may not pass while it is not on disk."""
        yield

    # Resident messages -------------------------------------------------------------------
    @abstractmethod
    def resident(self, route: str) -> ResidentRecord | None: ...

    @abstractmethod
    def residents(self) -> list[ResidentRecord]: ...

    @abstractmethod
    def residents_of(self, routes: Iterable[str]) -> dict[str, ResidentRecord]:
        """`resident` of each of `routes`, those that have one, in a few reads: for the
        routes of every agent at start (see `ReadAhead`), not per change."""

    @abstractmethod
    def set_message_id(self, route: str, message_id: str | None) -> None:
        """Persist the resident id (None forgets it); the committed fingerprint is cleared."""

    @abstractmethod
    def replace_message(
        self, route: str, *, message_id: str | None = None, stale_message_id: str | None = None
    ) -> None:
        """In one transaction: the resident id (None: send a replacement next) and the id of a
        superseded message still to delete (None: nothing left to delete)."""

    @abstractmethod
    def set_send_key(self, route: str, key: str | None) -> None:
        """Remember the idempotency key of the send about to happen (None: no send pending)."""

    @abstractmethod
    def set_unsure_sends(self, route: str, count: int, at: float | None) -> None:
        """Persist how many sends of the resident have no answer yet (see ResidentRecord);
        `set_message_id` with an id resets the count, the outcome being known."""

    def before_send(
        self, route: str, send_key: str | None, unsure: tuple[int, float | None] | None
    ) -> None:
        """What a send about to go out must leave behind if the process dies during it, in
        one write: its idempotency key (None: the one kept stays) and the count of sends
        without an answer with its time (None: not counted on this channel). Both stores
        write it as one transaction; this default is the two writes it stands for."""
        if send_key is not None:
            self.set_send_key(route, send_key)
        if unsure is not None:
            self.set_unsure_sends(route, *unsure)

    @abstractmethod
    def set_pin_owed(self, route: str, message_id: str | None) -> None:
        """Persist that `message_id` still owes its pin (None: no pin owed)."""

    @abstractmethod
    def set_committed(self, route: str, fingerprint: str, at: float) -> None: ...

    @abstractmethod
    def set_disabled(self, route: str, reason: str | None) -> None: ...

    # Preferences ---------------------------------------------------------------------------
    @abstractmethod
    def prefs(self, scope: str) -> ChatPrefs: ...

    @abstractmethod
    def set_prefs(self, scope: str, prefs: ChatPrefs) -> None: ...

    # Notices -------------------------------------------------------------------------------
    @abstractmethod
    def add_notice(self, route: str, notice_id: str, text: str, state: NoticeState) -> bool:
        """Record a notice for a route; False when that id was already known for the route."""

    @abstractmethod
    def pending_notices(self, route: str | None = None) -> list[PendingNotice]: ...

    @abstractmethod
    def set_notice_state(self, route: str, notice_id: str, state: NoticeState) -> None: ...

    @abstractmethod
    def mark_notice_unsure(self, route: str, notice_id: str) -> bool:
        """Record the notice `unsure` (its send begins, see `NoticeState`) only while it is
        `pending`, in one step: False, and nothing written, when it is not (clustered, the
        instance that took the agent over sent it or is sending it; people silenced it; it
        is gone), and then it must not be sent. Committed when it returns, or raises, as a
        write in `at_once`."""

    @abstractmethod
    def prune_unsure_notices(self, now: float, route: str | None = None) -> None:
        """Forget the notices recorded `unsure` before `now - UNSURE_KEEP_S`, and those of
        `route` (of every route when None) past its newest `UNSURE_KEEP_PER_ROUTE`: each is
        `failed` from then on, its text dropped and its id kept, so that the same notice read
        again (its offset lost) is still known and not sent a second time."""

    @abstractmethod
    def unsure_notices(self, route: str | None = None) -> list[UnsureNotice]:
        """The notices recorded `unsure` (of `route`, or of all routes), the oldest first:
        for `taskcard status`, which shows an operator what may be missing from a chat."""

    # Offsets and cursors -------------------------------------------------------------------
    @abstractmethod
    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None: ...

    @abstractmethod
    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None: ...

    @abstractmethod
    def get_offsets(
        self, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, int]]:
        """`get_offset` of each (agent id, file name) of `keys`, those that have one, in a few
        reads: for every agent's files at start (see `ReadAhead`), not per change."""

    def set_first_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        """The offset taken at an agent's first sight; a store may commit it a little later.

        Losing it to a crash only means the next start takes the first sight again, so a
        store may batch these (SQLite does); by default it is an ordinary `set_offset`.
        """
        self.set_offset(agent_id, name, inode, offset)

    @abstractmethod
    def get_cursor(self, key: str) -> str | None: ...

    @abstractmethod
    def set_cursor(self, key: str, value: str) -> None: ...

    @abstractmethod
    def change_cursor(self, key: str, change: Callable[[str | None], str]) -> None:
        """Set the cursor to `change` of its stored value (None: not set), in one atomic
        step: no other writer of the store (another instance of a cluster, another process
        on the same file) writes the cursor between the read and the write, so two writers
        changing different parts of one document both keep their change (the shared origin
        route book). `change` may be called more than once, each time on a newer value
        (Redis: another writer came first), and later than this call (SQLite: a write that
        failed is retried from the backlog), so it depends only on its argument and on
        values it captured when given. A read stays one `get_cursor`."""

    @abstractmethod
    def get_cursors(self, keys: Iterable[str]) -> dict[str, str]:
        """`get_cursor` of each of `keys`, those that are set, in a few reads: for every
        agent's cursors at start (see `ReadAhead`), not per change."""

    @abstractmethod
    def cursor_keys(self, prefix: str) -> list[str]:
        """The keys of every cursor whose key starts with `prefix` (a plain prefix, no
        pattern), sorted. It reads every cursor: for housekeeping at start, not per change."""

    @abstractmethod
    def delete_cursors(self, keys: Iterable[str]) -> None:
        """Forget these cursors (`get_cursor` gives None for them after); unknown keys are
        ignored."""

    def replace_cursor_if(self, key: str, expected: str, value: str | None) -> bool:
        """Set the cursor to `value` (None: delete it) only while it still holds `expected`;
        whether it did. For a row another writer may rewrite between this caller's read and
        its write (a cluster's instances share the cursors), so that the newer row is never
        written over or deleted. Here, for a store with one writer (SQLite: one service per
        file, `serve.lock`), a read and a write; a shared store does both in one atomic
        step."""
        if self.get_cursor(key) != expected:
            return False
        if value is None:
            self.delete_cursors([key])
        else:
            self.set_cursor(key, value)
        return True

    # Sets of names ---------------------------------------------------------------------------
    # An index the service reads often, where reading every row it indexes would cost per
    # agent served (the agents that owe wakes). Here one cursor per member under
    # `SET_CURSOR`, which `set_members` finds by prefix (SQLite: one instance per file, which
    # reads the index seldom); Redis keeps a real set, read in one call.

    def add_to_set(self, name: str, members: Iterable[str]) -> None:
        """Add `members` to the set `name`; one already there stays there, once."""
        for member in dict.fromkeys(members):
            self.set_cursor(_set_cursor(name, member), "")

    def set_members(self, name: str) -> list[str]:
        """The members of the set `name`, sorted; a member a backend cannot read (Redis: not
        UTF-8, or longer than `MAX_MEMBER_BYTES`) is left out, logged once, and removed."""
        start = _set_cursor(name, "")
        return [key[len(start) :] for key in self.cursor_keys(start)]

    def remove_from_set(self, name: str, members: Iterable[str]) -> None:
        """Remove `members` from the set `name`; one not there is ignored."""
        self.delete_cursors(_set_cursor(name, member) for member in members)

    def set_shown(self, name: str) -> str:
        """Where the set `name` is kept, as a log line names it for an operator to look."""
        return f"the state's rows {_set_cursor(name, '*')}"

    # An agent that left for good -----------------------------------------------------------
    @abstractmethod
    def offset_agents(self) -> set[str]:
        """The agents whose files have offsets kept: every agent the service has read. It
        reads every offset: for housekeeping at start, not per change."""

    @abstractmethod
    def forget_agent(
        self,
        agent_id: str,
        *,
        routes: Iterable[str] = (),
        cursors: Iterable[str] = (),
        cursor_prefixes: Iterable[str] = (),
    ) -> None:
        """Forget what is kept for an agent that left for good: the resident and the notices
        of every route whose key ends with `:<agent_id>` (its cards in every chat; see
        `RouteKey.store_key`) and of `routes`, the offsets of its files, its inbox messages,
        the `cursors`, and each cursor whose key starts with one of `cursor_prefixes` and
        ends with `:<agent_id>`. Called once per agent that left, never periodically, and on
        the event loop, up to ten agents a second: SQLite finds the rows through indexes on
        the routes' last part (the agent's own rows' work). Redis walks its tables,
        filtering on the server; the service never calls it there, since a cluster forgets
        nothing (docs/operators.md)."""

    @abstractmethod
    def first_claim(self, key: str, value: str, keep_s: float) -> str:
        """The value the first caller gave for `key`, kept `keep_s`: the instances of a
        cluster that each handle one command decide what it means once (the first to get
        here) and all act on that decision. A store serving one instance has no other
        caller and answers `value`."""

    # Rate-limit pauses (wall-clock epochs, so a restart honours a running 429 window) ------
    @abstractmethod
    def pauses(self) -> dict[str, float]: ...

    @abstractmethod
    def set_pause(self, scope: str, until_epoch: float) -> None: ...

    # What operators read: notices by state, and where commands came from -----------------
    @abstractmethod
    def notice_counts(self) -> dict[str, int]: ...

    @abstractmethod
    def record_chat(self, chat: SeenChat) -> None:
        """Remember (or refresh) a chat commands came from; a known title is kept."""

    @abstractmethod
    def seen_chats(self) -> list[SeenChat]: ...

    # Messages the service sent where a reply does not say who wrote the message ----------
    @abstractmethod
    def remember_sent(self, channel: str, message_id: str, at: float) -> None:
        """Keep for `SENT_KEEP_S` that the service posted `message_id` on `channel` (one
        whose replies name only the message replied to, see `Channel.replies_name_author`)."""

    @abstractmethod
    def sent_any(self, channel: str, message_ids: Iterable[str], now: float) -> bool:
        """Whether the service posted one of `message_ids` on `channel` within `SENT_KEEP_S`
        (any instance of a cluster)."""

    # Notices people may reply to ---------------------------------------------------------
    @abstractmethod
    def remember_notice(
        self, channel: str, chat_id: str, message_id: str, agent_id: str, at: float
    ) -> None:
        """Keep for `SENT_KEEP_S` that `message_id` in the chat is a notice about `agent_id`
        (on every platform): a reply to it is text for that agent, as a reply to its card.
        Kept when the agent leaves (`forget_agent`): the service gives a reply only to an
        agent routed to the chat, and one that returns under its name is the same agent."""

    @abstractmethod
    def notice_agent(
        self, channel: str, chat_id: str, message_ids: Iterable[str], now: float
    ) -> str | None:
        """The agent a notice among `message_ids` in the chat was about, posted within
        `SENT_KEEP_S` (by any instance of a cluster); None when none is a notice. When
        several are, the first of `message_ids` wins (every store alike)."""

    # Messages to agents (the inbox) ------------------------------------------------------
    @abstractmethod
    def add_inbox_message(self, record: InboxRecord) -> None:
        """Record a message about to be queued (before the file is written)."""

    @abstractmethod
    def set_inbox_outcome(
        self, message_id: str, outcome: InboxOutcome, reason: str | None, at: float
    ) -> None:
        """Close (or reopen) a message: delivered, failed or cancelled, with why or how."""

    @abstractmethod
    def inbox_messages(self, since: float) -> list[InboxRecord]:
        """Every open message, and closed ones queued at or after `since`, oldest first."""


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_UNREAD: Final = object()  # `ReadAhead.take` of a key its batch did not name


SET_CURSOR = "set:"
# Longer members of a shared set are someone else's (a hand, a hostile writer): skipped.
MAX_MEMBER_BYTES = 1024


def _set_cursor(name: str, member: str) -> str:
    """The cursor that holds `member` of the set `name` (`StateStore.add_to_set`)."""
    return f"{SET_CURSOR}{name}:{member}"


# The set of the agents that owe wakes (`bridge.run.inbox_desk`), named here so that a
# cluster's start can check the type of its key with the other fixed names.
OWED_AGENTS = "owed-wakes"


def shown_key(key: str, limit: int = 200) -> str:
    """A stored row's key or a Redis member as a log line may show it: cut to `limit`
    characters, and written as its `repr` when it holds a line break or another character a
    log line should not carry (a hand-edited key would otherwise split a text log line)."""
    key = key[:limit]
    return key if key.isprintable() else repr(key)


def stored_float(value: object) -> float | None:
    """A stored number as a finite float, or None when absent or not one (text such as
    "soon", NaN, infinity, a blob): the stores skip such a value with a warning instead of
    ending the service on a file or key edited by hand."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (ValueError, TypeError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def stored_time(value: object) -> float | None:
    """A stored epoch as a float, or None when absent or not one a date can show (see
    `stored_float`; `1e300` is a number but no time)."""
    number = stored_float(value)
    if number is None:
        return None
    try:
        datetime.fromtimestamp(number, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return number


def stored_int(value: object) -> int | None:
    """A stored whole number as an int, or None when absent or not one (text, a blob, a
    fraction, NaN, one beyond the 64 bits a store can hold): read like `stored_float`."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    return None


def stored_text(value: object) -> str | None:
    """A stored text (an id, a key, a reason) as a str, or None when absent or a blob: read
    like `stored_float`. A number is the text SQLite would have stored for it."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def in_batches(items: Iterable[K], size: int = READ_BATCH) -> Iterator[list[K]]:
    """`items` in lists of at most `size`, in order."""
    batch: list[K] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class ReadAhead(Generic[K, V]):
    """Values of many keys read in one batch, then taken one key at a time.

    At start the service reads the same few rows for every agent (its offsets, its cursors,
    its routes' residents): one batch read (`read_many`, a store's `get_offsets` and the like)
    replaces thousands of single reads. Each value is taken once (`take`); a key the batch
    did not name, or one taken already, is read alone (`read_one`) as before. When the batch
    read fails, it is as if it had named no key: every key is then read alone, so a state
    that cannot be read fails where and as it did before, one agent's read at a time (the
    failure is logged at debug level only: the single reads report it).
    """

    __slots__ = ("_found", "_read_one")

    def __init__(
        self,
        read_many: Callable[[Sequence[K]], Mapping[K, V]],
        read_one: Callable[[K], V | None],
        keys: Iterable[K],
    ) -> None:
        self._read_one = read_one
        # Each key the batch named, with its value (None: the store keeps none).
        self._found: dict[K, V | None] = dict.fromkeys(keys)
        if not self._found:
            return
        try:
            self._found.update(read_many(list(self._found)))
        except Exception as error:
            log.debug("a batch read failed (%s); each key is read alone", error)
            self._found = {}

    def take(self, key: K) -> V | None:
        """The value of `key` (None: none is kept), from the batch the first time."""
        value = self._found.pop(key, _UNREAD)
        return self._read_one(key) if value is _UNREAD else value  # type: ignore[return-value]

    def forget(self, key: K) -> None:
        """The value of `key` changed (it is written): read it alone if asked for again."""
        self._found.pop(key, None)


class OffsetsAhead:
    """The store's offsets as the agents' readers use them (`bridge.track.monitor`'s
    `OffsetStore`), whose first reads can be read ahead for many agents at once.

    Outside `reading_ahead` every call is the store's own. Inside it, the offsets it named
    were read in one batch and each is taken once; a write of one drops what was read ahead
    for it, so nothing read before a write is handed out after it.
    """

    __slots__ = ("_ahead", "_store")

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._ahead: ReadAhead[tuple[str, str], tuple[int, int]] | None = None

    @contextmanager
    def reading_ahead(self, keys: Iterable[tuple[str, str]]) -> Iterator[None]:
        """Read the offsets of `keys`, (agent id, file name), in one batch for the block."""
        store = self._store
        self._ahead = ReadAhead(store.get_offsets, lambda key: store.get_offset(*key), keys)
        try:
            yield
        finally:
            self._ahead = None

    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None:
        if self._ahead is None:
            return self._store.get_offset(agent_id, name)
        return self._ahead.take((agent_id, name))

    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        if self._ahead is not None:
            self._ahead.forget((agent_id, name))
        self._store.set_offset(agent_id, name, inode, offset)

    def set_first_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        if self._ahead is not None:
            self._ahead.forget((agent_id, name))
        self._store.set_first_offset(agent_id, name, inode, offset)
