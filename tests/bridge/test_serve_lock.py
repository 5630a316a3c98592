"""The serve lock's record of the state folders it made, which a refused start removes."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from taskcard.bridge.run.runner import ServeLock


def test_the_lock_counts_the_folders_its_own_start_made(tmp_path: Path) -> None:
    lock = ServeLock(tmp_path / "state" / "deep")
    assert lock.acquire() is None
    try:
        assert lock.made == [tmp_path / "state" / "deep", tmp_path / "state"]
    finally:
        lock.release()
    again = ServeLock(tmp_path / "state" / "deep")
    assert again.acquire() is None
    try:
        assert again.made == []  # there already: not this start's
    finally:
        again.release()


def test_folders_made_while_another_serve_held_the_lock_are_not_counted(tmp_path: Path) -> None:
    """A start that waits for another serve may find the folder taken away and make it again
    once the other is gone; the state in it may be that serve's, so it is not this start's
    to remove (it counted the folder as made when it first looked, and deleted another
    serve's state on a refusal)."""
    state = tmp_path / "state"
    state.mkdir()
    other = os.open(state / ServeLock.FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.pwrite(other, b"4242", 0)
    lock = ServeLock(state)
    assert lock.acquire() == "4242"
    os.close(other)
    (state / ServeLock.FILE).unlink()
    state.rmdir()
    assert lock.acquire() is None  # made the folder again, this time
    try:
        assert state.is_dir()
        assert lock.made == []
    finally:
        lock.release()
