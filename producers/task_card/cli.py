"""The producer's subcommands: `tool`, `card ...`, `host` and `mcp`.

`bridge.cli` calls `register(subparsers)`; `python -m taskcard.producers.task_card.cli` runs
the same commands on their own (the detached host is started that way, so it never imports the
projection service). Exit codes: 0 done, 1 the call was refused or failed (`call_failed`, a
`retry` whose render failed too), 2 a usage error or input that cannot be used at all (a
missing workdir, no action given, a runtime folder that is not private to us, and a result
whose code is one of `client.USAGE_CODES`: an envelope that is not a UTF-8 JSON object within
the limits or that the schema refuses, a renderer path that names no renderer file inside the
workdir), 3 a host already runs for the workdir (or holds it and does not answer, or a
program's own `TaskCard` holds it), 4 no host could be reached. `card` prints a
short summary for people; `--json` prints the result object. `manual` and `settings` only read
files, so `card` and `tool` answer them without starting or asking a host
(`client.call_via_host`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from taskcard.producers.task_card.client import (
    EXIT_ALREADY_RUNNING,
    SPAWN_TIMEOUT_S,
    USAGE_CODES,
    HostElsewhere,
    HostUnavailable,
    call_failed,
    call_via_host,
    held_refusal,
    host_log_file,
    ping,
)
from taskcard.producers.task_card.contract import one_line, terminal_json
from taskcard.producers.task_card.envelope import (
    MAX_ENVELOPE_BYTES,
    READ_ONLY_ACTIONS,
    EnvelopeError,
    check_values,
    decode_envelope,
)
from taskcard.producers.task_card.number_args import decimal_number, whole_number
from taskcard.producers.task_card.runtime import (
    RUNTIME_DIR_HELP,
    HostAlreadyRunning,
    HostPaths,
    RuntimeDirUnsafe,
    chosen_host_paths,
    runtime_dir_arg,
)
from taskcard.producers.task_card.settings import (
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_REFRESHES,
    DEFAULT_TIMEOUT_S,
)
from taskcard.producers.task_card.stdin_json import (
    DRAIN_MAX_BYTES,
    DRAIN_WITHIN_S,
    drain_stdin,
    read_stdin_object,
)
from taskcard.producers.task_card.workdir_arg import (
    existing_workdir_arg,
    writable_workdir_arg,
)

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
# A pipe on stdin that stays open this long without a byte (and without a settled envelope)
# ends the read with a refusal; a whole envelope, or bytes no more input can mend, followed
# by a moment's quiet is taken at once.
STDIN_IDLE_S: Final = 30.0
EXIT_UNREACHABLE: Final = 4
DEFAULT_IDLE_GRACE_S: Final = 120.0
DEFAULT_LEDGER_CHECK_S: Final = 30.0
CLI_REASONING: Final = "requested from the taskcard command line"


def _host_paths(args: argparse.Namespace, host: bool = True) -> HostPaths:
    """Raises `RuntimeDirUnsafe` for a runtime folder no host can use (`chosen_host_paths`);
    `host=False` for a call no host answers, which leaves the folder's place unchecked."""
    return chosen_host_paths(args.runtime_dir, os.environ, args.workdir, host=host)


def _emit(result: dict[str, Any], as_json: bool = True) -> int:
    if as_json:
        text = terminal_json(result, indent=2)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a path with undecodable bytes: escape rather than crash
            text = json.dumps(result, indent=2)
        print(text)
    else:
        print(summarize(result))
    if result.get("code") in USAGE_CODES:
        return EXIT_USAGE
    return EXIT_FAILED if call_failed(result) else EXIT_OK


def summarize(result: dict[str, Any]) -> str:
    """A few lines for people: the outcome first, then what the result says about the watch."""
    head = f"{result.get('action', 'call')}: {result.get('status', 'unknown')}"
    if result.get("watch_id"):
        head += f" (watch {result['watch_id']})"
    lines = [head]
    if result.get("message"):
        # It may name the workdir, whose name may hold a line break or a terminal escape.
        lines.append(f"  {one_line(str(result['message']))}")
    if "refreshes_remaining" in result:
        lines.append(
            f"  refreshes: {result.get('refreshes_used')} of {result.get('max_refreshes')}"
            f" used, {result['refreshes_remaining']} left"
        )
    if result.get("interval_s") is not None:
        lines.append(f"  every {result['interval_s']:g} s, renderer {result.get('renderer_path')}")
    if result.get("stop_reason"):
        lines.append(f"  why it stopped: {stop_reason_text(result['stop_reason'])}")
    if result.get("status") == "exhausted":
        final = result.get("final_retry_available")
        lines.append(
            "  final retry: available (retry once to publish a final state)"
            if final
            else "  final retry: not available (start a new watch to publish again)"
        )
    error = result.get("error")
    if isinstance(error, dict):
        # The message may quote the renderer's own output: one plain line, no escapes.
        lines.append(f"  error: {error.get('code')}: {one_line(str(error.get('message')))}")
    failed = result.get("refresh_error")
    if isinstance(failed, dict):  # a retry whose render failed: why, not only the state
        lines.append(f"  this render: {failed.get('code')}: {one_line(str(failed.get('message')))}")
    tail = result.get("stderr_tail")
    if not tail and isinstance(error, dict):
        tail = error.get("stderr_tail")
    said = [shown for shown in map(one_line, str(tail or "").splitlines()) if shown]
    if said:  # the renderer's own last word (a traceback ends with the exception)
        lines.append(f"  renderer stderr, last line: {said[-1]}")
    if result.get("last_body"):
        body = str(result["last_body"]).strip().splitlines()
        lines.append(f"  card (lines: {len(body)}): {one_line(body[0]) if body else ''}")
    for row in result.get("settings") or ():
        lines.append(f"  {row['key']} = {row['current']} (default {row['default']})")
    # A value of taskcard.json refused or a key not read: the owner must see it here too,
    # not only in --json (the rows alone showed the defaults as if nothing was written).
    for problem in (*(result.get("problems") or ()), *(result.get("settings_problems") or ())):
        lines.append(f"  settings problem: {one_line(str(problem))}")
    if result.get("body_removed") is not None:
        lines.append(f"  card body removed: {'yes' if result['body_removed'] else 'no'}")
    return "\n".join(lines)


# `stop_reason` as people read it; the result keeps the token (the manual documents it).
STOP_REASONS: Final = {
    "stopped": "a stop or remove call",
    "max_refreshes": "its refresh budget is used up; start a new watch to go on",
    "workdir_gone": "its workdir was deleted",
}


def stop_reason_text(reason: object) -> str:
    """Why a watch stopped, in words: the summary said `stopped: stopped` and
    `stopped: max_refreshes`. A reason a later host may add is shown as given, on one line."""
    return STOP_REASONS.get(str(reason)) or one_line(str(reason))


def _say(args: argparse.Namespace, message: str) -> None:
    """One error line on stderr, in the shape of every `taskcard` usage error: the command as
    typed (`taskcard card start: ...`), then what went wrong and the fix."""
    parser = getattr(args, "_parser", None)  # set by the `taskcard` parser; not by `main`
    command = parser.prog if parser is not None else f"taskcard {args.command}"
    print(f"{command}: {message}", file=sys.stderr)


def _refuse(message: str, as_json: bool = True, **extra: str) -> int:
    """An envelope we cannot use at all: the reason as a result, exit 2."""
    _emit({**extra, "status": "failed", "code": "bad_envelope", "message": message}, as_json)
    return EXIT_USAGE


def _call(args: argparse.Namespace, envelope: Any) -> dict[str, Any] | int:
    """The host's result, or the exit code when it could not be obtained."""
    try:
        # `manual` and `settings` use no host (`call_via_host` answers them itself): the
        # runtime folder's place among the default workdir's files is no concern of theirs.
        host = not (isinstance(envelope, dict) and envelope.get("action") in READ_ONLY_ACTIONS)
        return call_via_host(_host_paths(args, host), envelope, args.idle_grace_s)
    except RuntimeDirUnsafe as exc:
        _say(args, str(exc))
        return EXIT_USAGE
    except HostElsewhere as exc:
        _say(args, str(exc))
        return EXIT_ALREADY_RUNNING
    except (HostUnavailable, OSError, ValueError, subprocess.SubprocessError) as exc:
        _say(args, str(exc))
        return EXIT_UNREACHABLE


def _read_stdin_envelope() -> tuple[bytes, bool]:
    """(at most one byte over the cap, whether the read ended by itself): False when the
    pipe stayed open `STDIN_IDLE_S` without a byte and without a settled envelope (a caller
    that never closes it held the command forever). Reading stops one byte over the cap:
    the rest of an oversized input waits for the refusal to be answered (`run_tool`)."""
    return read_stdin_object(MAX_ENVELOPE_BYTES, _loads, STDIN_IDLE_S)


def _loads(data: bytes) -> object:
    # Digits kept as text: a long number is refused by `decode_envelope`, not waited on.
    return json.loads(data, parse_int=str)


def run_tool(args: argparse.Namespace) -> int:
    if args.envelope == "-":  # stdin, as `-` is for `report --payload` and most commands
        args.envelope = None
    # argv arrives decoded with surrogateescape; back to bytes so bad UTF-8 is named as such.
    if args.envelope is None and sys.stdin is None:  # started with stdin closed (`<&-`)
        return _refuse(
            "envelope: none given and stdin is closed; pass the envelope as the argument or"
            " pipe it to stdin"
        )
    if args.envelope is not None:
        raw, ended = os.fsencode(args.envelope), True
    else:
        raw, ended = _read_stdin_envelope()
    try:
        envelope = decode_envelope(raw, cut=args.envelope is None)
    except EnvelopeError as exc:
        if len(raw) > MAX_ENVELOPE_BYTES and args.envelope is None:
            # Answered before the rest is dropped: a writer that keeps sending, or keeps the
            # pipe open, held the refusal for as long as it wrote.
            code = _refuse(str(exc))
            sys.stdout.flush()
            drain_stdin(DRAIN_MAX_BYTES, DRAIN_WITHIN_S)
            return code
        if ended:
            return _refuse(str(exc))
        # What came is named exactly, as it would be had the pipe been closed after it.
        return _refuse(
            f"{exc}; stdin stayed open {STDIN_IDLE_S:g} s with nothing more: close stdin after"
            " writing the envelope, or pass it as the argument"
        )
    result = _call(args, envelope)
    return result if isinstance(result, int) else _emit(result)


def run_card(args: argparse.Namespace) -> int:
    # Every action, `manual` too, had its --workdir checked by the parser: one that names no
    # folder is a mistake worth saying, as `tool` says it for the same envelope. `manual` and
    # `settings` go the same way as the others: `call_via_host` answers them without a host.
    payload: dict[str, Any] = {}
    if args.card_action == "start":
        payload["renderer_path"] = args.renderer_path
        for name in ("interval_s", "timeout_s", "max_refreshes"):
            if getattr(args, name) is not None:
                payload[name] = getattr(args, name)
    elif args.card_action in ("inspect", "retry", "stop"):
        payload["watch_id"] = args.watch_id
    envelope = {"action": args.card_action, "input": payload, "reasoning": args.reasoning}
    problem = check_values(envelope)  # argv may carry bytes that are not UTF-8
    if problem:
        return _refuse(f"envelope: {problem}", args.json, action=args.card_action)
    result = _call(args, envelope)
    if isinstance(result, int):
        return result
    if args.card_action == "manual" and not args.json and result.get("status") == "ok":
        print(result["manual"])  # the manual itself is what people asked to read
        return EXIT_OK
    # A refused envelope comes back without its action; the summary names the command run.
    return _emit({"action": args.card_action, **result}, args.json)


def _private_paths(args: argparse.Namespace) -> HostPaths | None:
    """The host paths once the runtime folder is known to be ours; None after one line."""
    try:
        paths = _host_paths(args)
        paths.ensure_dir()
    except RuntimeDirUnsafe as exc:
        _say(args, str(exc))
        return None
    return paths


def run_host(args: argparse.Namespace) -> int:
    paths = _private_paths(args)
    if paths is None:
        return EXIT_USAGE
    if args.detach:
        return _detach(args, paths)
    # Imported here so `tool`/`card` stay light: they never run watches themselves.
    from taskcard.producers.task_card.capability import TaskCard
    from taskcard.producers.task_card.host import install_stop_signals, serve_host
    from taskcard.producers.task_card.renderer import become_subreaper

    stop = threading.Event()
    install_stop_signals(stop)
    # Orphans of renderers reparent to us, so the sweep after each render can find them.
    become_subreaper()
    try:
        card = TaskCard(paths.workdir, runtime_dir=paths.runtime_dir, served=True)
    except HostAlreadyRunning as exc:
        _say(args, str(exc))
        return EXIT_ALREADY_RUNNING
    except RuntimeDirUnsafe as exc:
        _say(args, str(exc))
        return EXIT_USAGE
    # The ledger's monitor runs here too, so a ledger needs no cron (lazy: the only import
    # of the ledger from the task card, and only in the host process).
    from taskcard.producers.ledger.hosted import ledger_supervisor

    serve_host(
        card,
        args.idle_grace_s or DEFAULT_IDLE_GRACE_S,
        stop,
        periodic=ledger_supervisor(card),
        periodic_s=args.ledger_check_s,
    )
    return EXIT_OK


def _detach(args: argparse.Namespace, paths: HostPaths) -> int:
    """Start the foreground host in its own session and return without waiting for it."""
    from taskcard.producers.task_card.renderer import HOST_PROCESS_ENV, RENDER_MARKS

    command = [
        sys.executable,
        "-m",
        "taskcard.producers.task_card.cli",
        "host",
        "--workdir",
        str(paths.workdir),
        "--runtime-dir",
        str(paths.runtime_dir),
    ]
    if args.idle_grace_s is not None:
        command += ["--idle-grace-s", str(args.idle_grace_s)]
    command += ["--ledger-check-s", str(args.ledger_check_s)]
    try:
        log_fd = host_log_file(paths)
    except RuntimeDirUnsafe as exc:
        _say(args, str(exc))
        return EXIT_USAGE
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
            cwd="/",
            # Called from inside a render (a renderer that starts another workdir's card),
            # the host must not carry that render's marks: the next host of the render's
            # workdir ends every process carrying its tag (`end_leftover_renders`). Marked
            # as a host, so that the rendering host it reparents to spares it.
            env={
                **{k: v for k, v in os.environ.items() if k not in RENDER_MARKS},
                HOST_PROCESS_ENV: "1",
            },
        )
    finally:
        os.close(log_fd)
    # Wait until it answers or dies, so a broken host is reported now, not after a timeout.
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while time.monotonic() < deadline:
        if ping(paths):
            return EXIT_OK
        code = proc.poll()
        if code is not None:
            if code == EXIT_ALREADY_RUNNING:
                # The host's own refusal went to its log: this exited 3 without a word.
                _say(args, held_refusal(paths))
            else:
                _say(args, f"the task card host exited with code {code}; see {paths.log}")
            return code
        time.sleep(0.05)
    _say(args, f"the task card host did not answer within {SPAWN_TIMEOUT_S:g} s")
    return EXIT_UNREACHABLE


def run_mcp(args: argparse.Namespace) -> int:
    # Refused before the MCP handshake: a client would otherwise list tools that all fail.
    if sys.stdin is None:  # started with stdin closed (`<&-`): no client to serve
        _say(args, "stdin is closed; an MCP client runs this command with its requests on stdin")
        return EXIT_USAGE
    import anyio

    from taskcard.producers.task_card.mcp_server import serve_stdio

    paths = _private_paths(args)
    if paths is None:
        return EXIT_USAGE
    anyio.run(serve_stdio, paths)
    return EXIT_OK


def _seconds(floor: float, ceiling: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds in [floor, ceiling], or a usage error
    (exit 2) that names the range. A `nan` or negative grace used to be taken as given."""

    def parse(text: str) -> float:
        value = decimal_number(text, "a number of seconds")
        if not math.isfinite(value) or not floor <= value <= ceiling:
            raise argparse.ArgumentTypeError(
                f"{text!r} is out of range; use a number of seconds from {floor:g} to {ceiling:g}"
            )
        return value

    return parse


def _finite(text: str) -> float:
    """An argparse type for `card start`'s numbers: any finite number, or a usage error (exit
    2) naming the option and the value as typed. The floors are the envelope's to check (as
    for `tool`); `nan`, `inf` or `1e400` used to reach it and come back on stdout naming
    `input.interval_s`, and `1e400` as `inf`."""
    value = decimal_number(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give one such as 5")
    return value


def _common(
    parser: argparse.ArgumentParser, workdir_type: Callable[[str], Path] = existing_workdir_arg
) -> None:
    # `workdir_arg` expands `~` and resolves once, so the check, the host's lock and socket,
    # and `settings` all see the same folder: a `~/agent` that no shell expanded (an MCP
    # client's config passes arguments verbatim) used to pass the check expanded and then
    # start the host on a literal `./~/agent`. A folder that is not there is a usage error
    # worded as every agent-side command words it (`existing_workdir_arg`).
    parser.add_argument(
        "--workdir", type=workdir_type, default=".", help="the agent's working directory"
    )
    parser.add_argument("--runtime-dir", type=runtime_dir_arg, default=None, help=RUNTIME_DIR_HELP)
    parser.add_argument(
        "--idle-grace-s",
        type=_seconds(0.1, 7 * 86_400),
        default=None,
        help=f"seconds a host without a live watch waits before exiting "
        f"(default: {DEFAULT_IDLE_GRACE_S:g})",
    )


def register(subparsers: Any) -> None:
    """Add `tool`, `card`, `host` and `mcp` to the `taskcard` command line."""
    tool = subparsers.add_parser("tool", help="call the task_card tool with a JSON envelope")
    _common(tool)
    tool.add_argument(
        "envelope",
        nargs="?",
        help=f"the envelope as JSON, at most {MAX_ENVELOPE_BYTES // 1024} KiB, or - for stdin"
        " (default: stdin)",
    )
    tool.set_defaults(handler=run_tool)

    card = subparsers.add_parser(
        "card",
        help="friendly forms of the task_card actions",
        # Wrapped by hand: the `taskcard` parsers keep descriptions as written.
        description="friendly forms of the task_card actions; each exits 1 when its call was\n"
        "refused or failed, as `taskcard tool` does, a retry whose render failed included\n"
        "(its status is then error, or stays stopped, and the card keeps its last body),\n"
        "and 2 when what it was given cannot be used (a renderer path naming no renderer)",
    )
    card.set_defaults(handler=_usage_help(card))
    actions = card.add_subparsers(dest="card_action", metavar="ACTION")
    start = actions.add_parser("start", help="start the agent's one watch")
    start.add_argument("renderer_path", help="the renderer, a Python file inside the workdir")
    start.add_argument(
        "--interval-s",
        dest="interval_s",
        type=_finite,
        help="seconds between refreshes (default: the workdir's settings, which say"
        f" {DEFAULT_INTERVAL_S:g} unless its taskcard.json sets interval_s)",
    )
    start.add_argument(
        "--timeout-s",
        dest="timeout_s",
        type=_finite,
        help="time limit of one render in seconds, capped by the settings (default: the"
        f" settings, {DEFAULT_TIMEOUT_S:g} unless taskcard.json sets timeout_s)",
    )
    start.add_argument(
        "--max-refreshes",
        dest="max_refreshes",
        type=whole_number,
        help="refresh budget, capped by the settings (default: the settings,"
        f" {DEFAULT_MAX_REFRESHES} unless taskcard.json sets max_refreshes)",
    )
    for name, text in (
        ("inspect", "show a watch's state, body, error and budget"),
        ("retry", "render now; exit 1 when the render fails (the card keeps its last body)"),
        ("stop", "pause: status inactive, body kept"),
    ):
        sub = actions.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}.")
        sub.add_argument("watch_id", help="the watch's id, as `start` printed it (tc_1)")
    actions.add_parser("remove", help="retire the card and delete its body")
    actions.add_parser("settings", help="show the five settings")
    actions.add_parser("manual", help="print the capability's manual")
    for sub in actions.choices.values():
        _common(sub)
        sub.add_argument(
            "--reasoning", default=CLI_REASONING, help="why, as recorded in the envelope"
        )
        sub.add_argument("--json", action="store_true", help="print the result as JSON")
        sub.set_defaults(handler=run_card)

    host = subparsers.add_parser("host", help="run a workdir's task card host")
    _common(host)
    host.add_argument("--detach", action="store_true", help="start it in the background")
    host.add_argument(
        "--ledger-check-s",
        dest="ledger_check_s",
        type=_seconds(0.05, 86_400),
        default=DEFAULT_LEDGER_CHECK_S,
        help="seconds between runs of the ledger monitor when the workdir has a ledger",
    )
    host.set_defaults(handler=run_host)

    mcp = subparsers.add_parser(
        "mcp",
        help="serve the task_card, ledger, report, reports, spawn and inbox tools over MCP stdio",
    )
    _common(mcp, writable_workdir_arg)
    mcp.set_defaults(handler=run_mcp)


def _usage_help(parser: argparse.ArgumentParser) -> Any:
    """A command group called without its subcommand prints its help: a usage error."""

    def show(args: argparse.Namespace) -> int:
        del args
        parser.print_help()
        return EXIT_USAGE

    return show


def main(argv: Sequence[str] | None = None) -> int:
    """The producer's commands alone (used for the detached host)."""
    parser = argparse.ArgumentParser(prog="taskcard")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    register(subparsers)
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
