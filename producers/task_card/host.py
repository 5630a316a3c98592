"""The per-workdir background host: a `TaskCard` behind a unix socket.

The shell and MCP forms are short-lived, but a watch must outlive them, so they hand calls to
this host. Protocol: one JSON line per connection, one JSON line back. Requests:
`{"op": "call", "envelope": {...}}`, `{"op": "ping"}`, `{"op": "turn"}`, `{"op": "meta"}`,
`{"op": "shutdown"}`. The host exits after `idle_grace_s` without a live watch or a request,
and on SIGTERM/SIGINT; exiting never ends a watch (its descriptor stays for the next host).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socketserver
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from producers.task_card.capability import TaskCard
from producers.task_card.runtime import HostAlreadyRunning, HostPaths

__all__ = ["HostAlreadyRunning", "HostServer", "serve_host"]

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES: Final = 1_000_000
_IDLE_CHECK_S: Final = 0.2


class _Handler(socketserver.StreamRequestHandler):
    server: HostServer

    def handle(self) -> None:
        self.server.touch()
        line = self.rfile.readline(MAX_REQUEST_BYTES)
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not an object")
            reply = self.server.answer(request)
        except ValueError as exc:
            reply = {"ok": False, "error": f"bad request: {exc}"}
        self.wfile.write((json.dumps(reply, ensure_ascii=False) + "\n").encode())
        self.server.touch()


class HostServer(socketserver.ThreadingUnixStreamServer):
    """Answers socket requests with the workdir's `TaskCard`."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, card: TaskCard, paths: HostPaths, stop: threading.Event) -> None:
        self.card = card
        self.stop = stop
        self._last_request = time.monotonic()
        with contextlib.suppress(FileNotFoundError):
            paths.socket.unlink()  # we hold the lock, so any socket file here is stale
        super().__init__(str(paths.socket), _Handler)
        os.chmod(paths.socket, 0o600)

    def touch(self) -> None:
        self._last_request = time.monotonic()

    def idle_for_s(self) -> float:
        return time.monotonic() - self._last_request

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "workdir": str(self.card.workdir)}
        if op == "call":
            return {"ok": True, "result": self.card.call(request.get("envelope") or {})}
        if op == "turn":
            self.card.on_completed_turn()
            return {"ok": True}
        if op == "meta":
            return {"ok": True, "meta": self.card.meta_payload()}
        if op == "shutdown":
            self.stop.set()
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {op!r}"}


def serve_host(
    card: TaskCard,
    idle_grace_s: float,
    stop: threading.Event,
    *,
    periodic: Callable[[], None] | None = None,
    periodic_s: float = 30.0,
) -> None:
    """Serve until `stop` is set or the host has been idle for `idle_grace_s`. Closes `card`.

    `periodic` (the ledger's monitor, when the workdir has a ledger) runs every `periodic_s`
    on this loop; a failing run is logged and the next one runs on time.
    """
    paths = card.host_paths
    try:
        server = HostServer(card, paths, stop)
    except OSError:
        card.close()
        raise
    loop = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    loop.start()
    log.info("task card host for %s listening (pid %d)", card.workdir, os.getpid())
    next_periodic = time.monotonic()
    try:
        while not stop.wait(_IDLE_CHECK_S):
            if periodic is not None and time.monotonic() >= next_periodic:
                next_periodic = time.monotonic() + periodic_s
                try:
                    periodic()
                except Exception:  # one bad run must not end the host or its watch
                    log.exception("periodic check for %s failed", card.workdir)
            if card.has_live_watch():
                server.touch()
            elif server.idle_for_s() >= idle_grace_s:
                log.info("task card host idle for %.0f s, exiting", idle_grace_s)
                break
    finally:
        server.shutdown()
        loop.join()
        server.server_close()
        with contextlib.suppress(FileNotFoundError):
            paths.socket.unlink()
        card.close()


def install_stop_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT end the host cleanly (the watch itself survives for the next host)."""

    def handle(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
