"""Reading one JSON object from a stdin that may never be closed.

A program that runs a command with a pipe on its stdin sometimes writes the JSON and keeps the
pipe open (an agent host's hook runner, a tool caller that reuses its pipe): read to the end,
the command waits forever. So a pipe is read until its end, or until it holds one whole JSON
object followed by `QUIET_S` of silence (parsed only then, once per length), or until
`idle_s` pass without a byte. A terminal is read to its end (a person's Ctrl-D).
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable
from typing import Final

QUIET_S: Final = 0.2
_CHUNK: Final = 1 << 20


def read_stdin_object(
    limit: int, whole: Callable[[bytes], bool], idle_s: float
) -> tuple[bytes, bool]:
    """(at most `limit + 1` bytes of stdin, whether the read ended by itself): False when it
    stopped because `idle_s` passed without a byte and without a whole object (`whole`)."""
    assert sys.stdin is not None
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):
        return sys.stdin.buffer.read(limit + 1), True
    if os.isatty(fd):
        return sys.stdin.buffer.read(limit + 1), True  # typed by a person: up to their Ctrl-D
    data = bytearray()
    tried = -1  # the length at which `data` was last tried as a whole object
    last_byte = time.monotonic()
    while len(data) <= limit:
        if select.select([fd], [], [], QUIET_S)[0]:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
            last_byte = time.monotonic()
            continue
        if len(data) != tried:
            tried = len(data)
            if data.rstrip().endswith(b"}") and whole(bytes(data)):
                break
        if time.monotonic() - last_byte >= idle_s:
            return bytes(data), False
    return bytes(data), True
