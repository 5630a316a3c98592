"""Fixtures for the task_card producer: renderers, a `taskcard` run as separate processes
(`CliHost`, with its MCP server), helpers. The workdir and the short runtime dir come from
tests/conftest.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from queue import Queue
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.client import request_host
from taskcard.producers.task_card.runtime import HostPaths
from tests.conftest import mcp_server, mcp_session

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

# `taskcard mcp` as the producer's own module runs it.
MCP_MODULE = (sys.executable, "-m", "taskcard.producers.task_card.cli")


INITIALIZED = '{"jsonrpc":"2.0","method":"notifications/initialized"}'


def mcp_answers(cli: CliHost, lines: list[str]) -> list[dict[str, Any]]:
    """Every answer of a `taskcard mcp` given `lines` as raw JSON-RPC, its stdin closed after
    the last one."""
    done = cli.run("mcp", stdin="".join(line + "\n" for line in lines))
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def report_summaries(workdir: Path) -> list[str]:
    """The summaries of the reports written to `reports/reports.jsonl`, in order."""
    written = workdir / "reports" / "reports.jsonl"
    if not written.exists():
        return []
    return [json.loads(line)["summary"] for line in written.read_text().splitlines()]


def tool_call(ident: int, params: str) -> str:
    """A raw tools/call line with `params` written as given (JSON or not)."""
    return f'{{"jsonrpc":"2.0","id":{ident},"method":"tools/call","params":{params}}}'


class CliHost:
    """Runs `taskcard` (the lead's entry point) as separate processes against one workdir."""

    def __init__(self, workdir: Path, runtime_dir: Path) -> None:
        self.workdir = workdir
        self.runtime_dir = runtime_dir
        self.paths = HostPaths(runtime_dir, workdir.resolve())

    def command(self, *args: str) -> list[str]:
        return [
            *(sys.executable, "-m", "taskcard.bridge.cli", *args),
            *("--workdir", str(self.workdir), "--runtime-dir", str(self.runtime_dir)),
        ]

    def run(
        self, *args: str, stdin: str | None = None, timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        command = self.command(*args)
        return subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def json(self, *args: str, stdin: str | None = None) -> dict[str, Any]:
        """The parsed result; `card` prints it as JSON only when asked with `--json`."""
        done = self.run(*args, *(("--json",) if args[0] == "card" else ()), stdin=stdin)
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def mcp_server(self) -> StdioServerParameters:
        return mcp_server(self.workdir, self.runtime_dir, MCP_MODULE)

    def mcp(self) -> AbstractAsyncContextManager[ClientSession]:
        """An initialized session of the SDK's real stdio client with `taskcard mcp`."""
        return mcp_session(self.workdir, self.runtime_dir, MCP_MODULE)

    @contextlib.contextmanager
    def raw_mcp(self) -> Iterator[tuple[subprocess.Popen[bytes], Queue[dict[str, Any]]]]:
        """`taskcard mcp` driven line by line, as a hand-written client does: the process, and
        the queue its answers arrive on (decoded, in order); killed when the block ends."""
        params = self.mcp_server()
        server = subprocess.Popen(
            [params.command, *params.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        answers: Queue[dict[str, Any]] = Queue()

        def read() -> None:
            assert server.stdout is not None
            for raw in server.stdout:
                answers.put(json.loads(raw))

        threading.Thread(target=read, daemon=True).start()
        try:
            yield server, answers
        finally:
            server.kill()
            server.wait()
            for pipe in (server.stdin, server.stdout):
                if pipe is not None:
                    pipe.close()

    def start_host(self) -> None:
        """Brings the workdir's background host up, as a call that needs it would
        (`manual` and `settings` need none)."""
        done = self.run("host", "--detach")
        assert done.returncode == 0, done.stderr

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
