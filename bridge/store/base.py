"""The state store's interface and its value types, shared by every backend.

`StateStore` is the seam: `SqliteStore` (one file, the embedded default) and `RedisStore` (shared
by several `taskcard serve` instances) implement it. Calls are synchronous: each is one small
statement on a local file or a loopback round trip, cheaper than a thread hop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

# How long the service remembers a message it posted on a platform whose replies do not say
# who wrote the message replied to (Feishu), so a command written as a reply to it counts as
# addressed to the bot: a month, beyond the 14 days Feishu lets a message be edited, after
# which a card's next change posts a new message (remembered anew).
SENT_KEEP_S = 30 * 86_400.0

NoticeState = Literal["pending", "delivered", "suppressed", "failed", "folded"]


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


class StateFileError(Exception):
    """The state file cannot be used; the message is one line naming the file and the fix."""


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
    last_seen: float


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

    # Resident messages -------------------------------------------------------------------
    @abstractmethod
    def resident(self, route: str) -> ResidentRecord | None: ...

    @abstractmethod
    def residents(self) -> list[ResidentRecord]: ...

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

    # Offsets and cursors -------------------------------------------------------------------
    @abstractmethod
    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None: ...

    @abstractmethod
    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None: ...

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
    def cursor_keys(self, prefix: str) -> list[str]:
        """The keys of every cursor whose key starts with `prefix` (a plain prefix, no
        pattern), sorted. It reads every cursor: for housekeeping at start, not per change."""

    @abstractmethod
    def delete_cursors(self, keys: Iterable[str]) -> None:
        """Forget these cursors (`get_cursor` gives None for them after); unknown keys are
        ignored."""

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
