"""`taskcard report`, `taskcard reports` and `taskcard spawn`.

Each prints one JSON object on stdout. Exit codes: 0 done (`reports` with nothing newer
too: `{"report": null}`; broken lines of the file it read past are named on stderr, one line
each, with the exit code still 0), 2 bad input (one line on stderr naming the field and the
fix), 1 the files could not be written.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from taskcard.producers.reports.lineage import (
    DEFAULT_MAX_DEPTH,
    MAX_DEPTH_LIMIT,
    MAX_REASON_CHARS,
    LineageError,
    spawn,
)
from taskcard.producers.reports.store import (
    MAX_PAYLOAD_BYTES,
    MAX_SUMMARY_CHARS,
    NAMES,
    VERDICTS,
    ReportError,
    Reports,
    after_problem,
    write_problem,
)
from taskcard.producers.task_card.contract import (
    LOOP_OF_LINKS,
    NotRegularFile,
    expand_home,
    file_kind,
    link_loop,
    read_regular,
    terminal_json,
)
from taskcard.producers.task_card.number_args import whole_number
from taskcard.producers.task_card.stdin_json import (
    DRAIN_MAX_BYTES,
    DRAIN_WITHIN_S,
    drain_stdin,
    read_stdin_object,
)
from taskcard.producers.task_card.tool_failure import READ_FAILED, WRITE_FAILED, worded
from taskcard.producers.task_card.workdir_arg import (
    dangling_link,
    existing_workdir_arg,
    file_path_problem,
    not_a_directory,
    shown_path,
    workdir_arg,
)


def _print(data: Any) -> None:
    print(terminal_json(data))


def _fail(command: str, message: str, code: int = 2) -> int:
    """Say a refusal on stderr and return its exit code. `report` and `reports` name the
    field at fault as its option (`worded`); `spawn` words its own (`lineage.spawn`)."""
    if command != "spawn":
        message = worded(message, "cli", NAMES)
    print(f"taskcard {command}: {message}", file=sys.stderr)
    return code


class PayloadTooLarge(ReportError):
    """A payload over the limit; `from_stdin` when its writer may still be writing."""

    def __init__(self, message: str, *, from_stdin: bool) -> None:
        super().__init__(message)
        self.from_stdin = from_stdin


def _read_payload(source: str) -> str:
    try:
        if source == "-" and sys.stdin is None:  # started with stdin closed (`<&-`)
            raise ReportError(
                "--payload: stdin is closed, so there is no payload to read; pipe it in, or"
                " name a file"
            )
        if not source.strip():
            # Read as `.`, it was "cannot read  (Is a directory)", about a folder nobody named.
            raise ReportError("--payload: is empty; give the file to read, or - for stdin")
        raw = _read_payload_stdin() if source == "-" else _read_payload_file(_expanded(source))
    except OSError as exc:
        # Shown escaped: a name holding an escape sequence acted on the terminal.
        named = _expanded(source)
        dangling = (
            dangling_link(Path(named), "cannot be read: ")
            if isinstance(exc, FileNotFoundError)
            else None
        )
        if dangling is not None:
            # "No such file" about a name `ls` shows: the link's far end is what is missing.
            raise ReportError(
                f"--payload: {shown_path(source)} {dangling}; name the file itself"
            ) from None
        if exc.errno == errno.ELOOP:
            loop = link_loop(Path(named), "cannot be read: ") or LOOP_OF_LINKS
            raise ReportError(
                f"--payload: {shown_path(source)} {loop}; fix the links, or name the file itself"
            ) from None
        if exc.errno == errno.ENOTDIR and (problem := file_path_problem(Path(named))):
            # A file on the way (`notes.txt/x`) was "Not a directory", naming no file.
            raise ReportError(f"--payload: {shown_path(source)} {problem}") from None
        raise ReportError(f"--payload: cannot read {shown_path(source)} ({exc.strerror})") from None
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"--payload: over {MAX_PAYLOAD_BYTES} bytes; write the rest to a file in the "
            "workdir and name it in the payload",
            from_stdin=source == "-",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(
            f"--payload: not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x}); convert it"
            " to UTF-8 (iconv -t UTF-8) and report again"
        ) from None


# A pipe on stdin that stays open this long without a byte ends `--payload -` with a
# refusal, as `taskcard tool` ends its envelope's read (`task_card.cli.STDIN_IDLE_S`).
PAYLOAD_STDIN_IDLE_S: Final = 30.0


def _never_settled(data: bytes) -> object:
    raise ValueError("a payload is text: only its end ends it")


def _read_payload_stdin() -> bytes:
    """At most one byte over the cap of stdin, read to its end (a terminal: to Ctrl-D).

    A caller that runs the command with a pipe it never closes (an agent host's tool runner
    does, when nothing is piped in) held `--payload -` for ever: the read now ends after
    `PAYLOAD_STDIN_IDLE_S` without a byte, refused, with the one stdin reader the envelope's
    and the hooks' reads use. Text has no end of its own, so only the pipe's end takes it.
    """
    raw, ended = read_stdin_object(MAX_PAYLOAD_BYTES, _never_settled, PAYLOAD_STDIN_IDLE_S)
    if not ended:
        raise ReportError(
            f"--payload: stdin stayed open {PAYLOAD_STDIN_IDLE_S:g} s without a byte and"
            " without its end; close it after the payload, or name a file"
        )
    return raw


def _expanded(source: str) -> str:
    """`source` with `~` expanded: `--payload=~/notes.md` (or the path in quotes) reaches the
    command as typed, and was "No such file" about a file that is there."""
    path = expand_home(source)
    if path is None:
        raise ReportError(
            f"--payload: {shown_path(source)} cannot be expanded (no such user); give the full path"
        )
    return os.fspath(path)


def _read_payload_file(source: str) -> bytes:
    """At most one byte over the cap of the regular file `source` names.

    Anything else is refused before a byte is read (`read_regular` opens without waiting and
    checks the descriptor): a named pipe with no writer held the command for ever at its
    `open`, `/dev/zero` was read as a payload too long, a socket (which cannot be opened at
    all) was "No such device or address".
    """
    try:
        return read_regular(Path(source), MAX_PAYLOAD_BYTES + 1)
    except NotRegularFile:
        mode = os.stat(source).st_mode
    except OSError as exc:
        if exc.errno != errno.ENXIO:
            raise
        mode = os.stat(source).st_mode
    raise ReportError(
        f"--payload: {shown_path(source)} is {file_kind(mode)}, not a regular file; write the"
        " payload to a file, or pipe it in with --payload -"
    )


def run_report(args: argparse.Namespace) -> int:
    try:
        payload = _read_payload(args.payload) if args.payload is not None else None
        record = Reports(args.workdir, channel="cli").add(
            ok=args.ok,
            verdict=args.verdict,
            role=args.role,
            summary=args.summary,
            payload=payload,
        )
    except PayloadTooLarge as exc:
        code = _fail("report", str(exc))
        if exc.from_stdin:
            # Only the limit and a byte were read: a writer still sending the rest got a
            # broken pipe (SIGPIPE, its pipeline failed) or blocked on a full pipe. The rest
            # is read and dropped after the refusal is said, within the same bound as
            # `taskcard tool`'s oversized envelope.
            sys.stderr.flush()
            drain_stdin(DRAIN_MAX_BYTES, DRAIN_WITHIN_S)
        return code
    except ReportError as exc:
        # The reports file the system failed to read (EIO) is a failure, 1, as a failed
        # write is (it was refused as one); its other refusals are input to mend, 2.
        return _fail("report", str(exc), 1 if exc.code == READ_FAILED else 2)
    except OSError as exc:
        return _fail("report", write_problem(exc, args.workdir), 1)
    _print(record)
    return 0


def run_reports(args: argparse.Namespace) -> int:
    try:
        reports = Reports(args.workdir, channel="cli")
        report = reports.after(args.after)
    except ReportError as exc:
        return _fail("reports", str(exc), 1 if exc.code == READ_FAILED else 2)
    except OSError as exc:
        return _fail("reports", f"cannot read reports/: {exc.strerror}", 1)
    # Broken lines read past are said on stderr, the answer and its exit code unchanged: the
    # reports around them are read as ever, and a caller polling for the next one goes on.
    for line in reports.skipped():
        print(f"taskcard reports: {line}", file=sys.stderr)
    _print({"report": report})
    return 0


def _spawn_folder_arg(fix: str) -> Callable[[str], Path]:
    """`workdir_arg` for `spawn`'s folders, refusing a name through a symbolic link that leads
    nowhere as the user typed it: resolved first, the refusal named the link's far end
    ("'/elsewhere/gone' is not a directory"), a path the user never gave."""

    def read(text: str) -> Path:
        path = workdir_arg(text)
        broken = not_a_directory(text)
        if broken != "is not a directory":  # a link leading nowhere or round a loop
            raise argparse.ArgumentTypeError(f"{shown_path(text)} {broken}; {fix}")
        return path

    return read


def run_spawn(args: argparse.Namespace) -> int:
    try:
        record = spawn(
            args.workdir,
            parent=args.parent,
            reason=args.reason,
            provider=args.provider,
            parent_workdir=args.parent_workdir,
            max_depth=args.max_depth,
            way="cli",
        )
    except LineageError as exc:
        # A lineage.json the system failed to read (EIO) or write is a failure, 1; its other
        # refusals are input to mend, 2 (docs: the exit codes table).
        return _fail("spawn", str(exc), 1 if exc.code in (READ_FAILED, WRITE_FAILED) else 2)
    _print(record)
    return 0


def _seq(text: str) -> int:
    value = whole_number(text, "a seq (the last one you read)")
    problem = after_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = subparsers.add_parser(
        "report",
        help="append a numbered report (the result of this agent's work)",
        description=(
            "Append one report to <workdir>/reports/reports.jsonl with the next seq. The "
            "channel (cli) is stamped by this command."
        ),
    )
    report.add_argument(
        "--workdir", type=existing_workdir_arg, default=".", help="the agent's workdir"
    )
    outcome = report.add_mutually_exclusive_group(required=True)
    outcome.add_argument("--ok", dest="ok", action="store_true", help="the work succeeded")
    outcome.add_argument("--failed", dest="ok", action="store_false", help="a declared failure")
    report.add_argument("--verdict", choices=VERDICTS, default=None, help="when it is a review")
    report.add_argument("--role", default=None, help="your role now, e.g. reviewer")
    report.add_argument(
        "--summary",
        default=None,
        help=f"one short paragraph, at most {MAX_SUMMARY_CHARS} characters",
    )
    report.add_argument(
        "--payload", default=None, metavar="FILE|-", help="details, UTF-8, at most 64 KiB"
    )
    report.set_defaults(handler=run_report)

    reports = subparsers.add_parser(
        "reports",
        help="read the next report after a seq (or the latest)",
        description=(
            'Print {"report": ...} for the first report with a seq above --after (the '
            'latest without it); {"report": null} when there is nothing newer.'
        ),
    )
    reports.add_argument(
        "--workdir", type=existing_workdir_arg, default=".", help="the agent's workdir"
    )
    reports.add_argument(
        "--after",
        type=_seq,
        default=None,
        metavar="SEQ",
        help="last seq read (default: print the latest report)",
    )
    reports.set_defaults(handler=run_reports)

    spawn_parser = subparsers.add_parser(
        "spawn",
        help="record who created an agent and why (<child>/lineage.json)",
        description="Write the child's lineage record; refuses spawns deeper than the cap.",
    )
    spawn_parser.add_argument(
        "--workdir",
        type=_spawn_folder_arg("create the child's working directory first"),
        required=True,
        help="the child's workdir",
    )
    spawn_parser.add_argument("--parent", required=True, help="the parent's agent id")
    spawn_parser.add_argument(
        "--reason",
        required=True,
        help=f"why the child is created, at most {MAX_REASON_CHARS} characters",
    )
    spawn_parser.add_argument("--provider", default=None, help="e.g. claude-code, codex")
    spawn_parser.add_argument(
        "--parent-workdir",
        type=_spawn_folder_arg("give the parent's working directory, or leave it out"),
        default=None,
        help="the parent's workdir, recorded: the child's depth is the parent's + 1, and a"
        " child that would close a loop or sit in the parent's contract folders is refused"
        " (default: depth 1, none of these checks)",
    )
    spawn_parser.add_argument(
        "--max-depth",
        type=whole_number,
        default=DEFAULT_MAX_DEPTH,
        help=f"the depth cap, 1 to {MAX_DEPTH_LIMIT}",
    )
    spawn_parser.set_defaults(handler=run_spawn)
