"""Where a workdir's host lives: its lock and socket, outside the workdir.

The folder is `$TASKCARD_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/taskcard`, else
`/tmp/taskcard-<uid>`, created 0700. Files are named by a hash of the resolved workdir so
that a path of any length maps to a socket path under the 108-byte limit. The lock is an
`flock` the kernel releases when the holder dies, so a SIGKILLed host never blocks its
successor.

The folder is trusted only when it is ours: whoever controls it can answer on the socket,
read every envelope (reasoning included) and forge results. In the shared `/tmp` another
user may have created `/tmp/taskcard-<uid>` first, so before any lock, socket or log is
used the folder must be a real directory (not a symlink), owned by our uid, with no access
for group or others; anything else is refused (`RuntimeDirUnsafe`) rather than repaired,
because repairing a folder someone else owns is exactly what they would want. Files inside
are opened without following symlinks.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import taskcard.producers.task_card.workdir_lock as workdir_lock
from taskcard.producers.task_card.contract import (
    LOOP_OF_LINKS,
    broken_link,
    dangling_link,
    file_on_path,
    link_loop,
)
from taskcard.producers.task_card.workdir_arg import shown_path


class HostAlreadyRunning(RuntimeError):
    """Another host holds this workdir's lock."""


class RuntimeDirUnsafe(RuntimeError):
    """The runtime folder could be read or replaced by someone else; nothing is sent there."""


class RuntimeDirInvalid(RuntimeDirUnsafe):
    """`TASKCARD_RUNTIME_DIR` or `--runtime-dir` names no folder a host can use (blank, inside
    the workdir, too long for a socket); answered like an unsafe runtime folder (one line,
    exit 2)."""


class CardFolderUnsafe(RuntimeDirUnsafe):
    """The workdir's `taskcard/` or `.taskcard-host/` folder leads out of it; answered like an
    unsafe runtime folder (one line, exit 2), since a host there would lock and write
    somewhere else."""


def runtime_dir_problem(mode: int, owner_uid: int, my_uid: int) -> str | None:
    """Why a folder with this `lstat` mode and owner is not private to us, or None. Pure."""
    if stat.S_ISLNK(mode):
        return "is a symlink"
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    if owner_uid != my_uid:
        return f"is owned by uid {owner_uid}, not by you (uid {my_uid})"
    if stat.S_IMODE(mode) & 0o077:
        return f"has mode {stat.S_IMODE(mode):04o}, looser than 0700"
    return None


def ensure_private_dir(path: Path, *, make: bool = True) -> None:
    """Create `path` 0700 if missing; raise `RuntimeDirUnsafe` unless it is ours alone.
    `make=False`: nothing is made; a missing folder passes when it could be made."""
    if make:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        except OSError as exc:
            # A folder that cannot be made (a file on its path, a read-only or pseudo file
            # system) was a bare "[Errno 17] File exists: ..." and exit 4, "no host
            # reachable". The folder in the way, when not the runtime dir itself (said once).
            where = "" if exc.filename in (None, str(path)) else f": {shown_path(exc.filename)}"
            _cannot_be_made(path, f" ({exc.strerror}{where})")
    elif not os.path.lexists(path):
        _cannot_be_made(path, None)
        return
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise RuntimeDirUnsafe(
            f"runtime dir {shown_path(path)} cannot be checked ({exc.strerror})"
        ) from None
    # A link that leads nowhere is said as one, with where it points: "is a symlink" alone
    # sent the user looking for a folder.
    problem = dangling_link(path) if stat.S_ISLNK(info.st_mode) else None
    problem = problem or runtime_dir_problem(info.st_mode, info.st_uid, os.getuid())
    if problem is not None:
        raise RuntimeDirUnsafe(
            f"runtime dir {shown_path(path)} {problem}; refusing to use it. Remove it if it is not "
            "yours, or set TASKCARD_RUNTIME_DIR (or --runtime-dir) to a private directory"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        # Ours and 0500: the lock's open failed with "remove it", about a lock never made.
        raise RuntimeDirUnsafe(
            f"runtime dir {shown_path(path)} is not writable (mode"
            f" {stat.S_IMODE(info.st_mode):04o}); chmod 700 it, or set TASKCARD_RUNTIME_DIR"
            " (or --runtime-dir) to a private directory you can write"
        )


def _cannot_be_made(path: Path, why: str | None) -> None:
    """Raise `RuntimeDirUnsafe` for the runtime folder `path` that cannot be made: a link
    that leads nowhere or a file on its path, else `why` (the error met making it); with no
    error met (`why` None, nothing tried), return when nothing on the path stands in the way."""
    broken = broken_link(path)
    file_above = file_on_path(path)
    if broken is not None:
        # A link on the way that leads nowhere, or round a loop, was "File exists" about it.
        leads = dangling_link(path) or link_loop(path) or LOOP_OF_LINKS
        why = f": {leads}"
    elif file_above is not None:  # "File exists" or "Not a directory" about a folder name
        why = f": {shown_path(file_above)} on its path is a file, not a folder"
    if why is None:
        return
    raise RuntimeDirUnsafe(
        f"runtime dir {shown_path(path)} cannot be created{why}; set "
        "TASKCARD_RUNTIME_DIR (or --runtime-dir) to a private directory you can create"
    ) from None


# The `--runtime-dir` option's help, the same for every command that reaches a host.
RUNTIME_DIR_HELP: Final = (
    "where host sockets and locks live (default: $TASKCARD_RUNTIME_DIR, "
    "$XDG_RUNTIME_DIR/taskcard or /tmp/taskcard-UID); never inside the workdir"
)


def runtime_dir_arg(text: str) -> str:
    """`--runtime-dir` as an argparse `type=`: an empty or blank name is a usage error. It
    meant the default folder without a word, so a script's `--runtime-dir "$DIR"` with `DIR`
    unset reached another host than the one it named (an empty `--workdir` or `--config` is
    refused alike). An empty `TASKCARD_RUNTIME_DIR` still means unset, as for any variable."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "is empty; give a private directory for the hosts' sockets and locks, or leave"
            " the option out for the default"
        )
    return text


# The variable that names the runtime folder; read in one place, `default_runtime_dir`.
RUNTIME_DIR_ENV: Final = "TASKCARD_RUNTIME_DIR"
# The longest path a unix socket is bound at (`sun_path` is 108 bytes, its NUL included).
MAX_SOCKET_PATH_BYTES: Final = 107


def default_runtime_dir(environ: Mapping[str, str]) -> Path:
    """The runtime folder when no `--runtime-dir` is given.

    An empty `TASKCARD_RUNTIME_DIR` counts as unset, as for any variable; one of white space
    only is refused (`RuntimeDirInvalid`): it was used as a folder named by spaces in the
    current folder, while the same `--runtime-dir` is a usage error. `~` is expanded (a
    client's config passes it verbatim, as for `--runtime-dir`); a relative name starts at
    the caller's folder (`HostPaths`). An `XDG_RUNTIME_DIR` that is empty, blank or relative
    is ignored, as the XDG base directory specification says of such values.
    """
    explicit = environ.get(RUNTIME_DIR_ENV)
    if explicit:
        if not explicit.strip():
            raise RuntimeDirInvalid(
                f"{RUNTIME_DIR_ENV} is blank; set it to a private directory for the hosts'"
                " sockets and locks, or unset it for the default"
            )
        try:
            return Path(explicit).expanduser()
        except RuntimeError:  # `~name` of no known user
            raise RuntimeDirInvalid(
                f"{RUNTIME_DIR_ENV}={shown_path(explicit)} cannot be expanded; set it to the"
                " full path of a private directory"
            ) from None
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "taskcard"
    return Path(f"/tmp/taskcard-{os.getuid()}")


def chosen_host_paths(
    option: str | os.PathLike[str] | None,
    environ: Mapping[str, str],
    workdir: Path,
    *,
    option_name: str = "--runtime-dir",
    host: bool = True,
) -> HostPaths:
    """The host paths for `--runtime-dir` (None when not given), else the environment's folder.
    `option_name` is how the caller's user gave the folder: the Python API's `runtime_dir`
    argument is named as such, not as an option its caller never typed.

    A folder chosen by the option or by `TASKCARD_RUNTIME_DIR` that is the workdir or lies
    inside it is refused (`RuntimeDirInvalid`, naming which of the two chose it): the help
    always said "never inside the workdir", yet it was taken, putting the host's lock,
    socket and log among the agent's files, where the agent's own cleanup (`git clean`,
    removing the tree) deletes a running host's socket and lock. The defaults are not
    checked: a workdir of `/tmp` or `/` holds them, and the host's folder there is a
    system folder, not one an agent keeps its work in. Nor is a workdir of `/` or of the
    home folder (`_holds_system_folders`): every folder is inside the one, and the user's
    own (`~/.cache`) inside the other. `host=False`: for a call that neither starts nor asks a
    host (`manual`, `settings`: `READ_ONLY_ACTIONS`), which puts nothing in the folder, so
    where it lies is not checked; they were refused from a folder holding the runtime folder
    (the home folder's `rt/`, say), a `taskcard card manual` that could run nowhere there.
    """
    if option is not None:
        source: str | None = option_name
        try:
            runtime = Path(option).expanduser()
        except RuntimeError:  # `~name` of no known user: it was a traceback
            raise RuntimeDirInvalid(
                f"{option_name}: {shown_path(os.fspath(option))} cannot be expanded; give the"
                " full path of a private directory"
            ) from None
    else:
        source = RUNTIME_DIR_ENV if environ.get(RUNTIME_DIR_ENV) else None
        runtime = default_runtime_dir(environ)
    paths = HostPaths(runtime, workdir, chosen=source is not None)
    if source is not None and host:
        inside = Path(os.path.realpath(paths.runtime_dir))
        home = workdir.resolve()
        if _holds_system_folders(home, environ):
            return paths
        if inside == home or home in inside.parents:
            default = "unset it" if source == RUNTIME_DIR_ENV else "leave it out"
            raise RuntimeDirInvalid(
                f"{source}: {shown_path(paths.runtime_dir)} is inside the workdir"
                f" {shown_path(home)}, among the agent's files; give {source} a private"
                f" directory outside it, or {default} for the default"
            )
    return paths


def _holds_system_folders(workdir: Path, environ: Mapping[str, str]) -> bool:
    """Whether `workdir` is `/` or the user's home folder, which hold the system's and the
    user's own folders (`/run`, `/tmp`, `~/.cache`) besides any work: every runtime folder
    is inside `/`, and `~/.cache/taskcard` inside a home an agent works in is no agent file."""
    if workdir.parent == workdir:
        return True
    home = environ.get("HOME", "")
    return bool(home) and Path(os.path.realpath(home)) == workdir


@dataclass(frozen=True)
class HostPaths:
    """The lock, socket and log of one workdir's host.

    The runtime folder is made absolute against the current directory here: the detached
    host runs from `/`, so a relative `TASKCARD_RUNTIME_DIR` or `--runtime-dir` would put its
    socket under `/` while the caller waited for it in the folder it meant.
    """

    runtime_dir: Path
    workdir: Path
    # Chosen by `--runtime-dir` or the variable, not the default (`chosen_host_paths`).
    chosen: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtime_dir", Path(os.path.abspath(self.runtime_dir)))

    @property
    def key(self) -> str:
        # The path's own bytes: a folder name that is not UTF-8 (surrogate escapes) made
        # `.encode()` raise, a traceback for every command on such a workdir.
        return hashlib.sha256(os.fsencode(self.workdir.resolve())).hexdigest()[:20]

    @property
    def lock(self) -> Path:
        return self.runtime_dir / f"{self.key}.lock"

    @property
    def socket(self) -> Path:
        return self.runtime_dir / f"{self.key}.sock"

    @property
    def log(self) -> Path:
        return self.runtime_dir / f"{self.key}.log"

    def ensure_dir(self, *, for_socket: bool = True) -> None:
        """Create or check the runtime folder; raises `RuntimeDirUnsafe`.

        A folder whose socket path would not fit a unix socket is refused before anything is
        made: the host's `bind` failed with a traceback in its log, and the caller saw exit
        4, "failed to start", with no word of the folder's length. Not for the lock alone
        (`for_socket=False`: the Python API's in-process watches, which bind no socket, as
        the demo's under a long `TMPDIR`).
        """
        self._check_length(for_socket)
        ensure_private_dir(self.runtime_dir)

    def check_dir(self) -> None:
        """Check the runtime folder as `ensure_dir` does, making nothing: for the calls that
        need no host (`manual`, `settings`), which still refuse a bad folder a user chose."""
        self._check_length(True)
        ensure_private_dir(self.runtime_dir, make=False)

    def _check_length(self, for_socket: bool) -> None:
        length = len(os.fsencode(self.socket))
        if for_socket and length > MAX_SOCKET_PATH_BYTES:
            raise RuntimeDirInvalid(
                f"runtime dir {shown_path(self.runtime_dir)} is too long for the hosts' sockets"
                f" (a socket's path in it takes {length} bytes, a unix socket's at most"
                f" {MAX_SOCKET_PATH_BYTES}); set {RUNTIME_DIR_ENV} (or --runtime-dir) to a"
                " shorter private directory"
            )


class HostLock:
    """The exclusive right to run watches for one workdir.

    Two locks: the runtime folder's (next to the socket callers find) and the workdir's own
    (`workdir_lock.py`), which also holds against a host started with another runtime folder.
    """

    def __init__(
        self, paths: HostPaths, *, renders: str | None = None, served: bool = False
    ) -> None:
        self._paths = paths
        self._renders = renders
        self._served = served  # a `taskcard host` holds it (`workdir_lock.Holder.served`)
        self._fd: int | None = None
        self._workdir_lock: workdir_lock.WorkdirLock | None = None
        # The notes previous holders left in the workdir lock (none: they ended cleanly).
        self.previous: tuple[workdir_lock.Holder, ...] = ()

    def acquire(self) -> None:
        # The host's socket path was checked by whoever started it (`client`, `taskcard host`).
        self._paths.ensure_dir(for_socket=False)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self._paths.lock, flags, 0o600)
        except OSError as exc:
            raise RuntimeDirUnsafe(
                f"host lock {self._paths.lock} cannot be opened safely ({exc.strerror}); remove it"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            note = workdir_lock.read_holder(self._paths.workdir)
            if note is not None and str(note.pid) == holder:
                # The workdir's note says what holds it: a Python program's TaskCard is not
                # a host that `taskcard tool/card` can talk to.
                raise HostAlreadyRunning(note.describe(self._paths.workdir)) from None
            raise HostAlreadyRunning(
                f"a task_card host already runs for {shown_path(self._paths.workdir)}"
                f" (pid {shown_path(holder)}); "
                "use it (taskcard tool/card talk to it) or stop it first"
            ) from None
        try:
            self._workdir_lock = workdir_lock.acquire(
                self._paths.workdir, self._paths.runtime_dir, self._renders, served=self._served
            )
        except workdir_lock.WorkdirHeld as exc:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise HostAlreadyRunning(exc.holder.describe(self._paths.workdir)) from None
        except workdir_lock.CardFolderOutside as exc:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise CardFolderUnsafe(str(exc)) from None
        self.previous = self._workdir_lock.previous
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        held, self._workdir_lock = self._workdir_lock, None
        workdir_lock.release(held)
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
