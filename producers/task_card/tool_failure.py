"""The failed result of every tool `taskcard mcp` offers, and the codes it carries.

A failed result is `{"status": "failed", "code": CODE, "message": MESSAGE}`: the message says,
for people, what is wrong (naming the field or the file) and the fix; the code says, for a
program, what kind of failure it is. The tools share one vocabulary, each code meaning the
same failure whichever tool answers it (`TOOL_CODES`); `task_card` adds its own codes for its
watch (docs/producer.md). Before this module the ledger, report, reports, spawn and inbox
tools answered a message alone, and each built that dict in its own copy.

The errors the tools' Python APIs raise (`LedgerError`, `ReportError`, `LineageError`) carry
the code of their failure (`Coded`), so a tool answers it without reading the words.

Those errors are written once and said for each way in by `worded`: a message starts with
the field at fault (`max_depth: must be 1..32`) and names in its fix the options as the command
line spells them (`give --bytes`). The command line says the field as its option
(`--max-depth: ...`); MCP keeps the field and says each option as its field (`observed_bytes`);
Python says each as its parameter (`observed_bytes=`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

# An argument of the call is wrong (missing, of the wrong type, out of range, not a field of
# the tool, or a value its rules refuse): the message starts with the field's name. The code
# a `task_card` envelope the host's schema refuses gets, whichever way it was caught.
BAD_ARGUMENTS: Final = "bad_envelope"
# A file or folder of the workdir the tool uses is not usable as it stands: a symbolic link
# leads nowhere, round a loop or out of the workdir, something else stands where it belongs,
# or its content is broken or too large. The message names it and the fix, which is the file.
UNUSABLE_FILE: Final = "unusable_file"
# The system failed or refused a read (an I/O error, no access): nothing is wrong with the
# name or the call; the message gives the system's words.
READ_FAILED: Final = "read_failed"
# The system failed or refused a write (no access, a file where a folder belongs, a full or
# read-only disk); nothing was recorded. The code `task_card` gives a card it cannot write.
WRITE_FAILED: Final = "write_failed"
# The server's workdir was deleted while it ran: nothing was written, nor created again.
WORKDIR_GONE: Final = "workdir_gone"
# The call named a tool the server does not have.
UNKNOWN_TOOL: Final = "unknown_tool"
# `task_card` only: no task card host could be reached or started for the workdir.
HOST_UNAVAILABLE: Final = "host_unavailable"
# `task_card` only: another process holds the workdir and takes no call from us (a host under
# another runtime folder, a program's own `TaskCard`, a host that does not answer); the
# command line's exit 3. It was `host_unavailable` (or, after a minute, a timeout's words).
WORKDIR_HELD: Final = "workdir_held"
# The codes only `task_card` answers: the other tools' schemas leave them out.
TASK_CARD_ONLY: Final = frozenset({HOST_UNAVAILABLE, WORKDIR_HELD})

TOOL_CODES: Final[dict[str, str]] = {
    BAD_ARGUMENTS: "an argument is wrong; the message names the field and the fix",
    UNUSABLE_FILE: "a file or folder of the workdir is not usable as it stands; the message"
    " names it and the fix",
    READ_FAILED: "the system failed or refused a read; the message names the file",
    WRITE_FAILED: "the system failed or refused a write; nothing was recorded",
    WORKDIR_GONE: "the server's workdir was deleted while it ran",
    UNKNOWN_TOOL: "no tool of that name",
    HOST_UNAVAILABLE: "task_card only: no task card host could be reached or started",
    WORKDIR_HELD: "task_card only: another process holds the workdir and takes no call from"
    " here; the message names its pid and program and the fix",
}


def failed(code: str, message: str) -> dict[str, Any]:
    """The result of a failed tool call: the shape every tool's failure has."""
    return {"status": "failed", "code": code, "message": message}


class Coded(ValueError):
    """An error of a tool's Python API that knows its tool code: `BAD_ARGUMENTS` unless
    raised with another (`code=UNUSABLE_FILE` for a file of the workdir in the way)."""

    code: str = BAD_ARGUMENTS

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


# The way in an error is said for: the command line, an MCP tool or the Python API.
Way = Literal["cli", "mcp", "python"]
# The field a message starts with: `max_depth: ...`, before anything else.
_LEADING_FIELD: Final = re.compile(r"^([a-z][a-z_]*)(?=: )")
# An option as a message writes one in its fix: after a space or a bracket, never inside a
# quoted path or id; with its placeholder when it has one (`--ledger PATH`).
_OPTION: Final = re.compile(r"(?<=[ (])--([a-z][a-z-]*)(?: [A-Z_]+)?")


@dataclass(frozen=True)
class Names:
    """What one tool's fields are called on each way in.

    `options`: the fields that are options of its commands (`--` and `-` for `_`, but as
    `renamed` says: `observed_bytes` is `--bytes`); a leading field among them is said as
    its option on the command line. `mcp` and `python`: a field called otherwise there (the
    child's `workdir` is MCP's `child_workdir`). `references`: a command line phrase and what
    it is on the other ways (`` `taskcard ledger --help` `` is "the ledger tool's schema")."""

    options: frozenset[str]
    renamed: Mapping[str, str] = field(default_factory=dict)
    mcp: Mapping[str, str] = field(default_factory=dict)
    python: Mapping[str, str] = field(default_factory=dict)
    references: Mapping[Way, tuple[tuple[re.Pattern[str], str], ...]] = field(default_factory=dict)

    def option(self, name: str) -> str:
        """The field's option as a person types it: `--bytes` for `observed_bytes`."""
        return "--" + self.renamed.get(name, name.replace("_", "-"))

    def field_of(self, option: str) -> str:
        """The field an option (`bytes`, without `--`) sets."""
        fields = {spelt: name for name, spelt in self.renamed.items()}
        return fields.get(option, option.replace("-", "_"))


def worded(message: str, way: Way, names: Names) -> str:
    """A tool's error (written with its field first and the command line's options in the
    fix) said as `way` names them: the leading field as its option on the command line, each
    option as its field over MCP, as a keyword argument (`step=`) in Python. Saying it again
    changes nothing."""
    for pattern, words in names.references.get(way, ()):
        message = pattern.sub(words, message)
    if way == "cli":
        return _LEADING_FIELD.sub(
            lambda found: names.option(found[1]) if found[1] in names.options else found[1],
            message,
            count=1,
        )
    ours = names.mcp if way == "mcp" else names.python
    after = "=" if way == "python" else ""
    message = _OPTION.sub(
        lambda found: ours.get(names.field_of(found[1]), names.field_of(found[1])) + after,
        message,
    )
    return _LEADING_FIELD.sub(lambda found: ours.get(found[1], found[1]), message, count=1)
