"""`<child>/lineage.json`: who created this agent, why, with which provider, how deep.

`{"parent": agent id, "reason": str, "provider": str | null, "depth": int, "created_at":
ISO-8601 UTC}`, replaced atomically (it survives restarts: it is a file). The reason is the
one field nothing can derive, so it is required and must say something. The depth is the
parent's depth plus one when the parent's workdir is known (a parent without lineage is a
root, depth 0), else 1; a spawn deeper than the cap (default 3) is refused, and so is a
parent whose own lineage file is broken, since that would let a chain escape the cap.
When the parent's workdir is known, a child's workdir that is the parent's or a folder above
it (compared resolved, through `..` and symbolic links) is refused: the two agents would
share files and the lineage would loop. A child inside the parent's workdir or beside it is
fine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from taskcard.producers.reports.store import encodable
from taskcard.producers.task_card.contract import (
    atomic_write,
    quoted,
    read_regular,
    shows_text,
    utc_now_iso,
)
from taskcard.producers.task_card.workdir_arg import WorkdirError, given_path

LINEAGE_FILE: Final = "lineage.json"
DEFAULT_MAX_DEPTH: Final = 3
MAX_DEPTH_LIMIT: Final = 32
MAX_REASON_CHARS: Final = 1000
MAX_FILE_BYTES: Final = 16 * 1024
AGENT_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# The pattern in words, for every message that refuses an id.
AGENT_ID_RULE: Final = "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
PROVIDER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/ -]{0,63}")


class LineageError(ValueError):
    """A spawn that cannot be recorded; the text names the field and the fix."""


def _folder(value: object, field: str, what: str = "the agent's working directory") -> Path:
    """`value` as a folder name (`given_path`), or `LineageError` naming `field`."""
    try:
        return given_path(value, what)
    except WorkdirError as exc:
        raise LineageError(f"{field}: {exc}") from None


def read_lineage(workdir: Path) -> dict[str, Any] | None:
    """The workdir's lineage record, None when it has none; `LineageError` when broken."""
    path = _folder(workdir, "workdir") / LINEAGE_FILE
    try:
        # Never a plain open: a named pipe there blocked the spawn, /dev/zero filled memory.
        raw = read_regular(path, MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LineageError(f"{path}: cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise LineageError(
            f"{path}: over {MAX_FILE_BYTES} bytes, not a lineage record; fix or remove it"
        )
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    depth = data.get("depth") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or not isinstance(depth, int)
        or isinstance(depth, bool)
        or not 1 <= depth <= MAX_DEPTH_LIMIT
    ):
        raise LineageError(
            f"{path}: not a lineage record with a depth of 1..{MAX_DEPTH_LIMIT}; "
            "fix or remove it (then the agent counts as a root)"
        )
    return data


def spawn(
    child: Path,
    *,
    parent: str,
    reason: str,
    provider: str | None = None,
    parent_workdir: Path | None = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
    clock: Callable[[], str] = utc_now_iso,
) -> dict[str, Any]:
    """Write `<child>/lineage.json` and return the record; raises `LineageError`."""
    if not isinstance(parent, str) or not AGENT_ID.fullmatch(parent):
        raise LineageError(f"parent: the parent's agent id, {AGENT_ID_RULE}")
    if not isinstance(reason, str) or not shows_text(reason):
        raise LineageError(
            "reason: required, and it must show text (not only white space or invisible"
            " characters such as zero-width spaces); say why this agent is created"
        )
    if "\0" in reason:
        raise LineageError("reason: contains a NUL character; remove it")
    if not encodable(reason):
        raise LineageError(
            "reason: holds bytes that are not UTF-8 (undecodable input); pass UTF-8 text"
        )
    if len(reason) > MAX_REASON_CHARS:
        raise LineageError(f"reason: at most {MAX_REASON_CHARS} characters; say it shorter")
    if provider is not None and not (isinstance(provider, str) and PROVIDER.fullmatch(provider)):
        raise LineageError("provider: 1-64 letters, digits, spaces or _.:/-, e.g. claude-code")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int):
        raise LineageError("max_depth: must be a whole number")
    if not 1 <= max_depth <= MAX_DEPTH_LIMIT:
        raise LineageError(f"max_depth: must be 1..{MAX_DEPTH_LIMIT}")
    child = _folder(child, "workdir", "the child's working directory")
    try:
        usable = child.is_dir()
    except OSError as exc:  # a name too long for the system, a folder not searchable
        raise LineageError(
            f"workdir: {quoted(str(child))} cannot be used ({exc.strerror}); give the child's"
            " working directory"
        ) from None
    if not usable:
        raise LineageError(
            f"workdir: {quoted(str(child))} is not a directory; create the child's first"
        )
    try:
        recorded = read_lineage(child)
    except LineageError:
        recorded = None  # a broken record is replaced, as a missing one is written
    if recorded is not None and recorded["parent"] != parent:
        # Who created whom survives restarts: a second spawn naming another parent would
        # rewrite that history, and could close a loop between two folders side by side
        # (b spawned by a, then a "spawned" by b). A retry naming the same parent is fine.
        raise LineageError(
            f"workdir: {quoted(str(child))} is already recorded as a child of"
            f" {quoted(str(recorded['parent']))}; an agent is spawned once: give the new"
            " child a folder of its own (or remove its lineage.json first if the folder now"
            " holds a new agent)"
        )
    depth = 1
    if parent_workdir is not None:
        parent_workdir = _folder(parent_workdir, "parent_workdir", "the parent's working directory")
        if not parent_workdir.is_dir():
            raise LineageError(
                f"parent_workdir: {quoted(str(parent_workdir))} is not a directory; give the"
                " parent's working directory, or leave it out"
            )
        parent_at, child_at = parent_workdir.resolve(), child.resolve()
        if parent_at == child_at:
            raise LineageError(
                "parent_workdir: is the child's own workdir; an agent is not its own parent"
            )
        if parent_at.is_relative_to(child_at):
            # Compared resolved, so `..` and symbolic links cannot hide it: the child's
            # folder would hold the parent's files, and the parent would sit in its
            # child's tree.
            raise LineageError(
                f"workdir: {quoted(str(child))} holds the parent's workdir"
                f" ({quoted(str(parent_at))}); a child's workdir is never its parent's"
                " folder or one above it: give the child a folder of its own (inside the"
                " parent's workdir or beside it)"
            )
        record = read_lineage(Path(parent_workdir))
        depth = 1 if record is None else int(record["depth"]) + 1
    if depth > max_depth:
        raise LineageError(
            f"depth: this spawn would be depth {depth}, over the cap of {max_depth}; "
            "do the work in this agent, or ask a person to raise the cap (max_depth)"
        )
    record = {
        "parent": parent,
        "reason": reason.strip(),
        "provider": provider,
        "depth": depth,
        "created_at": clock(),
    }
    atomic_write(child / LINEAGE_FILE, json.dumps(record, ensure_ascii=False).encode())
    return record
