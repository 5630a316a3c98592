"""`<child>/lineage.json`: who created this agent, why, with which provider, how deep.

`{"parent": agent id, "parent_workdir": absolute path | null, "reason": str, "provider": str |
null, "depth": int, "created_at": ISO-8601 UTC}`, replaced atomically (it survives restarts:
it is a file). The reason is the one field nothing can derive, so it is required and must say
something. The depth is the parent's depth plus one when the parent's workdir is known (a
parent without lineage is a root, depth 0), else 1; a spawn deeper than the cap (default 3)
is refused, and so is a parent whose own lineage file is broken, since that would let a chain
escape the cap.

When the parent's workdir is known, it is recorded (resolved) as `parent_workdir`: ids name
no folders, so the folders are what lets a later spawn walk the chain above its parent. Every
folder comparison is by the folder itself (device and inode, after resolving `..` and
symbolic links), so a link, a bind mount or another spelling of a name on a case-insensitive
file system cannot hide a folder. Refused, naming the child's `workdir`:

- the parent's own folder, or one above it: the two agents would share files;
- a folder inside one of the parent's contract folders (`inbox/`, `reports/`, `taskcard/`,
  `ledger/`, `logs/`, `.notification/`): the parent's files and the service's writes live
  there;
- a folder the chain above the parent reaches through the recorded `parent_workdir`s: it
  would become its own ancestor (b spawned by a, then a "spawned" by b; or a -> b -> c ->
  a). A record without `parent_workdir` (a spawn that did not name the parent's folder) ends
  the walk: nothing above it is known, for this check as for the depth.

A child inside the parent's workdir (outside its contract folders) or beside it is fine,
whatever its name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from taskcard.producers.reports.contract import CONTRACT_DIRS
from taskcard.producers.reports.store import encodable
from taskcard.producers.task_card.contract import (
    LOOP_OF_LINKS,
    NotRegularFile,
    atomic_write,
    cannot_write,
    dangling_link,
    iso_utc,
    json_kind,
    link_loop,
    parse_iso,
    quoted,
    read_regular,
    shows_text,
    utc_now_iso,
)
from taskcard.producers.task_card.tool_failure import (
    READ_FAILED,
    UNUSABLE_FILE,
    WRITE_FAILED,
    Coded,
    Names,
    Way,
    worded,
)
from taskcard.producers.task_card.workdir_arg import (
    PATH_MAX,
    WorkdirError,
    given_path,
    not_a_directory,
)

LINEAGE_FILE: Final = "lineage.json"
PARENT_WORKDIR: Final = "parent_workdir"
DEFAULT_MAX_DEPTH: Final = 3
MAX_DEPTH_LIMIT: Final = 32
MAX_REASON_CHARS: Final = 1000
MAX_FILE_BYTES: Final = 16 * 1024
# How many folders the loop check walks up the recorded parent folders before it gives up
# and refuses: far more than any chain of spawns under the depth cap.
MAX_WALK: Final = 1024
AGENT_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# The pattern in words, for every message that refuses an id.
AGENT_ID_RULE: Final = "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
PROVIDER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/ -]{0,63}")
# A folder's identity: the same folder under any name (a link, `..`, a bind mount, another
# case on a case-insensitive file system) has the same one.
_Identity = tuple[int, int]
# `spawn`'s fields as each way in names them (`tool_failure.worded`): its errors start with
# the field and name the options as `taskcard spawn` spells them; the child's folder is
# `--workdir` there, the MCP tool's `child_workdir`, and `spawn()`'s first parameter, `child`
# (a refusal names what the caller typed: "workdir:" sent a Python caller looking for a
# parameter `spawn` does not have).
_NAMES: Final = Names(
    options=frozenset(("workdir", "parent", "reason", "provider", PARENT_WORKDIR, "max_depth")),
    mcp={"workdir": "child_workdir"},
    python={"workdir": "child"},
)


class LineageError(Coded):
    """A spawn that cannot be recorded; the text names the field and the fix."""


class LineageWriteFailed(LineageError, OSError):
    """The system refused to write the child's `lineage.json` (`code` `write_failed`): the
    text names the field, the file, why and the fix, as every refusal of `spawn` does. An
    `OSError` too, with the system's `errno`: it was a bare `OSError` before, and a caller's
    `except OSError` still catches it."""

    def __init__(self, message: str, exc: OSError) -> None:
        super().__init__(message, code=WRITE_FAILED)
        # Only the number: with `strerror` or `filename` set, `str()` would be the system's
        # words instead of this message.
        self.errno = exc.errno


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
        # A link at lineage.json (or a folder link on its way) that leads nowhere is a
        # broken record, as a loop of links is: read as none, a parent's chain lost its
        # depth and the spawn under it escaped the cap.
        dangling = dangling_link(path, "cannot be read: ")
        if dangling is None:
            return None
        raise LineageError(
            f"{path} {dangling}; restore what it points to, or remove the link (then the"
            " agent counts as a root)",
            code=UNUSABLE_FILE,
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            # The link round the loop, named in the words of every reader (`link_loop`):
            # "cannot be read (Too many levels of symbolic links)" named none.
            loop = link_loop(path, "cannot be read: ") or LOOP_OF_LINKS
            raise LineageError(
                f"{path} {loop}; fix the links",
                code=UNUSABLE_FILE,
            ) from None
        # Something else than a regular file there is the file's own problem (its words say
        # what and the fix); any other failure is the system's.
        code = UNUSABLE_FILE if isinstance(exc, NotRegularFile) else READ_FAILED
        raise LineageError(f"{path}: cannot be read ({exc.strerror})", code=code) from None
    if len(raw) > MAX_FILE_BYTES:
        raise LineageError(
            f"{path}: over {MAX_FILE_BYTES} bytes, not a lineage record; fix or remove it",
            code=UNUSABLE_FILE,
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
            "fix or remove it (then the agent counts as a root)",
            code=UNUSABLE_FILE,
        )
    return data


def _named(path: Path | str) -> str:
    """A folder as the checks below quote it: whole up to the longest path the system opens
    (a path cut in the middle names no folder), `quoted` past that."""
    text = str(path)
    return repr(text) if len(text) <= PATH_MAX else quoted(text)


def _identity(path: Path) -> _Identity | None:
    """The folder's (device, inode), following links; None when it cannot be reached."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def _within(inner: Path, outer: set[_Identity]) -> tuple[Path, _Identity] | None:
    """The first folder from resolved `inner` up to `/` that is one of `outer` (with its
    identity), else None.

    Walked by identity, not by text: on a case-insensitive file system `/T/Planner` is
    `/t/planner` without being spelt like it, and a bind mount shows one folder twice."""
    for folder in (inner, *inner.parents):
        ident = _identity(folder)
        if ident is not None and ident in outer:
            return folder, ident
    return None


def _recorded_parent_folder(workdir: Path) -> Path | None:
    """The `parent_workdir` the workdir's lineage record names, None when it names none.

    Total: a missing, broken or odd record (a named pipe, a relative path) names none."""
    try:
        data = json.loads(read_regular(workdir / LINEAGE_FILE, MAX_FILE_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None
    folder = data.get(PARENT_WORKDIR) if isinstance(data, dict) else None
    if not isinstance(folder, str) or not os.path.isabs(folder):
        return None
    return Path(folder)


def _recorded_identity(record: dict[str, Any]) -> _Identity | None:
    """The identity of the parent's folder a lineage record names, when it still exists."""
    before = record.get(PARENT_WORKDIR)
    return _identity(Path(before)) if isinstance(before, str) and os.path.isabs(before) else None


def _loop_through(parent_at: Path, child_id: _Identity) -> list[Path] | None:
    """The chain of folders from the parent up to the child, when the recorded
    `parent_workdir`s lead there (the child would be its own ancestor), else None.

    The walk ends at a record without a folder, at a folder seen before (a loop written by
    hand among other folders) and at a folder that is gone. Spawns keep a chain short (the
    depth cap; a root adopted later adds its own chain), so past `MAX_WALK` folders the
    records were written by hand: refused, rather than taken as no loop unseen."""
    chain, folder = [parent_at], parent_at
    seen = {_identity(parent_at)}
    while len(chain) <= MAX_WALK:
        above = _recorded_parent_folder(folder)
        ident = None if above is None else _identity(above)
        if above is None or ident is None or ident in seen:
            return None
        chain.append(above)
        if ident == child_id:
            return chain
        seen.add(ident)
        folder = above
    raise LineageError(
        f"parent_workdir: the lineage above {_named(parent_at)} runs through more than"
        f" {MAX_WALK} folders ({PARENT_WORKDIR} in each lineage.json), more than spawns"
        f" record; fix or remove the lineage.json files on the way (the last one read:"
        f" {_named(folder / LINEAGE_FILE)})"
    )


def _check_parent(
    child: Path, parent_workdir: Path, recorded: dict[str, Any] | None
) -> tuple[Path, int]:
    """Where the parent is (resolved) and its depth, once the child's folder is known to be
    no folder of the parent's, nor of its chain; `LineageError` naming the field otherwise."""
    try:
        found = parent_workdir.is_dir()
    except OSError as exc:  # a name too long: it was "cannot write lineage.json" of the child
        raise LineageError(
            f"parent_workdir: {quoted(str(parent_workdir))} cannot be used ({exc.strerror});"
            " give the parent's working directory, or leave it out"
        ) from None
    if not found:
        raise LineageError(
            f"parent_workdir: {quoted(str(parent_workdir))} {not_a_directory(str(parent_workdir))};"
            " give the parent's working directory, or leave it out"
        )
    parent_at, child_at = parent_workdir.resolve(), child.resolve()
    parent_id, child_id = _identity(parent_at), _identity(child_at)
    if parent_id is None or child_id is None:
        raise LineageError(
            f"parent_workdir: {quoted(str(parent_workdir))} cannot be reached; give the"
            " parent's working directory, or leave it out"
        )
    if parent_id == child_id:
        raise LineageError(
            "parent_workdir: is the child's own workdir; an agent is not its own parent"
        )
    if _within(parent_at, {child_id}) is not None:
        # The child's folder would hold the parent's files, and the parent would sit in its
        # child's tree.
        raise LineageError(
            f"workdir: {quoted(str(child))} holds the parent's workdir"
            f" ({quoted(str(parent_at))}); a child's workdir is never its parent's"
            " folder or one above it: give the child a folder of its own (inside the"
            " parent's workdir or beside it)"
        )
    contract: dict[_Identity, str] = {}
    for name in CONTRACT_DIRS:
        # The contract folder as it is in the parent's workdir (not through a link: the
        # service follows none there); on a case-insensitive file system `INBOX` is found.
        try:
            info = os.lstat(parent_at / name)
        except OSError:
            continue
        contract[info.st_dev, info.st_ino] = name
    inside = _within(child_at, set(contract))
    if inside is not None:
        name = contract[inside[1]]
        raise LineageError(
            f"workdir: {_named(child)} is inside the parent's {name}/ folder"
            f" ({_named(inside[0])}), where the parent's own files live; give the child a"
            f" folder of its own outside {name}/ (inside the parent's workdir or beside it)"
        )
    chain = _loop_through(parent_at, child_id)
    if chain is not None:
        path = " -> ".join(_named(folder) for folder in reversed(chain))
        raise LineageError(
            f"workdir: {_named(child)} is an ancestor of the parent (spawned in turn:"
            f" {path}, as their lineage.json files record it); recording it as the parent's"
            " child would close a loop: give the child a folder of its own"
        )
    before_id = None if recorded is None else _recorded_identity(recorded)
    if recorded is not None and before_id is not None and before_id != parent_id:
        raise LineageError(
            f"workdir: {_named(child)} is already recorded as the child of"
            f" {quoted(str(recorded['parent']))} in {_named(recorded[PARENT_WORKDIR])};"
            " an agent is spawned once: give the new child a folder of its own (or remove its"
            " lineage.json first if the folder now holds a new agent)"
        )
    record = read_lineage(parent_at)
    return parent_at, 1 if record is None else int(record["depth"]) + 1


@contextlib.contextmanager
def _spawning(child: Path, parent_workdir: Path | None) -> Iterator[None]:
    """One spawn of `child` at a time, across threads and processes: an exclusive `flock` on
    the child's folder itself (no file of ours is added to it), held from reading its record
    to writing the new one. Without it, parents spawning one folder at once each read "no
    record yet" and each wrote its own: all were told they had spawned the child, and the
    file kept only the last.

    The parent's folder is locked too, so two agents spawning each other at once (a records
    b while b records a) cannot both find the other side without a record and close a loop.
    Both locks are taken in one order (by device and inode), so two such spawns never wait on
    each other for good. A parent folder that cannot be opened is not locked: the checks that
    follow refuse it with their own message."""
    try:
        child_fd = os.open(child, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise LineageError(
            f"workdir: {quoted(str(child))} cannot be used ({exc.strerror}); give the child's"
            " working directory"
        ) from None
    fds = [child_fd]
    try:
        if parent_workdir is not None:
            with contextlib.suppress(OSError, ValueError, TypeError):
                fds.append(os.open(parent_workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        ordered = {(info.st_dev, info.st_ino): fd for fd in fds for info in [os.fstat(fd)]}
        for _, fd in sorted(ordered.items()):  # one folder given twice is locked once
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        for fd in fds:
            os.close(fd)  # releases the locks


def spawn(
    child: Path,
    *,
    parent: str,
    reason: str,
    provider: str | None = None,
    parent_workdir: Path | None = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
    clock: Callable[[], str] = utc_now_iso,
    way: Way = "python",
) -> dict[str, Any]:
    """Write `<child>/lineage.json` and return the record; raises `LineageError`, said for
    `way`: naming this function's parameters, or the command line's options (`cli`) or the
    MCP tool's fields (`mcp`)."""
    try:
        return _spawn(
            child,
            parent=parent,
            reason=reason,
            provider=provider,
            parent_workdir=parent_workdir,
            max_depth=max_depth,
            clock=clock,
        )
    except LineageError as exc:
        exc.args = (worded(str(exc), way, _NAMES),)
        raise


def _spawn(
    child: Path,
    *,
    parent: str,
    reason: str,
    provider: str | None,
    parent_workdir: Path | None,
    max_depth: int,
    clock: Callable[[], str],
) -> dict[str, Any]:
    """`spawn`, its errors written once: the field first, the options as the command line
    spells them (`spawn` says them for its way in)."""
    if not isinstance(parent, str) or not AGENT_ID.fullmatch(parent):
        raise LineageError(f"parent: the parent's agent id, {AGENT_ID_RULE}")
    if reason is not None and not isinstance(reason, str):
        raise LineageError(
            f"reason: must be text, not {json_kind(reason)}; say why this agent is created"
        )
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
            f"workdir: {quoted(str(child))} {not_a_directory(str(child))}; create the child's"
            " working directory first"
        )
    with _spawning(child, parent_workdir):
        return _spawn_locked(
            child,
            parent=parent,
            reason=reason,
            provider=provider,
            parent_workdir=parent_workdir,
            max_depth=max_depth,
            clock=clock,
        )


def _spawn_locked(
    child: Path,
    *,
    parent: str,
    reason: str,
    provider: str | None,
    parent_workdir: Path | None,
    max_depth: int,
    clock: Callable[[], str],
) -> dict[str, Any]:
    """The rest of `spawn`, while it holds the child's and the parent's folders (`_spawning`)."""
    try:
        recorded = read_lineage(child)
    except LineageError:
        recorded = None  # a broken record is replaced, as a missing one is written
    if recorded is not None and recorded["parent"] != parent:
        # Who created whom survives restarts: a second spawn naming another parent would
        # rewrite that history. A retry naming the same parent is fine.
        raise LineageError(
            f"workdir: {quoted(str(child))} is already recorded as a child of"
            f" {quoted(str(recorded['parent']))}; an agent is spawned once: give the new"
            " child a folder of its own (or remove its lineage.json first if the folder now"
            " holds a new agent)"
        )
    depth, parent_at = 1, None
    if parent_workdir is not None:
        parent_workdir = _folder(parent_workdir, "parent_workdir", "the parent's working directory")
        parent_at, depth = _check_parent(child, parent_workdir, recorded)
    elif recorded is not None and _recorded_identity(recorded) is not None:
        # A retry that leaves the folder out would drop the link the loop check walks.
        raise LineageError(
            f"parent_workdir: the lineage.json of {_named(child)} records its parent's"
            f" folder ({_named(recorded[PARENT_WORKDIR])}); give it again as"
            " --parent-workdir (a retry names the same parent)"
        )
    if depth > max_depth:
        raise LineageError(
            f"depth: this spawn would be depth {depth}, over the cap of {max_depth}; "
            "do the work in this agent, or ask a person to raise the cap (--max-depth)"
        )
    parent_text = None if parent_at is None else str(parent_at)
    # A retry (the recorded parent again) keeps the recorded creation time: the agent was
    # created then, and a second run of the spawn must not move it to now.
    first = parse_iso(recorded.get("created_at")) if recorded is not None else None
    created_at = clock() if first is None else iso_utc(first)
    record = {
        "parent": parent,
        PARENT_WORKDIR: parent_text,
        "reason": reason.strip(),
        "provider": provider,
        "depth": depth,
        "created_at": created_at,
    }
    # A folder name may hold bytes that are not UTF-8 (kept as lone surrogates): escaped
    # (`\udcff`), the file stays UTF-8 and the name reads back the same.
    text = json.dumps(record, ensure_ascii=not encodable(parent_text or ""))
    try:
        atomic_write(child / LINEAGE_FILE, text.encode())
    except OSError as exc:
        # A bare `OSError` from Python; each way in worded it itself, MCP naming
        # `child_workdir`, the command line no field at all.
        raise LineageWriteFailed(
            f"workdir: {cannot_write(child / LINEAGE_FILE, exc)}", exc
        ) from exc
    return record
