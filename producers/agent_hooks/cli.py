"""`taskcard hook claude-code|codex` and `taskcard init claude-code|codex`."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Final

from taskcard.producers.agent_hooks import runner
from taskcard.producers.agent_hooks.inbox_hook import Handover
from taskcard.producers.agent_hooks.install import (
    InitError,
    Version,
    codex_config_path,
    init_claude_code,
    init_codex,
    parse_version,
)
from taskcard.producers.agent_hooks.payload_json import read_json
from taskcard.producers.task_card.contract import broken_link, cannot_write, expand_home
from taskcard.producers.task_card.stdin_json import read_stdin_object
from taskcard.producers.task_card.workdir_arg import (
    existing_workdir_arg,
    file_path_problem,
    shown_path,
)

# A host writes the hook's JSON and closes its stdin. One that keeps the pipe open (a wrapper
# holding its end, a host bug) held the hook until the host's timeout killed it, and the
# event was lost: a whole JSON object followed by `QUIET_S` of silence is the payload (and
# bytes no more input can make one are taken as they are, to be logged as not JSON), and
# `_IDLE_S` without a byte ends the read with what came (nothing: "no payload" is logged).
_IDLE_S: Final = 5.0  # under the 10 s `init` gives each hook


def _read_stdin(limit: int) -> bytes:
    """At most `limit + 1` bytes of stdin, up to its end or, when it stays open, a settled
    payload (`read_stdin_object`); none when the hook was started with it closed (Python then
    has no `sys.stdin`, and the hook died with a traceback and exit 1)."""
    if sys.stdin is None:
        return b""
    return read_stdin_object(limit, read_json, _IDLE_S)[0]


def _command(args: argparse.Namespace) -> str:
    """The hook's command as typed (`taskcard hook codex`), which its errors start with."""
    parser = getattr(args, "_parser", None)
    return parser.prog if parser is not None else f"taskcard hook {args.host}"


def run_hook(args: argparse.Namespace) -> int:
    """Always exit 0: a hook must not break its agent (errors go to the workdir's log)."""
    handover = Handover()  # the chat's messages, delivered only once the output is written
    if args.host == "claude-code":
        try:
            raw = _read_stdin(runner.MAX_PAYLOAD_BYTES)
        except OSError:
            raw = b""
        text = runner.run_guarded(
            args.workdir,
            raw,
            lambda: runner.claude_code(raw, args.workdir, handover=handover),
            _command(args),
        )
    else:
        # The notify program gets its JSON as an argument; a lifecycle hook, on stdin.
        argument: bytes | str = args.payload or ""
        if args.payload is None and sys.stdin is not None and not sys.stdin.isatty():
            try:
                argument = _read_stdin(runner.MAX_PAYLOAD_BYTES)
            except OSError:
                argument = b""

        def handle() -> str:
            return runner.codex(argument, args.workdir, only_in=args.only_in, handover=handover)

        hint = args.workdir if args.workdir is not None else args.only_in
        text = runner.run_guarded(hint, argument, handle, _command(args))
    # The hosts read the hook's JSON as UTF-8, whatever the locale: written through the
    # locale's encoding (ASCII, Latin-1), a chat text in Chinese raised after the message was
    # claimed, so the chat read "delivered" and the agent never got it.
    # Started with stdout closed (`>&-`), Python has no `sys.stdout`: nothing can be said,
    # and the hook still exits 0 (it died with a traceback and exit 1). Whatever it claimed
    # from the inbox then goes back to the queue, as when the write fails.
    written = False
    with contextlib.suppress(OSError):
        if sys.stdout is not None:
            if text:
                sys.stdout.buffer.write(text.encode("utf-8", errors="replace") + b"\n")
            sys.stdout.buffer.flush()
            written = True
    handover.settle(written)
    return 0


def run_init(args: argparse.Namespace) -> int:
    workdir: Path = args.workdir
    try:
        if args.host == "claude-code":
            report = init_claude_code(workdir, version=args.claude_version)
        else:
            config = Path(args.config) if args.config else codex_config_path(os.environ)
            report = init_codex(workdir, config)
    except InitError as exc:
        print(f"taskcard init: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # `str(exc)` was "[Errno 20] Not a directory: '...'", the path whole and unescaped.
        where = exc.filename if exc.filename is not None else workdir
        print(f"taskcard init: {cannot_write(where, exc)}", file=sys.stderr)
        return 1
    for line in report:
        print(line)
    return 0


def _version_arg(text: str) -> Version:
    """`2.1.90`, or the whole line `claude --version` prints (`2.1.90 (Claude Code)`)."""
    version = parse_version(text)
    number = "" if version is None else ".".join(str(part) for part in version)
    first = (text.split() or [""])[0].removeprefix("v")
    if version is None or first != number:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a version; write it as claude --version prints it, e.g. 2.1.90"
        )
    return version


def codex_config_arg(text: str) -> str:
    """`init codex --config` as an argparse `type=`: an empty or blank name is a usage error.
    It meant the default, so `--config "$CONFIG"` with `CONFIG` unset wrote the hooks into
    the person's own `~/.codex` (or `$CODEX_HOME`), which every Codex project reads."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "is empty; give the path of Codex's config.toml, or leave the option out for"
            " $CODEX_HOME/config.toml or ~/.codex/config.toml"
        )
    # `--config=~/.codex/config.toml` (or the path in quotes) reaches us unexpanded: it was
    # written into a folder named `~` in the current folder, where no Codex looks.
    path = expand_home(text)
    if path is None:
        raise argparse.ArgumentTypeError(
            f"{shown_path(text)} cannot be expanded (no such user); give the full path of"
            " Codex's config.toml"
        )
    # A file on the way (`notes.txt/config.toml`) or a name too long to open was "cannot
    # write ...", exit 1, after the fact. A link on the way that leads nowhere or round a
    # loop is init's own refusal, in its words (`install._refuse_broken_link`).
    problem = file_path_problem(path)
    if problem is not None and broken_link(path) is None:
        raise argparse.ArgumentTypeError(f"{shown_path(text)} {problem}")
    return os.fspath(path)


def register(subparsers: Any) -> None:
    hook = subparsers.add_parser(
        "hook", help="turn one agent-host hook event into activity (always exits 0)"
    )
    hosts = hook.add_subparsers(dest="host", metavar="HOST")
    hosts.required = True
    claude = hosts.add_parser("claude-code", help="one Claude Code hook payload on stdin")
    claude.add_argument("--workdir", default=None, help="default: the payload's cwd")
    codex = hosts.add_parser(
        "codex", help="Codex's notify JSON as the argument, or a lifecycle hook's on stdin"
    )
    where = codex.add_mutually_exclusive_group()
    where.add_argument("--workdir", default=None, help="default: the payload's cwd")
    where.add_argument(
        "--only-in",
        default=None,
        metavar="WORKDIR",
        help="write into WORKDIR, and only for sessions whose cwd is in it (others are "
        "ignored): for hooks every project runs",
    )
    codex.add_argument("payload", nargs="?", help="notify's JSON (default: read stdin)")
    for sub in (claude, codex):
        sub.set_defaults(handler=run_hook)

    init = subparsers.add_parser("init", help="wire a project to the hooks and MCP server")
    targets = init.add_subparsers(dest="host", metavar="HOST")
    targets.required = True
    claude_init = targets.add_parser(
        "claude-code", help="merge into .claude/settings.json and .mcp.json"
    )
    claude_init.add_argument(
        "--claude-version",
        type=_version_arg,
        default=None,
        help="the Claude Code version the project runs (default: ask claude --version); "
        "hook events it predates are not registered",
    )
    codex_init = targets.add_parser(
        "codex", help="merge into Codex's config.toml and the hooks.json beside it"
    )
    codex_init.add_argument(
        "--config",
        type=codex_config_arg,
        default=None,
        help="default: $CODEX_HOME/config.toml or ~/.codex/config.toml",
    )
    for sub in (claude_init, codex_init):
        sub.add_argument(
            "--workdir",
            type=existing_workdir_arg,
            default=".",
            help="the agent's working directory",
        )
        sub.set_defaults(handler=run_init)
