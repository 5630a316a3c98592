"""`Ledger(path)`: every read-modify-write of a ledger file, under a lock, replaced atomically.

Each write takes an exclusive `flock` on `<ledger>.lock` beside the file, reads the current
document, applies one observation to one task, recomputes that task's `derived` state and
replaces the file atomically (temp file, fsync, rename). Concurrent writers from many
processes therefore queue instead of overwriting each other, and readers never see half a
file. A write touches exactly one task record; other tasks' bytes are carried over as read.

Bad input raises `LedgerError` with one line naming the field and the fix.

A ledger in an agent's workdir (the default `ledger/long-task-ledger.json`, or any path given
inside it) is read and written only inside it: with `inside` (the workdir), a `ledger/` folder
or ledger file that is a symlink leading out of the workdir is refused with a `LedgerError`
naming it, before anything is read, created or written there, as the other contract paths are.
"""

from __future__ import annotations

import codecs
import contextlib
import difflib
import errno
import fcntl
import functools
import json
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Final, TypeVar, cast

from pydantic import ValidationError

from taskcard.producers.ledger.contract import LEDGER_DIR, LEDGER_FILE, SAFE_ID
from taskcard.producers.ledger.model import (
    EVENT_TYPES,
    FAILURE_KINDS,
    MAX_BYTES,
    MAX_OBSERVATIONS,
    MAX_SECONDS,
    OWNER_REPLIES,
    BlockTruth,
    BrokenTask,
    CompletionTruth,
    Download,
    EventType,
    ExternalJob,
    LedgerDocument,
    Limits,
    Observation,
    Source,
    StepTruth,
    TaskInfo,
    TaskRecord,
    derive,
    key_problem,
    note_problem,
)
from taskcard.producers.task_card.contract import (
    NotRegularFile,
    OutsideWorkdir,
    atomic_write,
    cannot_read,
    make_folder,
    open_lock,
    open_regular,
    quoted,
    shows_text,
)
from taskcard.producers.task_card.contract import cannot_write as contract_cannot_write
from taskcard.producers.task_card.tool_failure import (
    READ_FAILED,
    UNUSABLE_FILE,
    Coded,
    Names,
    Way,
)
from taskcard.producers.task_card.tool_failure import worded as worded_for
from taskcard.producers.task_card.workdir_arg import (
    WorkdirError,
    dangling_link,
    file_path_problem,
    given_path,
    shown_path,
)

DEFAULT_LEDGER: Final = Path(LEDGER_DIR) / LEDGER_FILE
MAX_LEDGER_BYTES: Final = 16_000_000
Clock = Callable[[], datetime]


class LedgerError(Coded):
    """Bad input or an unreadable ledger: the message names the field and the fix; `code`
    says which (`tool_failure`: `bad_envelope`, or `unusable_file` for the ledger's file)."""


class LedgerReadFailed(LedgerError):
    """The system failed a read of the ledger's file (an I/O error, no access): not the
    caller's input to mend, so the command line exits 1 for it, as for a failed write."""

    code = READ_FAILED


# The ledger's fields as each way in names them (`tool_failure.worded`): the store words its
# errors for the command line (`give --kind`, `see taskcard ledger init --help`) with the
# field first; `Ledger(..., way=...)` says them for the way it is used by.
_NAMES: Final = Names(
    options=frozenset(
        (
            *("purpose", "steps", "event_type", "step", "new_step", "note", "source"),
            *("artifacts", "kind", "reason", "safe_next_step", "failed", "reply", "job_id"),
            *("status", "provider", "evidence", "max_wait_sec", "name", "observed_bytes"),
            *("expected_bytes", "complete", "corrupt", "ledger", "workdir"),
            *(name for name in Limits.model_fields),
        )
    ),
    renamed={"observed_bytes": "bytes", "artifacts": "artifact"},
    references={
        "mcp": (
            (re.compile(r"`taskcard ledger(?: init)? --help`"), "the ledger tool's schema"),
            (
                re.compile(r"run `(?:taskcard )?ledger init`"),
                "call the ledger tool with command init",
            ),
        ),
        "python": (
            (re.compile(r"`taskcard ledger init --help`"), "help(Ledger.init)"),
            (re.compile(r"`taskcard ledger --help`"), "help(Ledger)"),
            (re.compile(r"run `(?:taskcard )?ledger init`"), "call Ledger.init"),
            (re.compile(r"`taskcard ledger init`"), "Ledger.init"),
            (re.compile(r"--ledger PATH"), "Ledger(PATH)"),
        ),
    },
)


def worded(message: str, way: Way) -> str:
    """A store's error (`LedgerError`) said as `way` names the ledger's fields and commands
    (`tool_failure.worded`): `--kind: ...` for the command line, `kind: ...` over MCP and in
    Python. Saying it again changes nothing."""
    return worded_for(message, way, _NAMES)


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _worded(method: _Method) -> _Method:
    """`method` with the `LedgerError`s it raises said for the ledger's way in (`worded`)."""

    @functools.wraps(method)
    def said_for_the_way_in(self: Ledger, /, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except LedgerError as exc:
            exc.args = (worded(str(exc), self.way),)
            raise

    return cast(_Method, said_for_the_way_in)


def cannot_write(exc: OSError) -> str:
    """What the system refused while the ledger was kept, in one line: the path it named,
    why (a file where the `ledger/` folder belongs, a folder without write access), and
    the fix."""
    return contract_cannot_write(exc.filename or "the ledger", exc)


def utc_now() -> datetime:
    return datetime.now(UTC)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"]) or "value"
    # A rule of the ledger's own (`note_problem`, a task's key) in its own words, without
    # pydantic's "Value error, " before them.
    cause = error.get("ctx", {}).get("error") if error["type"] == "value_error" else None
    return f"{field}: {cause if isinstance(cause, ValueError) else error['msg']}"


def _check_id(field: str, value: str) -> None:
    try:
        StepTruth(step_id=value)
    except ValidationError:
        raise LedgerError(
            f"{field}: {quoted(value)} is not a valid id; use 1-64 letters, digits, '_', '.', ':' "
            "or '-', starting with a letter or digit"
        ) from None


# The type each field of the ledger's commands takes. The Python API checks them itself: a
# text where a number belongs reached a comparison as a TypeError, `True` counted as 1 byte
# or 1 nudge, and a text given as `steps` became one step per character.
_TEXT_FIELDS: Final = ("note", "reason", "safe_next_step", "provider", "evidence")
_INT_FIELDS: Final = ("observed_bytes", "expected_bytes", "max_nudges", "max_retries")
_BOOL_FIELDS: Final = ("failed", "complete", "corrupt", "new_step")
_LIST_FIELDS: Final = ("steps", "artifacts")
# The checkpoints that record no step (their own record is a job, a download, a reply).
_STEPLESS: Final = ("EXTERNAL_OBSERVED", "DOWNLOAD_OBSERVED", "OWNER_REPLY_RECORDED")
# The checkpoints whose own fields say what was seen, and where to say it instead of a note.
_NOTELESS: Final = {
    "BLOCKED_CONFIRMED": "say what stops the task in --reason",
    "EXTERNAL_OBSERVED": "the job's --evidence says what was seen",
    "DOWNLOAD_OBSERVED": "the sizes and --complete or --corrupt say what was seen",
}
# Fields only some event types take: a checkpoint of that type passes them to its method.
EVENT_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "BLOCKED_CONFIRMED": ("kind", "reason", "safe_next_step", "failed"),
    "OWNER_REPLY_RECORDED": ("reply", "reason", "safe_next_step", "kind"),
    "EXTERNAL_OBSERVED": ("job_id", "status", "provider", "evidence", "max_wait_sec"),
    "DOWNLOAD_OBSERVED": ("name", "observed_bytes", "expected_bytes", "complete", "corrupt"),
}


def not_taken(event_type: str, given: Iterable[str]) -> str | None:
    """The refusal of the first of `given` (fields besides `step`, `note` and `new_step`)
    that a checkpoint of `event_type` does not take, else None: one wording for the store and
    the MCP tool (an option of another event type was "not taken by a STARTED checkpoint" from
    one and "not a field of checkpoint STARTED" from the other). The options as the command
    line spells them; `worded` says them as each way in names them."""
    takes = EVENT_FIELDS.get(event_type, ())
    stray = sorted(name for name in given if name not in takes)
    if not stray:
        return None
    common = [
        name
        for name in ("step", "note")
        if not (name == "note" and event_type in _NOTELESS)
        and not (name == "step" and event_type in _STEPLESS)
    ]
    options = ", ".join(_NAMES.option(name) for name in [*common, *takes])
    article = "an" if event_type[:1] in "AEIOU" else "a"
    return f"{stray[0]}: not taken by {article} {event_type} checkpoint; remove it" + (
        f" (it takes {options})" if options else ""
    )


def _number(value: float) -> str:
    """A number as a person typed it: `1000000000000` for 1e12 given as a float."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def limit_refused(name: str, value: float, fix: str) -> str:
    """The refusal of a limit of init (`Limits`) or `max_wait_sec` out of its range, in the
    ledger's words: the field, what it must be, the value given and `fix`. pydantic's own
    ("Input should be less than or equal to 315360000") followed the option and said neither
    the unit, the other bound nor what to do. The range is read from `Limits` itself;
    `max_wait_sec` keeps the range of `external_max_wait_sec`, the task's default for it."""
    rule = Limits.model_fields["external_max_wait_sec" if name == "max_wait_sec" else name]
    bounds = {
        kind: getattr(bound, kind)
        for bound in rule.metadata
        for kind in ("gt", "ge", "le")
        if getattr(bound, kind, None) is not None
    }
    high = bounds["le"]
    years = " (ten years)" if high == MAX_SECONDS else ""
    if rule.annotation is int:
        what = f"a whole number from {bounds.get('ge', 0)} to {high}"
    elif "gt" in bounds:
        what = f"a number of seconds above {_number(bounds['gt'])}, at most {_number(high)}{years}"
    else:
        what = f"a number of seconds from {_number(bounds.get('ge', 0))} to {_number(high)}{years}"
    return f"{name}: must be {what}, not {_number(value)}; {fix}"


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return repr(value)  # `2.5` for a whole number: "a number" said nothing wrong
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list | tuple) else type(value).__name__


def _check_types(**values: object) -> None:
    """Raise `LedgerError` naming the first given value of the wrong type (None: left out)."""
    for field, value in values.items():
        if value is None:
            continue
        if field in _TEXT_FIELDS and not isinstance(value, str):
            wanted = "text"
        elif field in _INT_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
            wanted = "a whole number"
        elif field in _BOOL_FIELDS and not isinstance(value, bool):
            wanted = "true or false"
        elif field in _LIST_FIELDS and not (
            isinstance(value, list) and all(isinstance(item, str) for item in value)
        ):
            wanted = "a list of text"
        elif field not in (*_TEXT_FIELDS, *_INT_FIELDS, *_BOOL_FIELDS, *_LIST_FIELDS) and (
            isinstance(value, bool) or not isinstance(value, int | float)
        ):
            wanted = "a number"  # the seconds of init's limits and max_wait_sec
        else:
            continue
        raise LedgerError(f"{field}: must be {wanted}, not {_type_name(value)}")


def _note(field: str, value: str | None) -> str | None:
    problem = None if value is None else note_problem(value)
    if problem is not None:
        raise LedgerError(f"{field}: {problem}")
    return value


def load_document(data: bytes, where: str) -> LedgerDocument:
    """The document; a task whose record does not validate is set aside in `broken` (the
    others are read as usual), and anything wrong outside one task is a `LedgerError`."""
    # A byte-order mark, as an editor may save a hand edit with: JSON readers (the service's
    # among them) take it, and every command here refused the whole file for it.
    data = data.removeprefix(codecs.BOM_UTF8)
    if not data.strip():
        return LedgerDocument()
    try:
        return LedgerDocument.model_validate_json(data)
    except ValidationError as exc:
        document = _set_broken_tasks_aside(data)
        if document is None:
            raise LedgerError(
                f"ledger {where} is not a valid ledger ({_first_error(exc)}); "
                "fix it or move it aside and run `taskcard ledger init` again",
                code=UNUSABLE_FILE,
            ) from None
        return document


_DECODER: Final = json.JSONDecoder()


def _skip(text: str, at: int) -> int:
    """The offset of the first character at or after `at` that is not JSON white space."""
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


def _members(text: str, start: int) -> tuple[dict[str, tuple[int, int]], int]:
    """The members of the JSON object at `start` of `text` (valid JSON, already checked):
    each key's value as (start, end) offsets into `text`, and the offset after the object.
    A key given twice keeps its last value, as a JSON reader does."""
    found: dict[str, tuple[int, int]] = {}
    at = _skip(text, start + 1)
    if text[at] == "}":
        return found, at + 1
    while True:
        key, at = _DECODER.raw_decode(text, at)
        at = _skip(text, at) + 1  # past the colon
        begin = _skip(text, at)
        _, end = _DECODER.raw_decode(text, begin)
        found[key] = (begin, end)
        at = _skip(text, end)
        if text[at] == "}":
            return found, at + 1
        at = _skip(text, at + 1)  # past ','


def _task_texts(data: bytes) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(the document's other members, each task's JSON text by id), or None when `data` is
    not a JSON object whose `tasks` is an object."""
    try:
        text = data.decode("utf-8")
        top = json.loads(text)
        if not isinstance(top, dict) or not isinstance(top.get("tasks"), dict):
            return None
        members, _ = _members(text, _skip(text, 0))
        begin, _ = members["tasks"]
        tasks, _ = _members(text, begin)
    except (ValueError, RecursionError, KeyError, IndexError):
        return None
    rest = {key: value for key, value in top.items() if key != "tasks"}
    return rest, {ident: text[begin:end] for ident, (begin, end) in tasks.items()}


def _shown_id(ident: str) -> str:
    return ident if SAFE_ID.fullmatch(ident) else quoted(ident)


def _set_broken_tasks_aside(data: bytes) -> LedgerDocument | None:
    """The document with each task that does not validate set aside, its text kept exactly
    as read; None when no task is broken or the rest of the document is wrong too."""
    found = _task_texts(data)
    if found is None:
        return None
    rest, texts = found
    good: dict[str, TaskRecord] = {}
    broken: dict[str, BrokenTask] = {}
    for ident, text in texts.items():
        try:
            record = TaskRecord.model_validate_json(text)
        except ValidationError as exc:
            broken[ident] = BrokenTask(text, f"tasks.{_shown_id(ident)}.{_first_error(exc)}")
            continue
        problem = key_problem(ident, record)
        if problem is None:
            good[ident] = record
        else:
            broken[ident] = BrokenTask(text, f"tasks.{_shown_id(ident)}.{problem}")
    if not broken:
        return None
    try:
        document = LedgerDocument.model_validate({**rest, "tasks": good})
    except ValidationError:
        return None
    document.broken.update(broken)
    return document


def dump_document(document: LedgerDocument) -> bytes:
    """The file's bytes for `document`, its broken tasks written back exactly as read."""
    if not document.broken:
        return document.model_dump_json(indent=2).encode("utf-8") + b"\n"
    data = document.model_dump(mode="json")
    marks = {ident: f"taskcard-broken-task-{uuid.uuid4().hex}" for ident in document.broken}
    for ident, mark in marks.items():
        data["tasks"][ident] = mark
    text = json.dumps(data, indent=2, ensure_ascii=False)
    for ident, mark in marks.items():
        text = text.replace(json.dumps(mark), document.broken[ident].text, 1)
    return text.encode("utf-8") + b"\n"


class Ledger:
    """One ledger file. All methods are safe to call from many processes at once."""

    def __init__(
        self,
        path: Path | str,
        *,
        clock: Clock = utc_now,
        inside: Path | None = None,
        way: Way = "python",
    ) -> None:
        """`way`: the way in the errors name the fix for: the Python parameters (this API),
        the command line's options (`cli`) or the MCP tool's fields (`mcp`)."""
        self.way: Way = way
        try:
            self.path = given_path(path, "the ledger's file path", folder=False)
        except WorkdirError as exc:
            raise LedgerError(f"ledger: {exc}") from None
        if not self.path.name or self.path.name in (".", ".."):
            raise LedgerError(
                f"ledger: {shown_path(path)} names a folder; give the ledger's file path"
            )
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        # The path as the errors show it: escaped when it holds a control, cut when too long.
        self.shown = shown_path(self.path)
        self._clock = clock
        self._inside = inside

    # ---------------------------------------------------------------------- reading

    @_worded
    def read(self) -> LedgerDocument:
        """The current document (empty when the file does not exist yet)."""
        try:
            handle = self._open()
            if handle is None:
                return LedgerDocument()
            with handle:
                data = handle.read(MAX_LEDGER_BYTES + 1)
        except OSError as exc:  # a file on the way (`_open`), or the read itself
            raise self._cannot_read(exc) from None
        if len(data) > MAX_LEDGER_BYTES:
            raise LedgerError(
                f"ledger {self.shown}: larger than {MAX_LEDGER_BYTES} bytes, the most a ledger"
                " may hold; move it aside and start a new one (`taskcard ledger init`), or keep"
                " long tasks in ledgers of their own (--ledger PATH)",
                code=UNUSABLE_FILE,
            )
        return load_document(data, self.shown)

    def _open(self) -> BinaryIO | None:
        """The ledger file opened for reading, None when it does not exist yet; `LedgerError`
        when its name cannot be a ledger (a folder, a named pipe, a link that leads nowhere
        or out of the workdir). A file on its way, where a folder belongs, raises
        `NotADirectoryError` for the caller to word."""
        try:
            return open_regular(self.path, inside=self._inside)
        except NotADirectoryError:
            raise
        except FileNotFoundError:
            # A link at the ledger's name (or a folder link) that leads nowhere: read as an
            # empty ledger, its task was "not in" it, and `init` wrote a file over the link.
            dangling = dangling_link(self.path)
            if dangling is not None:
                raise LedgerError(
                    f"ledger {self.shown} {dangling}; restore what it points to, or fix the link",
                    code=UNUSABLE_FILE,
                ) from None
            return None
        except OutsideWorkdir:
            raise self._outside() from None
        except OSError as exc:
            raise self._cannot_read(exc) from None

    def _path_problem(self) -> str | None:
        """`file_path_problem` of the ledger's path, its fix for a file on the way said for
        the way in: the MCP tool's ledger is the workdir's default, a path its caller cannot
        change ("give a path in a folder" told it to)."""
        if self.way == "mcp":
            return file_path_problem(self.path, in_a_folder="move that file aside")
        return file_path_problem(self.path)

    def _cannot_read(self, exc: OSError) -> LedgerError:
        """Why the ledger could not be read, naming the file, and what to do: the words of
        `--ledger` for a name that cannot be a ledger (`file_path_problem`: a link that leads
        nowhere or round a loop, a file on the way, a name too long), what is there and the
        fix for a file of another kind, else the system's words with the errno and the fix.
        The Python API and the MCP tool said "cannot read it (Not a directory)" and no more,
        while the command line, which looks at its option first, named the file on the way."""
        problem = self._path_problem()
        if problem is not None:
            return LedgerError(f"ledger {self.shown} {problem}", code=UNUSABLE_FILE)
        if isinstance(exc, NotRegularFile):  # its words say what is there and the fix
            return LedgerError(
                f"ledger {self.shown}: cannot read it ({exc.strerror})", code=UNUSABLE_FILE
            )
        # The system's failure, not the caller's input: `LedgerReadFailed` (exit 1).
        return LedgerReadFailed(f"ledger {self.shown}: {cannot_read(exc)}")

    @_worded
    def task(self, task_id: str) -> TaskRecord:
        return self.require(self.read(), task_id)

    @_worded
    def default_task_id(self) -> str:
        """The only task, else the newest one not completed, else the newest one."""
        document = self.read()
        if not document.tasks and document.broken:
            first = sorted(document.broken)[0]
            problem = self.broken_problem(document, first)
            raise LedgerError(f"task_id: {problem}", code=UNUSABLE_FILE)
        if not document.tasks:
            raise LedgerError(f"task_id: the ledger {self.shown} has no task; run `ledger init`")
        records = sorted(document.tasks.values(), key=lambda r: r.task.created_at)
        open_records = [r for r in records if r.derived.workflow != "COMPLETED"]
        return (open_records or records)[-1].task.task_id

    # ---------------------------------------------------------------------- writing

    @contextlib.contextmanager
    def locked(self) -> Iterator[LedgerDocument]:
        """The document under the exclusive lock; written back atomically if it changed."""
        # A name that can be no ledger (a folder, say) is refused before the lock beside it
        # and the folders above it are made: the refusal left a `.lock` file next to it. A
        # file where a folder on its way belongs is said by `_make_folder`.
        with contextlib.suppress(NotADirectoryError):
            handle = self._open()
            if handle is not None:
                handle.close()
        try:
            self._make_folder()
        except OutsideWorkdir:
            raise self._outside() from None
        try:
            fd = open_lock(self.lock_path, inside=self._inside)
        except OSError as exc:
            # The folder is inside (just checked): what leads out is a link at the lock's name.
            if exc.errno != errno.ELOOP and not isinstance(exc, NotRegularFile | OutsideWorkdir):
                raise
            raise LedgerError(
                f"ledger lock {shown_path(self.lock_path)}: a symlink or not a regular file;"
                " only taskcard creates it, so remove it (it is made again)",
                code=UNUSABLE_FILE,
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            document = self.read()
            before = document.model_dump_json()
            yield document
            if document.model_dump_json() != before:
                try:
                    self._make_folder()  # looked at again: swapped for a link meanwhile?
                except OutsideWorkdir:
                    raise self._outside() from None
                atomic_write(self.path, dump_document(document))
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def clock(self) -> datetime:
        return self._clock()

    def _make_folder(self) -> None:
        """The ledger's folder, made if missing. A name no ledger can have (a file where a
        folder on its way belongs, a link that leads nowhere) is refused in the words of
        `--ledger` and of a read (`file_path_problem`, `unusable_file`): a write said the
        system's "File exists" (`write_failed` over MCP, a bare `FileExistsError` from
        Python) where the command line and a read name the file in the way."""
        try:
            if self._inside is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            else:
                make_folder(self.path.parent, inside=self._inside)
        except OutsideWorkdir:
            raise
        except OSError:
            problem = self._path_problem()
            if problem is None:
                raise
            raise LedgerError(f"ledger {self.shown} {problem}", code=UNUSABLE_FILE) from None

    def _outside(self) -> LedgerError:
        return LedgerError(
            f"ledger {self.shown}: leads out of the workdir {shown_path(self._inside)} through"
            f" a symlink (the {shown_path(self.path.parent.name)}/ folder or the file); nothing"
            " is read or written there, so make it a real folder and file inside the workdir"
            " (remove the link)",
            code=UNUSABLE_FILE,
        )

    def broken_problem(self, document: LedgerDocument, task_id: str) -> str | None:
        """What is wrong with the record of `task_id` in the file, None when it is sound."""
        broken = document.broken.get(task_id)
        if broken is None:
            return None
        return (
            f"task {_shown_id(task_id)} in {self.shown} is broken ({broken.problem}); fix that "
            "field in the file, or delete the task's entry there (ledger commands leave it as "
            "it is; the file's other tasks work as before)"
        )

    @_worded
    def require(self, document: LedgerDocument, task_id: str) -> TaskRecord:
        broken = self.broken_problem(document, task_id)
        if broken is not None:
            raise LedgerError(f"task_id: {broken}", code=UNUSABLE_FILE)
        record = document.tasks.get(task_id)
        if record is None:
            known = ", ".join(sorted(document.tasks)) or "none"
            raise LedgerError(
                f"task_id: {quoted(task_id)} is not in {self.shown} (known: {known}); "
                "run `taskcard ledger init` first"
            )
        return record

    @_worded
    def init(
        self,
        task_id: str,
        purpose: str,
        steps: list[str] | None = None,
        **limits: float | int,
    ) -> TaskRecord:
        """Create a task. Creating an existing task is refused (its truth is never reset)."""
        _check_types(steps=steps, **limits)
        _check_id("task_id", task_id)
        if not isinstance(purpose, str) or not shows_text(purpose):
            raise LedgerError("purpose: say in one line what the task is for")
        _note("purpose", purpose)
        for step in steps or []:
            _check_id("steps", step)
        if len(set(steps or [])) != len(steps or []):
            raise LedgerError("steps: a step id appears twice; give each step its own id")
        try:
            checked = Limits.model_validate(limits)
        except ValidationError as exc:
            name = str(exc.errors()[0]["loc"][0])
            if name not in Limits.model_fields:  # a field init does not take
                raise LedgerError(
                    f"{_first_error(exc)}; see `taskcard ledger init --help`"
                ) from None
            default = Limits.model_fields[name].default
            raise LedgerError(
                limit_refused(
                    name,
                    limits[name],
                    f"give one in that range, or leave it out for the default, {_number(default)}",
                )
            ) from None
        try:
            info = TaskInfo(
                task_id=task_id,
                purpose=purpose,
                created_at=self._clock(),
                limits=checked,
                planned=bool(steps),
            )
        except ValidationError as exc:
            raise LedgerError(f"{_first_error(exc)}; see `taskcard ledger init --help`") from None
        with self.locked() as document:
            if task_id in document.tasks or task_id in document.broken:
                raise LedgerError(
                    f"task_id: {quoted(task_id)} already exists in {self.shown}; "
                    "choose another id (a task's truth is never reset)"
                )
            record = TaskRecord(task=info)
            record.observed.steps = [StepTruth(step_id=step) for step in steps or []]
            record.derived = derive(record.observed)
            document.tasks[task_id] = record
            return record.model_copy(deep=True)

    def _observe(
        self,
        task_id: str,
        event_type: EventType,
        source: Source,
        apply: Callable[[TaskRecord, datetime], bool | None],
        *,
        step: str | None = None,
        note: str | None = None,
        delta: bool = True,
    ) -> TaskRecord:
        """Record one observation and its truth for one task, then re-derive that task.
        A value the model refuses is bad input naming its field; nothing is written."""
        try:
            return self._observe_locked(
                task_id, event_type, source, apply, step=step, note=note, delta=delta
            )
        except ValidationError as exc:
            raise LedgerError(f"{_first_error(exc)}; see `taskcard ledger --help`") from None

    def _observe_locked(
        self,
        task_id: str,
        event_type: EventType,
        source: Source,
        apply: Callable[[TaskRecord, datetime], bool | None],
        *,
        step: str | None,
        note: str | None,
        delta: bool,
    ) -> TaskRecord:
        with self.locked() as document:
            record = self.require(document, task_id)
            now = self._clock()
            moved = apply(record, now) is not False
            if record.observations:
                record.next_seq = max(record.next_seq, record.observations[-1].seq + 1)
            record.observations.append(
                Observation(
                    seq=record.next_seq,
                    at=now,
                    event_type=event_type,
                    source=source,
                    step=step,
                    note=note,
                )
            )
            record.next_seq += 1
            overflow = len(record.observations) - MAX_OBSERVATIONS
            if overflow > 0:
                del record.observations[:overflow]
                record.observations_dropped += overflow
            observed = record.observed
            if delta and moved:  # also over a stamp ahead of this clock: this one is newer
                observed.last_delta_at = now
                observed.last_delta_source = event_type
            record.derived = derive(observed)
            return record.model_copy(deep=True)

    @classmethod
    def _step(cls, record: TaskRecord, step_id: str, *, new_step: bool = False) -> StepTruth:
        """The truth of `step_id`. A step the task does not have yet joins its plan at the end
        only when the task has no plan (`init` without steps) or `new_step` says it is meant:
        a mistyped id would otherwise become a step of its own, silently open for good."""
        known = cls._known_step(record, step_id, new_step=new_step)
        if known is not None:
            return known
        step = StepTruth(step_id=step_id)
        record.observed.steps.append(step)
        return step

    @staticmethod
    def _known_step(record: TaskRecord, step_id: str, *, new_step: bool) -> StepTruth | None:
        """The truth of `step_id`, None for a step the task may take on; `LedgerError` for
        one not in the task's plan, unless `new_step` says it is meant (see `_step`)."""
        steps = record.observed.steps
        for step in steps:
            if step.step_id == step_id:
                return step
        if record.task.planned and not new_step:
            known = [step.step_id for step in steps]
            close = difflib.get_close_matches(step_id, known, n=1, cutoff=0.6)
            hint = f"did you mean {quoted(close[0])}? " if close else ""
            raise LedgerError(
                f"step: {quoted(step_id)} is not a step of task {_shown_id(record.task.task_id)} "
                f"(its steps: {', '.join(known)}); {hint}give one of them, or add it to the "
                "plan with --new-step"
            )
        return None

    @staticmethod
    def _resolve_block_on(
        record: TaskRecord, step_id: str | None, at: datetime, by: EventType
    ) -> None:
        block = record.observed.block
        if block is not None and block.active and (step_id is None or block.step == step_id):
            block.resolved_at = at
            block.resolved_by = by

    @_worded
    def checkpoint(
        self,
        task_id: str,
        event_type: str,
        *,
        step: str | None = None,
        note: str | None = None,
        source: Source = "executor",
        artifacts: list[str] | None = None,
        new_step: bool = False,
        **fields: Any,
    ) -> TaskRecord:
        """Record one of the ten event types; the typed ones delegate to their own method.
        `new_step`: `step` may be one the task's plan does not have yet (it joins at the end)."""
        if event_type not in EVENT_TYPES:
            what = (
                "is required"
                if event_type is None
                else f"{quoted(event_type)} is not an event type"
            )
            raise LedgerError(f"event_type: {what}; use one of " + ", ".join(EVENT_TYPES))
        refused = not_taken(event_type, fields)
        if refused is not None:
            raise LedgerError(refused)
        _check_types(note=note, artifacts=artifacts, new_step=new_step)
        if (step is not None or new_step) and event_type in _STEPLESS:
            # Their methods record no step: a step given here was dropped unsaid.
            raise LedgerError(
                f"step: {event_type} checkpoints keep no step; remove --step and --new-step"
            )
        if artifacts and event_type != "TASK_COMPLETED":
            # Only the completion truth keeps artifacts; on any other event they were dropped
            # without a word while the command said it had recorded the checkpoint.
            raise LedgerError(
                f"artifacts: only a TASK_COMPLETED checkpoint records artifacts, not a "
                f"{event_type} one; remove --artifact, or say what was produced in --note"
            )
        if step is not None:
            _check_id("step", step)
        _note("note", note)
        if note and event_type in _NOTELESS:
            # Their own fields carry what was seen; a note given here was dropped while the
            # checkpoint was reported recorded.
            raise LedgerError(
                f"note: {event_type} checkpoints keep no note; remove --note "
                f"({_NOTELESS[event_type]})"
            )
        if event_type == "BLOCKED_CONFIRMED":
            return self.block(task_id, step=step, source=source, new_step=new_step, **fields)
        if event_type == "OWNER_REPLY_RECORDED":
            return self.owner_reply(task_id, note=note, **fields)
        if event_type == "EXTERNAL_OBSERVED":
            return self.external_job(task_id, **fields)
        if event_type == "DOWNLOAD_OBSERVED":
            return self.download_observed(task_id, **fields)
        if event_type in ("STEP_PROGRESS", "STEP_COMPLETED") and step is None:
            raise LedgerError(f"step: {event_type} needs --step STEP_ID (which step moved)")
        if event_type == "TASK_COMPLETED" and not shows_text(note or ""):
            raise LedgerError(
                "note: TASK_COMPLETED needs --note with the completion evidence "
                "(what was delivered and where)"
            )
        for artifact in artifacts or []:
            _note("artifacts", artifact)

        def apply(record: TaskRecord, now: datetime) -> None:
            observed = record.observed
            if step is not None and event_type not in ("STEP_PROGRESS", "STEP_COMPLETED"):
                # Only noted with the observation, but a mistyped step is refused here too.
                self._known_step(record, step, new_step=new_step)
            if event_type == "STARTED":
                observed.started_at = observed.started_at or now
            elif event_type == "STEP_PROGRESS":
                assert step is not None
                truth = self._step(record, step, new_step=new_step)
                truth.progress_at, truth.progress_note = now, note
                self._resolve_block_on(record, step, now, "STEP_PROGRESS")
            elif event_type == "STEP_COMPLETED":
                assert step is not None
                self._step(record, step, new_step=new_step).completed_at = now
                self._resolve_block_on(record, step, now, "STEP_COMPLETED")
            elif event_type == "TASK_COMPLETED":
                observed.task_completion = CompletionTruth(
                    completed_at=now, source=source, summary=note or "", artifacts=artifacts or []
                )
            elif event_type == "OWNER_RESUMED":
                observed.owner.resumed_at = now
                self._resolve_block_on(record, None, now, "OWNER_RESUMED")
            elif event_type == "HEARTBEAT":
                observed.executor_health.last_success_at = now

        return self._observe(task_id, event_type, source, apply, step=step, note=note)  # type: ignore[arg-type]

    @_worded
    def block(
        self,
        task_id: str,
        *,
        kind: str | None = None,
        reason: str | None = None,
        step: str | None = None,
        safe_next_step: str | None = None,
        failed: bool = False,
        source: Source = "executor",
        new_step: bool = False,
    ) -> TaskRecord:
        """A confirmed block: its kind (from the closed list) and reason are required."""
        _check_types(reason=reason, safe_next_step=safe_next_step, failed=failed, new_step=new_step)
        if kind not in FAILURE_KINDS:
            what = "is required" if kind is None else f"{quoted(kind)} is not a failure kind"
            raise LedgerError(f"kind: {what}; give --kind, one of " + ", ".join(FAILURE_KINDS))
        if not shows_text(reason or ""):
            raise LedgerError("reason: a block needs --reason saying what stops the task")
        if step is not None:
            _check_id("step", step)
        _note("reason", reason)
        _note("safe_next_step", safe_next_step)

        def apply(record: TaskRecord, now: datetime) -> None:
            if step is not None:
                truth = self._step(record, step, new_step=new_step)
                if failed:
                    truth.failed_at = now
            record.observed.block = BlockTruth(
                blocked_at=now,
                kind=kind,  # type: ignore[arg-type]
                reason=reason or "",
                source=source,
                step=step,
                safe_next_step=safe_next_step,
                failed=failed,
            )

        return self._observe(
            task_id, "BLOCKED_CONFIRMED", source, apply, step=step, note=reason, delta=False
        )

    @_worded
    def external_job(
        self,
        task_id: str,
        *,
        job_id: str | None = None,
        status: str | None = None,
        provider: str | None = None,
        evidence: str | None = None,
        max_wait_sec: float | None = None,
    ) -> TaskRecord:
        """What a provider says about a job. A status change is progress; a repeat is not."""
        _check_types(provider=provider, evidence=evidence, max_wait_sec=max_wait_sec)
        if job_id is None:
            raise LedgerError("job_id: give --job-id naming the external job")
        _check_id("job_id", job_id)
        statuses = ("submitted", "running", "succeeded", "failed", "cancelled")
        if status not in statuses:
            what = "is required" if status is None else f"{quoted(status)} is not a job status"
            raise LedgerError(f"status: {what}; give --status, one of {', '.join(statuses)}")
        _note("evidence", evidence)
        _note("provider", provider)
        for field, text, what in (
            ("evidence", evidence, "the provider's own id, URL or status line"),
            ("provider", provider, "who runs the job"),
        ):
            # Blank evidence is no evidence: a pending job must not pass on white space.
            if text is not None and not shows_text(text):
                raise LedgerError(
                    f"{field}: shows no text (only white space or invisible characters); give"
                    f" {what}, or leave it out"
                )
        if max_wait_sec is not None and not 0 < max_wait_sec <= MAX_SECONDS:
            raise LedgerError(
                limit_refused(
                    "max_wait_sec",
                    max_wait_sec,
                    "give the seconds the job may take, or leave it out for the task's limit"
                    " (--external-max-wait-sec, set at init)",
                )
            )

        def apply(record: TaskRecord, now: datetime) -> bool:
            jobs = record.observed.external_jobs
            existing = next((j for j in jobs if j.job_id == job_id), None)
            limit = max_wait_sec or (
                existing.max_wait_sec if existing else record.task.limits.external_max_wait_sec
            )
            if existing is None:
                jobs.append(
                    ExternalJob(
                        job_id=job_id,
                        provider=provider or "unknown",
                        status=status,  # type: ignore[arg-type]
                        evidence=evidence,
                        observed_at=now,
                        status_changed_at=now,
                        max_wait_sec=limit,
                    )
                )
                return True
            changed = existing.status != status
            if changed:
                existing.status_changed_at = now
            existing.status = status  # type: ignore[assignment]
            existing.observed_at = now
            existing.max_wait_sec = limit
            if provider:
                existing.provider = provider
            if evidence:
                existing.evidence = evidence
            return changed

        return self._observe(task_id, "EXTERNAL_OBSERVED", "external", apply, note=evidence)

    @_worded
    def download_observed(
        self,
        task_id: str,
        *,
        name: str | None = None,
        observed_bytes: int | None = None,
        expected_bytes: int | None = None,
        complete: bool = False,
        corrupt: bool = False,
    ) -> TaskRecord:
        """A download as seen on disk: a new size or state is progress."""
        _check_types(
            observed_bytes=observed_bytes,
            expected_bytes=expected_bytes,
            complete=complete,
            corrupt=corrupt,
        )
        if name is None:
            raise LedgerError("name: give --name naming the download")
        _check_id("name", name)
        if observed_bytes is None or observed_bytes < 0:
            raise LedgerError("observed_bytes: give --bytes with the size seen on disk (>= 0)")
        if expected_bytes is not None and expected_bytes < 0:
            raise LedgerError("expected_bytes: must be >= 0")
        for field, option, count in (
            ("observed_bytes", "--bytes", observed_bytes),
            ("expected_bytes", "--expected-bytes", expected_bytes),
        ):
            if count is not None and count > MAX_BYTES:
                # Said by its length past 20 digits: a 4,000-digit count was stored and shown.
                shown = str(count) if count < 10**20 else f"a number of {len(str(count))} digits"
                raise LedgerError(
                    f"{field}: {shown} is over the largest byte count a download may give"
                    f" ({MAX_BYTES}, a petabyte); give {option} the size in bytes"
                )

        def apply(record: TaskRecord, now: datetime) -> bool:
            before = next((d for d in record.observed.downloads if d.name == name), None)
            downloads = [d for d in record.observed.downloads if d.name != name]
            downloads.append(
                Download(
                    name=name,
                    observed_at=now,
                    observed_bytes=observed_bytes,
                    expected_bytes=expected_bytes,
                    complete=complete,
                    corrupt=corrupt,
                )
            )
            record.observed.downloads = downloads
            return before is None or (before.observed_bytes, before.complete, before.corrupt) != (
                observed_bytes,
                complete,
                corrupt,
            )

        return self._observe(task_id, "DOWNLOAD_OBSERVED", "external", apply, note=name)

    @_worded
    def owner_reply(
        self,
        task_id: str,
        *,
        reply: str | None = None,
        note: str | None = None,
        reason: str | None = None,
        safe_next_step: str | None = None,
        kind: str | None = None,
    ) -> TaskRecord:
        """The owner's answer to the monitor. B records a block and C a completion, each with
        the fields that make them truth; A counts as progress; D and E only record the reply
        (the monitor then asks for external evidence, or tells the agent to resume)."""
        _check_types(note=note, reason=reason, safe_next_step=safe_next_step)
        if reply not in OWNER_REPLIES:
            what = "is required" if reply is None else f"{quoted(reply)} is not a reply"
            raise LedgerError(
                f"reply: {what}; give --reply, one of "
                + "; ".join(f"{k} = {v}" for k, v in OWNER_REPLIES.items())
            )
        _note("note", note)
        if reply != "B":
            # Only a block records them: taken with another reply, they were dropped unsaid.
            for field, option, value in (
                ("reason", "--reason", reason),
                ("safe_next_step", "--safe-next-step", safe_next_step),
                ("kind", "--kind", kind),
            ):
                if value is not None:
                    raise LedgerError(
                        f"{field}: only reply B (blocked) takes {option}; remove it, or put"
                        f" what it says in --note (reply {reply} records the note)"
                    )
        if reply == "B":
            if not shows_text(reason or "") or not shows_text(safe_next_step or ""):
                raise LedgerError(
                    "reason: reply B needs --reason and --safe-next-step (why it is blocked "
                    "and what can safely be done next)"
                )
            self.block(
                task_id,
                kind=kind or "NEEDS_OWNER_DECISION",
                reason=reason,
                safe_next_step=safe_next_step,
                source="owner",
            )
        if reply == "C":
            if not shows_text(note or ""):
                raise LedgerError("note: reply C needs --note with the completion evidence")
            self.checkpoint(task_id, "TASK_COMPLETED", note=note, source="owner")

        def apply(record: TaskRecord, now: datetime) -> None:
            owner = record.observed.owner
            owner.reply, owner.reply_at, owner.note = reply, now, note  # type: ignore[assignment]

        return self._observe(
            task_id, "OWNER_REPLY_RECORDED", "owner", apply, note=note, delta=reply == "A"
        )

    @_worded
    def heartbeat(self, task_id: str, note: str | None = None) -> TaskRecord:
        return self.checkpoint(task_id, "HEARTBEAT", note=note)
