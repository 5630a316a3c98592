"""Completed turns without a publication, shared by the host and the agent-host hooks.

Reminders count completed turns. Those are seen by the agent host (a Claude Code `Stop`
hook, a Codex `notify` call), which runs as a short process of its own, often while no task
card host runs at all (no card, or a card that was removed): exactly when a reminder matters.
So the count lives in a small file, `.notification/turns.json`, updated under an advisory
lock by whoever sees the event: hooks add turns, the host resets the count on every
publication. The file is absent while the count is zero and no reminder waits, so a
refreshing watch pays one failed `open` per publication and nothing more.

The file also keeps the ids of the reminders submitted since the last publication
(`reminders`, the latest 16) until a publication takes them (`reset_turns`), so the host
retracts the reminders the hooks wrote: the port's own memory of one lived only in the
process that wrote it, and an agent that started its card after a hook's reminder was still
told, with the very result of that start, that it had none.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from taskcard.producers.task_card.contract import (
    CardPaths,
    atomic_write,
    make_folder,
    open_lock,
    read_regular,
)

TURNS_FILE: Final = "turns.json"
# Reminders kept for the next publication to clear: as many as a consumer is given at once
# (`wakes.MAX_WAKES`), and a few more; the file stays within one small read.
MAX_KEPT_REMINDERS: Final = 16
_LOCK_FILE: Final = ".turns.lock"


@contextlib.contextmanager
def _locked(paths: CardPaths) -> Iterator[None]:
    make_folder(paths.notification_dir, inside=paths.workdir)
    fd = open_lock(paths.notification_dir / _LOCK_FILE, inside=paths.workdir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_state(path: Path) -> tuple[int, tuple[str, ...]]:
    """(turns counted, the ids of the reminders waiting to be cleared)."""
    try:
        data = json.loads(read_regular(path, 4096))
    except (OSError, ValueError, RecursionError):
        return 0, ()
    if not isinstance(data, dict):
        return 0, ()
    turns, reminders = data.get("turns"), data.get("reminders")
    count = turns if isinstance(turns, int) and not isinstance(turns, bool) and turns > 0 else 0
    if not isinstance(reminders, list):
        return count, ()
    return count, tuple(key for key in reminders if isinstance(key, str) and key)


def _write_state(path: Path, count: int, reminders: tuple[str, ...]) -> None:
    state: dict[str, object] = {"turns": count}
    if reminders:
        state["reminders"] = list(reminders[-MAX_KEPT_REMINDERS:])
    atomic_write(path, json.dumps(state).encode(), durable=False)


def _read_count(path: Path) -> int:
    return _read_state(path)[0]


def turns_path(paths: CardPaths) -> Path:
    return paths.notification_dir / TURNS_FILE


def add_completed_turn(paths: CardPaths, threshold: int) -> int | None:
    """Count one completed turn; the count when it reaches `threshold` (then it restarts)."""
    path = turns_path(paths)
    with _locked(paths):
        count, reminders = _read_state(path)
        count += 1
        if count >= threshold:
            if reminders:
                _write_state(path, 0, reminders)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            return count
        _write_state(path, count, reminders)
        return None


def keep_reminder(paths: CardPaths, reminder: str) -> None:
    """Note the reminder just submitted, for the next publication to clear."""
    path = turns_path(paths)
    with _locked(paths):
        count, reminders = _read_state(path)
        _write_state(path, count, (*reminders, reminder))


def reset_turns(paths: CardPaths) -> tuple[str, ...]:
    """A publication: the count restarts at zero; the ids of the reminders it clears."""
    path = turns_path(paths)
    if not path.exists():
        return ()
    with _locked(paths):
        reminders = _read_state(path)[1]
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return reminders


def completed_turns(paths: CardPaths) -> int:
    """The current count (for tests and `inspect`-like views)."""
    return _read_count(turns_path(paths))
