"""The MCP server's stdin, line by line, before the SDK reads it: a tools/call that names one
key twice in an object is refused here, where the text still shows it.

The SDK decodes each JSON-RPC line into Python objects before our server sees the call, and
a JSON object that names a key twice decodes to its last value: `{"child_workdir": "a",
"child_workdir": "b"}` reached the `spawn` tool as `"b"`, while a person or a checker that
read the call saw `"a"`. `taskcard tool` and the host socket refuse such an object
(`envelope.decode_envelope`); over MCP the repeat was gone before any check could run.

So `RepeatedKeys.line` reads every line once more, with a decoder that notes repeats, and
when a tools/call has one (anywhere in the message: its arguments at any depth, or the
request's own fields) it hands the SDK the same request with its arguments replaced by a
single entry under a key no client can know (`RepeatedKeys.marker`, random per server),
whose value is the refusal. The tool handler answers such a call with that refusal as a
failed tool result, and nothing of the original arguments reaches a tool: were the marker
ever missed, the lone unknown field would still be refused as one (`unknown_field`). Every
other line (initialize, notifications, other requests, a call without repeats) goes to the
SDK unchanged; a line this decoder cannot read goes unchanged too, and the SDK's reader
answers it as before.

Bytes that are not UTF-8 are kept apart the same way: stdin is decoded with
`surrogateescape`, so such a byte still shows in the line, and a tools/call holding one is
refused like a repeat, naming the field whose text (or key) holds it. The SDK's reader
replaced such bytes with U+FFFD, so a summary sent as Latin-1 was stored with the wrong
characters and answered as a success. Every other line reaches the SDK with such bytes
replaced, as before.

The extra decoding runs in the worker thread that already waits for stdin, not on the loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import secrets
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Final

TOOLS_CALL: Final = "tools/call"


def _marker() -> str:
    return f"taskcard.repeated-key.{secrets.token_hex(16)}"


def _first_repeat(pairs: list[tuple[str, Any]]) -> tuple[str, int]:
    """The first key `pairs` names more than once, and how many times."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key, sum(1 for other, _ in pairs if other == key)
        seen.add(key)
    raise AssertionError("called only for pairs that repeat a key")


def _field_path(path: tuple[str | int, ...]) -> str:
    """A place in the message as the caller names it: inside the arguments, the field path
    the tool's errors use (`input.renderer_path`); elsewhere, the JSON-RPC path (`params`)."""
    if len(path) > 2 and path[:2] == ("params", "arguments"):
        path = path[2:]
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _locate(root: object, targets: Mapping[int, tuple[str, int]]) -> str | None:
    """The first object of `targets` (by identity) reached from `root` in document order,
    worded as the refusal's field; None when none is reachable (never, in practice: an
    object dropped because its key repeated sits under an object that is itself a target)."""
    stack: list[tuple[object, tuple[str | int, ...]]] = [(root, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            found = targets.get(id(value))
            if found is not None:
                key, times = found
                where = _field_path((*path, key))
                count = "twice" if times == 2 else f"{times} times"
                return (
                    f"{where}: given {count} in one object, and JSON leaves open which one"
                    " counts, so nothing was done; send each field once"
                )
            stack.extend((item, (*path, name)) for name, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((item, (*path, n)) for n, item in reversed(list(enumerate(value))))
    return None


def _undecodable(text: str) -> bool:
    """Whether `text` (decoded with `surrogateescape`) holds a byte that is not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _replaced(text: str) -> str:
    """`text` with each byte that is not UTF-8 made U+FFFD, as the SDK's own reader does."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _undecodable_field(root: object) -> str | None:
    """The first place in document order whose key or text holds a byte that is not UTF-8,
    worded as the refusal's field (its key shown with U+FFFD); None when none does."""
    stack: list[tuple[object, tuple[str | int, ...]]] = [(root, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str) and _undecodable(value):
            return _field_path(path) or "the request"
        if isinstance(value, dict):
            for name in value:
                if _undecodable(name):
                    return _field_path((*path, _replaced(name)))
            stack.extend((item, (*path, name)) for name, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((item, (*path, n)) for n, item in reversed(list(enumerate(value))))
    return None


@dataclass(frozen=True)
class RepeatedKeys:
    """Refuses a tools/call whose JSON names a key twice (see the module docstring)."""

    marker: str = field(default_factory=_marker)

    def line(self, text: str) -> str:
        """`text` as the SDK should read it: unchanged, or, for a tools/call with a repeated
        key, the same request carrying the refusal in place of its arguments."""
        repeats: dict[int, tuple[str, int]] = {}

        def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            built = dict(pairs)
            if len(built) != len(pairs):
                repeats[id(built)] = _first_repeat(pairs)
            return built

        undecodable = _undecodable(text)
        as_read = _replaced(text) if undecodable else text
        try:
            message = json.loads(text, object_pairs_hook=build)
        except (ValueError, RecursionError):
            return as_read  # the SDK's reader refuses it too, and it is answered as such
        if not isinstance(message, dict) or message.get("method") != TOOLS_CALL:
            return as_read
        params = message.get("params")
        if undecodable:
            where = _undecodable_field(message)
            refusal: str | None = (
                f"{where}: not valid UTF-8 (bytes of another encoding?), so nothing was done;"
                " send UTF-8 text"
                if where is not None
                else None
            )
        else:
            refusal = _locate(message, repeats) if repeats else None
        if not isinstance(params, dict) or refusal is None:
            return as_read  # no params object: the SDK refuses the request itself, naming params
        params["arguments"] = {self.marker: refusal}
        return _replaced(json.dumps(message, ensure_ascii=False)) + "\n"

    def refusal(self, arguments: Mapping[str, Any]) -> str | None:
        """The refusal `line` put in place of a call's arguments, or None."""
        value = arguments.get(self.marker) if len(arguments) == 1 else None
        return value if isinstance(value, str) else None


class CheckedLines(io.TextIOWrapper):
    """stdin as UTF-8 text (undecodable bytes kept as `surrogateescape` for `check` to see;
    it hands the SDK text without them), each line passed through `check` on its way out.
    Closing it leaves the descriptor open: a worker thread may still be blocked reading it
    when the server stops."""

    def __init__(self, wire: IO[bytes], check: Callable[[str], str]) -> None:
        super().__init__(wire, encoding="utf-8", errors="surrogateescape")
        self._check = check

    def readline(self, size: int = -1, /) -> str:  # type: ignore[override]  # typeshed: bytes
        line = super().readline(size)
        return self._check(line) if line else line

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.detach()


@contextlib.contextmanager
def claimed_stdin() -> Iterator[IO[bytes]]:
    """The wire on a private descriptor, with the null device on fd 0 while serving.

    What the SDK's `stdio_server` does for stdin when it opens it itself (we hand it our own
    reader, so it does not): a child process or library that reads fd 0 gets end of file
    instead of taking bytes of the protocol. fd 0 is pointed back at the wire on exit; the
    private descriptor stays open, as a worker thread may still be blocked on it."""
    stdin = sys.stdin
    try:
        private = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3) if stdin.fileno() == 0 else None
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        private = None
    if private is None:
        yield stdin.buffer  # served in place, as the SDK does when it cannot divert
        return
    wire = os.fdopen(private, "rb", closefd=False)
    diverted = False
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
            diverted = True
        finally:
            os.close(null)
    except OSError:
        pass  # fd 0 stays the wire; it is only read through `wire`
    try:
        yield wire
    finally:
        if diverted:
            with contextlib.suppress(OSError):
                os.dup2(private, 0)
