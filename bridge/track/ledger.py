"""The ledger's line in the automatic slot: state and next gate, read safely from a workdir.

A workdir is untrusted, so the read goes through the agent's `WorkdirFiles` like every other
contract file: a regular file whose resolved path stays inside the resolved workdir (a symlink
that stays inside is followed, one out is refused), never a pipe or a device, capped in size.
A refusal is logged and listed in `taskcard status` under `ledger/long-task-ledger.json`, and
the row shows `unknown`, never an exception. The summary is cached by the file's (inode,
size, mtime), so an unchanged ledger is not parsed again, and it is looked at only when the
watcher names the ledger file (or a rescan looks at everything): a ledger change alone
updates the card, and composing a card costs no look at all.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Collection
from typing import Final

from taskcard.bridge.follow.safe_read import PATH_MEMO, WorkdirFiles
from taskcard.producers.ledger.contract import (
    LEDGER_DIR,
    LEDGER_FILE,
    MAX_SUMMARY_BYTES,
    LedgerSummary,
    judged_summary,
)

_UNKNOWN: Final = LedgerSummary()
# The cache entries of an agent without a readable ledger (most of them), shared.
_ABSENT: Final = (None, None)
_REFUSED: Final = (None, _UNKNOWN)
_LEDGER_NAME: Final = f"{LEDGER_DIR}/{LEDGER_FILE}"


def _joined_ledger_path(workdir: str) -> str:
    return os.path.join(workdir, _LEDGER_NAME)


# A workdir's ledger path, worked out once (`os.path.join` is Python code, about 50 bytecodes
# a call, and every rescan looks at each agent's ledger); bounded as `safe_read`'s memos are.
_ledger_path = functools.lru_cache(maxsize=PATH_MEMO)(_joined_ledger_path)
Signature = tuple[int, int, int, int]


class LedgerView:
    """Per agent: the current `LedgerSummary`, or None when its workdir has no ledger.

    `summary` looks at the file; `refresh` looks only when the watcher named the ledger
    (or could not say what changed) and says whether the summary moved, so a ledger change
    alone brings the card up to date; `current` is what compositions use, without a look
    when one was already taken (a composition happens on every card change, and the ledger
    is usually missing: a `stat` per change saved).

    Kept per agent (its `WorkdirFiles`), not per workdir: agents may share a workdir, and
    each must see the change its own refresh was told of (one cache for both would answer
    "unchanged" to the second), and its own refusals (in its own `problems`). A monitor
    replaced or retired is `forget`-ten.
    """

    def __init__(self) -> None:
        self._cache: dict[WorkdirFiles, tuple[Signature | None, LedgerSummary | None]] = {}

    def summary(self, files: WorkdirFiles) -> LedgerSummary | None:
        # Asked on every look: joined as text, not built as `Path` objects, and remembered.
        path = _ledger_path(os.fspath(files.workdir))
        name = _LEDGER_NAME
        info = files.stat(path)
        if info is None:
            entry = _REFUSED if name in files.problems else _ABSENT
            self._cache[files] = entry
            return entry[1]
        signature = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        cached = self._cache.get(files)
        if cached is not None and cached[0] == signature:
            return cached[1]
        read: list[LedgerSummary] = []

        def judge(raw: bytes) -> str | None:
            # Read once, judged and summed up in the same parse: a ledger that is no ledger
            # (not JSON, nested too deep, no tasks) is named with the fix, not only "unknown".
            summary, problem = judged_summary(raw)
            read.append(summary)
            return problem

        # `whole`: a larger one is refused naming its size (it read as unknown, silently).
        data = files.read(path, MAX_SUMMARY_BYTES, whole=True, judge=judge)
        if data is None and name not in files.problems:
            self._cache.pop(files, None)
            return None  # removed between the look and the read
        result = read[0] if read else _UNKNOWN
        if name in files.problems:
            # Refused for its size or its content: the last good row stays, as for any file.
            kept = cached[1] if cached is not None else None
            result = kept if kept is not None else _UNKNOWN
        self._cache[files] = (signature, result)
        return result

    def refresh(self, files: WorkdirFiles, changed: Collection[str] | None) -> bool:
        """Look again when `changed` (the contract files the watcher named) holds the ledger
        or is None (anything may have changed); whether the summary is now different."""
        cached = self._cache.get(files)
        if cached is not None and changed is not None and _LEDGER_NAME not in changed:
            return False
        before = cached[1] if cached is not None else None
        return self.summary(files) != before

    def current(self, files: WorkdirFiles) -> LedgerSummary | None:
        """The summary as last looked at (looked at now when never before)."""
        cached = self._cache.get(files)
        return cached[1] if cached is not None else self.summary(files)

    def forget(self, files: WorkdirFiles) -> None:
        self._cache.pop(files, None)


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
