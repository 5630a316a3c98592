"""Per agent: its reports, the acks of its inbox and its lineage, read as untrusted files.

`reports/reports.jsonl` and `inbox/acks.jsonl` are followed like the notification file: by
(inode, offset) persisted through the `OffsetStore`; an agent seen for the first time starts
at the end (old reports are not announced again) but a bounded tail tells which report is the
latest. A report dated ahead of the clock is taken as dated when it was read: its date is the
agent side's word, and a date in the future would count as "reported since" every later
start and turn, silencing the exited and idle signals for good. `lineage.json` is read again
whenever its signature changes; a broken one keeps the last good reading. A run of broken
report lines is logged once and kept as the agent's problem (`broken_reports`) until a report
is read after it or the file is replaced or removed. Offsets move only
through `commit`, after the caller recorded what `refresh` returned, so a crash in between
repeats (idempotent) rather than loses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TypeAlias

from taskcard.bridge.follow.safe_read import HELD_LIKE_WARNINGS, StrPath, WorkdirFiles
from taskcard.bridge.follow.tail import (
    MAX_READ_BYTES,
    FileSignature,
    LineFollower,
    Position,
    signature,
)
from taskcard.bridge.track.activity import ActivitySummary
from taskcard.bridge.track.files import ACKS_NAME, LINEAGE_NAME, REPORTS_NAME, SideFiles
from taskcard.bridge.track.monitor import OffsetStore
from taskcard.producers.reports.contract import (
    LINE_FIX,
    Ack,
    Lineage,
    Report,
    line_problem,
    lineage_problem,
    parse_ack,
    parse_lineage,
    parse_report,
)

logger = logging.getLogger(__name__)

REPORTS_OFFSET: Final = "reports"
ACKS_OFFSET: Final = "inbox-acks"
MAX_LINEAGE_BYTES: Final = 64 * 1024
# What the time-driven signals were last decided from when none was due, and the moment the
# next may become due: the activity summary, the latest report, the card's status and its
# time, the idle floor (`Service._follow_agent_side`).
QuietSignals: TypeAlias = tuple[
    ActivitySummary, Report | None, str, datetime | None, float, datetime | None
]


@dataclass(frozen=True)
class SideRefresh:
    """What one `refresh` found: new reports (seq only grows), new acks, a lineage change."""

    reports: tuple[Report, ...] = ()
    acks: tuple[Ack, ...] = ()
    lineage_changed: bool = False


# What most refreshes find (a change of the card's own files): one shared answer.
_NOTHING_NEW: Final = SideRefresh()


class _Followed:
    """One followed file with its persisted offset (see the module docstring)."""

    __slots__ = (
        "_agent_id",
        "_name",
        "_offsets",
        "_primed",
        "_restarted_inode",
        "follower",
        "pending",
        "started_over",
    )

    def __init__(
        self, agent_id: str, name: str, path: StrPath, files: WorkdirFiles, offsets: OffsetStore
    ) -> None:
        self._agent_id = agent_id
        self._name = name
        self._offsets = offsets
        self.follower = LineFollower(path, files)
        self._primed = False
        # The position read up to and not saved yet (`commit` saves it).
        self.pending: tuple[int, int] | None = None
        # The inode of a file that was read again from its beginning (it replaced the one
        # followed, or was truncated): its lines may be a new series numbered from 1 again.
        # Kept, since the file is often seen empty (just created) before its first line.
        self._restarted_inode: int | None = None
        # Whether the last `read` began the file again from its start (see above).
        self.started_over = False

    def read(self) -> tuple[list[bytes], list[bytes]]:
        """(history lines seen at first sight, new lines)."""
        follower = self.follower
        self.started_over = False
        if not self._primed:
            self._primed = True
            follower.unchanged()
            stored = self._offsets.get_offset(self._agent_id, self._name)
            if stored is None:
                history = follower.start_at_end(seen_missing=follower.signature is None)
                position = follower.position or Position(0, 0)
                self._offsets.set_first_offset(
                    self._agent_id, self._name, position.inode, position.offset
                )
                return history, []
            follower.position = Position(*stored)
            # The history is the stored file's: a file that replaced it while the service
            # was down is new from its first line (a new series of reports, say).
            seen = follower.signature
            same = bool(stored[0]) and seen is not None and seen[0] == stored[0]
            history, _ = follower.tail(end=stored[1]) if same else ([], 0)
            return history, self._new()
        if follower.unchanged():
            return [], []
        return [], self._new()

    def _new(self) -> list[bytes]:
        before = self.follower.position
        was = None if before is None else (before.inode, before.offset)  # moved in place
        lines = self.follower.read_new()
        position = self.follower.position
        if position is not None:
            if was is not None and (position.inode != was[0] or position.offset < was[1]):
                self._restarted_inode = position.inode
                self.started_over = True
            self.pending = (position.inode, position.offset)
        return lines

    @property
    def restarted(self) -> bool:
        """Whether the file followed now was read again from its start (see `__init__`)."""
        position = self.follower.position
        return position is not None and position.inode == self._restarted_inode

    def commit(self) -> None:
        if self.pending is not None:
            self._offsets.set_offset(self._agent_id, self._name, *self.pending)
            self.pending = None

    def forget(self) -> None:
        self.follower.forget()

    def rewind(self) -> None:
        """The next `read` starts again from the saved offset, as after a restart: the lines
        read since are read again."""
        self.pending = None
        self._primed = False
        self.follower.forget()


class AgentSide:
    """Reads what the agent side wrote for the service: reports, acks, lineage."""

    __slots__ = (
        "_acks",
        "_broken_line",
        "_clock",
        "_files",
        "_full_next",
        "_lineage_signature",
        "_reports",
        "latest_report",
        "lineage",
        "paths",
        "quiet_signals",
    )

    def __init__(
        self,
        agent_id: str,
        workdir: Path,
        files: WorkdirFiles,
        offsets: OffsetStore,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.paths = SideFiles(workdir)
        self._clock = clock
        self._files = files
        self._reports = _Followed(agent_id, REPORTS_OFFSET, self.paths.reports, files, offsets)
        self._acks = _Followed(agent_id, ACKS_OFFSET, self.paths.acks, files, offsets)
        self._lineage_signature: FileSignature | None = None
        self.latest_report: Report | None = None
        self.lineage: Lineage | None = None
        self._full_next = True
        # The service's note of its last look at this agent's time-driven signals that
        # found none due (`Service._follow_agent_side`): kept here, with the agent's other
        # per-agent state, rather than in a map of its own.
        self.quiet_signals: QuietSignals | None = None
        # What was wrong with the first broken line of `reports/reports.jsonl` logged since
        # the last report read: one warning per run of broken lines (`_broken`).
        self._broken_line: str | None = None

    def refresh(self, changed: frozenset[str] | None = None) -> SideRefresh:
        """What is new; `changed` as in `AgentMonitor.refresh` (None: look at every file).
        The first refresh and the one after `forget` look at every file."""
        self.commit()
        if self._full_next:
            changed = None
            self._full_next = False
        reports: list[Report] = []
        if changed is None or REPORTS_NAME in changed:
            history, lines = self._reports.read()
            if self._broken_line is not None and (
                self._reports.started_over or self._reports.follower.signature is None
            ):
                # Replaced, truncated or removed: the broken lines went with the file.
                self._broken_line = None
                logger.info(
                    "agent %s: %s was replaced or removed, and its broken lines with it",
                    self._files.agent_id,
                    REPORTS_NAME,
                )
            for line in history:
                # Judged too: a file whose last lines are broken is so after a restart as
                # well (the lines after the last report read are where a report is lost).
                report = self._dated(parse_report(line))
                self._judge(line, report)
                self._learn(report)
            restarted = self._reports.restarted
            if self._reports.follower.take_skipped():
                self._broken(
                    f"had more than {MAX_READ_BYTES // 1024:,} KB appended at once (a line that"
                    " long is no report), of which only the last were read"
                )
            for line in lines:
                report = self._dated(parse_report(line))
                self._judge(line, report)
                if report is not None and self._learn(report, restarted=restarted):
                    reports.append(report)
        acks: tuple[Ack, ...] = ()
        if changed is None or ACKS_NAME in changed:
            _, ack_lines = self._acks.read()
            acks = tuple(ack for ack in map(parse_ack, ack_lines) if ack is not None)
        lineage_changed = (
            self._refresh_lineage() if changed is None or LINEAGE_NAME in changed else False
        )
        if not (reports or acks or lineage_changed):
            return _NOTHING_NEW
        return SideRefresh(tuple(reports), acks, lineage_changed)

    @property
    def reports_broken(self) -> bool:
        """Whether `broken_reports` says anything (asked at every change, without words)."""
        return self._broken_line is not None

    @property
    def broken_reports(self) -> str | None:
        """What is wrong with `reports/reports.jsonl` since the last report read, for
        `taskcard status` and the card (after the file's name), or None. A line's problem,
        unlike a file's (`WorkdirFiles.problems`, looked at again at each stat), lasts until
        the file is good again: a report read after the broken lines, or the file replaced,
        truncated or removed."""
        if self._broken_line is None:
            return None
        return (
            f"{self._broken_line}; skipped, so a report there is lost, and later ones are still"
            f" read ({LINE_FIX}; `taskcard reports` names each broken line by number)"
        )

    def _judge(self, line: bytes, report: Report | None) -> None:
        """A line of the reports file read: a report ends a run of broken lines, a broken
        line starts or continues one, a blank line does neither."""
        if report is not None:
            if self._broken_line is not None:
                self._broken_line = None
                logger.info(
                    "agent %s: %s holds reports again",
                    self._files.agent_id,
                    REPORTS_NAME,
                    extra=HELD_LIKE_WARNINGS,
                )
            return
        problem = line_problem(line)
        if problem is not None:
            self._broken(f"holds a line that {problem}")

    def _broken(self, problem: str) -> None:
        """Log a broken line of the reports file, once until a report is read again: it was
        skipped without a word, the report in it lost. Later reports are read as ever. The
        first problem of the run is the one shown (`broken_reports`): the card does not
        change at each broken line."""
        if self._broken_line is None:
            logger.warning(
                "agent %s: %s %s; skipped, later reports are still read (%s)",
                self._files.agent_id,
                REPORTS_NAME,
                problem,
                LINE_FIX,
            )
            self._broken_line = problem

    def _dated(self, report: Report | None) -> Report | None:
        """`report`, its date no later than now (see the module docstring)."""
        if report is None:
            return None
        now = self._clock()
        return replace(report, at=now) if report.at > now else report

    def _learn(self, report: Report | None, *, restarted: bool = False) -> bool:
        """Keep the newest report; True when `report` is newer than any seen.

        Within one file, newer means a larger seq (seq only grows). In a file read again from
        its start (`restarted`: `reports/` moved aside or deleted, numbering from 1 again, as
        the writer suggests once seq reaches its ceiling), a smaller seq is still a new report
        when it is dated after the latest one seen: a copy of old reports keeps their dates
        and is not announced twice.
        """
        if report is None:
            return False
        latest = self.latest_report
        older = latest is not None and report.seq <= latest.seq
        if older and not (restarted and latest is not None and report.at > latest.at):
            return False
        self.latest_report = report
        return True

    def _refresh_lineage(self) -> bool:
        seen = signature(self.paths.lineage)
        if seen == self._lineage_signature:
            return False
        self._lineage_signature = seen
        if seen is None:
            if self._files.problems:
                # Gone: a refusal of the file that was there (a folder, unreadable, a link
                # out) ends with it, as it does for every other file; unlooked at, its row
                # stayed on the card and in `taskcard status` for good.
                self._files.stat(self.paths.lineage)
            changed = self.lineage is not None
            self.lineage = None
            return changed
        raw = self._files.read(self.paths.lineage, limit=MAX_LINEAGE_BYTES, judge=lineage_problem)
        lineage = parse_lineage(raw)
        if lineage is None or lineage == self.lineage:
            return False  # half-written or unchanged: keep the last good reading
        self.lineage = lineage
        return True

    def commit(self) -> None:
        """Persist the offsets of what the last `refresh` returned (asked twice per change,
        most often with nothing read: then nothing is called)."""
        if self._reports.pending is not None:
            self._reports.commit()
        if self._acks.pending is not None:
            self._acks.commit()

    def forget(self) -> None:
        self._reports.forget()
        self._acks.forget()
        self._lineage_signature = None
        self._full_next = True

    def rewind(self) -> None:
        """Back to the saved offsets, for a reading that failed or whose follow-up failed:
        the next `refresh` returns again every report and ack read since they were saved
        (a report's notice and an ack are idempotent), where it would otherwise save the
        offsets past what was read and never acted on."""
        self._reports.rewind()
        self._acks.rewind()
        self.latest_report = None  # taken up again from the reports before the saved offset
        self.forget()
