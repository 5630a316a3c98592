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
  children whose parent is still alive, and orphans, in any process);
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
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final, Literal, Protocol

STDERR_TAIL_BYTES: Final = 4096
_READ_CHUNK: Final = 65536
_POLL_S: Final = 0.05
RENDER_TOKEN_ENV: Final = "TASKCARD_RENDER_TOKEN"
_PR_SET_CHILD_SUBREAPER: Final = 36
_SWEEP_ROUNDS: Final = 100
_SWEEP_PAUSE_S: Final = 0.01
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


class RendererPathError(ValueError):
    """The renderer path is not a regular file inside the workdir."""


def resolve_renderer(workdir: Path, renderer_path: str) -> Path:
    """The resolved renderer file; symlinks are followed before the inside-workdir check."""
    root = workdir.resolve()
    candidate = Path(renderer_path)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        resolved = candidate.resolve(strict=True)
    except (OSError, RuntimeError):
        raise RendererPathError(
            f"renderer_path: {renderer_path!r} does not exist (relative paths start at the workdir)"
        ) from None
    if not resolved.is_relative_to(root):
        raise RendererPathError(
            f"renderer_path: {renderer_path!r} resolves outside the workdir; keep it inside {root}"
        )
    if not resolved.is_file():
        raise RendererPathError(f"renderer_path: {renderer_path!r} is not a regular file")
    return resolved


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
    everything below a root. Never ourselves, never a running renderer or its subtree.
    """
    rows = {entry.pid: entry for entry in table}
    roots = {pid for pid, entry in rows.items() if entry.tagged}
    if leader is not None:
        roots.add(leader)
    if subreaper:
        roots |= {pid for pid, entry in rows.items() if entry.ppid == me}
    protected = set(live_leaders) | {me}
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


def _snapshot(token: bytes | None) -> list[ProcEntry]:
    marker = f"{RENDER_TOKEN_ENV}=".encode() + token if token else None
    entries = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) < 2:
            continue
        tagged = False
        if marker is not None:
            with contextlib.suppress(OSError):
                tagged = marker in Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        entries.append(ProcEntry(int(name), int(fields[1]), fields[0] == b"Z", tagged))
    return entries


def _sweep(token: bytes | None, leader: int | None) -> None:
    """Kill what `decide_doomed` names until nothing is left; reap our zombie children.

    Caller holds `_Fence.lock`. Bounded: a fork bomb outrunning SIGKILL ends the sweep after
    `_SWEEP_ROUNDS` rounds; the next run or the host's idle loop sweeps again.
    """
    if token is None and not _Fence.subreaper:
        return
    me = os.getpid()
    for _ in range(_SWEEP_ROUNDS):
        table = _snapshot(token)
        live = frozenset(_Fence.live_leaders - {leader})
        doomed = decide_doomed(
            table, me=me, leader=leader, live_leaders=live, subreaper=_Fence.subreaper
        )
        by_pid = {entry.pid: entry for entry in table}
        running = [pid for pid in doomed if not by_pid[pid].zombie]
        for pid in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for entry in table:
            # The leader is left to its Popen, which must collect its real exit status.
            if entry.ppid == me and entry.zombie and entry.pid not in live | {leader}:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(entry.pid, os.WNOHANG)
        if not running:
            return
        time.sleep(_SWEEP_PAUSE_S)


def reap_orphans() -> None:
    """In a subreaper: kill leftover renderer descendants and reap zombies. Cheap otherwise."""
    if not _Fence.subreaper:
        return
    with _Fence.lock:
        _sweep(None, None)


def run_renderer(request: RunRequest, cancel: threading.Event) -> RunOutcome:
    """Run `[sys.executable, renderer]` in its own session with every bound enforced."""
    started = time.monotonic()
    token = uuid.uuid4().hex
    env = {**request.env, RENDER_TOKEN_ENV: token}
    try:
        with _Fence.lock:
            proc = subprocess.Popen(
                [sys.executable, str(request.renderer)],
                cwd=request.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
            _Fence.live_leaders.add(proc.pid)
    except OSError as exc:
        return RunOutcome(None, False, False, b"", False, b"", exc.strerror or "spawn failed", 0.0)
    try:
        return _supervise(proc, request, cancel, started, token.encode())
    finally:
        with _Fence.lock:
            _Fence.live_leaders.discard(proc.pid)
            _sweep(token.encode(), proc.pid)


def _supervise(
    proc: subprocess.Popen[bytes],
    request: RunRequest,
    cancel: threading.Event,
    started: float,
    token: bytes,
) -> RunOutcome:
    assert proc.stdout is not None and proc.stderr is not None
    deadline = started + request.timeout_s
    out = bytearray()
    err = bytearray()
    overflow = timed_out = cancelled = leader_gone = False
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, "out")
    selector.register(proc.stderr, selectors.EVENT_READ, "err")
    try:
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if cancel.is_set():
                cancelled = True
                break
            for key, _ in selector.select(timeout=min(_POLL_S, deadline - now)):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.data == "out":
                    out += chunk
                    if len(out) > request.stdout_limit_bytes:
                        overflow = True
                else:
                    err += chunk
                    del err[:-STDERR_TAIL_BYTES]
            if overflow:
                break
            if proc.poll() is not None and not leader_gone:
                # The leader is gone: drain what is buffered, then stop waiting for pipes that
                # a leftover descendant might hold open forever.
                leader_gone = True
                _kill_group(proc.pid)
                with _Fence.lock:
                    _sweep(token, proc.pid)
    finally:
        selector.close()
        with _Fence.lock:
            _sweep(token, proc.pid)  # while the renderer's ancestry is still intact
        _kill_group(proc.pid)
        proc.stdout.close()
        proc.stderr.close()
        exit_code = proc.wait()
    return RunOutcome(
        exit_code=None if (timed_out or cancelled or overflow) else exit_code,
        timed_out=timed_out,
        cancelled=cancelled,
        stdout=bytes(out[: request.stdout_limit_bytes]),
        stdout_overflow=overflow,
        stderr_tail=bytes(err),
        spawn_error=None,
        duration_s=time.monotonic() - started,
    )


@dataclass(frozen=True)
class Rendered:
    body: str


@dataclass(frozen=True)
class RenderFailure:
    code: ErrorCode
    message: str


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
    if not body.strip():
        return RenderFailure("renderer_blank_output", "the renderer printed nothing but whitespace")
    if len(body) > max_body_chars:
        return RenderFailure(
            "body_too_large",
            f"the body has {len(body)} characters, over max-body-chars ({max_body_chars}); "
            "refused, not truncated: keep the card short and link details",
        )
    return Rendered(body)
