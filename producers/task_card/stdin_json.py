"""Reading one JSON object from a stdin that may never be closed.

A program that runs a command with a pipe on its stdin sometimes writes the JSON and keeps the
pipe open (an agent host's hook runner, a tool caller that reuses its pipe): read to the end,
the command waits forever. So a pipe is read until its end, or until `QUIET_S` of silence
finds it settled (parsed only then, once per length): one whole JSON object, or bytes that no
further input can make one (`beyond_repair`), or until `idle_s` pass without a byte. A
terminal is read to its end (a person's Ctrl-D).
"""

from __future__ import annotations

import json
import os
import re
import select
import sys
import time
from collections.abc import Callable
from typing import Final

QUIET_S: Final = 0.2
# Dropping what comes after a refused input ends after this long without a byte.
DRAIN_QUIET_S: Final = 1.0
# After a refusal for size has been answered, stdin is read on (and dropped) up to this much
# and for this long at most (`drain_stdin`), so a writer finishing its write sees it taken
# rather than a broken pipe; one that keeps writing, or keeps the pipe open, is not waited
# for beyond it. The same for every command that reads stdin.
DRAIN_MAX_BYTES: Final = 64 * 1024 * 1024
DRAIN_WITHIN_S: Final = 1.0
_CHUNK: Final = 1 << 20

# What ends a token of JSON text (a number, `true`, `null`...): space, punctuation, a quote.
_TOKEN_END: Final = frozenset(' \t\r\n,:[]{}"')
# The start of a number or of a literal Python's reader takes: more input may complete it.
_TOKEN_START: Final = re.compile(
    r"-?(?:0|[1-9]\d*)?(?:\.\d*)?(?:[eE][-+]?\d*)?"
    r"|-?(?:I(?:n(?:f(?:i(?:n(?:i(?:t(?:y)?)?)?)?)?)?)?)"
    r"|t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?|n(?:u(?:ll?)?)?|N(?:aN?)?"
)
_ESCAPE_START: Final = re.compile(r"u[0-9a-fA-F]{0,4}")


def read_stdin_object(
    limit: int, loads: Callable[[bytes], object], idle_s: float
) -> tuple[bytes, bool]:
    """(at most `limit + 1` bytes of stdin, whether the read ended by itself): False when it
    stopped because `idle_s` passed without a byte and the bytes were not settled (see
    `settled`, with the caller's JSON reader `loads`)."""
    assert sys.stdin is not None
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):
        return sys.stdin.buffer.read(limit + 1), True
    if os.isatty(fd):
        return sys.stdin.buffer.read(limit + 1), True  # typed by a person: up to their Ctrl-D
    data = bytearray()
    tried = -1  # the length at which `data` was last tried
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
            if settled(bytes(data), loads):
                break
        if time.monotonic() - last_byte >= idle_s:
            return bytes(data), False
    return bytes(data), True


def settled(data: bytes, loads: Callable[[bytes], object]) -> bool:
    """Whether more bytes cannot change what `data` is: one whole JSON value (an object, or
    something no appended byte makes one), or text whose error lies where no appended byte
    reaches it. An error only `loads` raises (a number too long, nesting too deep, a byte
    that is not UTF-8) may be cut short by the end of the data: not settled."""
    if not data.strip():
        return False
    try:
        loads(data)
    except json.JSONDecodeError as exc:
        return beyond_repair(exc)
    except (ValueError, RecursionError):
        return False
    return True


def beyond_repair(exc: json.JSONDecodeError) -> bool:
    """Whether no text appended to `exc.doc` makes the error go away.

    An error before the end is not always final: Python's reader names the start of a token
    it could not finish (`-`, `tr`, `"abc`, `"\\u12`, the `.` of `1.`), and more text may
    finish it. It is final when the token it stopped in ends before the text does, or can be
    the start of no token (`{"a": 1,}`, `{'a': 1}`, a raw line break inside a string)."""
    text, pos = exc.doc, exc.pos
    if pos >= len(text) or exc.msg.startswith("Unterminated string"):
        return False
    if exc.msg.startswith(("Invalid control character", "Extra data", "Invalid \\escape")):
        return True
    if exc.msg.startswith("Invalid \\uXXXX escape"):
        return _ESCAPE_START.fullmatch(text, pos) is None
    start = pos
    while start > 0 and text[start - 1] not in _TOKEN_END:
        start -= 1
    end = pos
    while end < len(text) and text[end] not in _TOKEN_END:
        end += 1
    if end < len(text):
        return True  # the token ends (or is a delimiter) before the text does
    if start == pos and not exc.msg.startswith("Expecting value"):
        return True  # a delimiter or a quoted name was due where a new token starts
    return _TOKEN_START.fullmatch(text, start) is None


def drain_stdin(max_bytes: int, within_s: float) -> None:
    """Read and drop up to `max_bytes` of what stdin still holds, for `within_s` at most, so
    a writer still sending sees its input taken rather than a broken pipe; a pipe ends the
    draining once `DRAIN_QUIET_S` pass without a byte, or at `within_s` (a writer that keeps
    it open, or keeps writing, held the command for ever). A terminal is read up to its end
    (a person's Ctrl-D)."""
    assert sys.stdin is not None
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):
        fd = -1
    if fd < 0 or os.isatty(fd):
        drained = 0
        while drained < max_bytes:
            chunk = sys.stdin.buffer.read(65536)
            if not chunk:
                return
            drained += len(chunk)
        return
    drained = 0
    deadline = time.monotonic() + within_s
    while drained < max_bytes:
        left_s = deadline - time.monotonic()
        if left_s <= 0 or not select.select([fd], [], [], min(DRAIN_QUIET_S, left_s))[0]:
            return
        chunk = os.read(fd, min(_CHUNK, max_bytes - drained))
        if not chunk:
            return
        drained += len(chunk)
