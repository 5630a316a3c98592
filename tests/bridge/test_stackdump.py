"""SIGUSR1's stack dump never ends the process it looks at, whatever became of stderr.

Each case runs a small program in its own process (a signal handler belongs to the main
thread of a whole process): it installs the dump as `taskcard serve` does, runs an event
loop, signals itself while the loop waits in `select`, and must go on to print "survived"
and exit 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from taskcard.bridge.run.stackdump import TASKS_FOOTER

PROGRAM = """
import asyncio, os, signal, sys
from taskcard.bridge.run import stackdump

stackdump.install()

async def main() -> None:
    await asyncio.sleep(0.05)
    if sys.argv[1] == "closed_stream":
        sys.stderr.close()
    os.kill(os.getpid(), signal.SIGUSR1)
    await asyncio.sleep(0.5)  # the Python handler runs here, in the loop's select

asyncio.run(main())
os.write(1, b"survived\\n")
"""


def _run(case: str, **popen: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, case], stdout=subprocess.PIPE, timeout=60, **popen
    )


def _close_fd_2() -> None:
    os.close(2)


def test_the_dump_reaches_a_working_stderr() -> None:
    run = _run("plain", stderr=subprocess.PIPE)
    assert run.returncode == 0, run.stderr
    assert run.stdout == b"survived\n"
    assert b"most recent call first" in run.stderr  # faulthandler, then the chained handler
    assert TASKS_FOOTER.encode() in run.stderr


def test_the_dump_counts_one_task_in_the_singular() -> None:
    run = _run("plain", stderr=subprocess.PIPE)
    assert run.returncode == 0, run.stderr
    assert b"\n1 task\n" in run.stderr  # the program's one task, main(): not "1 tasks"


@pytest.mark.parametrize(
    ("case", "stderr", "preexec"),
    [
        ("disk_full", "/dev/full", None),  # every write fails with ENOSPC
        ("closed_stream", "/dev/null", None),  # sys.stderr closed by the time of the signal
        ("no_stderr", "/dev/null", _close_fd_2),  # started with fd 2 closed: sys.stderr is None
    ],
)
def test_a_dump_that_cannot_be_written_leaves_the_process_running(
    case: str, stderr: str, preexec: Callable[[], None] | None
) -> None:
    with open(stderr, "wb") as sink:
        run = _run(case, stderr=sink, preexec_fn=preexec)
    assert (run.returncode, run.stdout) == (0, b"survived\n")


def test_a_dump_into_a_pipe_nobody_reads_any_more_leaves_the_process_running() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, "broken_pipe"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    proc.stderr.close()  # the log's reader is gone: every write gets EPIPE
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, b"survived\n")
