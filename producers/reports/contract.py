"""The file contract of reports, lineage and the inbox, shared by the agent side and the service.

Layout under an agent's working directory::

    reports/reports.jsonl   one report per line: {"seq", "at", "ok", "verdict", "role",
                            "channel", "summary", ...}; `seq` only grows
    lineage.json            who created this agent: {"parent", "parent_workdir", "reason",
                            "provider", "depth", "created_at"} (the service does not read
                            `parent_workdir`: the agent side's loop check walks it)
    inbox/queued/<id>.json  a message waiting for the agent (written by the service only
                            through inbox/tmp/ and an atomic rename)
    inbox/taken/<id>.json   claimed by the agent side (rename from queued/)
    inbox/cancelled/<id>.json  withdrawn by the service (rename from queued/)
    inbox/acks.jsonl        one line per delivered message: {"id", "state", "at", "via"}

Every parser here is total: whatever an agent wrote gives a value or None, never an exception.
Constants and parsers only: writing these files is each side's own business.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal

from taskcard.producers.inbox.contract import (
    ACKS_FILE,
    CANCELLED_DIR,
    INBOX_DIR,
    MAX_MESSAGE_BYTES,
    MESSAGE_ID,
    QUEUED_DIR,
    TAKEN_DIR,
    TMP_DIR,
    VERSION,
    VIAS,
    shown_name,
)
from taskcard.producers.ledger.contract import LEDGER_DIR
from taskcard.producers.task_card.contract import (
    LOGS_DIR,
    MAX_COUNT,
    NOTIFICATION_DIR,
    TASKCARD_DIR,
    count_field,
    int_or_digits,
    iso_utc,
    load_json,
    parse_iso,
    parse_json,
    shows_text,
)

REPORTS_DIR: Final = "reports"
# Every folder of a workdir's file contracts (`lineage.json` sits in the workdir itself): the
# service watches each, and no child's workdir may sit inside one of its parent's.
CONTRACT_DIRS: Final = (
    TASKCARD_DIR,
    NOTIFICATION_DIR,
    LOGS_DIR,
    REPORTS_DIR,
    INBOX_DIR,
    LEDGER_DIR,
)
REPORTS_FILE: Final = "reports.jsonl"
LINEAGE_FILE: Final = "lineage.json"
# The inbox's names come from its own contract (the agent side reads the same ones).
INBOX_SUBDIRS: Final = (QUEUED_DIR, TAKEN_DIR, CANCELLED_DIR, TMP_DIR)
INBOX_VERSION: Final = VERSION
MAX_INBOX_MESSAGE_BYTES: Final = MAX_MESSAGE_BYTES
MAX_TEXT_CHARS: Final = 4000  # a field longer than this is cut when read for people
MAX_SEQ: Final = MAX_COUNT  # the largest seq a report may carry
Verdict = Literal["approved", "rejected"]
# Every word a verdict may be given as, and the one stored and shown: the reports-and-signals
# spec names them aprovado and reprovado, so an agent following it is understood too.
VERDICT_WORDS: Final[dict[str, Verdict]] = {
    "approved": "approved",
    "rejected": "rejected",
    "aprovado": "approved",
    "reprovado": "rejected",
}
MessageKind = Literal["message", "wake"]
# What an acknowledgement may name as its way in: the agent side's own list, so a way added
# there (a new host's hooks) is shown by the service too.
ACK_VIAS: Final = VIAS


@dataclass(frozen=True)
class ReportPaths:
    """Every path of this contract in one working directory."""

    workdir: Path

    @property
    def reports(self) -> Path:
        return self.workdir / REPORTS_DIR / REPORTS_FILE

    @property
    def lineage(self) -> Path:
        return self.workdir / LINEAGE_FILE

    @property
    def inbox(self) -> Path:
        return self.workdir / INBOX_DIR

    @property
    def acks(self) -> Path:
        return self.inbox / ACKS_FILE


def _short_text(value: object) -> str | None:
    if not isinstance(value, str) or not shows_text(value):
        return None
    return value[:MAX_TEXT_CHARS]


def report_seq(value: object) -> int | None:
    """A report's `seq`: a JSON integer from 1 to `MAX_SEQ`, else None.

    The one rule for both sides: the writer numbers after the lines it counts and the
    service announces the lines it counts, so they must count the same lines. (A `5.0` the
    service took for 5 while the writer skipped it, or a seq past `MAX_SEQ` the writer
    numbered after while the service skipped it, silenced every later report in the chat.)
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= MAX_SEQ else None


@dataclass(frozen=True)
class Report:
    """One line of `reports/reports.jsonl`, reduced to the typed fields people may see."""

    seq: int
    at: datetime
    ok: bool
    verdict: Verdict | None
    role: str | None
    channel: str | None
    summary: str | None


# How a line of `reports/reports.jsonl` is fixed, for every reader that names a bad one.
LINE_FIX: Final = "write one JSON object per line, as `taskcard report` does"


def _line_value(line: bytes) -> tuple[Any, str | None]:
    """(the JSON value of a report line, None) or (None, what keeps it from being JSON). A
    whole number too long for Python (over 4,300 digits) is kept as its digits, so one in a
    field no reader uses does not lose the report (`int_or_digits`)."""
    try:
        return load_json(line, parse_int=int_or_digits), None
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    except RecursionError:
        return None, "nests too deep to be read"
    except ValueError:
        return None, "is not JSON"


def report_object(line: bytes) -> dict[str, Any] | None:
    """The JSON object of a report line, or None when the line is no JSON object (total)."""
    data, _ = _line_value(line)
    return data if isinstance(data, dict) else None


def line_problem(line: bytes) -> str | None:
    """Why a complete line of `reports/reports.jsonl` is no report, in words that follow its
    name (`line 3 is not JSON`); None for a report and for a blank line. The one judgment of
    the service (which logs it) and of `taskcard reports` (which prints it): a broken line
    was skipped silently by both, the report in it lost without a word."""
    if not line.strip():
        return None
    data, problem = _line_value(line)
    if problem is not None:
        return problem
    if not isinstance(data, dict):
        return "is not a JSON object"
    if report_seq(data.get("seq")) is None:
        return f"has no usable seq (a whole number from 1 to {MAX_SEQ:,})"
    if parse_iso(data.get("at")) is None:
        return "has no usable at (an ISO-8601 time)"
    if not isinstance(data.get("ok"), bool):
        return "has no ok of true or false"
    return None


def parse_report(line: bytes) -> Report | None:
    """A report, or None when the line lacks a usable `seq`, `at` or boolean `ok`."""
    data = report_object(line)
    if data is None:
        return None
    seq = report_seq(data.get("seq"))
    at = parse_iso(data.get("at"))
    ok = data.get("ok")
    if seq is None or at is None or not isinstance(ok, bool):
        return None
    verdict = data.get("verdict")
    return Report(
        seq=seq,
        at=at,
        ok=ok,
        verdict=VERDICT_WORDS.get(verdict) if isinstance(verdict, str) else None,
        role=_short_text(data.get("role")),
        channel=_short_text(data.get("channel")),
        summary=_short_text(data.get("summary")),
    )


@dataclass(frozen=True)
class Lineage:
    """`lineage.json`: which agent created this one and why."""

    parent: str
    reason: str
    provider: str | None
    depth: int | None
    created_at: datetime | None


def parse_lineage(raw: bytes | None) -> Lineage | None:
    """The lineage record, or None when missing or without a parent and a reason."""
    if raw is None:
        return None
    data: Any = parse_json(raw)
    if not isinstance(data, dict):
        return None
    parent, reason = _short_text(data.get("parent")), _short_text(data.get("reason"))
    if parent is None or reason is None:
        return None
    return Lineage(
        parent=parent,
        reason=reason,
        provider=_short_text(data.get("provider")),
        depth=count_field(data.get("depth")),
        created_at=parse_iso(data.get("created_at")),
    )


# How a broken `lineage.json` is fixed, for the service that names one.
LINEAGE_FIX: Final = "write it as `taskcard spawn` does, or remove it (then no lineage row shows)"


def lineage_problem(raw: bytes) -> str | None:
    """Why the bytes of `lineage.json` are no lineage record, in words that follow its name;
    None for a record and for an empty file (a write under way). The service's judgment: such
    a file read as no lineage, and nothing said why."""
    if not raw.strip():
        return None
    data, problem = _line_value(raw)
    if problem is None and not isinstance(data, dict):
        problem = "is not a JSON object"
    elif problem is None and (
        _short_text(data.get("parent")) is None or _short_text(data.get("reason")) is None
    ):
        problem = "has no parent and reason that show text"
    return None if problem is None else f"{problem}; {LINEAGE_FIX}"


@dataclass(frozen=True)
class Ack:
    """One line of `inbox/acks.jsonl`: the agent side has handed message `id` to the agent."""

    id: str
    at: datetime | None
    via: str | None


def parse_ack(line: bytes) -> Ack | None:
    """An ack of a delivered message, or None (bad id, other state, not JSON)."""
    data: Any = parse_json(line)
    if not isinstance(data, dict) or data.get("state") != "delivered":
        return None
    ident = data.get("id")
    if not isinstance(ident, str) or not MESSAGE_ID.fullmatch(ident):
        return None
    via = data.get("via")
    # Only text is tested against the set: a list or an object there would raise.
    known = isinstance(via, str) and via in ACK_VIAS
    return Ack(id=ident, at=parse_iso(data.get("at")), via=via if known else None)


def inbox_message(
    *,
    ident: str,
    kind: MessageKind,
    text: str,
    channel: str,
    chat_id: str,
    thread_id: str | None,
    user: str | None,
    queued_at: datetime,
    name: str | None = None,
) -> dict[str, Any]:
    """The JSON object of one queued message (see the module docstring for the fields).
    `name` is the author's shown name when the message names no person (`from.name`, only
    then written), cleaned and cut by `shown_name`."""
    origin = None
    if kind == "message":
        origin = f"{channel}:{chat_id}" + (f":{thread_id}" if thread_id else "")
    sender: dict[str, str | None] = {
        "channel": channel,
        "chat_id": chat_id,
        "thread_id": thread_id,
        "user": user,
    }
    if name is not None and (shown := shown_name(name)):
        sender["name"] = shown
    return {
        "v": INBOX_VERSION,
        "id": ident,
        "kind": kind,
        "text": text,
        "from": sender,
        "origin": origin,
        "queued_at": iso_utc(queued_at),
    }
