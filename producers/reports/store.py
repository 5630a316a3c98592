"""`reports/reports.jsonl`: numbered reports, one JSON object per line, seq never reused.

A report line is `{"seq", "at", "ok", "verdict", "role", "channel", "summary",
"payload_file", "payload_bytes"}`. The `channel` (cli, mcp, python, hook) is stamped by the
side that received the report; a caller that passes one is refused. The payload (at most
64 KiB of UTF-8 text) goes to a side file `reports/payloads/<seq>.txt`, written before its
line, so every line stays small for the service's tail reader and one report is one line.

Numbering: under an exclusive `flock` on `reports/.lock`, the writer takes the larger of the
last seq in the file (a bounded tail read) and the counter in `reports/.seq`, adds one,
writes the line with one `write` on an `O_APPEND` descriptor (after a line break when the
file ends in a torn line) and then the counter. Either
source alone survives the loss of the other (a truncated file, a deleted counter), so a seq
is never handed out twice. Reading with `after(seq)` returns the first report with a larger
seq: reading with the last seq seen walks every round once, and old rounds stay in the file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final

from taskcard.producers.reports.contract import (
    LINE_FIX,
    MAX_SEQ,
    VERDICT_WORDS,
    line_problem,
    parse_report,
    report_object,
    report_seq,
)
from taskcard.producers.task_card.contract import (
    NotRegularFile,
    OutsideWorkdir,
    append_whole,
    atomic_write,
    cannot_read,
    cannot_write,
    count_field,
    file_kind,
    is_inside,
    iso_utc,
    json_kind,
    line_break_first,
    open_append,
    open_lock,
    open_regular,
    quoted,
    read_regular,
    shows_text,
    utc_now_iso,
)
from taskcard.producers.task_card.tool_failure import READ_FAILED, UNUSABLE_FILE, Coded, Names
from taskcard.producers.task_card.workdir_arg import WorkdirError, given_path, not_a_directory

REPORTS_DIR: Final = "reports"
REPORTS_FILE: Final = "reports.jsonl"
PAYLOADS_DIR: Final = "payloads"
LOCK_FILE: Final = ".lock"
COUNTER_FILE: Final = ".seq"
CHANNELS: Final = ("cli", "mcp", "python", "hook")
VERDICTS: Final = tuple(VERDICT_WORDS)  # approved, rejected and the spec's own words
MAX_PAYLOAD_BYTES: Final = 64 * 1024
MAX_SUMMARY_CHARS: Final = 2000
TAIL_BYTES: Final = 256 * 1024
MAX_LINE_BYTES: Final = 64 * 1024
# Letters and digits of any script (a reviewer may be a "revisão" or a "审阅者"), read in
# NFC, with the marks some scripts write words with (Devanagari's vowel signs); no controls,
# format characters, or a mark to begin with.
ROLE_MAX_CHARS: Final = 64
PAYLOAD_NAME: Final = re.compile(rf"{PAYLOADS_DIR}/[0-9]{{1,18}}\.txt")

# The broken lines `reports` names one by one (on stderr, in the MCP tool's result); the rest
# are counted.
SKIPPED_SHOWN: Final = 5

Clock = Callable[[], str]


# The fields of `report` and `reports` as each way in names them (`tool_failure.worded`):
# their errors start with the field, which is the MCP tools' field and the Python API's
# parameter; the command line says it as its option (`--role: ...`, where it said `role:`).
NAMES: Final = Names(
    options=frozenset(("ok", "verdict", "role", "summary", "payload", "after", "workdir"))
)


class ReportError(Coded):
    """A report or a read that cannot be done; the text names the field and the fix."""


def write_problem(exc: OSError, workdir: Path) -> str:
    """What the system refused while a report was added, in one line: the path it named
    (relative to the workdir; for the temporary file of an atomic write, its folder), why,
    and the fix. "cannot write reports/: Is a directory" said neither which file (a folder
    at `reports/.lock`) nor what to do."""
    named = Path(exc.filename) if isinstance(exc.filename, str) else workdir / REPORTS_DIR
    if named.name.startswith(".") and named.name.endswith(".tmp"):
        named = named.parent
    with contextlib.suppress(ValueError):
        named = named.relative_to(workdir)
    return cannot_write(named, exc)


def encodable(text: str) -> bool:
    """False for text carrying lone surrogates (undecodable bytes of a command line)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """One report line, or None when it is not one (total; read by the shared JSON reader, so
    a lone surrogate escape comes back as U+FFFD, printable and encodable)."""
    data = report_object(raw)
    if data is None or report_seq(data.get("seq")) is None:
        return None
    return data


def _problem(line: bytes | None) -> str | None:
    """Why a line read by `Reports` is no report, None for a report, a blank line or the
    file's last line while it is still being written (no line break yet)."""
    if line is None:
        return f"is longer than {MAX_LINE_BYTES:,} bytes, the most a report line may hold"
    if not line.endswith(b"\n"):
        return None
    return line_problem(line)


def is_role(text: str) -> bool:
    """1-64 letters, digits, combining marks (after the first), spaces, '_', '.' or '-'."""
    if not 1 <= len(text) <= ROLE_MAX_CHARS or unicodedata.category(text[0])[0] not in "LN":
        return False
    return all(c in " _.-" or unicodedata.category(c)[0] in "LNM" for c in text)


def readable(report: dict[str, Any]) -> dict[str, Any] | None:
    """What a reader is given of one report line: None unless the service would announce it
    too (a seq, a date and a boolean `ok`), else its documented fields with the types the
    format states, an unusable value read as null (a verdict in the spec's words as the one
    stored). A hand-written `"ok": "false"` read as a report would be a success to any caller
    testing its truth; fields the format does not name are left out."""
    typed = parse_report(json.dumps(report).encode())
    if typed is None:
        return None
    name = report.get("payload_file")
    named = isinstance(name, str) and PAYLOAD_NAME.fullmatch(name) is not None
    return {
        "seq": typed.seq,
        "at": iso_utc(typed.at),  # a hand-written offset in the writers' UTC form
        "ok": typed.ok,
        "verdict": typed.verdict,
        "role": typed.role,
        "channel": typed.channel,
        "summary": typed.summary,
        "payload_file": name if named else None,
        "payload_bytes": count_field(report.get("payload_bytes")) if named else None,
    }


def check_report(
    *,
    ok: object,
    verdict: object = None,
    role: object = None,
    summary: object = None,
    payload: object = None,
) -> None:
    """Raise `ReportError` naming the first field that is wrong (pure)."""
    if not isinstance(ok, bool):
        raise ReportError("ok: must be true (succeeded) or false (a declared failure)")
    if verdict is not None and verdict not in VERDICTS:
        raise ReportError(
            "verdict: must be approved or rejected (aprovado or reprovado), or left out when"
            " not a review"
        )
    if role is not None and not (
        isinstance(role, str) and is_role(unicodedata.normalize("NFC", role))
    ):
        raise ReportError(
            "role: 1-64 letters (of any script), digits, spaces, '_', '.' or '-', starting"
            " with a letter or digit, e.g. reviewer"
        )
    if summary is not None:
        if not isinstance(summary, str):
            # Said as white space before, which sent the writer looking at the wrong thing.
            raise ReportError(
                f"summary: must be text, not {json_kind(summary)}; give one short paragraph,"
                " or leave it out"
            )
        if not shows_text(summary):
            raise ReportError(
                "summary: must be text that shows (not only white space or invisible"
                " characters such as zero-width spaces), or left out"
            )
        if "\0" in summary:
            raise ReportError("summary: contains a NUL character; remove it")
        if not encodable(summary):
            raise ReportError(
                "summary: holds bytes that are not UTF-8 (undecodable input); pass UTF-8 text"
            )
        if len(summary) > MAX_SUMMARY_CHARS:
            raise ReportError(
                f"summary: {len(summary)} characters, at most {MAX_SUMMARY_CHARS}; "
                "put the details in the payload"
            )
    if payload is not None:
        if not isinstance(payload, str):
            raise ReportError("payload: must be text")
        if not encodable(payload):
            raise ReportError(
                "payload: holds bytes that are not UTF-8 (undecodable input); pass UTF-8 text"
            )
        size = len(payload.encode("utf-8"))
        if size > MAX_PAYLOAD_BYTES:
            raise ReportError(
                f"payload: {size} bytes, at most {MAX_PAYLOAD_BYTES}; "
                "write the rest to a file in the workdir and name it in the payload"
            )


def after_problem(seq: object) -> str | None:
    """Why `seq` cannot be the last seq read, in words after the field's name (None: it can):
    one range for every way in (`Reports.after`, `taskcard reports --after`, the `reports`
    tool), where MCP alone refused a seq past any report's and the others answered that no
    report came after it."""
    if isinstance(seq, bool) or not isinstance(seq, int):
        return f"must be a whole number from 0 to {MAX_SEQ} (the last seq you read)"
    if not 0 <= seq <= MAX_SEQ:
        return f"{seq} is out of range; give the last seq you read (0 to {MAX_SEQ})"
    return None


class Reports:
    """The reports of one workdir; `channel` is who receives them (stamped on each)."""

    def __init__(self, workdir: Path, *, channel: str = "python", clock: Clock = utc_now_iso):
        if channel not in CHANNELS:
            raise ReportError(f"channel: {channel!r} is not one of {', '.join(CHANNELS)}")
        try:
            self.workdir = given_path(workdir)
        except WorkdirError as exc:
            raise ReportError(f"workdir: {exc}") from None
        self.dir = self.workdir / REPORTS_DIR
        self.path = self.dir / REPORTS_FILE
        self._channel = channel
        self._clock = clock
        # The broken lines the last `after` read past: the first `SKIPPED_SHOWN`, each with
        # its line number and what is wrong, and how many there were in all (`skipped_lines`).
        # Bounded: a file of 100,000 broken lines keeps five of them.
        self._skipped: list[tuple[int, str]] = []
        self._skipped_count = 0

    def add(
        self,
        /,
        *,
        ok: bool,
        verdict: str | None = None,
        role: str | None = None,
        summary: str | None = None,
        payload: str | None = None,
        **unknown: object,
    ) -> dict[str, Any]:
        """Append one report; the stored record (with its seq). Raises `ReportError`."""
        if "channel" in unknown:
            raise ReportError("channel: stamped by the side that receives the report; remove it")
        if unknown:
            raise ReportError(
                f"{sorted(unknown)[0]}: not a report field; use ok, verdict, role, summary, payload"
            )
        check_report(ok=ok, verdict=verdict, role=role, summary=summary, payload=payload)
        self._require_workdir()
        self._require_folder()
        with self._locked():
            seq = max(self._last_seq(), self._counter()) + 1
            if seq > MAX_SEQ:
                raise ReportError(
                    f"seq: reports/ is numbered up to {MAX_SEQ} already, the most a report may"
                    " carry; move reports/ aside to start again from 1"
                )
            record: dict[str, Any] = {
                "seq": seq,
                "at": self._clock(),
                "ok": ok,
                "verdict": None if verdict is None else VERDICT_WORDS[verdict],
                "role": None if role is None else unicodedata.normalize("NFC", role),
                "channel": self._channel,
                "summary": summary,
                "payload_file": None,
                "payload_bytes": None,
            }
            if payload is not None:
                data = payload.encode("utf-8")
                name = f"{PAYLOADS_DIR}/{seq}.txt"
                atomic_write(self.dir / name, data)
                record["payload_file"] = name
                record["payload_bytes"] = len(data)
            line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
            fd = self._open_for_append()
            try:
                append_whole(fd, line_break_first(fd) + line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            # The report is recorded: a counter that cannot be written (a folder planted at
            # `.seq`, a full disk) must not turn it into a failure the caller would retry,
            # adding it again. The file's own last seq numbers the next one meanwhile.
            with contextlib.suppress(OSError):
                atomic_write(self.dir / COUNTER_FILE, str(seq).encode(), durable=False)
        return record

    def after(self, seq: int | None = None) -> dict[str, Any] | None:
        """The first report with a seq above `seq` (the latest when None), or None."""
        problem = None if seq is None else after_problem(seq)
        if problem is not None:
            raise ReportError(f"after: {problem}")
        self._require_workdir()
        self._require_folder()
        self._skipped, self._skipped_count = [], 0
        if seq is None:
            latest = self._read(self._tail_lines(), None)
            if latest is None:
                # The tail holds no report (a long run of other lines after the last one):
                # walk the whole file rather than answer that there is none.
                latest = self._read(self._numbered_lines(), None)
            return None if latest is None else self._with_payload(latest)
        found = self._read(self._numbered_lines(), seq)
        return None if found is None else self._with_payload(found)

    def _read(
        self, lines: Iterable[tuple[int, bytes | None]], after: int | None
    ) -> dict[str, Any] | None:
        """The first readable report with a seq above `after`, or (`after` None) the last one.
        The broken lines read past where a report could have been are kept (`skipped`):
        those after the last report at or below `after` (after the latest, for None)."""
        latest: dict[str, Any] | None = None
        skipped = self._skipped
        skipped.clear()
        self._skipped_count = 0
        for number, line in lines:
            problem = _problem(line)
            if problem is not None:
                if len(skipped) < SKIPPED_SHOWN:
                    skipped.append((number, problem))
                self._skipped_count += 1
                continue
            found = parse_line(line) if line is not None else None
            report = readable(found) if found is not None else None
            if found is None or report is None:
                continue  # a blank line, or one still being written
            if after is not None and found["seq"] > after:
                return report
            latest = report
            skipped.clear()
            self._skipped_count = 0
        return latest if after is None else None

    def skipped_lines(self) -> tuple[list[tuple[int, str]], int]:
        """The broken lines the last `after` read past where a report could have been: the
        first `SKIPPED_SHOWN` as (line number, what `taskcard reports` says of it:
        `reports/reports.jsonl line 3 is not JSON; skipped (...)`), and how many more there
        were. One wording for the command line, the MCP tool and the Python API."""
        name = f"{REPORTS_DIR}/{REPORTS_FILE}"
        said = [
            (number, f"{name} line {number:,} {problem}; skipped ({LINE_FIX})")
            for number, problem in self._skipped
        ]
        return said, self._skipped_count - len(said)

    def skipped(self) -> list[str]:
        """`skipped_lines` in words, one line each, and then how many more: a reader told of
        no report learns that one may be there and cannot be read."""
        shown, more = self.skipped_lines()
        said = [text for _, text in shown]
        if more:
            said.append(f"{REPORTS_DIR}/{REPORTS_FILE}: {more:,} more broken lines skipped")
        return said

    def _require_workdir(self) -> None:
        """A workdir that is not a folder (missing, a file) is refused, naming it."""
        try:
            usable = self.workdir.is_dir()
        except OSError as exc:  # a name too long for the system, a folder not searchable
            raise ReportError(
                f"workdir: {quoted(str(self.workdir))} cannot be used ({exc.strerror}); give the"
                " agent's working directory"
            ) from None
        if not usable:
            raise ReportError(
                f"workdir: {quoted(str(self.workdir))} {not_a_directory(str(self.workdir))};"
                " give the agent's working directory"
            )

    def _require_folder(self) -> None:
        """Something other than a folder at `reports/` (a file, a named pipe) is the agent's
        files being wrong, not the system failing: refused naming it and the fix, where the
        system's "File exists" or "Not a directory" said neither."""
        try:
            mode = os.lstat(self.dir).st_mode
        except OSError:  # missing: created by the first report
            return
        if stat.S_ISLNK(mode):
            # Never followed out of the workdir (not even for a stat); a link inside it that
            # leads nowhere is named as such, not as the system's "File exists".
            if not is_inside(os.path.realpath(self.workdir), os.path.realpath(self.dir)):
                raise self._outside()
            try:
                mode = os.stat(self.dir).st_mode
            except OSError:
                raise ReportError(
                    f"{REPORTS_DIR}/: a symlink that leads nowhere; replace it with a folder",
                    code=UNUSABLE_FILE,
                ) from None
        if not stat.S_ISDIR(mode):
            kind = "a regular file" if stat.S_ISREG(mode) else file_kind(mode)
            raise ReportError(
                f"{REPORTS_DIR}/: {kind}, not a folder; move it aside (reports are kept in the"
                f" folder {REPORTS_DIR}/, created by the first report)",
                code=UNUSABLE_FILE,
            )

    def _reports(self) -> Iterator[dict[str, Any]]:
        """Every report line of the file in order (a line too long is skipped)."""
        for _, line in self._numbered_lines():
            if line is not None and (report := parse_line(line)) is not None:
                yield report

    def _numbered_lines(self) -> Iterator[tuple[int, bytes | None]]:
        """(line number, line) for every line of the file; None for a line over
        `MAX_LINE_BYTES`, skipped without holding more than that much of it in memory."""
        handle = self._open_reports()
        if handle is None:
            return
        with handle:
            number = 0
            while line := self._reading(handle.readline, MAX_LINE_BYTES + 1):
                number += 1
                if len(line) > MAX_LINE_BYTES:
                    while line and not line.endswith(b"\n"):  # the rest of the long line
                        line = self._reading(handle.readline, MAX_LINE_BYTES)
                    yield number, None
                    continue
                yield number, line

    def _reading(self, read: Callable[[int], bytes], size: int) -> bytes:
        """`read(size)` of the reports file, a failure of the system's said as one."""
        try:
            return read(size)
        except OSError as exc:
            raise self._read_failed(exc) from None

    def _read_failed(self, exc: OSError) -> ReportError:
        """A read of the reports file the system failed (an I/O error): named, with the
        errno and the fix (`contract.cannot_read`). A report was refused as a write the
        system refused ("move what is in the way aside"), and `reports` named the folder."""
        return ReportError(f"{REPORTS_DIR}/{REPORTS_FILE}: {cannot_read(exc)}", code=READ_FAILED)

    def _open_reports(self) -> BinaryIO | None:
        """The reports file opened for reading, None when there is none. Like every writer,
        the reader takes nothing from a file that lies outside the workdir (a link out of it
        at `reports/` or at the file): another agent's reports would read as this one's."""
        try:
            return open_regular(self.path, inside=self.workdir)
        except FileNotFoundError:
            return None
        except OutsideWorkdir:
            raise self._outside() from None
        except NotRegularFile:
            raise self._not_regular(os.stat(self.path).st_mode) from None
        except OSError as exc:
            raise self._read_failed(exc) from None

    def _with_payload(self, report: dict[str, Any]) -> dict[str, Any]:
        """The report with its payload text, read from its side file (bounded)."""
        name = report.get("payload_file")
        text: str | None = None
        if isinstance(name, str) and PAYLOAD_NAME.fullmatch(name):
            with contextlib.suppress(OSError):  # gone, odd, or a link out: no payload
                data = read_regular(self.dir / name, MAX_PAYLOAD_BYTES, inside=self.workdir)
                text = data.decode("utf-8", errors="replace")
        return {**report, "payload": text}

    def _open_for_append(self) -> int:
        """A descriptor appending to the reports file, which is created when missing.

        Non-blocking and checked with `fstat`: a named pipe in its place would otherwise hold
        the writer (and the lock every other writer waits on) forever."""
        try:
            fd = open_append(self.path, inside=self.workdir)
        except OutsideWorkdir:
            raise self._outside() from None
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a named pipe that nobody reads
                raise self._not_regular(stat.S_IFIFO) from None
            raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise self._not_regular(mode)
        return fd

    def _outside(self, name: str = REPORTS_FILE) -> ReportError:
        """What leads out of the workdir, named: the folder `reports/`, or (the folder inside)
        its file `name` (`reports.jsonl`, `.lock`), which was called the folder."""
        folder_inside = is_inside(os.path.realpath(self.workdir), os.path.realpath(self.dir))
        if folder_inside:
            return ReportError(
                f"{REPORTS_DIR}/{name}: leads out of the workdir (a symlink); nothing"
                " outside it is read or written, so replace the link with a regular file inside"
                " the workdir (or move it aside)",
                code=UNUSABLE_FILE,
            )
        return ReportError(
            f"{REPORTS_DIR}/: leads out of the workdir (a symlink); nothing outside it is read"
            " or written, so replace the link with a folder (or a file) inside the workdir",
            code=UNUSABLE_FILE,
        )

    @staticmethod
    def _not_regular(mode: int) -> ReportError:
        return ReportError(
            f"{REPORTS_DIR}/{REPORTS_FILE}: {file_kind(mode)}, not a regular file; replace it"
            " with a regular file (or move it aside)",
            code=UNUSABLE_FILE,
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not is_inside(os.path.realpath(self.workdir), os.path.realpath(self.dir)):
            raise self._outside()  # the lock, the payloads and the counter would go there
        try:
            fd = open_lock(self.dir / LOCK_FILE, inside=self.workdir)
        except OutsideWorkdir:
            raise self._outside(LOCK_FILE) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _tail_lines(self) -> list[tuple[int, bytes | None]]:
        """The complete lines of the file's last `TAIL_BYTES`, numbered as in the file."""
        handle = self._open_reports()
        if handle is None:
            return []
        with handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_BYTES)
            handle.seek(start)
            data = self._reading(handle.read, TAIL_BYTES)
            first = 1
            if start > 0:
                # The lines before the tail, counted in bounded chunks; the tail's first
                # (partial) line is left out.
                handle.seek(0)
                left = start
                while left > 0 and (chunk := self._reading(handle.read, min(left, 1 << 20))):
                    first += chunk.count(b"\n")
                    left -= len(chunk)
        # Split at line feeds only, as `readline` does (`splitlines` also splits at a carriage
        # return, which a broken line may hold, and the numbers would differ).
        lines = [line + b"\n" for line in data.split(b"\n")]
        lines[-1] = lines[-1][:-1]
        if not lines[-1]:
            lines.pop()
        if start > 0 and lines:
            lines, first = lines[1:], first + 1
        return [(first + index, line) for index, line in enumerate(lines)]

    def _last_seq(self) -> int:
        seqs: list[int] = [
            r["seq"] for _, line in self._tail_lines() if line and (r := parse_line(line))
        ]
        if not seqs:
            # The tail holds no report (a long run of other lines after the last one): walk
            # the whole file, or numbering would restart at 1 below what the service has seen.
            seqs = [report["seq"] for report in self._reports()]
        return max(seqs, default=0)

    def _counter(self) -> int:
        try:
            return report_seq(int(read_regular(self.dir / COUNTER_FILE, 32))) or 0
        except (OSError, ValueError):
            return 0
