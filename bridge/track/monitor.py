"""Per-agent reading of the contract files: the card, its health, new notifications, activity.

One job: the monitor. Following the JSONL logs is `bridge.follow.tail`, the legacy JSON card
frame is `bridge.track.legacy`, the activity fold is `bridge.track.activity`; here they are put
together into one agent's last good reading.

An `AgentMonitor` is refreshed whenever the watcher says an agent's files may have changed
(and on every rescan), for up to thousands of agents, so a refresh with nothing new costs a
handful of `stat` calls and no reads. Every file may be missing, half-written, replaced,
truncated or rotated at any moment; none of that raises, and none of it loses the last good
state: a card is only replaced by a better reading of the files, never by a worse one.

Rules (docs/architecture.md, "File contracts"):

- `taskcard/status` exactly `active` with a non-blank body shows the body; exactly `inactive`
  means the card stopped; anything else keeps the last good state. Byte-identical bodies
  change nothing, so `body_changed_at` is the body file's own modification time.
- `.notification/system.jsonl` is followed by (inode, offset), persisted through an
  `OffsetStore`. An agent seen for the first time starts at the end of the file (history is
  not replayed to chats) but a bounded tail is read to learn whether an error episode is open
  or the refresh budget ran out.
- `logs/events.jsonl` is read from a bounded tail at first sight, then incrementally. The
  agent state comes only from these events and their timestamps, never from card refreshes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal, Protocol

from taskcard.bridge.follow.safe_read import WorkdirFiles
from taskcard.bridge.follow.tail import TAIL_BYTES as TAIL_BYTES
from taskcard.bridge.follow.tail import FileSignature, LineFollower, Position, signature
from taskcard.bridge.track.activity import ActivitySummary as ActivitySummary
from taskcard.bridge.track.activity import ActivityTracker
from taskcard.bridge.track.files import (
    BODY_NAME,
    EVENTS_NAME,
    NOTIFICATIONS_NAME,
    STATUS_NAME,
    WATCH_NAME,
    CardFiles,
)
from taskcard.bridge.track.legacy import body_markdown
from taskcard.producers.task_card.contract import (
    EARLIEST_TIME,
    LATEST_TIME,
    SOURCE_ERROR,
    SOURCE_LIMIT,
    CardStatus,
    Notification,
    parse_json,
    parse_notification,
    parse_status,
    shows_text,
)

logger = logging.getLogger(__name__)

NOTIFICATIONS_OFFSET: Final = "notifications"
MAX_BODY_BYTES: Final = 512 * 1024


class OffsetStore(Protocol):
    """Durable (inode, byte offset) positions in followed files, per agent and file name."""

    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None: ...

    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None: ...

    def set_first_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        """Like `set_offset`, at first sight: a crash may lose it (the sight is taken again)."""


class MemoryOffsetStore:
    """An `OffsetStore` in memory: for tests and for runs that need no restart continuity."""

    def __init__(self) -> None:
        self._offsets: dict[tuple[str, str], tuple[int, int]] = {}

    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None:
        return self._offsets.get((agent_id, name))

    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        self._offsets[(agent_id, name)] = (inode, offset)

    set_first_offset = set_offset


@dataclass(frozen=True)
class CardState:
    """The programmable slot's source and the card's health, as last read from the files."""

    status: Literal["none", "active", "inactive"] = "none"
    body: str | None = None
    body_changed_at: datetime | None = None
    error_code: str | None = None
    error_since: datetime | None = None
    exhausted: bool = False
    watch_id: str | None = None
    status_changed_at: datetime | None = None

    def with_body(self, body: str, changed_at: datetime | None) -> CardState:
        """This state with a new body: `replace(self, body=..., body_changed_at=...)` for the
        one change every card change makes, without `dataclasses.replace`'s walk over the
        fields (it cost as much as the rest of reading the card), nor the frozen `__init__`'s
        `object.__setattr__` per field: the new state's fields are this one's, copied in one
        update of its `__dict__` (the class has no `__post_init__` to run, and no slots), so a
        field added later is carried too (`tests/bridge/test_compose.py` checks both)."""
        state = object.__new__(CardState)
        state.__dict__.update(self.__dict__, body=body, body_changed_at=changed_at)
        return state


@dataclass(frozen=True)
class AgentRefresh:
    """What one `refresh` found: whether the card or the activity changed, new notifications."""

    card_changed: bool
    activity_changed: bool
    notifications: tuple[Notification, ...] = ()
    # An unexpected error in one part of the reading (the others still ran); the caller's
    # fault barrier reports it. Retried on the next refresh.
    failure: Exception | None = None


_CARD_NAMES: Final = frozenset({STATUS_NAME, BODY_NAME, WATCH_NAME})
# What most refreshes find, made once (immutable, so shared): no notification and no
# failure, by (card_changed, activity_changed).
_PLAIN_REFRESHES: Final = {
    (card, activity): AgentRefresh(card_changed=card, activity_changed=activity)
    for card in (False, True)
    for activity in (False, True)
}


def status_problem(raw: bytes) -> str | None:
    """Why a status file's bytes are neither of the two the contract has (exactly `active` or
    `inactive`, nothing around them), or None. The card keeps its last state meanwhile; an
    `echo active > status` writes a line break after the word, which no card ever showed."""
    if not raw or parse_status(raw) != "unknown":
        return None  # empty: a write under way, read again when it lands
    word = raw.strip().decode("ascii", "replace").lower()
    if word in ("active", "inactive") and raw.strip() == word.encode():
        return (
            f'holds "{word}" with a line break or spaces around it; write exactly {word}, with'
            f" nothing after it (printf {word}, not echo)"
        )
    return (
        "holds neither active nor inactive; write exactly one of the two words, in lower case,"
        " with nothing after it"
    )


def _mtime(signature: FileSignature | None) -> datetime | None:
    """A file's modification time, or None when it is absurd (an agent may set any mtime)."""
    if signature is None:
        return None
    try:
        moment = datetime.fromtimestamp(signature[2] / 1e9, UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return moment if EARLIEST_TIME <= moment < LATEST_TIME else None


def body_problem(raw: bytes) -> str | None:
    """Why a body's bytes are no card body, or None (an empty file too: a write under way).

    By the renderer contract a body is UTF-8 (the host refuses other output) that shows a
    reader something: white space, NULs, zero-width or other invisible characters alone are
    blank (the host refuses such output too). Either kind keeps the last good body shown,
    and says why; bytes that are not UTF-8 were shown as a screenful of replacement marks."""
    if not raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return (
            f"is not UTF-8 text (byte 0x{raw[error.start]:02x} at offset {error.start:,});"
            " write the body as UTF-8 text, as a renderer prints it (the last good one stays"
            " shown)"
        )
    if not raw.strip() or not shows_text(text):
        return (
            "shows nothing (only white space or invisible characters); write a body with"
            " visible text (the last good one stays shown)"
        )
    return None


def _text(value: object) -> str:
    """A text field of an agent record; anything that is not text is unset."""
    return value if isinstance(value, str) else ""


class AgentMonitor:
    """Reads one agent's contract files incrementally; never raises on bad or missing files."""

    # One per agent, thousands at once: slots keep each a few hundred bytes smaller.
    __slots__ = (
        "_activity",
        "_body_raw",
        "_card",
        "_card_removed",
        "_card_signatures",
        "_clock",
        "_events",
        "_full_next",
        "_no_output_after_s",
        "_notifications",
        "_offsets",
        "_pending_offset",
        "_primed",
        "_start_silence_s",
        "_status_read",
        "_tracker",
        "agent_id",
        "files",
        "paths",
    )

    def __init__(
        self,
        agent_id: str,
        workdir: Path,
        offsets: OffsetStore,
        *,
        clock: Callable[[], datetime],
        no_output_after_s: float = 300.0,
        start_silence_s: float = 30.0,
    ) -> None:
        self.agent_id = agent_id
        self.paths = CardFiles(workdir)
        self._offsets = offsets
        self._clock = clock
        self._no_output_after_s = no_output_after_s
        self._start_silence_s = start_silence_s
        self._card = CardState()
        self._card_signatures: tuple[FileSignature | None, ...] | None = None
        self._card_removed = False  # inactive with no body: `remove` ended the card
        self._body_raw: bytes | None = None
        # The status file's signature and what it said, when it was last read successfully:
        # a body change (the usual one) then costs no second read of an unchanged status.
        self._status_read: tuple[FileSignature, CardStatus] | None = None
        self.files = WorkdirFiles(agent_id, workdir)
        self._notifications = LineFollower(self.paths.notifications, self.files)
        self._events = LineFollower(self.paths.events, self.files)
        self._tracker = ActivityTracker()
        self._activity = ActivitySummary()
        self._primed = False
        self._pending_offset: tuple[int, int] | None = None
        # After a failure, the next refresh looks at every file whatever it is told changed.
        self._full_next = False

    @property
    def card(self) -> CardState:
        return self._card

    @property
    def activity(self) -> ActivitySummary:
        """The activity summary; its time-dependent state is brought up to date on read."""
        valid_until = self._activity.state_valid_until
        if valid_until is not None and self._clock() >= valid_until:
            self._activity = self._tracker.summary(
                self._clock(), self._no_output_after_s, self._start_silence_s
            )
        return self._activity

    def retime(self, no_output_after_s: float) -> None:
        """Take a new `no_output_after_s` (a reload changed `[display]`): the state is worked
        out again with it at once (before the first refresh there is none to work out)."""
        self._no_output_after_s = no_output_after_s
        if self._primed:
            self._activity = self._tracker.summary(
                self._clock(), no_output_after_s, self._start_silence_s
            )

    def commit(self) -> None:
        """Persist the notification offset of what the last `refresh` returned.

        Called at the start of the next `refresh` too: a caller that records the returned
        notifications before refreshing again loses none when the service dies in between
        (they are returned again and deduplicated by their idempotency keys).
        """
        if self._pending_offset is not None:
            inode, offset = self._pending_offset
            self._offsets.set_offset(self.agent_id, NOTIFICATIONS_OFFSET, inode, offset)
            self._pending_offset = None

    def take_origins(self) -> list[tuple[str, datetime]]:
        """The chats turns came from since the last call, as written (unchecked), with when."""
        if not self._tracker.origins:
            return []  # the usual answer (asked on every change)
        taken = list(self._tracker.origins)
        self._tracker.origins.clear()
        return taken

    def forget_signatures(self) -> None:
        """Read the card files again at the next refresh, even when they look unchanged.

        Used after a refresh failed half-way, so that a retry is never skipped as "nothing new".
        """
        self._card_signatures = None
        self._status_read = None
        self._full_next = True
        self._notifications.forget()
        self._events.forget()

    def refresh(self, changed: frozenset[str] | None = None) -> AgentRefresh:
        """Read what changed since the last refresh.

        `changed` names the files the watcher saw change (`bridge.track.files`' names), when
        it saw nothing else: the others are then taken as they were at the last refresh, not
        even `stat`ed (a card body change costs one `stat` and one read instead of five
        `stat`s). None, the first refresh and the one after a failure look at every file;
        the watcher's rescan passes None, so whatever an event missed is still found.
        """
        if self._pending_offset is not None:  # `commit`'s own test: most often none
            self.commit()
        if not self._primed or self._full_next:
            changed = None
            self._full_next = False
        card_before = self._card
        notifications: tuple[Notification, ...] = ()
        failure: Exception | None = None
        # The three parts are independent: a failure in one must not hide the others' news.
        try:
            if changed is None or not changed.isdisjoint(_CARD_NAMES):
                self._refresh_card(changed)
        except Exception as error:
            failure = error
        try:
            if changed is None or NOTIFICATIONS_NAME in changed:
                notifications = self._refresh_notifications()
        except Exception as error:
            failure = failure or error
        events_read = False
        try:
            if changed is None or EVENTS_NAME in changed:
                events_read = self._refresh_events()
        except Exception as error:
            events_read = True
            failure = failure or error
        if failure is not None:
            self.forget_signatures()
        self._primed = True
        now = self._clock()
        valid_until = self._activity.state_valid_until
        activity_changed = False
        if events_read or (valid_until is not None and now >= valid_until):
            summary = self._tracker.summary(now, self._no_output_after_s, self._start_silence_s)
            activity_changed = summary != self._activity
            self._activity = summary
        card = self._card
        # The same object when nothing was read; a new body tells a change at once.
        card_changed = card is not card_before and (
            card.body != card_before.body or card != card_before
        )
        if not notifications and failure is None:
            return _PLAIN_REFRESHES[card_changed, activity_changed]
        return AgentRefresh(
            card_changed=card_changed,
            activity_changed=activity_changed,
            notifications=notifications,
            failure=failure,
        )

    # -- the card -------------------------------------------------------------------------

    def _refresh_card(self, changed: frozenset[str] | None) -> None:
        paths = self.paths
        previous = self._card_signatures
        body_read = False  # the body was tried with its signature (then `raw` is what it held)
        raw: bytes | None = None
        status: CardStatus | None = None  # read once per refresh (a refused one is not kept)
        if changed is None or previous is None:
            status_sig, body_sig, watch_sig = (
                signature(paths.status),
                signature(paths.body),
                signature(paths.watch),
            )
        else:
            status_sig = signature(paths.status) if STATUS_NAME in changed else previous[0]
            watch_sig = signature(paths.watch) if WATCH_NAME in changed else previous[2]
            if BODY_NAME not in changed:
                body_sig = previous[1]
            elif status_sig is not None and (status := self._status(status_sig)) == "active":
                # An active card's changed body is read anyway, and the descriptor read tells
                # its signature: one look at the file per change, not a `stat` and a read.
                signed = self.files.read_signed(
                    paths.body, limit=MAX_BODY_BYTES, whole=True, judge=body_problem
                )
                body_read = True  # missing or refused: not tried again below
                if signed is None:
                    body_sig = signature(paths.body)
                else:
                    raw, found = signed
                    body_sig = (
                        found.st_ino,
                        found.st_size,
                        found.st_mtime_ns,
                        found.st_ctime_ns,
                    )
            else:
                body_sig = signature(paths.body)
        signatures = (status_sig, body_sig, watch_sig)
        if signatures == previous:
            return
        self._card_signatures = signatures
        card = self._card
        if previous is None or previous[2] != watch_sig:
            card = replace(card, watch_id=self._read_watch_id())
        if status is None:
            status = self._status(status_sig)
        if status == "active":
            if not body_read:
                raw = self.files.read(
                    paths.body, limit=MAX_BODY_BYTES, whole=True, judge=body_problem
                )
            if raw and (raw == self._body_raw or body_problem(raw) is None):
                activated = card.status != "active" or (
                    card.watch_id is not None and card.watch_id != self._card.watch_id
                )
                if raw != self._body_raw:
                    card = card.with_body(body_markdown(raw), _mtime(body_sig))
                    self._body_raw = raw
                if card.status != "active":
                    card = replace(
                        card, status="active", status_changed_at=_mtime(status_sig) or self._clock()
                    )
                if activated and self._primed:
                    # A new watch: the previous one's error episode and budget are history.
                    card = replace(card, error_code=None, error_since=None, exhausted=False)
        elif status == "inactive" and card.status != "inactive":
            card = replace(
                card, status="inactive", status_changed_at=_mtime(status_sig) or self._clock()
            )
        if status is not None:
            # Removed (`remove` deletes the body): the watch whose error episode was open is
            # gone, so the card no longer says its renderer fails (nor that it recovered);
            # an error line read later from the history (a restart) is not applied either.
            self._card_removed = status == "inactive" and body_sig is None
        if self._card_removed and card.error_code is not None:
            card = replace(card, error_code=None, error_since=None)
        self._card = card

    def _status(self, status_sig: FileSignature | None) -> CardStatus:
        """What the status file says: read again unless it is the very file (same inode, size
        and mtime) last read successfully. A missing or refused status is always read again,
        so a fixed file is noticed."""
        kept = self._status_read
        if kept is not None and status_sig is not None and kept[0] == status_sig:
            return kept[1]
        raw = self.files.read(self.paths.status, limit=64, judge=status_problem)
        status = parse_status(raw)
        self._status_read = (status_sig, status) if raw is not None and status_sig else None
        return status

    def _read_watch_id(self) -> str | None:
        raw = self.files.read(self.paths.watch, limit=64 * 1024)
        if raw is None:
            return None
        data = parse_json(raw)
        if data is None:
            return self._card.watch_id  # half-written descriptor: keep what we knew
        watch_id = data.get("watch_id") if isinstance(data, dict) else None
        return watch_id if isinstance(watch_id, str) and watch_id else None

    # -- notifications --------------------------------------------------------------------

    def _refresh_notifications(self) -> tuple[Notification, ...]:
        follower = self._notifications
        if not self._primed:
            self._prime_notifications()
        elif follower.unchanged():
            return ()
        new: list[Notification] = []
        for line in follower.read_new():
            notification = parse_notification(line)
            if notification is None:
                continue
            self._apply_health(notification)
            new.append(notification)
        if follower.position is not None:
            self._pending_offset = (follower.position.inode, follower.position.offset)
        return tuple(new)

    def _prime_notifications(self) -> None:
        """First sight: learn the card's health from a bounded tail, deliver nothing old."""
        follower = self._notifications
        follower.unchanged()  # record the current signature
        stored = self._offsets.get_offset(self.agent_id, NOTIFICATIONS_OFFSET)
        if stored is None:
            history = follower.start_at_end(seen_missing=follower.signature is None)
            # No file yet is recorded as inode 0: whatever appears later is new, also after a
            # restart, so it is read from its start rather than skipped as history.
            position = follower.position or Position(0, 0)
            self._offsets.set_first_offset(
                self.agent_id, NOTIFICATIONS_OFFSET, position.inode, position.offset
            )
        else:
            inode, offset = stored
            follower.position = Position(inode, offset)
            history = self._history_before(inode, offset)
        for line in history:
            notification = parse_notification(line)
            if notification is not None:
                self._apply_health(notification)

    def _history_before(self, inode: int, offset: int) -> list[bytes]:
        """Notifications already delivered before a stored position, for health only."""
        follower = self._notifications
        for path in (follower.path, follower.rotated):
            st = self.files.stat(path)
            if st is None:
                continue
            if st.st_ino == inode:
                lines, _ = LineFollower(path, self.files).tail(end=min(offset, st.st_size))
                return lines
        return []

    def _apply_health(self, notification: Notification) -> None:
        card = self._card
        about = notification.ref_id or _text(notification.extra.get("watch_id"))
        if card.status == "active" and card.watch_id and about and about != card.watch_id:
            return  # about an older watch than the one now showing
        state = notification.extra.get("state")
        at = notification.at or self._clock()
        if notification.source == SOURCE_ERROR and state == "error":
            if self._card_removed:
                return  # the removed card's watch (above): its episode is over
            code = notification.extra.get("code")
            self._card = replace(
                card,
                error_code=code if isinstance(code, str) and code else "unknown",
                error_since=card.error_since if card.error_code else at,
            )
        elif notification.source == SOURCE_ERROR and state == "recovered":
            self._card = replace(card, error_code=None, error_since=None)
        elif notification.source == SOURCE_LIMIT or state == "limit":
            self._card = replace(card, exhausted=True, error_code=None, error_since=None)

    # -- activity -------------------------------------------------------------------------

    def _refresh_events(self) -> bool:
        """Feed new activity lines to the tracker; whether there were any to read."""
        follower = self._events
        if not self._primed:
            follower.unchanged()
            lines = follower.start_at_end(seen_missing=follower.signature is None)
        elif follower.unchanged():
            return False
        else:
            lines = follower.read_new()
            if follower.take_skipped():
                # More than the follower reads at once appended between two reads (a line
                # that long, 30 MB, is no event): passed over, counted among the unreadable
                # lines as a deep or malformed one is (it was passed over without a word).
                self._tracker.skipped_lines += 1
        for line in lines:
            self._tracker.feed(line)
        return True
