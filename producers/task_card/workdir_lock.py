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

The folder is opened first and the lock file relative to it, and the kernel's path of the
opened folder must lie inside the resolved workdir. A `taskcard` symlink leading elsewhere
(to another agent's card folder, to a folder someone else holds a lock in) would make the
host wait on a foreign lock, or put its card there; that is `CardFolderOutside`, and the host
does not start (a link that stays inside the workdir is followed).

The note also says how to recognise the holder's renders (`renders`: the random tag every
renderer it starts carries in its environment, `renderer.RENDER_HOST_ENV`), on which boot and
for which workdir. A host that ends cleanly empties the note before it lets go of the lock. A
host killed with SIGKILL cannot, and its renderer may still be running (in its own session, for
its whole timeout or for ever); so the next host reads the note it finds before writing its
own, and when it names this workdir on this boot, ends what those renders left running before
it renders anything (`Holder.leftover_tag`, `renderer.end_leftover_renders`). The note is in the
agent's workdir, so it is read as untrusted text: a copied workdir carries a note naming the
original's path, and is ignored.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from taskcard.producers.task_card.contract import HOST_LOCK_FILE, TASKCARD_DIR, is_inside

log = logging.getLogger(__name__)

_MAX_LOCK_BYTES: Final = 4096
_TAG_RE: Final = re.compile(r"^[0-9a-f]{32}$")
_BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """This boot's id (Linux), None when it cannot be read: processes never outlive a boot."""
    try:
        with open(_BOOT_ID_PATH, "rb") as file:
            value = file.read(64).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value or None


@dataclass(frozen=True)
class Holder:
    """Who holds a workdir, as the holder wrote it; fields are None when unreadable."""

    pid: int | None
    runtime_dir: str | None
    renders: str | None = None  # the tag its renders carry (`renderer.RENDER_HOST_ENV`)
    boot: str | None = None  # the boot it ran in
    workdir: str | None = None  # the resolved workdir it held

    def leftover_tag(self, workdir: Path, boot: str | None) -> str | None:
        """The tag of renders this note's host may have left running in `workdir`, or None.

        Only a note left behind (a clean end empties it) by a host of this very workdir (a
        copied workdir carries the original's note) on this boot (no process outlives one)."""
        if self.renders is None or boot is None or self.boot != boot:
            return None
        return self.renders if self.workdir == str(workdir) else None

    def describe(self, workdir: Path) -> str:
        pid = self.pid if self.pid is not None else "unknown"
        where = self.runtime_dir or "unknown"
        return (
            f"a task_card host already runs for {workdir} (pid {pid}, runtime dir {where}); "
            f"talk to it through the same runtime dir (TASKCARD_RUNTIME_DIR={where} or "
            "--runtime-dir), or stop it first"
        )


class CardFolderOutside(RuntimeError):
    """The workdir's `taskcard/` folder leads out of the workdir; the text names the fix."""


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
    renders = data.get("renders")
    boot = data.get("boot")
    workdir = data.get("workdir")
    return Holder(
        pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
        runtime_dir if isinstance(runtime_dir, str) and runtime_dir else None,
        renders if isinstance(renders, str) and _TAG_RE.match(renders) else None,
        boot if isinstance(boot, str) and 0 < len(boot) <= 64 else None,
        workdir if isinstance(workdir, str) and workdir else None,
    )


def open_card_folder(workdir: Path, *, create: bool) -> int | None:
    """A descriptor of `<workdir>/taskcard/` (None when missing and not created).

    Raises `CardFolderOutside` when the folder opened (after any symlink) is not inside the
    resolved workdir, and `OSError` when it cannot be opened."""
    folder = workdir / TASKCARD_DIR
    if create:
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        opened = os.path.realpath(folder)  # no /proc: the resolved path is what we have
    if not is_inside(os.path.realpath(workdir), opened):
        os.close(fd)
        raise CardFolderOutside(
            f"{folder} is a symlink that leads out of the workdir; the host keeps its lock and "
            "the card there, so make it a real folder inside the workdir (remove the link)"
        )
    return fd


def read_holder(workdir: Path) -> Holder | None:
    """What the lock file says, None when there is none (or it cannot be read)."""
    try:
        folder = open_card_folder(workdir, create=False)
    except (OSError, CardFolderOutside):
        return None
    if folder is None:
        return None
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(HOST_LOCK_FILE, flags, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return parse_holder(os.read(fd, _MAX_LOCK_BYTES))
    except OSError:
        return None
    finally:
        os.close(fd)


def acquire(
    workdir: Path, runtime_dir: Path, renders: str | None = None
) -> tuple[int | None, Holder | None]:
    """The held lock's descriptor (None when the file cannot be used) and the note a previous
    holder left in it (None when it ended cleanly, or there was none). `renders` is the tag
    this holder's renders carry. Raises `WorkdirHeld`, and `CardFolderOutside` when
    `taskcard/` leads out of the workdir."""
    path = lock_path(workdir)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        folder = open_card_folder(workdir, create=True)
        assert folder is not None
    except OSError as exc:
        log.warning("no workdir lock at %s (%s); the runtime lock alone", path, exc.strerror)
        return None, None
    try:
        fd = os.open(HOST_LOCK_FILE, flags, 0o644, dir_fd=folder)
    except OSError as exc:
        log.warning("no workdir lock at %s (%s); the runtime lock alone", path, exc.strerror)
        return None, None
    finally:
        os.close(folder)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        # A hard link planted at the name is another file's inode: truncating it would empty
        # that file, wherever it lives.
        os.close(fd)
        log.warning(
            "no workdir lock: %s is not a regular file of its own; the runtime lock alone", path
        )
        return None, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raw = os.pread(fd, _MAX_LOCK_BYTES, 0)
        os.close(fd)
        raise WorkdirHeld(parse_holder(raw)) from None
    try:
        left = os.pread(fd, _MAX_LOCK_BYTES, 0)
    except OSError:
        left = b""
    previous = parse_holder(left) if left.strip() else None
    note: dict[str, object] = {"pid": os.getpid(), "runtime_dir": str(runtime_dir)}
    if renders is not None:
        note.update(renders=renders, boot=boot_id(), workdir=str(workdir))
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(note).encode(), 0)
    except OSError as exc:  # the lock holds without its note; a refused caller says "unknown"
        log.warning("cannot write the holder into %s (%s)", path, exc.strerror)
    return fd, previous


def release(fd: int | None) -> None:
    """Let go of the lock, emptying the note first: a clean end left no render running."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
