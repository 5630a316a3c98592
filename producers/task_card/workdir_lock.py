"""One host per workdir, whichever runtime folder each caller picked.

The host's lock and socket live in the runtime folder (`runtime.py`), named by a hash of the
workdir. But that folder comes from the caller's environment (`--runtime-dir`,
`$TASKCARD_RUNTIME_DIR`, `$XDG_RUNTIME_DIR`), and environments differ: a login shell has
`XDG_RUNTIME_DIR`, a cron job or an MCP client started from a desktop may not. Two callers
with two folders used to start two hosts on one workdir, both resuming the same watch from
`watch.json`, both rendering and spending its budget. So the host also holds an `flock` on
`.taskcard-host/lock` inside the workdir, the one place every caller agrees on, and writes
there which pid and runtime folder hold it, so a refused caller can say where the host is.
The folder is the host's private one (`contract.HOST_DIR`), beside `taskcard/` rather than in
it: the manual gives the capability exactly its card files there, and a shell `rm -r` of the
card folder no longer takes the lock with it.

The file is opened without following symlinks and without blocking, and must be a regular
file with no other name (a hard link planted there would be truncated). When it cannot be
used at all (a read-only workdir, a folder planted at its name or at the folder's) the host
runs on the runtime lock alone, as before, and logs why: refusing to start would stop the
card for a problem the runtime lock still mostly covers.

Both folders the host writes in, `.taskcard-host/` and `taskcard/`, are opened first (the lock
file relative to the first), and the kernel's path of each opened folder must lie inside the
resolved workdir. Either one a symlink leading elsewhere (to another agent's folder, to a
folder someone else holds a lock in) would make the host wait on a foreign lock, or put its
card there; that is `CardFolderOutside`, and the host does not start (a link that stays
inside the workdir is followed).

Earlier versions kept the lock at `taskcard/.host.lock`. While that file exists the host takes
its `flock` too, after its own: a host of the previous version still running on the workdir
(with another runtime folder) holds it, and the new one is refused as it would be by a host of
its own version. The host then writes its note there too and keeps both locked while it runs,
so a host of the previous version started meanwhile is refused and told where this one is;
a clean end removes the old name (still locked, so an old host that opened it just before
finds it held) and `taskcard/` is left with the manual's files only. (An old host started
after that creates the name anew and is not stopped by a later new host that never saw it:
see docs/producer.md for why that takes an old installation kept beside the new one.) When
the new lock cannot be used, the old one, if present, stands in for it and stays; where
`.taskcard-host/` cannot be made or written at all (a read-only workdir root beside a
writable `taskcard/`, a file at its name) the old lock is created for that, as the id counter
falls back to its old place then too.

The note also says whether the holder serves the card to other processes (`taskcard host`,
over its socket) or is a program running it through its own Python `TaskCard`, and names
that program (interpreter and script or module, never its arguments): a caller refused by
the latter is told so at once, as there is no socket to wait for (`Holder.describe`).

The note also says how to recognise the holder's renders (`renders`: the random tag every
renderer it starts carries in its environment, `renderer.RENDER_HOST_ENV`), on which boot and
for which workdir. A host that ends cleanly empties the note before it lets go of the lock. A
host killed with SIGKILL cannot, and its renderer may still be running (in its own session, for
its whole timeout or for ever); so the next host reads the notes it finds (in the old lock too)
before writing its own, and when one names this workdir on this boot, ends what those renders
left running before it renders anything (`Holder.leftover_tag`,
`renderer.end_leftover_renders`). The note is in the agent's workdir, so it is read as
untrusted text: a copied workdir carries a note naming the original's path, and is ignored.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from taskcard.producers.task_card.contract import (
    HOST_DIR,
    HOST_LOCK_FILE,
    LEGACY_HOST_LOCK_FILE,
    TASKCARD_DIR,
    is_inside,
)
from taskcard.producers.task_card.workdir_arg import shown_path

log = logging.getLogger(__name__)

_MAX_LOCK_BYTES: Final = 4096
_TAG_RE: Final = re.compile(r"[0-9a-f]{32}")
_BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
# The holder's command line as its note carries it, cut: enough to recognise the program.
_MAX_PROGRAM_CHARS: Final = 300


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
    # Whether a `taskcard host` serves the card to other processes over its socket (True), or
    # a program runs it in its own process through the Python `TaskCard` and answers nobody
    # else (False); None in a note of an earlier version, which said neither.
    served: bool | None = None
    program: str | None = None  # the holder's command line, cut

    def leftover_tag(self, workdir: Path, boot: str | None) -> str | None:
        """The tag of renders this note's host may have left running in `workdir`, or None.

        Only a note left behind (a clean end empties it) by a host of this very workdir (a
        copied workdir carries the original's note) on this boot (no process outlives one)."""
        if self.renders is None or boot is None or self.boot != boot:
            return None
        return self.renders if self.workdir == str(workdir) else None

    def describe(self, workdir: Path) -> str:
        pid = self.pid if self.pid is not None else "unknown"
        program = f": {shown_path(self.program)}" if self.program else ""
        if self.served is False:
            # Nothing to wait for and no socket to find: the program must let go first.
            return (
                f"{shown_path(workdir)} is held by a Python program's TaskCard (pid {pid}"
                f"{program}), which runs the card inside that program and takes no calls from"
                " other processes; make the call through that TaskCard, or end it (leave its"
                " `with TaskCard(...)` block, or call close()) and call again"
            )
        # Both names are the user's own: a runtime dir holding an escape acted on the
        # terminal that showed this line, and one of 100 KB came back whole, twice.
        where = shown_path(self.runtime_dir) if self.runtime_dir else "unknown"
        return (
            f"a task_card host already runs for {shown_path(workdir)} (pid {pid}{program},"
            f" runtime dir {where}); "
            f"talk to it through the same runtime dir (TASKCARD_RUNTIME_DIR={where} or "
            "--runtime-dir), or stop it first"
        )


class CardFolderOutside(RuntimeError):
    """The workdir's `taskcard/` or `.taskcard-host/` folder leads out of the workdir; the
    text names the folder and the fix."""


class WorkdirHeld(RuntimeError):
    """Another host holds the workdir's lock."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(holder)
        self.holder = holder


@dataclass
class WorkdirLock:
    """What `acquire` holds: the lock (None when it could not be used), the old lock of an
    earlier version (held, with this host's note, while the host runs; its name removed at a
    clean end unless it stands in for the lock), and the notes hosts that did not end cleanly
    left in either."""

    workdir: Path
    fd: int | None
    legacy_fd: int | None = None
    legacy_kept: bool = False  # the old lock stands in for the new one: its name stays
    previous: tuple[Holder, ...] = ()


def lock_path(workdir: Path) -> Path:
    return workdir / HOST_DIR / HOST_LOCK_FILE


def legacy_lock_path(workdir: Path) -> Path:
    return workdir / TASKCARD_DIR / LEGACY_HOST_LOCK_FILE


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
    served = data.get("served")
    program = data.get("program")
    return Holder(
        pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
        runtime_dir if isinstance(runtime_dir, str) and runtime_dir else None,
        renders if isinstance(renders, str) and _TAG_RE.fullmatch(renders) else None,
        boot if isinstance(boot, str) and 0 < len(boot) <= 64 else None,
        workdir if isinstance(workdir, str) and workdir else None,
        served if isinstance(served, bool) else None,
        program[:_MAX_PROGRAM_CHARS] if isinstance(program, str) and program else None,
    )


def _open_folder_inside(workdir: Path, name: str, *, create: bool, holds: str) -> int | None:
    """A descriptor of `<workdir>/<name>/` (None when missing and not created). Raises
    `CardFolderOutside` when the folder opened (after any symlink) is not inside the resolved
    workdir (`holds`: what the host keeps there, for the message), `OSError` when it cannot
    be opened."""
    folder = workdir / name
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
            f"{folder} is a symlink that leads out of the workdir; the host keeps {holds} "
            "there, so make it a real folder inside the workdir (remove the link)"
        )
    return fd


def open_card_folder(workdir: Path, *, create: bool) -> int | None:
    """A descriptor of `<workdir>/taskcard/`; see `_open_folder_inside`."""
    return _open_folder_inside(workdir, TASKCARD_DIR, create=create, holds="the card")


def open_host_folder(workdir: Path, *, create: bool) -> int | None:
    """A descriptor of `<workdir>/.taskcard-host/`; see `_open_folder_inside`."""
    return _open_folder_inside(
        workdir, HOST_DIR, create=create, holds="its lock and its bookkeeping"
    )


def check_folders(workdir: Path) -> None:
    """Raise `CardFolderOutside` when either folder the host writes in leads out of the
    workdir; anything else (missing, not a folder, unreadable) is the host's to report."""
    for opener in (open_card_folder, open_host_folder):
        try:
            fd = opener(workdir, create=False)
        except OSError:
            continue
        if fd is not None:
            os.close(fd)


def _read_note(workdir: Path, opener: Callable[..., int | None], name: str) -> Holder | None:
    try:
        folder = opener(workdir, create=False)
    except (OSError, CardFolderOutside):
        return None
    if folder is None:
        return None
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, flags, dir_fd=folder)
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


def read_holder(workdir: Path) -> Holder | None:
    """What the lock file says (the old one's note when only it names a pid), None when there
    is none (or it cannot be read)."""
    notes = [
        note
        for note in (
            _read_note(workdir, open_host_folder, HOST_LOCK_FILE),
            _read_note(workdir, open_card_folder, LEGACY_HOST_LOCK_FILE),
        )
        if note is not None
    ]
    named = [note for note in notes if note.pid is not None]
    return next(iter(named or notes), None)


def program_name(executable: str, argv0: str) -> str:
    """The program as the note names it: the interpreter and what Python made of the command
    line's program (`sys.argv[0]`: the script's path, the module's path for `-m`, `-c`, `-`
    for standard input), never anything else of it. The program's own arguments may carry a
    token, the interpreter's options may be glued to code (`-cimport os; ...`, `-Ic ...`)
    or to a module and its arguments, and the note is in the workdir. Pure."""
    shown = "-c ..." if argv0 == "-c" else argv0 or "(interactive)"
    return f"{executable or 'python'} {shown}"[:_MAX_PROGRAM_CHARS]


def _write_note(
    fd: int, path: Path, workdir: Path, runtime_dir: Path, renders: str | None, served: bool
) -> None:
    note: dict[str, object] = {
        "pid": os.getpid(),
        "runtime_dir": str(runtime_dir),
        "served": served,
        "program": program_name(sys.executable, sys.argv[0] if sys.argv else ""),
    }
    if renders is not None:
        note.update(renders=renders, boot=boot_id(), workdir=str(workdir))
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(note).encode(), 0)
    except OSError as exc:  # the lock holds without its note; a refused caller says "unknown"
        log.warning("cannot write the holder into %s (%s)", path, exc.strerror)


def _left_note(fd: int) -> Holder | None:
    """The note a holder that did not end cleanly left in the lock just taken, else None."""
    try:
        left = os.pread(fd, _MAX_LOCK_BYTES, 0)
    except OSError:
        left = b""
    return parse_holder(left) if left.strip() else None


def _lock(fd: int) -> None:
    """`flock` the descriptor, or close it and raise `WorkdirHeld` naming the holder."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raw = os.pread(fd, _MAX_LOCK_BYTES, 0)
        os.close(fd)
        raise WorkdirHeld(parse_holder(raw)) from None


def _own_regular_file(fd: int) -> bool:
    """A regular file with no other name: a hard link planted at a lock's name is another
    file's inode, and truncating it would empty that file, wherever it lives."""
    info = os.fstat(fd)
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


_NO_WRITES: Final = (errno.EROFS, errno.EACCES, errno.EPERM)


class _FolderUnusable(Exception):
    """`.taskcard-host/` cannot be made or written (not a link out, not a planted lock)."""


def _take_lock(workdir: Path) -> tuple[int | None, Holder | None]:
    """`.taskcard-host/lock` locked (None when it cannot be used) and the note left in it.
    Raises `WorkdirHeld`, `CardFolderOutside` when the folder leads out, and `_FolderUnusable`
    when the folder cannot be made or written (a read-only root, a file at its name)."""
    path = lock_path(workdir)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        folder = open_host_folder(workdir, create=True)
        assert folder is not None
    except OSError as exc:
        log.warning("no workdir lock at %s (%s)", path, exc.strerror)
        raise _FolderUnusable from None
    try:
        fd = os.open(HOST_LOCK_FILE, flags, 0o644, dir_fd=folder)
    except OSError as exc:
        log.warning("no workdir lock at %s (%s)", path, exc.strerror)
        if exc.errno in _NO_WRITES:
            raise _FolderUnusable from None
        log.warning("the runtime lock alone")
        return None, None
    finally:
        os.close(folder)
    if not _own_regular_file(fd):
        os.close(fd)
        log.warning(
            "no workdir lock: %s is not a regular file of its own; the runtime lock alone", path
        )
        return None, None
    _lock(fd)
    return fd, _left_note(fd)


def _take_legacy_lock(card_folder: int, *, create: bool) -> tuple[int | None, Holder | None]:
    """The old `taskcard/.host.lock` locked while it exists (never created), and the note in
    it; (None, None) when it is missing or is not a file an earlier host could have locked (a
    link, a pipe, a folder or a hard link planted there: those hosts refused such a file too).
    Raises `WorkdirHeld` when a host of an earlier version holds it."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    if create:
        flags |= os.O_CREAT
    try:
        fd = os.open(LEGACY_HOST_LOCK_FILE, flags, 0o644, dir_fd=card_folder)
    except OSError:
        return None, None
    if not _own_regular_file(fd):
        os.close(fd)
        return None, None
    _lock(fd)
    return fd, _left_note(fd)


def _remove_legacy_name(card_folder: int, fd: int) -> None:
    """Remove the old lock's name, when it still names the file we hold."""
    try:
        named = os.stat(LEGACY_HOST_LOCK_FILE, dir_fd=card_folder, follow_symlinks=False)
        held = os.fstat(fd)
        if (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            os.unlink(LEGACY_HOST_LOCK_FILE, dir_fd=card_folder)
    except OSError as exc:
        log.warning("cannot remove the old workdir lock taskcard/.host.lock (%s)", exc.strerror)


def acquire(
    workdir: Path, runtime_dir: Path, renders: str | None = None, *, served: bool = False
) -> WorkdirLock:
    """The workdir lock held, with the notes previous holders left (see the top). `renders`
    is the tag this holder's renders carry; `served`, whether a `taskcard host` serves the
    card to other processes (`Holder.served`). Raises `WorkdirHeld`, and `CardFolderOutside`
    when `taskcard/` or `.taskcard-host/` leads out of the workdir."""
    try:
        card_folder = open_card_folder(workdir, create=True)
    except OSError:
        card_folder = None  # not a folder, not creatable: the card writes will say so
    try:
        try:
            fd, previous = _take_lock(workdir)
            unusable = False
        except _FolderUnusable:
            fd, previous, unusable = None, None, True
        try:
            # Where the host's folder cannot be made or written (and only there) the old lock
            # is created as its stand-in, as the id counter falls back to the old place too:
            # two hosts with two runtime folders must still not run one watch.
            legacy_fd, legacy_previous = (
                _take_legacy_lock(card_folder, create=unusable)
                if card_folder is not None
                else (None, None)
            )
        except WorkdirHeld:
            _let_go(fd, empty=False)  # a note left in it stays for the host that gets it
            raise
        if unusable and legacy_fd is None:
            log.warning("no workdir lock for %s; the runtime lock alone", workdir)
        held = WorkdirLock(
            workdir,
            fd,
            legacy_fd,
            legacy_kept=fd is None,
            previous=tuple(note for note in (previous, legacy_previous) if note is not None),
        )
        if fd is not None:
            _write_note(fd, lock_path(workdir), workdir, runtime_dir, renders, served)
        if legacy_fd is not None:
            # An earlier version's host refused by it says where this one is.
            _write_note(legacy_fd, legacy_lock_path(workdir), workdir, runtime_dir, renders, served)
        return held
    finally:
        if card_folder is not None:
            os.close(card_folder)


def release(held: WorkdirLock | None) -> None:
    """Let go of the locks, emptying the note first: a clean end left no render running."""
    if held is None:
        return
    _let_go(held.fd, empty=True)
    if held.legacy_fd is not None and not held.legacy_kept:
        # Removed while still locked: an earlier version's host that opened the name just
        # before finds it held, one that comes after finds no lock of ours to wait on.
        try:
            card_folder = open_card_folder(held.workdir, create=False)
        except (OSError, CardFolderOutside):  # gone, or now a link out: nothing removed
            card_folder = None
        if card_folder is not None:
            try:
                _remove_legacy_name(card_folder, held.legacy_fd)
            finally:
                os.close(card_folder)
    _let_go(held.legacy_fd, empty=True)
    held.fd = held.legacy_fd = None


def _let_go(fd: int | None, *, empty: bool) -> None:
    if fd is None:
        return
    if empty:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
