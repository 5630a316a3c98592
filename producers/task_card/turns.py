"""Completed turns without a publication, shared by the host and the agent-host hooks.

Reminders count completed turns. Those are seen by the agent host (a Claude Code `Stop`
hook, a Codex `notify` call), which runs as a short process of its own, often while no task
card host runs at all (no card, or a card that was removed): exactly when a reminder matters.
So the count lives in a small file, `.notification/turns.json`, updated under an advisory
lock by whoever sees the event: hooks add turns, the host resets the count on every
publication. The file is absent while the count is zero, so a refreshing watch pays one failed
`open` per publication and nothing more.
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


def _read_count(path: Path) -> int:
    try:
        data = json.loads(read_regular(path, 4096))
    except (OSError, ValueError, RecursionError):
        return 0
    turns = data.get("turns") if isinstance(data, dict) else None
    return turns if isinstance(turns, int) and not isinstance(turns, bool) and turns > 0 else 0


def turns_path(paths: CardPaths) -> Path:
    return paths.notification_dir / TURNS_FILE


def add_completed_turn(paths: CardPaths, threshold: int) -> int | None:
    """Count one completed turn; the count when it reaches `threshold` (then it restarts)."""
    path = turns_path(paths)
    with _locked(paths):
        count = _read_count(path) + 1
        if count >= threshold:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return count
        atomic_write(path, json.dumps({"turns": count}).encode(), durable=False)
        return None


def reset_turns(paths: CardPaths) -> bool:
    """A publication: the count restarts at zero. True when there were turns counted."""
    path = turns_path(paths)
    if not path.exists():
        return False
    with _locked(paths), contextlib.suppress(FileNotFoundError):
        path.unlink()
        return True
    return False


def completed_turns(paths: CardPaths) -> int:
    """The current count (for tests and `inspect`-like views)."""
    return _read_count(turns_path(paths))
