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
replaced, as before. Half a surrogate pair escaped in the JSON (`"\\ud800"`, an emoji cut in
two) is refused the same way in a tools/call, naming the field or key: the SDK's reader
refused the whole line as a parse error, naming nothing.

A request whose `id` is not text or a whole number (`1.5`, `true`, a list, an object, null)
reaches the SDK as a stand-in it refuses (`BadIds`), which `mcp_server` answers as an invalid
request saying what the id is: the SDK read such a line as a notification, and never answered
it (a tools/call among them ran, or not, without a word).

A line is read as bytes, at most `MAX_LINE_BYTES` of them: the SDK's reader kept a line
until its newline, so a client that wrote megabytes without one grew the server without
bound. A longer line reaches the SDK as a stand-in that it refuses and `mcp_server` answers
with an error naming the limit (`LongLines`), for the request's id when the part read shows
it; the rest of that line is read and dropped as it arrives, and the next line is read as
usual.

A tools/call nested deeper than `MAX_NESTING` levels is refused the same way, naming the
field that nests so deep. The SDK's reader gives up near 200 levels and answered the whole line
as a parse error (one deeper than Python's reader takes, near 1,000, with a null id, so the
client waited for ever); no tool takes a value nested more than a few levels. The line is read
once more with each part past the limit as a stand-in text, in one pass without recursing.
Any other message nested that deep (a ping, an initialize) reaches the SDK as so read, with
the stand-in texts in place of its deep parts: it is answered (or refused) under its own id.

The extra decoding runs in the worker thread that already waits for stdin, not on the loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Final

from taskcard.producers.task_card.contract import cut_deep
from taskcard.producers.task_card.envelope import MAX_ENVELOPE_BYTES

TOOLS_CALL: Final = "tools/call"

# One line holds one call, whose arguments the envelope limit bounds in UTF-8 bytes; JSON
# escapes make a text at most six times that long (a control character as `\u0001`), so
# eight times the envelope limit holds any call that limit lets through, however escaped.
MAX_LINE_BYTES: Final = 8 * MAX_ENVELOPE_BYTES
_DROP_CHUNK_BYTES: Final = 64 * 1024
# The deepest a tools/call may nest (the message, params and arguments count as three levels):
# well under the ~200 the SDK's reader takes, far over what any tool's fields need.
MAX_NESTING: Final = 100
_SPACE = re.compile(r"[ \t\n\r]*")


def _after_space(text: str, at: int) -> int:
    """Where the JSON whitespace that starts at `at` ends (the pattern matches empty)."""
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]


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


# A surrogate that no undecodable byte stands for: half a surrogate pair, escaped in the JSON.
_HALF_PAIR = re.compile(r"[\ud800-\udc7f\udd00-\udfff]")
# The escape of a surrogate in a line's JSON, either half: only a line with one can hold a
# half without its other half once decoded.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _replaced(text: str) -> str:
    """`text` with each byte that is not UTF-8 made U+FFFD, as the SDK's own reader does (and
    each half of a surrogate pair, which the SDK's reader refuses, made U+FFFD too)."""
    text = _HALF_PAIR.sub("\ufffd", text)
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


def _too_deep(root: object, stand_in: str) -> str:
    """The refusal of a message `cut_deep` cut: the field (as the caller named it, not the
    indices inside it) where the first part cut off lies, in document order."""
    stack: list[tuple[object, tuple[str | int, ...]]] = [(root, ())]
    where = "the request"
    while stack:
        value, path = stack.pop()
        if value == stand_in:
            names: list[str | int] = []
            for part in path:
                if not isinstance(part, str):
                    break  # an index inside the field: the field is named, not its items
                names.append(part)
            where = _field_path(tuple(names)) or where
            break
        if isinstance(value, dict):
            stack.extend((item, (*path, name)) for name, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((item, (*path, n)) for n, item in reversed(list(enumerate(value))))
    return (
        f"{where}: nested deeper than {MAX_NESTING} levels, so nothing was done; send the"
        " field as the tool's schema gives it (text, a number, true or false, a short list)"
    )


def _id_kind(ident: object) -> str:
    if ident is None:
        return "not allowed (MCP takes no null id)"
    if isinstance(ident, bool):
        return "true or false"
    if isinstance(ident, float):
        return "a number with a fraction or exponent"
    return "a list" if isinstance(ident, list) else "an object"


def _number_as_written(text: str | None) -> str | None:
    """The top-level `id` of the JSON object `text` as written, read again with its numbers
    with a fraction or exponent kept as text (the caller knows the id is one); None when
    `text` does not read again."""
    if text is None:
        return None
    try:
        message = json.loads(text, parse_float=str)
    except (ValueError, RecursionError):
        return None
    ident = message.get("id") if isinstance(message, dict) else None
    return ident if isinstance(ident, str) else None


@dataclass(frozen=True)
class BadIds:
    """Stands in for a request whose `id` is not text or a whole number (`1.5`, `true`, `[1]`,
    an object, null). The SDK's reader took such a line for a notification (its models drop
    the id they cannot hold), so a ping or even a tools/call was run, or not, and never
    answered. The stand-in is an object the SDK refuses (it has no method) carrying `marker`,
    a key no client can know, whose value `mcp_server` answers as an invalid request with a
    null id, as JSON-RPC asks when the id cannot be read."""

    marker: str = field(default_factory=lambda: f"taskcard.bad-id.{secrets.token_hex(16)}")

    @staticmethod
    def problem(message: object, text: str | None = None) -> str | None:
        """What is wrong with the id of `message` (decoded from the line `text`), or None
        when it is a request with a good id, a notification (no id at all), or not a
        request."""
        if not isinstance(message, dict) or "method" not in message or "id" not in message:
            return None
        ident = message["id"]
        if isinstance(ident, str) or (isinstance(ident, int) and not isinstance(ident, bool)):
            return None
        # A number with a fraction or exponent as the line wrote it: read as a float, one
        # too long for it (1e400, or 400 digits and a fraction) was shown as "Infinity".
        written = _number_as_written(text) if isinstance(ident, float) else None
        shown = written or _replaced(json.dumps(ident, ensure_ascii=False))
        shown = shown if len(shown) <= 40 else f"{shown[:37]}..."
        return (
            f"Invalid Request: id {shown} is {_id_kind(ident)}, so the request was not run;"
            " a request's id is text or a whole number (a notification has no id at all)"
        )

    def stand_in(self, problem: str) -> str:
        return json.dumps({"jsonrpc": "2.0", self.marker: problem}) + "\n"

    def marks(self, decoded: object) -> str | None:
        """The answer to `decoded` (what the SDK refused) when it is a stand-in of these."""
        value = decoded.get(self.marker) if isinstance(decoded, dict) else None
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class RepeatedKeys:
    """Refuses a tools/call whose JSON names a key twice (see the module docstring)."""

    marker: str = field(default_factory=_marker)
    # The check of every request's id, whose stand-ins the server answers.
    ids: BadIds = field(default_factory=BadIds)
    # What a part nested too deep is read as: a text no client can know.
    deep: str = field(default_factory=lambda: f"taskcard.nested-too-deep.{secrets.token_hex(16)}")

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
        flat = cut_deep(text, MAX_NESTING, self.deep)
        try:
            message = json.loads(text if flat is None else flat, object_pairs_hook=build)
        except (ValueError, RecursionError):
            return as_read  # the SDK's reader refuses it too, and it is answered as such
        bad_id = self.ids.problem(message, text)
        if bad_id is not None:
            return self.ids.stand_in(bad_id)
        if not isinstance(message, dict) or message.get("method") != TOOLS_CALL:
            if flat is not None:  # the SDK reads it with the deep parts cut: under its id
                return _replaced(flat) if undecodable else flat
            return as_read
        params = message.get("params")
        if flat is not None:
            refusal: str | None = _too_deep(message, self.deep)
        elif undecodable:
            where = _undecodable_field(message)
            refusal = (
                f"{where}: not valid UTF-8 (bytes of another encoding?), so nothing was done;"
                " send UTF-8 text"
                if where is not None
                else None
            )
        elif _SURROGATE_ESCAPE.search(text) and (where := _undecodable_field(message)):
            # Only an escape in the JSON (`"\ud800"`) puts a surrogate in text read from UTF-8:
            # half of a pair, which the SDK's reader refuses as a parse error of the whole line.
            refusal = (
                f"{where}: holds half a surrogate pair (an escape such as \\ud800 without its"
                " other half, as when an emoji is cut in two), so nothing was done; send both"
                " halves, or leave the character out"
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


def leading_id(head: bytes) -> str | int | None:
    """The id of the request whose line begins with `head` (a line cut at the limit), when
    a top-level `id` comes before the field the cut fell in; None otherwise (not an object,
    no id yet, an id that is not text or a whole number)."""
    text = head.decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    ident: object = None
    at = _after_space(text, 0)
    if not text.startswith("{", at):
        return None
    at += 1
    try:
        while True:
            at = _after_space(text, at)
            key, at = decoder.raw_decode(text, at)
            at = _after_space(text, at)
            if not text.startswith(":", at):
                break
            at = _after_space(text, at + 1)
            value, at = decoder.raw_decode(text, at)
            if key == "id":
                ident = value
            at = _after_space(text, at)
            if not text.startswith(",", at):
                break
            at += 1
    except (ValueError, RecursionError):
        pass  # the cut, or text that is not JSON: the id is what was read before it
    if isinstance(ident, bool) or not isinstance(ident, str | int):
        return None
    return ident


@dataclass(frozen=True)
class LongLines:
    """Stands in for a line over `limit` bytes: the SDK gets an object it refuses (it has no
    method), carrying the request's id if read and `marker`, a key no client can know, by
    which `mcp_server` answers it with `message`."""

    marker: str = field(default_factory=lambda: f"taskcard.line-too-long.{secrets.token_hex(16)}")
    limit: int = MAX_LINE_BYTES

    @property
    def message(self) -> str:
        return (
            f"Invalid Request: a line over the {self.limit}-byte limit, so it was not read"
            " (the rest of it is dropped); send one message per line, and a short envelope"
            " (put long detail in files the renderer reads)"
        )

    def stand_in(self, head: bytes) -> str:
        ident = leading_id(head)
        message: dict[str, object] = {"jsonrpc": "2.0", self.marker: True}
        if ident is not None:
            message["id"] = ident
        return json.dumps(message) + "\n"

    def marks(self, decoded: object) -> bool:
        """Whether `decoded` (what the SDK refused) is a stand-in of this server's."""
        return isinstance(decoded, dict) and decoded.get(self.marker) is True


class CheckedLines(io.TextIOWrapper):
    """stdin as lines of UTF-8 text (undecodable bytes kept as `surrogateescape` for `check`
    to see; it hands the SDK text without them), each line passed through `check` on its way
    out, and none longer than `long.limit` bytes (see the module docstring).

    Lines are read off the byte buffer itself, never through the text layer's own reading,
    so a line is bounded before it is decoded. Closing it leaves the descriptor open: a
    worker thread may still be blocked reading it when the server stops."""

    def __init__(
        self, wire: IO[bytes], check: Callable[[str], str], long: LongLines | None = None
    ) -> None:
        super().__init__(wire, encoding="utf-8", errors="surrogateescape")
        self._wire = wire
        self._check = check
        self._long = long or LongLines()
        self._dropping = False  # the rest of a line over the limit is still to come

    def readline(self, size: int = -1, /) -> str:  # type: ignore[override]  # typeshed: bytes
        wire = self._wire
        while self._dropping:
            rest = wire.readline(_DROP_CHUNK_BYTES)
            if not rest:
                return ""
            self._dropping = not rest.endswith(b"\n")
        limit = self._long.limit
        raw = wire.readline(limit + 1 if size < 0 else min(size, limit + 1))
        if len(raw) > limit and not raw.endswith(b"\n"):
            self._dropping = True
            return self._long.stand_in(raw)
        line = raw.decode("utf-8", "surrogateescape")
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
