"""Running an agent's renderer safely, and naming what went wrong.

The renderer is agent code, so every run is fenced: its own process group (a timeout kills
the renderer and whatever it spawned), a minimal environment, a bounded read of stdout (a
renderer printing gigabytes costs us a few kilobytes), and a bounded tail of stderr kept for
`inspect`. What the run *means* is decided by `classify`, a pure function of the outcome's
typed fields, never by matching message text.

Everything a renderer starts dies with the run, even a grandchild that left the process group
with `setsid` or double-forked. Three nets, because each alone has a hole:

- the process group is killed, as before (covers ordinary children);
- every run's environment carries a fresh `TASKCARD_RENDER_TOKEN`; after the run (and as soon
  as the renderer itself exits, so held pipes close) every process whose environment carries
  that token, or whose parent chain leads to the renderer, is SIGKILLed (covers `setsid`
  children whose parent is still alive, and orphans, in any process; a subreaper does not
  need to read environments, see `_snapshot`);
- `taskcard host` makes itself a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)` through
  ctypes), so orphans reparent to the host instead of init; there, every child that is not a
  renderer currently running is a leftover and is killed with its subtree, and zombies are
  reaped (`reap_orphans`, also called from the host's idle loop). This catches descendants
  that cleared their environment. The in-process Python API does not turn the agent's process
  into a subreaper (that would change how the agent's own children are reparented), so there
  a renderer descendant that both escaped with `setsid` and cleared its environment can
  survive.

cgroup v2 would give an exact boundary, but it needs a writable, delegated subtree, which a
host started from a shell or an MCP client normally does not have; it is not used.
`decide_doomed` is the pure decision over a snapshot of /proc, table-tested.

What the sweep costs. Reading every process's /proc entry costs about 9 us each (the kernel
formats `stat` on every read), and it used to happen three times per run: once per run was
most of a producer host's CPU. Now:

- only processes created since the renderer was spawned are read. Every descendant got its
  pid after the renderer's, so it lies in the circular pid window from the renderer's pid to
  the kernel's last allocated pid (`/proc/loadavg`), unless the pid counter went all the way
  round since the spawn. That is ruled out by counting: the kernel's fork count
  (`processes` in `/proc/stat`) plus the threads alive must stay under half of `pid_max`;
  otherwise, or when any of these files cannot be read, the sweep reads every process as
  before (`pid_window`, pure and table-tested). The idle loop's `reap_orphans` always reads
  everything, since orphans of earlier runs are older than any window;
- a sweep that runs after the renderer exited and finds nothing alive to kill proves that no
  descendant is left (none existed to fork another), so the later sweeps of that run are
  skipped; a run that ends by timeout, cancel or overflow (renderer still alive) keeps all
  three.

A host killed with SIGKILL ends none of this: its renderer runs on in its own session, for its
whole timeout or for ever. Every render of a host (one `TaskCard`) carries a random tag of
that host in its environment (`RENDER_HOST_ENV`), the workdir lock's note names the tag, and
the next host of the workdir, finding a note that no clean end emptied, kills every process
carrying the tag before it renders (`end_leftover_renders`; `workdir_lock.py` says when).
Nothing is written per run for it. A parent-death signal (`PR_SET_PDEATHSIG`) was the other
way, but it must be set in the child before the renderer starts: a `preexec_fn` makes CPython
fork instead of vfork (host CPU on every spawn), and Python 3.11's `subprocess` has no option
for it (`process_group=` and `start_new_session=` keep vfork but only set the group); it
would also fire when the spawning thread ends, not the host, and reach the renderer only,
not its group.

Renderers run at a lower CPU priority than the host (`nice_increment`, +10 by default, set
right after the spawn, before the interpreter has even started): on a machine saturated by
renderers the host still gets the CPU to start the next tick on time, and the renderers share
what is left. Their descendants inherit it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import ClassVar, Final, Literal, Protocol, get_args

from taskcard.producers.task_card.contract import (
    LOOP_OF_LINKS,
    body_chars,
    broken_link,
    dangling_link,
    file_kind,
    file_on_path,
    link_loop,
    quoted,
    shows_text,
)

STDERR_TAIL_BYTES: Final = 4096
_READ_CHUNK: Final = 65536
_DRAIN_CHUNKS: Final = 16
_POLL_S: Final = 0.05
_EXIT_GRACE_S: Final = 0.05  # from closing its pipes to exiting, a renderer takes microseconds
RENDER_TOKEN_ENV: Final = "TASKCARD_RENDER_TOKEN"
# Names the host (one `TaskCard`) whose renders carry it: what a later host looks for when
# that one died without ending its runs (`end_leftover_renders`).
RENDER_HOST_ENV: Final = "TASKCARD_RENDER_HOST"
# What marks a process as a render of one host: never passed on to a host started from one.
RENDER_MARKS: Final = frozenset({RENDER_TOKEN_ENV, RENDER_HOST_ENV})
# Marks a detached `taskcard host` (set by `card start` when it spawns one). A renderer may
# start another workdir's card: that card's host is orphaned when its `card start` exits, and
# reparents to the rendering host, a subreaper, whose sweep would take it for a leftover and
# kill it, ending the other card. A process with this mark and none of the render marks (a
# host never carries them; `RENDER_MARKS`) is spared, with its subtree, like a running
# renderer. Faking it needs a descendant that also cleared the render marks from its
# environment, which already escapes the token sweep.
HOST_PROCESS_ENV: Final = "TASKCARD_HOST_PROCESS"
_HOST_MARK: Final = f"{HOST_PROCESS_ENV}=1".encode()
_RENDER_MARK_PREFIXES: Final = tuple(f"{name}=".encode() for name in sorted(RENDER_MARKS))
_PR_SET_CHILD_SUBREAPER: Final = 36
_SWEEP_ROUNDS: Final = 100
_SWEEP_PAUSE_S: Final = 0.01
RENDER_NICE_INCREMENT: Final = 10
_NICE_MAX: Final = 19
_PROBE_MAX: Final = 256  # a pid window up to this size is probed instead of listing /proc
_RESERVED_PIDS: Final = 300  # the kernel restarts the pid counter here after a wrap
ENV_KEEP: Final = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

ErrorCode = Literal[
    "renderer_timeout",
    "renderer_nonzero_exit",
    "renderer_failed",
    "renderer_blank_output",
    "renderer_invalid_utf8",
    "body_too_large",
    "write_failed",
    "watch_crash",
]
ERROR_CODES: Final[frozenset[str]] = frozenset(get_args(ErrorCode))


class RendererPathError(ValueError):
    """The renderer path is not a regular file inside the workdir; `why` says which of the
    three it is, without the path or the fix (a resume names it for a watch it drops)."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


class RendererUnreadable(OSError):
    """The renderer path could not be looked at for a reason that says nothing of the path (an
    I/O error, no memory, a stale file handle): a failure to report with the system's words
    and the place, not a mistake the caller can mend in their arguments (`RendererPathError`)."""

    def __str__(self) -> str:
        return str(self.strerror)  # the whole sentence, without the "[Errno 5]" prefix


# What an OS error while resolving `renderer_path` may say about the path itself, which its
# caller can mend: a name missing or under a file, a loop of links, a name too long, or a
# folder on the way the caller may not enter (EACCES, EPERM: the path is theirs to choose and
# its folders are usually theirs to open; no retry of the same path helps). Any other errno
# is `RendererUnreadable`.
PATH_ERRNOS: Final = frozenset(
    {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EACCES, errno.EPERM}
    # A name the file system cannot hold (vfat, CIFS, 9p): the name is what to mend.
    | {errno.EINVAL, errno.EILSEQ}
)


def _unreadable(renderer_path: str, exc: OSError) -> RendererUnreadable:
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    where = f" at {quoted(str(exc.filename))}" if exc.filename else ""
    return RendererUnreadable(
        exc.errno,
        f"renderer_path: {quoted(renderer_path)} could not be looked at ({exc.strerror}, {name}"
        f"{where}); nothing is wrong with the name: call again, and if it keeps failing, check"
        " the file system that holds it",
    )


def resolve_renderer(workdir: Path, renderer_path: str) -> Path:
    """The resolved renderer file; symlinks are followed before the inside-workdir check.

    `RendererPathError` when the path names no renderer file inside the workdir (the caller's
    to mend), `RendererUnreadable` when it could not be looked at (`PATH_ERRNOS`)."""
    root = workdir.resolve()
    ending = next((end for end in ("/", "/.") if renderer_path.endswith(end)), None)
    if ending is not None:
        # `Path` drops the ending: `r.py/` started a watch on the file `r.py`.
        raise RendererPathError(
            f"renderer_path: {quoted(renderer_path)} ends in {ending!r}, which names a folder;"
            " give the renderer's Python file without it",
            f"ends in {ending!r}, which names a folder",
        )
    candidate = Path(renderer_path)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        resolved = candidate.resolve(strict=True)
    except OSError as exc:
        if exc.errno not in PATH_ERRNOS:
            raise _unreadable(renderer_path, exc) from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            _refuse_broken_link(root, candidate, renderer_path)
        above = file_on_path(candidate) if exc.errno == errno.ENOTDIR else None
        if above is not None:
            # `notes.py/r.py` was said not to exist, as if `notes.py` were not there.
            shown = above.relative_to(root) if above.is_relative_to(root) else above
            raise RendererPathError(
                f"renderer_path: {quoted(renderer_path)} goes through {quoted(str(shown))}, a"
                " file, as if it were a folder; give the renderer's Python file",
                "goes through a file",
            ) from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise RendererPathError(
                f"renderer_path: {quoted(renderer_path)} does not exist (relative paths start"
                " at the workdir)",
                "does not exist",
            ) from None
        # A name too long to look at, or a folder on the way we may not enter, was said not
        # to exist.
        raise RendererPathError(
            f"renderer_path: {quoted(renderer_path)} cannot be used ({exc.strerror}); give the"
            " renderer's Python file, inside the workdir",
            "cannot be used",
        ) from None
    except RuntimeError:  # a loop of symbolic links
        _refuse_broken_link(root, candidate, renderer_path)
        raise RendererPathError(
            f"renderer_path: {quoted(renderer_path)} does not exist (relative paths start at"
            " the workdir)",
            "does not exist",
        ) from None
    if not resolved.is_relative_to(root):
        raise RendererPathError(
            f"renderer_path: {quoted(renderer_path)} resolves outside the workdir; keep it"
            f" inside {root}",
            "resolves outside the workdir",
        )
    try:
        mode = resolved.stat().st_mode
    except OSError as exc:  # removed since it was resolved
        if exc.errno not in PATH_ERRNOS:
            raise _unreadable(renderer_path, exc) from None
        raise RendererPathError(
            f"renderer_path: {quoted(renderer_path)} does not exist (relative paths start at"
            " the workdir)",
            "does not exist",
        ) from None
    if not S_ISREG(mode):
        # What it is and the fix: "is not a regular file" alone left both to guess.
        raise RendererPathError(
            f"renderer_path: {quoted(renderer_path)} is {file_kind(mode)}, not a regular file;"
            " give the renderer's Python file",
            "is not a regular file",
        )
    return resolved


def _refuse_broken_link(root: Path, candidate: Path, renderer_path: str) -> None:
    """`RendererPathError` naming the symbolic link on `candidate` that leads nowhere
    (`contract.dangling_link`, the words of every path option) or round a loop
    (`contract.link_loop`), if there is one: "does not exist" about a name the agent sees in
    its folder sent it looking for a file that is there. The link is named as inside the
    workdir when it is."""
    broken = broken_link(candidate)
    if broken is None:
        return
    if broken[2]:
        loop = link_loop(candidate, "cannot be reached: ", inside=root) or LOOP_OF_LINKS
        raise RendererPathError(
            f"renderer_path: {quoted(renderer_path)} {loop}; fix the links, or give the"
            " renderer's Python file itself",
            "does not exist",
        )
    nowhere = dangling_link(candidate, "cannot be reached: ", inside=root)
    if nowhere is None:  # gone or mended since `broken_link` looked: said as missing
        return
    raise RendererPathError(
        f"renderer_path: {quoted(renderer_path)} {nowhere}; create what it points to, or give"
        " the renderer's Python file itself",
        "does not exist",
    )


def renderer_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Only what a renderer plausibly needs; secrets in the host's environment stay there."""
    env = {key: environ[key] for key in ENV_KEEP if key in environ}
    env["PYTHONIOENCODING"] = "utf-8"
    env["PYTHONUTF8"] = "1"
    env.setdefault("PATH", os.defpath)
    return env


@dataclass(frozen=True)
class RunRequest:
    renderer: Path
    workdir: Path
    timeout_s: float
    stdout_limit_bytes: int
    env: Mapping[str, str]
    nice_increment: int = RENDER_NICE_INCREMENT
    due: float | None = None  # the monotonic time the tick was due (None: not a tick)


@dataclass(frozen=True)
class RunOutcome:
    """What happened, as facts; `classify` decides what it means."""

    exit_code: int | None
    timed_out: bool
    cancelled: bool
    stdout: bytes
    stdout_overflow: bool
    stderr_tail: bytes
    spawn_error: str | None
    duration_s: float


class RendererRunner(Protocol):
    """Runs one renderer; `cancel` set means stop now (the watch is being stopped)."""

    def __call__(self, request: RunRequest, cancel: threading.Event) -> RunOutcome: ...


def stdout_limit_for(max_body_chars: int) -> int:
    """A UTF-8 character is at most 4 bytes; the slack leaves room to report the real size."""
    return max_body_chars * 4 + 4096


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@dataclass(frozen=True)
class ProcEntry:
    """One row of a /proc snapshot: what the sweep needs to know about a process."""

    pid: int
    ppid: int
    zombie: bool
    tagged: bool  # its environment carries the run's token
    start: int | None = None  # its start time (clock ticks after boot): who holds the pid
    pgrp: int | None = None  # its process group (a renderer leads its own)
    host: bool = False  # a detached taskcard host (`HOST_PROCESS_ENV`): never a leftover


def decide_doomed(
    table: Iterable[ProcEntry],
    *,
    me: int,
    leader: int | None,
    live_leaders: frozenset[int],
    subreaper: bool,
) -> set[int]:
    """Which processes belong to a finished renderer and must die. Pure.

    Roots: the renderer itself, anything carrying its token, and, when we are a subreaper,
    every child of ours that is not a running renderer (an orphan reparented to us). Then
    everything below a root. Never ourselves, never a running renderer, never a taskcard
    host (one a renderer started for another workdir), nor anything below them.
    """
    rows = {entry.pid: entry for entry in table}
    roots = {pid for pid, entry in rows.items() if entry.tagged}
    if leader is not None:
        roots.add(leader)
    if subreaper:
        roots |= {pid for pid, entry in rows.items() if entry.ppid == me}
    protected = set(live_leaders) | {me} | {pid for pid, entry in rows.items() if entry.host}
    doomed: set[int] = set()
    for pid in rows:
        chain: list[int] = []
        current: int | None = pid
        verdict = False
        while current is not None and current not in chain and len(chain) < 4096:
            if current in protected:
                break
            chain.append(current)
            if current in doomed or current in roots:
                verdict = True
                break
            entry = rows.get(current)
            current = entry.ppid if entry is not None and entry.ppid > 0 else None
        if verdict:
            doomed.update(chain)
    return doomed - protected


class _Fence:
    """Process-wide state of the sweep: running renderers and whether we are a subreaper."""

    lock: ClassVar[threading.Lock] = threading.Lock()
    live_leaders: ClassVar[set[int]] = set()
    subreaper: ClassVar[bool] = False


def become_subreaper() -> bool:
    """Make this process the reaper of orphaned descendants (Linux). False if unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False
    _Fence.subreaper = _Fence.subreaper or ok
    return ok


def _read_proc(path: str, limit: int = 4096) -> bytes | None:
    """One small /proc file, without pathlib's per-call cost; None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_pid_max() -> int | None:
    raw = _read_proc("/proc/sys/kernel/pid_max", 64)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


_PID_MAX: Final = _read_pid_max()


def _fork_count() -> int | None:
    """Processes and threads created since boot, machine-wide (`processes` in /proc/stat)."""
    raw = _read_proc("/proc/stat", 65536)
    if raw is None:
        return None
    start = raw.find(b"\nprocesses ")
    if start < 0:
        return None
    end = raw.find(b"\n", start + 1)
    try:
        return int(raw[start + 11 : end if end > 0 else None])
    except ValueError:
        return None


def _pid_cursor() -> tuple[int, int] | None:
    """(last pid allocated in our namespace, threads alive) from /proc/loadavg."""
    raw = _read_proc("/proc/loadavg", 256)
    if raw is None:
        return None
    fields = raw.split()
    try:
        threads = int(fields[3].split(b"/")[1])
        return int(fields[4]), threads
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class PidWindow:
    """The pids allocated from `first` up to `last`, in allocation order (circular)."""

    first: int
    last: int

    def __contains__(self, pid: object) -> bool:
        if not isinstance(pid, int):
            return False
        if self.last >= self.first:
            return self.first <= pid <= self.last
        return pid >= self.first or pid <= self.last  # the counter wrapped once


def pid_window(
    leader: int,
    forks_at_spawn: int | None,
    forks_now: int | None,
    cursor: tuple[int, int] | None,
    pid_max: int | None,
) -> PidWindow | None:
    """The pids a descendant of `leader` can have, or None: read every process. Pure.

    Sound only while the pid counter has not gone all the way round since the spawn. A full
    round allocates every free pid of the ring, so it needs at least `pid_max - 300 - alive`
    allocations; the machine-wide fork count since the spawn (an upper bound of ours) plus the
    threads alive must stay under half of that ring.
    """
    if forks_at_spawn is None or forks_now is None or cursor is None or pid_max is None:
        return None
    last, threads = cursor
    if not (0 < leader < pid_max and 0 < last < pid_max):
        return None
    forks = forks_now - forks_at_spawn
    if forks < 0 or forks + threads >= (pid_max - _RESERVED_PIDS) // 2:
        return None
    return PidWindow(leader, last)


_FORKS_REUSE_S: Final = 5.0  # an older reading is read again: it would only widen the bound


class _Forks:
    """The last reading of the fork count, shared by the runs of this process.

    A spawn mark needs the fork count at the spawn, as a lower bound: any reading taken
    before the spawn is one (the count only grows), and it only makes the count since the
    spawn look larger, so `pid_window` falls back to reading all of /proc sooner, never
    later. So the mark takes the last reading of any run's sweep (recent enough) instead of
    reading /proc/stat again: one read of it per clean run instead of two. Reads and writes
    happen under `_Fence.lock`, which also covers the spawn.
    """

    seen: ClassVar[tuple[float, int] | None] = None

    @classmethod
    def now(cls) -> int | None:
        count = _fork_count()
        if count is not None:
            cls.seen = (time.monotonic(), count)
        return count

    @classmethod
    def before_spawn(cls) -> int | None:
        seen = cls.seen
        if seen is not None and time.monotonic() - seen[0] < _FORKS_REUSE_S:
            return seen[1]
        return cls.now()


@dataclass(frozen=True)
class SpawnMark:
    """A lower bound of the kernel's fork count when a renderer was spawned."""

    leader: int
    forks: int | None

    def window(self) -> PidWindow | None:
        return pid_window(self.leader, self.forks, _Forks.now(), _pid_cursor(), _PID_MAX)


def _snapshot(
    token: bytes | None, window: PidWindow | None = None, *, marker: bytes | None = None
) -> list[ProcEntry]:
    """Processes from /proc, only those inside `window` when one is given.

    A small window is probed pid by pid instead of listing /proc (the listing alone costs more
    than the probes). A probe also finds threads, which the listing hides; a thread other than
    its process's first has `exit_signal` -1 in its stat and is left out, so a thread of a live
    renderer is never taken for an orphan.

    In a subreaper the environments are not read: every descendant of a finished renderer
    then hangs, through descendants only, under an orphan reparented to us, which
    `decide_doomed` takes as a root; the token only matters where orphans go to init.
    A `marker` given (one whole `NAME=value` entry) is looked for in every environment.
    Wherever an environment is read, and always for our own children in a subreaper (the
    orphans `decide_doomed` would take as roots), it also tells a taskcard host apart
    (`HOST_PROCESS_ENV`).
    """
    if marker is None and token and not _Fence.subreaper:
        marker = f"{RENDER_TOKEN_ENV}=".encode() + token
    me = os.getpid()
    if window is not None and window.first <= window.last <= window.first + _PROBE_MAX:
        pids: Iterable[int] = range(window.first, window.last + 1)
        probing = True
    else:
        pids = _listed_pids(window)
        probing = False
    entries = []
    for pid in pids:
        stat = _read_proc(f"/proc/{pid}/stat")
        if stat is None:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) < 2 or (probing and len(fields) > 35 and fields[35] == b"-1"):
            continue
        ppid = int(fields[1])
        tagged = host = False
        if marker is not None or (ppid == me and _Fence.subreaper):
            environ = _read_proc(f"/proc/{pid}/environ", 1 << 20)
            names = environ.split(b"\0") if environ is not None else []
            tagged = marker is not None and marker in names
            host = _HOST_MARK in names and not any(
                name.startswith(_RENDER_MARK_PREFIXES) for name in names
            )
        entries.append(
            ProcEntry(
                pid,
                ppid,
                fields[0] == b"Z",
                tagged,
                _start_field(fields),
                int(fields[2]) if fields[2].lstrip(b"-").isdigit() else None,
                host,
            )
        )
    return entries


def _start_field(fields: list[bytes]) -> int | None:
    """`starttime` (field 22 of /proc/<pid>/stat) from the fields after the command name."""
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _start_time(pid: int) -> int | None:
    stat = _read_proc(f"/proc/{pid}/stat")
    return None if stat is None else _start_field(stat.rsplit(b")", 1)[-1].split())


def kill_seen(entry: ProcEntry, *, group: bool = False) -> None:
    """SIGKILL the process `entry` describes, never one that took its pid since.

    With `group`, its whole process group instead (`entry` must lead it): checked the same
    way, so the group is the one the leader still holds (a group's id cannot be handed to a
    new process while any member of the group lives).

    Between the snapshot and the kill, a doomed process may have exited and been reaped,
    and its pid handed to an unrelated process. A pidfd names one process for good: it is
    opened first, then the start time read under that pid must still be the snapshot's, and
    the signal goes through the pidfd. Without pidfds (Linux before 5.3) the start time is
    compared just before `kill`, which narrows the window to microseconds.
    """
    pidfd_open = getattr(os, "pidfd_open", None)
    send = getattr(signal, "pidfd_send_signal", None)
    fd: int | None = None
    if pidfd_open is not None and send is not None:
        try:
            fd = int(pidfd_open(entry.pid))
        except ProcessLookupError:
            return  # gone already
        except OSError:
            fd = None
    try:
        if entry.start is not None and _start_time(entry.pid) != entry.start:
            return  # another process holds the pid now (or none does)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(entry.pid, signal.SIGKILL)
            elif fd is not None and send is not None:
                send(fd, signal.SIGKILL)
            else:
                os.kill(entry.pid, signal.SIGKILL)
    finally:
        if fd is not None:
            os.close(fd)


def _listed_pids(window: PidWindow | None) -> list[int]:
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    return pids if window is None else [pid for pid in pids if pid in window]


def _sweep(token: bytes | None, leader: int | None, mark: SpawnMark | None = None) -> bool:
    """Kill what `decide_doomed` names until nothing is left; reap our zombie children.

    True when it ended with nothing alive to kill (after the renderer's exit that proves no
    descendant is left). With a `mark`, only processes created since that spawn are read.
    Caller holds `_Fence.lock`. Bounded: a fork bomb outrunning SIGKILL ends the sweep after
    `_SWEEP_ROUNDS` rounds; the next run or the host's idle loop sweeps again.
    """
    if token is None and not _Fence.subreaper:
        return True
    me = os.getpid()
    for _ in range(_SWEEP_ROUNDS):
        table = _snapshot(token, mark.window() if mark is not None else None)
        live = frozenset(_Fence.live_leaders - {leader})
        doomed = decide_doomed(
            table, me=me, leader=leader, live_leaders=live, subreaper=_Fence.subreaper
        )
        by_pid = {entry.pid: entry for entry in table}
        running = [pid for pid in doomed if not by_pid[pid].zombie]
        for pid in running:
            kill_seen(by_pid[pid])
        for entry in table:
            # The leader is left to its Popen, which must collect its real exit status.
            if entry.ppid == me and entry.zombie and entry.pid not in live | {leader}:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(entry.pid, os.WNOHANG)
        if not running:
            return True
        time.sleep(_SWEEP_PAUSE_S)
    return False


def _lower_priority(pid: int, increment: int) -> None:
    """Renice a just-spawned renderer below us; raising it back needs no privilege we use."""
    if increment <= 0:
        return
    with contextlib.suppress(OSError):
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, pid, min(_NICE_MAX, mine + increment))


def end_leftover_renders(host_tag: str) -> int:
    """SIGKILL what the renders of a dead host left running; how many processes it killed.

    A host killed with SIGKILL cannot end the run it was supervising: the renderer (in its
    own session) and whatever it started go on, for its whole timeout or for ever. Every
    render of a host carries `RENDER_HOST_ENV=host_tag` in its environment (descendants
    inherit it), so the next host of the workdir, which learns the dead host's tag from the
    workdir lock's note (`workdir_lock.Holder.leftover_tag`), kills every process carrying
    it, each renderer's whole process group first, and whatever lives below one. Nothing else:
    a process that merely took a recorded pid carries no such tag (a random 128-bit value),
    and each kill checks the start time the scan saw (`kill_seen`). It reads every process
    once per round, but runs only when a host of this workdir died without ending cleanly.
    A descendant that both cleared its environment and left the renderer's group and
    ancestry is not found (as in the in-process API's sweep).
    """
    marker = f"{RENDER_HOST_ENV}={host_tag}".encode()
    me = os.getpid()
    killed: set[tuple[int, int | None]] = set()
    with _Fence.lock:
        for _ in range(_SWEEP_ROUNDS):
            table = _snapshot(None, None, marker=marker)
            doomed = decide_doomed(
                table,
                me=me,
                leader=None,
                live_leaders=frozenset(_Fence.live_leaders),
                subreaper=False,
            )
            # A renderer leads its own group, and only its descendants can join it (it leads
            # its session too): members that cleared their environment and lost their
            # parent are still in it.
            leaders = {entry.pid for entry in table if entry.tagged and entry.pgrp == entry.pid}
            doomed |= {entry.pid for entry in table if entry.pgrp in leaders}
            doomed -= {me, *_Fence.live_leaders, *(entry.pid for entry in table if entry.host)}
            by_pid = {entry.pid: entry for entry in table}
            # Without a start time the pid's holder cannot be checked at the kill: left alone.
            running = [
                by_pid[pid]
                for pid in doomed
                if not by_pid[pid].zombie and by_pid[pid].start is not None
            ]
            if not running:
                break
            for pid in leaders & doomed - {entry.pid for entry in table if entry.start is None}:
                kill_seen(by_pid[pid], group=True)  # the whole group at once, then each one
            for entry in running:
                kill_seen(entry)
                killed.add((entry.pid, entry.start))
            time.sleep(_SWEEP_PAUSE_S)
    return len(killed)


def reap_orphans() -> None:
    """In a subreaper: kill leftover renderer descendants and reap zombies. Cheap otherwise."""
    if not _Fence.subreaper:
        return
    with _Fence.lock:
        _sweep(None, None)


def _devnull() -> int:
    """One read-only /dev/null for every renderer's stdin, opened once (close-on-exec here;
    the spawn duplicates it onto the child's fd 0)."""
    global _DEVNULL_FD
    if _DEVNULL_FD is None:
        _DEVNULL_FD = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return _DEVNULL_FD


_DEVNULL_FD: int | None = None


def run_renderer(request: RunRequest, cancel: threading.Event) -> RunOutcome:
    """Run `[sys.executable, renderer]` in its own session with every bound enforced.

    The pipes are made here and handed to `Popen` as plain descriptors, so the spawn builds
    no file objects and opens no /dev/null of its own; the parent reads them with `os.read`.
    """
    started = time.monotonic()
    token = uuid.uuid4().hex
    env = {**request.env, RENDER_TOKEN_ENV: token}
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        with _Fence.lock:
            forks = _Forks.before_spawn()
            proc = subprocess.Popen(
                [sys.executable, str(request.renderer)],
                cwd=request.workdir,
                env=env,
                stdin=_devnull(),
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
                close_fds=True,
            )
            _Fence.live_leaders.add(proc.pid)
            mark = SpawnMark(proc.pid, forks)
    except OSError as exc:
        for fd in (out_r, err_r):
            os.close(fd)
        return RunOutcome(None, False, False, b"", False, b"", exc.strerror or "spawn failed", 0.0)
    finally:
        os.close(out_w)
        os.close(err_w)
    _lower_priority(proc.pid, request.nice_increment)
    clean = False
    try:
        outcome, clean = _supervise(proc, (out_r, err_r), request, cancel, started, token, mark)
        return outcome
    finally:
        with _Fence.lock:
            _Fence.live_leaders.discard(proc.pid)
            if not clean:
                _sweep(token.encode(), proc.pid, mark)


def _has_exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the renderer exited, leaving it unreaped until `proc.wait()` at the end of the
    run: until then its pid, and so its process group's id, cannot be handed to another
    process, so the group kill and the sweeps can only reach the renderer's own processes."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already collected (the wait without pidfds)
        return proc.poll() is not None


def _exit_watch(pid: int) -> int | None:
    """A pidfd that polls readable once `pid` exits (Linux 5.3+), or None: poll the status."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(pid))
    except OSError:
        return None


def _pipe_holds(fd: int, limit: int) -> bool:
    """Whether the pipe `fd` reads from can hold more than `limit` bytes unread (Linux)."""
    get_size = getattr(fcntl, "F_GETPIPE_SZ", None)
    if get_size is None:
        return False
    try:
        return int(fcntl.fcntl(fd, get_size)) > limit
    except OSError:
        return False


def _drain(fd: int, into: bytearray, limit: int | None) -> bool:
    """Read what a non-blocking pipe holds into `into`; True when the pipe has ended.

    With a `limit` (stdout) it stops once `into` is past it; without one (stderr) it keeps
    the last `STDERR_TAIL_BYTES` and reads at most `_DRAIN_CHUNKS` chunks, so a renderer
    writing as fast as we read cannot hold the loop.
    """
    for _ in range(_DRAIN_CHUNKS):
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            return True
        into += chunk
        if limit is None:
            del into[:-STDERR_TAIL_BYTES]
        elif len(into) > limit:
            return False
    return False


def _supervise(
    proc: subprocess.Popen[bytes],
    pipes: tuple[int, int],
    request: RunRequest,
    cancel: threading.Event,
    started: float,
    token_text: str,
    mark: SpawnMark,
) -> tuple[RunOutcome, bool]:
    """The run's outcome, and whether a sweep after the renderer's exit proved it left nothing.

    One `poll(2)` set holds a pidfd of the renderer (Linux 5.3+). When stdout's pipe can
    hold more than the stdout limit (64 KiB against the default limit of 12 KiB), the
    renderer can never block on stdout before going past the limit (one that shrinks its own
    pipe only slows itself: it is still read every `_POLL_S`), so neither pipe wakes
    the loop at first: both are read without waiting (non-blocking) on every wake, which is
    the exit for a normal run, or every `_POLL_S` while it runs (a renderer flooding stdout
    is cut off at the first of these). After the first quiet `_POLL_S`, stderr joins the
    poll set, so a long renderer writing much to stderr is read as it writes; once the
    renderer is gone both pipes do (a descendant may still hold them). A normal run then
    wakes the loop once (exit) instead of four times (output, end of stderr, end of stdout,
    exit). Otherwise both pipes are polled from the start; without a pidfd the exit is
    polled as before: a short wait once both pipes have closed, and a status check per wake.
    """
    out_fd, err_fd = pipes
    token = token_text.encode()
    deadline = started + request.timeout_s
    out = bytearray()
    err = bytearray()
    overflow = timed_out = cancelled = leader_gone = clean = False
    pidfd = _exit_watch(proc.pid)
    poller = select.poll()
    open_fds = {out_fd, err_fd}
    out_polled = pidfd is None or not _pipe_holds(out_fd, request.stdout_limit_bytes)
    err_polled = out_polled  # stderr waits for the first quiet `_POLL_S` (see above)
    for fd, polled in ((out_fd, out_polled), (err_fd, err_polled)):
        if polled:
            poller.register(fd, select.POLLIN)
        else:
            os.set_blocking(fd, False)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    grace_end: float | None = None  # both pipes closed: the exit is due by then
    try:
        while open_fds or not leader_gone:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if cancel.is_set():
                cancelled = True
                break
            exited = False
            if not open_fds:
                # Both pipes closed: the renderer is normally in the middle of exiting. Give it
                # a moment, so the one sweep below runs after its exit and can prove it clean;
                # one that lingers longer is killed by the sweep after the loop, as ever.
                if grace_end is None:
                    grace_end = min(now + _EXIT_GRACE_S, deadline)
                if now >= grace_end:
                    break
                if pidfd is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(grace_end - now)
                    exited = True
            if not exited:
                wait_s = min(_POLL_S, deadline - now, (grace_end or deadline) - now)
                events = poller.poll(max(1, math.ceil(wait_s * 1000)))
                if not events and not err_polled and err_fd in open_fds:
                    poller.register(err_fd, select.POLLIN)  # a long run: read stderr as it comes
                    err_polled = True
                for fd, _ in events:
                    if fd == pidfd:
                        poller.unregister(fd)
                        exited = True
                        continue
                    try:
                        chunk = os.read(fd, _READ_CHUNK)
                    except BlockingIOError:  # a non-blocking pipe: nothing after all
                        continue
                    if not chunk:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                    elif fd == out_fd:
                        out += chunk
                        if len(out) > request.stdout_limit_bytes:
                            overflow = True
                    else:
                        err += chunk
                        del err[:-STDERR_TAIL_BYTES]
                if not err_polled and err_fd in open_fds and _drain(err_fd, err, None):
                    open_fds.discard(err_fd)
                if not out_polled and out_fd in open_fds:
                    if _drain(out_fd, out, request.stdout_limit_bytes):
                        open_fds.discard(out_fd)
                    overflow = len(out) > request.stdout_limit_bytes
                if overflow:
                    break
            if leader_gone:
                if open_fds:
                    # Something still holds the pipes although the sweep after the exit
                    # found nothing left: a descendant it missed (one caught in the middle of
                    # an exec reads an empty environment, so it bore no token then). Look
                    # again on every wake (every `_POLL_S` at most) until the pipes close.
                    with _Fence.lock:
                        clean = _sweep(token, proc.pid, mark)
                continue
            if not (exited or pidfd is None):
                continue
            if _has_exited(proc):
                # The leader is gone: drain what is buffered, then stop waiting for pipes that
                # a leftover descendant might hold open forever.
                leader_gone = True
                # What a descendant may still write until the sweep kills it must now wake
                # the loop.
                for fd, polled in ((out_fd, out_polled), (err_fd, err_polled)):
                    if not polled and fd in open_fds:
                        poller.register(fd, select.POLLIN)
                out_polled = err_polled = True
                _kill_group(proc.pid)
                with _Fence.lock:
                    clean = _sweep(token, proc.pid, mark)
            elif exited and pidfd is not None:
                pidfd_fd, pidfd = pidfd, None  # readable pidfd, no status yet: poll the status
                os.close(pidfd_fd)
    finally:
        if pidfd is not None:
            os.close(pidfd)
        if not clean:
            with _Fence.lock:
                _sweep(token, proc.pid, mark)  # while the renderer's ancestry is still intact
            _kill_group(proc.pid)  # a clean sweep already proved the group empty
        os.close(out_fd)
        os.close(err_fd)
        exit_code = proc.wait()
    outcome = RunOutcome(
        exit_code=None if (timed_out or cancelled or overflow) else exit_code,
        timed_out=timed_out,
        cancelled=cancelled,
        stdout=bytes(out[: request.stdout_limit_bytes]),
        stdout_overflow=overflow,
        stderr_tail=bytes(err),
        spawn_error=None,
        duration_s=time.monotonic() - started,
    )
    return outcome, clean


@dataclass(frozen=True)
class Rendered:
    body: str


@dataclass(frozen=True)
class RenderFailure:
    code: ErrorCode
    message: str


def _signal_name(number: int) -> str:
    """`SIGKILL` for 9; a number this system names no signal for stays a number."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unnamed"


def classify(
    outcome: RunOutcome, max_body_chars: int, timeout_s: float
) -> Rendered | RenderFailure:
    """What a run means. Pure: the same outcome always gets the same verdict."""
    if outcome.spawn_error is not None:
        return RenderFailure(
            "renderer_failed", f"the renderer could not start: {outcome.spawn_error}"
        )
    if outcome.cancelled:
        return RenderFailure("renderer_failed", "the run was cancelled because the watch stopped")
    if outcome.timed_out:
        return RenderFailure(
            "renderer_timeout", f"the renderer ran longer than {timeout_s:g} s and was killed"
        )
    if outcome.stdout_overflow:
        return RenderFailure(
            "body_too_large",
            f"the renderer printed far more than max-body-chars ({max_body_chars}); refused",
        )
    if outcome.exit_code is not None and outcome.exit_code < 0:
        # `Popen`'s negative code is a signal, which "exited with code -9" hid: a renderer
        # killed from outside (the kernel's out-of-memory killer sends SIGKILL) or crashed.
        number = -outcome.exit_code
        return RenderFailure(
            "renderer_nonzero_exit",
            f"the renderer did not exit: it was ended by signal {number} ({_signal_name(number)})",
        )
    if outcome.exit_code != 0:
        return RenderFailure(
            "renderer_nonzero_exit", f"the renderer exited with code {outcome.exit_code}"
        )
    try:
        body = outcome.stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RenderFailure(
            "renderer_invalid_utf8", f"stdout is not valid UTF-8 (byte offset {exc.start})"
        )
    if not shows_text(body):
        return RenderFailure(
            "renderer_blank_output",
            "the renderer printed nothing but whitespace or invisible characters",
        )
    if (chars := body_chars(body)) > max_body_chars:
        return RenderFailure(
            "body_too_large",
            f"the body has {chars} characters, over max-body-chars ({max_body_chars}); "
            "refused, not truncated: keep the card short and link details",
        )
    return Rendered(body)
