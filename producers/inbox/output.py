"""Writing a delivery to a reader and learning whether the reader took it.

A successful `write` to a pipe only means the bytes sit in the pipe: `taskcard inbox | head -1`
reads one line and exits, and whatever it did not read is gone with the pipe. So on a pipe
(or FIFO) a delivery counts once the reader has read every byte of it (`FIONREAD` on our end
says none are left), and counts as lost when the reader closes its end first (`POLLERR`).
A caller that writes one message at a time and waits for this before the next one never
hands a reader more than the message it is reading. Other outputs (a terminal, a file, a
socket) give no such signal: there a complete write counts.

A reader that reads nothing until the writer exits (a parent that waits for the command
before reading its output) would never drain the pipe: after `patience_s` without the
reader taking anything, a reader still there is taken to read later, and the writes from
then on count once written.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import stat
import struct
import termios
import time
from typing import Final

PATIENCE_S: Final = 30.0  # how long a live reader may leave a delivery unread in the pipe
_FIRST_WAIT_S: Final = 0.001
_LONGEST_WAIT_S: Final = 0.05


class Output:
    """One output descriptor; `deliver` writes a unit and says whether the reader has it."""

    def __init__(self, fd: int, *, patience_s: float = PATIENCE_S) -> None:
        self.fd = fd
        self.patience_s = patience_s
        self.gone: str | None = None  # why nothing more can reach the reader
        try:
            self._pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
        except OSError:
            self._pipe = False

    def deliver(self, data: bytes, *, confirm: bool = True) -> bool:
        """Write all of `data`; True once the reader has it, False when it cannot have it
        all (then `gone` says why, and every later call is False at once). Without
        `confirm`, a complete write counts: nothing waits for the reader."""
        if self.gone is not None:
            return False
        try:
            self._write_all(data)
        except OSError as exc:
            self.gone = (
                "the reader closed the output"
                if exc.errno == errno.EPIPE
                else f"cannot write the output ({exc.strerror or exc})"
            )
            return False
        if confirm and self._pipe and not self._taken():
            self.gone = "the reader closed the output before reading all of it"
            return False
        return True

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:  # an output left non-blocking by whoever shares it
                select.select([], [self.fd], [], _LONGEST_WAIT_S)

    def _unread(self) -> int:
        return int(struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0"))[0])

    def _taken(self) -> bool:
        """Whether the reader read everything written so far; waits for it, or for it to
        go away (False), within the patience left."""
        poller = select.poll()
        poller.register(self.fd, 0)  # POLLERR and POLLHUP are reported all the same
        deadline = time.monotonic() + self.patience_s
        wait_s = _FIRST_WAIT_S
        while True:
            try:
                if self._unread() == 0:
                    return True
            except OSError:
                self._pipe = False  # no count for this pipe here: a complete write counts
                return True
            if any(event & select.POLLERR for _, event in poller.poll(0)):
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                self.patience_s = 0.0  # it reads after we exit: stop waiting for it
                return True
            poller.poll(min(wait_s, left) * 1000)
            wait_s = min(wait_s * 2, _LONGEST_WAIT_S)
