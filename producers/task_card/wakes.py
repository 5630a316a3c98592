"""Task card wakes for the agent itself, each delivered once per consumer.

The notification file tells people (through the service) when a card breaks, recovers, runs
out of refreshes or has gone quiet. The agent has to hear the same thing, through its host:
a hook's `additionalContext`, an MCP result's `_meta`. Each such consumer keeps its own
cursor, `.notification/cursors/<consumer>.json` (the inode and byte offset it has read up
to), so one wake reaches every consumer once, and two hook processes running at the same
time (parallel tool calls) cannot both deliver it: the read-and-advance happens under a lock.

A consumer's first read only places its cursor at the end: an agent that just started is not
flooded with old episodes. Reading follows the writer's rotation (`system.jsonl` moved to
`system.jsonl.1`) and survives truncation; every read is bounded, and a notification file
that leads out of the workdir through a symlink is never read (as it is never written).

Wake text is built from the typed fields only (watch id, error code, counts), never from the
header or body strings of the line: anything may write that file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Final

from taskcard.producers.task_card.contract import (
    SOURCE_ERROR,
    SOURCE_LIMIT,
    SOURCE_REMINDER,
    CardPaths,
    Notification,
    atomic_write,
    counted,
    make_folder,
    open_lock,
    open_regular,
    parse_notification,
    read_regular,
)

CURSOR_DIR: Final = "cursors"
MAX_READ_BYTES: Final = 2_000_000
MAX_WAKES: Final = 10
_CONSUMER = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_TOKEN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True)
class Cursor:
    """How far a consumer has read: the file's inode and the byte offset in it."""

    inode: int
    offset: int


def _token(value: object, fallback: str) -> str:
    """A short identifier from an untrusted field, or the fallback."""
    return value if isinstance(value, str) and _TOKEN.fullmatch(value) else fallback


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def wake_text(note: Notification) -> str | None:
    """One sentence for the agent, or None when the line is not a task card wake."""
    state = note.extra.get("state")
    watch = _token(note.extra.get("watch_id") or note.ref_id, "your watch")
    if note.source == SOURCE_ERROR and state == "error":
        code = _token(note.extra.get("code"), "an error")
        return (
            f"Task card: watch {watch} failed to refresh ({code}); the card keeps its last "
            f"good body. Call task_card inspect with watch_id {watch} to see why, then fix "
            "the renderer and retry."
        )
    if note.source == SOURCE_ERROR and state == "recovered":
        replaced_by = _token(note.extra.get("replaced_by"), "")
        if replaced_by:  # the failed watch ended; a new one published (notifications.py)
            return f"Task card: watch {replaced_by} publishes the card; watch {watch} had failed."
        return f"Task card: watch {watch} publishes again."
    if note.source == SOURCE_LIMIT and state == "limit":
        budget = _count(note.extra.get("max_refreshes"))
        used = (
            f"all {counted(budget, 'refresh', 'refreshes')}"
            if budget is not None
            else "its refresh budget"
        )
        return (
            f"Task card: watch {watch} used {used} and stopped. Start a new watch if the work "
            "goes on, or remove the card if it is done."
        )
    if note.source == SOURCE_REMINDER and state == "reminder":
        turns = _count(note.extra.get("turns"))
        quiet = counted(turns, "turn", "turns") if turns is not None else "Many turns"
        return (
            f"Task Card reminder: {quiet} passed without a card update. Check whether your "
            "card is absent or stale; update it, or remove it if the work is done."
        )
    return None


def select_wakes(notes: list[Notification]) -> list[str]:
    """The texts to deliver: reminders cleared within the same batch are dropped."""
    cleared = {
        str(note.extra.get("clears"))
        for note in notes
        if note.source == SOURCE_REMINDER and note.extra.get("state") == "reminder_cleared"
    }
    texts = [text for note in notes if note.id not in cleared and (text := wake_text(note))]
    if len(texts) > MAX_WAKES:
        skipped = len(texts) - MAX_WAKES
        texts = [*texts[-MAX_WAKES:], f"({skipped} earlier task card notices not shown)"]
    return texts


class WakeReader:
    """Reads the wakes a named consumer has not been given yet, and advances its cursor."""

    def __init__(self, paths: CardPaths, consumer: str) -> None:
        if not _CONSUMER.fullmatch(consumer):
            raise ValueError(f"consumer name {consumer!r}: use lowercase letters and digits")
        self._paths = paths
        self._cursor_path = paths.notification_dir / CURSOR_DIR / f"{consumer}.json"

    def prime(self) -> None:
        """Place the cursor at the end if this consumer has none yet (a first session)."""
        with self._locked():
            if self._load() is None:
                self._save(self._read_from(None)[1])

    def take(self) -> list[str]:
        """New wake texts since the last call (none on the very first call)."""
        with self._locked():
            cursor = self._load()
            data, new_cursor = self._read_from(cursor)
            if new_cursor != cursor:
                self._save(new_cursor)
        if cursor is None:
            return []
        notes = [note for line in data.splitlines() if (note := parse_notification(line))]
        return select_wakes(notes)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        workdir = self._paths.workdir
        make_folder(self._cursor_path.parent, inside=workdir)
        lock = self._cursor_path.with_name(f".{self._cursor_path.name}.lock")
        fd = open_lock(lock, inside=workdir)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _load(self) -> Cursor | None:
        try:
            data = json.loads(read_regular(self._cursor_path, 4096))
            cursor = Cursor(inode=int(data["inode"]), offset=int(data["offset"]))
        except (OSError, ValueError, KeyError, TypeError, RecursionError, OverflowError):
            return None  # `1e999` reads as infinity, which no `int` is
        # An offset before the start (edited by hand) fails every read: placed anew instead.
        return cursor if cursor.inode >= 0 and cursor.offset >= 0 else None

    def _save(self, cursor: Cursor) -> None:
        record = {"inode": cursor.inode, "offset": cursor.offset}
        atomic_write(self._cursor_path, json.dumps(record).encode(), durable=False)

    def _read_from(self, cursor: Cursor | None) -> tuple[bytes, Cursor]:
        """The unread bytes (whole lines only) and the cursor after them.

        Each file is opened once, and only when it is a regular file inside the workdir once
        symlinks are resolved (anything may write there: a link to a file elsewhere is never
        read). Its inode and size come from the descriptor it is read through, so a rotation
        between a look and a read cannot pair one file's inode with another's bytes.
        """
        current = self._paths.notifications
        rotated = current.with_name(current.name + ".1")
        workdir = self._paths.workdir
        try:
            handle = open_regular(current, inside=workdir)
        except OSError:
            # Nothing yet (or nothing that may be read: a link out of the workdir, a pipe): a
            # cursor at offset 0 of "no file" reads the file from its start once there is one.
            return b"", cursor or Cursor(inode=0, offset=0)
        with handle:
            stat = os.fstat(handle.fileno())
            if cursor is None:
                return b"", Cursor(inode=stat.st_ino, offset=stat.st_size)
            chunks = b""
            offset = cursor.offset
            if cursor.inode != stat.st_ino:
                # Inode 0: there was no file when the cursor was placed, so all of it is new.
                with contextlib.suppress(OSError), open_regular(rotated, inside=workdir) as old:
                    if cursor.inode in (0, os.fstat(old.fileno()).st_ino):
                        chunks = _read_lines(old, offset if cursor.inode else 0)[0]
                offset = 0
            elif stat.st_size < offset:
                offset = 0  # truncated in place: start over
            data, end = _read_lines(handle, offset)
        return chunks + data, Cursor(inode=stat.st_ino, offset=end)


def _read_lines(handle: BinaryIO, offset: int) -> tuple[bytes, int]:
    """Whole lines from `offset`, at most `MAX_READ_BYTES`; the offset after the last line."""
    try:
        handle.seek(offset)
        data = handle.read(MAX_READ_BYTES)
    except OSError:
        return b"", offset
    cut = data.rfind(b"\n") + 1
    if cut == 0 and len(data) >= MAX_READ_BYTES:
        cut = len(data)  # one absurd line: skip it rather than stall on it forever
    return data[:cut], offset + cut
