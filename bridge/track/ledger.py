"""The ledger's line in the automatic slot: state and next gate, read safely from a workdir.

A workdir is untrusted, so the read is total and bounded: the ledger must be a regular file
inside the resolved workdir (no symlink out, `O_NOFOLLOW` on the file itself), it is opened
with `O_NONBLOCK` so a FIFO planted there cannot stall the event loop, checked with `fstat`
before reading, and capped in size. Anything wrong shows `unknown`, never an exception. The
summary is cached by the file's (inode, size, mtime), so an unchanged ledger is not parsed
again on every composition.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from producers.ledger.contract import (
    LEDGER_DIR,
    LEDGER_FILE,
    MAX_SUMMARY_BYTES,
    LedgerSummary,
    parse_summary,
)

_UNKNOWN: Final = LedgerSummary()
Signature = tuple[int, int, int]


def read_ledger_bytes(workdir: Path) -> bytes | None:
    """The ledger's bytes; None when there is no ledger; b"" when it cannot be trusted."""
    root = workdir.resolve()
    folder = root / LEDGER_DIR
    try:
        if folder.is_symlink() or not folder.resolve().is_relative_to(root):
            return b""
        fd = os.open(folder / LEDGER_FILE, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return b""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SUMMARY_BYTES:
            return b""
        return os.read(fd, MAX_SUMMARY_BYTES)
    except OSError:
        return b""
    finally:
        os.close(fd)


class LedgerView:
    """Per workdir: the current `LedgerSummary`, or None when the workdir has no ledger."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[Signature | None, LedgerSummary | None]] = {}

    def summary(self, workdir: Path) -> LedgerSummary | None:
        path = workdir / LEDGER_DIR / LEDGER_FILE
        try:
            info = os.lstat(path)
            signature: Signature | None = (info.st_ino, info.st_size, info.st_mtime_ns)
        except FileNotFoundError:
            return None
        except OSError:
            signature = None
        cached = self._cache.get(workdir)
        if cached is not None and signature is not None and cached[0] == signature:
            return cached[1]
        data = read_ledger_bytes(workdir)
        result = None if data is None else (parse_summary(data) if data else _UNKNOWN)
        self._cache[workdir] = (signature, result)
        return result


def ledger_row(summary: LedgerSummary | None) -> str | None:
    """`ledger: RUNNING · step 2/3 · next: complete step train` (typed fields only)."""
    if summary is None:
        return None
    task = f" {summary.task_id}" if summary.task_id else ""
    parts = [f"ledger{task}: {summary.workflow}"]
    if summary.step_count:
        parts.append(f"{summary.steps_done or 0}/{summary.step_count} steps done")
    parts.append(f"next: {summary.next_gate}")
    return " · ".join(parts)
