"""Fixtures for the task_card producer: a workdir, a short runtime dir, renderers, helpers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.client import request_host
from taskcard.producers.task_card.runtime import HostPaths

POLL_TIMEOUT_S = 60.0


def wait_for(condition: Callable[[], bool], timeout_s: float = POLL_TIMEOUT_S) -> None:
    """Poll with a generous deadline; the machine may be loaded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def envelope(action: str, **inputs: Any) -> dict[str, Any]:
    return {"action": action, "input": inputs, "reasoning": "test"}


def notifications(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / ".notification" / "system.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_renderer(workdir: Path, name: str, code: str) -> Path:
    path = workdir / name
    path.write_text(code)
    return path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return False


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "agent"
    path.mkdir()
    return path


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """Short on purpose: unix socket paths are limited to 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="tcrt"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_card(workdir: Path, runtime_dir: Path) -> Iterator[Callable[..., TaskCard]]:
    cards: list[TaskCard] = []

    def make(**kwargs: Any) -> TaskCard:
        card = TaskCard(workdir, runtime_dir=runtime_dir, environ={"PATH": os.defpath}, **kwargs)
        cards.append(card)
        return card

    yield make
    for card in cards:
        card.close()


# Counts its runs in count.txt, replaced whole so a test reading it never sees it half-written.
COUNTER_RENDERER = """
import os
from pathlib import Path
p = Path("count.txt")
n = int(p.read_text()) + 1 if p.exists() else 1
Path("count.txt.tmp").write_text(str(n))
os.replace("count.txt.tmp", p)
print(f"# Work\\nrender {n}")
"""

# Fails while `fail.flag` exists, so a test can open and close an error episode.
FLAG_RENDERER = """
import sys
from pathlib import Path
if Path("fail.flag").exists():
    print("boom", file=sys.stderr)
    sys.exit(3)
print("# Work\\nall good")
"""

STATIC_RENDERER = 'print("# Work\\nsteady body")\n'


class CliHost:
    """Runs `taskcard` (the lead's entry point) as separate processes against one workdir."""

    def __init__(self, workdir: Path, runtime_dir: Path) -> None:
        self.workdir = workdir
        self.runtime_dir = runtime_dir
        self.paths = HostPaths(runtime_dir, workdir.resolve())

    def run(
        self, *args: str, stdin: str | None = None, timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "taskcard.bridge.cli", *args]
        command += ["--workdir", str(self.workdir), "--runtime-dir", str(self.runtime_dir)]
        return subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def json(self, *args: str, stdin: str | None = None) -> dict[str, Any]:
        """The parsed result; `card` prints it as JSON only when asked with `--json`."""
        done = self.run(*args, *(("--json",) if args[0] == "card" else ()), stdin=stdin)
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def host_pid(self) -> int | None:
        try:
            return int(self.paths.lock.read_text().strip())
        except (OSError, ValueError):
            return None

    def shutdown(self) -> None:
        pid = self.host_pid()
        with contextlib.suppress(OSError, ValueError):
            request_host(self.paths, {"op": "shutdown"}, 5.0)
        if pid is not None:
            try:
                wait_for(lambda: not pid_alive(pid), 30)
            except AssertionError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cli(workdir: Path, runtime_dir: Path) -> Iterator[CliHost]:
    host = CliHost(workdir, runtime_dir)
    yield host
    host.shutdown()
