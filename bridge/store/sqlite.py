"""The service's durable state: resident message ids, preferences, notices, offsets, cursors.

`StateStore` is the seam (a shared database can replace SQLite when one machine is not enough);
`SqliteStore` is the default: one file in the state directory, WAL mode, every write committed
at once so that a SIGKILL loses nothing that was acknowledged, with one exception: the
fingerprint of the card a resident shows (`set_committed`, one per edit, the most frequent
write by far) is kept in memory and committed with the next other write or the service's next
timer tick (`retry_pending`, once a second), many in one transaction. What a SIGKILL can lose
is therefore at most the last second's fingerprints: those routes are edited once more after
the restart with the bytes they already show (the platform answers "not modified"), and the
rate limiter's restart seed is up to a second older. Message ids, send keys and unsure-send
counts, which guard against a second copy of a resident, are still committed at once.
The first-sight offsets of followed files (`set_first_offset`, three per agent the first time
the service sees it, so 30,000 on a cold start at 10,000 agents) are kept and committed the
same way: an offset lost to a SIGKILL only means that the next start takes that first sight
again (the file's end, history unsent); nothing was delivered from that file since, or the
offset written after the delivery would have committed the kept one before it.
Calls are short and synchronous:
each is a single indexed statement on a local file (well under a millisecond), cheaper than a
thread hop, so the event loop calls them directly.

Disks fail. A write that fails at run time (disk full, I/O error, a read-only remount) never
raises into the service: it joins an ordered backlog (a later write of the same row replaces
an earlier one), the store retries the backlog in one transaction with capped backoff
(`retry_pending`, driven by the service's timer), and the fault is logged once per episode
and recorded in a small pre-allocated health file that `taskcard status` reads, because a full
disk still lets a file be rewritten in place. The exception is a write made in `at_once` (the
mark a Telegram send needs before it may go out): it is committed now or raises, never kept.
What was committed before stays committed: a failed transaction is rolled back, never
half-applied. At start it is the other way round: a
state file that is not a healthy taskcard database, or cannot be written, stops the service
with `StateFileError` (one line: the file and the fix) instead of a fresh start that would
post every resident message a second time.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from taskcard.bridge.store.base import (
    SENT_KEEP_S,
    UNSURE_KEEP_PER_ROUTE,
    UNSURE_KEEP_S,
    ChatPrefs,
    InboxOutcome,
    InboxRecord,
    NoticeState,
    OffsetsAhead,
    PendingNotice,
    ReadAhead,
    ResidentRecord,
    SeenChat,
    StateFileError,
    StateFileLocked,
    StateHealth,
    StateNotSaved,
    StateStore,
    UnsureNotice,
    in_batches,
    shown_key,
    stored_int,
    stored_text,
    stored_time,
)
from taskcard.channels.aio import Backoff
from taskcard.channels.base import counted

log = logging.getLogger(__name__)

__all__ = [
    "ChatPrefs",
    "InboxOutcome",
    "InboxRecord",
    "NoticeState",
    "OffsetsAhead",
    "PendingNotice",
    "ReadAhead",
    "ResidentRecord",
    "SeenChat",
    "SqliteStore",
    "StateFileError",
    "StateFileLocked",
    "StateHealth",
    "StateNotSaved",
    "StateStore",
    "UnsureNotice",
    "check_state_file",
    "in_batches",
    "read_health",
    "stored_time",
    "unfit_state",
]


def _last_part(column: str) -> str:
    """SQL for what follows the last ":" in `column` (all of it when it has none): the agent
    of a route key (`RouteKey.store_key` ends with `:<agent>`, and agent ids hold no ":").
    `rtrim` strips from the right every character but ":", so it stops at the last one.
    Built-in, deterministic functions only, so SQLite can index the expression, and a query
    that repeats it exactly finds one agent's rows without reading the others'."""
    return f"substr({column}, length(rtrim({column}, replace({column}, ':', ''))) + 1)"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS residents (
    route TEXT PRIMARY KEY,
    message_id TEXT,
    fingerprint TEXT,
    committed_at REAL,
    disabled_reason TEXT,
    send_key TEXT,
    stale_message_id TEXT,
    unsure_sends INTEGER NOT NULL DEFAULT 0,
    unsure_at REAL,
    pin_owed_id TEXT
);
CREATE INDEX IF NOT EXISTS residents_agent ON residents ({agent_of_route});
CREATE TABLE IF NOT EXISTS prefs (
    scope TEXT PRIMARY KEY,
    hidden INTEGER NOT NULL DEFAULT 0,
    activity_rows INTEGER
);
CREATE TABLE IF NOT EXISTS notices (
    route TEXT NOT NULL,
    notice_id TEXT NOT NULL,
    text TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (route, notice_id)
);
CREATE INDEX IF NOT EXISTS notices_pending ON notices (state, created_at);
CREATE INDEX IF NOT EXISTS notices_agent ON notices ({agent_of_route});
CREATE TABLE IF NOT EXISTS offsets (
    agent_id TEXT NOT NULL,
    name TEXT NOT NULL,
    inode INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    PRIMARY KEY (agent_id, name)
);
CREATE TABLE IF NOT EXISTS cursors (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS cursors_agent ON cursors ({agent_of_key});
CREATE TABLE IF NOT EXISTS pauses (scope TEXT PRIMARY KEY, until_epoch REAL NOT NULL);
CREATE TABLE IF NOT EXISTS inbox (
    message_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    thread_id TEXT,
    author TEXT,
    queued_at REAL NOT NULL,
    outcome TEXT NOT NULL,
    reason TEXT,
    closed_at REAL,
    reply_to_id TEXT,
    reply_thread_id TEXT
);
CREATE INDEX IF NOT EXISTS inbox_open ON inbox (outcome, queued_at);
CREATE INDEX IF NOT EXISTS inbox_agent ON inbox (agent_id);
CREATE TABLE IF NOT EXISTS sent (
    channel TEXT NOT NULL,
    message_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (channel, message_id)
);
CREATE INDEX IF NOT EXISTS sent_at ON sent (at);
CREATE TABLE IF NOT EXISTS notice_messages (
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (channel, chat_id, message_id)
);
CREATE INDEX IF NOT EXISTS notice_messages_at ON notice_messages (at);
CREATE TABLE IF NOT EXISTS seen_chats (
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    thread_id TEXT NOT NULL DEFAULT '',
    title TEXT,
    last_seen REAL NOT NULL,
    PRIMARY KEY (channel, chat_id, thread_id)
);
""".format(
    agent_of_route=_last_part("route"),
    agent_of_key=_last_part("key"),
)

STATE_FILE = "state.sqlite3"
HEALTH_FILE = "state.health"
_SQLITE_HEADER = b"SQLite format 3\x00"
_HEALTH_SIZE = 1024
_FRESH_START = "or move it away to start afresh (every chat then gets a second resident message)"

# How long a write waits for a lock another process holds on the state file (SQLite's busy
# timeout; the connections' default), and a retry of waiting writes, which runs on the loop.
_BUSY_MS: Final = 5000
_RETRY_BUSY_MS: Final = 100

# Fingerprints kept in memory before they are committed at once, whatever the timer says.
MAX_UNSAVED_COMMITS = 1000
# Errors that mean "our SQL is wrong", not "the disk is": they still raise.
_BUG_ERRORS = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)

WriteOp = Callable[[sqlite3.Connection], Any]

# Columns added after the first version: a read-only open (`taskcard status`) of an older
# file that lacks one reads None; any other column missing is a newer version's file.
_ADDED_COLUMNS: Final = frozenset(
    {"unsure_sends", "unsure_at", "pin_owed_id", "reply_to_id", "reply_thread_id"}
)
_A_TIME = "a time"
_AN_ID = "a message id"
_TEXT = "text"
_A_NUMBER = "a whole number"
# What a file whose offset is lost is read from: as at the agent's first sight.
_FIRST_SIGHT = "the file is read on from its end, as at the agent's first sight"
_UNLISTED = "it is left out of `taskcard chats` (a command from it lists it again)"
_NO_STATUS = (
    "it is left out: its status message is no longer updated (the message itself, in the"
    " agent's inbox folder, is untouched)"
)
# How `SqliteStore._stored` reads a column of a table, and what a value that is not of its
# kind (a file edited by hand, or a row a bug wrote) means: (the reader, what the value is,
# what it should be, what the service does instead). Every such value is skipped, with the
# least harm: the service keeps serving every other row.
_COLUMNS: Final[dict[tuple[str, str], tuple[Callable[[object], Any], str, str, str]]] = {
    ("pauses", "scope"): (stored_text, "the scope of a rate-limit pause", _TEXT, "it is ignored"),
    ("pauses", "until_epoch"): (
        stored_time,
        "the rate-limit pause of",
        _A_TIME,
        "it is ignored (the platform's next 429 sets a new one)",
    ),
    ("residents", "route"): (stored_text, "the route of a card", _TEXT, "the row is ignored"),
    ("residents", "message_id"): (
        stored_text,
        "the message id of card",
        _AN_ID,
        "it is forgotten: the card is posted as a new message, the old one stays in the chat",
    ),
    ("residents", "fingerprint"): (
        stored_text,
        "the fingerprint of card",
        _TEXT,
        "the card is edited once more",
    ),
    ("residents", "committed_at"): (
        stored_time,
        "the last edit time of card",
        _A_TIME,
        "it is taken as unknown",
    ),
    ("residents", "disabled_reason"): (
        stored_text,
        "the reason it is off, of card",
        _TEXT,
        "the card is tried again",
    ),
    ("residents", "send_key"): (
        stored_text,
        "the key of the send in flight of card",
        "a key",
        "it is taken as none (a send cut short then may show as a second message)",
    ),
    ("residents", "stale_message_id"): (
        stored_text,
        "the replaced message id of card",
        _AN_ID,
        "it is not deleted (delete it by hand)",
    ),
    ("residents", "unsure_sends"): (
        stored_int,
        "the count of unanswered sends of card",
        _A_NUMBER,
        "it is taken as none",
    ),
    ("residents", "unsure_at"): (
        stored_time,
        "the last unanswered send time of card",
        _A_TIME,
        "it is taken as unknown",
    ),
    ("residents", "pin_owed_id"): (
        stored_text,
        "the id of the message whose pin is owed by card",
        _AN_ID,
        "no pin is owed (pin it by hand)",
    ),
    ("prefs", "hidden"): (
        stored_int,
        "the /taskcard on/off setting of",
        "0 or 1",
        "they are shown (/taskcard off hides them again)",
    ),
    ("prefs", "activity_rows"): (
        stored_int,
        "the /taskcard <rows> setting of",
        _A_NUMBER,
        "cards show the default (/taskcard <rows> sets it again)",
    ),
    ("offsets", "inode"): (stored_int, "the inode of", _A_NUMBER, _FIRST_SIGHT),
    ("offsets", "offset"): (stored_int, "the read offset of", _A_NUMBER, _FIRST_SIGHT),
    ("notices", "route"): (stored_text, "the route of notice", _TEXT, "it is not sent"),
    ("notices", "notice_id"): (stored_text, "the id of notice", _TEXT, "it is not sent"),
    ("notices", "text"): (stored_text, "the text of notice", _TEXT, "it is not sent"),
    ("notices", "created_at"): (
        stored_time,
        "the time of notice",
        _A_TIME,
        "it is taken as the oldest",
    ),
    ("seen_chats", "channel"): (stored_text, "the channel of seen chat", _TEXT, _UNLISTED),
    ("seen_chats", "chat_id"): (stored_text, "the id of seen chat", _TEXT, _UNLISTED),
    ("seen_chats", "thread_id"): (stored_text, "the topic of seen chat", _TEXT, _UNLISTED),
    ("seen_chats", "title"): (stored_text, "the title of seen chat", _TEXT, "it is unknown"),
    ("seen_chats", "last_seen"): (
        stored_time,
        "the last command time of seen chat",
        _A_TIME,
        "it is taken as long ago",
    ),
    **{
        ("inbox", column): (reader, f"the {what} of inbox message", kind, _NO_STATUS)
        for column, reader, what, kind in (
            ("message_id", stored_text, "id", _TEXT),
            ("agent_id", stored_text, "agent", _TEXT),
            ("channel", stored_text, "channel", _TEXT),
            ("chat_id", stored_text, "chat", _TEXT),
            ("queued_at", stored_time, "queue time", _A_TIME),
        )
    },
    **{
        ("inbox", column): (reader, f"the {what} of inbox message", kind, "it is unknown")
        for column, reader, what, kind in (
            ("outcome", stored_text, "outcome", _TEXT),
            ("thread_id", stored_text, "topic", _TEXT),
            ("author", stored_text, "author", _TEXT),
            ("reason", stored_text, "outcome's reason", _TEXT),
            ("closed_at", stored_time, "closing time", _A_TIME),
            ("reply_to_id", stored_text, "command", _AN_ID),
            ("reply_thread_id", stored_text, "command's thread", _TEXT),
        )
    },
}


def _readonly_uri(path: Path) -> str:
    """A read-only SQLite URI for `path`, percent-encoded.

    Why: a raw `file:{path}` URI reads `#`, `?` and `%41` in a directory name as URI syntax,
    so the check and `taskcard status` would open (and create) a different file.
    """
    return f"{path.absolute().as_uri()}?mode=ro"


def check_state_file(path: Path) -> None:
    """Raise `StateFileError` unless `path` is absent or a readable taskcard state database.

    Read-only, so `taskcard status` and `serve --check` use it too. Absent is fine (a first
    start); anything else must be a regular, non-empty SQLite file with our tables that
    passes SQLite's quick check.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateFileError(
            f"{path}: cannot be examined ({exc.strerror}); fix the permissions of its folder"
        ) from None
    if stat.S_ISDIR(info.st_mode):
        raise StateFileError(
            f"{path} is a directory, not the state database; remove or rename it"
            " (the service creates the file itself)"
        )
    if not stat.S_ISREG(info.st_mode):
        raise StateFileError(
            f"{path} is not a regular file; remove it (the service creates the file itself)"
        )
    if info.st_size == 0:
        raise StateFileError(
            f"{path} is empty, not a taskcard state database; restore it from a backup,"
            f" {_FRESH_START}"
        )
    try:
        with path.open("rb") as handle:
            header = handle.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise StateFileError(
            f"{path}: cannot be read ({exc.strerror}); fix its permissions"
        ) from None
    if header != _SQLITE_HEADER:
        raise StateFileError(
            f"{path} is not a SQLite database (damaged or foreign); restore it from a backup,"
            f" {_FRESH_START}"
        )
    for suffix in ("-wal", "-shm"):
        # SQLite's companions of the file: something else in their place makes the database
        # fail to open, which must not read as a damaged database to be moved away.
        companion = path.with_name(path.name + suffix)
        if os.path.lexists(companion) and not companion.is_file():
            raise StateFileError(
                f"{companion} is not a regular file (the state database itself may be fine);"
                " remove it, SQLite creates it itself"
            )
    try:
        db = sqlite3.connect(_readonly_uri(path), uri=True, timeout=5.0)
        try:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
            verdict = [str(row[0]) for row in db.execute("PRAGMA quick_check(1)")]
        finally:
            db.close()
    except sqlite3.Error as exc:
        if _locked(exc):  # a healthy file another process holds: never "move it away"
            raise StateFileLocked(
                f"{path}: cannot be read ({_fault_reason(exc)}); {_fault_advice(exc)}"
            ) from None
        raise StateFileError(
            f"{path} is damaged ({exc}); restore it from a backup, {_FRESH_START}"
        ) from None
    if verdict != ["ok"]:
        raise StateFileError(
            f"{path} is damaged ({'; '.join(verdict)[:120]}); restore it from a backup,"
            f" {_FRESH_START}"
        )
    if "residents" not in tables:
        raise StateFileError(
            f"{path} is a SQLite database without taskcard's tables (another program's file?);"
            f" choose another state_dir, {_FRESH_START}"
        )


# What reading a state file that passed `check_state_file` raises when its tables or values
# are not the ones this version writes (a newer version's file, or rows edited by hand).
UNFIT_STATE_ERRORS: Final = (
    sqlite3.Error,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    OverflowError,  # a time no date can show
)


def unfit_state(path: Path, error: BaseException) -> StateFileError:
    """The one line `taskcard status` and `taskcard chats` print for a state file they could
    open but not read: `error` (one of `UNFIT_STATE_ERRORS`) and the way out."""
    reason = " ".join(str(error).split())[:120] or type(error).__name__
    if isinstance(error, sqlite3.Error) and _locked(error):
        return StateFileLocked(f"{path}: cannot be read ({reason}); {_fault_advice(error)}")
    return StateFileError(
        f"{path} could not be read ({reason}): its tables or values are not the ones this"
        " version of taskcard writes (a newer version's state, or one edited by hand); read it"
        f" with the version that wrote it, restore it from a backup, {_FRESH_START}"
    )


def read_health(state_dir: Path) -> StateHealth | None:
    """The write fault last recorded by `taskcard serve` in `state_dir`, if any."""
    try:
        raw = (state_dir / HEALTH_FILE).read_bytes()[:_HEALTH_SIZE]
        data = json.loads(raw.decode("utf-8").strip() or "{}")
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("failing_since") is None:
        return None
    try:
        health = StateHealth(
            float(data["failing_since"]), str(data["reason"]), int(data["waiting_writes"])
        )
        datetime.fromtimestamp(health.failing_since, UTC)  # a time a date can show
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        return None
    return health


class _HealthFile:
    """A fixed-size file rewritten in place: it stays writable when the disk is full."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        self.write(None)

    def write(self, health: StateHealth | None) -> None:
        data: dict[str, Any] = {"failing_since": None}
        if health is not None:
            data = {
                "failing_since": health.failing_since,
                "reason": health.reason[:300],
                "waiting_writes": health.waiting_writes,
            }
        text = json.dumps(data).encode()[: _HEALTH_SIZE - 1]
        try:
            os.pwrite(self._fd, text.ljust(_HEALTH_SIZE), 0)
        except OSError as exc:
            log.debug("cannot record state health: %s", exc)

    def close(self) -> None:
        os.close(self._fd)


# An unsure notice past its keep (`prune_unsure_notices`): failed, its text gone, its id kept
# so that the same notice read again is not taken as new and sent a second time.
_FORGOTTEN = "state = 'failed', text = ''"


class SqliteStore(StateStore):
    """SQLite in WAL mode; `readonly=True` opens an existing file for `taskcard status`."""

    def __init__(
        self,
        path: Path,
        *,
        readonly: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_retry_s: float = 30.0,
    ) -> None:
        """Open (or create) the state file; `StateFileError` when it is unusable."""
        self.path = path
        self._clock = clock
        self._wall = wall_clock
        self._backoff = Backoff(initial_s=min(0.5, max_retry_s), max_s=max_retry_s)
        self._backlog: dict[tuple[str, ...], WriteOp] = {}
        self._changes = 0  # `change_cursor` writes, each a backlog key of its own
        # cursor -> the backlog key of its `change_cursor` write waiting, and its changes
        self._waiting_changes: dict[
            str, tuple[tuple[str, ...], list[Callable[[str | None], str]]]
        ] = {}
        # Notice states written to the backlog, so reads do not re-send a delivered one.
        self._notice_overlay: dict[tuple[str, str], tuple[str, NoticeState, float]] = {}
        # Fingerprints of shown cards not committed yet, per route, in the order written
        # (see the module docstring); reads see them.
        self._unsaved_commits: dict[str, tuple[str, float]] = {}
        # First-sight offsets not committed yet, (agent id, file name) -> (inode, offset).
        self._unsaved_offsets: dict[tuple[str, str], tuple[int, int]] = {}
        self._health: StateHealth | None = None
        self._retry_at = 0.0
        self._at_once = False  # in `at_once`: a write is committed now or raises
        self._health_file: _HealthFile | None = None
        # The file this store writes, as (device, inode): None for a read-only open.
        self._identity: tuple[int, int] | None = None
        self._replaced_logged = False
        self._mark: _RunMark | None = None  # this run's mark in the file (None: read-only)
        self._overwritten_logged = False
        self._restore_failed = False
        self._unreadable: set[tuple[str, str, str]] = set()  # (table, key, column), said once
        check_state_file(path)
        if readonly:
            self._db = sqlite3.connect(_readonly_uri(path), uri=True, timeout=5.0)
        else:
            self._db = _open_writable(path)
            try:
                self._health_file = _HealthFile(path.parent / HEALTH_FILE)
            except OSError as exc:
                self._db.close()
                raise StateFileError(
                    f"{path.parent / HEALTH_FILE}: cannot be written ({exc.strerror});"
                    " fix the permissions of the state directory or remove that entry"
                ) from None
            self._identity = _identity(path)
            self._mark = _RunMark.made(self._db, path)
        self._db.row_factory = sqlite3.Row

    @classmethod
    def in_dir(cls, state_dir: Path, *, readonly: bool = False) -> SqliteStore:
        return cls(state_dir / STATE_FILE, readonly=readonly)

    def close(self) -> None:
        """A last try at writes still waiting, then close (what cannot be written is logged)."""
        self._save_commits()
        if self._backlog and not self.retry_pending(force=True):
            log.error(
                "%s could not be saved to %s before stopping (%s); the next start works from"
                " the state last committed",
                counted(len(self._backlog), "state write", "state writes"),
                self.path,
                self._health.reason if self._health else "unknown",
            )
        self._db.close()
        if self._mark is not None:
            self._mark.close()
        if self._health_file is not None:
            self._health_file.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            # SQLite may already have rolled back (a full disk does); never mask the cause.
            if self._db.in_transaction:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error as exc:
                    log.debug("rollback after a failed write failed too: %s", exc)
            raise

    @contextmanager
    def at_once(self) -> Iterator[None]:
        """A write in this block is committed before it returns, after the writes waiting
        (which are retried first, when due), or raises `StateNotSaved` and is not kept: a
        mark kept in the backlog let its send go out, and a kill -9 before the backlog was
        written left no mark, so the next start sent the notice or reply a second time.
        While the fault lasts a write here fails at once until the next retry is due, so
        it never holds the service's loop for the lock's busy timeout each time."""
        self._at_once = True
        try:
            yield
        finally:
            self._at_once = False

    def _write(self, key: tuple[str, ...], op: WriteOp) -> None:
        """Commit `op` now, or keep it in the backlog (after the writes already waiting).

        Fingerprints not committed yet go first, in the same transaction: they were written
        before `op`, which may overwrite the same row (a retired resident's `message_id`).
        """
        if self._at_once:
            self._write_now(op)
            return
        if self._backlog or self._health is not None:  # (not tried before the retry is due)
            self._commits_to_backlog()
            self._backlog.pop(key, None)  # the newer write of the same row supersedes it
            self._backlog[key] = op
            self.retry_pending()
            return
        refused = self._commit(op)
        if refused is not None:
            self._backlog[key] = op
            self._failed(refused)

    def _write_now(self, op: WriteOp) -> None:
        """Commit `op` now, or raise `StateNotSaved` without keeping it (see `at_once`)."""
        if (self._backlog or self._health is not None) and not self.retry_pending():
            raise StateNotSaved(self._health.reason if self._health else "writes waiting")
        refused = self._commit(op)
        if refused is not None:
            self._failed(refused)
            raise StateNotSaved(_fault_reason(refused))

    def _commit(self, op: WriteOp) -> sqlite3.Error | None:
        """Commit `op` with the kept first-sight offsets and fingerprints; the database's
        refusal, those kept then moved to the backlog (`_commits_to_backlog`), or None."""
        try:
            with self._tx() as db:
                self._save_unsaved(db)
                op(db)
        except _BUG_ERRORS:
            raise
        except sqlite3.Error as exc:
            self._commits_to_backlog()
            return exc
        self._unsaved_commits.clear()
        self._unsaved_offsets.clear()
        return None

    def _save_unsaved(self, db: sqlite3.Connection) -> None:
        """Write the kept first-sight offsets and fingerprints (in a transaction of the caller)."""
        for (agent_id, name), (inode, offset) in self._unsaved_offsets.items():
            _save_offset(db, agent_id, name, inode, offset)
        for route, (fingerprint, at) in self._unsaved_commits.items():
            _save_commit(db, route, fingerprint, at)

    def _save_commits(self) -> None:
        """Commit what is kept in memory, in one transaction (the backlog on error)."""
        if not self._unsaved_commits and not self._unsaved_offsets:
            return
        if self._backlog or self._health is not None:
            self._commits_to_backlog()
            return
        try:
            with self._tx() as db:
                self._save_unsaved(db)
        except _BUG_ERRORS:
            raise
        except sqlite3.Error as exc:
            self._commits_to_backlog()
            self._failed(exc)
        else:
            self._unsaved_commits.clear()
            self._unsaved_offsets.clear()

    def _commits_to_backlog(self) -> None:
        """Hand what is kept to the backlog (its order, its retries, its health)."""
        for (agent_id, name), (inode, offset) in self._unsaved_offsets.items():

            def save(
                db: sqlite3.Connection,
                agent_id: str = agent_id,
                name: str = name,
                inode: int = inode,
                offset: int = offset,
            ) -> None:
                _save_offset(db, agent_id, name, inode, offset)

            self._backlog.pop(("offset", agent_id, name), None)
            self._backlog[("offset", agent_id, name)] = save
        self._unsaved_offsets.clear()
        for route, (fingerprint, at) in self._unsaved_commits.items():

            def op(
                db: sqlite3.Connection, route: str = route, fp: str = fingerprint, at: float = at
            ) -> None:
                _save_commit(db, route, fp, at)

            self._backlog.pop(("committed", route), None)
            self._backlog[("committed", route)] = op
        self._unsaved_commits.clear()

    def retry_pending(self, *, force: bool = False) -> bool:
        self._keep_in_place()
        self._save_commits()
        if not self._backlog and self._health is None:
            return True  # (a fault with no write waiting: a write `at_once` refused)
        if not force and self._clock() < self._retry_at:
            return False
        try:
            # A retry runs on the event loop: a lock another process holds on the file is
            # waited for briefly here (the first failed write already waited the full time),
            # except for the last try at stop.
            self._db.execute(f"PRAGMA busy_timeout = {_BUSY_MS if force else _RETRY_BUSY_MS}")
            with self._tx() as db:
                for op in self._backlog.values():
                    op(db)
        except _BUG_ERRORS:
            raise
        except sqlite3.Error as exc:
            self._failed(exc)
            return False
        finally:
            with suppress(sqlite3.Error):
                self._db.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
        log.warning(
            "state writes to %s work again; %s saved",
            self.path,
            counted(len(self._backlog), "waiting write", "waiting writes"),
        )
        self._backlog.clear()
        self._waiting_changes.clear()
        self._notice_overlay.clear()
        self._health, self._retry_at = None, 0.0
        self._backoff.reset()
        if self._health_file is not None:
            self._health_file.write(None)
        return True

    def _keep_in_place(self) -> None:
        """Write the state file back when it was deleted while serving.

        SQLite goes on writing to an open file that was unlinked (a cleanup of the state
        directory, a person's `rm`), without an error: every write since would be gone at
        stop, and the next start would post every resident message a second time. Checked
        once a second (one `stat`); the open database is copied back to its path. A different
        file put in its place (a backup restored while serving) is left as it is: logged once.
        """
        if self._identity is None:
            return
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._restore(self._identity[0])
            return
        except OSError:
            return  # a folder that cannot be searched: the writes say so themselves
        if (info.st_dev, info.st_ino) != self._identity:
            if not self._replaced_logged:
                self._replaced_logged = True
                log.error(
                    "the state file %s was replaced by another file while the service ran;"
                    " the service keeps writing to the one it opened, so the new file's state"
                    " is used only from the next start, and what the service writes until"
                    " then is lost; stop the service before replacing its state file",
                    self.path,
                )
        elif self._mark is not None and not self._overwritten_logged and self._mark.gone():
            self._overwritten_logged = True
            log.error(
                "the state file %s was overwritten in place while the service ran (another"
                " file copied over it: a backup restored, another state); the service's"
                " writes now mix with what was copied, and the next start may post cards"
                " again; stop the service, put the state file you mean in place, then start"
                " it; stop the service before restoring its state file",
                self.path,
            )

    def _restore(self, device: int) -> None:
        """Copy the open (deleted) database, on file system `device`, to a new file at its
        path and switch to it."""
        fresh = self.path.with_name(self.path.name + ".new")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if os.stat(self.path.parent).st_dev != device:
                # Not deleted but out of sight: the state directory's file system unmounted
                # (lazily) under the open file, which keeps it. A copy would land on the
                # mount point's own disk and be hidden again when the mount comes back.
                if not self._restore_failed:
                    self._restore_failed = True
                    log.error(
                        "the state file %s is gone from sight: its folder is now on another"
                        " file system (unmounted?); the service keeps writing to the file it"
                        " opened; mount the state directory again, then restart",
                        self.path,
                    )
                return
            fresh.unlink(missing_ok=True)
            copy = sqlite3.connect(fresh, timeout=5.0, isolation_level=None)
            try:
                self._db.backup(copy)
            finally:
                copy.close()
        except (OSError, sqlite3.Error) as exc:
            with suppress(OSError):
                fresh.unlink(missing_ok=True)
            if not self._restore_failed:
                self._restore_failed = True
                log.error(
                    "the state file %s was deleted while the service ran and cannot be"
                    " written again (%s); the service carries on and tries again each"
                    " second; free space or fix the state directory, else the next start"
                    " posts every resident message again",
                    self.path,
                    _fault_reason(exc),
                )
            return
        # Closing the old connection removes its write-ahead log and shared memory by
        # name, so it goes before the copy takes the path; what it leaves of them is stale
        # (no other connection writes here while the serve lock is held) and would be read
        # as the copy's own.
        self._db.close()
        for suffix in ("-wal", "-shm"):
            with suppress(OSError):
                self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
        try:
            os.replace(fresh, self.path)
        except OSError as exc:
            self._db = sqlite3.connect(fresh, timeout=5.0, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._identity = None  # serving from the copy: nothing more to put back
            log.error(
                "the state file %s was deleted while the service ran; its copy %s cannot take"
                " its place (%s): the service writes there; after stopping it, rename it to %s",
                self.path,
                fresh,
                exc.strerror,
                self.path.name,
            )
            return
        try:
            self._db = _open_writable(self.path)
        except StateFileError:
            # A disk that filled up in between: writes fail into the backlog until it frees.
            self._db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._identity = _identity(self.path)
        self._replaced_logged = self._restore_failed = False
        if self._mark is not None:
            self._mark.close()
        self._mark = _RunMark.made(self._db, self.path)
        if self._health_file is not None:
            self._health_file.close()
            try:
                self._health_file = _HealthFile(self.path.parent / HEALTH_FILE)
            except OSError:
                self._health_file = None
            else:
                self._health_file.write(self._health)
        log.error(
            "the state file %s was deleted while the service ran; it is written again from"
            " the open database and nothing is lost; stop the service before moving or"
            " deleting its state",
            self.path,
        )

    def health(self) -> StateHealth | None:
        return self._health

    def _failed(self, exc: sqlite3.Error) -> None:
        reason = _fault_reason(exc)
        first = self._health is None
        since = self._wall() if self._health is None else self._health.failing_since
        self._health = StateHealth(since, reason, len(self._backlog))
        retry_s = self._backoff.next_delay_s()
        self._retry_at = self._clock() + retry_s
        if first:
            log.error(
                "cannot write the state file %s (%s); the service carries on and retries"
                " with backoff; %s",
                self.path,
                reason,
                _fault_advice(exc),
            )
        else:
            log.warning(
                "state file %s still not writable (%s); writes waiting: %d, next try in %.0fs",
                self.path,
                reason,
                len(self._backlog),
                retry_s,
            )
        if self._health_file is not None:
            self._health_file.write(self._health)

    def _ensure_resident(self, db: sqlite3.Connection, route: str) -> None:
        db.execute("INSERT OR IGNORE INTO residents (route) VALUES (?)", (route,))

    def resident(self, route: str) -> ResidentRecord | None:
        row = self._db.execute("SELECT * FROM residents WHERE route = ?", (route,)).fetchone()
        if row is None:
            return (
                None
                if route not in self._unsaved_commits
                else self._with_commit(ResidentRecord(route, None, None, None, None))
            )
        return self._with_commit(self._resident(row, route))

    def residents(self) -> list[ResidentRecord]:
        rows = self._db.execute("SELECT * FROM residents ORDER BY route").fetchall()
        records = {}
        for row in rows:
            route = self._stored("residents", "?", row, "route")
            if route is not None:
                records[route] = self._with_commit(self._resident(row, route))
        for route in self._unsaved_commits.keys() - records.keys():
            records[route] = self._with_commit(ResidentRecord(route, None, None, None, None))
        return [records[route] for route in sorted(records)]

    def residents_of(self, routes: Iterable[str]) -> dict[str, ResidentRecord]:
        found: dict[str, ResidentRecord] = {}
        for batch in in_batches(dict.fromkeys(routes)):
            rows = self._db.execute(
                f"SELECT * FROM residents WHERE route IN ({_marks(len(batch))})", batch
            )
            for row in rows:
                found[row["route"]] = self._with_commit(self._resident(row, row["route"]))
            for route in self._unsaved_commits.keys() & set(batch) - found.keys():
                found[route] = self._with_commit(ResidentRecord(route, None, None, None, None))
        return found

    def _resident(self, row: sqlite3.Row, route: str) -> ResidentRecord:
        unread: set[str] = set()

        def field(column: str) -> Any:
            return self._stored("residents", route, row, column, unread)

        return ResidentRecord(
            route=route,
            message_id=field("message_id"),
            fingerprint=field("fingerprint"),
            committed_at=field("committed_at"),
            disabled_reason=field("disabled_reason"),
            send_key=field("send_key"),
            stale_message_id=field("stale_message_id"),
            unsure_sends=field("unsure_sends") or 0,
            unsure_at=field("unsure_at"),
            pin_owed_id=field("pin_owed_id"),
            unreadable=frozenset(unread),
        )

    def _stored(
        self, table: str, key: str, row: sqlite3.Row, column: str, unread: set[str] | None = None
    ) -> Any:
        """`row[column]` of `table` read as `_COLUMNS` says (None where the file is from
        before a column of `_ADDED_COLUMNS`). A value that is not of the column's kind,
        edited by hand or written by a bug, reads as None, with one warning per row and
        column naming it and what the service does instead: a file that ends the service
        helps no one. Such a column is added to `unread`."""
        raw = _added(row, column) if column in _ADDED_COLUMNS else row[column]
        reader, what, kind, instead = _COLUMNS[table, column]
        value = reader(raw)
        if value is None and raw is not None and unread is not None:
            unread.add(column)
        if value is None and raw is not None and (table, key, column) not in self._unreadable:
            self._unreadable.add((table, key, column))
            log.warning(
                "%s: %s %s holds %.40r, not %s; %s",
                self.path,
                what,
                shown_key(key),
                raw,
                kind,
                instead,
            )
        return value

    def _has_table(self, name: str) -> bool:
        """Whether the file has table `name`: a read-only open of a file from before it was
        added reads it as empty, while a table of another layout is an unfit state."""
        row = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return row is not None

    def _with_commit(self, record: ResidentRecord) -> ResidentRecord:
        """`record` as it reads once its kept fingerprint is committed."""
        unsaved = self._unsaved_commits.get(record.route)
        if unsaved is None:
            return record
        unreadable = record.unreadable - {"fingerprint", "committed_at"}
        return replace(
            record, fingerprint=unsaved[0], committed_at=unsaved[1], unreadable=unreadable
        )

    def set_message_id(self, route: str, message_id: str | None) -> None:
        def op(db: sqlite3.Connection) -> None:
            self._ensure_resident(db, route)
            db.execute(
                "UPDATE residents SET message_id = ?, fingerprint = NULL, send_key = NULL, "
                "unsure_sends = CASE WHEN ? IS NULL THEN unsure_sends ELSE 0 END "
                "WHERE route = ?",
                (message_id, message_id, route),
            )

        self._write(("message_id", route), op)

    def replace_message(
        self, route: str, *, message_id: str | None = None, stale_message_id: str | None = None
    ) -> None:
        def op(db: sqlite3.Connection) -> None:
            self._ensure_resident(db, route)
            db.execute(
                "UPDATE residents SET message_id = ?, stale_message_id = ?, "
                "fingerprint = CASE WHEN message_id IS ? THEN fingerprint ELSE NULL END, "
                "send_key = CASE WHEN ? IS NULL THEN NULL ELSE send_key END "
                "WHERE route = ?",
                (message_id, stale_message_id, message_id, message_id, route),
            )

        self._write(("replace_message", route), op)

    def set_send_key(self, route: str, key: str | None) -> None:
        def op(db: sqlite3.Connection) -> None:
            self._ensure_resident(db, route)
            db.execute("UPDATE residents SET send_key = ? WHERE route = ?", (key, route))

        self._write(("send_key", route), op)

    def set_unsure_sends(self, route: str, count: int, at: float | None) -> None:
        def op(db: sqlite3.Connection) -> None:
            self._ensure_resident(db, route)
            db.execute(
                "UPDATE residents SET unsure_sends = ?, unsure_at = ? WHERE route = ?",
                (count, at, route),
            )

        self._write(("unsure_sends", route), op)

    def before_send(
        self, route: str, send_key: str | None, unsure: tuple[int, float | None] | None
    ) -> None:
        if send_key is None or unsure is None:
            super().before_send(route, send_key, unsure)  # one write or none
            return
        count, at = unsure

        def op(db: sqlite3.Connection) -> None:
            self._ensure_resident(db, route)
            db.execute(
                "UPDATE residents SET send_key = ?, unsure_sends = ?, unsure_at = ? "
                "WHERE route = ?",
                (send_key, count, at, route),
            )

        # In a backlog it supersedes the waiting writes of both fields; a later write of
        # either one goes after it.
        self._backlog.pop(("send_key", route), None)
        self._backlog.pop(("unsure_sends", route), None)
        self._write(("before_send", route), op)

    def set_pin_owed(self, route: str, message_id: str | None) -> None:
        def op(db: sqlite3.Connection) -> None:
            self._ensure_resident(db, route)
            db.execute("UPDATE residents SET pin_owed_id = ? WHERE route = ?", (message_id, route))

        self._write(("pin_owed", route), op)

    def set_committed(self, route: str, fingerprint: str, at: float) -> None:
        """Kept in memory until the next other write or `retry_pending` (module docstring)."""
        self._unsaved_commits.pop(route, None)  # keeps the dict in write order
        self._unsaved_commits[route] = (fingerprint, at)
        if self._backlog or len(self._unsaved_commits) >= MAX_UNSAVED_COMMITS:
            self._save_commits()

    def set_disabled(self, route: str, reason: str | None) -> None:
        def op(db: sqlite3.Connection) -> None:
            self._ensure_resident(db, route)
            db.execute("UPDATE residents SET disabled_reason = ? WHERE route = ?", (reason, route))

        self._write(("disabled", route), op)

    def prefs(self, scope: str) -> ChatPrefs:
        row = self._db.execute("SELECT * FROM prefs WHERE scope = ?", (scope,)).fetchone()
        if row is None:
            return ChatPrefs()
        hidden = self._stored("prefs", scope, row, "hidden")
        rows = self._stored("prefs", scope, row, "activity_rows")
        return ChatPrefs(hidden=bool(hidden), activity_rows=rows)

    def set_prefs(self, scope: str, prefs: ChatPrefs) -> None:
        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO prefs (scope, hidden, activity_rows) VALUES (?, ?, ?) "
                "ON CONFLICT(scope) DO UPDATE SET hidden = excluded.hidden, "
                "activity_rows = excluded.activity_rows",
                (scope, int(prefs.hidden), prefs.activity_rows),
            )

        self._write(("prefs", scope), op)

    def add_notice(self, route: str, notice_id: str, text: str, state: NoticeState) -> bool:
        if (route, notice_id) in self._notice_overlay or self._db.execute(
            "SELECT 1 FROM notices WHERE route = ? AND notice_id = ?", (route, notice_id)
        ).fetchone():
            return False
        now = time.time()

        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR IGNORE INTO notices "
                "(route, notice_id, text, state, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (route, notice_id, text, state, now, now),
            )

        self._write(("notice", route, notice_id), op)
        if self._backlog:
            self._notice_overlay[(route, notice_id)] = (text, state, now)
        return True

    def pending_notices(self, route: str | None = None) -> list[PendingNotice]:
        query = "SELECT route, notice_id, text, created_at FROM notices WHERE state = 'pending'"
        params: tuple[str, ...] = ()
        if route is not None:
            query += " AND route = ?"
            params = (route,)
        rows = self._db.execute(query + " ORDER BY created_at, notice_id", params).fetchall()
        found = {}
        for row in rows:
            name = f"{stored_text(row['route'])} {stored_text(row['notice_id'])}"
            notice_route, notice_id, text, created_at = (
                self._stored("notices", name, row, column)
                for column in ("route", "notice_id", "text", "created_at")
            )
            if notice_route is not None and notice_id is not None and text is not None:
                found[notice_route, notice_id] = PendingNotice(
                    notice_route, notice_id, text, created_at or 0.0
                )
        # Writes waiting in the backlog are newer than the file: they decide.
        for (notice_route, notice_id), (text, state, at) in self._notice_overlay.items():
            if route is not None and notice_route != route:
                continue
            if state != "pending":
                found.pop((notice_route, notice_id), None)
            elif text and (notice_route, notice_id) not in found:
                found[(notice_route, notice_id)] = PendingNotice(notice_route, notice_id, text, at)
        return sorted(found.values(), key=lambda n: (n.created_at, n.notice_id))

    def unsure_notices(self, route: str | None = None) -> list[UnsureNotice]:
        query = "SELECT route, notice_id, text, updated_at FROM notices WHERE state = 'unsure'"
        params: tuple[str, ...] = ()
        if route is not None:
            query += " AND route = ?"
            params = (route,)
        rows = self._db.execute(query + " ORDER BY updated_at, notice_id", params).fetchall()
        found = {}
        for row in rows:
            name = f"{stored_text(row['route'])} {stored_text(row['notice_id'])}"
            notice_route, notice_id, text = (
                self._stored("notices", name, row, column)
                for column in ("route", "notice_id", "text")
            )
            if notice_route is not None and notice_id is not None:
                since = stored_time(row["updated_at"])
                found[notice_route, notice_id] = UnsureNotice(
                    notice_route, notice_id, text or "", since
                )
        # Writes waiting in the backlog are newer than the file: they decide.
        for (notice_route, notice_id), (text, state, at) in self._notice_overlay.items():
            if route is not None and notice_route != route:
                continue
            if state != "unsure":
                found.pop((notice_route, notice_id), None)
            elif (notice_route, notice_id) not in found:
                found[notice_route, notice_id] = UnsureNotice(notice_route, notice_id, text, at)
        return sorted(found.values(), key=lambda n: (n.since or 0.0, n.notice_id))

    def set_notice_state(self, route: str, notice_id: str, state: NoticeState) -> None:
        now = time.time()

        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE notices SET state = ?, updated_at = ? WHERE route = ? AND notice_id = ?",
                (state, now, route, notice_id),
            )

        self._write(("notice_state", route, notice_id), op)
        if self._backlog:
            known = self._notice_overlay.get((route, notice_id))
            self._notice_overlay[(route, notice_id)] = (known[0] if known else "", state, now)

    def mark_notice_unsure(self, route: str, notice_id: str) -> bool:
        now = time.time()
        marked = False

        def op(db: sqlite3.Connection) -> None:
            nonlocal marked
            cursor = db.execute(
                "UPDATE notices SET state = 'unsure', updated_at = ?"
                " WHERE route = ? AND notice_id = ? AND state = 'pending'",
                (now, route, notice_id),
            )
            marked = cursor.rowcount == 1

        self._write_now(op)  # after the writes waiting, which may be this notice's own
        return marked

    def prune_unsure_notices(self, now: float, route: str | None = None) -> None:
        of_route, params = ("AND route = ?", (route,)) if route is not None else ("", ())

        def op(db: sqlite3.Connection) -> None:
            db.execute(
                f"UPDATE notices SET {_FORGOTTEN} WHERE state = 'unsure' AND updated_at < ?",
                (now - UNSURE_KEEP_S,),
            )
            db.execute(
                f"UPDATE notices SET {_FORGOTTEN} WHERE rowid IN (SELECT rowid FROM (SELECT rowid,"
                " row_number() OVER (PARTITION BY route ORDER BY updated_at DESC, notice_id"
                f" DESC) AS newer FROM notices WHERE state = 'unsure' {of_route})"
                " WHERE newer > ?)",
                (*params, UNSURE_KEEP_PER_ROUTE),
            )

        self._write(("prune unsure", route or ""), op)

    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None:
        if self._unsaved_offsets:
            kept = self._unsaved_offsets.get((agent_id, name))
            if kept is not None:
                return kept
        row = self._db.execute(
            "SELECT inode, offset FROM offsets WHERE agent_id = ? AND name = ?", (agent_id, name)
        ).fetchone()
        return None if row is None else self._offset(agent_id, name, row)

    def _offset(self, agent_id: str, name: str, row: sqlite3.Row) -> tuple[int, int] | None:
        inode = self._stored("offsets", f"{agent_id}/{name}", row, "inode")
        offset = self._stored("offsets", f"{agent_id}/{name}", row, "offset")
        return None if inode is None or offset is None else (inode, offset)

    def get_offsets(
        self, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, int]]:
        wanted = set(keys)
        found: dict[tuple[str, str], tuple[int, int]] = {}
        for agents in in_batches(dict.fromkeys(agent_id for agent_id, _ in wanted)):
            rows = self._db.execute(
                "SELECT agent_id, name, inode, offset FROM offsets"
                f" WHERE agent_id IN ({_marks(len(agents))})",
                agents,
            )
            for row in rows:
                key = (row["agent_id"], row["name"])
                if key in wanted and (offset := self._offset(*key, row)) is not None:
                    found[key] = offset
        for key in wanted & self._unsaved_offsets.keys():
            found[key] = self._unsaved_offsets[key]
        return found

    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        def op(db: sqlite3.Connection) -> None:
            _save_offset(db, agent_id, name, inode, offset)

        self._write(("offset", agent_id, name), op)

    def set_first_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        """Kept in memory until the next other write or `retry_pending` (module docstring)."""
        self._unsaved_offsets[(agent_id, name)] = (inode, offset)
        if self._backlog or len(self._unsaved_offsets) >= MAX_UNSAVED_COMMITS:
            self._save_commits()

    def get_cursor(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM cursors WHERE key = ?", (key,)).fetchone()
        return str(row["value"]) if row else None

    def get_cursors(self, keys: Iterable[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for batch in in_batches(dict.fromkeys(keys)):
            rows = self._db.execute(
                f"SELECT key, value FROM cursors WHERE key IN ({_marks(len(batch))})", batch
            )
            found.update((str(key), str(value)) for key, value in rows)
        return found

    def first_claim(self, key: str, value: str, keep_s: float) -> str:
        del key, keep_s  # one instance per state file: no one else decides
        return value

    def set_cursor(self, key: str, value: str) -> None:
        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO cursors (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

        self._waiting_changes.pop(key, None)  # a change after this one goes after it
        self._write(("cursor", key), op)

    def change_cursor(self, key: str, change: Callable[[str | None], str]) -> None:
        """Read, change and write in one `BEGIN IMMEDIATE` transaction: it holds the file's
        write lock from before the read, so another process on the same file waits (its busy
        timeout) rather than writing in between. A change that fails waits in the backlog
        behind the writes before it; the later changes of the same cursor join that one
        write, made in their order on the value as stored when it goes in (each changes
        another part of it, so none supersedes another; a `set_cursor` or a delete of the
        cursor after it does, and a change after those starts a write of its own). One write
        per change, a busy origin book kept a backlog growing with every route it opened
        while another process held the file."""
        waiting = self._waiting_changes.get(key)
        if waiting is not None and waiting[0] in self._backlog:
            waiting[1].append(change)
            self.retry_pending()
            return
        changes = [change]

        def op(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT value FROM cursors WHERE key = ?", (key,)).fetchone()
            value = None if row is None else str(row[0])
            for each in changes:
                value = each(value)
            db.execute(
                "INSERT INTO cursors (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

        self._changes += 1
        backlog_key = ("cursor changed", key, str(self._changes))
        self._write(backlog_key, op)
        if backlog_key in self._backlog:
            self._waiting_changes[key] = (backlog_key, changes)
        else:
            self._waiting_changes.pop(key, None)

    def cursor_keys(self, prefix: str) -> list[str]:
        rows = self._db.execute(
            "SELECT key FROM cursors WHERE substr(key, 1, ?) = ? ORDER BY key",
            (len(prefix), prefix),
        )
        return [str(row["key"]) for row in rows]

    def delete_cursors(self, keys: Iterable[str]) -> None:
        wanted = sorted(set(keys))
        if not wanted:
            return

        def op(db: sqlite3.Connection) -> None:
            db.executemany("DELETE FROM cursors WHERE key = ?", [(key,) for key in wanted])

        for key in wanted:  # a set_cursor of one of them still waiting is superseded
            self._backlog.pop(("cursor", key), None)
            self._waiting_changes.pop(key, None)
        self._write(("cursors deleted", *wanted), op)

    def offset_agents(self) -> set[str]:
        rows = self._db.execute("SELECT DISTINCT agent_id FROM offsets")
        return {str(row["agent_id"]) for row in rows} | {a for a, _ in self._unsaved_offsets}

    def forget_agent(
        self,
        agent_id: str,
        *,
        routes: Iterable[str] = (),
        cursors: Iterable[str] = (),
        cursor_prefixes: Iterable[str] = (),
    ) -> None:
        suffix = ":" + agent_id
        named = sorted(set(routes))
        keys = sorted(set(cursors))
        prefixes = sorted(set(cursor_prefixes))

        def owned(route: str) -> bool:
            return route.endswith(suffix) or route in named

        def op(db: sqlite3.Connection) -> None:
            for table in ("residents", "notices"):
                # The agent's routes through the index on their last part (`_last_part`):
                # the work is its own rows', not the fleet's.
                db.execute(
                    f"DELETE FROM {table} WHERE {_last_part('route')} = ?"
                    " AND instr(route, ':') > 0",
                    (agent_id,),
                )
                db.executemany(
                    f"DELETE FROM {table} WHERE route = ?",
                    [(route,) for route in named],
                )
            db.execute("DELETE FROM offsets WHERE agent_id = ?", (agent_id,))
            db.execute("DELETE FROM inbox WHERE agent_id = ?", (agent_id,))
            db.executemany("DELETE FROM cursors WHERE key = ?", [(key,) for key in keys])
            for prefix in prefixes:
                db.execute(
                    f"DELETE FROM cursors WHERE {_last_part('key')} = ?"
                    " AND substr(key, 1, ?) = ? AND length(key) > ?",
                    (agent_id, len(prefix), prefix, len(prefix) + len(suffix)),
                )

        # What is kept in memory for it would write its rows again.
        for route in [route for route in self._unsaved_commits if owned(route)]:
            del self._unsaved_commits[route]
        for kept in [kept for kept in self._unsaved_offsets if kept[0] == agent_id]:
            del self._unsaved_offsets[kept]
        for ref in [ref for ref in self._notice_overlay if owned(ref[0])]:
            del self._notice_overlay[ref]
        self._write(("agent forgotten", agent_id), op)

    def pauses(self) -> dict[str, float]:
        rows = self._db.execute("SELECT scope, until_epoch FROM pauses").fetchall()
        pauses = {}
        for row in rows:
            scope = self._stored("pauses", "?", row, "scope")
            until = None if scope is None else self._stored("pauses", scope, row, "until_epoch")
            if scope is not None and until is not None:
                pauses[scope] = until
        return pauses

    def set_pause(self, scope: str, until_epoch: float) -> None:
        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO pauses (scope, until_epoch) VALUES (?, ?) "
                "ON CONFLICT(scope) DO UPDATE SET until_epoch = excluded.until_epoch",
                (scope, until_epoch),
            )

        self._write(("pause", scope), op)

    def notice_counts(self) -> dict[str, int]:
        rows = self._db.execute("SELECT state, COUNT(*) AS n FROM notices GROUP BY state")
        return {str(row["state"]): int(row["n"]) for row in rows}

    def record_chat(self, chat: SeenChat) -> None:
        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO seen_chats (channel, chat_id, thread_id, title, last_seen) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT(channel, chat_id, thread_id) DO UPDATE SET "
                "title = COALESCE(excluded.title, title), last_seen = excluded.last_seen",
                (chat.channel, chat.chat_id, chat.thread_id or "", chat.title, chat.last_seen),
            )

        self._write(("seen_chat", chat.channel, chat.chat_id, chat.thread_id or ""), op)

    def seen_chats(self) -> list[SeenChat]:
        if not self._has_table("seen_chats"):
            return []  # a read-only open of a state file from before this table
        # A table of another layout (a newer version's) raises, as any unfit table does.
        rows = self._db.execute(
            "SELECT * FROM seen_chats ORDER BY last_seen DESC, channel, chat_id, thread_id"
        ).fetchall()
        chats = []
        for row in rows:
            name = ":".join(str(stored_text(row[c])) for c in ("channel", "chat_id", "thread_id"))
            unread: set[str] = set()
            channel, chat_id, thread_id, title, last_seen = (
                self._stored("seen_chats", name, row, column, unread)
                for column in ("channel", "chat_id", "thread_id", "title", "last_seen")
            )
            if channel is not None and chat_id is not None and thread_id is not None:
                chats.append(
                    SeenChat(
                        channel, chat_id, thread_id or None, title, last_seen or 0.0,
                        frozenset(unread),
                    )
                )  # fmt: skip
        # Sorted again once read: SQL put a time no date shows (`1e308`, text) first, and it
        # is taken as long ago.
        return sorted(chats, key=lambda c: (-c.last_seen, c.channel, c.chat_id, c.thread_id or ""))

    def remember_sent(self, channel: str, message_id: str, at: float) -> None:
        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR REPLACE INTO sent (channel, message_id, at) VALUES (?, ?, ?)",
                (channel, message_id, at),
            )
            db.execute("DELETE FROM sent WHERE at < ?", (at - SENT_KEEP_S,))

        self._write(("sent", channel, message_id), op)

    def sent_any(self, channel: str, message_ids: Iterable[str], now: float) -> bool:
        where = "FROM sent WHERE channel = ?"
        return (
            self._recent_message("SELECT message_id " + where, (channel,), message_ids, now)
            is not None
        )

    def _recent_message(
        self,
        query: str,
        args: tuple[str, ...],
        message_ids: Iterable[str],
        now: float,
        *,
        strict: bool = False,
    ) -> sqlite3.Row | None:
        """The row of `query` (a SELECT message_id, ... WHERE of a table of message ids kept
        `SENT_KEEP_S`) for the first of `message_ids` posted within that time, as Redis
        answers; None when there is none, or the table is not there (a read-only open of a
        state file from before it). `strict`: any other failure to read is raised, not
        taken for none."""
        wanted = list(dict.fromkeys(message_ids))
        if not wanted:
            return None
        marks = ", ".join("?" * len(wanted))
        try:
            rows: list[sqlite3.Row] = self._db.execute(
                f"{query} AND at >= ? AND message_id IN ({marks})",
                (*args, now - SENT_KEEP_S, *wanted),
            ).fetchall()
        except sqlite3.OperationalError as error:
            if strict and not str(error).startswith("no such table"):
                raise  # the file cannot be read now: not the same as no such message
            return None
        return min(rows, key=lambda row: wanted.index(row["message_id"]), default=None)

    def remember_notice(
        self, channel: str, chat_id: str, message_id: str, agent_id: str, at: float
    ) -> None:
        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR REPLACE INTO notice_messages (channel, chat_id, message_id, agent_id,"
                " at) VALUES (?, ?, ?, ?, ?)",
                (channel, chat_id, message_id, agent_id, at),
            )
            db.execute("DELETE FROM notice_messages WHERE at < ?", (at - SENT_KEEP_S,))

        self._write(("notice_message", channel, chat_id, message_id), op)

    def notice_agent(
        self, channel: str, chat_id: str, message_ids: Iterable[str], now: float
    ) -> str | None:
        where = "FROM notice_messages WHERE channel = ? AND chat_id = ?"
        query = "SELECT message_id, agent_id " + where
        row = self._recent_message(query, (channel, chat_id), message_ids, now, strict=True)
        return None if row is None else str(row["agent_id"])

    def add_inbox_message(self, record: InboxRecord) -> None:
        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR REPLACE INTO inbox (message_id, agent_id, channel, chat_id,"
                " thread_id, author, queued_at, outcome, reason, closed_at, reply_to_id,"
                " reply_thread_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.message_id,
                    record.agent_id,
                    record.channel,
                    record.chat_id,
                    record.thread_id,
                    record.author,
                    record.queued_at,
                    record.outcome,
                    record.reason,
                    record.closed_at,
                    record.reply_to_id,
                    record.reply_thread_id,
                ),
            )

        self._write(("inbox", record.message_id), op)

    def set_inbox_outcome(
        self, message_id: str, outcome: InboxOutcome, reason: str | None, at: float
    ) -> None:
        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE inbox SET outcome = ?, reason = ?, closed_at = ? WHERE message_id = ?",
                (outcome, reason, None if outcome == "open" else at, message_id),
            )

        self._write(("inbox_outcome", message_id), op)

    def inbox_messages(self, since: float) -> list[InboxRecord]:
        if not self._has_table("inbox"):
            return []  # a read-only open of a state file from before this table
        rows = self._db.execute(
            "SELECT * FROM inbox WHERE outcome = 'open' OR queued_at >= ?"
            " ORDER BY queued_at, message_id",
            (since,),
        ).fetchall()
        records = (self._inbox_record(row) for row in rows)
        return [record for record in records if record is not None]

    def _inbox_record(self, row: sqlite3.Row) -> InboxRecord | None:
        """The inbox message of `row`, None when it lacks what names or places it."""
        name = str(stored_text(row["message_id"]))

        def field(column: str) -> Any:
            return self._stored("inbox", name, row, column)

        message_id, agent_id, channel, chat_id, queued_at = (
            field(column)
            for column in ("message_id", "agent_id", "channel", "chat_id", "queued_at")
        )
        if None in (message_id, agent_id, channel, chat_id, queued_at):
            return None
        outcome = field("outcome")
        return InboxRecord(
            message_id=message_id,
            agent_id=agent_id,
            channel=channel,
            chat_id=chat_id,
            thread_id=field("thread_id"),
            author=field("author"),
            queued_at=queued_at,
            outcome=outcome
            if outcome in ("open", "delivered", "failed", "cancelled")
            else "failed",
            reason=field("reason"),
            closed_at=field("closed_at"),
            reply_to_id=field("reply_to_id"),
            reply_thread_id=field("reply_thread_id"),
        )


def _create_atomically(path: Path) -> None:
    """Create a new state file with its schema under a temporary name, then rename it.

    So the state file either does not exist or has every table: `taskcard status` run in the
    first instant of a first start, or a start after a crash during creation, never meets an
    empty or half-made database (which the start-up check rightly refuses).
    """
    fresh = path.with_name(path.name + ".new")
    fresh.unlink(missing_ok=True)  # left by a creation that crashed: never committed to
    db = sqlite3.connect(fresh, timeout=5.0, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(_SCHEMA)
    finally:
        db.close()  # the last connection's close folds the WAL back into the file
    os.replace(fresh, path)


def _open_writable(path: Path) -> sqlite3.Connection:
    """Open the state file for writing and prove it with a real write, or `StateFileError`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            _create_atomically(path)
        db = sqlite3.connect(path, timeout=5.0, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise StateFileError(
            f"{path}: cannot be opened ({_fault_reason(exc)}); fix the permissions or mount of"
            " the state directory, or choose another state_dir"
        ) from None
    try:
        db.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL survives a crash of this process (SIGKILL included); only a
        # power cut may lose the last commits. It keeps a commit in microseconds, which
        # matters right after a send: the new message id is persisted at once.
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(residents)")}
        added = {
            "send_key": "TEXT",
            "stale_message_id": "TEXT",
            "unsure_sends": "INTEGER NOT NULL DEFAULT 0",
            "unsure_at": "REAL",
            "pin_owed_id": "TEXT",
        }
        for column, kind in added.items():  # state files from before them
            if column not in columns:
                db.execute(f"ALTER TABLE residents ADD COLUMN {column} {kind}")
        columns = {row[1] for row in db.execute("PRAGMA table_info(inbox)")}
        for column in ("reply_to_id", "reply_thread_id"):
            if column not in columns:
                db.execute(f"ALTER TABLE inbox ADD COLUMN {column} TEXT")
        # A real write: a read-only mount, an immutable file or a full disk shows here.
        db.execute(
            "INSERT INTO cursors (key, value) VALUES ('service:opened_at', ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (str(time.time()),),
        )
    except sqlite3.Error as exc:
        db.close()
        if _locked(exc):  # not the disk: naming space and permissions sent people astray
            raise StateFileLocked(
                f"{path}: cannot be written ({_fault_reason(exc)}); {_fault_advice(exc)},"
                " then start again"
            ) from None
        raise StateFileError(
            f"{path}: cannot be written ({_fault_reason(exc)}); free space, or fix its"
            " permissions, attributes (chattr -i) or mount (read-write), then start again"
        ) from None
    return db


class _RunMark:
    """A mark of this run in the state file's header, to notice the file overwritten in place.

    A file copied over the state file (`cp backup state.sqlite3`) keeps its inode, so the
    once-a-second `stat` sees nothing, and SQLite in WAL mode reads on from its WAL. At open
    the service writes a random number into the header's `application_id` (nothing else uses
    it) and checkpoints it into the file; the same check then reads those four bytes: one
    `pread` a second, whatever the fleet's size. Another value there, once ours was seen,
    means another file's content. A mark the checkpoint could not write yet (a reader held
    the WAL) is looked for until it appears.
    """

    OFFSET = 68  # the header's application_id, big-endian

    def __init__(self, value: int, fd: int) -> None:
        self._value = value
        self._fd = fd  # kept open: closing a descriptor of the file drops SQLite's locks on it
        self._seen = False

    @classmethod
    def made(cls, db: sqlite3.Connection, path: Path) -> _RunMark | None:
        value = secrets.randbits(31) | 1
        try:
            db.execute(f"PRAGMA application_id = {value}")
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, sqlite3.Error):
            return None  # a disk that fails now: the writes say so themselves
        mark = cls(value, fd)
        mark.gone()
        return mark

    def gone(self) -> bool:
        """Whether the file's header no longer holds this run's mark, once it did."""
        try:
            header = os.pread(self._fd, 4, self.OFFSET)
        except OSError:
            return False
        if len(header) == 4 and int.from_bytes(header, "big", signed=True) == self._value:
            self._seen = True
            return False
        return self._seen

    def close(self) -> None:
        with suppress(OSError):
            os.close(self._fd)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`, None when it cannot be examined."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _locked(exc: sqlite3.Error) -> bool:
    """Whether another connection's lock, not the disk, made the write fail."""
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _fault_advice(exc: sqlite3.Error) -> str:
    """What the operator can do about a failed write."""
    if _locked(exc):
        return (
            "another process holds the file locked (a sqlite3 shell or a tool in a"
            " transaction): end that transaction or stop that process"
        )
    return "free space or fix the disk"


def _fault_reason(exc: BaseException) -> str:
    """A short reason for logs and the status: SQLite's message, or the OS error's text."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _marks(count: int) -> str:
    """The placeholders of an `IN (...)` list of `count` values."""
    return ", ".join("?" * count)


def _save_offset(db: sqlite3.Connection, agent_id: str, name: str, inode: int, offset: int) -> None:
    db.execute(
        "INSERT INTO offsets (agent_id, name, inode, offset) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(agent_id, name) DO UPDATE SET inode = excluded.inode, "
        "offset = excluded.offset",
        (agent_id, name, inode, offset),
    )


def _save_commit(db: sqlite3.Connection, route: str, fingerprint: str, at: float) -> None:
    """The shown card's fingerprint; the row is created only when it is missing (rarely)."""
    changed = db.execute(
        "UPDATE residents SET fingerprint = ?, committed_at = ? WHERE route = ?",
        (fingerprint, at, route),
    ).rowcount
    if not changed:
        db.execute(
            "INSERT INTO residents (route, fingerprint, committed_at) VALUES (?, ?, ?)",
            (route, fingerprint, at),
        )


def _added(row: sqlite3.Row, column: str) -> Any:
    """`row[column]`, or None where the file is from before that column was added: a
    read-only open (`taskcard status`) does not migrate it."""
    try:
        return row[column]
    except IndexError:  # no such column (a Row's `in` looks at values, not names)
        return None
