"""Per-agent reading of the contract files: the card, its health, new notifications, activity.

An `AgentMonitor` is refreshed whenever the watcher says an agent's files may have changed
(and on every rescan), for up to thousands of agents, so a refresh with nothing new costs a
handful of `stat` calls and no reads. Every file may be missing, half-written, replaced,
truncated or rotated at any moment; none of that raises, and none of it loses the last good
state: a card is only replaced by a better reading of the files, never by a worse one.

Rules (DESIGN.md, "File contracts" and "The service"):

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
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from bridge.compose.redact import redact
from bridge.follow.safe_read import WorkdirFiles
from bridge.track.status import StateFacts, agent_state
from channels.base import AgentState
from producers.task_card.contract import (
    EARLIEST_TIME,
    LATEST_TIME,
    SOURCE_ERROR,
    SOURCE_LIMIT,
    ActivityEvent,
    CardPaths,
    Notification,
    count_field,
    duration_field,
    int_field,
    parse_event,
    parse_json,
    parse_notification,
    parse_status,
)

logger = logging.getLogger(__name__)

NOTIFICATIONS_OFFSET: Final = "notifications"
TAIL_BYTES: Final = 256 * 1024
MAX_READ_BYTES: Final = 8 * 1024 * 1024
MAX_BODY_BYTES: Final = 512 * 1024
MAX_RECENT: Final = 10
ROW_CHARS: Final = 100
_MAX_OPEN_CALLS: Final = 256

FileSignature = tuple[int, int, int]


class OffsetStore(Protocol):
    """Durable (inode, byte offset) positions in followed files, per agent and file name."""

    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None: ...

    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None: ...


class MemoryOffsetStore:
    """An `OffsetStore` in memory: for tests and for runs that need no restart continuity."""

    def __init__(self) -> None:
        self._offsets: dict[tuple[str, str], tuple[int, int]] = {}

    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None:
        return self._offsets.get((agent_id, name))

    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        self._offsets[(agent_id, name)] = (inode, offset)


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


@dataclass(frozen=True)
class ActivitySummary:
    """The automatic slot's facts, decided only from the activity log and its timestamps."""

    state: AgentState = "unknown"
    last_movement: str | None = None
    last_movement_at: datetime | None = None
    turn_started_at: datetime | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    recent: tuple[tuple[str, datetime], ...] = ()  # (row, when), newest first
    skipped_lines: int = 0
    state_valid_until: datetime | None = None
    last_event_at: datetime | None = None
    state_since: datetime | None = None
    # Facts the signals are decided from (bridge.notices.signals).
    agent_started_at: datetime | None = None
    exited_at: datetime | None = None
    turn_ended_at: datetime | None = None


@dataclass(frozen=True)
class AgentRefresh:
    """What one `refresh` found: whether the card or the activity changed, new notifications."""

    card_changed: bool
    activity_changed: bool
    notifications: tuple[Notification, ...] = ()
    # An unexpected error in one part of the reading (the others still ran); the caller's
    # fault barrier reports it. Retried on the next refresh.
    failure: Exception | None = None


def _signature(path: Path) -> FileSignature | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _mtime(signature: FileSignature | None) -> datetime | None:
    """A file's modification time, or None when it is absurd (an agent may set any mtime)."""
    if signature is None:
        return None
    try:
        moment = datetime.fromtimestamp(signature[2] / 1e9, UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return moment if EARLIEST_TIME <= moment < LATEST_TIME else None


def _escape_markdown(text: str) -> str:
    """Show legacy plain-text fields literally inside Markdown."""
    for char in ("\\", "`", "*", "_", "[", "]"):
        text = text.replace(char, "\\" + char)
    return text


def legacy_json_to_markdown(text: str) -> str | None:
    """A `{title, lines, footer}` renderer frame as Markdown, or None when `text` is not one.

    The older Telegram renderer contract printed this JSON object; it is shown as a card:
    the title in bold, the lines as they are, the footer in italics.
    """
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    data: Any = parse_json(stripped)
    if not isinstance(data, dict) or not data or not set(data) <= {"title", "lines", "footer"}:
        return None
    title, lines, footer = data.get("title"), data.get("lines"), data.get("footer")
    if title is not None and not isinstance(title, str):
        return None
    if footer is not None and not isinstance(footer, str):
        return None
    if lines is not None and not (
        isinstance(lines, list) and all(isinstance(line, str) for line in lines)
    ):
        return None
    parts: list[str] = []
    if title and title.strip():
        parts.append(f"**{_escape_markdown(title.strip())}**")
    parts.extend(_escape_markdown(line) for line in lines or [])
    if footer and footer.strip():
        parts.append(f"_{_escape_markdown(footer.strip())}_")
    if not any(part.strip() for part in parts):
        return None
    return "\n".join(parts)


def body_markdown(raw: bytes) -> str:
    """The body bytes as Markdown: the legacy JSON frame converted, anything else verbatim."""
    text = raw.decode("utf-8", errors="replace")
    return legacy_json_to_markdown(text) or text


@dataclass
class _Position:
    inode: int
    offset: int


class _LineFollower:
    """Follows one append-only JSONL file (and its `.1` rotation) by inode and byte offset.

    Only complete lines are returned: a line without its newline is still being written and
    is picked up by a later read. A new inode means the file was replaced or rotated: the rest
    of the old file is read from `<name>.1` when it is there, then the new file from its start.
    A file shorter than the offset was truncated and is read from its start.
    """

    def __init__(self, path: Path, files: WorkdirFiles) -> None:
        self.path = path
        self.files = files
        self.rotated = path.with_name(path.name + ".1")
        self.position: _Position | None = None
        self.signature: FileSignature | None = None
        self._signed = False

    def forget(self) -> None:
        """The next `unchanged` is False: the file is looked at again."""
        self.signature, self._signed = None, False

    def unchanged(self) -> bool:
        """Whether the file looks as at the last call (one `stat`); records the new look."""
        signature = _signature(self.path)
        if self._signed and signature == self.signature:
            return True
        self.signature, self._signed = signature, True
        return False

    def tail(self, *, end: int | None = None, limit: int = TAIL_BYTES) -> tuple[list[bytes], int]:
        """Complete lines in the last `limit` bytes before `end`, and the offset after them."""
        handle = self.files.open(self.path)
        if handle is None:
            return [], 0
        try:
            with handle:
                size = os.fstat(handle.fileno()).st_size if end is None else end
                start = max(0, size - limit)
                handle.seek(start)
                chunk = handle.read(size - start)
        except OSError:
            return [], 0
        last_newline = chunk.rfind(b"\n")
        if last_newline < 0:
            return [], start
        complete = chunk[: last_newline + 1]
        if start > 0:
            # The first line may be cut by the window; it is not trustworthy.
            first_newline = complete.find(b"\n")
            complete = complete[first_newline + 1 :]
        return complete.splitlines(), start + last_newline + 1

    def start_at_end(self) -> list[bytes]:
        """Position at the end of the last complete line; return the tail before it."""
        st = self.files.stat(self.path)
        if st is None:
            self.position = None
            return []
        inode = st.st_ino
        lines, end = self.tail()
        self.position = _Position(inode, end)
        return lines

    def read_new(self) -> list[bytes]:
        """Complete lines appended since the last read (all of a file seen for the first time)."""
        st = self.files.stat(self.path)
        lines: list[bytes] = []
        position = self.position
        if position is not None and (st is None or st.st_ino != position.inode):
            rotated_size = self._rotated_size(position.inode)
            if rotated_size is not None:
                lines += self._read_range(self.rotated, position, rotated_size)
                if st is None:
                    return lines
            elif st is None:
                return lines
            position = None
        if st is None:
            return lines
        if position is None or st.st_size < position.offset:
            position = _Position(st.st_ino, 0)
        lines += self._read_range(self.path, position, st.st_size)
        self.position = position
        return lines

    def _rotated_size(self, inode: int) -> int | None:
        st = self.files.stat(self.rotated)
        if st is None:
            return None
        return st.st_size if st.st_ino == inode else None

    def _read_range(self, path: Path, position: _Position, size: int) -> list[bytes]:
        """Lines between `position.offset` and `size`; advances `position` in place."""
        if size <= position.offset:
            return []
        start = position.offset
        if size - start > MAX_READ_BYTES:
            start = size - MAX_READ_BYTES
        handle = self.files.open(path)
        if handle is None:
            return []
        try:
            with handle:
                handle.seek(start)
                chunk = handle.read(size - start)
        except OSError:
            return []
        last_newline = chunk.rfind(b"\n")
        if last_newline < 0:
            return []
        complete = chunk[: last_newline + 1]
        if start > position.offset:
            complete = complete[complete.find(b"\n") + 1 :]
        position.offset = start + last_newline + 1
        self.position = position
        return complete.splitlines()


def _text(value: object) -> str:
    """A text field of an agent record; anything that is not text is unset."""
    return value if isinstance(value, str) else ""


def _short(text: str) -> str:
    """One redacted line of at most `ROW_CHARS` characters."""
    flat = " ".join(redact(text).split())
    return flat if len(flat) <= ROW_CHARS else flat[: ROW_CHARS - 1].rstrip() + "…"


class ActivityTracker:
    """Folds activity events into the facts of the automatic slot.

    Transitions follow line order; silence is measured from the newest timestamp seen.
    """

    def __init__(self) -> None:
        self.skipped_lines = 0
        self._exited_at: datetime | None = None
        self._turn_started_at: datetime | None = None
        self._turn_ended_at: datetime | None = None
        self._waiting_since: datetime | None = None
        self._waiting_reason: str | None = None
        self._started_at: datetime | None = None
        self._after_start = False  # any event since the latest `agent.start`
        self._turns_after_start = False  # any turn fact since it (a shell has none)
        self._last_event_at: datetime | None = None
        self._movement: tuple[str, datetime] | None = None
        self._recent: deque[tuple[str, datetime]] = deque(maxlen=MAX_RECENT)
        self._tokens: tuple[int, int] | None = None
        self._calls: dict[str, str] = {}

    def feed(self, line: bytes) -> None:
        if not line.strip():
            return
        event = parse_event(line)
        if event is None:
            self.skipped_lines += 1
            return
        self.apply(event)

    def apply(self, event: ActivityEvent) -> None:
        if self._last_event_at is None or event.ts > self._last_event_at:
            self._last_event_at = event.ts
        if event.kind != "agent.start":
            self._after_start = True
        if event.kind in ("turn.start", "turn.end"):
            self._turns_after_start = True
        movement = self._transition(event)
        if movement is not None:
            row = _short(movement)
            self._movement = (row, event.ts)
            self._recent.appendleft((row, event.ts))

    def _transition(self, event: ActivityEvent) -> str | None:
        fields = event.fields
        kind = event.kind
        if kind == "agent.start":
            self._exited_at = None
            self._started_at = event.ts
            self._after_start = self._turns_after_start = False
            self._turn_started_at = self._turn_ended_at = self._waiting_since = None
            self._tokens = None
            return "agent started"
        if kind == "agent.exit":
            self._exited_at = event.ts
            self._waiting_since = None
            code = int_field(fields.get("code"))
            return "agent exited" if code is None else f"agent exited (code {code})"
        if kind == "turn.start":
            self._turn_started_at, self._turn_ended_at = event.ts, None
            self._waiting_since = None
            self._tokens = None
            return "turn started"
        if kind == "turn.end":
            self._turn_ended_at = event.ts
            self._waiting_since = None
            return "turn ended"
        if kind == "wait.start":
            self._waiting_since = event.ts
            reason = fields.get("reason")
            self._waiting_reason = reason if isinstance(reason, str) else None
            return f"waiting: {reason}" if isinstance(reason, str) and reason else "waiting"
        if kind == "wait.end":
            self._waiting_since = None
            return "resumed"
        if kind == "tool.start":
            name = _text(fields.get("name")) or "tool"
            call_id = fields.get("call_id")
            if isinstance(call_id, str):
                if len(self._calls) >= _MAX_OPEN_CALLS:
                    self._calls.pop(next(iter(self._calls)))
                self._calls[call_id] = name
            summary = fields.get("summary")
            return f"{name}: {summary}" if isinstance(summary, str) and summary else name
        if kind == "tool.end":
            call_id = fields.get("call_id")
            name = self._calls.pop(call_id, "tool") if isinstance(call_id, str) else "tool"
            outcome = "done" if fields.get("ok") is not False else "failed"
            duration = duration_field(fields.get("duration_s"))
            if duration is not None:
                return f"{name} {outcome} in {duration:.1f} s"
            return f"{name} {outcome}"
        if kind == "text":
            text = fields.get("text")
            return text if isinstance(text, str) and text.strip() else None
        if kind == "usage":
            tokens_in = count_field(fields.get("input_tokens")) or 0
            tokens_out = count_field(fields.get("output_tokens")) or 0
            before = self._tokens or (0, 0)
            self._tokens = (before[0] + tokens_in, before[1] + tokens_out)
            return None
        return None

    def summary(
        self, now: datetime, no_output_after_s: float, start_silence_s: float = 30.0
    ) -> ActivitySummary:
        state, since, valid_until = agent_state(
            self.facts(), now, no_output_after_s, start_silence_s
        )
        movement, moved_at = self._movement if self._movement else (None, None)
        return ActivitySummary(
            state=state,
            last_movement=movement,
            last_movement_at=moved_at,
            turn_started_at=self._turn_started_at,
            tokens_in=self._tokens[0] if self._tokens else None,
            tokens_out=self._tokens[1] if self._tokens else None,
            recent=tuple(self._recent),
            skipped_lines=self.skipped_lines,
            state_valid_until=valid_until,
            last_event_at=self._last_event_at,
            state_since=since,
            agent_started_at=self._started_at,
            exited_at=self._exited_at,
            turn_ended_at=self._turn_ended_at,
        )

    def facts(self) -> StateFacts:
        return StateFacts(
            exited_at=self._exited_at,
            waiting_since=self._waiting_since,
            waiting_reason=self._waiting_reason,
            started_at=self._started_at,
            after_start=self._after_start,
            turns_after_start=self._turns_after_start,
            turn_started_at=self._turn_started_at,
            turn_ended_at=self._turn_ended_at,
            last_event_at=self._last_event_at,
        )


class AgentMonitor:
    """Reads one agent's contract files incrementally; never raises on bad or missing files."""

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
        self.paths = CardPaths(workdir)
        self._offsets = offsets
        self._clock = clock
        self._no_output_after_s = no_output_after_s
        self._start_silence_s = start_silence_s
        self._card = CardState()
        self._card_signatures: tuple[FileSignature | None, ...] | None = None
        self._body_raw: bytes | None = None
        self.files = WorkdirFiles(agent_id, workdir)
        self._notifications = _LineFollower(self.paths.notifications, self.files)
        self._events = _LineFollower(self.paths.events, self.files)
        self._tracker = ActivityTracker()
        self._activity = ActivitySummary()
        self._primed = False
        self._pending_offset: tuple[int, int] | None = None

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

    def forget_signatures(self) -> None:
        """Read the card files again at the next refresh, even when they look unchanged.

        Used after a refresh failed half-way, so that a retry is never skipped as "nothing new".
        """
        self._card_signatures = None
        self._notifications.forget()
        self._events.forget()

    def refresh(self) -> AgentRefresh:
        """Read what changed since the last refresh."""
        self.commit()
        card_before = self._card
        notifications: tuple[Notification, ...] = ()
        failure: Exception | None = None
        # The three parts are independent: a failure in one must not hide the others' news.
        try:
            self._refresh_card()
        except Exception as error:
            failure = error
        try:
            notifications = self._refresh_notifications()
        except Exception as error:
            failure = failure or error
        events_read = True
        try:
            events_read = self._refresh_events()
        except Exception as error:
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
        return AgentRefresh(
            card_changed=self._card != card_before,
            activity_changed=activity_changed,
            notifications=notifications,
            failure=failure,
        )

    # -- the card -------------------------------------------------------------------------

    def _refresh_card(self) -> None:
        paths = self.paths
        status_sig, body_sig, watch_sig = (
            _signature(paths.status),
            _signature(paths.body),
            _signature(paths.watch),
        )
        signatures = (status_sig, body_sig, watch_sig)
        if signatures == self._card_signatures:
            return
        previous = self._card_signatures
        self._card_signatures = signatures
        card = self._card
        if previous is None or previous[2] != watch_sig:
            card = replace(card, watch_id=self._read_watch_id())
        status = parse_status(self.files.read(paths.status, limit=64))
        if status == "active":
            raw = self.files.read(paths.body, limit=MAX_BODY_BYTES)
            if raw is not None and raw.strip():
                activated = card.status != "active" or (
                    card.watch_id is not None and card.watch_id != self._card.watch_id
                )
                if raw != self._body_raw:
                    card = replace(card, body=body_markdown(raw), body_changed_at=_mtime(body_sig))
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
        self._card = card

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
            history = follower.start_at_end()
            # No file yet is recorded as inode 0: whatever appears later is new, also after a
            # restart, so it is read from its start rather than skipped as history.
            position = follower.position or _Position(0, 0)
            self._offsets.set_offset(
                self.agent_id, NOTIFICATIONS_OFFSET, position.inode, position.offset
            )
        else:
            inode, offset = stored
            follower.position = _Position(inode, offset)
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
                lines, _ = _LineFollower(path, self.files).tail(end=min(offset, st.st_size))
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
            lines = follower.start_at_end()
        elif follower.unchanged():
            return False
        else:
            lines = follower.read_new()
        for line in lines:
            self._tracker.feed(line)
        return True
