"""`taskcard/watch.json`: what a restarted host needs to resume the same watch.

Fields: watch_id, renderer_path (relative to the workdir), interval_s, timeout_s,
max_refreshes, refreshes_used, started_at, plus error_epoch so that an error episode after a
restart gets a fresh idempotency key instead of colliding with one already delivered, and
error_code, the code of the error episode still open when the file was written (null when the
watch was healthy): a host killed mid-episode resumes it, so a renderer still failing sends no
second error notice and one that works again sends the recovery the chats wait for.
Watch ids come from `.taskcard-host/watch-seq` (the host's private folder, not the card's), a
counter that only grows, so an id is never reused even after the descriptor is cleared.
Earlier versions kept it at `taskcard/.watch-seq`: the larger of the two counts, and the old
file is removed once the new one is written (`adopt_legacy_files`, at every host start).

A watch that `stop` paused (or that used its budget) has no `watch.json`, but is recorded in
`.taskcard-host/ended.json` with the same fields, so a host started later can still answer
`inspect` and `retry` for it (`write_ended`, `read_ended`); `final_retry_used` there says
whether the one retry an exhausted watch is allowed was spent (a record without it, from an
earlier version, has not spent it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

from taskcard.producers.task_card.contract import (
    CardPaths,
    OutsideWorkdir,
    atomic_write,
    is_inside,
    read_regular,
)
from taskcard.producers.task_card.renderer import ERROR_CODES, ErrorCode
from taskcard.producers.task_card.settings import BOUNDS, setting_problem
from taskcard.producers.task_card.tally import clear_tally, host_folder, remove_legacy

log = logging.getLogger(__name__)

MAX_DESCRIPTOR_BYTES: Final = 64 * 1024  # a descriptor is a few hundred bytes
_ID_RE: Final = re.compile(r"tc_([1-9][0-9]*)")


@dataclass(frozen=True)
class WatchDescriptor:
    watch_id: str
    renderer_path: str
    interval_s: float
    timeout_s: float
    max_refreshes: int
    refreshes_used: int
    started_at: str
    error_epoch: int = 0
    error_code: ErrorCode | None = None  # the open error episode's code; None while healthy


class DescriptorCorrupt(ValueError):
    """The file exists but is not a descriptor we can trust."""


def write_descriptor(
    paths: CardPaths, descriptor: WatchDescriptor, *, durable: bool = True
) -> None:
    """Write watch.json atomically; per-tick budget updates pass `durable=False`."""
    data = json.dumps(asdict(descriptor), indent=2, sort_keys=True) + "\n"
    atomic_write(paths.watch, data.encode(), durable=durable)


def clear_descriptor(paths: CardPaths) -> None:
    """No watch to resume: the descriptor goes, and the budget tally that belonged to it."""
    with contextlib.suppress(FileNotFoundError):
        paths.watch.unlink()
    clear_tally(paths)


def _number(data: dict[str, Any], key: str) -> float:
    """A cadence or timeout within its setting's range: an edited file cannot exceed it."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DescriptorCorrupt(f"{key} is not a number")
    # The host writes floats; a whole number past the largest float was planted (and
    # `math.isfinite` of it raised OverflowError, which stopped the host from booting).
    too_big = isinstance(value, int) and abs(value) > sys.float_info.max
    if too_big or not math.isfinite(value) or setting_problem(key, value) is not None:
        raise DescriptorCorrupt(f"{key} is out of range ({BOUNDS[key].describe()})")
    return float(value)


def _integer(data: dict[str, Any], key: str, minimum: int, maximum: float) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise DescriptorCorrupt(f"{key} is not an integer from {minimum} to {maximum:g}")
    return value


def read_descriptor(paths: CardPaths) -> WatchDescriptor | None:
    """The descriptor, None when there is none; raises `DescriptorCorrupt`."""
    data = _read_object(paths.watch, follow=True)
    return None if data is None else _descriptor_from(data)


def _read_object(path: Path, *, follow: bool) -> dict[str, Any] | None:
    """The JSON object at `path`, None when there is none; raises `DescriptorCorrupt`."""
    try:
        raw = read_regular(path, MAX_DESCRIPTOR_BYTES + 1, follow=follow)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DescriptorCorrupt(f"unreadable ({exc.strerror})") from None
    if len(raw) > MAX_DESCRIPTOR_BYTES:
        raise DescriptorCorrupt(f"larger than {MAX_DESCRIPTOR_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise DescriptorCorrupt("not valid JSON") from None
    if not isinstance(data, dict):
        raise DescriptorCorrupt("not a JSON object")
    return data


def _descriptor_from(data: dict[str, Any]) -> WatchDescriptor:
    """A descriptor's fields checked one by one; raises `DescriptorCorrupt` naming the first
    that is wrong."""
    watch_id = data.get("watch_id")
    renderer = data.get("renderer_path")
    started = data.get("started_at")
    if not isinstance(watch_id, str) or not _ID_RE.fullmatch(watch_id):
        raise DescriptorCorrupt("watch_id is missing or malformed")
    if not isinstance(renderer, str) or not renderer:
        raise DescriptorCorrupt("renderer_path is missing")
    if not isinstance(started, str):
        raise DescriptorCorrupt("started_at is missing")
    error_code = data.get("error_code")
    if error_code is not None and error_code not in ERROR_CODES:
        raise DescriptorCorrupt("error_code is not an error code of the task card")
    return WatchDescriptor(
        watch_id=watch_id,
        renderer_path=renderer,
        interval_s=_number(data, "interval_s"),
        timeout_s=_number(data, "timeout_s"),
        max_refreshes=_integer(data, "max_refreshes", 1, BOUNDS["max_refreshes"].ceiling),
        refreshes_used=_integer(data, "refreshes_used", 0, BOUNDS["max_refreshes"].ceiling),
        started_at=started,
        error_epoch=_integer(data, "error_epoch", 0, 2**53) if "error_epoch" in data else 0,
        error_code=cast("ErrorCode | None", error_code),
    )


EndedState = Literal["stopped", "exhausted"]


@dataclass(frozen=True)
class EndedWatch:
    """A watch that `stop` paused or its budget ended, as a later host needs it to answer
    `inspect` and `retry` for it: its descriptor (with the budget spent so far), how it
    ended, when its last body was published, and whether the one final retry an exhausted
    watch is allowed was spent."""

    descriptor: WatchDescriptor
    state: EndedState
    last_body_at: str | None
    final_retry_used: bool = False


def write_ended(paths: CardPaths, ended: EndedWatch) -> None:
    """Record the ended watch in the host's folder (`.taskcard-host/ended.json`).

    The manual keeps a stopped watch for a later `retry` or inspection, and clears
    `watch.json` at `stop`; but the host of a workdir exits once no watch is live (its idle
    grace), so a stopped watch held only in its memory was unknown two minutes later
    ("not a watch of this host") and the agent could no longer retry the card it paused.
    Only the host reads this file; the card folder keeps exactly the manual's files."""
    data = {
        **asdict(ended.descriptor),
        "state": ended.state,
        "last_body_at": ended.last_body_at,
        "final_retry_used": ended.final_retry_used,
    }
    host_folder(paths)
    atomic_write(paths.ended, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def read_ended(paths: CardPaths) -> EndedWatch | None:
    """The ended watch recorded in the host's folder, None when there is none or the record
    cannot be trusted (never through a link: the host writes it by rename; logged)."""
    if not is_inside(os.path.realpath(paths.workdir), os.path.realpath(paths.host_dir)):
        return None
    try:
        data = _read_object(paths.ended, follow=False)
        if data is None:
            return None
        descriptor = _descriptor_from(data)
    except DescriptorCorrupt as exc:
        log.warning("task card: the record of an ended watch is ignored: %s", exc)
        return None
    state = data.get("state")
    last_body_at = data.get("last_body_at")
    if state not in ("stopped", "exhausted") or not isinstance(last_body_at, str | None):
        log.warning("task card: the record of an ended watch is ignored: no state it can have")
        return None
    # Absent in the records of earlier versions, which allowed no final retry at all.
    final_retry_used = data.get("final_retry_used", False)
    if not isinstance(final_retry_used, bool):
        # Spent, when in doubt: the record is the host's own, and a planted value must not
        # give an exhausted watch a render it already had.
        log.warning("task card: the ended watch's final_retry_used is not true or false")
        final_retry_used = True
    return EndedWatch(descriptor, cast("EndedState", state), last_body_at, final_retry_used)


def clear_ended(paths: CardPaths) -> None:
    """No ended watch to keep (a new watch started, or the card was removed); never through
    a host folder swapped for a link out of the workdir."""
    if os.path.lexists(paths.ended) and is_inside(
        os.path.realpath(paths.workdir), os.path.realpath(paths.host_dir)
    ):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(paths.ended)


def watch_number(watch_id: str) -> int:
    match = _ID_RE.fullmatch(watch_id)
    return int(match.group(1)) if match else 0


def _read_seq(path: Path) -> int:
    """The counter in `path`, 0 when missing or unusable (never through a symbolic link: only
    a planter makes one; the host writes the counter by rename)."""
    try:
        return int(read_regular(path, 64, follow=False).decode().strip())
    except (OSError, ValueError):
        return 0


def allocate_watch_id(paths: CardPaths, seen: int) -> str:
    """The next id, persisted before use so a crash can never hand the same id out twice.

    In the host's folder; where that folder cannot be made or written (a workdir whose root
    is read-only while `taskcard/` is writable, a file planted at its name) the counter stays
    where earlier versions kept it, `taskcard/.watch-seq`, rather than no card being startable
    (a folder linked out of the workdir is still refused)."""
    last = max(_read_seq(paths.watch_seq), _read_seq(paths.legacy_watch_seq))
    number = max(last, seen) + 1
    data = str(number).encode()
    try:
        host_folder(paths)
        atomic_write(paths.watch_seq, data)
    except OutsideWorkdir:
        raise
    except OSError as exc:
        if not _host_folder_unusable(paths, exc):
            raise
        log.warning(
            "task card: %s cannot be written (%s); the id counter stays in taskcard/",
            paths.host_dir,
            exc.strerror or exc,
        )
        atomic_write(paths.legacy_watch_seq, data)
        return f"tc_{number}"
    remove_legacy(paths, paths.legacy_watch_seq)
    return f"tc_{number}"


def _host_folder_unusable(paths: CardPaths, exc: OSError) -> bool:
    """Whether `exc` says the host's folder itself cannot be used (not made, not a folder, no
    writes allowed there), as opposed to something planted at the counter's own name."""
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return True
    return exc.filename is not None and os.fsdecode(exc.filename) == str(paths.host_dir)


def adopt_legacy_files(paths: CardPaths) -> None:
    """Upgrade a workdir an earlier version's host used: its id counter and refresh tally sat
    in `taskcard/`. The counter moves to the host's folder now (the larger count wins); the
    old tally goes when the new one exists or no watch is left to resume, and otherwise stays
    until the resumed watch's own tally is written (`tally.read_tally` reads it meanwhile).
    When the host's folder cannot be written the old files stay and keep counting."""
    try:
        if os.path.lexists(paths.legacy_watch_seq):
            number = max(_read_seq(paths.watch_seq), _read_seq(paths.legacy_watch_seq))
            if number:
                host_folder(paths)
                atomic_write(paths.watch_seq, str(number).encode())
            remove_legacy(paths, paths.legacy_watch_seq)
        if os.path.lexists(paths.legacy_tally) and (
            os.path.lexists(paths.tally) or not os.path.lexists(paths.watch)
        ):
            remove_legacy(paths, paths.legacy_tally)
    except OSError as exc:
        log.warning(
            "task card: an earlier version's files stay in %s and are read there (%s)",
            paths.taskcard_dir,
            exc.strerror or exc,
        )
