"""`taskcard/` holds exactly the files the manual gives the capability, at every step.

The manual: `taskcard/status` and `taskcard/taskcard.md`, plus `taskcard/watch.json` while a
watch is active (and `taskcard/taskcard.json`, the owner's document, which the capability
only reads). The host's own files (its workdir lock, the id counter, the refresh tally) live
in `.taskcard-host/`. Driven through `taskcard card`/`tool`, `taskcard host` and MCP over
stdio; then the upgrade of a workdir an earlier version's host left its files in.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.workdir_lock import boot_id

from .conftest import (
    COUNTER_RENDERER,
    STATIC_RENDERER,
    CliHost,
    pid_alive,
    wait_for,
    write_renderer,
)

ACTIVE = {"status", "taskcard.md", "watch.json"}
ENDED = {"status", "taskcard.md"}
REMOVED = {"status"}


def card_folder(workdir: Path) -> set[str]:
    return set(os.listdir(workdir / "taskcard"))


def host_folder(workdir: Path) -> set[str]:
    return set(os.listdir(workdir / ".taskcard-host"))


def kill_host(cli: CliHost) -> None:
    pid = cli.host_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid))


def tool(cli: CliHost, action: str, **inputs: Any) -> dict[str, Any]:
    envelope = {"action": action, "input": inputs, "reasoning": "folder test"}
    return cli.json("tool", json.dumps(envelope))


def test_the_card_folder_holds_only_the_manuals_files_through_the_cli(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    started = cli.json("card", "start", "r.py", "--interval-s", "1", "--max-refreshes", "1000")
    assert (started["status"], started["watch_id"]) == ("watching", "tc_1")
    assert card_folder(workdir) == ACTIVE
    assert host_folder(workdir) == {"lock", "watch-seq", "refreshes"}
    # Ticks spend budget: the tally grows in the host's folder, never in the card's.
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["refreshes_used"] >= 3)
    assert (workdir / ".taskcard-host" / "refreshes").read_bytes().startswith(b"tc_1\n")
    assert card_folder(workdir) == ACTIVE
    assert tool(cli, "retry", watch_id="tc_1")["status"] == "watching"
    assert card_folder(workdir) == ACTIVE
    assert cli.json("card", "stop", "tc_1")["status"] == "stopped"
    assert card_folder(workdir) == ENDED
    assert "refreshes" not in host_folder(workdir)  # the tally went with the descriptor
    assert "ended.json" in host_folder(workdir)  # the stopped watch, for a later host
    retried = cli.json("card", "retry", "tc_1")  # a stopped watch's retry: body only
    assert retried["status"] == "stopped"
    assert card_folder(workdir) == ENDED
    assert tool(cli, "start", renderer_path="r.py", interval_s=3600)["watch_id"] == "tc_2"
    assert card_folder(workdir) == ACTIVE
    assert "ended.json" not in host_folder(workdir)  # replaced: tc_1 is retried no more
    # The owner's settings document is the one other file the manual names there.
    (workdir / "taskcard" / "taskcard.json").write_text('{"interval_s": 5}\n')
    kill_host(cli)
    resumed = cli.json("card", "inspect", "tc_2")  # a new host resumes the watch
    assert (resumed["status"], resumed["status_value"]) == ("watching", "active")
    assert card_folder(workdir) == ACTIVE | {"taskcard.json"}
    assert cli.json("card", "remove")["status"] == "removed"
    assert card_folder(workdir) == REMOVED | {"taskcard.json"}
    assert tool(cli, "start", renderer_path="r.py")["watch_id"] == "tc_3"  # never reused


def test_the_card_folder_holds_only_the_manuals_files_after_exhaustion(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    started = cli.json("card", "start", "r.py", "--interval-s", "1", "--max-refreshes", "3")
    assert started["status"] == "watching"
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["status"] == "exhausted")
    assert card_folder(workdir) == ENDED
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
    # The exhausted watch is recorded for later hosts' inspect, in the host's folder.
    assert host_folder(workdir) == {"lock", "watch-seq", "ended.json"}


class Supervisor:
    """Runs `taskcard host` in the foreground, as a supervisor does; stops what it started."""

    def __init__(self, cli: CliHost) -> None:
        self.cli = cli
        self.hosts: list[subprocess.Popen[bytes]] = []

    def start_host(self) -> None:
        command = [sys.executable, "-m", "taskcard.bridge.cli", "host"]
        command += ["--workdir", str(self.cli.workdir), "--runtime-dir", str(self.cli.runtime_dir)]
        host = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        self.hosts.append(host)
        wait_for(lambda: self.cli.host_pid() == host.pid and self.cli.paths.socket.exists())

    def stop_all(self) -> None:
        for host in self.hosts:
            if host.poll() is None:
                host.send_signal(signal.SIGTERM)
                try:
                    host.wait(30)
                except subprocess.TimeoutExpired:
                    host.kill()
                    host.wait()


@pytest.fixture
def supervisor(workdir: Path, runtime_dir: Path) -> Iterator[Supervisor]:
    supervisor = Supervisor(CliHost(workdir, runtime_dir))
    yield supervisor
    supervisor.stop_all()


def test_a_supervised_host_that_stops_and_resumes_keeps_the_card_folder_clean(
    workdir: Path, supervisor: Supervisor
) -> None:
    cli = supervisor.cli
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    supervisor.start_host()
    assert card_folder(workdir) == set()  # a host alone writes nothing of its own there
    started = cli.json("card", "start", "r.py", "--interval-s", "1")
    assert started["status"] == "watching"
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["refreshes_used"] >= 2)
    assert card_folder(workdir) == ACTIVE
    pid = cli.host_pid()
    assert pid is not None
    os.kill(pid, signal.SIGTERM)  # the supervisor stops it; the watch stays on disk
    wait_for(lambda: not pid_alive(pid))
    assert card_folder(workdir) == ACTIVE
    assert (workdir / ".taskcard-host" / "lock").read_bytes() == b""  # a clean end
    supervisor.start_host()
    assert cli.json("card", "inspect", "tc_1")["status"] == "watching"
    assert card_folder(workdir) == ACTIVE


async def test_the_card_folder_holds_only_the_manuals_files_through_mcp(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    async with cli.mcp() as session:

        async def call(action: str, **inputs: object) -> dict[str, Any]:
            arguments = {"action": action, "input": inputs, "reasoning": "mcp folder test"}
            result = await session.call_tool("task_card", arguments)
            answer: dict[str, Any] = json.loads(result.content[0].text)  # type: ignore[union-attr]
            return answer

        assert (await call("start", renderer_path="r.py", interval_s=3600))["watch_id"] == "tc_1"
        assert card_folder(workdir) == ACTIVE
        assert (await call("retry", watch_id="tc_1"))["status"] == "watching"
        assert card_folder(workdir) == ACTIVE
        assert (await call("stop", watch_id="tc_1"))["status"] == "stopped"
        assert card_folder(workdir) == ENDED
        assert (await call("start", renderer_path="r.py", interval_s=3600))["watch_id"] == "tc_2"
        kill_host(cli)
        inspected = await call("inspect", watch_id="tc_2")  # the server starts a new host
        assert inspected["status"] == "watching"
        assert card_folder(workdir) == ACTIVE
        assert (await call("remove"))["status"] == "removed"
        assert card_folder(workdir) == REMOVED
    assert host_folder(workdir) == {"lock", "watch-seq"}


# -- a workdir an earlier version's host used ---------------------------------------------


def old_descriptor(workdir: Path, **fields: object) -> None:
    (workdir / "taskcard").mkdir(exist_ok=True)
    descriptor = {
        "watch_id": "tc_7",
        "renderer_path": "r.py",
        "interval_s": 3600,
        "timeout_s": 5,
        "max_refreshes": 10,
        "refreshes_used": 2,
        "started_at": "2026-01-01T00:00:00Z",
        **fields,
    }
    (workdir / "taskcard" / "watch.json").write_text(json.dumps(descriptor))
    (workdir / "taskcard" / "status").write_bytes(b"active")
    (workdir / "taskcard" / "taskcard.md").write_text("# old body\n")


def test_an_upgraded_workdir_keeps_its_id_sequence_and_spent_budget(
    workdir: Path, cli: CliHost
) -> None:
    """An earlier host's `.watch-seq` and `.refreshes` in `taskcard/`: the resumed watch keeps
    the budget the tally counted, the next id follows the old counter, and the old files are
    gone once the new ones are written."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    old_descriptor(workdir)
    (workdir / "taskcard" / ".watch-seq").write_text("7")
    (workdir / "taskcard" / ".refreshes").write_bytes(b"tc_7\n2\n3\n4\n5\n")
    resumed = cli.json("card", "inspect", "tc_7")
    assert (resumed["status"], resumed["refreshes_used"]) == ("watching", 5)
    assert card_folder(workdir) == ACTIVE
    assert (workdir / ".taskcard-host" / "watch-seq").read_text() == "7"
    assert (workdir / ".taskcard-host" / "refreshes").read_bytes() == b"tc_7\n5\n"
    cli.json("card", "retry", "tc_7")
    kill_host(cli)
    assert cli.json("card", "inspect", "tc_7")["refreshes_used"] == 6
    assert cli.json("card", "stop", "tc_7")["status"] == "stopped"
    assert cli.json("card", "start", "r.py")["watch_id"] == "tc_8"
    assert card_folder(workdir) == ACTIVE


def test_an_old_counter_without_a_watch_is_carried_over_at_the_next_start(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / ".watch-seq").write_text("41")
    (workdir / "taskcard" / ".refreshes").write_bytes(b"tc_41\n9\n")  # its watch is gone
    assert cli.json("card", "start", "r.py")["watch_id"] == "tc_42"
    assert card_folder(workdir) == ACTIVE
    assert (workdir / ".taskcard-host" / "watch-seq").read_text() == "42"


HOLD_OLD_LOCK = """
import fcntl, json, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(fd, 0)
os.write(fd, json.dumps({"pid": os.getpid(), "runtime_dir": sys.argv[2]}).encode())
print("held", flush=True)
sys.stdin.read()
"""


def test_a_host_of_the_previous_version_still_running_keeps_a_new_one_out(
    workdir: Path, cli: CliHost, tmp_path: Path
) -> None:
    """An earlier version's host holds `taskcard/.host.lock` (here, a process doing what it
    did: an `flock` and its note) with another runtime folder: a new host is refused and told
    where that host is; once it is gone a new host starts, holds the old lock while it runs
    (an old-style locker started then is refused and told where it is) and its clean end
    removes the old name."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard").mkdir()
    old_lock = workdir / "taskcard" / ".host.lock"
    elsewhere = str(tmp_path / "old-runtime")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_OLD_LOCK, str(old_lock), elsewhere],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        refused = cli.run("card", "start", "r.py")
        assert refused.returncode == 3, (refused.stdout, refused.stderr)
        assert f"pid {holder.pid}, runtime dir {elsewhere}" in refused.stderr
        host = cli.run("host", timeout_s=60)
        assert host.returncode == 3 and f"runtime dir {elsewhere}" in host.stderr
        assert not (workdir / "taskcard" / "status").exists()
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()
    assert cli.json("card", "start", "r.py")["status"] == "watching"
    assert json.loads((workdir / ".taskcard-host" / "lock").read_text())["pid"] == cli.host_pid()
    assert card_folder(workdir) == ACTIVE | {".host.lock"}  # held while this first host runs
    late = subprocess.run(
        [sys.executable, "-c", HOLD_OLD_LOCK, str(old_lock), elsewhere],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert late.returncode != 0 and "BlockingIOError" in late.stderr
    assert json.loads(old_lock.read_text())["pid"] == cli.host_pid()  # what it would report
    cli.shutdown()
    assert card_folder(workdir) == ACTIVE
    assert cli.json("card", "inspect", "tc_1")["status"] == "watching"  # a new host resumes
    assert card_folder(workdir) == ACTIVE


def test_a_killed_old_hosts_leftover_render_is_ended_by_a_new_host(
    workdir: Path, cli: CliHost
) -> None:
    """The note a previous version's host killed with SIGKILL left in `taskcard/.host.lock`
    names its renders' tag: the new host ends them, as it does for its own version's note."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    tag = "ab" * 16
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, "TASKCARD_RENDER_HOST": tag},
        start_new_session=True,
    )
    try:
        (workdir / "taskcard").mkdir()
        note = {"pid": 1, "runtime_dir": "/nowhere", "renders": tag, "boot": boot_id()}
        note["workdir"] = str(workdir.resolve())
        (workdir / "taskcard" / ".host.lock").write_text(json.dumps(note))
        assert cli.json("card", "start", "r.py")["status"] == "watching"
        wait_for(lambda: leftover.poll() is not None)
        assert leftover.returncode == -signal.SIGKILL
        assert card_folder(workdir) == ACTIVE | {".host.lock"}  # until this host's clean end
        cli.shutdown()
        assert card_folder(workdir) == ACTIVE
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()


def test_a_host_folder_linked_out_of_the_workdir_is_refused(
    workdir: Path, tmp_path: Path, cli: CliHost
) -> None:
    """`.taskcard-host` planted as a link to another workdir's: the host would wait on that
    host's lock or write its counter there, so it does not start, as for `taskcard/`."""
    other = tmp_path / "other"
    (other / ".taskcard-host").mkdir(parents=True)
    (workdir / ".taskcard-host").symlink_to(other / ".taskcard-host")
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    for command in (("card", "start", "r.py"), ("host",)):
        done = cli.run(*command, timeout_s=60)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        folder = workdir / ".taskcard-host"
        assert f"{folder} is a symlink that leads out of the workdir" in done.stderr
    assert os.listdir(other / ".taskcard-host") == []
    # A link that stays inside the workdir is followed.
    (workdir / ".taskcard-host").unlink()
    (workdir / "state").mkdir()
    (workdir / ".taskcard-host").symlink_to(workdir / "state")
    assert cli.json("card", "start", "r.py")["status"] == "watching"
    assert {"lock", "watch-seq", "refreshes"} <= set(os.listdir(workdir / "state"))


@pytest.mark.parametrize("plant", ["symlink", "fifo", "hardlink", "folder"])
def test_a_planted_lock_in_the_host_folder_is_never_written_through(
    workdir: Path, tmp_path: Path, cli: CliHost, plant: str
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep me\n")
    lock = workdir / ".taskcard-host" / "lock"
    lock.parent.mkdir()
    if plant == "symlink":
        lock.symlink_to(outside)
    elif plant == "fifo":
        os.mkfifo(lock)
    elif plant == "hardlink":
        os.link(outside, lock)
    else:
        lock.mkdir()
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    assert cli.json("card", "start", "r.py")["status"] == "watching"  # the runtime lock alone
    assert outside.read_bytes() == b"keep me\n"
    assert card_folder(workdir) == ACTIVE


def test_a_file_planted_as_the_host_folder_keeps_the_counter_where_it_was(
    workdir: Path, cli: CliHost
) -> None:
    """No host folder can be made (a file at its name; a read-only workdir root beside a
    writable `taskcard/` is the same to the host): cards still start, on the runtime lock
    alone, with the id counter where earlier versions kept it; the first host that can make
    the folder moves the counter there, and no id is handed out twice."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / ".taskcard-host").write_text("not a folder")
    assert cli.json("card", "start", "r.py")["watch_id"] == "tc_1"
    assert card_folder(workdir) == ACTIVE | {".watch-seq", ".host.lock"}
    assert cli.json("card", "stop", "tc_1")["status"] == "stopped"
    cli.shutdown()
    assert cli.json("card", "start", "r.py")["watch_id"] == "tc_2"  # a new host, same count
    assert cli.json("card", "stop", "tc_2")["status"] == "stopped"
    cli.shutdown()
    (workdir / ".taskcard-host").unlink()
    assert cli.json("card", "start", "r.py")["watch_id"] == "tc_3"
    assert (workdir / ".taskcard-host" / "watch-seq").read_text() == "3"
    cli.shutdown()  # the old lock, held while it ran, goes at its clean end
    assert card_folder(workdir) == ACTIVE


def test_the_old_lock_is_held_by_a_new_host_so_an_old_host_opening_it_is_refused(
    workdir: Path, cli: CliHost
) -> None:
    """An earlier version's host that opened `taskcard/.host.lock` just before the new host
    took it finds it locked, as it would have found its own, also after the new host's clean
    end removed the name (it is removed while still held)."""
    (workdir / "taskcard").mkdir()
    old_lock = workdir / "taskcard" / ".host.lock"
    old_lock.write_text("")
    fd = os.open(old_lock, os.O_RDWR)
    try:
        cli.start_host()
        assert cli.host_pid() is not None
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert old_lock.exists()
        cli.shutdown()
        assert not old_lock.exists()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # let go of only now
    finally:
        os.close(fd)


def test_a_host_folder_swapped_for_a_link_out_while_a_watch_runs_is_not_written_through(
    workdir: Path, tmp_path: Path, make_card: Callable[..., TaskCard]
) -> None:
    """In-process (the shell forms refuse every call then): the tally's restart and the stop's
    removal of it must not reach a folder outside that has files of the same names."""
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    start = {"renderer_path": "r.py", "interval_s": 3600, "max_refreshes": 1000}
    assert card.call({"action": "start", "input": start, "reasoning": "t"})["status"] == "watching"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for name in ("refreshes", "watch-seq"):
        (outside / name).write_text("keep me\n")
    (workdir / ".taskcard-host").rename(workdir / "moved")
    (workdir / ".taskcard-host").symlink_to(outside)
    retried = card.call({"action": "retry", "input": {"watch_id": "tc_1"}, "reasoning": "t"})
    assert retried["status"] == "watching"
    assert (
        card.call({"action": "stop", "input": {"watch_id": "tc_1"}, "reasoning": "t"})["status"]
        == "stopped"
    )
    again = card.call({"action": "start", "input": start, "reasoning": "t"})
    assert (again["status"], again["code"]) == ("failed", "write_failed")
    assert "cannot write .taskcard-host/" in again["message"]
    assert "leads out of the workdir" in again["message"]
    assert sorted(os.listdir(outside)) == ["refreshes", "watch-seq"]
    assert all((outside / name).read_text() == "keep me\n" for name in os.listdir(outside))
    assert card_folder(workdir) == ENDED


@pytest.mark.parametrize("old_lock_there", [True, False])
def test_the_old_lock_stands_in_when_the_host_folder_cannot_be_used(
    workdir: Path, cli: CliHost, other_runtime_dir: Path, old_lock_there: bool
) -> None:
    """No `.taskcard-host/` (a file planted at its name; a read-only root is the same to the
    host): the old lock, found or created, carries the host's note and stays, so a caller with
    another runtime folder is still kept out and told where the host is, as before."""
    (workdir / ".taskcard-host").write_text("not a folder")
    (workdir / "taskcard").mkdir()
    old_lock = workdir / "taskcard" / ".host.lock"
    if old_lock_there:
        old_lock.write_text("")
    cli.start_host()
    assert json.loads(old_lock.read_text())["pid"] == cli.host_pid()
    other = other_runtime_dir
    command = [sys.executable, "-m", "taskcard.bridge.cli", "host"]
    command += ["--workdir", str(workdir), "--runtime-dir", str(other)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 3, done.stderr
    assert f"runtime dir {cli.runtime_dir}" in done.stderr
    cli.shutdown()
    assert old_lock.read_bytes() == b""  # a clean end empties the note


def test_an_earlier_versions_files_are_never_removed_through_a_card_folder_linked_out(
    workdir: Path, tmp_path: Path, make_card: Callable[..., TaskCard]
) -> None:
    """`taskcard/` swapped for a link to another agent's card folder (an agent still on the
    previous version, its counter and tally in there) while a host runs: stop and start must
    not remove that agent's files as if they were this workdir's old ones."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    start = {"renderer_path": "r.py", "interval_s": 3600}
    assert card.call({"action": "start", "input": start, "reasoning": "t"})["status"] == "watching"
    other = tmp_path / "other" / "taskcard"
    other.mkdir(parents=True)
    (other / ".watch-seq").write_text("12")
    (other / ".refreshes").write_bytes(b"tc_12\n4\n")
    (workdir / "taskcard").rename(workdir / "moved")
    (workdir / "taskcard").symlink_to(other)
    card.call({"action": "stop", "input": {"watch_id": "tc_1"}, "reasoning": "t"})
    card.call({"action": "start", "input": start, "reasoning": "t"})
    assert (other / ".watch-seq").read_text() == "12"
    assert (other / ".refreshes").read_bytes() == b"tc_12\n4\n"
