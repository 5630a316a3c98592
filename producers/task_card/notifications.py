"""The typed notification port of the task card, and its default file implementation.

Task card code can only say *which* typed event happened (an error episode, a recovery, a
limit, a reminder); the port decides the wire source, the channel (always `system`) and the
idempotency key. There is no free-form source, channel or extra, so this capability cannot
publish into another producer's namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from taskcard.producers.task_card.contract import (
    NOTIFICATION_LOCK_FILE,
    NOTIFICATION_ROTATE_BYTES,
    SOURCE_ERROR,
    SOURCE_LIMIT,
    SOURCE_REMINDER,
    CardPaths,
    append_jsonl_line,
    counted,
    make_folder,
    open_lock,
    read_regular,
    utc_now_iso,
)


@dataclass(frozen=True)
class TaskCardErrorNotification:
    watch_id: str
    epoch: int
    code: str
    message: str


@dataclass(frozen=True)
class TaskCardRecoveredNotification:
    """The end of `watch_id`'s error episode `epoch`: a render of that watch published again,
    or (`replaced_by`) the card's next watch did, started after `watch_id` ended in error."""

    watch_id: str
    epoch: int
    replaced_by: str | None = None


@dataclass(frozen=True)
class TaskCardLimitNotification:
    watch_id: str
    max_refreshes: int


TaskCardNotification = (
    TaskCardErrorNotification | TaskCardRecoveredNotification | TaskCardLimitNotification
)


def idempotency_key(event: TaskCardNotification) -> str:
    """One key per episode, per recovery, per limit; keys survive restarts (epochs persist)."""
    if isinstance(event, TaskCardErrorNotification):
        return f"task_card.error:{event.watch_id}:{event.epoch}:{event.code}"
    if isinstance(event, TaskCardRecoveredNotification):
        return f"task_card.recovered:{event.watch_id}:{event.epoch}"
    return f"task_card.limit:{event.watch_id}:{event.max_refreshes}"


class NotificationPort(Protocol):
    """Everything the task card may tell the system channel."""

    def notify(self, event: TaskCardNotification) -> None: ...

    def submit_reminder(self, turns: int, watch_id: str | None) -> str: ...

    def clear_reminder(self, pending: Collection[str] = ()) -> None: ...


def _record(event: TaskCardNotification) -> dict[str, Any]:
    if isinstance(event, TaskCardErrorNotification):
        return {
            "source": SOURCE_ERROR,
            "priority": "high",
            "header": "Task card renderer error",
            "body": f"Watch {event.watch_id} failed to refresh ({event.code}); "
            "the last valid body stays on the card.",
            "extra": {"state": "error", "watch_id": event.watch_id, "code": event.code},
        }
    if isinstance(event, TaskCardRecoveredNotification):
        if event.replaced_by is not None:
            return {
                "source": SOURCE_ERROR,
                "priority": "normal",
                "header": "Task card recovered",
                "body": f"Watch {event.watch_id} ended in error; watch {event.replaced_by}"
                " publishes the card now.",
                "extra": {
                    "state": "recovered",
                    "watch_id": event.watch_id,
                    "replaced_by": event.replaced_by,
                },
            }
        return {
            "source": SOURCE_ERROR,
            "priority": "normal",
            "header": "Task card recovered",
            "body": f"Watch {event.watch_id} publishes again.",
            "extra": {"state": "recovered", "watch_id": event.watch_id},
        }
    return {
        "source": SOURCE_LIMIT,
        "priority": "normal",
        "header": "Task card refresh budget exhausted",
        "body": f"Watch {event.watch_id} used all"
        f" {counted(event.max_refreshes, 'refresh', 'refreshes')} and stopped.",
        "extra": {
            "state": "limit",
            "watch_id": event.watch_id,
            "max_refreshes": event.max_refreshes,
        },
    }


class FileNotificationPort:
    """Appends to `.notification/system.jsonl`: deduped by id, rotated past a size bound."""

    def __init__(self, paths: CardPaths, rotate_bytes: int = NOTIFICATION_ROTATE_BYTES) -> None:
        self._paths = paths
        self._rotate_bytes = rotate_bytes
        self._lock = threading.Lock()
        self._pending_reminder: str | None = None

    def notify(self, event: TaskCardNotification) -> None:
        record = _record(event)
        self._append(idempotency_key(event), event.watch_id, record)

    def submit_reminder(self, turns: int, watch_id: str | None) -> str:
        """Append a reminder; its id, for `clear_reminder` in whichever process publishes."""
        key = f"task_card.reminder:{uuid.uuid4().hex}"
        self._append(
            key,
            watch_id or "",
            {
                "source": SOURCE_REMINDER,
                "priority": "normal",
                "header": "Task Card reminder",
                "body": f"{counted(turns, 'turn', 'turns')} without a task card update: check"
                " whether the card is "
                "absent or stale, then update it, or remove it if the work is done.",
                "extra": {"state": "reminder", "watch_id": watch_id or "", "turns": turns},
            },
        )
        self._pending_reminder = key
        return key

    def clear_reminder(self, pending: Collection[str] = ()) -> None:
        """Retract the pending reminders: a reader drops a reminder whose id a later line
        clears. `pending` names those other processes submitted (the hooks'; `turns.py`)."""
        own, self._pending_reminder = self._pending_reminder, None
        keys = dict.fromkeys((*pending, *((own,) if own is not None else ())))
        for key in keys:
            self._append(
                f"{key}:cleared",
                "",
                {
                    "source": SOURCE_REMINDER,
                    "priority": "normal",
                    "header": "Task Card reminder cleared",
                    "body": "The card was published again.",
                    "extra": {"state": "reminder_cleared", "watch_id": "", "clears": key},
                },
            )

    def _known_ids(self) -> set[str]:
        ids: set[str] = set()
        current = self._paths.notifications
        for path in (current.with_name(current.name + ".1"), current):
            try:
                data = read_regular(path, 2 * NOTIFICATION_ROTATE_BYTES, inside=self._paths.workdir)
            except OSError:
                continue
            for line in data.splitlines():
                try:
                    ident = json.loads(line).get("id")
                except (ValueError, AttributeError, RecursionError):
                    continue
                if isinstance(ident, str):
                    ids.add(ident)
        return ids

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Held around the dedupe, the rotation and the append: by the threads of this process
        (the lock) and by every other process writing the file (an `flock` on
        `.notification/.system.jsonl.lock`: the host, a CLI call, a hook, the ledger). Without
        it, two writers that both found the file past its size rotated it twice, the second
        `os.replace` putting the first one's fresh file over `system.jsonl.1`: the lines not
        yet read there were lost. The kernel drops the `flock` of a writer that dies."""
        workdir = self._paths.workdir
        path = self._paths.notifications
        with self._lock:
            make_folder(path.parent, inside=workdir)
            fd = open_lock(path.with_name(NOTIFICATION_LOCK_FILE), inside=workdir)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _append(self, key: str, ref_id: str, record: dict[str, Any]) -> None:
        path: Path = self._paths.notifications
        with self._writing():
            if key in self._known_ids():
                return
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size >= self._rotate_bytes:
                os.replace(path, path.with_name(path.name + ".1"))
            line = {"id": key, "channel": "system", "ref_id": ref_id, **record, "at": utc_now_iso()}
            append_jsonl_line(path, line, inside=self._paths.workdir)
