"""Writing a delivery to a reader and learning whether the reader took it.

A successful `write` to a pipe only means the bytes sit in the pipe: `taskcard inbox | head -1`
reads one line and exits, and whatever it did not read is gone with the pipe. So on a pipe
(or FIFO) and on a local stream socket (what a Node host such as Claude Code gives its MCP
servers as stdio) a delivery counts once the reader has read every byte of it (`FIONREAD` on
a pipe, `SIOCOUTQ` on a socket: none left unread), and counts as lost when the reader closes
its end first (`POLLERR`, `POLLHUP`; a socket's count drops to 0 as its peer closes too, and
the error Linux leaves behind, `ECONNRESET`, tells a peer that left bytes unread from one
that read them all before it closed). A caller that writes one message at a time and waits for
this before the next one never hands a reader more than the message it is reading. Other
outputs (a terminal, a file, a TCP socket) give no such signal: there a complete write counts.

A reader that reads nothing until the writer exits (a parent that waits for the command
before reading its output) would never drain the pipe: with `patience_s`, a delivery still
unread that long by a reader still there counts (`late` is then set, so the caller can stop
handing over more); without it, the wait lasts until the reader reads or goes away.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import socket
import stat
import struct
import termios
import time
from typing import Final

PATIENCE_S: Final = 30.0  # how long `taskcard inbox` lets a live reader leave a message unread
_FIRST_WAIT_S: Final = 0.001
_LONGEST_WAIT_S: Final = 0.05
_GONE: Final = select.POLLERR | select.POLLHUP


def _kind(fd: int) -> str:
    """ "pipe", "socket" (a local stream socket) or "other"."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return "other"
    if stat.S_ISFIFO(mode):
        return "pipe"
    if stat.S_ISSOCK(mode):
        try:
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            return "other"
        try:
            local = probe.family == socket.AF_UNIX and probe.type == socket.SOCK_STREAM
        finally:
            probe.close()
        return "socket" if local else "other"
    return "other"


class Output:
    """One output descriptor; `deliver` writes a unit and says whether the reader has it."""

    def __init__(self, fd: int, *, patience_s: float | None = PATIENCE_S) -> None:
        self.fd = fd
        self.patience_s = patience_s
        self.gone: str | None = None  # why nothing more can reach the reader
        self.late = False  # a delivery counted after `patience_s` without being read
        self._kind = _kind(fd)

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
                if exc.errno in (errno.EPIPE, errno.ECONNRESET)
                else f"cannot write the output ({exc.strerror or exc})"
            )
            return False
        if confirm and self._kind != "other" and not self._taken():
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
        request = termios.FIONREAD if self._kind == "pipe" else termios.TIOCOUTQ
        return int(struct.unpack("i", fcntl.ioctl(self.fd, request, b"\0\0\0\0"))[0])

    def _reset_by_peer(self) -> bool:
        """Whether the socket's peer closed it with bytes of ours unread: Linux leaves
        ECONNRESET as the socket's error then, and none when the peer read all first."""
        try:
            with socket.socket(fileno=os.dup(self.fd)) as probe:
                return probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET
        except OSError:
            return False

    def _taken(self) -> bool:
        """Whether the reader read everything written so far; waits for it, or for it to
        go away (False), within the patience, if any."""
        poller = select.poll()
        poller.register(self.fd, 0)  # POLLERR and POLLHUP are reported all the same
        deadline = None if self.patience_s is None else time.monotonic() + self.patience_s
        wait_s = _FIRST_WAIT_S
        while True:
            # A socket's count drops to 0 when its peer closes too: ask about the peer first.
            gone = any(event & _GONE for _, event in poller.poll(0))
            if gone and self._kind == "socket":
                return False
            try:
                if self._unread() == 0:
                    # A peer that closes drops the count to 0 too, even between the poll
                    # above and this look: it leaves a reset behind when it had not read all.
                    return not (self._kind == "socket" and self._reset_by_peer())
            except OSError:
                self._kind = "other"  # no count for it here: a complete write counts
                return True
            if gone:
                return False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.late = True
                return True
            poller.poll(min(wait_s, left if left is not None else wait_s) * 1000)
            wait_s = min(wait_s * 2, _LONGEST_WAIT_S)
