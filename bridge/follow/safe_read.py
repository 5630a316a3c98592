"""Reading an agent's files without trusting them: the one way the service opens agent paths.

An agent owns its working directory and may put anything at a contract path: a named pipe
(whose blocking `open` would freeze the event loop and every other agent with it), a device,
a socket, a folder, or a symlink to `/proc/self/environ` or to the service's own config
(which would be posted to a chat, secrets included). So every read goes through
`WorkdirFiles`, which:

- resolves the path and requires it to stay inside the agent's resolved workdir (symlinks
  that stay inside are followed; a contract folder symlinked out counts as outside);
- looks at the file with `lstat` before opening it, so a pipe or a device is never opened;
- opens with `O_NONBLOCK | O_NOFOLLOW`, then checks with `fstat` that what was opened is the
  regular file that was looked at (a swap in between is refused, never followed), and on
  Linux that the descriptor's own path is still inside the workdir;
- never raises for the agent's doing: a missing file is `None`, anything else refused is
  `None` plus a reason in `problems`, keyed by the path relative to the workdir, so the
  operator sees it (`taskcard status`) and the other files and agents carry on.

A reason names the file, what is wrong and the fix; it never names the symlink's target.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Final, Literal, TypeAlias

from taskcard.producers.task_card.contract import file_kind as contract_file_kind

logger = logging.getLogger(__name__)

# A path as the callers hold it: a `Path`, or text where thousands are kept (followers).
StrPath: TypeAlias = str | os.PathLike[str]

_OPEN_FLAGS: Final = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOCTTY", 0)
)
_PROC_FD: Final = "/proc/self/fd/"
# A descriptor that names a file without opening it (Linux): no read permission needed, no
# side effect of opening a device or a pipe, and the kernel's path of it can be read back.
_O_PATH: Final = getattr(os, "O_PATH", 0)
_LOOK_FLAGS: Final = _O_PATH | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_MISSING: Final = frozenset({errno.ENOENT})
# `extra=HELD_LIKE_WARNINGS` marks an INFO line that says an agent's problem is over ("is
# readable again"): the log's repeat limiter (`bridge.run.logs.RepeatLimiter`) holds it back
# as it holds back the warnings, for its problem's warning may have been held back. An agent
# whose file flaps between good and broken logged one such line per flap (109 in 20 s), the
# warnings once a minute. Defined here, the lowest layer that logs one.
HELD_ATTR: Final = "taskcard_held_like_warnings"
HELD_LIKE_WARNINGS: Final = {HELD_ATTR: True}


class Refused(Exception):
    """An agent path the service will not read; the message is the operator-facing reason."""


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words an operator knows (a dangling link included)."""
    if stat.S_ISLNK(mode):
        return "a symlink that cannot be resolved"
    return contract_file_kind(mode)


def _read_up_to(handle: BinaryIO, limit: int) -> bytes:
    """At most `limit` bytes from `handle`, as `handle.read(limit)` returns them.

    Asking for the file's size (plus one byte, to see the end) rather than for `limit`: a
    buffered read allocates the whole amount asked for first, and `limit` is often far larger
    than the file (a 512 KB allocation, through `mmap`, to read a card body of 60 bytes).
    A file that grew after its size was taken is read on up to `limit`, as before.
    """
    size = os.fstat(handle.fileno()).st_size
    if size >= limit:
        return handle.read(limit)
    first = handle.read(size + 1)
    if len(first) <= size:
        return first
    return first + handle.read(limit - len(first))


def _read_fd(fd: int, size: int, limit: int) -> bytes:
    """At most `limit` bytes from `fd`, a regular file of `size` bytes when it was looked at:
    `_read_up_to` on a bare descriptor (a short read of a regular file is its end)."""
    want = min(limit, size + 1)
    data = os.read(fd, want)
    if len(data) < want:
        return data
    parts = [data]
    got = len(data)
    while got < limit:
        more = os.read(fd, limit - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _is_normal_absolute(path: str) -> bool:
    """Whether `path` is already absolute and normal (`os.path.abspath` gives it back)."""
    return path == os.path.abspath(path)


# `_is_normal_absolute`, remembered: every read and `stat` asks it of one of an agent's few
# contract paths (`abspath` is Python code, about 50 bytecodes a call; a hit is a lookup in
# C). Pure although `abspath` reads the working folder: a relative path is never its own
# `abspath`, whatever that folder is, and an absolute one's answer depends on its text alone.
# Bounded, as `inotify.child_path` is.
PATH_MEMO: Final = 4096
is_normal_absolute = functools.lru_cache(maxsize=PATH_MEMO)(_is_normal_absolute)


# `os.path.dirname`, remembered the same way: a missing file (most often an agent's ledger,
# at each rescan) is shown missing by walking up its folders.
def _parent_of(path: str) -> str:
    return os.path.dirname(path)


parent_of = functools.lru_cache(maxsize=PATH_MEMO)(_parent_of)


def is_inside(root: str, path: str) -> bool:
    """Whether the absolute `path` is `root` or below it (both already resolved)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class WorkdirFiles:
    """Safe reads of the files under one agent's workdir, with the problems they had."""

    __slots__ = ("_by_judge", "_root", "agent_id", "problems", "workdir")

    def __init__(self, agent_id: str, workdir: Path) -> None:
        self.agent_id = agent_id
        absolute = os.path.abspath(workdir)
        # The caller's object when it already is that path (a config's workdir is): one
        # `Path` less per agent, thousands of them. Equal either way; only the copy is saved.
        self.workdir = workdir if os.fspath(workdir) == absolute else Path(absolute)
        self.problems: dict[str, str] = {}
        # The workdir as last resolved. Resolving it walks every component with `lstat`, once
        # per read, thousands of times a minute; so it is kept, and resolved again only when a
        # read is refused against it. A stale root can only refuse (what is inside the old
        # location is compared against the old location, and the descriptor's kernel path must
        # still be inside it), never admit: a refusal is then re-judged against a fresh root,
        # which is exactly what a read without the kept root would have done.
        self._root: str | None = None
        # The names whose problem a `judge` found in their bytes (made on the first one): a
        # `stat` of the file, which sees only that it is a regular file, leaves their problem
        # as it is; the next reading of the bytes decides (a ledger looked at by `stat`
        # between its reads was called "readable again" at the next look, still broken).
        self._by_judge: set[str] | None = None

    # -- public reads -----------------------------------------------------------------------

    def stat(self, path: StrPath) -> os.stat_result | None:
        """The regular file's status, or None when it is missing or refused."""
        direct = self._stat_direct(os.fspath(path))
        if direct is not None:
            self._fine(path, looked=direct[0] is not None)
            return direct[0]
        try:
            checked = self._check(path)
        except Refused as refusal:
            self._refused(path, str(refusal))
            return None
        self._fine(path, looked=checked is not None)
        return checked[2] if checked else None

    def open(self, path: StrPath) -> BinaryIO | None:
        """The regular file opened for binary reading (the caller closes it), or None."""
        return self._judged(path, self._open)

    def read(
        self,
        path: StrPath,
        limit: int,
        *,
        whole: bool = False,
        judge: Callable[[bytes], str | None] | None = None,
    ) -> bytes | None:
        """At most `limit` bytes of the regular file, or None when it is missing or refused.

        `whole`: a file larger than `limit` is refused (a problem naming its size) instead of
        read in part, for a file whose first `limit` bytes alone mean nothing (a card body).
        `judge`: why the bytes read are not what the file should hold (a problem, kept until
        a reading it passes, and the bytes still returned), or None when they are."""
        found = self._read(path, limit, whole, judge)
        return None if found is None else found[0]

    def read_signed(
        self,
        path: StrPath,
        limit: int,
        *,
        whole: bool = False,
        judge: Callable[[bytes], str | None] | None = None,
    ) -> tuple[bytes, os.stat_result] | None:
        """`read`, with the status of the very file read (taken from its open descriptor):
        a caller that needs both the bytes and the file's (inode, size, mtime) looks once."""
        return self._read(path, limit, whole, judge)

    def _read(
        self,
        path: StrPath,
        limit: int,
        whole: bool = False,
        judge: Callable[[bytes], str | None] | None = None,
    ) -> tuple[bytes, os.stat_result] | None:
        direct = self._open_direct(os.fspath(path))
        if direct is False:
            self._fine(path)
            return None
        if isinstance(direct, tuple):
            # The usual case, read straight from the descriptor: no file object is built.
            fd, status = direct
            if whole and status.st_size > limit:
                os.close(fd)
                self._refused(path, _too_large(limit))
                return None
            try:
                data = _read_fd(fd, status.st_size, limit)
            except OSError as error:
                self._refused(path, f"cannot be read ({error.strerror or 'I/O error'})")
                return None
            finally:
                os.close(fd)
            self._judge(path, data, judge)
            return data, status
        # The shortcuts were just tried; a file judged by its bytes is cleared by `_judge`.
        handle = self._judged(path, self._check_and_open, clear=judge is None)
        if handle is None:
            return None
        try:
            with handle:
                # The status before the read: the bytes are then never older than it says (a
                # write while reading changes it again, so the next look reads once more).
                status = os.fstat(handle.fileno())
                if whole and status.st_size > limit:
                    self._refused(path, _too_large(limit))
                    return None
                data = _read_up_to(handle, limit)
        except OSError as error:
            self._refused(path, f"cannot be read ({error.strerror or 'I/O error'})")
            return None
        self._judge(path, data, judge)
        return data, status

    def _judge(
        self, path: StrPath, data: bytes, judge: Callable[[bytes], str | None] | None
    ) -> None:
        """Note the file read as fine, or as refused for what it holds (`read`'s `judge`)."""
        reason = judge(data) if judge is not None else None
        if reason is None:
            self._fine(path)
        else:
            self._refused(path, reason, after="its last good reading stays", judged=True)

    # -- the checks -------------------------------------------------------------------------

    def _resolved_root(self) -> str:
        root = self._root
        if root is None:
            root = self._root = os.path.realpath(self.workdir)
        return root

    def _check(self, path: StrPath) -> tuple[str, str, os.stat_result] | None:
        """(resolved workdir, resolved path, lstat) of a regular file inside the workdir;
        None when missing."""
        try:
            kept = self._root
            root = self._resolved_root()
            real = os.path.realpath(path)
            if kept is not None and not is_inside(root, real):
                root = self._fresh_root()  # re-judged against the workdir as it is now
        except (OSError, ValueError) as error:
            self._root = None
            raise Refused(f"cannot be resolved ({error}); fix the path") from None
        if not is_inside(root, real):
            raise Refused(
                "resolves outside the agent's workdir (a symlink out of it); only files inside "
                "the workdir are read, so replace the symlink with the file itself"
            )
        try:
            st = os.lstat(real)
        except OSError as error:
            if error.errno in _MISSING:
                return None
            if error.errno == errno.EACCES:
                # `lstat` needs no access to the file, only to enter each folder on its way.
                raise Refused(_folder_reason(root, real)) from None
            raise Refused(_os_reason(error)) from None
        if not stat.S_ISREG(st.st_mode):
            raise Refused(
                f"is {file_kind(st.st_mode)}, not a regular file; replace it with a regular file"
            )
        return root, real, st

    def _judged(
        self, path: StrPath, opener: Callable[[StrPath], BinaryIO | None], *, clear: bool = True
    ) -> BinaryIO | None:
        """`opener(path)`, with a refusal recorded as the file's problem (None) and a clean
        answer clearing it (`clear=False`: a file opened is judged by what it holds, so the
        problem its bytes made is not cleared and named again at each read)."""
        try:
            handle = opener(path)
        except Refused as refusal:
            self._refused(path, str(refusal))
            return None
        if clear or handle is None:
            self._fine(path)
        return handle

    def _open(self, path: StrPath) -> BinaryIO | None:
        direct = self._open_direct(os.fspath(path))
        if direct is False:
            return None
        if isinstance(direct, tuple):
            try:
                return os.fdopen(direct[0], "rb")
            except BaseException:
                os.close(direct[0])
                raise
        return self._check_and_open(path)

    def _check_and_open(self, path: StrPath) -> BinaryIO | None:
        """`_open` without its shortcuts: the full check, then the checked open."""
        checked = self._check(path)
        if checked is None:
            return None
        root, real, looked_at = checked
        try:
            fd = os.open(real, _OPEN_FLAGS)
        except OSError as error:
            if error.errno in _MISSING:
                return None
            raise Refused(_os_reason(error)) from None
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
                looked_at.st_dev,
                looked_at.st_ino,
            ):
                raise Refused("was replaced while being opened; it is read again when it changes")
            self._check_descriptor(fd, root)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def _open_direct(self, path: str) -> tuple[int, os.stat_result] | Literal[False] | None:
        """(descriptor, status) of the file at `path` when `path` is already its own real
        location, without resolving it component by component (one `lstat` per component, on
        every read); False when it is shown missing the same way (`_missing_direct`); None
        when neither can be shown, and the full check decides (missing, refused or read)
        instead. The caller closes the descriptor.

        Taken only when `path` is absolute and normal and inside the resolved workdir, and
        accepted only when the kernel's own path of the opened descriptor is exactly `path`:
        the file read is then the regular file (looked at with `lstat` first, so a pipe or a
        device is never opened) whose real location is `path`, inside the workdir, which is
        what resolving `path` first would have read. A symlink anywhere on the way makes the
        kernel's path differ, so it always goes the long way.
        """
        if not is_normal_absolute(path) or not is_inside(self._resolved_root(), path):
            return None
        try:
            looked_at = os.lstat(path)
        except FileNotFoundError:
            return False if self._missing_direct(path, seen_missing=True) else None
        except OSError:
            return None
        if not stat.S_ISREG(looked_at.st_mode):
            return None
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            return None
        try:
            opened = os.fstat(fd)
            if (
                stat.S_ISREG(opened.st_mode)
                and (opened.st_dev, opened.st_ino) == (looked_at.st_dev, looked_at.st_ino)
                and os.readlink(_PROC_FD + str(fd)) == path
            ):
                return fd, opened
        except OSError:
            pass  # no /proc, or the file went: the full check decides
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def _stat_direct(self, path: str) -> tuple[os.stat_result | None] | None:
        """`(status,)` of the regular file at `path`, or `(None,)` when it is missing, shown
        without resolving `path` component by component; None when that cannot be shown, and
        the full check decides instead.

        The same proof as `_open_direct`, without opening the file: `path` (absolute, normal,
        inside the resolved workdir) is looked at through an `O_PATH` descriptor, which opens
        nothing (a pipe or a device is only named), and accepted only when it is a regular
        file and the kernel's path of the descriptor is exactly `path`.
        """
        if not _O_PATH or not is_normal_absolute(path):
            return None
        if not is_inside(self._resolved_root(), path):
            return None
        try:
            fd = os.open(path, _LOOK_FLAGS)
        except FileNotFoundError:
            return (None,) if self._missing_direct(path, seen_missing=True) else None
        except OSError:
            return None
        try:
            found = os.fstat(fd)
            if stat.S_ISREG(found.st_mode) and os.readlink(_PROC_FD + str(fd)) == path:
                return (found,)
        except OSError:
            pass  # no /proc, or the file went: the full check decides
        finally:
            os.close(fd)
        return None

    def _missing_direct(self, path: str, seen_missing: bool = False) -> bool:
        """Whether `path` is shown missing without resolving it: it does not exist, and its
        nearest existing ancestor is a folder inside the resolved workdir whose kernel path is
        exactly its own text. Then no symlink lies on the way, so resolving `path` would have
        given `path` itself, inside the workdir and missing: the full check's answer too. A
        symlink anywhere (dangling or not), or any doubt, answers False: the full check
        decides, and refuses a way out of the workdir even for a missing file.
        `seen_missing`: the caller's own `lstat` of `path` has just failed with ENOENT, so it
        is not looked at again (the ancestors still are)."""
        if not _O_PATH or not is_normal_absolute(path):
            return False
        root = self._resolved_root()
        if not is_inside(root, path) or path == root:
            return False
        if not seen_missing:
            try:
                os.lstat(path)
                return False  # it exists after all
            except FileNotFoundError:
                pass
            except OSError:
                return False
        folder = parent_of(path)
        while is_inside(root, folder):
            try:
                fd = os.open(folder, _LOOK_FLAGS | os.O_DIRECTORY)
            except FileNotFoundError:
                if folder == root:
                    return False
                folder = parent_of(folder)
                continue
            except OSError:
                return False  # a symlink (O_NOFOLLOW), a file, no permission: full check
            try:
                return os.readlink(_PROC_FD + str(fd)) == folder
            except OSError:
                return False
            finally:
                os.close(fd)
        return False

    def _check_descriptor(self, fd: int, root: str) -> None:
        """On Linux, the path the kernel opened, which no component swap can fake, checked
        against the workdir as `_check` resolved it for this same read (and, if it was the
        kept root and the check fails, against the workdir resolved afresh)."""
        try:
            opened = os.readlink(_PROC_FD + str(fd))
        except OSError:
            return  # no /proc: the lstat/fstat identity check above is what we have
        if not is_inside(root, opened) and not is_inside(self._fresh_root(), opened):
            raise Refused(
                "resolves outside the agent's workdir (a folder on its path was swapped for a "
                "symlink); only files inside the workdir are read"
            )

    def _fresh_root(self) -> str:
        self._root = None
        return self._resolved_root()

    # -- bookkeeping ------------------------------------------------------------------------

    def _name(self, path: StrPath) -> str:
        try:
            return Path(os.path.abspath(path)).relative_to(self.workdir).as_posix()
        except ValueError:
            return os.path.basename(path)

    def _refused(
        self, path: StrPath, reason: str, *, after: str = "not read", judged: bool = False
    ) -> None:
        name = self._name(path)
        if self.problems.get(name) != reason:
            logger.warning("agent %s: %s %s; %s", self.agent_id, name, reason, after)
        self.problems[name] = reason
        if judged:
            if self._by_judge is None:
                self._by_judge = set()
            self._by_judge.add(name)
        elif self._by_judge is not None:
            self._by_judge.discard(name)

    def _fine(self, path: StrPath, *, looked: bool = False) -> None:
        """`path` found fine: its problem cleared. `looked`: only seen to be a regular file
        (`stat`), which clears no problem found in its bytes (`_by_judge`)."""
        if not self.problems:
            return  # the common case: nothing to clear, no name to work out
        name = self._name(path)
        if self._by_judge is not None and name in self._by_judge:
            if looked:
                return
            self._by_judge.discard(name)
        if self.problems.pop(name, None) is not None:
            logger.info(
                "agent %s: %s is readable again", self.agent_id, name, extra=HELD_LIKE_WARNINGS
            )


def _too_large(limit: int) -> str:
    # Without the size: a file rewritten at other sizes stays one problem, logged once.
    return (
        f"is larger than the {limit // 1024:,} KB the service reads of it; keep it shorter"
        " (the last good one stays shown)"
    )


def _folder_reason(root: str, real: str) -> str:
    """Why a file inside the workdir `root` could not even be looked at: a folder on its way
    the service may not enter. Named, with that fix: "grant read access" to the file, said
    before, changed nothing (the file itself may be readable by anyone)."""
    folder = root
    for part in os.path.relpath(os.path.dirname(real), root).split(os.sep):
        if not os.access(folder, os.X_OK):
            break
        folder = os.path.join(folder, part) if part != "." else folder
    where = (
        "the workdir itself" if folder == root else f"the folder {os.path.relpath(folder, root)}/"
    )
    return (
        f"is in {where}, which the service may not enter (permission denied); let the"
        " service's user enter it (search permission: chmod o+x, or a group both share)"
    )


def _os_reason(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "is a symlink loop or was swapped for a symlink; replace it with a regular file"
    if error.errno == errno.ENOTDIR:
        return "has a folder on its path that is not a folder; make it a folder"
    if error.errno in (errno.EACCES, errno.EPERM):
        return "is not readable by the service (permission denied); grant read access"
    return f"cannot be opened ({error.strerror or 'error'})"
