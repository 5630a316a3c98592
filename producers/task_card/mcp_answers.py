"""The MCP server's stdout: answers written by us, so a tool learns whether its answer arrived.

The SDK's stdio transport writes each message as one line and flushes it; it never says
whether the client got it. A tool whose answer hands something over for good (the `inbox`
tool: claimed messages) registers a settle function for its request (`Deliveries.expect`).
`AnswerWriter`, the file the SDK writes to, finds that request's answer line and settles it
once the client has read the line (`producers.inbox.output`: on a pipe, nothing of it left
unread), or as not delivered when the line could not be written or the client went away
without reading it. Whatever is still unsettled when the server stops (an answer the SDK
dropped, a cancelled call) is settled as not delivered.

After a failed write nothing more is written: the client is gone, and the server keeps
reading stdin until it ends, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from taskcard.producers.inbox.output import Output

Settle = Callable[[bool], None]


def _log(text: str) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(f"taskcard mcp: {text}", file=sys.stderr, flush=True)


def _run(settle: Settle, *, delivered: bool) -> None:
    try:
        settle(delivered)
    except Exception as exc:  # a settle's trouble must not stop the server
        _log(f"cannot settle an answer ({exc.__class__.__name__}: {exc})")


class _Once:
    """A settle function that runs at most once, whoever calls it first."""

    def __init__(self, settle: Settle) -> None:
        self._settle = settle
        self._lock = threading.RLock()  # the signal handler may run inside
        self._done = False

    def __call__(self, delivered: bool) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        _run(self._settle, delivered=delivered)


class Deliveries:
    """Requests whose answer must be settled once it is known to have arrived, or not."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # the signal handler may run inside
        self._pending: dict[tuple[str, Any], _Once] = {}
        self.broken = False

    @staticmethod
    def _key(request_id: Any) -> tuple[str, Any]:
        return (type(request_id).__name__, request_id)

    def expect(self, request_id: Any, settle: Settle) -> None:
        """Settle `request_id`'s answer once it is written; at once when it cannot be."""
        with self._lock:
            if not self.broken and request_id is not None:
                self._pending[self._key(request_id)] = _Once(settle)
                return
        _run(settle, delivered=False)

    def get(self, request_id: Any) -> Settle | None:
        """The settle function of `request_id`'s answer; it stays pending (for `settle_all`,
        should the server be stopped while the answer waits for its reader) until `done`."""
        with self._lock:
            return self._pending.get(self._key(request_id))

    def done(self, request_id: Any) -> None:
        with self._lock:
            self._pending.pop(self._key(request_id), None)

    def waiting(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def settle_all(self, *, delivered: bool) -> None:
        """Settle everything still pending (the server stops, or its output broke)."""
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for settle in pending:
            settle(delivered)


class AnswerWriter:
    """The text file the SDK's stdio transport writes to: one line per message, then a
    flush. Written to our descriptor with `Output`, line by line, settling the answers
    `deliveries` waits for."""

    def __init__(self, fd: int, deliveries: Deliveries) -> None:
        # No patience: a client must read its answers to go on; one that never does is
        # stuck or gone, and a gone one is seen.
        self._out = Output(fd, patience_s=None)
        self._deliveries = deliveries
        self._buffer: list[str] = []

    def write(self, text: str) -> int:
        self._buffer.append(text)
        return len(text)

    def flush(self) -> None:
        text = "".join(self._buffer)
        self._buffer.clear()
        for line in text.splitlines(keepends=True):
            self._send(line)

    def _send(self, line: str) -> None:
        request_id, settle, answered = self._settle_for(line)
        # Only an answer that hands something over waits for the client to read it.
        delivered = self._out.deliver(line.encode("utf-8"), confirm=settle is not None)
        if settle is not None:  # an error in place of the result hands nothing over
            settle(delivered and answered)
            self._deliveries.done(request_id)
        if not delivered and not self._deliveries.broken:
            self._deliveries.broken = True
            _log(f"{self._out.gone}; nothing more is written to it")
            self._deliveries.settle_all(delivered=False)

    def _settle_for(self, line: str) -> tuple[Any, Settle | None, bool]:
        """The request this line answers, the settle function waiting for it if any, and
        whether the line carries the result (not an error)."""
        if not self._deliveries.waiting():
            return None, None, False
        try:
            message = json.loads(line)
        except ValueError:
            return None, None, False
        if not isinstance(message, dict) or "id" not in message or "method" in message:
            return None, None, False
        request_id = message["id"]
        return request_id, self._deliveries.get(request_id), "result" in message


@contextlib.contextmanager
def claimed_stdout() -> Iterator[int | None]:
    """The wire on a private descriptor, with stderr on fd 1 while serving, or None when
    stdout has no descriptor to claim.

    What the SDK's `stdio_server` does for stdout when it opens it itself (we hand it our own
    writer, so it does not): stray output of a library or a child process lands on stderr
    instead of tearing the protocol's lines. fd 1 is pointed back at the wire on exit."""
    try:
        private = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3) if sys.stdout.fileno() == 1 else None
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        private = None
    if private is None:
        yield None
        return
    diverted = False
    with contextlib.suppress(OSError):
        os.dup2(2, 1)
        diverted = True
    try:
        yield private
    finally:
        if diverted:
            with contextlib.suppress(OSError):
                os.dup2(private, 1)


@contextlib.contextmanager
def settled_on_signals(deliveries: Deliveries | None) -> Iterator[None]:
    """SIGTERM and SIGHUP (a host ending its session) first put back what unsettled
    answers hold, then end the process as the signal would."""
    if deliveries is None:
        yield
        return

    def stop(signum: int, frame: object) -> None:
        deliveries.settle_all(delivered=False)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    before = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
