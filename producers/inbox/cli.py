"""`taskcard inbox --workdir W [--peek] [--json]`: read the chat's texts from any host.

Without `--peek` it claims every queued message and prints each one framed as the agent
should read it, acknowledging it (via `inbox-cli`) only once its reader has it: a reader that
goes away mid-way (`| head -1`, a closed pipe) leaves the rest queued for the next read.
`--peek` lists them and claims nothing. Exit codes: 0 done (nothing queued too), 2 bad
workdir or an inbox that is a link, 141 the output closed before every message was read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from taskcard.producers.inbox.claim import (
    Batch,
    Claim,
    InboxReadFailed,
    InboxUnsafe,
    InboxWriteFailed,
    claiming,
    peek,
)
from taskcard.producers.inbox.contract import INBOX_DIR, frame
from taskcard.producers.inbox.output import PATIENCE_S, Output
from taskcard.producers.task_card.contract import counted, terminal_json
from taskcard.producers.task_card.workdir_arg import WorkdirError, existing_workdir_arg

VIA: Final = "inbox-cli"
EXIT_BROKEN_OUTPUT: Final = 141  # as a shell reports a command SIGPIPE ended


def run(args: argparse.Namespace) -> int:
    workdir: Path = args.workdir
    if sys.stdout is None:  # started with stdout closed (`>&-`): nothing could be shown
        # Claiming acknowledges a message as delivered: the chat would say so of a text the
        # agent never saw ("stop now", say). So nothing is claimed.
        print(
            "taskcard inbox: stdout is closed, so no message could be shown; nothing was"
            " claimed (the messages stay queued)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.peek:
            return _show_peek(args, peek(workdir))
        stop = _Stop()
        with stop.installed():
            with claiming(workdir, VIA) as claim:
                code = _deliver(args, claim, stop)
            stop.check()  # noted during the release: the messages are back, now it ends
    except (InboxUnsafe, WorkdirError) as exc:  # a folder to fix, a workdir in a loop or gone
        print(f"taskcard inbox: {exc}", file=sys.stderr)
        return 2
    except (InboxReadFailed, InboxWriteFailed) as exc:  # the folder, the cause and the fix
        print(f"taskcard inbox: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # none known: said as a failed read of the inbox, as the others
        print(f"taskcard inbox: {InboxReadFailed(f'{INBOX_DIR}/', exc)}", file=sys.stderr)
        return 1
    for problem in claim.problems:
        print(f"taskcard inbox: warning: {problem}", file=sys.stderr)
    return code


class _Stop:
    """SIGTERM and SIGHUP (a host ending its session, a closed terminal) end the command
    through Python, so the claim's end puts the messages not yet delivered back. The signal
    ends it at once only while it waits for its reader (`waiting`); during a claim, an
    acknowledgement or a release it is noted and acted on at the next `check`, so none of
    them stops half-way."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._armed = False

    def _handle(self, signum: int, frame: object) -> None:
        self.signum = signum
        if self._armed:
            self._armed = False
            raise SystemExit(128 + signum)

    def check(self) -> None:
        if self.signum is not None:
            raise SystemExit(128 + self.signum)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        self.check()
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        numbers = (signal.SIGTERM, signal.SIGHUP)
        before = {number: signal.signal(number, self._handle) for number in numbers}
        try:
            yield
        finally:
            for number, handler in before.items():
                signal.signal(number, handler)


def _show_peek(args: argparse.Namespace, batch: Batch) -> int:
    for problem in batch.problems:
        print(f"taskcard inbox: warning: {problem}", file=sys.stderr)
    if args.json:
        result = {"claimed": False, "messages": [m.summary() for m in batch.messages]}
        text = terminal_json(result, indent=2)
    elif batch.messages:
        text = "\n\n".join(frame(message) for message in batch.messages)
    else:
        print("taskcard inbox: nothing queued", file=sys.stderr)
        return 0
    # Written as a delivery is (`Output`), so a failed write is said as one: a full disk or
    # a closed pipe under `--peek` was "cannot read the inbox", naming no file.
    out = _output()
    if out.deliver((text + "\n").encode(), confirm=False):
        return 0
    _silence(out)
    print(f"taskcard inbox: {out.gone}; --peek claims nothing: all stay queued", file=sys.stderr)
    return EXIT_BROKEN_OUTPUT


def _silence(out: Output) -> None:
    """No more output can reach anyone: the interpreter's last flush at exit must not fail on
    it again (a traceback), so stdout now leads to the null device."""
    if out.fd >= 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, out.fd)
        os.close(null)


def _deliver(args: argparse.Namespace, claim: Claim, stop: _Stop) -> int:
    """Print the claimed messages; each is acknowledged once its reader has it (see
    `output.py`), the rest go back to the queue when the reader goes away."""
    messages = claim.messages
    if not args.json and not messages:
        print("taskcard inbox: nothing queued", file=sys.stderr)
        return 0
    out = _output()
    if args.json:  # one document: the reader has all of it or none
        result = {"claimed": True, "messages": [m.summary() for m in messages]}
        with stop.waiting():
            delivered = out.deliver((terminal_json(result, indent=2) + "\n").encode())
        if delivered:
            claim.delivered(*messages)
    else:
        for n, message in enumerate(messages):
            text = ("\n" if n else "") + frame(message) + "\n"  # a blank line between
            with stop.waiting():
                delivered = out.deliver(text.encode())
            if not delivered:
                break
            claim.delivered(message)
            if out.late:  # a reader that reads later, if at all: hand it no more
                break
    if out.gone is None:
        back = len(claim.unsettled())
        if back:
            print(
                f"taskcard inbox: the reader took nothing for {PATIENCE_S:.0f} s; "
                f"{counted(back, 'message', 'messages')} left queued for the next read",
                file=sys.stderr,
            )
        return 0
    _silence(out)
    back = len(claim.unsettled())
    print(
        f"taskcard inbox: {out.gone} after {len(messages) - back} of"
        f" {counted(len(messages), 'message', 'messages')}; {back} queued again for the next"
        " read",
        file=sys.stderr,
    )
    return EXIT_BROKEN_OUTPUT


def _output() -> Output:
    """stdout as a descriptor, with whatever Python buffered written first."""
    sys.stdout.flush()
    try:
        return Output(sys.stdout.fileno())
    except (OSError, ValueError):  # not a file (an embedding caller's stream)
        return _StreamOutput()


class _StreamOutput(Output):
    """sys.stdout when it has no descriptor: a complete write and flush counts."""

    def __init__(self) -> None:
        self.fd = -1
        self.gone = None

    def deliver(self, data: bytes, *, confirm: bool = True) -> bool:
        if self.gone is not None:
            return False
        try:
            sys.stdout.write(data.decode())
            sys.stdout.flush()
        except (OSError, ValueError) as exc:
            self.gone = f"cannot write the output ({exc})"
            return False
        return True


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inbox",
        help="claim and print the texts people queued for this agent from a chat",
        description=(
            "Claim every message queued in <workdir>/inbox/queued/ (oldest first) and print "
            "each framed as a message from a person in a chat, acknowledging it as delivered "
            "once the reader has it; what the reader did not take goes back to the queue. "
            "--peek lists without claiming."
        ),
    )
    parser.add_argument(
        "--workdir", type=existing_workdir_arg, default=".", help="the agent's working directory"
    )
    parser.add_argument("--peek", action="store_true", help="list only; claim nothing")
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    parser.set_defaults(handler=run)
