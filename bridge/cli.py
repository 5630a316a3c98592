"""The `taskcard` command line: one parser, subcommands registered by the modules that own them.

Each owner module exposes `register(subparsers)`, adding its subcommands with a `handler`
default: a function from the parsed arguments to an exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

# Modules that contribute subcommands, in the order `taskcard --help` lists them.
_COMMAND_MODULES = (
    "bridge.run.serve_cli",
    "bridge.run.chats_cli",
    "bridge.run.demo",
    "producers.agent_hooks.activity_cli",
    "producers.task_card.cli",
    "producers.ledger.cli",
    "producers.agent_hooks.cli",
)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="taskcard",
        description="Keep one truthful task card per agent in Telegram and Feishu chats.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in _COMMAND_MODULES:
        import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
