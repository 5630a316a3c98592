"""`taskcard inbox --workdir W [--peek] [--json]`: read the chat's texts from any host.

Without `--peek` it claims every queued message (acknowledged with via `inbox-cli`) and
prints each one framed as the agent should read it; `--peek` lists them and claims nothing.
Exit codes: 0 done (nothing queued too), 2 bad workdir or an inbox that is a link.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from taskcard.producers.inbox.claim import Batch, InboxUnsafe, claim_all, peek
from taskcard.producers.inbox.contract import frame
from taskcard.producers.task_card.contract import terminal_json
from taskcard.producers.task_card.workdir_arg import existing_workdir_arg

VIA: Final = "inbox-cli"


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
        batch: Batch = peek(workdir) if args.peek else claim_all(workdir, VIA)
    except InboxUnsafe as exc:
        print(f"taskcard inbox: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"taskcard inbox: cannot read the inbox: {exc}", file=sys.stderr)
        return 1
    for problem in batch.problems:
        print(f"taskcard inbox: warning: {problem}", file=sys.stderr)
    if args.json:
        result = {
            "claimed": not args.peek,
            "messages": [message.summary() for message in batch.messages],
        }
        print(terminal_json(result, indent=2))
    elif batch.messages:
        print("\n\n".join(frame(message) for message in batch.messages))
    else:
        print("taskcard inbox: nothing queued", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inbox",
        help="claim and print the texts people queued for this agent from a chat",
        description=(
            "Claim every message queued in <workdir>/inbox/queued/ (oldest first), "
            "acknowledge it as delivered, and print it framed as a message from a person in "
            "a chat. --peek lists without claiming."
        ),
    )
    parser.add_argument(
        "--workdir", type=existing_workdir_arg, default=".", help="the agent's working directory"
    )
    parser.add_argument("--peek", action="store_true", help="list only; claim nothing")
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    parser.set_defaults(handler=run)
