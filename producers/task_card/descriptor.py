"""`taskcard/watch.json`: what a restarted host needs to resume the same watch.

Fields: watch_id, renderer_path (relative to the workdir), interval_s, timeout_s,
max_refreshes, refreshes_used, started_at, plus error_epoch so that an error episode after a
restart gets a fresh idempotency key instead of colliding with one already delivered, and
error_code, the code of the error episode still open when the file was written (null when the
watch was healthy): a host killed mid-episode resumes it, so a renderer still failing sends no
second error notice and one that works again sends the recovery the chats wait for.
Watch ids come from `taskcard/.watch-seq`, a counter that only grows, so an id is never reused
even after the descriptor is cleared.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any, Final, cast

from taskcard.producers.task_card.contract import CardPaths, atomic_write, read_regular
from taskcard.producers.task_card.renderer import ERROR_CODES, ErrorCode
from taskcard.producers.task_card.settings import BOUNDS, setting_problem
from taskcard.producers.task_card.tally import clear_tally

SEQ_FILE: Final = ".watch-seq"
MAX_DESCRIPTOR_BYTES: Final = 64 * 1024  # a descriptor is a few hundred bytes
_ID_RE: Final = re.compile(r"^tc_([1-9][0-9]*)$")


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
    try:
        raw = read_regular(paths.watch, MAX_DESCRIPTOR_BYTES + 1)
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
    watch_id = data.get("watch_id")
    renderer = data.get("renderer_path")
    started = data.get("started_at")
    if not isinstance(watch_id, str) or not _ID_RE.match(watch_id):
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


def watch_number(watch_id: str) -> int:
    match = _ID_RE.match(watch_id)
    return int(match.group(1)) if match else 0


def allocate_watch_id(paths: CardPaths, seen: int) -> str:
    """The next id, persisted before use so a crash can never hand the same id out twice."""
    seq_path = paths.taskcard_dir / SEQ_FILE
    try:
        last = int(read_regular(seq_path, 64).decode().strip())
    except (OSError, ValueError):
        last = 0
    number = max(last, seen) + 1
    atomic_write(seq_path, str(number).encode())
    return f"tc_{number}"
