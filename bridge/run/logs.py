"""How the service's log lines look: one handler on stderr, text or JSON, scrubbed, not noisy.

Every module logs through `logging.getLogger(__name__)`, so a record's name says where it came
from (`bridge.schedule.scheduler`); this module only decides the shape of the line:

- timestamps are ISO 8601 with milliseconds and the UTC offset, so lines from machines in
  different zones (or a log shipper) sort and compare without guessing;
- `json` writes one object per line (`ts`, `level`, `logger`, `message`, then any `extra=`
  fields) for log pipelines; `text` is for people;
- the configured secrets are replaced in the finished line, whatever format, whatever part of
  the record (message, extra field, traceback) carried them;
- a warning that repeats (a refresh failing every second) is let through once per interval
  and per kind of message; the next one after the interval says how many were held back
  (and so is the line that says an agent's file is readable again, `HELD_LIKE_WARNINGS`).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Final, Literal, TextIO

from taskcard.bridge.follow.safe_read import HELD_ATTR
from taskcard.channels.errors import secrets_pattern
from taskcard.producers.task_card.contract import terminal_json

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
REPEAT_INTERVAL_S: Final = 60.0
SECRET_MASK: Final = "***"

# HTTP client libraries log request URLs, and a Telegram URL carries the bot token.
_NOISY: Final = ("httpx", "httpcore", "telegram", "websockets", "watchfiles")
# lark-oapi's logger (named "Lark"): written at the configured level under the name
# `lark_oapi`, its run-time credentials masked (`channels.feishu.longconn.LarkLinesAsOurs`).
_LARK: Final = "Lark"
# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS: Final = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
_DIGITS: Final = re.compile(r"\d+")
# The agent or route a line is about, at its head ("agent worker-7: ..."): kept as written in
# the repeat limiter's kind, so each agent's or route's first line of a kind is logged.
_SUBJECT: Final = re.compile(r"(?:agent|route) \S+: ")
# `extra=EVERY_TIME` marks a record the repeat limiter never holds back: the answer to an
# operator's own action (a SIGHUP's refused reload), which each action is owed, however
# like the one before it. The mark itself is not written out.
_EVERY_TIME_ATTR: Final = "taskcard_every_time"
EVERY_TIME: Final = {_EVERY_TIME_ATTR: True}
# The marks of a record, which are not written out (`HELD_ATTR`: an INFO line the limiter
# holds back like a warning, see `bridge.follow.safe_read.HELD_LIKE_WARNINGS`).
_MARKS: Final = frozenset({_EVERY_TIME_ATTR, HELD_ATTR})


def iso_timestamp(created: float) -> str:
    """`2026-11-30T14:02:03.123+00:00`: local time, milliseconds, explicit offset."""
    return datetime.fromtimestamp(created).astimezone().isoformat(timespec="milliseconds")


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS and k not in _MARKS
    }


class TextFormatter(logging.Formatter):
    """`TS LEVEL logger: message key=value ...` with the traceback, if any, below."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{iso_timestamp(record.created)} {record.levelname} {record.name}: "
        line += record.getMessage()
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; values that are not JSON become their `str`."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": iso_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(_extras(record))
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return terminal_json(data, default=str)


class ScrubbingFormatter(logging.Formatter):
    """Wraps a formatter and replaces every secret in the finished line."""

    def __init__(self, inner: logging.Formatter, secrets: Iterable[str]) -> None:
        super().__init__()
        self._inner = inner
        # A JSON line escapes some characters, a URL quoted in an error encodes others, and a
        # client library may change the case of an answer that echoes a secret.
        self._secrets = secrets_pattern(secrets, json_escaped=True)

    def format(self, record: logging.LogRecord) -> str:
        line = self._inner.format(record)
        if self._secrets is not None:
            line = self._secrets.sub(SECRET_MASK, line)
        return line


class RepeatLimiter(logging.Filter):
    """Lets the first of a kind of warning through, then one per `interval_s` with a count
    (a record logged with `extra=EVERY_TIME` always passes; one logged below WARNING with
    `extra=HELD_LIKE_WARNINGS`, the line saying an agent's problem is over, is held back
    the same way: a flapping agent's "is readable again" lines came once per flap).

    Messages are of one kind when the logger, the level and the text with its numbers blanked
    out agree ("refresh of builder failed (attempt 7)" and "... (attempt 8)"), the agent or
    route a line starts with ("agent worker-7: ", "route telegram:-100123::builder: ") kept as
    written: the numbers in such a name tell fleets of agents apart, so the same problem of
    forty agents is forty lines, each once, not the first agent's alone. Below WARNING
    nothing else is held back: debug output is asked for on purpose. A held-back count is reported
    on the next message of its kind after the interval; `time_s` is injectable for tests.
    """

    def __init__(
        self,
        interval_s: float = REPEAT_INTERVAL_S,
        *,
        time_s: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._time_s = time_s
        self._windows: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _EVERY_TIME_ATTR, False):
            return True
        if record.levelno < logging.WARNING and not getattr(record, HELD_ATTR, False):
            return True
        message = record.getMessage()
        key = (record.name, record.levelno, _kind(message))
        now = self._time_s()
        window = self._windows.get(key)
        if window is not None and now - window[0] < self._interval_s:
            self._windows[key] = (window[0], window[1] + 1)
            return False
        suppressed = window[1] if window is not None else 0
        self._windows[key] = (now, 0)
        if suppressed:
            record.msg = (
                f"{message} ({suppressed} similar messages suppressed"
                f" in the last {self._interval_s:g} s)"
            )
            record.args = None
            record.suppressed = suppressed
        return True


def _kind(message: str) -> str:
    """`message` with its numbers blanked out, but for the agent or route it starts with."""
    subject = _SUBJECT.match(message)
    if subject is None:
        return _DIGITS.sub("#", message)
    return subject.group() + _DIGITS.sub("#", message[subject.end() :])


class _Settings:
    """The choices made on the command line, which outlive a later `setup_logging` call."""

    level: str | None = None
    fmt: LogFormat = "text"


def choose(level: str | None, fmt: LogFormat | None) -> None:
    """Record the command line's `--log-level` / `--log-format`; they win over the config."""
    if level is not None:
        _Settings.level = level
    if fmt is not None:
        _Settings.fmt = fmt


def start_error(text: str) -> None:
    """A line that stops `serve` before or while it starts, on stderr: `taskcard: TEXT`, or
    with JSON logs a JSON record (level ERROR, logger `taskcard`), so that a log shipper
    reading one object per line reads this line too."""
    if _Settings.fmt != "json":
        print(f"taskcard: {text}", file=sys.stderr)
        return
    record = logging.LogRecord("taskcard", logging.ERROR, __file__, 0, text, None, None)
    print(JsonFormatter().format(record), file=sys.stderr)


def chosen_format() -> LogFormat:
    """The log format the command line chose (text unless it said json)."""
    return _Settings.fmt


def setup_logging(
    level: str,
    secrets: Iterable[str] = (),
    *,
    stream: TextIO | None = None,
    repeat_interval_s: float = REPEAT_INTERVAL_S,
) -> None:
    """One handler on the root logger (stderr by default), replacing any earlier one."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    inner: logging.Formatter = JsonFormatter() if _Settings.fmt == "json" else TextFormatter()
    handler.setFormatter(ScrubbingFormatter(inner, secrets))
    handler.addFilter(RepeatLimiter(repeat_interval_s))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_Settings.level or level)
    for noisy in _NOISY:
        library = logging.getLogger(noisy)
        library.setLevel(logging.WARNING)
        # A library's own handler (lark-oapi prints to stdout in its own format) would write
        # its records a second time, neither scrubbed nor in the chosen format.
        library.handlers.clear()
        library.propagate = True
    lark = logging.getLogger(_LARK)
    lark.setLevel(logging.NOTSET)  # the root's: the configured level
    lark.handlers.clear()  # its own handler printed to stdout, in its own format
    lark.propagate = True
