"""A host killed mid-render: the next host ends what the run left running, and nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from taskcard.producers.task_card.capability import TaskCard

from .conftest import CliHost, pid_alive, wait_for, write_renderer

# The first run and every run after the second print at once; the second run (the first
# tick) starts a child in a session of its own, notes both pids and hangs.
HANGING_SECOND_RUN = """\
import os, subprocess, sys, time
from pathlib import Path
runs = Path("runs.txt")
n = int(runs.read_text()) + 1 if runs.exists() else 1
Path("runs.tmp").write_text(str(n))
os.replace("runs.tmp", runs)  # whole: the test reads it meanwhile
if n == 2:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    Path("hung.tmp").write_text(f"{os.getpid()} {child.pid}")
    os.rename("hung.tmp", "hung.txt")
    time.sleep(600)
print(f"# run {n}")
"""

SLEEPER = "import time; time.sleep(600)"
Sleeper = Callable[[str, Path], "subprocess.Popen[bytes]"]


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _same_process_alive(pid: int, start: int | None) -> bool:
    """Alive, not a zombie, and still the process first seen under that pid."""
    return pid_alive(pid) and _start_time(pid) == start


@pytest.fixture
def strays() -> Iterator[list[int]]:
    """Pids the test must not leave behind, whatever the outcome."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def sleeper() -> Iterator[Sleeper]:
    """Starts a sleeping process with `TASKCARD_RENDER_HOST` set; all are gone afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(tag: str, cwd: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, "TASKCARD_RENDER_HOST": tag}
        started.append(subprocess.Popen([sys.executable, "-c", SLEEPER], cwd=cwd, env=env))
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_render_hanging_when_the_host_is_killed_is_ended_by_the_next_host(
    workdir: Path, cli: CliHost, strays: list[int]
) -> None:
    write_renderer(workdir, "r.py", HANGING_SECOND_RUN)
    started = cli.json("card", "start", "r.py", "--interval-s", "1", "--timeout-s", "300")
    assert started["status"] == "watching", started
    hung = workdir / "hung.txt"
    wait_for(hung.exists)
    renderer, child = (int(pid) for pid in hung.read_text().split())
    strays.extend([renderer, child])
    starts = {pid: _start_time(pid) for pid in (renderer, child)}
    host = cli.host_pid()
    assert host is not None
    os.kill(host, signal.SIGKILL)
    wait_for(lambda: not pid_alive(host))
    # The run the dead host supervised goes on: nobody is left to end it.
    assert all(_same_process_alive(pid, start) for pid, start in starts.items())
    resumed = cli.json("card", "inspect", "tc_1")  # a new host, which resumes the watch
    assert resumed["status"] == "watching", resumed
    wait_for(lambda: not any(_same_process_alive(pid, s) for pid, s in starts.items()))
    # The new host's renders run: the resume's and the ticks after it.
    wait_for(lambda: int((workdir / "runs.txt").read_text()) >= 4)
    wait_for(lambda: (workdir / "taskcard" / "taskcard.md").read_text() != "# run 1\n")
    assert cli.json("card", "inspect", "tc_1")["status"] == "watching"


# An agent process using the Python API: it starts a watch, then lives on until killed.
AGENT = """\
import sys, time
from taskcard.producers.task_card.capability import TaskCard
card = TaskCard(sys.argv[1], runtime_dir=sys.argv[2])
start = {"renderer_path": "r.py", "interval_s": 1, "timeout_s": 300}
result = card.call({"action": "start", "input": start, "reasoning": "test"})
assert result["status"] == "watching", result
time.sleep(600)
"""


def test_an_agent_killed_mid_render_through_the_python_api_leaves_nothing_to_the_next_one(
    workdir: Path, runtime_dir: Path, make_card: Callable[..., TaskCard], strays: list[int]
) -> None:
    write_renderer(workdir, "r.py", HANGING_SECOND_RUN)
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(workdir), str(runtime_dir)])
    try:
        hung = workdir / "hung.txt"
        wait_for(hung.exists)
        renderer, child = (int(pid) for pid in hung.read_text().split())
        strays.extend([renderer, child])
        starts = {pid: _start_time(pid) for pid in (renderer, child)}
    finally:
        agent.kill()
        agent.wait()
    assert all(_same_process_alive(pid, start) for pid, start in starts.items())
    card = make_card()  # the agent's next process resumes the watch
    assert (
        card.call({"action": "inspect", "input": {"watch_id": "tc_1"}, "reasoning": "t"})["status"]
        == "watching"
    )
    wait_for(lambda: not any(_same_process_alive(pid, s) for pid, s in starts.items()))
    wait_for(lambda: int((workdir / "runs.txt").read_text()) >= 4)


def _plant_note(folder: Path, **note: object) -> None:
    """A lock note as a host killed with SIGKILL leaves it (a clean end empties it)."""
    lock = folder / ".taskcard-host" / "lock"
    lock.parent.mkdir(exist_ok=True)
    lock.write_text(json.dumps({"runtime_dir": "/nowhere", **note}))


def test_only_the_dead_hosts_renders_are_ended_not_a_process_that_took_a_recorded_pid(
    workdir: Path, cli: CliHost, sleeper: Sleeper
) -> None:
    write_renderer(workdir, "r.py", "print('# card')\n")
    dead_tag, other_tag = uuid.uuid4().hex, uuid.uuid4().hex
    # An unrelated process: a renderer of some other host, holding the pid the note records
    # for the dead host; and a leftover of the dead host's renders, carrying its tag.
    unrelated = sleeper(other_tag, workdir)
    leftover = sleeper(dead_tag, workdir)
    _plant_note(
        workdir, pid=unrelated.pid, renders=dead_tag, boot=boot_id(), workdir=str(workdir.resolve())
    )
    assert cli.json("card", "start", "r.py")["status"] == "watching"  # the new host is up
    wait_for(lambda: leftover.poll() is not None)
    assert leftover.returncode == -signal.SIGKILL
    assert unrelated.poll() is None


def test_a_note_copied_with_the_workdir_or_from_an_earlier_boot_ends_nothing(
    workdir: Path, tmp_path: Path, cli: CliHost, sleeper: Sleeper
) -> None:
    """A workdir copied while its host runs carries the live host's note: the copy's host
    must not kill the original's renders; nor does a note from before a reboot count."""
    write_renderer(workdir, "r.py", "print('# card')\n")
    tag = uuid.uuid4().hex
    original = tmp_path / "original"
    original.mkdir()
    live_render = sleeper(tag, original)
    _plant_note(workdir, pid=live_render.pid, renders=tag, boot=boot_id(), workdir=str(original))
    assert cli.json("card", "start", "r.py")["status"] == "watching"
    cli.shutdown()
    _plant_note(
        workdir, pid=live_render.pid, renders=tag, boot="an-earlier-boot", workdir=str(workdir)
    )
    assert cli.json("card", "inspect", "tc_1")["status"] == "watching"  # resumed by a new host
    assert live_render.poll() is None


def test_a_host_that_ends_cleanly_leaves_no_note_behind(workdir: Path, cli: CliHost) -> None:
    write_renderer(workdir, "r.py", "print('# card')\n")
    assert cli.json("card", "start", "r.py")["status"] == "watching"
    note = json.loads((workdir / ".taskcard-host" / "lock").read_text())
    assert note["pid"] == cli.host_pid()
    assert note["workdir"] == str(workdir.resolve()) and len(note["renders"]) == 32
    cli.shutdown()
    assert (workdir / ".taskcard-host" / "lock").read_bytes() == b""


# A's second run starts a card in workdir B (its host, detached, lives on), then hangs.
STARTS_ANOTHER_CARD = """\
import os, subprocess, sys, time
from pathlib import Path
runs = Path("runs.txt")
n = int(runs.read_text()) + 1 if runs.exists() else 1
Path("runs.tmp").write_text(str(n))
os.replace("runs.tmp", runs)  # whole: the test reads it meanwhile
if n == 2:
    other, runtime = OTHER, RUNTIME
    subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "card", "start", "r.py",
         "--workdir", other, "--runtime-dir", runtime],
        check=True, capture_output=True,
    )
    Path("started.tmp").write_text(str(os.getpid()))
    os.rename("started.tmp", "started.txt")
    time.sleep(600)
print(f"# run {n}")
"""


def test_a_host_started_from_a_render_is_not_ended_with_that_render(
    workdir: Path, tmp_path: Path, runtime_dir: Path, cli: CliHost, strays: list[int]
) -> None:
    """A renderer that starts another workdir's card starts that workdir's host, which
    inherited the render's tag: once the render's own host was killed, its next host ended
    the other workdir's live host with the leftover render, and that card stopped."""
    other = tmp_path / "other"
    other.mkdir()
    write_renderer(other, "r.py", "print('# other card')\n")
    other_cli = CliHost(other, runtime_dir)
    renderer = STARTS_ANOTHER_CARD.replace("OTHER", repr(str(other)))
    write_renderer(workdir, "r.py", renderer.replace("RUNTIME", repr(str(runtime_dir))))
    started = cli.json("card", "start", "r.py", "--interval-s", "1", "--timeout-s", "300")
    assert started["status"] == "watching", started
    wait_for((workdir / "started.txt").exists)
    render = int((workdir / "started.txt").read_text())
    strays.append(render)
    other_host = other_cli.host_pid()
    assert other_host is not None and pid_alive(other_host)
    try:
        host = cli.host_pid()
        assert host is not None
        os.kill(host, signal.SIGKILL)
        wait_for(lambda: not pid_alive(host))
        assert cli.json("card", "inspect", "tc_1")["status"] == "watching"  # the sweep ran
        wait_for(lambda: not pid_alive(render))
        assert pid_alive(other_host), "the other workdir's host was ended with the render"
        assert other_cli.json("card", "inspect", "tc_1")["status"] == "watching"
        assert other_cli.host_pid() == other_host
    finally:
        other_cli.shutdown()


# The second run starts another workdir's card, then leaves a plain orphan (a `sleep` whose
# shell exits), notes both pids and hangs: the orphan reparents to the rendering host after the
# other card's host did, so its death proves that a sweep of the rendering host saw both.
STARTS_ANOTHER_CARD_AND_AN_ORPHAN = STARTS_ANOTHER_CARD.replace(
    '    Path("started.tmp").write_text(str(os.getpid()))\n',
    """\
    orphan = subprocess.run(
        ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    Path("started.tmp").write_text(f"{os.getpid()} {orphan}")
""",
)
assert STARTS_ANOTHER_CARD_AND_AN_ORPHAN != STARTS_ANOTHER_CARD


def test_a_rendering_host_spares_the_host_a_render_started(
    workdir: Path, tmp_path: Path, runtime_dir: Path, cli: CliHost, strays: list[int]
) -> None:
    """The other workdir's host, orphaned when its `card start` exits, reparents to the
    rendering host (a subreaper), whose sweep killed every child that was not a running
    renderer: the other card stopped within a second of starting. It is spared now, while a
    real leftover of the same render still dies."""
    other = tmp_path / "other"
    other.mkdir()
    write_renderer(other, "r.py", "print('# other card')\n")
    other_cli = CliHost(other, runtime_dir)
    renderer = STARTS_ANOTHER_CARD_AND_AN_ORPHAN.replace("OTHER", repr(str(other)))
    write_renderer(workdir, "r.py", renderer.replace("RUNTIME", repr(str(runtime_dir))))
    started = cli.json("card", "start", "r.py", "--interval-s", "1", "--timeout-s", "300")
    assert started["status"] == "watching", started
    wait_for((workdir / "started.txt").exists)
    render, orphan = map(int, (workdir / "started.txt").read_text().split())
    strays += [render, orphan]
    try:
        host = cli.host_pid()
        other_host = other_cli.host_pid()
        assert other_host is not None and host is not None
        assert _parent(other_host) == host  # reparented to the rendering host
        wait_for(lambda: not pid_alive(orphan))  # a sweep ran since both were reparented
        assert pid_alive(other_host), "the rendering host's sweep ended the other card's host"
        assert other_cli.json("card", "inspect", "tc_1")["status"] == "watching"
        assert other_cli.host_pid() == other_host
    finally:
        other_cli.shutdown()


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
