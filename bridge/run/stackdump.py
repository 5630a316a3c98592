"""SIGUSR1: print where a running `taskcard serve` is, for a stop that takes too long.

A service that does not exit after SIGTERM is waiting on something; without a way to look
inside, nobody can tell what. Two views, both written to stderr (where the log goes):

- every thread's Python stack, by `faulthandler` from its C signal handler: it appears even
  when the event loop is stuck in a blocking call and no Python code can run;
- every asyncio task's stack (which coroutine awaits what), by a Python handler that the
  faulthandler one chains to: the threads' view of an idle loop shows only its `select`, so
  an await that never ends is visible only here.

Installed once per process and never removed: the slow part may be the very end of the run
(the loop's teardown, a thread joined at exit), and SIGUSR1's default action would kill the
process that is being looked at. Nothing else in the service or its libraries uses SIGUSR1.
Only code locations are printed, never values: no secret can leave this way.

The dump never breaks the service it looks at. The Python handler runs in the main thread
wherever it was interrupted (usually the loop's `select`), so an exception out of it would
be raised there and end `taskcard serve`: a stderr whose reader is gone, a full disk, a
closed stream, or a signal landing inside a write to stderr (the buffered stream refuses
the re-entrant write) only lose the dump. Without any stderr (started with fd 2 closed)
there is nowhere to write: SIGUSR1 is then ignored, never left to its default action.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import linecache
import signal
import sys
from types import FrameType
from typing import Any, TextIO

TASKS_HEADER = "--- asyncio tasks (SIGUSR1) ---"
TASKS_FOOTER = "--- end of asyncio tasks ---"
# Frames shown per task: deep enough for any await chain of the service.
_TASK_FRAMES = 40


def install(stream: TextIO | None = None) -> None:
    """Make SIGUSR1 dump every thread's and every asyncio task's stack to `stream`
    (stderr by default). Call it from the main thread before the event loop starts."""
    out = stream or sys.stderr
    if out is None:  # fd 2 was closed at start: `faulthandler` would refuse it
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # see the module's doc
            dump_tasks(out, frame)

    signal.signal(signal.SIGUSR1, on_signal)
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=True)


def dump_tasks(stream: TextIO, frame: FrameType | None = None) -> None:
    """Every task of the loop running in this thread, each with its stack, between two
    marker lines (a harness waits for the footer)."""
    del frame
    lines = [TASKS_HEADER]
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:  # before the loop started or after it ended
        loop = None
    if loop is None:
        lines.append("(no event loop is running)")
    else:
        tasks = sorted(asyncio.all_tasks(loop), key=lambda task: task.get_name())
        lines.append(f"{len(tasks)} tasks")
        stream.write("\n".join(lines) + "\n")
        lines = []
        for task in tasks:
            state = "cancelling" if task.cancelling() else "pending"
            stream.write(f"task {task.get_name()!r} ({state}), outermost call first:\n")
            stream.writelines(f"{line}\n" for line in await_chain(task.get_coro()))
    lines.append(TASKS_FOOTER)
    stream.write("\n".join(lines) + "\n")
    stream.flush()


def await_chain(coro: object) -> list[str]:
    """Where a task is suspended: its coroutine and each one it awaits in turn, down to the
    innermost (`Task.print_stack` shows only the outermost coroutine, which says little:
    a stuck stop is in some helper three awaits below it)."""
    lines: list[str] = []
    current: Any = coro
    for _ in range(_TASK_FRAMES):
        frame = _frame_of(current)
        if frame is None:
            break
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        source = linecache.getline(code.co_filename, frame.f_lineno).strip()
        if source:
            lines.append(f"    {source}")
        current = _awaited(current)
    if current is not None and _frame_of(current) is None:
        lines.append(f"  awaiting {type(current).__name__}")
    return lines


def _frame_of(obj: Any) -> FrameType | None:
    for name in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(obj, name, None)
        if isinstance(frame, FrameType):
            return frame
    return None


def _awaited(obj: Any) -> Any:
    for name in ("cr_await", "gi_yieldfrom", "ag_await"):
        inner = getattr(obj, name, None)
        if inner is not None:
            return inner
    return None
