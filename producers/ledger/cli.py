"""`taskcard ledger ...`: the ledger's commands, one per kind of observation, plus the monitor.

`bridge.cli` calls `register(subparsers)`; `python -m taskcard.producers.ledger.cli` runs the same
commands alone (the renderer `ledger init` writes uses that). Every command takes
`--workdir` and `--ledger PATH` (relative paths start at the workdir). Exit codes: 0 done,
2 bad input (one line on stderr naming the field and the fix), 1 the files could not be
written (one line naming the file).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from taskcard.producers.ledger.model import (
    EVENT_TYPES,
    FAILURE_KINDS,
    MAX_NOTE_CHARS,
    OWNER_REPLIES,
    Limits,
    TaskRecord,
    derive,
)
from taskcard.producers.ledger.render import RENDERER_FILE, render_markdown, write_renderer
from taskcard.producers.ledger.store import (
    DEFAULT_LEDGER,
    Ledger,
    LedgerError,
    LedgerReadFailed,
    cannot_write,
    worded,
)
from taskcard.producers.task_card.contract import (
    expand_home,
    file_kind,
    is_inside,
    terminal_json,
)
from taskcard.producers.task_card.number_args import decimal_number, whole_number
from taskcard.producers.task_card.runtime import RUNTIME_DIR_HELP, runtime_dir_arg
from taskcard.producers.task_card.workdir_arg import (
    existing_workdir_arg,
    file_path_problem,
    shown_path,
)

EXIT_OK: Final = 0
EXIT_BAD_INPUT: Final = 2
EXIT_FAILED: Final = 1
SOURCES: Final = ("owner", "executor", "external", "monitor")
JOB_STATUSES: Final = ("submitted", "running", "succeeded", "failed", "cancelled")

# Each text of a ledger record (a note, a reason, the evidence) is at most this long.
_AT_MOST: Final = f", at most {MAX_NOTE_CHARS} characters"


def _ledger(args: argparse.Namespace) -> Ledger:
    # Checked as given: an empty `--ledger` joined to the workdir would name the workdir.
    typed = args.ledger is not None
    given: str = args.ledger if typed else str(DEFAULT_LEDGER)
    Ledger(given, way="cli")
    # `--ledger=~/x.json`, or a path in quotes: no shell expanded the ~, and a folder named
    # "~" was made in the workdir.
    path = expand_home(given)
    if path is None:
        raise LedgerError(
            f"--ledger: {shown_path(given)} cannot be expanded (no such user); give the full path"
        )
    full = path if path.is_absolute() else args.workdir / path
    # A ledger inside the workdir stays inside it (`Ledger`'s `inside`); one given elsewhere
    # on purpose (an absolute path, or `../` out of the workdir) is the caller's choice.
    workdir: Path = args.workdir
    inside = is_inside(str(workdir), os.path.normpath(full))
    # A link that leads nowhere was read as an empty ledger ("has no task") and replaced
    # with a file by `init`; a file on the way was a "cannot write" (exit 1). One inside the
    # workdir that leads out of it is the store's refusal, whether its far end exists or not.
    # A folder (or a named pipe) was the store's "ledger PATH: cannot read it (a folder, ...;
    # replace it with a file)": neither the option nor that a file in it was meant.
    # Left out, the path is the workdir's default ledger: named as that, with a fix that
    # does not tell to leave out the option nobody typed ("--ledger: ...; or leave --ledger
    # out" was said of the default too).
    if typed:
        problem = file_path_problem(full) or _not_a_file(full)
    else:
        moved = "move that file aside, or give another ledger file with --ledger"
        problem = file_path_problem(full, in_a_folder=moved) or _not_a_file(full, typed=False)
    leads_out = inside and not is_inside(str(workdir), os.path.realpath(full))
    if problem is not None and not leads_out:
        if typed:
            raise LedgerError(f"--ledger: {shown_path(given)} {problem}")
        raise LedgerError(f"the workdir's default ledger {shown_path(full)} {problem}")
    return Ledger(full, inside=workdir if inside else None, way="cli")


def _not_a_file(path: Path, *, typed: bool = True) -> str | None:
    """What `path` is, after the name, when it is there and no regular file (links followed);
    the fix as for a `--ledger` typed, or for the default ledger (`typed=False`)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # nothing there yet (a ledger to create), or the store says why
    if stat.S_ISREG(mode):
        return None
    if not typed:
        return (
            f"is {file_kind(mode)}, not a regular file; move it aside (the ledger is a file"
            " there), or give another ledger file with --ledger"
        )
    return (
        f"is {file_kind(mode)}, not a regular file; give the ledger's file (relative paths"
        f" start at the workdir), or leave --ledger out for {DEFAULT_LEDGER}"
    )


def _summary(record: TaskRecord) -> dict[str, Any]:
    derived = derive(record.observed)
    return {
        "task_id": record.task.task_id,
        "workflow": derived.workflow,
        "truth_state": derived.truth_state,
        "current_step": derived.current_step,
        "next_gate": derived.next_gate,
        "inconsistencies": [i.code for i in derived.inconsistencies],
    }


def _print(data: Any) -> None:
    print(terminal_json(data, indent=2, default=str))


def _plan(text: str | None) -> list[str]:
    """The step ids of `--steps` (none when it is not given). An empty item is refused, as
    the MCP tool refuses an empty step id: `prep,,eval` dropped it without a word, and an
    empty `--steps` (an unset variable) made a task without a plan."""
    if text is None:
        return []
    steps = [item.strip() for item in text.split(",")]
    for index, step in enumerate(steps, 1):
        if not step:
            raise LedgerError(
                f"steps: item {index} of {text[:80]!r} is empty; give comma-separated step ids"
                " (e.g. prep,train,eval), or leave --steps out for a task without a plan"
            )
    return steps


def run_init(args: argparse.Namespace) -> int:
    ledger = _ledger(args)
    steps = _plan(args.steps)
    limits = {
        name: getattr(args, name)
        for name in (
            "nudge_after_sec",
            "timeout_sec",
            "heartbeat_every_sec",
            "renotify_sec",
            "max_nudges",
            "max_retries",
            "external_max_wait_sec",
        )
        if getattr(args, name) is not None
    }
    record = ledger.init(args.task_id, args.purpose, steps, **limits)
    result = _summary(record)
    workdir: Path = args.workdir  # expanded and resolved by `existing_workdir_arg`
    if not args.no_renderer and write_renderer(workdir, ledger.path, args.task_id):
        result["renderer"] = RENDERER_FILE
        # Quoted for a shell: the line is meant to be pasted, and a workdir may hold spaces.
        folder = shlex.quote(str(workdir))
        result["start_card"] = f"taskcard card start --workdir {folder} {RENDERER_FILE}"
    _print(result)
    return EXIT_OK


def run_checkpoint(args: argparse.Namespace) -> int:
    # Every event-specific option given goes to the store, which refuses one the event type
    # does not take, naming it (as the MCP tool does): `--kind` on a STARTED checkpoint was
    # dropped without a word.
    options = {
        "kind": args.kind,
        "reason": args.reason,
        "safe_next_step": args.safe_next_step,
        "failed": args.failed,
        "reply": args.reply,
        "job_id": args.job_id,
        "status": args.status,
        "provider": args.provider,
        "evidence": args.evidence,
        "max_wait_sec": args.max_wait_sec,
        "name": args.name,
        "observed_bytes": args.bytes,
        "expected_bytes": args.expected_bytes,
        "complete": args.complete,
        "corrupt": args.corrupt,
    }
    fields: dict[str, Any] = {
        name: value for name, value in options.items() if value is not None and value is not False
    }
    record = _ledger(args).checkpoint(
        args.task_id,
        args.event_type,
        step=args.step,
        note=args.note,
        source=args.source,
        artifacts=args.artifact,
        new_step=args.new_step,
        **fields,
    )
    _print(_summary(record))
    return EXIT_OK


def run_block(args: argparse.Namespace) -> int:
    record = _ledger(args).block(
        args.task_id,
        kind=args.kind,
        reason=args.reason,
        step=args.step,
        safe_next_step=args.safe_next_step,
        failed=args.failed,
        source=args.source,
        new_step=args.new_step,
    )
    _print(_summary(record))
    return EXIT_OK


def run_external_job(args: argparse.Namespace) -> int:
    record = _ledger(args).external_job(
        args.task_id,
        job_id=args.job_id,
        status=args.status,
        provider=args.provider,
        evidence=args.evidence,
        max_wait_sec=args.max_wait_sec,
    )
    _print(_summary(record))
    return EXIT_OK


def run_download(args: argparse.Namespace) -> int:
    record = _ledger(args).download_observed(
        args.task_id,
        name=args.name,
        observed_bytes=args.bytes,
        expected_bytes=args.expected_bytes,
        complete=args.complete,
        corrupt=args.corrupt,
    )
    _print(_summary(record))
    return EXIT_OK


def run_owner_reply(args: argparse.Namespace) -> int:
    record = _ledger(args).owner_reply(
        args.task_id,
        reply=args.reply,
        note=args.note,
        reason=args.reason,
        safe_next_step=args.safe_next_step,
        kind=args.kind,
    )
    _print(_summary(record))
    return EXIT_OK


def run_heartbeat(args: argparse.Namespace) -> int:
    _print(_summary(_ledger(args).heartbeat(args.task_id, note=args.note)))
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    ledger = _ledger(args)
    record = ledger.task(args.task_id or ledger.default_task_id())
    record.derived = derive(record.observed)
    # As every other command prints: the agent's texts (purpose, notes) may hold a bidi
    # override or other characters that act on a terminal, which plain JSON leaves raw.
    _print(record.model_dump(mode="json"))
    return EXIT_OK


def run_render(args: argparse.Namespace) -> int:
    ledger = _ledger(args)
    record = ledger.task(args.task_id or ledger.default_task_id())
    sys.stdout.write(render_markdown(record, ledger.clock()))
    return EXIT_OK


def run_supervise(args: argparse.Namespace) -> int:
    from taskcard.producers.ledger.card import retirer_via_host
    from taskcard.producers.ledger.notifications import LedgerNotificationPort
    from taskcard.producers.ledger.supervise import supervise
    from taskcard.producers.task_card.contract import CardPaths
    from taskcard.producers.task_card.runtime import RuntimeDirUnsafe, chosen_host_paths

    workdir: Path = args.workdir  # expanded and resolved by `existing_workdir_arg`
    try:
        host_paths = chosen_host_paths(args.runtime_dir, os.environ, workdir)
    except RuntimeDirUnsafe as exc:  # a blank variable, a folder inside the workdir
        print(f"taskcard ledger supervise: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    skipped: list[str] = []
    decisions = supervise(
        _ledger(args),
        LedgerNotificationPort(CardPaths(workdir)),
        apply=args.apply_supervision,
        task_id=args.task_id,
        retire_card=retirer_via_host(host_paths),
        skipped=skipped,
    )
    for decision in decisions:
        print(
            json.dumps(
                {"task_id": decision.task_id, "action": decision.action, "reason": decision.reason}
            )
        )
    # The other tasks were supervised; each broken one is named, and the exit code says so.
    for problem in skipped:
        print(f"taskcard ledger: skipped: {problem}", file=sys.stderr)
    return EXIT_BAD_INPUT if skipped else EXIT_OK


class _OneLineParser(argparse.ArgumentParser):
    """Bad arguments get one line naming the argument and the fix, not a page of usage."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message}; see `{self.prog} --help`\n")


def _guarded(handler: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = handler(args)
        except LedgerReadFailed as exc:
            # The system failed the read (an I/O error): a failure, as a failed write is
            # (exit 1), not input to mend; it exited 2, the code of bad input.
            print(f"taskcard ledger: {exc}", file=sys.stderr)
            return EXIT_FAILED
        except LedgerError as exc:
            # The commands' own refusals (`--steps`) are said as the store's are: the
            # option first (`worded`).
            print(f"taskcard ledger: {worded(str(exc), 'cli')}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except BrokenPipeError:
            # The reader of the output went away (`taskcard ledger show | head -1`): the
            # command line ends it quietly with 141, as for every other command.
            raise
        except OSError as exc:
            print(f"taskcard ledger: {cannot_write(exc)}", file=sys.stderr)
            return EXIT_FAILED
        return code

    return run


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workdir", type=existing_workdir_arg, default=".", help="the agent's working directory"
    )
    parser.add_argument(
        "--ledger",
        default=None,  # the default ledger, said as that (not as `--ledger`) in errors
        help=f"the ledger file, relative to the workdir; ~ is expanded (default: {DEFAULT_LEDGER})",
    )


def _new_step_field(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--new-step",
        dest="new_step",
        action="store_true",
        help="--step names a step the plan does not have yet: add it at the end (without "
        "this, a step not in the plan is refused, so a typo never becomes a step)",
    )


def _block_fields(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=FAILURE_KINDS, help="what kind of failure blocks it")
    parser.add_argument("--reason", help=f"what stops the task, in one sentence{_AT_MOST}")
    parser.add_argument(
        "--safe-next-step", dest="safe_next_step", help=f"what is safe to do next{_AT_MOST}"
    )
    parser.add_argument("--failed", action="store_true", help="the step failed for good")


def _job_fields(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", dest="job_id", help="the external job's id")
    parser.add_argument("--status", choices=JOB_STATUSES, help="the provider's status")
    parser.add_argument("--provider", help="who runs the job")
    parser.add_argument("--evidence", help=f"the provider's own id, URL or status line{_AT_MOST}")
    parser.add_argument(
        "--max-wait-sec",
        dest="max_wait_sec",
        type=decimal_number,
        help="time limit while pending (default: the job's last one, else the task's "
        "external_max_wait_sec)",
    )


def _download_fields(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", help="the download's id")
    parser.add_argument("--bytes", type=whole_number, help="bytes seen on disk")
    parser.add_argument(
        "--expected-bytes",
        dest="expected_bytes",
        type=whole_number,
        help="the download's full size",
    )
    parser.add_argument("--complete", action="store_true", help="the download says it finished")
    parser.add_argument("--corrupt", action="store_true", help="a check found it corrupt")


def _reply_fields(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--reply",
        choices=tuple(OWNER_REPLIES),
        required=required,
        help="; ".join(f"{k} = {v}" for k, v in OWNER_REPLIES.items()),
    )


def register(subparsers: Any) -> None:
    """Add `ledger` and its subcommands to the `taskcard` command line."""
    ledger = subparsers.add_parser("ledger", help="long task ledger: observed truth and monitor")
    commands = ledger.add_subparsers(
        dest="ledger_command", metavar="COMMAND", parser_class=_OneLineParser
    )
    commands.required = True

    def add(name: str, handler: Any, text: str, *, task: str = "required") -> Any:
        # The formatter of the `taskcard` command line, so each option shows its default.
        parser = commands.add_parser(name, help=text, formatter_class=ledger.formatter_class)
        _common(parser)
        if task == "required":
            parser.add_argument("task_id", help="the task's id in the ledger")
        else:  # `task` says what a missing id stands for (`Ledger.default_task_id`, or all)
            parser.add_argument("task_id", nargs="?", help=f"the task's id (default: {task})")
        parser.set_defaults(handler=_guarded(handler))
        return parser

    init = add("init", run_init, "create a task (and a task card renderer for it)")
    init.add_argument("--purpose", required=True, help=f"what the task is for, one line{_AT_MOST}")
    init.add_argument("--steps", help="the planned step ids, comma-separated")
    seconds, count = decimal_number, whole_number  # the command line's one reading of numbers
    limits: dict[str, tuple[str, Callable[[str], float] | Callable[[str], int]]] = {
        "nudge_after_sec": ("seconds without progress before the agent is nudged", seconds),
        "timeout_sec": ("seconds without progress before the task counts as stale", seconds),
        "heartbeat_every_sec": ("seconds between expected heartbeats while waiting", seconds),
        "renotify_sec": ("seconds before the same action is sent again", seconds),
        "external_max_wait_sec": ("longest wait on pending external work", seconds),
        "max_nudges": ("nudges before escalating", count),
        "max_retries": ("retries before escalating", count),
    }
    # The defaults are the model's (`Limits`), shown with the number an unset option stands for.
    defaults = {name: field.default for name, field in Limits.model_fields.items()}
    for name, (text, kind) in limits.items():
        init.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            help=f"{text} (default: {defaults[name]:g})",
        )
    init.add_argument(
        "--no-renderer", action="store_true", help=f"do not write {RENDERER_FILE} in the workdir"
    )

    checkpoint = add("checkpoint", run_checkpoint, "record one observation")
    checkpoint.add_argument(
        "--event-type",
        dest="event_type",
        required=True,
        choices=EVENT_TYPES,
        help="what was observed",
    )
    checkpoint.add_argument("--step", help="the step that moved")
    _new_step_field(checkpoint)
    checkpoint.add_argument(
        "--note", help=f"what was observed (TASK_COMPLETED: the evidence){_AT_MOST}"
    )
    checkpoint.add_argument("--source", choices=SOURCES, default="executor", help="who observed it")
    checkpoint.add_argument(
        "--artifact", action="append", help="a delivered artifact (repeat; TASK_COMPLETED only)"
    )
    _block_fields(checkpoint)
    _job_fields(checkpoint)
    _download_fields(checkpoint)
    _reply_fields(checkpoint, required=False)

    block = add("block", run_block, "record a confirmed block")
    block.add_argument("--step", help="the blocked step")
    _new_step_field(block)
    block.add_argument("--source", choices=SOURCES, default="executor", help="who observed it")
    _block_fields(block)

    job = add("external-job", run_external_job, "record what a provider says about a job")
    _job_fields(job)

    download = add("download-observed", run_download, "record a download as seen on disk")
    _download_fields(download)

    reply = add("owner-reply", run_owner_reply, "record the owner's answer to the monitor")
    _reply_fields(reply, required=True)
    reply.add_argument("--note", help=f"what the owner observed{_AT_MOST}")
    reply.add_argument("--reason", help=f"why the task is blocked (with a block reply){_AT_MOST}")
    reply.add_argument(
        "--safe-next-step", dest="safe_next_step", help=f"what is safe to do next{_AT_MOST}"
    )
    reply.add_argument("--kind", choices=FAILURE_KINDS, help="the kind of failure, if any")

    heartbeat = add("heartbeat", run_heartbeat, "record that the executor is healthy")
    heartbeat.add_argument("--note", help=f"what the executor is doing{_AT_MOST}")

    newest = "the newest task not completed, else the newest task"
    add("show", run_show, "print a task's record as JSON", task=newest)
    add("render", run_render, "print a task's card (a task_card renderer)", task=newest)
    supervise = add("supervise", run_supervise, "run the monitor once", task="every task")
    supervise.add_argument(
        "--apply-supervision",
        dest="apply_supervision",
        action="store_true",
        help="deliver the actions (wakes, notices, retiring the card), not only print them",
    )
    supervise.add_argument(
        "--runtime-dir", type=runtime_dir_arg, default=None, help=RUNTIME_DIR_HELP
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="taskcard")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    register(subparsers)
    args = parser.parse_args(["ledger", *(argv if argv is not None else sys.argv[1:])])
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
