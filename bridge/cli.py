"""The `taskcard` command line: one parser, subcommands registered by the modules that own them.

Each owner module exposes `register(subparsers)`, adding its subcommands with a `handler`
default: a function from the parsed arguments to an exit code. The conventions live here, so
every subcommand gets them: help text that shows each default, the exit codes below in
`--help`, `--version`, and a command group given no subcommand prints its help and exits 2
(a usage error, as argparse's own), whether that is `taskcard` alone or `taskcard card`.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any, Final, NoReturn

from taskcard.bridge.run import early_stop

EXIT_OK: Final = 0
EXIT_RUNTIME: Final = 1
EXIT_USAGE: Final = 2
EXIT_ALREADY_RUNNING: Final = 3
EXIT_UNREACHABLE: Final = 4
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141  # as a shell reports a command SIGPIPE ended

EXIT_CODES_EPILOG: Final = f"""\
exit codes:
  {EXIT_OK}    done
  {EXIT_RUNTIME}    runtime failure (the service stopped on an error, a task card call failed)
  {EXIT_USAGE}    usage or configuration error (bad arguments, invalid config, missing workdir
       or secret, a metrics address that cannot be bound)
  {EXIT_ALREADY_RUNNING}    already running (a service on that state_dir, a host for that workdir
       or a program's own Python TaskCard holding it)
  {EXIT_UNREACHABLE}    no task card host could be reached or started
  129, 143
       `taskcard inbox` stopped by SIGHUP or SIGTERM before its reader had taken every
       message: those went back to the queue
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); serve, demo and host take it as a stop and exit 0
  {EXIT_BROKEN_PIPE}  the reader of the output went away (`taskcard ... | head`); nothing on
       stderr, except from `taskcard inbox`, which says how many messages went back

environment:
  TASKCARD_CONFIG       default for --config
  TASKCARD_LOG_LEVEL    default for --log-level
  TASKCARD_LOG_FORMAT   default for --log-format
  TASKCARD_RUNTIME_DIR  default for --runtime-dir (task card hosts' sockets and locks)
  TASKCARD_ORIGIN       the chat a turn came from, which the hooks write into turn.start
"""

# Modules that contribute subcommands, in the order `taskcard --help` lists them.
_COMMAND_MODULES = (
    "taskcard.bridge.run.serve_cli",
    "taskcard.bridge.run.chats_cli",
    "taskcard.bridge.run.demo",
    "taskcard.producers.agent_hooks.activity_cli",
    "taskcard.producers.task_card.cli",
    "taskcard.producers.ledger.cli",
    "taskcard.producers.agent_hooks.cli",
    "taskcard.producers.inbox.cli",
    "taskcard.producers.reports.cli",
)

Handler = Callable[[argparse.Namespace], int]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps hand-wrapped epilogs and appends `(default: X)` to options that have a default.

    Unlike `ArgumentDefaultsHelpFormatter` it leaves out defaults that say nothing (None,
    a flag's: `--failed` stores False into a field whose default is True) and help that
    already names its default.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "default" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
            or action.nargs == 0
        ):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """Every parser of the command line, subcommands included, formats help the same way,
    and says a usage error in one line naming the argument and where the help is (argparse
    printed its usage block first, several lines before the one that matters)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.set_defaults(_parser=self)  # the innermost command's parser (see parse_args)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message}; see `{self.prog} --help`\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an unknown option is said by the command it was given to
        (`taskcard inbox: unrecognized arguments: --bogus`), not by `taskcard`."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            innermost: argparse.ArgumentParser = getattr(parsed, "_parser", self)
            innermost.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def print_help_handler(parser: argparse.ArgumentParser) -> Handler:
    """The handler of a command group called without a subcommand: its help, exit 2."""

    def show(args: argparse.Namespace) -> int:
        del args
        parser.print_help()
        return EXIT_USAGE

    return show


def package_version() -> str:
    # Imported here: it costs every run (a hook's on each tool call) 60 ms otherwise.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("taskcard")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"


class _VersionAction(argparse.Action):
    """`--version`, looking the version up only when asked (reading the installed package's
    metadata costs a hook's run a tenth of a second)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version"
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"{parser.prog} {package_version()}")
        parser.exit()


def build_parser(modules: Sequence[str] = _COMMAND_MODULES) -> argparse.ArgumentParser:
    """The whole command line, or only the commands `modules` register (a hook's run)."""
    parser = Parser(
        prog="taskcard",
        description="Keep one truthful task card per agent in Telegram and Feishu chats.",
        epilog=EXIT_CODES_EPILOG,
    )
    parser.add_argument("--version", action=_VersionAction)
    parser.set_defaults(handler=print_help_handler(parser))
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in modules:
        import_module(name).register(subparsers)
    _register_completion(subparsers)
    _groups_print_help(parser)
    _each_knows_its_parser(parser)
    return parser


def _each_knows_its_parser(parser: argparse.ArgumentParser) -> None:
    """Every parser of the tree records itself as the innermost one (see `Parser.parse_args`),
    also a subcommand a module built with a parser class of its own (`ledger`'s, which must
    not import this module): `taskcard ledger show --bogus` is said by `taskcard ledger
    show`, with its help, not by `taskcard ledger`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(_parser=sub)
                _each_knows_its_parser(sub)


def _groups_print_help(parser: argparse.ArgumentParser) -> None:
    """Every command group that registered no handler of its own (`ledger`, `init`) prints
    its help and exits 2 when called alone, as `taskcard card` does, instead of argparse's
    one-line "arguments are required". Not `hook`: an agent host runs it, and its usage
    errors exit 0 (see `_HOST_HOOKS`)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, group in action.choices.items():
            inner = [a for a in group._actions if isinstance(a, argparse._SubParsersAction)]
            if not inner or name in _HOST_HOOKS:
                continue
            if group.get_default("handler") is None:
                for subcommands in inner:
                    subcommands.required = False
                group.set_defaults(handler=print_help_handler(group))
            _groups_print_help(group)


def _register_completion(subparsers: Any) -> None:
    completion = subparsers.add_parser(
        "completion",
        help="print a shell completion script",
        description=(
            "Print a completion script for the shell. Bash: "
            "`taskcard completion bash > ~/.local/share/bash-completion/completions/taskcard`. "
            "Zsh: `taskcard completion zsh > ~/.zfunc/_taskcard` (with ~/.zfunc in $fpath)."
        ),
    )
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete for")
    completion.set_defaults(handler=_completion)


def _completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


# Commands an agent host runs inside its own loop. A usage error there (a hand-edited hook
# command, an option this version lacks) still exits 0 with argparse's message on stderr: a
# Claude Code hook that exits 2 blocks the tool call, erases the prompt or keeps the
# session from stopping, feeding the usage text to the model.
_HOST_HOOKS: Final = frozenset({"hook"})
# What registers `hook`: an agent host runs it on every tool call, so it builds only its own
# command (the service's modules it would import otherwise cost about 0.3 s of CPU a call).
_HOOK_MODULE: Final = "taskcard.producers.agent_hooks.cli"


# Errors of writing to stdout when it is a file on a full or failing disk.
_OUTPUT_FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _stopped_early(stopped: early_stop.StopRequested) -> int:
    """`serve` asked to stop before it held anything (no lock, no store): a clean stop."""
    print(f"taskcard: stopped ({stopped}) before the service started", file=sys.stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["serve"]:
        # SIGTERM and SIGINT stop the service cleanly from here on, whatever it is doing
        # (see `early_stop`); their default actions would end it with nothing flushed.
        early_stop.install()
    if words[:1] == ["serve"] and hasattr(signal, "SIGHUP"):
        # SIGHUP reloads once the service runs; until then (the imports, the checks, the
        # channels' start) and while it winds down, its default action would end the service,
        # and systemd does not restart a service that a SIGHUP ended. One that arrives before
        # the file is read changes nothing anyway; one after it is dropped (send it again).
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        # The imports: most of a start's first second.
        parser = build_parser((_HOOK_MODULE,) if words[:1] == ["hook"] else _COMMAND_MODULES)
        args = parser.parse_args(words)
    except early_stop.StopRequested as stopped:
        return _stopped_early(stopped)
    except SystemExit as exc:
        # The command is the first word that is no option: `taskcard --verbose hook ...`
        # (an option this version lacks, before the command) is a hook's mistake too.
        command = next((word for word in words if not word.startswith("-")), None)
        if exc.code not in (0, None) and command in _HOST_HOOKS:
            return EXIT_OK
        raise
    handler: Handler = args.handler
    try:
        return handler(args)
    except early_stop.StopRequested as stopped:
        return _stopped_early(stopped)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # No traceback for `taskcard card inspect ... | head -1`; stdout goes to /dev/null so
        # the interpreter's last flush at exit cannot fail on the closed pipe again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as error:
        if error.filename is not None or error.errno not in _OUTPUT_FULL:
            raise
        # `taskcard status > status.txt` on a full disk: one line, not a traceback, and the
        # interpreter's last flush at exit must not fail on the same output again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        print(f"taskcard: cannot write the output ({error.strerror})", file=sys.stderr)
        return EXIT_RUNTIME


if __name__ == "__main__":
    sys.exit(main())
