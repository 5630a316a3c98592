"""The per-workdir background host: a `TaskCard` behind a unix socket.

The shell and MCP forms are short-lived, but a watch must outlive them, so they hand calls to
this host. Protocol: one JSON line per connection, one JSON line back. Requests:
`{"op": "call", "envelope": {...}}`, `{"op": "ping"}`, `{"op": "turn"}`, `{"op": "meta"}`,
`{"op": "shutdown"}`. The host exits after `idle_grace_s` without a live watch or a request,
and on SIGTERM/SIGINT; exiting never ends a watch (its descriptor stays for the next host).

A client that gives up on a `start` (its MCP call was cancelled) shuts its side of the
connection: the host watches the connection of a start for that hangup while it runs, and
sets the start's cancel flag (`TaskCard.start`: the first render stops, no watch is made).
So a client must keep its writing side open until the answer: one that half-closes after
its request line (as `nc -N` or `socat` may) cancels every start it sends.

A request line goes through the same transport checks as an envelope (`decode_envelope`):
size, UTF-8, NUL, nesting, JSON, object, valid Unicode. A refusal is answered, never dropped:
an oversized line is read on and thrown away (bounded) before the reply, so the sender sees
the reason instead of a reset connection. Replies are ASCII-escaped JSON, so no value can
make the reply itself unencodable.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.envelope import (
    MAX_ENVELOPE_BYTES,
    MAX_ENVELOPE_DEPTH,
    EnvelopeError,
    decode_envelope,
)
from taskcard.producers.task_card.renderer import reap_orphans
from taskcard.producers.task_card.runtime import HostAlreadyRunning, HostPaths

__all__ = ["HostAlreadyRunning", "HostServer", "serve_host"]

log = logging.getLogger(__name__)
# The envelope cap plus room for the wrapper and for escapes added by re-encoding.
MAX_REQUEST_BYTES: Final = 2 * MAX_ENVELOPE_BYTES + 4096
_DRAIN_BYTES: Final = 64 * 1024 * 1024
_DRAIN_TIMEOUT_S: Final = 5.0
_IDLE_CHECK_S: Final = 0.2


def _is_start(request: dict[str, Any]) -> bool:
    envelope = request.get("envelope")
    return (
        request.get("op") == "call"
        and isinstance(envelope, dict)
        and envelope.get("action") == "start"
    )


class _Handler(socketserver.StreamRequestHandler):
    server: HostServer

    def handle(self) -> None:
        self.server.touch()
        line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
        try:
            if len(line) > MAX_REQUEST_BYTES:
                self._drain()
            request = decode_envelope(
                line, what="request", max_bytes=MAX_REQUEST_BYTES, max_depth=MAX_ENVELOPE_DEPTH + 1
            )
            if _is_start(request):
                reply = self._answer_watching_hangup(request)
            else:
                reply = self.server.answer(request)
        except EnvelopeError as exc:
            reply = {"ok": False, "error": f"bad request: {exc}"}
        except Exception:  # a barrier: one bad request never leaves a client without an answer
            log.exception("a request failed inside the host")
            reply = {"ok": False, "error": "the host failed on this request; see its log"}
        self.wfile.write((json.dumps(reply) + "\n").encode())
        self.server.touch()

    def _answer_watching_hangup(self, request: dict[str, Any]) -> dict[str, Any]:
        cancel = threading.Event()
        wake_read, wake_write = os.pipe()
        watcher = threading.Thread(
            target=self._watch_hangup, args=(cancel, wake_read), name="start-hangup"
        )
        watcher.start()
        try:
            return self.server.answer(request, cancel)
        finally:
            os.write(wake_write, b"x")  # the start is done: the watcher ends at once
            watcher.join()
            os.close(wake_read)
            os.close(wake_write)

    def _watch_hangup(self, cancel: threading.Event, wake: int) -> None:
        """Set `cancel` when the client shuts its side before the answer: it sent its one
        line and only reads from now on, so the connection turning readable with nothing to
        read is its hangup. Anything else it sends is not a hangup and ends the watch, and
        so does a byte on `wake` (the start is done)."""
        poller = select.poll()
        # POLLRDHUP is Linux's; elsewhere the hangup shows as POLLIN with nothing to read.
        poller.register(self.connection, select.POLLIN | getattr(select, "POLLRDHUP", 0))
        poller.register(wake, select.POLLIN)
        while True:
            if any(fd == wake for fd, _ in poller.poll()):
                return
            try:
                peeked = self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                peeked = b""  # reset by the client: it is gone too
            if not peeked:
                cancel.set()
            return

    def _drain(self) -> None:
        """Read the rest of an oversized request, bounded in bytes and time."""
        self.connection.settimeout(_DRAIN_TIMEOUT_S)
        drained = 0
        with contextlib.suppress(OSError):
            while drained < _DRAIN_BYTES:
                chunk = self.rfile.read1(65536)
                if not chunk or chunk.endswith(b"\n"):
                    break
                drained += len(chunk)


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

    def answer(
        self, request: dict[str, Any], cancel: threading.Event | None = None
    ) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "workdir": str(self.card.workdir)}
        if op == "call":
            envelope = request.get("envelope") or {}
            return {"ok": True, "result": self.card.call(envelope, cancel=cancel)}
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
            reap_orphans()  # a subreaper collects orphans that die between renders
            if card.has_live_watch():
                server.touch()
            elif card.workdir_gone():
                # Deleted or moved away (another folder made in its place is not it): nothing
                # is left to serve here, and a host waiting out its grace kept the lock in the
                # moved folder, so every call there failed ("no task card host answered") for
                # two minutes while its card read active.
                log.info("task card host exiting: its workdir %s is gone", card.workdir)
                break
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
        reap_orphans()


def install_stop_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT end the host cleanly (the watch itself survives for the next host)."""

    def handle(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
