"""A workdir as a person or a client names it: one reading for every agent-side command.

`taskcard card|tool|host|mcp`, `ledger`, `report`, `reports`, `spawn`, `inbox`, `activity`,
`hook`, `init` and the MCP tools that take a folder all read the name here, so they agree:
`~` is expanded (an MCP client's config passes `~/agent` verbatim; no shell expands it), a
relative name starts at a given base (the current folder for a command line, the server's
workdir for an MCP tool), and an empty name is refused instead of silently meaning `.`,
which put reports, ledgers and activity into whatever folder the command ran in.

The Python API (`TaskCard`, `Reports`, `spawn`, `read_lineage`, `Ledger`, the inbox's
`peek` and `claim_all`) takes the folder as an object, not as text to expand: `given_path`
holds it to the same rule (no empty name, no NUL, text or a path object only).
"""

from __future__ import annotations

import argparse
import errno
import os
from pathlib import Path
from typing import Final

from taskcard.producers.task_card.contract import (
    LOOP_OF_LINKS,
    expand_home,
    file_on_path,
    link_loop,
    quoted,
)

# `PATH_MAX`, `shown_path` and `dangling_link` live in the contract, where the service's
# notes use them too; the commands read them from here as before.
from taskcard.producers.task_card.contract import PATH_MAX as PATH_MAX
from taskcard.producers.task_card.contract import dangling_link as dangling_link
from taskcard.producers.task_card.contract import shown_path as shown_path

# The fix named by every refusal of a `--workdir` that is no (usable) directory.
WORKDIR_FIX: Final = "pass the agent's working directory"


class WorkdirError(ValueError):
    """A folder name that cannot be used; the text says why, the caller names the field."""


def expand_workdir(text: str, base: Path | None = None) -> Path:
    """`text` with `~` expanded, relative to `base` (default: the current folder), resolved.

    Whether the folder exists is the caller's question: a child's workdir, a hook's target
    and a card's workdir each answer it with their own message.
    """
    if not text.strip():
        raise WorkdirError("is empty; give the agent's working directory (for this one: .)")
    path = expand_home(text)
    if path is None:
        raise WorkdirError(f"{text!r} cannot be expanded (no such user); give the full path")
    try:
        full = (base if base is not None else Path.cwd()) / path
        return full.resolve()
    except RuntimeError:  # a loop of symbolic links: "cannot be expanded" named no loop
        raise WorkdirError(
            f"{shown_path(text)} {link_loop(full) or LOOP_OF_LINKS}; fix the links, or give"
            " the folder itself"
        ) from None
    except (ValueError, OSError):  # a NUL byte; a current folder that was deleted
        raise WorkdirError(f"{text!r} is not a usable path; give the full path") from None


def given_path(
    value: object, what: str = "the agent's working directory", *, folder: bool = True
) -> Path:
    """`value` as a `Path`, when it is text or a path object that names something: an empty
    name (which `Path("")` reads as the current folder), one of white space only, one with a
    NUL byte and any other type raise `WorkdirError`, whose text says to give `what` (a
    `folder`, or a file). Not expanded or resolved; whether it exists is the caller's
    question."""
    name = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(name, str):
        raise WorkdirError(f"must be text or a path, not {type(value).__name__}; give {what}")
    if not name.strip():
        here = " (for the current folder: .)" if folder else ""
        raise WorkdirError(f"is empty; give {what}{here}")
    if "\0" in name:
        raise WorkdirError(f"{quoted(name)} contains a NUL character; give {what} without it")
    return Path(name)


def workdir_arg(text: str) -> Path:
    """`expand_workdir` as an argparse `type=`: a bad name is a usage error (exit 2) that
    argparse prefixes with the option's name."""
    try:
        return expand_workdir(text)
    except WorkdirError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def existing_workdir_arg(text: str) -> Path:
    """`workdir_arg` for commands that only read or add to a workdir: it must already be a
    directory (a mistyped name used to create a folder tree, or to be looked at as empty).
    Every agent-side command checks its `--workdir` so, as a usage error of one shape:
    `taskcard COMMAND: argument --workdir: DIR is not a directory; pass the agent's working
    directory; see ...`."""
    path = workdir_arg(text)
    try:
        found = path.is_dir()
    except OSError as exc:  # a name too long to open: it was a traceback
        raise argparse.ArgumentTypeError(
            f"{shown_path(text)} cannot be used ({exc.strerror}); {WORKDIR_FIX}"
        ) from None
    if not found:
        raise argparse.ArgumentTypeError(
            f"{shown_path(text)} {not_a_directory(text)}; {WORKDIR_FIX}"
        )
    return path


def not_a_directory(text: str) -> str:
    """Why the folder name `text` (one that names no directory) names none, after the name:
    "is not a directory", or the symbolic link that leads nowhere or round a loop on it and
    where it points (`dangling_link`, `link_loop`). Resolved, the name had followed the link,
    and "is not a directory" about a name `ls` shows as one sent the user looking at the
    wrong end of the link."""
    path = Path(text).expanduser()
    lead = "is not a directory: "
    return dangling_link(path, lead) or link_loop(path, lead) or "is not a directory"


def file_path_problem(path: Path, *, in_a_folder: str = "give a path in a folder") -> str | None:
    """Why `path` cannot name a file to read or create, in words after the name, or None when
    it can (it is a file, or nothing is there yet under a folder that is one). For options that
    name a file (`ledger --ledger`): a dangling link was read as "no such file" and written
    through, a link loop and a file on the way came out as the system's bare words, exit 1.
    `in_a_folder`: the fix for a file on the way, for a path nobody typed (a default)."""
    dangling = dangling_link(path, "cannot be reached: ")
    if dangling is not None:
        return dangling + "; restore what it points to, or fix the link"
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            loop = link_loop(path, "cannot be reached: ") or LOOP_OF_LINKS
            return f"{loop}; fix the links, or give the file itself"
        if exc.errno == errno.ENOTDIR:
            on_way = file_on_path(path)
            where = "" if on_way is None else f" ({shown_path(on_way)} is a file)"
            return f"goes through a file as if it were a folder{where}; {in_a_folder}"
        if exc.errno == errno.ENAMETOOLONG:
            return f"cannot be used ({exc.strerror}); give a shorter path"
    return None


def writable_workdir_arg(text: str) -> Path:
    """`existing_workdir_arg` for `taskcard mcp`, whose tools write into the workdir: a
    folder this user may not write is refused before the handshake, in the same shape (a
    client would otherwise list tools that all fail)."""
    path = existing_workdir_arg(text)
    if not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"{shown_path(text)} is not a writable directory; {WORKDIR_FIX}"
        )
    return path
