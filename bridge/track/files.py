"""The contract files the service reads for one agent, kept as text.

The service holds one of these per agent, thousands at once, for its whole life. A `Path`
keeps its parts list, its text and several cached fields (about 300 bytes each, and the
producer's `CardPaths` caches nine of them per agent in a `__dict__`): at 10,000 agents that
was about 30 MB of pathlib objects. The readers (`bridge.follow`) take text paths as well as
`Path`s, so here each path is built once with pathlib (its joining rules exactly: no `..` is
collapsed, which would change what a symlinked workdir means) and kept as its text.

Only how the paths are held changes: every read still goes through `WorkdirFiles`, which
resolves each path and refuses what leaves the resolved workdir.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from taskcard.producers.inbox.contract import ACKS_FILE, INBOX_DIR
from taskcard.producers.reports.contract import LINEAGE_FILE, REPORTS_DIR, REPORTS_FILE
from taskcard.producers.task_card.contract import (
    BODY_FILE,
    EVENTS_FILE,
    LOGS_DIR,
    NOTIFICATION_DIR,
    NOTIFICATION_FILE,
    STATUS_FILE,
    TASKCARD_DIR,
    WATCH_FILE,
)

# How the watcher names a changed file (`FleetWatcher.take_changed`): its contract folder and
# its name, or the name alone for the lineage file in the workdir itself.
STATUS_NAME: Final = f"{TASKCARD_DIR}/{STATUS_FILE}"
BODY_NAME: Final = f"{TASKCARD_DIR}/{BODY_FILE}"
WATCH_NAME: Final = f"{TASKCARD_DIR}/{WATCH_FILE}"
NOTIFICATIONS_NAME: Final = f"{NOTIFICATION_DIR}/{NOTIFICATION_FILE}"
EVENTS_NAME: Final = f"{LOGS_DIR}/{EVENTS_FILE}"
REPORTS_NAME: Final = f"{REPORTS_DIR}/{REPORTS_FILE}"
ACKS_NAME: Final = f"{INBOX_DIR}/{ACKS_FILE}"
LINEAGE_NAME: Final = LINEAGE_FILE


def _in(folder: Path, name: str) -> str:
    """The text of `folder / name` (pathlib's joining; a plain name adds one component)."""
    return os.path.join(os.fspath(folder), name)


class CardFiles:
    """The task-card contract files of one workdir, as text (see the module docstring)."""

    __slots__ = ("body", "events", "notifications", "status", "watch", "workdir")

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir  # the caller's object: compared when the fleet changes
        card_dir = workdir / TASKCARD_DIR
        self.status = _in(card_dir, STATUS_FILE)
        self.body = _in(card_dir, BODY_FILE)
        self.watch = _in(card_dir, WATCH_FILE)
        self.notifications = _in(workdir / NOTIFICATION_DIR, NOTIFICATION_FILE)
        self.events = _in(workdir / LOGS_DIR, EVENTS_FILE)


class SideFiles:
    """The agent side's files the service follows (reports, acks, lineage), as text."""

    __slots__ = ("acks", "lineage", "reports")

    def __init__(self, workdir: Path) -> None:
        self.reports = _in(workdir / REPORTS_DIR, REPORTS_FILE)
        self.acks = _in(workdir / INBOX_DIR, ACKS_FILE)
        self.lineage = os.fspath(workdir / LINEAGE_FILE)
