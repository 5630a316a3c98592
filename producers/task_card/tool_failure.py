"""The failed result of every tool `taskcard mcp` offers, and the codes it carries.

A failed result is `{"status": "failed", "code": CODE, "message": MESSAGE}`: the message says,
for people, what is wrong (naming the field or the file) and the fix; the code says, for a
program, what kind of failure it is. The tools share one vocabulary, each code meaning the
same failure whichever tool answers it (`TOOL_CODES`); `task_card` adds its own codes for its
watch (docs/producer.md). Before this module the ledger, report, reports, spawn and inbox
tools answered a message alone, and each built that dict in its own copy.

The errors the tools' Python APIs raise (`LedgerError`, `ReportError`, `LineageError`) carry
the code of their failure (`Coded`), so a tool answers it without reading the words.
"""

from __future__ import annotations

from typing import Any, Final

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

TOOL_CODES: Final[dict[str, str]] = {
    BAD_ARGUMENTS: "an argument is wrong; the message names the field and the fix",
    UNUSABLE_FILE: "a file or folder of the workdir is not usable as it stands; the message"
    " names it and the fix",
    READ_FAILED: "the system failed or refused a read; the message names the file",
    WRITE_FAILED: "the system failed or refused a write; nothing was recorded",
    WORKDIR_GONE: "the server's workdir was deleted while it ran",
    UNKNOWN_TOOL: "no tool of that name",
    HOST_UNAVAILABLE: "task_card only: no task card host could be reached or started",
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
