"""Log lines: timestamps, the JSON shape, secret scrubbing in both formats, held-back repeats."""

from __future__ import annotations

import ast
import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from taskcard.bridge.run import logs
from taskcard.bridge.run.logs import RepeatLimiter, iso_timestamp

ROOT = Path(__file__).resolve().parents[2]
SECRET = "123456:AAE-very-secret-token"


@pytest.fixture
def capture() -> Iterator[io.StringIO]:
    """setup_logging onto a buffer; the root logger and the format choice are restored after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved = (logs._Settings.level, logs._Settings.fmt)
    # setup_logging quiets the HTTP libraries; other tests read their debug records.
    quieted = {name: logging.getLogger(name).level for name in logs._NOISY}
    stream = io.StringIO()
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in quieted.items():
        logging.getLogger(name).setLevel(old)
    logs._Settings.level, logs._Settings.fmt = saved


def test_timestamps_have_milliseconds_and_an_offset() -> None:
    stamp = iso_timestamp(1_795_500_123.4567)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.456[+-]\d\d:\d\d", stamp), stamp


def test_text_lines_carry_time_level_logger_and_extras(capture: io.StringIO) -> None:
    logs.choose("INFO", "text")
    logs.setup_logging("WARNING", stream=capture)
    logging.getLogger("taskcard.bridge.schedule.scheduler").info(
        "edited %s", "m1", extra={"route": "r"}
    )
    line = capture.getvalue().strip()
    stamp, rest = line.split(" ", 1)
    assert stamp[19] == "." and stamp[23] in "+-"
    assert rest == "INFO taskcard.bridge.schedule.scheduler: edited m1 route=r"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_secrets_are_scrubbed_in_both_formats(capture: io.StringIO, fmt: logs.LogFormat) -> None:
    logs.choose(None, fmt)
    logs.setup_logging("INFO", [SECRET], stream=capture)
    log = logging.getLogger("taskcard.bridge.run.service")
    log.warning("token %s leaked", SECRET, extra={"url": f"https://x/bot{SECRET}/getMe"})
    try:
        raise RuntimeError(f"failed with {SECRET}")
    except RuntimeError:
        log.exception("crash")
    out = capture.getvalue()
    assert SECRET not in out
    assert out.count("***") >= 3
    if fmt == "json":
        records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert records[0]["url"] == "https://x/bot***/getMe"
        assert {"ts", "level", "logger", "message"} <= set(records[0])
        assert "RuntimeError: failed with ***" in records[1]["exc"]


def test_json_is_one_object_per_line(capture: io.StringIO) -> None:
    logs.choose("DEBUG", "json")
    logs.setup_logging("INFO", stream=capture)
    logging.getLogger("taskcard.bridge.track.monitor").debug(
        "a\nb", extra={"agent": "builder", "n": 3}
    )
    (line,) = capture.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "a\nb" and record["level"] == "DEBUG"
    assert (record["logger"], record["agent"], record["n"]) == (
        "taskcard.bridge.track.monitor",
        "builder",
        3,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(
    message: str, level: int = logging.WARNING, name: str = "taskcard.bridge.x"
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # (time, message) -> passed through? and the text that went out
        ([(0, "refresh failed (attempt 1)")], ["refresh failed (attempt 1)"]),
        (
            [(0, "refresh failed (attempt 1)"), (1, "refresh failed (attempt 2)")],
            ["refresh failed (attempt 1)"],
        ),
        (
            [(0, "fail 1"), (1, "fail 2"), (2, "fail 3"), (61, "fail 4")],
            ["fail 1", "fail 4 (2 similar messages suppressed in the last 60 s)"],
        ),
        ([(0, "fail 1"), (61, "fail 2")], ["fail 1", "fail 2"]),
        ([(0, "disk full"), (1, "network down")], ["disk full", "network down"]),
        # The agent or route a line is about keeps its numbers: one line each, once.
        (
            [
                (0, "agent worker-1: a pipe"),
                (1, "agent worker-2: a pipe"),
                (2, "agent worker-1: a pipe"),
                (3, "route telegram:-1001::w1: gone (7)"),
                (4, "route telegram:-1002::w1: gone (8)"),
                (5, "route telegram:-1001::w1: gone"),
            ],
            [
                "agent worker-1: a pipe",
                "agent worker-2: a pipe",
                "route telegram:-1001::w1: gone (7)",
                "route telegram:-1002::w1: gone (8)",
                "route telegram:-1001::w1: gone",
            ],
        ),
    ],
)
def test_repeat_limiter(events: list[tuple[float, str]], expected: list[str]) -> None:
    clock = Clock()
    limiter = RepeatLimiter(60, time_s=clock)
    out: list[str] = []
    for at, message in events:
        clock.now = at
        record = _record(message)
        if limiter.filter(record):
            out.append(record.getMessage())
    assert out == expected


def test_repeat_limiter_keys_by_logger_and_level_and_never_holds_back_debug() -> None:
    limiter = RepeatLimiter(60, time_s=Clock())
    assert limiter.filter(_record("x", name="taskcard.bridge.a"))
    assert limiter.filter(_record("x", name="taskcard.bridge.b"))
    assert limiter.filter(_record("x", level=logging.ERROR, name="taskcard.bridge.a"))
    assert not limiter.filter(_record("x", name="taskcard.bridge.a"))
    assert all(limiter.filter(_record("x", level=logging.DEBUG)) for _ in range(3))


def test_a_warning_repeated_every_second_is_printed_once(capture: io.StringIO) -> None:
    logs.choose(None, "text")
    logs.setup_logging("INFO", stream=capture)
    log = logging.getLogger("taskcard.bridge.run.service")
    for attempt in range(30):
        log.warning("refresh of builder failed (attempt %d)", attempt)
    assert capture.getvalue().count("refresh of builder failed") == 1


def test_every_module_names_its_logger_after_itself() -> None:
    """One rule: `logging.getLogger(__name__)`, so a record's name is its module's path."""
    offenders = []
    for package in ("bridge", "channels", "producers"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                # A hand-written name ("taskcard.service") is what the rule forbids.
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "getLogger"
                    and any(isinstance(arg, ast.Constant) for arg in node.args)
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_a_secret_is_masked_in_any_case_and_url_encoded(capture: io.StringIO) -> None:
    """A platform's answer may echo a secret in a URL, and a client library may change its
    case (PTB capitalizes a bad request's description, lowercasing the rest): each spelling
    is masked, as the exact one is."""
    secret = "123456:AbC/dEf-Secret"
    logs.choose(None, "text")
    logs.setup_logging("INFO", [secret], stream=capture)
    log = logging.getLogger("taskcard.bridge.schedule.scheduler")
    log.warning("refused: %s", f"odd https://x/bot{secret.lower()}/editmessagetext")
    log.warning("refused: %s", f"odd https://x/bot{quote(secret, safe='')}/getMe")
    out = capture.getvalue()
    assert secret.lower() not in out.lower()
    assert quote(secret, safe="").lower() not in out.lower()
    assert "https://x/bot***/editmessagetext" in out
    assert "https://x/bot***/getMe" in out
