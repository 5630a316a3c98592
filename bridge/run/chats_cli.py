"""`taskcard chats`: the chats and forum topics the bot has received commands from.

Finding a chat id (and a topic's thread id) is the first hurdle of a new route: the service
records every chat a `/taskcard` arrives from, routed or not, so an operator sends the command
once in the chat and reads the id here instead of digging it out of an API response.

With `[cluster]` the chats are read from the shared Redis, where every instance records the
commands it reads from the shared stream; the local state file of one instance would miss the
chats the others were asked from. `routed` then says whether THIS configuration routes the
chat (another instance's configuration may route it instead).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from taskcard.bridge.config import ServiceConfig
from taskcard.bridge.deliver.registry import RouteSpec, route_specs, stored_topic_names
from taskcard.bridge.run.chat_names import as_last_resolved
from taskcard.bridge.run.serve_cli import (
    EXIT_CONFIG,
    UNREADABLE,
    _config_option,
    _load,
    no_config_given,
)
from taskcard.bridge.run.terminal import printable
from taskcard.bridge.store.base import SeenChat, StateFileError, StateStore
from taskcard.bridge.store.sqlite import STATE_FILE, UNFIT_STATE_ERRORS, SqliteStore, unfit_state
from taskcard.producers.task_card.contract import terminal_json


def _seen_chats(
    config: ServiceConfig,
) -> tuple[list[SeenChat], set[tuple[str, str, str | None]], dict[tuple[str, str, str], str]]:
    """The chats the store recorded (the cluster's shared one, else this state file's), the
    chats this config routes, each under the id the service keys it by (a supergroup a
    routed group became is listed under the group's id, as its commands are recorded), and
    the names of the seen topics that their channel kept (`_topic_names`).

    Raises `StateFileError` (one line, no secret) when the cluster's Redis cannot be reached.
    """
    store: StateStore
    if config.cluster.enabled:
        from taskcard.bridge.run.cluster_serve import status_store

        store = status_store(config, os.environ)
    else:
        path = config.state_dir / STATE_FILE
        if not path.exists():
            return [], _routed(route_specs(config)), {}
        store = SqliteStore(path, readonly=True)
    try:
        config = as_last_resolved(config, store)  # a route's @username: its chat's id
        chats = store.seen_chats()
        return chats, _routed(route_specs(config, store)), _topic_names(store, chats)
    finally:
        store.close()


def _topic_names(store: StateStore, chats: list[SeenChat]) -> dict[tuple[str, str, str], str]:
    """The kept names of the topics among `chats`, by (channel, chat id, thread id): one
    read per chat that has topics."""
    names: dict[tuple[str, str, str], str] = {}
    for channel, chat_id in dict.fromkeys((c.channel, c.chat_id) for c in chats if c.thread_id):
        for thread_id, name in stored_topic_names(channel, store, chat_id).items():
            names[(channel, chat_id, thread_id)] = name
    return names


def _routed(specs: list[RouteSpec]) -> set[tuple[str, str, str | None]]:
    return {(spec.channel, spec.chat.chat_id, spec.chat.thread_id) for spec in specs}


def seen_chats_report(config: ServiceConfig) -> list[dict[str, Any]]:
    """Every chat seen, newest first, with whether a route of this config covers it."""
    chats, routed, topics = _seen_chats(config)
    return [
        {
            "channel": chat.channel,
            "chat_id": chat.chat_id,
            "thread_id": chat.thread_id,
            # The forum topic's name, as the platform told it when it was opened or renamed
            # (or with a message in it): null when none is known, and for a whole chat.
            "topic": topics.get((chat.channel, chat.chat_id, chat.thread_id or "")),
            "title": chat.title,
            # An unreadable time is null (the chat listed last, as seen long ago), as
            # `status` shows its unreadable times.
            "last_seen": None
            if "last_seen" in chat.unreadable
            else datetime.fromtimestamp(chat.last_seen, UTC)
            .isoformat(timespec="seconds")
            .replace("+00:00", "Z"),
            "routed": (chat.channel, chat.chat_id, chat.thread_id) in routed,
        }
        for chat in chats
    ]


# The widest a cell of the table grows: a title or id past it (a state edited by hand; the
# platforms cap titles far below) is cut, or every row was padded to its width. `--json`
# keeps the whole text.
MAX_CELL_CHARS: Final = 100


def _cell(text: str) -> str:
    shown = printable(text)
    if len(shown) <= MAX_CELL_CHARS:
        return shown
    return f"{shown[: MAX_CELL_CHARS - 3]}..."


def _thread(row: dict[str, Any]) -> str:
    """A row's THREAD cell: the thread id, and the topic's name beside it when known."""
    if not row["thread_id"]:
        return "-"
    return row["thread_id"] if row["topic"] is None else f'{row["thread_id"]} "{row["topic"]}"'


def _table(rows: list[dict[str, Any]]) -> str:
    header = ("CHANNEL", "CHAT ID", "THREAD", "TITLE", "LAST SEEN", "ROUTED")
    lines = [
        (
            _cell(row["channel"]),
            _cell(row["chat_id"]),
            _cell(_thread(row)),
            _cell(row["title"] or "-"),
            row["last_seen"] or UNREADABLE,
            "yes" if row["routed"] else "no",
        )
        for row in rows
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=True)]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in (header, *lines)
    )


def _nothing_seen(config: ServiceConfig) -> str:
    """What to do when no chat is recorded. A configuration without a channel that receives
    commands (the console alone, say) was told to send /taskcard "in the chat", which it has
    none of."""
    if config.telegram is None and config.feishu is None:
        return (
            "No command seen yet, and none can arrive: this configuration has no chat channel "
            "(the console takes no commands). Add a [telegram] or [feishu] section (see "
            "config/taskcard.example.toml), start `taskcard serve`, send /taskcard in the chat, "
            "then run this again."
        )
    telegram_off = config.telegram is None or not config.telegram.commands
    feishu_off = config.feishu is None or config.feishu.events == "none"
    if telegram_off and feishu_off:
        off = [
            *(["telegram.commands = false"] if config.telegram is not None else []),
            *(['feishu.events = "none"'] if config.feishu is not None else []),
        ]
        return (
            f"No command seen yet, and none can arrive: this configuration receives no commands "
            f"({', '.join(off)}). Turn them on, start `taskcard serve`, send /taskcard in the "
            "chat, then run this again."
        )
    return (
        "No command seen yet. With `taskcard serve` running, send /taskcard in the chat "
        "(or forum topic), then run this again."
    )


def _chats(args: argparse.Namespace) -> int:
    if args.config is None:
        no_config_given(args, "--config", "--config FILE")
    config = _load(Path(args.config))
    if config is None:
        return EXIT_CONFIG
    try:
        rows = seen_chats_report(config)
    except StateFileError as error:
        print(f"taskcard: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as error:
        if not config.cluster.enabled:
            if not isinstance(error, UNFIT_STATE_ERRORS):
                raise
            print(f"taskcard: {unfit_state(config.state_dir / STATE_FILE, error)}", file=sys.stderr)
            return EXIT_CONFIG
        from taskcard.bridge.run.cluster_serve import say_read_failure

        say_read_failure(error)  # raises what it cannot say in one line
        return EXIT_CONFIG
    if args.json:
        print(terminal_json(rows, indent=2))
    elif not rows:
        print(_nothing_seen(config))
    else:
        print(_table(rows))
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "chats",
        help="list the chats and topics the bot has received /taskcard from (to find ids)",
        description=(
            "List every chat and forum topic a /taskcard command arrived from while the "
            "service ran, routed or not: channel, chat id, thread id (with the forum topic's "
            "name when known), title, last seen. With "
            "[cluster], the chats every instance saw, from the shared Redis."
        ),
    )
    _config_option(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_chats)
