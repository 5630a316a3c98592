"""The service's durable state: resident message ids, preferences, notices, offsets, cursors.

`StateStore` is the seam (a shared database can replace SQLite when one machine is not enough);
`SqliteStore` is the default: one file in the state directory, WAL mode, every write committed
at once so that a SIGKILL loses nothing that was acknowledged. Calls are short and synchronous:
each is a single indexed statement on a local file (well under a millisecond), cheaper than a
thread hop, so the event loop calls them directly.
"""

from __future__ import annotations

import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

NoticeState = Literal["pending", "delivered", "suppressed", "failed"]


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

    @abstractmethod
    def get_cursor(self, key: str) -> str | None: ...

    @abstractmethod
    def set_cursor(self, key: str, value: str) -> None: ...

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
    unsure_at REAL
);
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
CREATE TABLE IF NOT EXISTS offsets (
    agent_id TEXT NOT NULL,
    name TEXT NOT NULL,
    inode INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    PRIMARY KEY (agent_id, name)
);
CREATE TABLE IF NOT EXISTS cursors (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pauses (scope TEXT PRIMARY KEY, until_epoch REAL NOT NULL);
CREATE TABLE IF NOT EXISTS seen_chats (
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    thread_id TEXT NOT NULL DEFAULT '',
    title TEXT,
    last_seen REAL NOT NULL,
    PRIMARY KEY (channel, chat_id, thread_id)
);
"""

STATE_FILE = "state.sqlite3"


class SqliteStore(StateStore):
    """SQLite in WAL mode; `readonly=True` opens an existing file for `taskcard status`."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        if readonly:
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # In WAL mode NORMAL survives a crash of this process (SIGKILL included); only a
            # power cut may lose the last commits. It keeps a commit in microseconds, which
            # matters right after a send: the new message id is persisted at once.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(residents)")}
            added = {
                "send_key": "TEXT",
                "stale_message_id": "TEXT",
                "unsure_sends": "INTEGER NOT NULL DEFAULT 0",
                "unsure_at": "REAL",
            }
            for column, kind in added.items():  # state files from before them
                if column not in columns:
                    self._db.execute(f"ALTER TABLE residents ADD COLUMN {column} {kind}")
        self._db.row_factory = sqlite3.Row

    @classmethod
    def in_dir(cls, state_dir: Path, *, readonly: bool = False) -> SqliteStore:
        return cls(state_dir / STATE_FILE, readonly=readonly)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _ensure_resident(self, db: sqlite3.Connection, route: str) -> None:
        db.execute("INSERT OR IGNORE INTO residents (route) VALUES (?)", (route,))

    def resident(self, route: str) -> ResidentRecord | None:
        row = self._db.execute("SELECT * FROM residents WHERE route = ?", (route,)).fetchone()
        return _resident(row) if row else None

    def residents(self) -> list[ResidentRecord]:
        rows = self._db.execute("SELECT * FROM residents ORDER BY route").fetchall()
        return [_resident(row) for row in rows]

    def set_message_id(self, route: str, message_id: str | None) -> None:
        with self._tx() as db:
            self._ensure_resident(db, route)
            db.execute(
                "UPDATE residents SET message_id = ?, fingerprint = NULL, send_key = NULL, "
                "unsure_sends = CASE WHEN ? IS NULL THEN unsure_sends ELSE 0 END "
                "WHERE route = ?",
                (message_id, message_id, route),
            )

    def replace_message(
        self, route: str, *, message_id: str | None = None, stale_message_id: str | None = None
    ) -> None:
        with self._tx() as db:
            self._ensure_resident(db, route)
            db.execute(
                "UPDATE residents SET message_id = ?, stale_message_id = ?, "
                "fingerprint = CASE WHEN message_id IS ? THEN fingerprint ELSE NULL END, "
                "send_key = CASE WHEN ? IS NULL THEN NULL ELSE send_key END "
                "WHERE route = ?",
                (message_id, stale_message_id, message_id, message_id, route),
            )

    def set_send_key(self, route: str, key: str | None) -> None:
        with self._tx() as db:
            self._ensure_resident(db, route)
            db.execute("UPDATE residents SET send_key = ? WHERE route = ?", (key, route))

    def set_unsure_sends(self, route: str, count: int, at: float | None) -> None:
        with self._tx() as db:
            self._ensure_resident(db, route)
            db.execute(
                "UPDATE residents SET unsure_sends = ?, unsure_at = ? WHERE route = ?",
                (count, at, route),
            )

    def set_committed(self, route: str, fingerprint: str, at: float) -> None:
        with self._tx() as db:
            self._ensure_resident(db, route)
            db.execute(
                "UPDATE residents SET fingerprint = ?, committed_at = ? WHERE route = ?",
                (fingerprint, at, route),
            )

    def set_disabled(self, route: str, reason: str | None) -> None:
        with self._tx() as db:
            self._ensure_resident(db, route)
            db.execute("UPDATE residents SET disabled_reason = ? WHERE route = ?", (reason, route))

    def prefs(self, scope: str) -> ChatPrefs:
        row = self._db.execute("SELECT * FROM prefs WHERE scope = ?", (scope,)).fetchone()
        if row is None:
            return ChatPrefs()
        return ChatPrefs(hidden=bool(row["hidden"]), activity_rows=row["activity_rows"])

    def set_prefs(self, scope: str, prefs: ChatPrefs) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO prefs (scope, hidden, activity_rows) VALUES (?, ?, ?) "
                "ON CONFLICT(scope) DO UPDATE SET hidden = excluded.hidden, "
                "activity_rows = excluded.activity_rows",
                (scope, int(prefs.hidden), prefs.activity_rows),
            )

    def add_notice(self, route: str, notice_id: str, text: str, state: NoticeState) -> bool:
        now = time.time()
        with self._tx() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO notices "
                "(route, notice_id, text, state, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (route, notice_id, text, state, now, now),
            )
            return cursor.rowcount == 1

    def pending_notices(self, route: str | None = None) -> list[PendingNotice]:
        query = "SELECT route, notice_id, text, created_at FROM notices WHERE state = 'pending'"
        params: tuple[str, ...] = ()
        if route is not None:
            query += " AND route = ?"
            params = (route,)
        rows = self._db.execute(query + " ORDER BY created_at, notice_id", params).fetchall()
        return [
            PendingNotice(row["route"], row["notice_id"], row["text"], row["created_at"])
            for row in rows
        ]

    def set_notice_state(self, route: str, notice_id: str, state: NoticeState) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE notices SET state = ?, updated_at = ? WHERE route = ? AND notice_id = ?",
                (state, time.time(), route, notice_id),
            )

    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None:
        row = self._db.execute(
            "SELECT inode, offset FROM offsets WHERE agent_id = ? AND name = ?", (agent_id, name)
        ).fetchone()
        return (int(row["inode"]), int(row["offset"])) if row else None

    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO offsets (agent_id, name, inode, offset) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(agent_id, name) DO UPDATE SET inode = excluded.inode, "
                "offset = excluded.offset",
                (agent_id, name, inode, offset),
            )

    def get_cursor(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM cursors WHERE key = ?", (key,)).fetchone()
        return str(row["value"]) if row else None

    def set_cursor(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO cursors (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def pauses(self) -> dict[str, float]:
        rows = self._db.execute("SELECT scope, until_epoch FROM pauses").fetchall()
        return {str(row["scope"]): float(row["until_epoch"]) for row in rows}

    def set_pause(self, scope: str, until_epoch: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO pauses (scope, until_epoch) VALUES (?, ?) "
                "ON CONFLICT(scope) DO UPDATE SET until_epoch = excluded.until_epoch",
                (scope, until_epoch),
            )

    def notice_counts(self) -> dict[str, int]:
        rows = self._db.execute("SELECT state, COUNT(*) AS n FROM notices GROUP BY state")
        return {str(row["state"]): int(row["n"]) for row in rows}

    def record_chat(self, chat: SeenChat) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO seen_chats (channel, chat_id, thread_id, title, last_seen) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT(channel, chat_id, thread_id) DO UPDATE SET "
                "title = COALESCE(excluded.title, title), last_seen = excluded.last_seen",
                (chat.channel, chat.chat_id, chat.thread_id or "", chat.title, chat.last_seen),
            )

    def seen_chats(self) -> list[SeenChat]:
        try:
            rows = self._db.execute(
                "SELECT * FROM seen_chats ORDER BY last_seen DESC, channel, chat_id, thread_id"
            ).fetchall()
        except sqlite3.OperationalError:
            return []  # a read-only open of a state file from before this table
        return [
            SeenChat(
                row["channel"],
                row["chat_id"],
                row["thread_id"] or None,
                row["title"],
                float(row["last_seen"]),
            )
            for row in rows
        ]


def _resident(row: sqlite3.Row) -> ResidentRecord:
    columns = set(row.keys())  # a Row's `in` looks at values, not names
    return ResidentRecord(
        route=row["route"],
        message_id=row["message_id"],
        fingerprint=row["fingerprint"],
        committed_at=row["committed_at"],
        disabled_reason=row["disabled_reason"],
        send_key=row["send_key"],
        stale_message_id=row["stale_message_id"],
        # A read-only open (`taskcard status`) does not migrate a file from before these.
        unsure_sends=int(row["unsure_sends"] or 0) if "unsure_sends" in columns else 0,
        unsure_at=row["unsure_at"] if "unsure_at" in columns else None,
    )
