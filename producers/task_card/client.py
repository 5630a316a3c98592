"""Reaching a workdir's host from a short-lived process, starting it when none runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from producers.task_card.runtime import HostPaths

SPAWN_TIMEOUT_S: Final = 60.0
EXIT_ALREADY_RUNNING: Final = 3
CALL_TIMEOUT_S: Final = 600.0


class HostUnavailable(RuntimeError):
    """No host answered and none could be started."""


def request_host(paths: HostPaths, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One request, one reply. Raises OSError when nothing listens."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(str(paths.socket))
        conn.sendall((json.dumps(request) + "\n").encode())
        chunks = []
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                break
    reply = json.loads(b"".join(chunks))
    if not isinstance(reply, dict):
        raise OSError("malformed reply from the task card host")
    return reply


def ping(paths: HostPaths) -> bool:
    try:
        return bool(request_host(paths, {"op": "ping"}, 5.0).get("ok"))
    except (OSError, ValueError):
        return False


def spawn_detached_host(paths: HostPaths, idle_grace_s: float | None = None) -> None:
    """Start a host in its own session via `host --detach`, which returns at once.

    The detaching step is a separate short process so the host is never our child: no zombie
    in a long-lived caller (the MCP server) and no subprocess object left unreaped here.
    """
    command = [
        sys.executable,
        "-m",
        "producers.task_card.cli",
        "host",
        "--detach",
        "--workdir",
        str(paths.workdir),
        "--runtime-dir",
        str(paths.runtime_dir),
    ]
    if idle_grace_s is not None:
        command += ["--idle-grace-s", str(idle_grace_s)]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, timeout=SPAWN_TIMEOUT_S * 2)
    if done.returncode not in (0, EXIT_ALREADY_RUNNING):
        raise HostUnavailable(
            f"the task card host for {paths.workdir} failed to start; see its log at {paths.log}"
        )


def ensure_host(paths: HostPaths, idle_grace_s: float | None = None) -> None:
    """Make sure a host answers for the workdir (it rehydrates a persisted watch on start)."""
    if ping(paths):
        return
    spawn_detached_host(paths, idle_grace_s)
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while time.monotonic() < deadline:
        if ping(paths):
            return
        time.sleep(0.05)
    raise HostUnavailable(
        f"no task card host answered for {paths.workdir}; see its log at {paths.log}"
    )


def call_via_host(
    paths: HostPaths, envelope: Any, idle_grace_s: float | None = None
) -> dict[str, Any]:
    """Hand one envelope to the workdir's host, starting it if needed; the result dict."""
    ensure_host(paths, idle_grace_s)
    reply = request_host(paths, {"op": "call", "envelope": envelope}, CALL_TIMEOUT_S)
    if not reply.get("ok"):
        raise HostUnavailable(str(reply.get("error")))
    result = reply["result"]
    assert isinstance(result, dict)
    return result


def host_log_file(paths: HostPaths) -> int:
    """An append descriptor for the detached host's stdout and stderr."""
    paths.ensure_dir()
    return os.open(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def workdir_paths(workdir: str | Path, runtime_dir: Path) -> HostPaths:
    return HostPaths(runtime_dir, Path(workdir).resolve())
