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

With JSON logs (`--log-format json`) each line of the dump is a log record of its own (logger
`taskcard.bridge.run.stackdump`, level INFO), so a log shipper reading one JSON object per
line never meets a plain one. Both views then go into a pipe instead of stderr, and a
thread of this module turns each line into a record for the log's handler (formatted and
scrubbed as every other line, whatever the log level). The thread reads while the main
thread is blocked, so a stuck loop still shows its threads' stacks; the pipe's write end
does not block, so a dump that does not fit while nobody reads is cut short, never waited on.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import linecache
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, TextIO

from taskcard.channels.base import counted

TASKS_HEADER = "--- asyncio tasks (SIGUSR1) ---"
TASKS_FOOTER = "--- end of asyncio tasks ---"
# Frames shown per task: deep enough for any await chain of the service.
_TASK_FRAMES = 40
# The frame local in which a generator that drives a coroutine by hand keeps it (`_awaited`).
DRIVEN_LOCAL = "driven"


_RECORDS_LOGGER = "taskcard.bridge.run.stackdump"


def install(stream: TextIO | None = None, *, as_records: bool = False) -> None:
    """Make SIGUSR1 dump every thread's and every asyncio task's stack to `stream`
    (stderr by default), or with `as_records` each line as a log record through the root
    logger's handlers (JSON logs). Call it from the main thread before the event loop
    starts, and after the logging is set up."""
    out = stream or sys.stderr
    if out is None:  # fd 2 was closed at start: `faulthandler` would refuse it
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        return
    if as_records:
        out = _records_pipe()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # see the module's doc
            dump_tasks(out, frame)

    signal.signal(signal.SIGUSR1, on_signal)
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=True)


def _records_pipe() -> TextIO:
    """The write end of a pipe whose lines a daemon thread hands to the log's handlers as
    records, one per line (see the module's doc)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    threading.Thread(
        target=_forward_lines, args=(read_fd,), name="stackdump-records", daemon=True
    ).start()
    return io.TextIOWrapper(
        io.FileIO(write_fd, "w"), encoding="utf-8", errors="replace", write_through=True
    )


def _forward_lines(read_fd: int) -> None:
    pending = b""
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            _emit(line.decode("utf-8", "replace"))


def _emit(line: str) -> None:
    """One line of the dump as an INFO record, straight to the handlers: the dump was asked
    for, so the log level does not hold it back."""
    record = logging.LogRecord(_RECORDS_LOGGER, logging.INFO, __file__, 0, line, None, None)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.handle(record)


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
        lines.append(counted(len(tasks), "task", "tasks"))
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
    # A generator that drives another coroutine by hand (passing its yields through, as a
    # lane's request runs in `bridge.schedule.scheduler._Waits.awaited`) has no
    # `gi_yieldfrom`: it keeps what it drives in its frame's local `driven`.
    frame = getattr(obj, "gi_frame", None)
    if isinstance(frame, FrameType):
        return frame.f_locals.get(DRIVEN_LOCAL)
    return None
