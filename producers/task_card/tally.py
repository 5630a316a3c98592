"""`.taskcard-host/refreshes`: the refresh budget spent since `watch.json` was last written.

Every refresh spends one unit of the watch's budget, and a host killed with SIGKILL must come
back with exactly the budget it had. Rewriting `watch.json` on every tick did that, but it
cost a temporary file, a rename and a JSON encoding per tick (about 0.3 ms of host CPU, a
third of a tick), and each rewrite made the projection service read the descriptor again.
The tally is one line appended to an open file per refresh instead::

    tc_7          the watch the lines belong to
    12            refreshes_used after each spent refresh, one per line
    13

Rules: `watch.json` stays the source of everything else and is still written whenever a
field other than `refreshes_used` changes; the tally is rewritten (header and current count,
atomically) right after every descriptor write, and when it passes `MAX_TALLY_BYTES`. On
resume the budget used is the larger of the descriptor's and the tally's last complete line,
when the header names the same watch, so a crash between the two writes never gives budget
back. The write reaches the page cache, so a killed process loses nothing; like the per-tick
descriptor before it, only a power cut may roll the count back to an earlier value.

The file lives in the agent's workdir, so it is untrusted on read (a regular file only, never
through a symbolic link, which only a planter makes: the host creates the tally by rename;
bounded, parsed totally; a value past the watch's ceiling is ignored) and opened for append
with `O_NOFOLLOW | O_NONBLOCK` and checked with `fstat`, so a planted pipe or link is never
written through. When anything about it fails the caller falls back to rewriting
`watch.json` per tick.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

from taskcard.producers.task_card.contract import (
    TALLY_FILE,
    CardPaths,
    OutsideWorkdir,
    atomic_write,
    is_inside,
    make_folder,
    read_regular,
)

MAX_TALLY_BYTES: Final = 4096
_APPEND_FLAGS: Final = (
    os.O_WRONLY
    | os.O_APPEND
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def parse_tally(raw: bytes, watch_id: str, ceiling: int) -> int | None:
    """The last count recorded for `watch_id`, or None. Pure and total.

    Only complete lines count (a torn last line is ignored); the header must name the watch;
    a count must be a plain decimal from 0 to `ceiling`.
    """
    lines = raw.split(b"\n")
    if len(lines) < 3 or lines[0] != watch_id.encode():
        return None
    last = lines[-2]  # what follows the last newline is a torn line, never counted
    if not (last.isdigit() and len(last) <= 9):
        return None
    value = int(last)
    return value if value <= ceiling else None


def host_folder(paths: CardPaths) -> None:
    """The host's private folder created if missing, only inside the workdir once links are
    resolved; raises `OutsideWorkdir` (naming the folder) otherwise, and nothing is created."""
    try:
        make_folder(paths.host_dir, inside=paths.workdir)
    except OutsideWorkdir as exc:
        raise OutsideWorkdir(exc.errno, exc.strerror, str(paths.host_dir)) from None


def _inside(paths: CardPaths, folder: Path) -> bool:
    return is_inside(os.path.realpath(paths.workdir), os.path.realpath(folder))


def remove_legacy(paths: CardPaths, path: Path) -> None:
    """An earlier version's file of the host removed from `taskcard/` (its replacement is
    written); one that cannot be removed is left, and still read in its place. One `lstat`
    when there is none; never through a `taskcard/` swapped for a link out of the workdir,
    where it would remove another agent's file of that name."""
    if os.path.lexists(path) and _inside(paths, path.parent):
        with contextlib.suppress(OSError):
            os.unlink(path)


def read_tally(paths: CardPaths, watch_id: str, ceiling: int) -> int | None:
    """The tally's count for `watch_id`; None when missing, unusable or for another watch.
    The old `taskcard/.refreshes` is read when the tally is missing (an upgraded workdir)."""
    for path in (paths.tally, paths.legacy_tally):
        try:
            raw = read_regular(path, 2 * MAX_TALLY_BYTES + 1, follow=False)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        if len(raw) > 2 * MAX_TALLY_BYTES:
            return None
        return parse_tally(raw, watch_id, ceiling)
    return None


def clear_tally(paths: CardPaths) -> None:
    """The tally removed (an earlier version's too); never through a host folder swapped for
    a link out of the workdir, where it would remove another folder's file of that name."""
    if _inside(paths, paths.host_dir):
        with contextlib.suppress(OSError):
            os.unlink(paths.tally)
    remove_legacy(paths, paths.legacy_tally)


class RefreshTally:
    """The open tally of one watch. Raises `OSError` when it cannot be used; callers fall back."""

    def __init__(self, paths: CardPaths, watch_id: str, used: int) -> None:
        self._paths = paths
        self._watch_id = watch_id
        self._fd: int | None = None
        self._size = 0
        self.restart(used)

    def restart(self, used: int) -> None:
        """Header and current count only, replaced atomically (after a descriptor write)."""
        self.close()
        path = self._paths.tally
        data = f"{self._watch_id}\n{used}\n".encode()
        host_folder(self._paths)
        atomic_write(path, data, durable=False)
        remove_legacy(self._paths, self._paths.legacy_tally)
        fd = os.open(path, _APPEND_FLAGS)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(f"{TALLY_FILE} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._size = info.st_size

    def record(self, used: int) -> None:
        """One spent refresh: a single append (a few microseconds)."""
        if self._fd is None:
            raise OSError(f"{TALLY_FILE} is closed")
        line = f"{used}\n".encode()
        if self._size + len(line) > MAX_TALLY_BYTES:
            self.restart(used)
            return
        written = os.write(self._fd, line)
        self._size += written
        if written != len(line):
            raise OSError(f"short write to {TALLY_FILE}")

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
