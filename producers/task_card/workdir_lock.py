"""One host per workdir, whichever runtime folder each caller picked.

The host's lock and socket live in the runtime folder (`runtime.py`), named by a hash of the
workdir. But that folder comes from the caller's environment (`--runtime-dir`,
`$TASKCARD_RUNTIME_DIR`, `$XDG_RUNTIME_DIR`), and environments differ: a login shell has
`XDG_RUNTIME_DIR`, a cron job or an MCP client started from a desktop may not. Two callers
with two folders used to start two hosts on one workdir, both resuming the same watch from
`watch.json`, both rendering and spending its budget. So the host also holds an `flock` on
`taskcard/.host.lock` inside the workdir, the one place every caller agrees on, and writes
there which pid and runtime folder hold it, so a refused caller can say where the host is.

The file is opened without following symlinks and without blocking, and must be a regular
file with no other name (a hard link planted there would be truncated). When it cannot be
used at all (a read-only workdir, a folder planted at its name) the host runs on the runtime
lock alone, as before, and logs why: refusing to start would stop the card for a problem the
runtime lock still mostly covers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from taskcard.producers.task_card.contract import HOST_LOCK_FILE, TASKCARD_DIR, read_regular

log = logging.getLogger(__name__)

_MAX_LOCK_BYTES: Final = 4096


@dataclass(frozen=True)
class Holder:
    """Who holds a workdir, as the holder wrote it; fields are None when unreadable."""

    pid: int | None
    runtime_dir: str | None

    def describe(self, workdir: Path) -> str:
        pid = self.pid if self.pid is not None else "unknown"
        where = self.runtime_dir or "unknown"
        return (
            f"a task_card host already runs for {workdir} (pid {pid}, runtime dir {where}); "
            f"talk to it through the same runtime dir (TASKCARD_RUNTIME_DIR={where} or "
            "--runtime-dir), or stop it first"
        )


class WorkdirHeld(RuntimeError):
    """Another host holds the workdir's lock."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(holder)
        self.holder = holder


def lock_path(workdir: Path) -> Path:
    return workdir / TASKCARD_DIR / HOST_LOCK_FILE


def parse_holder(raw: bytes) -> Holder:
    """The holder record, total: anything malformed becomes unknown fields. Pure."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return Holder(None, None)
    pid = data.get("pid")
    runtime_dir = data.get("runtime_dir")
    return Holder(
        pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
        runtime_dir if isinstance(runtime_dir, str) and runtime_dir else None,
    )


def read_holder(workdir: Path) -> Holder | None:
    """What the lock file says, None when there is none (or it cannot be read)."""
    try:
        return parse_holder(read_regular(lock_path(workdir), _MAX_LOCK_BYTES, follow=False))
    except OSError:
        return None


def acquire(workdir: Path, runtime_dir: Path) -> int | None:
    """The held lock's descriptor; None when the file cannot be used. Raises `WorkdirHeld`."""
    path = lock_path(workdir)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        with contextlib.suppress(FileExistsError):
            path.parent.mkdir()
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        log.warning("no workdir lock at %s (%s); the runtime lock alone", path, exc.strerror)
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        # A hard link planted at the name is another file's inode: truncating it would empty
        # that file, wherever it lives.
        os.close(fd)
        log.warning(
            "no workdir lock: %s is not a regular file of its own; the runtime lock alone", path
        )
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raw = os.pread(fd, _MAX_LOCK_BYTES, 0)
        os.close(fd)
        raise WorkdirHeld(parse_holder(raw)) from None
    record = json.dumps({"pid": os.getpid(), "runtime_dir": str(runtime_dir)}).encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
    except OSError as exc:  # the lock holds without its note; a refused caller says "unknown"
        log.warning("cannot write the holder into %s (%s)", path, exc.strerror)
    return fd


def release(fd: int | None) -> None:
    if fd is None:
        return
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
