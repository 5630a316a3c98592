"""FleetWatcher: scripted change sets for the mapping, real `tmp_path` runs for the watching."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import inotify_simple
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskcard.bridge.watch.watcher as watcher_module
from taskcard.bridge.watch.watcher import FleetWatcher, is_writer_temp, plan_watch, unread
from taskcard.producers.ledger.contract import LEDGER_DIR, LEDGER_FILE
from taskcard.producers.ledger.store import DEFAULT_LEDGER, Ledger
from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.contract import (
    LEGACY_HOST_LOCK_FILE,
    LEGACY_TALLY_FILE,
    NOTIFICATION_LOCK_FILE,
    CardPaths,
    append_jsonl_line,
    atomic_write,
)

TIMEOUT_S = 20.0


@pytest.fixture(autouse=True, params=["inotify", "watchfiles"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every watching test runs on both backends: inotify (Linux) and watchfiles."""
    name: str = request.param
    monkeypatch.setattr(watcher_module, "DEFAULT_BACKEND", name)
    return name


# -- the plan, pure -------------------------------------------------------------------


def test_plan_watches_roots_and_existing_contract_folders_only(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    (ready / "taskcard").mkdir(parents=True)
    (ready / "src" / "deep").mkdir(parents=True)
    missing = tmp_path / "later" / "agent"
    plan = plan_watch({"ready": ready, "later": missing})
    assert set(plan.paths) == {str(ready), str(ready / "taskcard"), str(tmp_path)}
    assert plan.agents_for(str(ready / "taskcard" / "status")) == ({"ready"}, False)
    assert plan.agents_for(str(ready / "logs")) == ({"ready"}, True)
    assert plan.agents_for(str(ready / "src")) == (set(), False)
    assert plan.agents_for(str(ready / "README.md")) == (set(), False)
    assert plan.agents_for(str(tmp_path / "later")) == ({"later"}, True)
    assert plan.agents_for(str(tmp_path / "unrelated")) == (set(), False)


def test_the_temp_files_of_atomic_writes_are_not_reported(tmp_path: Path) -> None:
    (tmp_path / "w" / "taskcard").mkdir(parents=True)
    plan = plan_watch({"a": tmp_path / "w"})
    folder = tmp_path / "w" / "taskcard"
    assert plan.agents_for(str(folder / ".card.md.k2j4x9.tmp")) == (set(), False)
    assert plan.agents_for(str(folder / "card.md")) == ({"a"}, False)
    assert plan.agents_for(str(folder / "card.tmp")) == ({"a"}, False)  # not hidden: a file
    assert plan.agents_for(str(folder / ".hidden")) == ({"a"}, False)
    # A host of an earlier version kept its refresh tally (appended on every tick) and its
    # workdir lock here; the service never reads either.
    assert plan.agents_for(str(folder / ".refreshes")) == (set(), False)
    assert plan.agents_for(str(folder / ".host.lock")) == (set(), False)
    # Today's host keeps them in its own folder beside the card's, which nothing watches; the
    # same names in a contract folder are someone's files, and reported.
    host = tmp_path / "w" / ".taskcard-host"
    assert str(host) not in plan.paths
    assert plan.agents_for(str(host)) == (set(), False)
    for name in ("lock", "refreshes", "watch-seq"):
        assert plan.agents_for(str(host / name)) == (set(), False)
        assert plan.agents_for(str(folder / name)) == ({"a"}, False)


def test_the_names_never_read_are_the_temp_files_tally_and_locks_alone() -> None:
    """`unread` (one regular expression, asked of every event's name) answers as the plain
    rules: a name starting with "." and ending with ".tmp", or the tally or a lock."""
    fixed = (LEGACY_TALLY_FILE, LEGACY_HOST_LOCK_FILE, NOTIFICATION_LOCK_FILE)
    names = [
        *fixed,
        *(f"{name}x" for name in fixed),
        *(f"x{name}" for name in fixed),
        *(f".{name}.tmp" for name in fixed),
        ".tmp",
        "..tmp",
        "...tmp",
        ".x.tmp",
        ".status.a1b2c3.tmp",
        ".a\nb.tmp",
        ".tmp\n",
        ".x.tmp\n",
        "x.tmp",
        ".tmpx",
        ".x.tmp.",
        ".x.TMP",
        "tmp",
        ".",
        "",
        "status",
        "taskcard.md",
        ".hidden",
        "\udcff.x.tmp",
        ".\udcff.tmp",
    ]
    for name in names:
        plain = name in fixed or (name.startswith(".") and name.endswith(".tmp"))
        assert unread(name) is plain, name
        assert is_writer_temp(name) is (name.startswith(".") and name.endswith(".tmp")), name


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from([b".", b"tmp", b".tmp", b"x", b"\n", b"\xff", "\u00e9".encode(), b"lock"])
        | st.sampled_from(
            [n.encode() for n in (LEGACY_TALLY_FILE, LEGACY_HOST_LOCK_FILE, NOTIFICATION_LOCK_FILE)]
        ),
        max_size=6,
    ),
    st.integers(min_value=0, max_value=16),
)
def test_a_raw_name_is_unread_as_its_decoded_name_is(pieces: list[bytes], padding: int) -> None:
    """The inotify reader asks `unread_raw_match` of a name as the kernel gives it (inside
    the read buffer, NUL-padded, undecoded): the same answer as `unread` of the name
    decoded as the reader decodes the names it keeps."""
    raw = b"".join(pieces)
    buffer = b"\x01" * 16 + raw + b"\0" * padding + b"\x02" * 8
    start, end = 16, 16 + len(raw) + padding
    decoded = raw.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
    assert bool(watcher_module.unread_raw_match(buffer, start, end)) is unread(decoded), raw


def test_an_event_path_maps_as_the_plans_rules_say(tmp_path: Path) -> None:
    """`WatchPlan.classify` (spelled out for speed) answers as its rules composed from the
    plan's own pieces: what the path stands for as a folder, then the file it names in a
    contract folder or as a workdir's lineage file, the innermost workdir winning; over
    nested workdirs, shared workdirs, a missing workdir and a discovery root."""
    outer, shared = tmp_path / "outer", tmp_path / "shared"
    nested = outer / "reports"  # a workdir that is also the outer agent's contract folder
    for folder in (outer / "taskcard", nested / "taskcard", shared / "logs"):
        folder.mkdir(parents=True)
    root = tmp_path / "root"
    root.mkdir()
    plan = plan_watch(
        {
            "outer": outer,
            "nested": nested,
            "s1": shared,
            "s2": shared,
            "gone": tmp_path / "missing" / "deeper" / "w",
        },
        roots=[root],
    )

    def by_the_rules(path: str) -> tuple[set[str], bool, tuple[frozenset[str], str] | None]:
        agents = plan._standing_for(path, plan.structural)
        stale = bool(agents)
        folder, name = os.path.split(path)
        file = None
        if not unread(name):
            structural = frozenset(agents)
            agents |= plan.files_in.get(folder, frozenset())
            inner = plan.workdirs.get(folder) if name == "lineage.json" else None
            if inner is not None:
                agents |= inner
                file = (inner - structural, name)
            elif (owners := plan._contract_folder(folder)) is not None:
                agents |= owners
                file = (owners - structural, os.path.basename(folder) + "/" + name)
        return agents, stale, file

    places = [
        outer,
        nested,
        shared,
        root,
        tmp_path,
        tmp_path / "missing",
        tmp_path / "missing" / "deeper",
        tmp_path / "missing" / "deeper" / "w",
        tmp_path / "missing" / "deeper" / "w" / "taskcard",
        *(base / name for base in (outer, nested, shared) for name in ("taskcard", "logs")),
        outer / "elsewhere",
    ]
    names = ["status", "taskcard.md", "lineage.json", "reports", "taskcard", "x", ".a.b.tmp"]
    paths = {str(place) for place in places} | {
        str(place / name) for place in places for name in names
    }
    for path in sorted(paths):
        assert plan.classify(path) == by_the_rules(path), path


def test_a_plan_remembers_how_a_path_maps_and_a_new_plan_maps_it_anew(tmp_path: Path) -> None:
    """Each change asks its plan about the same few paths: the answer is remembered, the
    same as working it out again; a folder that appears makes a new plan, which is asked
    afresh (a remembered answer never outlives its plan)."""
    workdir = tmp_path / "a"
    (workdir / "taskcard").mkdir(parents=True)
    body = str(workdir / "taskcard" / "status")
    parent = tmp_path / "x"  # agent b's workdir, x/b, is not there yet
    agents = {"a": workdir, "b": parent / "b"}
    plan = plan_watch(agents)
    first = plan.classify(body)
    assert first == plan.classify_now(body) == ({"a"}, False, ({"a"}, "taskcard/status"))
    assert plan.classify(body) is first
    assert plan.classify(str(parent)) == plan.classify_now(str(parent)) == ({"b"}, True, None)
    parent.mkdir()
    fresh = plan_watch(agents)
    assert fresh.classify(str(parent)) == (set(), False, None)
    assert fresh.classify(body) == first


def test_a_workdir_inside_another_agents_contract_folder_maps_to_both(tmp_path: Path) -> None:
    """The plan keeps one entry per workdir and applies the contract rules to an event's path
    by splitting it; nested workdirs must still reach exactly the agents they did."""
    outer = tmp_path / "outer"
    inner = outer / "taskcard"  # agent b lives in agent a's card folder
    (inner / "logs").mkdir(parents=True)
    plan = plan_watch({"a": outer, "b": inner, "c": tmp_path / "c"})
    assert plan.agents_for(str(inner / "status")) == ({"a"}, False)
    assert plan.agents_for(str(inner)) == ({"a", "b"}, True)
    assert plan.agents_for(str(inner / "logs")) == ({"a", "b"}, True)  # also a file of a
    assert plan.agents_for(str(inner / "logs" / "events.jsonl")) == ({"b"}, False)
    # The lineage file in b's own workdir is b's: the innermost workdir wins.
    assert plan.classify(str(inner / "lineage.json")) == (
        {"b"},
        False,
        (frozenset({"b"}), "lineage.json"),
    )
    assert plan.classify(str(outer / "lineage.json"))[2] == (frozenset({"a"}), "lineage.json")
    assert plan.agents_for(str(inner / "src" / "x")) == (set(), False)
    assert plan.owners_of([str(inner)]) == {"a", "b"}
    assert plan.owners_of([str(outer), str(inner / "logs")]) == {"a", "b"}
    assert plan.owners_of([str(tmp_path)]) == {"c"}  # watched for the missing workdir
    assert plan.agents_for(str(tmp_path / "c")) == ({"c"}, True)
    # A contract folder of a workdir missing at planning time: it exists by now, so re-plan.
    assert plan.agents_for(str(tmp_path / "c" / "logs")) == ({"c"}, True)
    assert plan.agents_for(str(tmp_path / "c" / "notes")) == (set(), False)


async def test_an_atomic_write_is_reported_once_for_its_rename(tmp_path: Path) -> None:
    """The temp file's creation, writes and fsync raise events too; only the rename counts,
    so the agent is read once per write, and only once the new content is in place."""
    paths = CardPaths(tmp_path / "a")
    paths.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"a": paths.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a"}) as changes:
        for _ in range(5):
            # From another thread, as another process would: the loop runs meanwhile.
            await asyncio.to_thread(atomic_write, paths.body, b"# card")
            assert await changes.next() == {"a"}
            with pytest.raises(TimeoutError):
                await changes.next(timeout_s=0.5)


def test_agents_sharing_a_workdir_are_reported_together(tmp_path: Path) -> None:
    (tmp_path / "w" / "logs").mkdir(parents=True)
    plan = plan_watch({"a": tmp_path / "w", "b": tmp_path / "w"})
    assert plan.agents_for(str(tmp_path / "w" / "logs" / "events.jsonl")) == ({"a", "b"}, False)
    assert len(plan.paths) == len(set(plan.paths)) == 2


# -- real watching ---------------------------------------------------------------------


class Collector:
    """Consumes `changes()` in a task, so tests can wait with timeouts without cancelling the
    generator itself (cancelling its `__anext__` would close it)."""

    def __init__(self, watcher: FleetWatcher) -> None:
        self.batches: asyncio.Queue[frozenset[str]] = asyncio.Queue()
        self.seen: list[frozenset[str]] = []
        self._task = asyncio.create_task(self._run(watcher))

    async def _run(self, watcher: FleetWatcher) -> None:
        async for batch in watcher.changes():
            self.seen.append(batch)
            self.batches.put_nowait(batch)

    async def next(self, timeout_s: float = TIMEOUT_S) -> frozenset[str]:
        return await asyncio.wait_for(self.batches.get(), timeout_s)

    async def until(self, accept: Callable[[frozenset[str]], bool]) -> frozenset[str]:
        async def scan() -> frozenset[str]:
            while True:
                batch = await self.batches.get()
                if accept(batch):
                    return batch

        return await asyncio.wait_for(scan(), TIMEOUT_S)

    async def settle(self, quiet_s: float = 1.0) -> None:
        """Take every batch until none comes for `quiet_s`: what earlier writes still raise."""
        with contextlib.suppress(TimeoutError):
            while True:
                await self.next(timeout_s=quiet_s)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self._task, TIMEOUT_S)


@contextlib.asynccontextmanager
async def collecting(watcher: FleetWatcher, everyone: set[str]) -> AsyncIterator[Collector]:
    """A collector whose watcher reported everyone and then armed (everyone again)."""
    collector = Collector(watcher)
    try:
        assert await collector.next() == everyone
        assert await collector.next() == everyone
        yield collector
    finally:
        await collector.close()


async def test_first_all_agents_then_changed_ones(tmp_path: Path) -> None:
    a, b = CardPaths(tmp_path / "a"), CardPaths(tmp_path / "b")
    for paths in (a, b):
        paths.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"a": a.workdir, "b": b.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a", "b"}) as changes:
        atomic_write(b.status, b"active")
        assert await changes.next() == {"b"}


async def test_the_producer_hosts_own_folder_and_its_tally_are_never_reported(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """A real task card host on agent a: its private folder appearing, its lock, its id
    counter and the refresh tally it appends to on every refresh cost the watcher nothing;
    the next batch after them is b's change alone."""
    a, b = CardPaths(tmp_path / "a"), CardPaths(tmp_path / "b")
    for paths in (a, b):
        paths.taskcard_dir.mkdir(parents=True)
    (a.workdir / "r.py").write_text('print("# Work\\nsteady")\n')
    envelope = {"action": "start", "input": {"renderer_path": "r.py", "interval_s": 3600}}
    watcher = FleetWatcher({"a": a.workdir, "b": b.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a", "b"}) as changes:
        card = await asyncio.to_thread(
            TaskCard, a.workdir, runtime_dir=runtime_dir, environ={"PATH": os.defpath}
        )
        try:
            assert (a.workdir / ".taskcard-host" / "lock").is_file()
            await asyncio.to_thread(atomic_write, b.status, b"active")
            assert await changes.next() == {"b"}
            started = await asyncio.to_thread(card.call, {**envelope, "reasoning": "t"})
            assert started["status"] == "watching", started
            await changes.settle()  # the card's own files: a's, reported
            for _ in range(3):
                retry = {"action": "retry", "input": {"watch_id": "tc_1"}, "reasoning": "t"}
                assert (await asyncio.to_thread(card.call, retry))["status"] == "watching"
            assert (
                a.workdir / ".taskcard-host" / "refreshes"
            ).read_bytes() == b"tc_1\n0\n1\n2\n3\n"
            await asyncio.to_thread(atomic_write, b.status, b"inactive")
            assert await changes.next() == {"b"}
        finally:
            await asyncio.to_thread(card.close)


async def test_file_names_with_odd_bytes_are_reported_and_break_nothing(
    tmp_path: Path, backend: str
) -> None:
    """An agent may create any name: bytes that are no UTF-8, a newline, markup. The change
    is reported for its agent, and the watcher goes on for everyone. (watchfiles cannot
    decode such a name: its watcher fails and is re-armed, which reports every agent.)"""
    a, b = CardPaths(tmp_path / "a"), CardPaths(tmp_path / "b")
    for paths in (a, b):
        paths.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"a": a.workdir, "b": b.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a", "b"}) as changes:
        odd = a.taskcard_dir / os.fsdecode(b"\xff\xfe\n<b>*x*<i>.tmp\x1b[2J")
        odd.write_bytes(b"x")
        reported = await changes.next()
        assert reported == {"a"} if backend == "inotify" else "a" in reported
        await changes.settle()  # the events the write above still raises
        atomic_write(b.status, b"active")
        assert await changes.next() == {"b"}


async def test_notifications_and_events_folders_are_watched(tmp_path: Path) -> None:
    paths = CardPaths(tmp_path / "a")
    paths.notification_dir.mkdir(parents=True)
    paths.logs_dir.mkdir()
    async with collecting(FleetWatcher({"a": paths.workdir}, rescan_interval_s=3600), {"a"}) as (
        changes
    ):
        append_jsonl_line(paths.notifications, {"id": "1", "source": "x"})
        assert await changes.next() == {"a"}
        append_jsonl_line(paths.events, {"kind": "text"})
        assert await changes.next() == {"a"}


async def test_the_files_events_named_are_told_and_anything_else_means_everything(
    tmp_path: Path,
) -> None:
    """`take_changed` names the contract files events named since the agent was last taken
    (the lineage file in the workdir itself included), and answers None ("read everything")
    after any other report: the first one, a folder appearing."""
    a = CardPaths(tmp_path / "a")
    a.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"a": a.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a"}) as changes:
        assert watcher.take_changed("a") is None
        atomic_write(a.body, b"body")
        assert await changes.next() == {"a"}
        assert watcher.take_changed("a") == frozenset({"taskcard/taskcard.md"})
        atomic_write(a.status, b"active")
        atomic_write(a.workdir / "lineage.json", b"{}")
        named: set[str] = set()
        while named != {"taskcard/status", "lineage.json"}:  # however the backend batches them
            assert await changes.next() == {"a"}
            taken = watcher.take_changed("a")
            assert taken is not None
            named |= taken
        atomic_write(a.body, b"again")
        (a.workdir / "logs").mkdir()  # structural: the names no longer say it all
        assert "a" in await changes.next()
        await changes.settle()  # the rest of both changes' batches
        assert watcher.take_changed("a") is None


async def write_until_reported_alone(
    changes: Collector, agent: str, write: Callable[[], object]
) -> None:
    """Write until a batch names only `agent`: re-arming has settled and its files are watched."""
    for _ in range(50):
        write()
        try:
            batch = await changes.next(timeout_s=1.0)
        except TimeoutError:
            continue
        if batch == {agent}:
            return
    raise AssertionError(f"files of {agent} are not watched")


async def watched_here_and_not_there(changes: Collector, paths: CardPaths, there: Path) -> None:
    """Agent "a"'s contract folder, made anew under its name, is watched, and `there` (the
    folder that name led to before) no longer counts for the agent."""
    await write_until_reported_alone(changes, "a", lambda: atomic_write(paths.status, b"active"))
    await changes.settle()  # what the writes above still raise
    (there / "status").write_bytes(b"elsewhere")
    with pytest.raises(TimeoutError):
        await changes.next(timeout_s=1.0)


async def test_folders_and_workdirs_appearing_later_are_picked_up(tmp_path: Path) -> None:
    early = CardPaths(tmp_path / "early")
    early.workdir.mkdir()
    late = CardPaths(tmp_path / "not" / "yet" / "late")
    watcher = FleetWatcher({"early": early.workdir, "late": late.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"early", "late"}) as changes:
        # A contract folder created after the start: the watcher re-arms, then sees its files.
        early.taskcard_dir.mkdir()
        await changes.until(lambda batch: "early" in batch)
        await write_until_reported_alone(
            changes, "early", lambda: atomic_write(early.status, b"active")
        )
        # A workdir created after the start, several levels deep.
        late.taskcard_dir.mkdir(parents=True)
        await changes.until(lambda batch: "late" in batch)
        await write_until_reported_alone(
            changes, "late", lambda: atomic_write(late.status, b"active")
        )


async def test_a_workdir_named_like_a_temp_file_is_still_followed(tmp_path: Path) -> None:
    """Events naming a writer's temp file are dropped as they are read, but a workdir may
    carry such a name too: its appearance (here a symlink, which the kernel does not mark as
    a folder) and its files are reported all the same."""
    real = CardPaths(tmp_path / "real")
    real.taskcard_dir.mkdir(parents=True)
    link = tmp_path / "fleet" / ".agent.tmp"
    link.parent.mkdir()
    watcher = FleetWatcher({"a": link}, rescan_interval_s=3600)
    async with collecting(watcher, {"a"}) as changes:
        link.symlink_to(real.workdir)
        await changes.until(lambda batch: "a" in batch)
        await write_until_reported_alone(
            changes, "a", lambda: atomic_write(CardPaths(link).status, b"active")
        )


async def test_a_vanished_and_recreated_folder_is_watched_again(tmp_path: Path) -> None:
    paths, other = CardPaths(tmp_path / "a"), CardPaths(tmp_path / "b")
    paths.logs_dir.mkdir(parents=True)
    other.workdir.mkdir()
    watcher = FleetWatcher({"a": paths.workdir, "b": other.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a", "b"}) as changes:
        os.rmdir(paths.logs_dir)
        await changes.until(lambda batch: "a" in batch)  # seen going; re-planned without it
        paths.logs_dir.mkdir()
        await changes.until(lambda batch: "a" in batch)  # seen coming back
        await write_until_reported_alone(
            changes, "a", lambda: append_jsonl_line(paths.events, {"kind": "text"})
        )


async def test_unrelated_files_in_a_workdir_are_not_reported(tmp_path: Path) -> None:
    noisy, quiet = CardPaths(tmp_path / "noisy"), CardPaths(tmp_path / "quiet")
    (noisy.workdir / "src" / "deep").mkdir(parents=True)
    noisy.taskcard_dir.mkdir()
    quiet.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"noisy": noisy.workdir, "quiet": quiet.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"noisy", "quiet"}) as changes:
        for index in range(20):
            (noisy.workdir / "src" / "deep" / f"f{index}.py").write_text("x")
            (noisy.workdir / f"top{index}.txt").write_text("x")
        atomic_write(quiet.status, b"active")
        await changes.until(lambda batch: "quiet" in batch)
        assert all("noisy" not in batch for batch in changes.seen[2:]), changes.seen


async def test_periodic_rescan_reports_everyone(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    watcher = FleetWatcher({"a": tmp_path / "a", "b": tmp_path / "b"}, rescan_interval_s=0.2)
    collector = Collector(watcher)
    try:
        for _ in range(4):
            assert await collector.next() == {"a", "b"}
    finally:
        await collector.close()


class _Rewriter:
    """A busy agent: rewrites one file atomically every 2 ms, in a thread of its own, from
    `start()` until `stop()`."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            atomic_write(self._path, b"active")
            time.sleep(0.002)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


async def test_the_rescan_comes_round_while_events_keep_coming(tmp_path: Path) -> None:
    """A busy fleet must not starve the safety net: with a batch always waiting when the
    consumer asks for the next one, the quiet agent is still reported by the rescan."""
    busy, quiet = CardPaths(tmp_path / "busy"), CardPaths(tmp_path / "quiet")
    busy.taskcard_dir.mkdir(parents=True)
    quiet.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"busy": busy.workdir, "quiet": quiet.workdir}, rescan_interval_s=0.4)
    writer = _Rewriter(busy.status)
    batches = watcher.changes()
    try:
        assert await batches.__anext__() == {"busy", "quiet"}
        while await asyncio.wait_for(batches.__anext__(), TIMEOUT_S) != {"busy", "quiet"}:
            pass  # until the watches are armed (everyone reported again)
        writer.start()
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert time.monotonic() < deadline, "the rescan never came round"
            batch = await asyncio.wait_for(batches.__anext__(), TIMEOUT_S)
            if "quiet" in batch:
                break
            await asyncio.sleep(0.05)  # the consumer's own work: the next batch piles up
    finally:
        writer.stop()
        await batches.aclose()


async def test_cancelling_the_consumer_stops_the_watcher(tmp_path: Path) -> None:
    (tmp_path / "a" / "taskcard").mkdir(parents=True)
    watcher = FleetWatcher({"a": tmp_path / "a"}, rescan_interval_s=3600)
    reached = asyncio.Event()

    async def consume() -> None:
        async for _ in watcher.changes():
            reached.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(reached.wait(), TIMEOUT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, TIMEOUT_S)
    assert [t for t in asyncio.all_tasks() if t.get_name() == "taskcard-watcher"] == []


async def test_no_agents_yields_an_empty_set_and_closes(tmp_path: Path) -> None:
    changes = FleetWatcher({}, rescan_interval_s=3600).changes()
    assert await anext(changes) == frozenset()
    await changes.aclose()


async def test_a_folder_made_between_planning_and_arming_is_watched_soon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract folder appears after the plan was made and before the watches exist, so
    no event tells of it; the watcher notices at arming, not only at the end of a rescan."""
    paths = CardPaths(tmp_path / "a")
    paths.workdir.mkdir()
    real_plan = watcher_module.plan_watch
    planned: list[int] = []

    def plan_then_make_the_folder(workdirs: dict[str, Path], roots: object = ()) -> object:
        plan = real_plan(workdirs, roots)  # type: ignore[arg-type]
        if not planned:
            paths.taskcard_dir.mkdir()  # the race, made certain
        planned.append(1)
        return plan

    monkeypatch.setattr(watcher_module, "plan_watch", plan_then_make_the_folder)
    watcher = FleetWatcher({"a": paths.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a"}) as changes:
        await write_until_reported_alone(
            changes, "a", lambda: atomic_write(paths.status, b"active")
        )
    assert len(planned) >= 2, "planned again once the folder was found at arming"


async def test_a_deleted_and_recreated_workdir_is_watched_again(tmp_path: Path) -> None:
    paths = CardPaths(tmp_path / "a")
    paths.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"a": paths.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a"}) as changes:
        shutil.rmtree(paths.workdir)
        await changes.until(lambda batch: "a" in batch)
        paths.taskcard_dir.mkdir(parents=True)
        await write_until_reported_alone(
            changes, "a", lambda: atomic_write(paths.status, b"active")
        )


async def test_a_contract_folder_renamed_away_is_no_longer_followed(tmp_path: Path) -> None:
    """The folder moved elsewhere keeps its inode: writes there must not count for the agent,
    and a new folder under the old name is watched."""
    paths = CardPaths(tmp_path / "a")
    paths.taskcard_dir.mkdir(parents=True)
    moved = tmp_path / "moved"
    watcher = FleetWatcher({"a": paths.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a"}) as changes:
        os.rename(paths.taskcard_dir, moved)
        await changes.until(lambda batch: "a" in batch)
        paths.taskcard_dir.mkdir()
        await watched_here_and_not_there(changes, paths, moved)


async def test_a_symlinked_contract_folder_replaced_by_a_folder_is_watched_again(
    tmp_path: Path,
) -> None:
    """A watch follows the folder a symlink named when it was made; removing the symlink
    ends nothing on that folder. A real folder made under the same name must still be
    watched, and the old target no longer count for the agent."""
    paths = CardPaths(tmp_path / "a")
    paths.workdir.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    paths.taskcard_dir.symlink_to(target)
    watcher = FleetWatcher({"a": paths.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a"}) as changes:
        paths.taskcard_dir.unlink()
        paths.taskcard_dir.mkdir()
        await changes.until(lambda batch: "a" in batch)
        await watched_here_and_not_there(changes, paths, target)


async def test_at_the_watch_limit_unwatched_agents_are_polled_and_logged(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    backend: str,
) -> None:
    """The kernel refuses watches past `fs.inotify.max_user_watches` (ENOSPC): the agents
    left without watches are named in an error and reported every poll instead."""
    if backend != "inotify":
        pytest.skip("the limit path belongs to the inotify backend")
    real_add = inotify_simple.INotify.add_watch
    granted: list[str] = []
    limit = [2]

    def add_watch_with_a_limit(self: object, path: str, mask: int) -> int:
        if len(granted) >= limit[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        granted.append(path)
        result: int = real_add(self, path, mask)
        return result

    monkeypatch.setattr(inotify_simple.INotify, "add_watch", add_watch_with_a_limit)
    monkeypatch.setattr(watcher_module, "POLL_UNWATCHED_S", 0.2)
    watched, starved = CardPaths(tmp_path / "a"), CardPaths(tmp_path / "b")
    watched.taskcard_dir.mkdir(parents=True)
    starved.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"a": watched.workdir, "b": starved.workdir}, rescan_interval_s=3600)
    with caplog.at_level(logging.ERROR):
        async with collecting(watcher, {"a", "b"}) as changes:
            for _ in range(3):  # polled again and again, with nothing written
                await changes.until(lambda batch: batch == {"b"})
            atomic_write(watched.status, b"active")
            await changes.until(lambda batch: "a" in batch)
            assert granted == [str(watched.workdir), str(watched.taskcard_dir)]
            limit[0] = 100  # the operator raised the limit: watched from the next poll on
            await write_until_reported_alone(
                changes, "b", lambda: atomic_write(starved.status, b"active")
            )
            await changes.settle()  # what the writes above still raise
            with pytest.raises(TimeoutError):  # no longer polled
                await changes.next(timeout_s=1.0)
            atomic_write(starved.status, b"done")  # but watched
            assert await changes.next() == {"b"}
    assert any("max_user_watches" in r.getMessage() for r in caplog.records)


async def test_with_no_watch_to_be_had_every_agent_is_polled_until_there_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Another process of the user holds every watch: not one folder can be watched, the
    watcher keeps polling (it does not end) and watches once the limit allows it."""
    if backend != "inotify":
        pytest.skip("the limit path belongs to the inotify backend")
    real_add = inotify_simple.INotify.add_watch
    room = [False]

    def add_watch_without_room(self: object, path: str, mask: int) -> int:
        if not room[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        result: int = real_add(self, path, mask)
        return result

    monkeypatch.setattr(inotify_simple.INotify, "add_watch", add_watch_without_room)
    monkeypatch.setattr(watcher_module, "POLL_UNWATCHED_S", 0.2)
    paths = CardPaths(tmp_path / "a")
    paths.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"a": paths.workdir}, rescan_interval_s=3600)
    async with collecting(watcher, {"a"}) as changes:
        for _ in range(3):  # polled again and again, with nothing written
            assert await changes.next() == {"a"}
        room[0] = True
        await changes.settle()  # the polls still under way, and the one that finds room
        atomic_write(paths.status, b"active")  # watched now
        assert await changes.next() == {"a"}


async def test_the_ledger_is_named_to_every_agent_of_its_workdir(tmp_path: Path) -> None:
    """The ledger row is looked at again only when the watcher names the ledger (or says
    "everything"): its folder appearing or vanishing is structural (None), a write and a
    removal of the file name it, to each agent sharing the workdir."""
    workdir = tmp_path / "shared"
    workdir.mkdir()
    watcher = FleetWatcher({"a": workdir, "b": workdir}, rescan_interval_s=3600)
    ledger_name = f"{LEDGER_DIR}/{LEDGER_FILE}"
    async with collecting(watcher, {"a", "b"}) as changes:
        (workdir / LEDGER_DIR).mkdir()
        assert await changes.next() == {"a", "b"}
        await changes.settle()
        assert (watcher.take_changed("a"), watcher.take_changed("b")) == (None, None)
        Ledger(workdir / DEFAULT_LEDGER).init("train-7", "p", ["prep"])
        assert await changes.next() == {"a", "b"}
        await changes.settle()  # however the backend batches the writes
        for agent in ("a", "b"):
            taken = watcher.take_changed(agent)
            assert taken is not None and ledger_name in taken, (agent, taken)
        (workdir / DEFAULT_LEDGER).unlink()
        assert await changes.next() == {"a", "b"}
        await changes.settle()
        for agent in ("a", "b"):
            assert watcher.take_changed(agent) == {ledger_name}
        shutil.rmtree(workdir / LEDGER_DIR)
        assert await changes.next() == {"a", "b"}
        await changes.settle()
        assert (watcher.take_changed("a"), watcher.take_changed("b")) == (None, None)
        (workdir / "elsewhere").mkdir()
        (workdir / LEDGER_DIR).symlink_to(workdir / "elsewhere")  # replaced by a symlink
        assert await changes.next() == {"a", "b"}
        await changes.settle()
        assert (watcher.take_changed("a"), watcher.take_changed("b")) == (None, None)


# -- the handler: a change read while the owner waits is handled at once ------------------


class Handled:
    """Consumes `changes(handler)` as the service does: yielded batches go to the same
    handler; records which way each batch came and what the handler found."""

    def __init__(self, watcher: FleetWatcher, fail: Exception | None = None) -> None:
        self.watcher = watcher
        self.fail = fail
        self.direct: list[frozenset[str]] = []  # handed over in the reading callback
        self.yielded: list[frozenset[str]] = []
        self.taken: dict[str, frozenset[str] | None] = {}
        self.busy = False  # the owner is inside its loop body with a yielded batch
        self.while_busy = 0  # handler calls made while it was
        self.direct_arrived = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    def handle(self, batch: frozenset[str], *, direct: bool = True) -> None:
        if direct:
            self.while_busy += self.busy
            self.direct.append(batch)
            self.direct_arrived.set()
        for agent_id in batch:
            self.taken[agent_id] = self.watcher.take_changed(agent_id)
        if self.fail is not None and direct:
            raise self.fail

    async def _run(self) -> None:
        async for batch in self.watcher.changes(self.handle):
            self.yielded.append(batch)
            self.handle(batch, direct=False)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, TIMEOUT_S)


async def test_with_a_handler_a_change_is_handled_where_it_is_read(
    tmp_path: Path, backend: str
) -> None:
    """inotify: a change read while the owner waits goes to the handler at once, with the
    files it named; watchfiles (a thread, no reading callback) yields it as before."""
    a = CardPaths(tmp_path / "a")
    a.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"a": a.workdir}, rescan_interval_s=3600)
    owner = Handled(watcher)
    try:
        await eventually_true(lambda: len(owner.yielded) >= 2)  # everyone, then armed
        before = len(owner.yielded)
        atomic_write(a.body, b"# body")
        await eventually_true(lambda: owner.taken.get("a") == {"taskcard/taskcard.md"})
        if backend == "inotify":
            assert owner.direct == [frozenset({"a"})]
            assert len(owner.yielded) == before
        else:
            assert owner.direct == []
    finally:
        await owner.close()


async def test_a_failing_handler_ends_the_iteration_with_its_error(
    tmp_path: Path, backend: str
) -> None:
    """What the handler raises where the events are read is raised by `changes()` where the
    owner waits, as a failure of the owner's own loop would be: it is not lost in the
    loop's exception handler while the watcher carries on."""
    if backend == "watchfiles":
        pytest.skip("watchfiles batches are always yielded")
    a = CardPaths(tmp_path / "a")
    a.taskcard_dir.mkdir(parents=True)
    watcher = FleetWatcher({"a": a.workdir}, rescan_interval_s=3600)
    owner = Handled(watcher, fail=RuntimeError("the owner's bug"))
    await eventually_true(lambda: len(owner.yielded) >= 2)
    atomic_write(a.body, b"# body")
    with pytest.raises(RuntimeError, match="the owner's bug"):
        await asyncio.wait_for(owner.task, TIMEOUT_S)
    assert owner.direct == [frozenset({"a"})]
    assert [t for t in asyncio.all_tasks() if t.get_name() == "taskcard-watcher"] == []


async def test_the_handler_never_runs_while_the_owner_handles_a_batch(
    tmp_path: Path, backend: str
) -> None:
    """Changes read while the owner is busy with a yielded batch wait in the queue (merged)
    and are yielded; only once the owner waits again does the handler take them."""
    if backend == "watchfiles":
        pytest.skip("watchfiles batches are always yielded")
    busy, quiet = CardPaths(tmp_path / "busy"), CardPaths(tmp_path / "quiet")
    busy.taskcard_dir.mkdir(parents=True)
    quiet.taskcard_dir.mkdir(parents=True)
    # A rescan every 0.2 s: yielded batches (with "quiet") the owner is slow with, while
    # events come.
    watcher = FleetWatcher({"busy": busy.workdir, "quiet": quiet.workdir}, rescan_interval_s=0.2)
    writer = _Rewriter(busy.status)
    yielded_with_busy = 0

    class Slow(Handled):
        async def _run(self) -> None:
            nonlocal yielded_with_busy
            async for batch in self.watcher.changes(self.handle):
                self.yielded.append(batch)
                if "quiet" in batch:  # the rescan's: the owner's own work takes a while
                    self.busy = True
                    await asyncio.sleep(0.05)  # events are read meanwhile
                    self.busy = False
                else:
                    yielded_with_busy += batch == {"busy"}  # what was read meanwhile
                self.handle(batch, direct=False)

    owner = Slow(watcher)
    try:
        await eventually_true(lambda: len(owner.yielded) >= 2)
        writer.start()
        # Both ways are taken: the writes read while the owner is slow come out yielded, in
        # one batch, the others go to the handler.
        await eventually_true(lambda: yielded_with_busy >= 3 and len(owner.direct) >= 5)
        assert owner.while_busy == 0
    finally:
        writer.stop()
        await owner.close()


async def eventually_true(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
