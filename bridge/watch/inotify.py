"""The Linux watcher: one inotify instance read by the event loop itself, watches kept in step.

Why not `watchfiles` here: its Rust loop wakes every `step` and holds each batch until a step
passes without new events, so a rename reaches the service 10-20 ms late at the 10 ms step
(a 1 ms step would cost a thousand wake-ups a second, each taking the GIL, for ever). Here the
inotify descriptor is registered with the loop (`add_reader`): an idle fleet costs no wake-up
at all, and a rename is read as soon as the loop gets to it. Events that arrive while the
service is busy pile up in the kernel and are read as one batch, so under load batches grow
instead of requests.

Watches are kept in step with the plan one path at a time (`sync`): a folder that appears
costs one `inotify_add_watch`, not a re-arm of the whole fleet, and the paths that stayed
watched never had a gap. At the kernel's limit (`fs.inotify.max_user_watches`, shared by every
process of the user) a path that cannot be watched is named in an error log once, and its
agents are polled instead (see `FleetWatcher`): slower, never blind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import struct
import sys
from collections.abc import Callable, Iterable
from typing import Final

try:
    import inotify_simple
except ImportError:  # installed on Linux only; elsewhere `inotify_available` says no
    inotify_simple = None

logger = logging.getLogger(__name__)

# From <sys/inotify.h> (a stable kernel ABI).
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x2000, 0x4000, 0x8000
IN_ONLYDIR, IN_ISDIR = 0x01000000, 0x40000000
# What the notify crate under watchfiles asks for too: every way a name in a folder can
# change, and the folder itself going away.
WATCH_MASK: Final = (
    IN_ATTRIB
    | IN_CREATE
    | IN_DELETE
    | IN_CLOSE_WRITE
    | IN_MODIFY
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
# The watch is gone (or about to be): the path must be watched again once it is a folder.
_SELF_GONE: Final = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT
# A name in a watched folder now stands for another file, or for none.
_NAME_CHANGED: Final = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
# Bytes asked for per read: a few hundred events (one needs at most 16 + NAME_MAX + 1).
_READ_BYTES: Final = 64 * 1024
# `struct inotify_event`: wd, mask, cookie, the length of the NUL-padded name that follows.
_EVENT: Final = struct.Struct("iIII")
# What `os.fsdecode` does with bytes, without its call and checks for every event's name.
_FS_CODEC: Final = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


# `inotify_init` when the user (EMFILE: fs.inotify.max_user_instances) or the process or
# system (its open file limits) has no instance left.
OUT_OF_INSTANCES: Final = (errno.EMFILE, errno.ENFILE)


def inotify_available() -> bool:
    """Whether this system gives us an inotify instance (Linux with a free instance slot)."""
    if inotify_simple is None:
        return False
    try:
        probe = inotify_simple.INotify(nonblocking=True)
    except OSError as exc:
        # Out of instances (fs.inotify.max_user_instances) is Linux all the same: the inotify
        # watcher polls and logs it until one is free. watchfiles would fail the same way.
        return exc.errno in OUT_OF_INSTANCES
    except AttributeError:  # not Linux, no libc symbol
        return False
    probe.close()
    return True


# The paths of the files an agent changes are the same from one change to the next: joined
# once, by a pure function, and remembered (`os.path.join` is Python code, a few dozen
# bytecodes a call; a hit of the cache is a lookup in C). Bounded, so a fleet whose every
# agent changes costs a few MB at most, and a miss costs no more than the join.
PATH_MEMO: Final = 4096
child_path = functools.lru_cache(maxsize=PATH_MEMO)(os.path.join)


class InotifyWatches:
    """A set of non-recursive folder watches on one inotify instance, read by the loop.

    `on_events` gets the paths that changed (a watched folder's own path when the folder itself
    went away) and whether the kernel's queue overflowed (then anything may have changed).
    """

    def __init__(
        self,
        on_events: Callable[[list[str], bool], None],
        ignored: Callable[[bytes, int, int], object] = lambda _data, _start, _end: False,
    ) -> None:
        """`ignored(buffer, start, end)` (its truth), of a name as read, undecoded: the bytes
        `buffer[start:end]`, NUL-padded: a file of that name is never read, so its events are
        dropped as they are read (a writer's temp file costs four events per atomic write, the
        rename that matters one). Names in `kept` are reported all the same: the caller puts
        there any such name a watched or planned folder has."""
        self._on_events = on_events
        self._ignored = ignored
        self.kept: frozenset[str] = frozenset()
        self._inotify = inotify_simple.INotify(nonblocking=True)
        self._fd: int = self._inotify.fileno()
        # Usually one path per watch: a tuple, not a list (40,000 of them at 10,000 agents).
        self._paths_of: dict[int, tuple[str, ...]] = {}
        self._wd_of: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def watched(self) -> int:
        """Paths watched now."""
        return len(self._wd_of)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._fd, self._read)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._loop = None
        self._inotify.close()
        self._paths_of.clear()
        self._wd_of.clear()

    def sync(self, paths: Iterable[str]) -> tuple[list[str], list[str]]:
        """Watch exactly `paths` from now on: (paths newly watched, paths that could not be).

        A path that vanished, is no folder or may not be read is left out quietly (the plan
        sees it at its next check); one refused for the kernel's limit is listed as unwatched,
        even when not a single path could be watched (the caller polls those instead).
        """
        wanted = dict.fromkeys(paths)
        for path in [p for p in self._wd_of if p not in wanted]:
            self._unwatch(path)
        added: list[str] = []
        unwatched: list[str] = []
        for path in wanted:
            if path in self._wd_of:
                continue
            if unwatched:  # the limit was reached: every further one would fail too
                unwatched.append(path)
                continue
            try:
                wd = self._inotify.add_watch(path, WATCH_MASK)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    unwatched.append(path)
                elif exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP):
                    logger.debug("not watching %s: %s", path, exc.strerror)
                else:
                    raise
                continue
            self._wd_of[path] = wd
            self._paths_of[wd] = (*self._paths_of.get(wd, ()), path)
            added.append(path)
        return added, unwatched

    def _unwatch(self, path: str) -> None:
        wd = self._wd_of.pop(path)
        paths = tuple(p for p in self._paths_of.get(wd, ()) if p != path)
        if paths:
            self._paths_of[wd] = paths
        else:
            self._paths_of.pop(wd, None)
            with contextlib.suppress(OSError):  # the kernel dropped it (the folder went away)
                self._inotify.rm_watch(wd)

    def _forget(self, wd: int) -> tuple[str, ...]:
        """The kernel ended this watch: its paths are to be watched again when planned."""
        paths = self._paths_of.pop(wd, ())
        for path in paths:
            self._wd_of.pop(path, None)
        return paths

    def _read(self) -> None:
        # One `read` of whole events (the kernel never splits one); `INotify.read` asks for
        # the queued size with an `ioctl` through ctypes first, which cost as much again on
        # every wake-up. What does not fit waits: the descriptor stays readable. The events
        # are unpacked here rather than by `inotify_simple.parse_events`, which builds a
        # named tuple per event, so that ignored names cost no more than their unpacking.
        try:
            data = os.read(self._fd, _READ_BYTES)
        except BlockingIOError:
            return
        changed: list[str] = []
        overflow = False
        unpack, ignored, kept, joined = _EVENT.unpack_from, self._ignored, self.kept, child_path
        size, (encoding, errors) = _EVENT.size, _FS_CODEC
        at, end = 0, len(data)
        # Most events of a change name a writer's temp file, dropped at once: the loop does
        # as little as it can before that (a name holds no NUL, so its padding is stripped;
        # an overflow is an event without a name).
        while at < end:
            wd, mask, _cookie, length = unpack(data, at)
            start = at + size
            at = start + length
            if length:
                if (
                    not mask & IN_ISDIR
                    and ignored(data, start, at)
                    and (
                        not kept
                        or data[start:at].rstrip(b"\0").decode(encoding, errors) not in kept
                    )
                ):
                    continue
                name = data[start:at].rstrip(b"\0").decode(encoding, errors)
            else:
                name = ""
                if mask & IN_Q_OVERFLOW:
                    overflow = True
                    continue
            paths = self._paths_of.get(wd)
            if not paths:
                continue
            if mask & _SELF_GONE and not name:
                if mask & (IN_MOVE_SELF | IN_UNMOUNT):
                    # The folder lives on elsewhere: stop following it.
                    for path in paths:
                        self._unwatch(path)
                else:
                    self._forget(wd)
                changed += paths
                continue
            if name and mask & _NAME_CHANGED:
                for path in paths:
                    if joined(path, name) in self._wd_of:
                        # A watch follows the folder a name stood for when it was made: a
                        # symlink removed or retargeted ends nothing on that folder, so the
                        # watch is dropped here and the re-plan this event causes makes it
                        # again on what the name stands for now.
                        self._unwatch(joined(path, name))
            changed += [joined(path, name) if name else path for path in paths]
        if changed or overflow:
            self._on_events(changed, overflow)
