"""Reaching a workdir's host from a short-lived process, starting it when none runs."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import taskcard.producers.task_card.workdir_lock as workdir_lock
from taskcard.producers.task_card.contract import CardPaths, shown_path
from taskcard.producers.task_card.envelope import (
    READ_ONLY_ACTIONS,
    Envelope,
    EnvelopeError,
    StartInput,
    check_values,
    parse_envelope,
)
from taskcard.producers.task_card.runtime import CardFolderUnsafe, HostPaths, RuntimeDirUnsafe

SPAWN_TIMEOUT_S: Final = 60.0
EXIT_ALREADY_RUNNING: Final = 3
CALL_TIMEOUT_S: Final = 600.0
# How often a call that can be cancelled looks at its flag while it waits for the reply.
_CANCEL_CHECK_S: Final = 0.2
# The statuses of a call that was refused or failed; a watch's own states are not among them.
FAILED_STATES: Final = frozenset({"failed", "stop_failed", "remove_blocked", "remove_failed"})
# The `code` of a call refused for what it was given: an envelope that breaks the transport
# rules or the schema (an unknown action, a missing or mistyped field), a `renderer_path` that
# names no renderer file inside the workdir. A usage error (exit 2 of `taskcard tool` and
# `taskcard card`), as a `--workdir` that names no folder is; a bad renderer path, and an
# envelope the schema refused, exited 1, as if the call had failed at its work.
USAGE_CODES: Final = frozenset({"bad_envelope", "bad_renderer_path"})


def call_failed(result: Mapping[str, Any]) -> bool:
    """Whether a `task_card` result says the call failed: the one mapping behind the exit code
    1 of `taskcard tool` and `taskcard card` and the `isError` of the MCP tool.

    A refusal or a failure state, and a `retry` whose render failed: its answer is the watch
    (in `error`, or still `stopped`) with the render's `refresh_error`, and the card kept its
    last body; `card retry` exited 0 for it. An `inspect` of a watch in `error` succeeded: it
    looked."""
    return result.get("status") in FAILED_STATES or result.get("refresh_error") is not None


class HostUnavailable(RuntimeError):
    """No host answered and none could be started."""


class HostElsewhere(HostUnavailable):
    """Something holds the workdir that we cannot talk to: a host under another runtime
    folder than ours, a program running the card through its own Python `TaskCard`, or a
    host of ours that holds it and does not answer on its socket (stopped, stuck, or its
    socket removed). The command line's exit 3, MCP's `workdir_held`."""


def request_host(
    paths: HostPaths,
    request: dict[str, Any],
    timeout_s: float,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """One request, one reply. Raises OSError when nothing listens.

    `cancel` set while waiting for the reply (the caller gave up): our side of the
    connection is shut, which the host takes as the caller's hangup (a start still in its
    first render stops there), and the reply is still read, so the call ends with what the
    host did."""
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(str(paths.socket))
        _check_peer(conn, paths)
        # Not ASCII-escaped: escapes would triple non-Latin text past the host's line cap.
        conn.sendall((json.dumps(request, ensure_ascii=False) + "\n").encode())
        chunks = []
        watching = cancel is not None
        while True:
            if watching:
                conn.settimeout(max(0.001, min(_CANCEL_CHECK_S, deadline - time.monotonic())))
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                if not watching or time.monotonic() >= deadline:
                    raise
                if cancel is not None and cancel.is_set():
                    conn.shutdown(socket.SHUT_WR)
                    watching = False
                    conn.settimeout(max(0.001, deadline - time.monotonic()))
                continue
            if not chunk:
                break
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                break
    data = b"".join(chunks)
    if not data.endswith(b"\n"):  # every reply is one whole line: the host went away
        raise OSError(
            "the task card host ended before it answered (stopped or killed); call again:"
            " the next host resumes the watch"
        )
    try:
        reply = json.loads(data)
    except (ValueError, RecursionError):
        raise OSError("malformed reply from the task card host") from None
    if not isinstance(reply, dict):
        raise OSError("malformed reply from the task card host")
    return reply


def _check_peer(conn: socket.socket, paths: HostPaths) -> None:
    """Talk only to a host running as ourselves: envelopes carry the agent's reasoning."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.getuid():
        raise OSError(f"the socket {paths.socket} is served by uid {uid}, not by you")


def ping(paths: HostPaths) -> bool:
    try:
        return bool(request_host(paths, {"op": "ping"}, 5.0).get("ok"))
    except (OSError, ValueError):
        return False


def spawn_detached_host(paths: HostPaths, idle_grace_s: float | None = None) -> bool:
    """Start a host in its own session via `host --detach`, which returns at once; True when
    that host was refused because another holds the workdir (and answers nobody yet).

    The detaching step is a separate short process so the host is never our child: no zombie
    in a long-lived caller (the MCP server) and no subprocess object left unreaped here.
    """
    command = [
        sys.executable,
        "-m",
        "taskcard.producers.task_card.cli",
        "host",
        "--detach",
        "--workdir",
        str(paths.workdir),
        "--runtime-dir",
        str(paths.runtime_dir),
    ]
    if idle_grace_s is not None:
        command += ["--idle-grace-s", str(idle_grace_s)]
    # Its words are not the caller's: a refusal (exit 3) is weighed below and said once by
    # the caller (`held_refusal` after the wait), a failure by the line raised here.
    done = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=SPAWN_TIMEOUT_S * 2,
    )
    if done.returncode == EXIT_ALREADY_RUNNING and not ping(paths):
        holder = workdir_lock.read_holder(paths.workdir)
        # A host of ours still starting will answer soon (`ensure_host` waits for it); a
        # program's own TaskCard never will, and one under another folder never to us.
        if holder is not None and (
            holder.served is False or holder.runtime_dir != str(paths.runtime_dir)
        ):
            raise HostElsewhere(holder.describe(paths.workdir))
    if done.returncode not in (0, EXIT_ALREADY_RUNNING):
        raise HostUnavailable(
            f"the task card host for {paths.workdir} failed to start; see its log at {paths.log}"
        )
    return done.returncode == EXIT_ALREADY_RUNNING


def _check_card_folder(workdir: Path) -> None:
    """`CardFolderUnsafe` when `taskcard/` or `.taskcard-host/` leads out of the workdir; not
    a folder, unreadable: the host says what it can do with it."""
    try:
        workdir_lock.check_folders(workdir)
    except workdir_lock.CardFolderOutside as exc:
        raise CardFolderUnsafe(str(exc)) from None


def ensure_host(paths: HostPaths, idle_grace_s: float | None = None) -> None:
    """Make sure a host answers for the workdir (it rehydrates a persisted watch on start).

    Raises `RuntimeDirUnsafe` before anything is sent when the runtime folder is not ours,
    and `CardFolderUnsafe` when the workdir's `taskcard/` or `.taskcard-host/` leads out of
    it (no host would start there).
    """
    paths.ensure_dir()
    _check_card_folder(paths.workdir)
    if ping(paths):
        return
    refused = spawn_detached_host(paths, idle_grace_s)
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while time.monotonic() < deadline:
        if ping(paths):
            return
        time.sleep(0.05)
    if refused:
        # The host we started was refused (exit 3): a host of ours holds the workdir and did
        # not answer in all that time. That was "no task card host answered", exit 4, as if
        # none ran: the user went looking for a host that failed to start.
        raise HostElsewhere(held_refusal(paths, SPAWN_TIMEOUT_S))
    raise HostUnavailable(
        f"no task card host answered for {paths.workdir}; see its log at {paths.log}"
    )


def held_refusal(paths: HostPaths, waited_s: float | None = None) -> str:
    """Why a host started for the workdir was refused (it is held), naming the holder: as
    `Holder.describe` says it for one we cannot talk to, else for a host of ours that does not
    answer on its socket (`waited_s`: how long it was given, None when not waited for), its
    pid and program (from the workdir's note, else the pid in the runtime lock) and the fix."""
    holder = workdir_lock.read_holder(paths.workdir)
    if holder is not None and (
        holder.served is False or holder.runtime_dir != str(paths.runtime_dir)
    ):
        return holder.describe(paths.workdir)
    pid = holder.pid if holder is not None else None
    if pid is None:
        pid = _runtime_lock_pid(paths)
    program = f": {shown_path(holder.program)}" if holder and holder.program else ""
    named = "unknown" if pid is None else str(pid)
    end = f"end it (kill {pid})" if pid is not None else "end it"
    said = (
        f"a task_card host holds {shown_path(paths.workdir)} (pid {named}{program}) but"
        f" {{}} on its socket {shown_path(paths.socket)}{{}}: {{}}see its log at"
        f" {shown_path(paths.log)}, then {end} and call again (its watch resumes in the next"
        " host)"
    )
    if waited_s is None:
        return said.format(
            "does not answer",
            " yet",
            "a host still starting answers in a moment (call again); one that never does is"
            " stopped, stuck, or its socket was removed: ",
        )
    return said.format(
        "did not answer",
        f" within {waited_s:g} s",
        "it is stopped, stuck, or its socket was removed; ",
    )


def _runtime_lock_pid(paths: HostPaths) -> int | None:
    """The pid the holder of the runtime lock wrote in it, None when unreadable."""
    try:
        fd = os.open(paths.lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 32).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if text.isdigit() and int(text) > 0 else None


def call_via_host(
    paths: HostPaths,
    envelope: Any,
    idle_grace_s: float | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Hand one envelope to the workdir's host, starting it if needed; the result dict.

    An envelope that fails the transport checks (see `envelope.check_values`) is refused here
    with the same result shape the host would give, before any host is started or contacted.
    So is one the schema refuses (an unknown action, a missing field): the host would answer
    it with the same sentence, but starting one for it left a process idling for its grace.
    So is a `start` whose `renderer_path` names no renderer file (`_renderer_refusal`).

    `manual` and `settings` only read files, and are answered here, as a host would answer
    them (`capability.read_only_answer`): no host is started or contacted, so they create
    nothing in the workdir or the runtime folder, and resume no watch a killed host left.
    `settings` raises `CardFolderUnsafe` as a host call does when `taskcard/` (where it
    reads) or `.taskcard-host/` leads out of the workdir: nothing is read through the link.
    """
    problem = check_values(envelope)
    if problem:
        return {"status": "failed", "code": "bad_envelope", "message": f"envelope: {problem}"}
    try:
        parsed = parse_envelope(envelope)
    except EnvelopeError as exc:  # the schema's refusal: the caller's envelope, as above
        return {"status": "failed", "code": "bad_envelope", "message": str(exc)}
    if parsed.action in READ_ONLY_ACTIONS:
        # Imported here: a call that goes to the host never loads the capability.
        from taskcard.producers.task_card.capability import read_only_answer

        if paths.chosen:  # a folder the user chose is refused as for any call, not made
            paths.check_dir()
        if parsed.action == "settings":
            # The settings are read in `taskcard/`: one leading out of the workdir is refused
            # as for the calls a host answers, not read as this workdir's.
            _check_card_folder(paths.workdir)
        return read_only_answer(parsed, CardPaths(paths.workdir.resolve()))
    if parsed.action == "start":
        refused = _renderer_refusal(parsed, paths.workdir)
        if refused is not None:
            return refused
    ensure_host(paths, idle_grace_s)
    if cancel is not None and cancel.is_set():
        return {"status": "failed", "code": "cancelled", "message": "cancelled; nothing was done"}
    request = {"op": "call", "envelope": envelope}
    reply = request_host(paths, request, CALL_TIMEOUT_S, cancel)
    if not reply.get("ok"):
        raise HostUnavailable(str(reply.get("error")))
    result = reply["result"]
    assert isinstance(result, dict)
    return result


def _renderer_refusal(parsed: Envelope, workdir: Path) -> dict[str, Any] | None:
    """The host's answer to a `start` whose `renderer_path` names no renderer file inside the
    workdir, or could not be looked at (`renderer.resolve_renderer`, which the host runs
    first too), given here without
    starting or asking a host: one started for it answered only this refusal and then idled
    for its grace (120 s by default), a process left behind by a command that was refused."""
    # Imported here: the renderer's module is read only for a start.
    from taskcard.producers.task_card.renderer import (
        RendererPathError,
        RendererUnreadable,
        resolve_renderer,
    )

    assert isinstance(parsed.input, StartInput)
    try:
        resolve_renderer(workdir, parsed.input.renderer_path)
    except (RendererPathError, RendererUnreadable) as exc:
        from taskcard.producers.task_card.capability import refused_answer

        # The host's codes (`TaskCard.start`): only the first is the caller's to mend.
        code = "bad_renderer_path" if isinstance(exc, RendererPathError) else "renderer_failed"
        return refused_answer(parsed, str(exc), code)
    return None


def host_log_file(paths: HostPaths) -> int:
    """An append descriptor for the detached host's stdout and stderr.

    Never through a symlink and only onto our own regular file: the log may carry paths and
    errors, and a planted link must not make us append to (or create) a file elsewhere.
    """
    paths.ensure_dir()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(paths.log, flags, 0o600)
    except OSError as exc:
        raise RuntimeDirUnsafe(
            f"host log {paths.log} cannot be opened safely ({exc.strerror}); remove it"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        raise RuntimeDirUnsafe(f"host log {paths.log} is not your regular file; remove it")
    os.set_blocking(fd, True)
    return fd


def workdir_paths(workdir: str | Path, runtime_dir: Path) -> HostPaths:
    return HostPaths(runtime_dir, Path(workdir).resolve())
