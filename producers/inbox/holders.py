"""Who holds a claimed message, and whether that process is gone.

A reader that claims a message first writes `inbox/claims/<id>.json`, naming itself: its pid,
the kernel's start time of that pid (so a pid the system reused for another process is not
taken for the holder), the machine's boot id and the reader's pid namespace. A later reader
judges the holder of each record:

- gone: no process has that pid, the process with that pid started at another time, or it is
  a zombie (it can do nothing more); or the machine restarted since (another boot id);
- alive: that very process still runs;
- unknown: the record is not one this code wrote, the holder ran in another pid namespace
  (a container: its pids are not ours to look up), or a process has that pid but `/proc`
  does not show it (mounted with `hidepid`: its start time cannot be compared). An unknown
  holder is treated as alive: its messages are never offered twice, at worst they wait for
  a person (docs/reports.md).

Linux gives the start time in `/proc/<pid>/stat`; where there is no `/proc`, only whether a
process with that pid exists is known, so a reused pid keeps the claim held until it ends.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Final, Literal

Verdict = Literal["gone", "alive", "unknown"]
_PROC: Final = "/proc"


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read(4096)
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (state first), or None."""
    text = _read_text(f"{_PROC}/{pid}/stat")
    if text is None or ")" not in text:
        return None
    return text[text.rindex(")") + 1 :].split()


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


@functools.cache
def _boot_id() -> str | None:
    text = _read_text(f"{_PROC}/sys/kernel/random/boot_id")
    return text.strip() if text else None


@functools.cache
def _pid_namespace() -> str | None:
    try:
        return os.readlink(f"{_PROC}/self/ns/pid")
    except OSError:
        return None


def me() -> dict[str, Any]:
    """This process as the holder of a claim (the record's content)."""
    pid = os.getpid()
    return {"pid": pid, "start": _start_time(pid), "boot": _boot_id(), "pidns": _pid_namespace()}


def record_bytes(via: str) -> bytes:
    return (json.dumps({**me(), "via": via}, separators=(",", ":")) + "\n").encode()


def judge(raw: bytes) -> Verdict:
    """Whether the holder a claim record names is gone, alive, or cannot be told."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "unknown"
    if not isinstance(record, dict):
        return "unknown"
    pid, start = record.get("pid"), record.get("start")
    if type(pid) is not int or pid <= 0 or not (start is None or isinstance(start, str)):
        return "unknown"
    boot = _boot_id()
    if boot is not None and isinstance(record.get("boot"), str) and record["boot"] != boot:
        return "gone"  # the machine restarted since: every process of that boot ended
    if record.get("pidns") != _pid_namespace():
        return "unknown"
    if os.path.isdir(_PROC) and _boot_id() is not None:
        fields = _stat_fields(pid)
        if fields is None:  # no such process, or /proc hides it (`hidepid`)
            return "unknown" if _exists(pid) else "gone"
        if fields[0] == "Z" or (start is not None and fields[19:20] != [start]):
            return "gone"
        return "alive"
    return "alive" if _exists(pid) else "gone"  # no /proc: only whether the pid exists


def _exists(pid: int) -> bool:
    """Whether some process has that pid (one of another user too)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no process can have it
        return False
    except OSError:
        return True  # it exists, run by another user
    return True
