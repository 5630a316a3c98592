"""One file watcher for the whole fleet: which agents' contract files may have changed.

Design, and why:

- One watcher (one inotify instance) for every workdir: the kernel allows only 128 instances
  per user, so a watcher per agent would not scale to a fleet. Two backends behind one plan:
  on Linux (`inotify`, the default there) the loop reads the inotify descriptor itself, so a
  change is seen in well under a millisecond and an idle fleet costs no wake-up (see
  `inotify.py`); elsewhere `watchfiles.awatch`, whose thread wakes every `step` and holds a
  batch for one more quiet step (10-20 ms at the 10 ms step).
- Non-recursive watches on each workdir root and on the contract folders that exist
  (`taskcard/`, `.notification/`, `logs/`), never a workdir's whole tree: a workdir may be a
  large repository whose churn we must not pay for. The root watch is there to see contract
  folders appear or vanish; events for anything else in the root are ignored.
- When a contract folder or a workdir appears or vanishes the plan is made again. A workdir
  that does not exist yet is covered by a non-recursive watch on its nearest existing
  ancestor, so it is noticed as soon as it is created rather than at the next rescan.
  watchfiles fixes its paths when it starts, so it is re-armed with the new set, and every
  agent is reported again each time, which covers the gap while none was running; arming
  costs loop time in proportion to the paths (`awatch` arms synchronously; about 0.3 ms per
  path), so re-arms are paced to at most a tenth of the loop's time during bursts. inotify
  adds and removes only the watches that differ and reports the agents of the folders newly
  watched; its re-plans (a `stat` per contract folder of every agent) are paced the same way.
- Events for the temp file of an atomic write (`.<name>.<random>.tmp`) are dropped: the
  rename that follows is the change, and reporting the temp file would read the agent a
  second time for nothing.
- At the inotify watch limit, the agents whose folders could not be watched are named in an
  error log and reported every `POLL_UNWATCHED_S` instead: slower, never blind.
- A periodic rescan reports every agent, a safety net for anything notifications miss
  (overflowed event queues, network file systems, races while re-arming). It is the one
  periodic work here that grows with the fleet, because only re-reading can catch a missed
  event; so it is spread out: every `sweep_step_s` it reports the next slice of the agents,
  sized so that each agent comes round once per `rescan_interval_s`. A fleet of 10,000 costs
  about 33 agent reads a second at the default interval instead of a burst of 10,000 (which
  would also hold every change behind it). After each full round the plan is checked and the
  watcher re-armed when folders on disk appeared or vanished without an event.
- Discovery roots are watched non-recursively too: a folder appearing or vanishing directly
  in a root is reported as `ROOTS` (never an agent id), and so is each full rescan round, so
  the owner lists the roots again. The owner changes the set of workdirs while watching with
  `set_workdirs`, which re-arms.
- Both backends hand their batches to `changes()` through a queue, so whatever arrived while
  the owner was busy goes out as one batch. With a `handler` (the service's), a batch of
  inotify events read while the owner waits for the next batch and none is pending is
  handed to it at once, in the loop's callback that read the events, instead of waking the
  owner's task one turn of the loop later (see `_Handoff`). watchfiles' blocking wait runs
  in the single worker thread that `awatch` owns; closing or cancelling `changes()` stops it
  promptly (the thread checks the stop event every `step`) instead of after the watcher's
  timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import re
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from taskcard.bridge.watch.inotify import (
    OUT_OF_INSTANCES,
    PATH_MEMO,
    InotifyWatches,
    inotify_available,
)
from taskcard.channels.aio import TICK_S, AnyEvent, Backoff, next_tick, wait_first
from taskcard.producers.reports.contract import CONTRACT_DIRS, LINEAGE_FILE
from taskcard.producers.task_card.contract import (
    LEGACY_HOST_LOCK_FILE,
    LEGACY_TALLY_FILE,
    NOTIFICATION_LOCK_FILE,
)

logger = logging.getLogger(__name__)

# What to do when `inotify_init` finds no instance: EMFILE is the user's instance limit (or,
# rarely, this process's open file limit); ENFILE is the whole system's open file table.
_OUT_OF_INSTANCES_FIX: Final = {
    errno.EMFILE: "raise the user's limit (sysctl fs.inotify.max_user_instances), or the"
    " service's open file limit (LimitNOFILE, ulimit -n), or stop what holds them",
    errno.ENFILE: "the system's open file table is full (sysctl fs.file-max): raise it or"
    " close what holds the files",
}

CONTRACT_NAMES: Final = frozenset(CONTRACT_DIRS)
# The watcher thread returns this often (ms) without events; a stop is noticed every `step`.
_RUST_TIMEOUT_MS: Final = 5_000
# After a failure to arm, re-plan after 1 s, then backing off to 10 s while it keeps failing.
_RETRY_INITIAL_S: Final = 1.0
_RETRY_MAX_S: Final = 10.0
# A re-arm waits this many times the duration of the previous arming after it.
_REARM_COST_FACTOR: Final = 9.0
# Reported when something changed directly in a discovery root (no agent id is empty).
ROOTS: Final = ""

# How often the rescan reports its next slice of agents: at the service timer's ticks.
SWEEP_STEP_S: Final = TICK_S
# How often agents whose folders could not be watched (the inotify limit) are reported.
POLL_UNWATCHED_S: Final = 2.0

Backend = Literal["auto", "inotify", "watchfiles"]
# Per agent reported and not yet taken: the contract files events named since
# (`<contract folder>/<file name>`, or the lineage file's name), or None for "anything may
# have changed" (a rescan, a structural event, the report after arming, an overflow).
ChangedFiles = dict[str, set[str] | None]
# What `WatchPlan.classify` tells of an event's path: the agents it concerns, whether it is
# structural, and the contract file it names when that is all it is (its agents, its name).
Classified = tuple[frozenset[str], bool, tuple[frozenset[str], str] | None]
# What `backend="auto"` means; tests switch it to run the same checks on both.
DEFAULT_BACKEND: Backend = "auto"


def resolve_backend(backend: Backend) -> Literal["inotify", "watchfiles"]:
    """`auto`: inotify where the system has it (Linux), watchfiles elsewhere."""
    if backend == "auto":
        return "inotify" if inotify_available() else "watchfiles"
    return backend


def sweep_slices(
    agent_ids: Iterable[str], interval_s: float, step_s: float
) -> list[frozenset[str]]:
    """The fleet cut into the slices one rescan round reports, one per step: as many steps as
    fit in `interval_s` (at least one), the agents dealt out evenly in a stable order."""
    ordered = sorted(agent_ids)
    steps = max(1, min(len(ordered), int(interval_s / step_s))) if ordered else 1
    return [frozenset(ordered[index::steps]) for index in range(steps)]


def _abs(path: Path) -> str:
    return os.path.abspath(path)


# `os.path.split` of the paths events name, remembered as `inotify.child_path` remembers
# their joins (the same few paths change again and again); `split_path(p)[1]` is
# `os.path.basename(p)`.
split_path = functools.lru_cache(maxsize=PATH_MEMO)(os.path.split)


@dataclass
class WatchPlan:
    """The paths one watcher run observes, and how an event path maps to agents.

    `workdirs` maps each agent workdir to its agents. A workdir, and each contract folder
    directly in it (`<workdir>/<one of CONTRACT_DIRS>`), is structural: its creation or
    removal changes the plan; files directly in a contract folder are the agents' files, and
    so is the lineage file directly in the workdir (where both apply, in a workdir nested as
    another agent's contract folder, the innermost workdir wins).
    Those rules are applied to an event's path by splitting it, so the plan keeps one entry
    per workdir instead of a dozen per agent (at 10,000 agents, tens of thousands of path
    strings and dict entries less, twice over while a fresh plan is compared).

    The other maps hold what is not a workdir: `files_in` maps a discovery root to ROOTS;
    `structural` maps discovery roots and the ancestors of missing workdirs to the agents
    concerned; `owners` maps such watched ancestors to the agents (or ROOTS) they stand for.
    """

    paths: tuple[str, ...] = ()
    workdirs: dict[str, frozenset[str]] = field(default_factory=dict)
    files_in: dict[str, frozenset[str]] = field(default_factory=dict)
    structural: dict[str, frozenset[str]] = field(default_factory=dict)
    owners: dict[str, frozenset[str]] = field(default_factory=dict)
    # `classify`, remembered for the last `PATH_MEMO` paths: every change asks it of the
    # same one or two paths (about 120 bytecodes a path), and its answer depends on the path
    # and this plan's maps alone, which are complete once `plan_watch` returns it (a change
    # of the folders makes a new plan, with a memo of its own).
    classify: Callable[[str], Classified] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.classify = functools.lru_cache(maxsize=PATH_MEMO)(self.classify_now)

    def _contract_folder(self, path: str) -> frozenset[str] | None:
        """The agents whose contract folder `path` is, if it is one."""
        workdir, name = split_path(path)
        return self.workdirs.get(workdir) if name in CONTRACT_NAMES else None

    def _standing_for(self, path: str, first: Mapping[str, frozenset[str]]) -> set[str]:
        """The agents `path` stands for as a folder: in `first` (the ancestors watched, or
        what is structural), as a workdir, or as a contract folder directly in one."""
        found: set[str] = set()
        for who in (first.get(path), self.workdirs.get(path), self._contract_folder(path)):
            if who is not None:
                found |= who
        return found

    def unread_names(self) -> frozenset[str]:
        """The names of folders here that `unread` would take for files never read (a
        workdir called `.x.tmp`): events naming them must still be reported."""
        return frozenset(
            name
            for paths in (self.paths, self.structural, self.workdirs)
            for path in paths
            if unread(name := os.path.basename(path))
        )

    def owners_of(self, paths: Iterable[str]) -> set[str]:
        """The agents some of `paths` (watched folders) are watched for."""
        found: set[str] = set()
        for path in paths:
            found |= self._standing_for(path, self.owners)
        return found

    def agents_for(self, event_path: str) -> tuple[frozenset[str], bool]:
        """(agents whose files may have changed, whether the plan must be rebuilt)."""
        agents, stale, _ = self.classify(event_path)
        return agents, stale

    def classify_now(self, event_path: str) -> Classified:
        """`agents_for`, plus the file the event names when it is one of a contract folder's
        files and nothing structural: (its agents, `<contract folder>/<file name>`). Worked
        out each time; `classify` remembers its answers."""
        # Asked for every event path that survives the reader (one or two per change): the
        # path is split once and `_standing_for(event_path, self.structural)` is spelled
        # out here, so its `_contract_folder` look needs no split of its own.
        workdirs = self.workdirs
        folder, name = split_path(event_path)
        agents: set[str] = set()
        for who in (
            self.structural.get(event_path),
            workdirs.get(event_path),
            workdirs.get(folder) if name in CONTRACT_NAMES else None,
        ):
            if who is not None:
                agents |= who
        stale = bool(agents)
        file: tuple[frozenset[str], str] | None = None
        if not unread_match(name):
            structural = frozenset(agents)
            roots = self.files_in.get(folder)
            if roots is not None:
                agents |= roots
            # The innermost workdir wins: a workdir's own lineage file (it sits in the
            # workdir itself, whose root is watched) is a level deeper than the files of a
            # contract folder, so in a workdir nested as another agent's contract folder
            # (`<outer>/reports` as a workdir) it is the inner agent's, not the outer's.
            inner = workdirs.get(folder) if name == LINEAGE_FILE else None
            if inner is not None:
                agents |= inner
                file = (inner - structural, name)
            else:
                parent, folder_name = split_path(folder)  # `_contract_folder(folder)`
                owners = workdirs.get(parent) if folder_name in CONTRACT_NAMES else None
                if owners is not None:
                    agents |= owners
                    file = (owners - structural, folder_name + "/" + name)
        return frozenset(agents), stale, file


def is_writer_temp(name: str) -> bool:
    """Whether `name` is the temp file of an atomic write (`.<name>.<random>.tmp`, renamed
    over the real name once complete): no reader opens it, and reporting its creation would
    read the agent once more, for nothing, before the rename that matters."""
    return name.startswith(".") and name.endswith(".tmp")


# `unread` as one regular expression: the inotify reader asks it of every event's name (an
# atomic write raises about six), and a match is a call into C where the two functions cost
# about 20 bytecodes a name. `(?:.*\.)?` covers ".tmp" itself, which both `startswith(".")`
# and `endswith(".tmp")` accept; DOTALL, since a name may hold a newline.
_UNREAD: Final = re.compile(
    r"(?:\.(?:.*\.)?tmp|"
    + "|".join(
        re.escape(name)
        for name in (LEGACY_TALLY_FILE, LEGACY_HOST_LOCK_FILE, NOTIFICATION_LOCK_FILE)
    )
    + r")\Z",
    re.DOTALL,
)
# `unread(name)`, truthy or not (a match object or None).
unread_match: Final = _UNREAD.match
# The same test of a name as the inotify reader finds it, undecoded: `(buffer, start, end)`,
# the name NUL-padded, as in a `struct inotify_event`. Most events name a writer's temp
# file, dropped so without slicing, stripping and decoding their names (a dozen bytecodes
# and three calls into C each). The same answer as `unread_match` of the decoded name: its
# literals are ASCII, which the file system's encoding (UTF-8, or another that keeps ASCII
# as it is, with `surrogateescape`) turns into those same characters and nothing else into
# them (`test_a_raw_name_is_unread_as_its_decoded_name_is`).
unread_raw_match: Final = re.compile(
    _UNREAD.pattern.removesuffix(r"\Z").encode("ascii") + rb"\0*\Z", re.DOTALL
).match


def unread(name: str) -> bool:
    """Whether a file named `name` in a contract folder is one the service never reads: a
    writer's temp file (`is_writer_temp`), or a lock the notification writers open around
    every append. The producer host keeps its own files (its lock, its refresh tally appended
    to on every tick) in `.taskcard-host/`, a folder of the workdir no watch covers; a host of
    an earlier version still running kept them in `taskcard/` as `.refreshes` and
    `.host.lock`, so those names are ignored too: they say nothing about the card."""
    return unread_match(name) is not None


def _add(mapping: dict[str, frozenset[str]], key: str, who: frozenset[str]) -> None:
    """Map `key` to `who` too. Most paths concern one agent, so they share that agent's one
    set instead of each holding a set of its own (at 10,000 agents: 46 MB down to 14 MB)."""
    known = mapping.get(key)
    if known is None:
        mapping[key] = who
    elif not who <= known:
        mapping[key] = known | who


def plan_watch(workdirs: Mapping[str, Path], roots: Iterable[Path] = ()) -> WatchPlan:
    """The current watch plan for `workdirs` (and discovery `roots`), from a few `stat` calls
    per agent."""
    plan = WatchPlan()
    watched: dict[str, None] = {}
    structural, files_in, owners = plan.structural, plan.files_in, plan.owners
    roots_only = frozenset({ROOTS})
    for root_path in roots:
        root = _abs(root_path)
        _add(structural, root, roots_only)
        _add(files_in, root, roots_only)
        child, parent = root, root
        while not os.path.isdir(parent):
            child, parent = parent, os.path.dirname(parent)
            _add(structural, child, roots_only)
            if parent == child:
                break
        if os.path.isdir(parent):
            watched[parent] = None
            _add(owners, parent, roots_only)
    for agent_id, workdir in workdirs.items():
        mine = frozenset({agent_id})
        root = _abs(workdir)
        _add(plan.workdirs, root, mine)
        if os.path.isdir(root):
            watched[root] = None
            for name in CONTRACT_DIRS:
                folder = os.path.join(root, name)
                if os.path.isdir(folder):
                    watched[folder] = None
            continue
        # Missing: watch the nearest existing ancestor; each step down is structural.
        child, parent = root, os.path.dirname(root)
        while parent != child and not os.path.isdir(parent):
            _add(structural, parent, mine)
            child, parent = parent, os.path.dirname(parent)
        if os.path.isdir(parent):
            watched[parent] = None
            _add(owners, parent, mine)
    plan.paths = tuple(watched)
    return plan


class _Handoff:
    """How the batches of events the loop reads reach the owner of `changes()`.

    Through the queue, as every other batch (the first report, rescans, polls), unless
    `changes()` was given a handler, the owner waits for its next batch (`idle`) and none is
    pending: then the handler takes the batch at once, in the callback that read the events.
    That saves the owner's task a wake-up (a turn of the loop) per change. What the queue
    gives is kept: a batch that arrives while one is pending, or while the owner is busy
    with one, goes into the queue and is merged there (latest wins, one batch under load);
    the rescan's wake-up and the pump's failures still reach the owner through it; and
    nothing is handed over once the iteration ends. A handler that raises ends the
    iteration with that error, raised by `changes()` where the owner waits, as a failure of
    the owner's own loop always did.
    """

    __slots__ = ("failure", "handler", "idle", "queue")

    def __init__(
        self,
        queue: asyncio.Queue[frozenset[str]],
        handler: Callable[[frozenset[str]], None] | None,
    ) -> None:
        self.queue = queue
        self.handler = handler
        self.idle = False  # the owner waits in `changes()` for its next batch
        self.failure: Exception | None = None

    def events(self, batch: frozenset[str]) -> None:
        """A batch of events read by the loop."""
        handler = self.handler
        if handler is None or not self.idle or not self.queue.empty():
            self.queue.put_nowait(batch)
            return
        try:
            handler(batch)
        except Exception as error:
            self.handler = None  # nothing more is handed over: the iteration ends
            self.failure = error
            self.queue.put_nowait(frozenset())  # wakes the owner to raise it


@dataclass
class _Arming:
    """The plan the running watcher observes, and the event that makes it re-arm."""

    plan: WatchPlan | None = None
    rearm: asyncio.Event = field(default_factory=asyncio.Event)


class FleetWatcher:
    """Reports which agents' contract files may have changed, for many workdirs at once."""

    def __init__(
        self,
        workdirs: Mapping[str, Path],
        *,
        debounce_ms: int = 50,
        rescan_interval_s: float = 300.0,
        step_ms: int = 10,
        roots: Iterable[Path] = (),
        sweep_step_s: float = SWEEP_STEP_S,
        backend: Backend | None = None,
    ) -> None:
        self._backend = resolve_backend(backend or DEFAULT_BACKEND)
        self._workdirs = dict(workdirs)
        self._roots = tuple(roots)
        self._arming: _Arming | None = None
        self._debounce_ms = debounce_ms
        self._rescan_interval_s = rescan_interval_s
        self._step_ms = step_ms
        self._sweep_step_wanted_s = sweep_step_s
        self._slices = sweep_slices(self._workdirs, rescan_interval_s, sweep_step_s)
        self._sweep_step_s = rescan_interval_s / len(self._slices)
        self._changed: ChangedFiles = {}

    def take_changed(self, agent_id: str) -> frozenset[str] | None:
        """Which of `agent_id`'s files changed since it was last reported and taken: the
        names events gave (see `ChangedFiles`), or None when anything may have changed.

        An agent that was reported for any other reason than events naming its files (or was
        never taken) answers None, so a reader that honours the names misses nothing the
        watcher saw; the owner takes it for every agent of a batch, before reading it.
        """
        names = self._changed.pop(agent_id, None)
        return None if names is None else frozenset(names)

    def _report_all(self, agents: Iterable[str]) -> None:
        """Mark `agents` as reported for "anything may have changed"."""
        changed = self._changed
        for agent_id in agents:
            changed[agent_id] = None

    def set_workdirs(self, workdirs: Mapping[str, Path]) -> None:
        """Watch these workdirs from now on (agents added or removed while serving)."""
        if dict(workdirs) == self._workdirs:
            return
        self._workdirs = dict(workdirs)
        self._slices = sweep_slices(
            self._workdirs, self._rescan_interval_s, self._sweep_step_wanted_s
        )
        self._sweep_step_s = self._rescan_interval_s / len(self._slices)
        for agent_id in [a for a in self._changed if a not in self._workdirs]:
            del self._changed[agent_id]  # left the fleet: never taken
        if self._arming is not None:
            self._arming.rearm.set()

    def set_roots(self, roots: Iterable[Path]) -> None:
        """Watch these discovery roots from now on (a reload changed `[discover] roots`)."""
        roots = tuple(roots)
        if roots == self._roots:
            return
        self._roots = roots
        if self._arming is not None:
            self._arming.rearm.set()

    def _everyone(self) -> frozenset[str]:
        return frozenset(self._workdirs) | (frozenset({ROOTS}) if self._roots else frozenset())

    async def changes(
        self, handler: Callable[[frozenset[str]], None] | None = None
    ) -> AsyncGenerator[frozenset[str], None]:
        """All agents first, then the agents whose files may have changed, as they change.

        Every agent is reported again within each rescan interval (a slice at a time) and
        after each re-arm. Closing or cancelling the iteration stops the watcher thread.

        `handler`: what the owner does with a batch, when that is synchronous. A batch of
        inotify events read while the owner waits here for its next one, with none pending,
        goes to `handler` at once instead of being yielded (see `_Handoff`); every other
        batch is yielded as without it.
        """
        queue: asyncio.Queue[frozenset[str]] = asyncio.Queue()
        handoff = _Handoff(queue, handler)
        stop = asyncio.Event()
        arming = self._arming = _Arming()
        # Started before the first yield so the watcher arms while the caller reads everyone.
        pump = asyncio.create_task(
            self._pump_inotify(queue, stop, arming, handoff)
            if self._backend == "inotify"
            else self._pump(queue, stop, arming),
            name="taskcard-watcher",
        )
        loop = asyncio.get_running_loop()
        # Each step at a tick of its own clock (`next_tick`): with the one-second step of a
        # fleet of a few hundred agents or more, in the turn of the loop that the service's
        # timer and the serve lock's check take too.
        next_rescan = next_tick(loop.time(), self._sweep_step_s)
        next_slice = 0
        # The rescan step's wake-up: one timer per step, which puts an empty batch in the
        # queue, rather than a timeout (a timer made and cancelled) around every wait for a
        # change. `woken` tells its empty batch from anything else.
        woken = False

        def wake() -> None:
            nonlocal woken
            woken = True
            queue.put_nowait(frozenset())

        timer = loop.call_at(next_rescan, wake)
        try:
            everyone = self._everyone()
            self._report_all(everyone)
            yield everyone
            while True:
                if loop.time() < next_rescan and not woken:
                    # Under load the next batch is often in already. Cancelling this wait
                    # stops us (`Queue.get` passes a cancellation on).
                    if queue.empty():
                        handoff.idle = True  # events read meanwhile may go to the handler
                        try:
                            batch = await queue.get()
                        finally:
                            handoff.idle = False
                    else:
                        batch = queue.get_nowait()
                    merged = set(batch)
                    while not queue.empty():
                        merged |= queue.get_nowait()
                    if handoff.failure is not None:
                        raise handoff.failure
                    if pump.done():
                        pump.result()  # surfaces an unexpected failure of the watcher task
                    if merged:
                        yield frozenset(merged)
                        continue
                    if not woken:
                        continue  # an earlier step's wake-up, taken late: nothing is due
                # The rescan step is due. Taken here, not only when the timer wakes us, so a
                # fleet whose events never pause does not starve the safety net.
                timer.cancel()
                woken = False
                next_rescan = next_tick(loop.time(), self._sweep_step_s)
                timer = loop.call_at(next_rescan, wake)
                next_slice %= len(self._slices)  # the fleet may have shrunk meanwhile
                sweep = self._slices[next_slice]
                next_slice = (next_slice + 1) % len(self._slices)
                if next_slice == 0:
                    self._check_plan(arming)  # stats every workdir: once per round
                    if self._roots:
                        sweep = sweep | {ROOTS}  # and the roots are listed again
                if sweep:
                    self._report_all(sweep)
                    yield sweep
        finally:
            handoff.handler = None
            timer.cancel()
            stop.set()
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    def _check_plan(self, arming: _Arming) -> None:
        """Re-arm when folders appeared or vanished without an event (a safety net)."""
        plan = plan_watch(self._workdirs, self._roots)
        if arming.plan is not None and plan.paths != arming.plan.paths:
            arming.rearm.set()

    async def _pump(
        self, queue: asyncio.Queue[frozenset[str]], stop: asyncio.Event, arming: _Arming
    ) -> None:
        """Run one watcher at a time; re-arm it whenever the plan changes."""
        backoff = Backoff(initial_s=_RETRY_INITIAL_S, max_s=_RETRY_MAX_S)
        while not stop.is_set():
            plan = plan_watch(self._workdirs, self._roots)
            arming.plan, arming.rearm = plan, asyncio.Event()
            if not plan.paths:
                # Nothing exists to watch (no workdir has an existing ancestor): rescan only.
                await wait_first(stop, arming.rearm)
                continue
            try:
                await self._run_plan(plan, queue, AnyEvent(stop, arming.rearm))
            except OSError as exc:
                # Typically a folder vanished between planning and arming; plan again.
                logger.warning("file watcher could not be armed (%s); re-planning", exc)
                await backoff.asleep()
            except Exception:
                # Watching is an optimisation over the rescan: it must not end the service.
                logger.exception("file watcher failed; re-arming")
                await backoff.asleep()
            else:
                backoff.reset()

    async def _pump_inotify(
        self,
        queue: asyncio.Queue[frozenset[str]],
        stop: asyncio.Event,
        arming: _Arming,
        handoff: _Handoff,
    ) -> None:
        """Keep one inotify instance's watches in step with the plan, re-planning on events.

        Unlike a watchfiles re-arm, a re-plan only adds and removes the watches that differ,
        so it reports only the agents of newly watched folders (what changed in them before
        the watch existed); every agent is reported after the first arming. Planning stats
        every workdir, so re-plans are paced like re-arms: at most a tenth of the loop's time.
        """
        loop = asyncio.get_running_loop()
        plan_cost_s = 0.0
        planned_at = 0.0
        rearm_at: asyncio.TimerHandle | None = None

        def on_events(paths: list[str], overflow: bool) -> None:
            nonlocal rearm_at
            plan = arming.plan
            if plan is None:
                return
            agents, stale = _map_changes(plan, paths, self._changed)
            if overflow:
                logger.warning("file events were lost (inotify queue overflow); rereading all")
                everyone = self._everyone()
                self._report_all(everyone)
                agents |= everyone
                stale = True
            if stale and rearm_at is None:
                earliest = planned_at + plan_cost_s * (1 + _REARM_COST_FACTOR)
                rearm_at = loop.call_at(max(earliest, loop.time()), arming.rearm.set)
            if agents:  # last: the handler may run now (see `_Handoff`)
                handoff.events(frozenset(agents))

        out_logged = False
        while True:
            try:
                watches = InotifyWatches(on_events, ignored=unread_raw_match)
                break
            except OSError as exc:
                if exc.errno not in OUT_OF_INSTANCES:
                    logger.warning(
                        "inotify unavailable (%s); watching with watchfiles instead", exc
                    )
                    await self._pump(queue, stop, arming)
                    return
                if not out_logged:
                    out_logged = True
                    logger.error(
                        "no inotify instance left (%s): every agent is re-read every %gs"
                        " instead of watched; %s",
                        exc.strerror,
                        POLL_UNWATCHED_S,
                        _OUT_OF_INSTANCES_FIX[exc.errno],
                    )
            # Degraded: every agent is polled, and an instance asked for again each time.
            everyone = self._everyone()
            self._report_all(everyone)
            queue.put_nowait(frozenset(everyone))
            if await wait_first(stop, timeout_s=POLL_UNWATCHED_S):
                return
        if out_logged:
            logger.warning("an inotify instance is available again: the agents are watched")
        watches.start(loop)
        first = True
        limit_logged = False
        backoff = Backoff(initial_s=_RETRY_INITIAL_S, max_s=_RETRY_MAX_S)
        try:
            while not stop.is_set():
                planned_at = loop.time()
                plan = plan_watch(self._workdirs, self._roots)
                arming.plan, arming.rearm = plan, asyncio.Event()
                watches.kept = plan.unread_names()
                rearm_at = None
                try:
                    added, unwatched = watches.sync(plan.paths)
                except OSError as exc:
                    # Watching is an optimisation over the rescan: it must not end the service.
                    logger.warning("file watches could not be set (%s); re-planning", exc)
                    first = True  # what changed meanwhile is caught by reporting everyone
                    await backoff.asleep()
                    continue
                backoff.reset()
                plan_cost_s = loop.time() - planned_at
                polled = plan.owners_of(unwatched)
                if unwatched and not limit_logged:
                    logger.error(
                        "inotify watch limit reached (fs.inotify.max_user_watches): folders"
                        " not watched: %d (agents: %d); they are polled every %gs instead;"
                        " raise the limit (sysctl fs.inotify.max_user_watches) to watch them",
                        len(unwatched),
                        len(polled),
                        POLL_UNWATCHED_S,
                    )
                limit_logged = bool(unwatched)
                report = self._everyone() if first else plan.owners_of(added) | polled
                first = False
                if report:
                    self._report_all(report)
                    queue.put_nowait(frozenset(report))
                # A folder created between planning and watching raised no event for us:
                # plan once more after the pause a re-plan costs anyway.
                if plan_watch(self._workdirs, self._roots).paths != plan.paths:
                    rearm_at = loop.call_at(
                        planned_at + max(plan_cost_s, 0.001) * (1 + _REARM_COST_FACTOR),
                        arming.rearm.set,
                    )
                while not await wait_first(
                    stop, arming.rearm, timeout_s=POLL_UNWATCHED_S if polled else None
                ):
                    # Degraded: try again for room (one refused call when there is none).
                    added, unwatched = watches.sync(plan.paths)
                    report = polled | plan.owners_of(added)
                    self._report_all(report)
                    queue.put_nowait(frozenset(report))
                    polled = plan.owners_of(unwatched)
                    if not unwatched:
                        logger.warning("inotify watches available again: every folder watched")
                        limit_logged = False
                if rearm_at is not None:
                    rearm_at.cancel()
        finally:
            if rearm_at is not None:
                rearm_at.cancel()
            watches.close()

    async def _run_plan(
        self, plan: WatchPlan, queue: asyncio.Queue[frozenset[str]], stop: AnyEvent
    ) -> None:
        """Watch `plan.paths` until the plan is stale or the service stops.

        Every agent is reported once the watcher is armed: anything that changed between
        planning and arming (or while no watcher ran) is caught by that report. `awatch` arms
        synchronously in its first step, before it first suspends, so a callback scheduled now
        runs after the watches exist.
        """
        everyone = self._everyone()
        loop = asyncio.get_running_loop()
        started_at = loop.time()
        armed_at: list[float] = []

        rearm: asyncio.TimerHandle | None = None

        def on_armed() -> None:
            nonlocal rearm
            armed_at.append(loop.time())
            self._report_all(everyone)
            queue.put_nowait(everyone)
            # A folder created between planning and arming raised no event, so nothing would
            # re-arm for it until the rescan's round ends: compare once more now (as many
            # stats as arming costs anyway) and re-arm, paced, when the plan is already stale.
            if plan_watch(self._workdirs, self._roots).paths != plan.paths:
                cost_s = armed_at[0] - started_at
                rearm = loop.call_at(armed_at[0] + cost_s * _REARM_COST_FACTOR, stop.events[1].set)

        # Imported here: on Linux inotify does the watching and watchfiles (with anyio under
        # it, about 5 MB) is never loaded unless inotify fails.
        from watchfiles import awatch

        loop.call_soon(on_armed)
        try:
            async for raw in awatch(
                *plan.paths,
                watch_filter=None,
                debounce=self._debounce_ms,
                step=self._step_ms,
                stop_event=stop,
                rust_timeout=_RUST_TIMEOUT_MS,
                recursive=False,
                ignore_permission_denied=True,
            ):
                agents, stale = _map_changes(plan, (path for _, path in raw), self._changed)
                if agents:
                    queue.put_nowait(frozenset(agents))
                if stale and rearm is None:
                    # Arming blocks the loop for a time proportional to the number of paths
                    # (about 0.6 s for 2,000 workdirs); pace re-arms so that arming never
                    # takes more than a tenth of the loop's time during a burst of new
                    # folders. The current watcher keeps reporting meanwhile.
                    cost_s = (armed_at[0] if armed_at else loop.time()) - started_at
                    earliest = started_at + cost_s * (1 + _REARM_COST_FACTOR)
                    rearm = loop.call_at(max(earliest, loop.time()), stop.events[1].set)
        finally:
            if rearm is not None:
                rearm.cancel()


def _map_changes(
    plan: WatchPlan, paths: Iterable[str], changed: ChangedFiles
) -> tuple[set[str], bool]:
    """The agents `paths` concern and whether the plan is stale; records in `changed` which
    of each agent's files the events named (everything, for any other kind of event)."""
    agents: set[str] = set()
    stale = False
    for path in paths:
        found, structural, file = plan.classify(path)
        agents |= found
        stale = stale or structural
        if file is not None:
            owners, name = file
            for agent_id in owners:
                if agent_id not in changed:
                    changed[agent_id] = {name}
                else:
                    names = changed[agent_id]
                    if names is not None:
                        names.add(name)
        for agent_id in found if file is None else found - file[0]:
            changed[agent_id] = None
    return agents, stale
