"""SIGTERM and SIGINT of `taskcard serve` outside the service loop: a stop, never a kill.

The service loop takes both signals as its stop (`runner.serve`), but only once it runs. Before
that come the imports, the configuration, the serve lock, the store or the cluster's Redis,
the channels' set-up; after it, the wind-down. A signal then used to end the process by its
default action: nothing flushed, no stop line, an exit status by signal (which systemd logs
as a failure), and a Ctrl-C printed a traceback.

`install` (the first thing `taskcard serve` does) replaces both defaults with a handler that
notes the signal. Until `hold`, nothing is held that a stop must put back (no lock, no store),
so the handler also unwinds at once with `StopRequested` (a configuration read from a named
pipe with no writer yet cannot keep the service from stopping). From `hold` on, the start-up
asks `requested()` between its steps and stops there, cleanly; each step is bounded (the
store's busy timeout, the Redis probe's timeouts). A step that fails after a stop was asked
for ends as the stop does (exit 0), its failure logged: the operator asked for a stop, and
systemd must not read a configuration error into it. Once the service has stopped and its loop
gave the signals back, `force` makes a further one end the process at once, as a second
Ctrl-C does in most programs.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Final

SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


class StopRequested(BaseException):
    """A stop signal before anything was held: the command ends with exit code 0.

    A BaseException, as KeyboardInterrupt is: no `except Exception` on the way may take it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


class _State:
    installed: bool = False
    signum: int | None = None
    unwind: bool = True


def install() -> None:
    """Take SIGTERM and SIGINT as a stop request from now on (see the module's text)."""
    _State.installed = True
    _State.signum = None
    _State.unwind = True
    restore()


def restore() -> None:
    """Put the noting handler on both signals; nothing when `install` never ran (the service
    run inside another program keeps that program's handlers)."""
    if _State.installed:
        for signum in SIGNALS:
            signal.signal(signum, _note)


def force() -> None:
    """The service's own work is done and its loop's handlers are gone (only closing the
    store and the loop's teardown are left): a SIGTERM or SIGINT now ends the process at
    once, SIGINT as a KeyboardInterrupt (exit 130). It is the operator's second signal, the
    way out when the teardown is held by something that never returns (a thread of the
    loop's default executor, which the teardown waits for without a timeout). Nothing when
    `install` never ran."""
    if _State.installed:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def hold() -> None:
    """From now on a signal is only noted: the start-up stops at its next step."""
    _State.unwind = False


def note(signum: int) -> None:
    """A stop signal the service loop's own handler took: `requested` names it from now on,
    so a start-up step that fails after it ends as a stop, not as the step's failure."""
    if _State.signum is None:
        _State.signum = signum


def requested() -> str | None:
    """The name of the stop signal received so far ("SIGTERM"), or None."""
    return None if _State.signum is None else signal.Signals(_State.signum).name


def _note(signum: int, frame: FrameType | None) -> None:
    del frame
    first = _State.signum is None
    if first:
        _State.signum = signum
    if _State.unwind and first:
        raise StopRequested(signum)
