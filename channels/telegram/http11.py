"""A lean HTTP/1.1 keep-alive transport under python-telegram-bot: `LeanRequest`.

Why our own: PTB's default transport (httpx over httpcore over anyio) spent about 0.65 ms of
CPU per Bot API call on this machine, most of the channel's cost per card edit (issue 13
gives the whole serve path about 0.8 ms per change). The Bot API needs a small slice of
HTTP: a POST with a JSON body, an answer with `Content-Length` (or chunked), keep-alive.
On asyncio streams that slice costs about 30 µs; aiohttp's client, the maintained
alternative already installed here, measured about 95 µs for the same call. What we drop:
proxies from the environment (`telegram.api_base_url` is the only route; `channel.py`
falls back to PTB's httpx transport when an `https_proxy`-style variable covers the API
host) and file uploads (the service never uploads; they are refused, never half-sent).

Why streams rather than a protocol of our own: the answer costs two turns of the loop either
way (its bytes are read in one, and the waiting task goes on in the next, since a future's
callbacks run in the loop's next turn). A protocol would save only `StreamReader`'s own calls
(about 290 of a card edit's 10,900 bytecodes), for a buffer, its waiter and a write drain
written again, and `_read_answer` would no longer read a `StreamReader`.

What it keeps of `FloodAwareRequest`'s promises:

- a 429 raises `FloodWait`, an answer that is no Bot API answer is read as `read_answer`
  says, and a success is checked and cut down by `checked_success` (never a PTB traceback
  or a `KeyError`);
- nothing sent (connection refused, connect timeout, no free connection in time) raises
  `NetworkError`/`TimedOut`, which the channel reads as transient;
- once the request bytes were handed to the connection, any failure (read timeout, the
  connection closed or reset before the whole answer, a malformed answer) raises
  `AnswerLost`: Telegram may have performed it, and it is never sent again here;
- an idle keep-alive connection that the server closed is noticed before it is used (the
  loop has seen its end of stream) and replaced by a new one, so the request goes out once;
  connections idle longer than `IDLE_EXPIRY_S` are closed rather than risk the server's own
  keep-alive timeout racing a request;
- https verifies the server's certificate against certifi's CA bundle (the bundle httpx
  used), with the host name checked.

The pool: at most `pool_size` connections per transport, opened on demand, reused last-in
first-out so a quiet period leaves only a few warm ones. A request waits up to its pool
timeout for a free connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import re
import ssl
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from telegram import error as tg
from telegram.request import BaseRequest, RequestData

from taskcard.channels.base import json_chunks
from taskcard.channels.telegram.request import checked_answer, lost_after_write, parse_answer

IDLE_EXPIRY_S = 30.0
_FIXED_HEADERS = f"User-Agent: {BaseRequest.USER_AGENT}\r\nAccept: application/json\r\n"
_JSON_BODY = "Content-Type: application/json\r\nContent-Length: "

_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024
_HEX = re.compile(rb"[0-9A-Fa-f]+")
# The header lines an answer is read by, found by one search instead of a loop over every
# line (a Bot API answer has a dozen): a line whose name, whitespace around it ignored and
# in any case, is one of these, and its value up to the line's end.
_READ_HEADERS = re.compile(
    r"\r\n\s*(content-length|transfer-encoding|connection)\s*:(.*?)(?=\r\n)",
    re.IGNORECASE | re.DOTALL,
)
# A status line's HTTP/1 version (after the dot) and its three-digit code, in one match.
_STATUS_LINE = re.compile(r"HTTP/1\.([^ \r\n]*) ([0-9]{3})")
# A number as `int` reads it, whitespace around it allowed (ASCII digits only: `str.isdigit`
# also takes `²`, a latin-1 byte, which `int` refuses).
_DECIMAL = re.compile(r"\s*[0-9]+\s*")
# `json.dumps(..., separators=...)` builds a new encoder for every call; one serves them all.
_BODY_JSON = json_chunks(separators=(",", ":"))


@dataclass(frozen=True)
class _Target:
    """Where a URL goes, with what every request to it repeats worked out once (`_target`
    keeps the targets of the URLs seen)."""

    secure: bool
    host: str
    port: int
    origin: tuple[bool, str, int]  # (secure, host, port): the pool's key
    # The request line after the method (path and query), the Host header (host and any
    # explicit port, without user info) and the headers every request carries.
    head: str
    endpoint: str  # the Bot API method: the last path segment (`.../bot<token>/sendMessage`)


@functools.lru_cache(maxsize=256)
def _target(url: str) -> _Target:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise tg.NetworkError(f"unsupported Bot API URL scheme {parts.scheme!r}")
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    path = parts.path or "/"
    endpoint = path.rsplit("/", 1)[-1]
    if parts.query:
        path = f"{path}?{parts.query}"
    authority = parts.netloc.rpartition("@")[2]
    head = f" {path} HTTP/1.1\r\nHost: {authority}\r\n{_FIXED_HEADERS}"
    return _Target(secure, parts.hostname, port, (secure, parts.hostname, port), head, endpoint)


def proxy_configured(base_url: str) -> bool:
    """True when the environment names a proxy for the API host (this transport has none)."""
    host = urllib.parse.urlsplit(base_url).hostname or ""
    scheme = urllib.parse.urlsplit(base_url).scheme
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get(scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(host)


def default_ssl_context() -> ssl.SSLContext:
    """Certificates verified against certifi's bundle, host names checked."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0

    def reusable(self, now: float) -> bool:
        """False when the server has closed it (as far as the loop knows) or it idled long."""
        if self.reader.at_eof() or self.writer.is_closing():
            return False
        return now - self.idle_since < IDLE_EXPIRY_S

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


@dataclass
class _Answer:
    status: int
    body: bytes
    keep_alive: bool


class _Incomplete(Exception):
    """The answer ended or broke before it was whole."""


@dataclass
class _Pool:
    size: int
    idle: dict[tuple[bool, str, int], list[_Connection]] = field(default_factory=dict)
    slots: asyncio.Semaphore | None = None

    def semaphore(self) -> asyncio.Semaphore:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.size)
        return self.slots

    def take(self, origin: tuple[bool, str, int], now: float) -> _Connection | None:
        stack = self.idle.get(origin)
        while stack:
            connection = stack.pop()
            if connection.reusable(now):
                return connection
            connection.close()
        return None

    def give_back(self, origin: tuple[bool, str, int], connection: _Connection, now: float) -> None:
        connection.idle_since = now
        self.idle.setdefault(origin, []).append(connection)

    def close_all(self) -> None:
        for stack in self.idle.values():
            for connection in stack:
                connection.close()
        self.idle.clear()


@dataclass(eq=False)
class _Deadline:
    """When one request's answer is due, and the task waiting for it."""

    task: asyncio.Task[Any]
    at: float
    cancelling: int  # the task's pending cancellations when the wait began
    expired: bool = False


class _Deadlines:
    """The read deadlines of the requests on their way, kept by one timer.

    `asyncio.timeout` schedules a timer per request: at a hundred requests a second and a
    timeout of tens of seconds, thousands of cancelled timers wait in the loop's heap, and
    every new one is sifted in by Python-level comparisons (a twentieth of a change's
    bytecodes, with the context manager around it). Here a request only notes its deadline.
    The one timer stands at the earliest deadline noted; when it fires it cancels the tasks
    whose deadline has passed, as `asyncio.timeout` does, and stands again at the earliest
    one left. Requests of one transport share a timeout, so their deadlines come in order
    and the timer is set about once per timeout while requests keep coming.
    """

    def __init__(self) -> None:
        self._waiting: set[_Deadline] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def watch(self, loop: asyncio.AbstractEventLoop, seconds: float) -> _Deadline:
        task = asyncio.current_task(loop)
        assert task is not None, "a request runs in a task"
        deadline = _Deadline(task, loop.time() + seconds, task.cancelling())
        self._waiting.add(deadline)
        if deadline.at < self._timer_at:
            self._arm(loop, deadline.at)
        return deadline

    def release(self, deadline: _Deadline) -> None:
        """The wait is over; a timer standing for it finds nothing due and moves on."""
        self._waiting.discard(deadline)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf
        self._waiting.clear()

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(at, self._fire, loop), at

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        # The loop may run a timer up to its clock's resolution early: what it stood for
        # is due.
        now = max(loop.time(), self._timer_at)
        self._timer, self._timer_at = None, math.inf
        earliest = math.inf
        for deadline in self._waiting:
            if deadline.expired:
                continue
            if deadline.at <= now:
                deadline.expired = True
                deadline.task.cancel()
            elif deadline.at < earliest:
                earliest = deadline.at
        if earliest < math.inf:
            self._arm(loop, earliest)


def _timeout(value: Any, default: float | None) -> float | None:
    if isinstance(value, type(BaseRequest.DEFAULT_NONE)):
        return default
    return None if value is None else float(value)


class LeanRequest(BaseRequest):
    """PTB's `BaseRequest` on asyncio streams: see the module docstring."""

    parse_json_payload = staticmethod(parse_answer)

    def __init__(
        self,
        *,
        pool_size: int,
        timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._pool = _Pool(pool_size)
        self._deadlines = _Deadlines()
        self._timeout_s = timeout_s
        self._ssl = ssl_context
        self._closed = False

    @property
    def read_timeout(self) -> float | None:
        return self._timeout_s

    def idle_connections(self) -> int:
        """Idle keep-alive connections the loop has not yet seen the server close."""
        return sum(
            1
            for stack in self._pool.idle.values()
            for connection in stack
            if not connection.reader.at_eof()
        )

    async def initialize(self) -> None:
        self._closed = False

    async def shutdown(self) -> None:
        self._closed = True
        self._pool.close_all()
        self._pool.slots = None  # a later start may run on another event loop
        self._deadlines.close()

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = default_ssl_context()
        return self._ssl

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: Any = BaseRequest.DEFAULT_NONE,
        write_timeout: Any = BaseRequest.DEFAULT_NONE,
        connect_timeout: Any = BaseRequest.DEFAULT_NONE,
        pool_timeout: Any = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        if self._closed:
            raise RuntimeError("This LeanRequest is shut down")
        if request_data is not None and request_data.contains_files:
            raise tg.TelegramError("file uploads are not supported by this transport")
        target = _target(url)
        if request_data is not None:
            # One JSON document of the raw values (PTB's `json_payload` would encode each
            # value to a string first, nesting JSON in JSON).
            body = "".join(_BODY_JSON(request_data.parameters, 0)).encode()
            head = f"{method}{target.head}{_JSON_BODY}{len(body)}\r\n\r\n"
            payload = head.encode() + body
        else:
            payload = f"{method}{target.head}\r\n".encode()
        slots = self._pool.semaphore()
        if not slots.locked():
            await slots.acquire()  # a free slot: taken at once, no timer needed
        else:
            try:
                async with asyncio.timeout(_timeout(pool_timeout, self._timeout_s)):
                    await slots.acquire()
            except TimeoutError:
                raise tg.TimedOut(
                    "no free connection in time; the request was not sent to Telegram"
                ) from None
        try:
            answer = await self._exchange(
                target, payload, read_timeout, write_timeout, connect_timeout
            )
        finally:
            slots.release()
        return checked_answer(target.endpoint, answer.status, answer.body)

    async def _exchange(
        self,
        target: _Target,
        payload: bytes,
        read_timeout: Any,
        write_timeout: Any,
        connect_timeout: Any,
    ) -> _Answer:
        """One request on a pooled connection. The timeouts are PTB's arguments, each worked
        out (`_timeout`) only when its wait happens: most requests open no connection and
        never wait for the socket to take their bytes."""
        loop = asyncio.get_running_loop()
        connection = self._pool.take(target.origin, loop.time())
        if connection is None:
            connection = await self._connect(target, _timeout(connect_timeout, self._timeout_s))
        # From here on the request may reach Telegram: every failure is an unknown outcome.
        try:
            connection.writer.write(payload)
            if connection.writer.transport.get_write_buffer_size():
                async with asyncio.timeout(_timeout(write_timeout, self._timeout_s)):
                    await connection.writer.drain()
            read_s = _timeout(read_timeout, self._timeout_s)
            if read_s is None:
                answer = await _read_answer(connection.reader)
            else:
                answer = await self._read_within(connection.reader, read_s, loop)
        except (TimeoutError, OSError, EOFError, asyncio.LimitOverrunError, _Incomplete) as exc:
            connection.close()
            raise lost_after_write(exc) from exc
        except BaseException:
            connection.close()  # cancelled mid-answer: the stream position is unknown
            raise
        if answer.keep_alive and not self._closed:
            self._pool.give_back(target.origin, connection, loop.time())
        else:
            connection.close()
        return answer

    async def _read_within(
        self, reader: asyncio.StreamReader, seconds: float, loop: asyncio.AbstractEventLoop
    ) -> _Answer:
        """`_read_answer` bounded as `asyncio.timeout(seconds)` bounds it (`TimeoutError`
        once the time is up; a cancellation from elsewhere stays one), with the transport's
        one timer for every request on its way (`_Deadlines`)."""
        deadline = self._deadlines.watch(loop, seconds)
        try:
            answer = await _read_answer(reader)
        except BaseException as exc:
            if (
                deadline.expired
                and deadline.task.uncancel() <= deadline.cancelling
                and isinstance(exc, asyncio.CancelledError)
            ):
                raise TimeoutError from exc
            raise
        finally:
            self._deadlines.release(deadline)
        if deadline.expired:
            deadline.task.uncancel()  # cancelled just as the answer came: that cancel is ours
        return answer

    async def _connect(self, target: _Target, connect_s: float | None) -> _Connection:
        try:
            async with asyncio.timeout(connect_s):
                reader, writer = await asyncio.open_connection(
                    target.host,
                    target.port,
                    ssl=self._ssl_context() if target.secure else None,
                    limit=_MAX_HEAD,
                )
        except TimeoutError:
            raise tg.TimedOut("connecting to the Bot API timed out; nothing was sent") from None
        except (OSError, ssl.SSLError) as exc:
            raise tg.NetworkError(
                f"cannot connect to the Bot API ({type(exc).__name__}); nothing was sent"
            ) from exc
        return _Connection(reader, writer)


async def _read_answer(reader: asyncio.StreamReader) -> _Answer:
    """One HTTP/1.1 response: status, headers, and a body by length, chunks or end of stream.
    Informational answers (1xx) before it are skipped."""
    status = 100
    while 100 <= status < 200:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise _Incomplete("the connection closed before an answer") from exc
        text = head.decode("latin-1")
        status_line = _STATUS_LINE.match(text)
        if status_line is None:
            first_line = text.partition("\r\n")[0]
            raise _Incomplete(f"not an HTTP/1 status line: {first_line[:40]!r}")
        minor_version, status = status_line.group(1), int(status_line.group(2))
    length: int | None = None
    chunked = False
    keep_alive = minor_version == "1"
    for header in _READ_HEADERS.finditer(text):
        name, value = header.group(1).lower(), header.group(2)
        if name == "content-length":
            if _DECIMAL.fullmatch(value) is None:
                raise _Incomplete("a Content-Length that is not a number")
            length = int(value)
        elif name == "transfer-encoding":
            chunked = "chunked" in value.lower()
        elif name == "connection":
            tokens = value.lower()
            keep_alive = "close" not in tokens and (keep_alive or "keep-alive" in tokens)
    try:
        if status in (204, 304):
            body = b""
        elif chunked:
            body = await _read_chunks(reader)
        elif length is not None:
            if length > _MAX_BODY:
                raise _Incomplete("an answer larger than any Bot API answer")
            body = await reader.readexactly(length)
        else:
            body = await _read_to_end(reader)
            keep_alive = False
    except asyncio.IncompleteReadError as exc:
        raise _Incomplete("the connection closed in the middle of the answer") from exc
    return _Answer(status, body, keep_alive)


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    """A body without length or chunks: it ends where the server closes the connection."""
    parts: list[bytes] = []
    total = 0
    while part := await reader.read(_MAX_HEAD):
        total += len(part)
        if total > _MAX_BODY:
            raise _Incomplete("an answer larger than any Bot API answer")
        parts.append(part)
    return b"".join(parts)


async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size_hex = size_line.split(b";", 1)[0].strip()
        if _HEX.fullmatch(size_hex) is None:
            raise _Incomplete("a chunk size that is not a number")
        size = int(size_hex, 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers
            return b"".join(parts)
        total += size
        if total > _MAX_BODY:
            raise _Incomplete("an answer larger than any Bot API answer")
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise _Incomplete("a chunk without its line end")
