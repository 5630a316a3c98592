"""The I/O around the pure hook decisions: workdir, per-session waits, files, error log.

A hook runs inside the agent's loop, so `run_hook` never raises and never exits non-zero;
whatever goes wrong is appended to `logs/taskcard-hook.log` under the workdir (or, when there
is no usable workdir, one line on stderr, which hosts only show in their debug views).
Stdout carries only the host's hook JSON, or nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from taskcard.producers.agent_hooks.claude_code import (
    TURN_END_EVENTS,
    Event,
    HookDecision,
    bounded_id,
    decide,
    read_transcript_usage,
    subagent,
    transcript_tail,
)
from taskcard.producers.agent_hooks.codex import (
    codex_events,
    interrupt_decision,
    rollout_usage,
    tool_failed,
)
from taskcard.producers.agent_hooks.inbox_hook import Delivery, Handover, steer
from taskcard.producers.agent_hooks.inbox_hook import output as inbox_output
from taskcard.producers.agent_hooks.inbox_hook import take as take_inbox
from taskcard.producers.agent_hooks.payload_json import read_json
from taskcard.producers.agent_hooks.sessions import SESSIONS_FILE, merge
from taskcard.producers.task_card.activity_log import append_event, event_record
from taskcard.producers.task_card.contract import (
    ORIGIN_FORMS,
    CardPaths,
    NotRegularFile,
    Origin,
    OutsideWorkdir,
    atomic_write,
    is_inside,
    json_cut_short,
    json_error_place,
    json_kind,
    make_folder,
    open_append,
    open_lock,
    parse_origin,
    quoted,
    read_regular,
    utc_now_iso,
)
from taskcard.producers.task_card.notifications import FileNotificationPort
from taskcard.producers.task_card.settings import settings_or_defaults
from taskcard.producers.task_card.turns import add_completed_turn, keep_reminder
from taskcard.producers.task_card.wakes import WakeReader
from taskcard.producers.task_card.workdir_arg import (
    PATH_MAX,
    WORKDIR_FIX,
    WorkdirError,
    expand_workdir,
    not_a_directory,
    shown_path,
)

MAX_PAYLOAD_BYTES: Final = 32_000_000
ERROR_LOG: Final = "taskcard-hook.log"
ERROR_LOG_MAX_BYTES: Final = 256_000
WAITS_FILE: Final = ".taskcard-hook-waits.json"
# Codex turns whose end was written, by turn id: its notify program and its Stop hook both
# report the end of one turn, which must end it (and count for reminders) once.
CODEX_TURNS_FILE: Final = ".taskcard-codex-turns.json"
# Per Codex turn id, the tokens of it written so far ("<in> <out>"): see `_unwritten_usage`.
CODEX_USAGE_FILE: Final = ".taskcard-codex-usage.json"
# What an event is written without when one of those two cannot be used (see `_locked_map`).
_TURNS_KEPT_FOR: Final = (
    "the record of the turns that ended (another report of its turn may end it again)"
)
_USAGE_KEPT_FOR: Final = (
    "the record of its turn's tokens (a later stop of the turn may count them again)"
)
_SESSIONS_KEPT_FOR: Final = (
    "the record of the workdir's live sessions (another session's card may be reset or ended)"
)
MAX_SESSIONS: Final = 64
CLAUDE_CONSUMER: Final = "claude-code"
ORIGIN_ENV: Final = "TASKCARD_ORIGIN"
_SESSION = re.compile(r"[A-Za-z0-9_.:-]{1,128}")

Clock = Callable[[], str]
Beside = Callable[[list[Event], Mapping[str, str]], list[Event]]


class HookInputError(ValueError):
    """The payload cannot be used; the message says what was wrong with it."""


class NoSessionFolder(HookInputError):
    """The payload's `cwd` names no folder at all (it holds a NUL character): no workdir can
    be told from it, `--only-in`'s included, so it is said on stderr as without one."""


def log_error(
    workdir: Path | None, message: str, command: str = "taskcard hook", said: str | None = None
) -> None:
    """Append one line to the workdir's hook log; stderr when there is no usable workdir, as
    `command: said` (default: `message`), in the shape of the command's usage errors."""
    line = f"{utc_now_iso()} {message}\n"
    if workdir is not None and workdir.is_dir():
        path = CardPaths(workdir).logs_dir / ERROR_LOG
        with contextlib.suppress(OSError):
            make_folder(path.parent, inside=workdir)
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_size > ERROR_LOG_MAX_BYTES:
                    os.replace(path, path.with_name(path.name + ".1"))
            # Never a plain `open`: a named pipe planted there held the hook (and the agent's
            # turn) forever, and a link out of the workdir was appended to wherever it led.
            fd = open_append(path, inside=workdir)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise NotRegularFile(errno.EINVAL, "not a regular file")
                os.write(fd, line.encode(errors="replace"))
            finally:
                os.close(fd)
            return
    with contextlib.suppress(OSError):
        os.write(2, f"{command}: {said or message}\n".encode(errors="replace"))


def parse_payload(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise HookInputError(f"payload over {MAX_PAYLOAD_BYTES} bytes, ignored")
    try:
        data = read_json(raw)
    except (ValueError, RecursionError) as exc:
        raise HookInputError(f"payload is not JSON: {_not_json(exc)}; nothing written") from None
    if not isinstance(data, dict):
        raise HookInputError(
            f"payload is not a JSON object (the top level is {json_kind(data)}); a hook's "
            "payload is one object; nothing written"
        )
    name = data.get("hook_event_name")
    if name is not None and not isinstance(name, str):
        # Read as one, a list there made every set lookup raise `TypeError` (a traceback in
        # the log); no host sends anything but the event's name.
        raise HookInputError(
            f"hook_event_name must be the event's name as a string, not {json.dumps(name)[:80]}; "
            "nothing written"
        )
    return data


def _not_json(exc: ValueError | RecursionError) -> str:
    """Where and how the payload stopped being JSON, as a person fixing it needs it: the
    class name alone (`JSONDecodeError`) said neither."""
    if not isinstance(exc, json.JSONDecodeError):
        return exc.__class__.__name__
    if json_cut_short(exc):
        return "the text ends before the object is complete (truncated?)"
    return json_error_place(exc)


def _directory(text: str, field: str) -> Path:
    """`text` read as every agent-side command reads a workdir; it must be a directory."""
    try:
        path = expand_workdir(text)
    except WorkdirError as exc:
        raise HookInputError(f"{field} {exc}") from None
    # Shown on one line and cut: a cwd with a line break broke the line in two, and one of
    # 100,000 characters (too long to open) came back whole, as a file the hook cannot write.
    shown = shown_path(text) if len(text) <= PATH_MAX else quoted(text)
    try:
        found = path.is_dir()
    except OSError as exc:
        raise HookInputError(
            f"{field} {shown} cannot be used ({exc.strerror}); nothing written"
        ) from None
    if not found:
        fix = f"{WORKDIR_FIX}; " if field == _WORKDIR_FIELD else ""
        raise HookInputError(f"{field} {shown} {not_a_directory(text)}; {fix}nothing written")
    return path


# `--workdir` as every command's usage error names it (`workdir_arg.existing_workdir_arg`).
_WORKDIR_FIELD: Final = "argument --workdir:"


def resolve_workdir(override: str | None, payload: Mapping[str, Any]) -> Path:
    """`--workdir` when given, else the payload's `cwd`; either must name a directory.

    `--workdir` is the host's configuration (`taskcard init claude-code` passes
    `$CLAUDE_PROJECT_DIR`, which stays put when the session `cd`s). Without it the payload's
    `cwd` is the workdir, exactly: not a parent that looks like an agent's, which a fresh
    agent nested in another's workdir would have its events credited to.
    """
    if override is not None:
        return _directory(override, _WORKDIR_FIELD)
    cwd = payload.get("cwd")
    if cwd is None:
        raise HookInputError("no workdir: the payload has no cwd; nothing written (pass --workdir)")
    if not isinstance(cwd, str) or not cwd.strip():
        # A number or a blank was reported as no cwd at all: the wrong fix to look for.
        raise HookInputError(
            f"the payload's cwd must be the session's folder as an absolute path, not "
            f"{json.dumps(cwd)[:80]}; nothing written (pass --workdir)"
        )
    _refuse_nul_cwd(cwd)
    if not os.path.isabs(cwd):
        # The hosts send the session's absolute folder. Read from the hook's own folder, a
        # `..` or `~` here wrote the agent's events into a folder of no agent (`/`, home).
        raise HookInputError(
            f"the payload's cwd {json.dumps(cwd)[:200]} is not an absolute path; nothing "
            "written (pass --workdir)"
        )
    return _directory(cwd, "the payload's cwd")


def _refuse_nul_cwd(cwd: object) -> None:
    """No path holds a NUL character: it was reported as "not an absolute path" or "not a
    usable path", which sent the reader looking at the wrong part of it."""
    if isinstance(cwd, str) and "\0" in cwd:
        raise NoSessionFolder(
            f"the payload's cwd {json.dumps(cwd)[:200]} holds a NUL character, which no path"
            " can; nothing written (send the session's folder, or pass --workdir)"
        )


def transcript_path(payload: Mapping[str, Any], paths: CardPaths) -> object:
    """The payload's `transcript_path` to read the turn's tokens from; None, with one line in
    the hook log naming the field, when it holds a NUL character (no file can be named so)
    or is not a string: either was dropped without a word, as if the host had sent none. The
    event is still written, without the turn's token usage."""
    path = payload.get("transcript_path")
    if isinstance(path, str) and "\0" in path:
        problem = "holds a NUL character, which no path can"
    elif path is not None and not isinstance(path, str):
        problem = "is not a path (a string)"
    else:
        return path
    log_error(
        paths.workdir,
        f"HookInputError: the payload's transcript_path {json.dumps(path)[:200]} {problem};"
        " the event is written without the turn's token usage (send the transcript's path)",
    )
    return None


def _session_waits(paths: CardPaths) -> contextlib.AbstractContextManager[dict[str, str]]:
    """The open waits per session, read and written back under a lock."""
    return _locked_map(paths, WAITS_FILE, "its session's wait")


@contextlib.contextmanager
def _locked_map(paths: CardPaths, name: str, kept_for: str) -> Iterator[dict[str, str]]:
    """A small string map in the logs folder, read and written back under a lock; only the
    last `MAX_SESSIONS` keys are kept.

    A map whose lock or file cannot be used (a folder, a pipe or a link out of the workdir
    planted at its name, a full disk) costs only that bookkeeping, `kept_for`: one line in
    the hook log names the file, and the map starts empty and is not kept, so the event is
    still written (with a planted lock, a Claude Code event lost its session's wait, and a
    Codex event was lost whole). When the logs folder itself cannot be used no event can be
    written either, and the error is raised (one line says why)."""
    try:
        make_folder(paths.logs_dir, inside=paths.workdir)
        path = paths.logs_dir / name
        fd = open_lock(path.with_name(path.name + ".lock"), inside=paths.workdir)
    except OSError as exc:
        _without_bookkeeping(paths, exc, kept_for)
        fd = None
    if fd is None:
        yield {}
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            data = json.loads(read_regular(path, 65536))
        except (OSError, ValueError, RecursionError):
            data = {}
        records = {
            str(k): v
            for k, v in (data if isinstance(data, dict) else {}).items()
            if isinstance(v, str)
        }
        before = dict(records)
        yield records
        if records != before:
            kept = dict(list(records.items())[-MAX_SESSIONS:])
            try:
                atomic_write(path, json.dumps(kept).encode(), durable=False)
            except OSError as exc:
                _without_bookkeeping(paths, exc, kept_for)
    finally:
        os.close(fd)


def _without_bookkeeping(paths: CardPaths, exc: OSError, kept_for: str) -> None:
    """Log that a map of `_locked_map` cannot be used, so the event is written without what
    it keeps (`kept_for`); raise `exc` when the logs folder cannot hold the events either."""
    logs = os.path.realpath(paths.logs_dir)
    if not paths.logs_dir.is_dir() or not is_inside(os.path.realpath(paths.workdir), logs):
        raise exc
    log_error(paths.workdir, f"{filesystem_problem(exc)}; the event is written without {kept_for}")


def with_origin(
    events: list[tuple[str, dict[str, Any]]],
    paths: CardPaths,
    env: Mapping[str, str],
    *,
    at_turn_end: bool = False,
) -> list[tuple[str, dict[str, Any]]]:
    """Each `turn.start` with the origin that `TASKCARD_ORIGIN` names (the chat the host's
    turn came from). An invalid value is logged to the hook log and left out: the turn is
    still written, and the hook still succeeds.

    `at_turn_end`: the host reports only the end of a turn (Codex), so the origin goes on a
    `turn.origin` just before its `turn.end`; else such a host's turns never had one."""
    raw = env.get(ORIGIN_ENV, "").strip()
    marked = ("turn.start", "turn.end") if at_turn_end else ("turn.start",)
    if not raw or not any(kind in marked for kind, _ in events):
        return events
    origin = parse_origin(raw)
    if not isinstance(origin, Origin):
        log_error(
            paths.workdir,
            f"{ORIGIN_ENV}: {origin} (forms: {ORIGIN_FORMS}); turn written without it",
        )
        return events
    if at_turn_end and not any(kind == "turn.start" for kind, _ in events):
        at = next(index for index, (kind, _) in enumerate(events) if kind == "turn.end")
        return [*events[:at], ("turn.origin", {"origin": str(origin)}), *events[at:]]
    return [
        # A turn started by a message from a chat keeps that message's origin.
        (kind, {"origin": str(origin), **fields} if kind == "turn.start" else fields)
        for kind, fields in events
    ]


def _append(paths: CardPaths, events: list[tuple[str, dict[str, Any]]], clock: Clock) -> None:
    for kind, fields in events:
        append_event(paths, event_record(kind, fields, ts=clock()))


def _count_turn(paths: CardPaths) -> None:
    """A completed turn for the reminder count; submits the reminder when it is due."""
    count = add_completed_turn(paths, settings_or_defaults(paths).reminder_turns)
    if count is not None:
        keep_reminder(paths, FileNotificationPort(paths).submit_reminder(count, None))


def _session_key(payload: Mapping[str, Any]) -> str:
    session = payload.get("session_id")
    return session if isinstance(session, str) and _SESSION.fullmatch(session) else "-"


def _record(
    paths: CardPaths,
    key: str,
    make: Callable[[str | None], HookDecision],
    env: Mapping[str, str],
    clock: Clock,
    beside: Beside | None = None,
) -> HookDecision:
    """`make`'s decision for the session's open wait, with the wait kept and the events
    appended, all under the waits lock; `beside` (given the events and every session's open
    wait) makes them what the card is to see beside the workdir's other sessions.

    A waits file or lock that cannot be used (a folder or a link planted at its name) costs
    only the bookkeeping of waits (`_locked_map`): the events are still written (they were
    all lost)."""
    with _session_waits(paths) as waits:
        decision = make(waits.get(key))
        if decision.waiting is None:
            waits.pop(key, None)
        else:
            waits[key] = decision.waiting
        events = with_origin(decision.events, paths, env)
        if beside is not None:
            events = beside(events, waits)
        _append(paths, events, clock)
    return decision


def _beside_other_sessions(paths: CardPaths, key: str, name: object, payload: Any) -> Beside:
    """The step of `_record` that writes a Claude Code session's events (its hook event
    `name`) beside the other sessions live in the workdir (`sessions.merge`), keeping their
    record under its lock. A record that cannot be used costs only itself: the events are
    written as they are."""
    ended = name == "SessionEnd"
    source = payload.get("source")
    # A start of no source named is a start afresh, as the hooks have always read it.
    started = (source if isinstance(source, str) else "") if name == "SessionStart" else None

    def beside(events: list[Event], waits: Mapping[str, str]) -> list[Event]:
        with _locked_map(paths, SESSIONS_FILE, _SESSIONS_KEPT_FOR) as sessions:
            return merge(events, key, ended, sessions, waits, int(time.time()), started)

    return beside


def _turn_key(thread: object, turn_id: object) -> str | None:
    """A Codex turn's key in the records, bounded (`bounded_id`): a turn id of 70,000
    characters was written whole into the turns' record, past the size it is read at, so
    every turn's record was lost and each turn's second report ended it again."""
    if not isinstance(turn_id, str) or not turn_id:
        return None
    return bounded_id(f"{thread if isinstance(thread, str) else ''}/{turn_id}")


def _first_end_of(paths: CardPaths, thread: object, turn_id: object, reporter: str) -> bool:
    """Whether this report of the end of a Codex turn is the first, for `notify` and the
    hooks (`reporter`) that both report one turn: the other's report of the same thread and
    turn id is then skipped. The same hook again is a copy of it registered in another
    config layer (Codex runs them all), skipped too; `notify` again is a new turn that
    reuses the id (older Codex numbered turns from 0 in each process, also on resume; with
    hooks, the turn's `UserPromptSubmit` clears the record, see `_turn_started`).

    A `Stop` after the turn's `StopFailure` (reporter `failure`) is not a copy of it: a
    StopFailure hook of the user's had Codex retry the turn (its `recovery`), which has now
    ended after all; it ends the turn again."""
    key = _turn_key(thread, turn_id)
    if key is None:
        return True  # no id to match: as before, every report ends a turn
    with _locked_map(paths, CODEX_TURNS_FILE, _TURNS_KEPT_FOR) as ended:
        first = ended.get(key)
        retried = first == "failure" and reporter == "hook"
        if first is not None and not retried and (first != reporter or reporter != "notify"):
            if first != reporter:
                del ended[key]  # both have reported it: done with this turn
            return False
        ended.pop(key, None)  # re-added last, so the newest stay within MAX_SESSIONS
        ended[key] = reporter
        return True


def _response_of(turn_id: object, payload: Mapping[str, Any]) -> str | None:
    """A Codex turn id narrowed to one of its responses by the response's last message: the
    stops of one turn that a stop hook made go on differ in it, the copies of one stop (one
    per config layer) do not. None without a turn id."""
    if not isinstance(turn_id, str) or not turn_id:
        return None
    message = payload.get("last_assistant_message")
    text = message if isinstance(message, str) else ""
    digest = hashlib.sha256(text.encode(errors="replace")).hexdigest()[:16]
    return f"{turn_id}#{digest}"


def _turn_started(paths: CardPaths, thread: object, turn_id: object) -> None:
    """A Codex turn starts: an earlier turn's records under the same id are stale."""
    key = _turn_key(thread, turn_id)
    if key is not None:
        for name, kept_for in (
            (CODEX_TURNS_FILE, _TURNS_KEPT_FOR),
            (CODEX_USAGE_FILE, _USAGE_KEPT_FOR),
        ):
            with _locked_map(paths, name, kept_for) as records:
                records.pop(key, None)


def _unwritten_usage(
    paths: CardPaths, thread: object, turn_id: object, decision: HookDecision
) -> HookDecision:
    """`decision` with its `usage` (the Codex turn's tokens so far, from the rollout) cut to
    what no stop of this turn has written yet, or dropped when that is nothing.

    A turn can stop more than once under one id: a stop hook of the user's blocked its stop
    (seen here as an ending one) and Codex went on to stop again with `stop_hook_active`;
    each stop is seen by the copy of the hook in every config layer, maybe after `notify`
    ended the turn. Each writes the tokens since the last written, so the turn's usage is
    written once and whole (the part after a continued stop was lost, and a turn `notify`
    ended first lost all of it). A stop our block held writes none (`_codex_hook`)."""
    found = [fields for kind, fields in decision.events if kind == "usage"]
    key = _turn_key(thread, turn_id)
    if not found or key is None:
        return decision
    total = (found[0]["input_tokens"], found[0]["output_tokens"])
    with _locked_map(paths, CODEX_USAGE_FILE, _USAGE_KEPT_FOR) as written:
        before = _token_pair(written.pop(key, None))
        written[key] = f"{total[0]} {total[1]}"  # re-added last: the newest are kept
    if before is not None and total[0] >= before[0] and total[1] >= before[1]:
        total = (total[0] - before[0], total[1] - before[1])  # else the count restarted
    events = [event for event in decision.events if event[0] != "usage"]
    if total != (0, 0) or before is None:
        usage = ("usage", {"input_tokens": total[0], "output_tokens": total[1]})
        events.insert(decision.events.index(("usage", found[0])), usage)
    return replace(decision, events=events)


def _token_pair(text: str | None) -> tuple[int, int] | None:
    """`"<in> <out>"` as written by `_unwritten_usage`, None for anything else."""
    parts = (text or "").split()
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None
    return int(parts[0]), int(parts[1])


def claude_code(
    raw: bytes,
    workdir_override: str | None,
    clock: Clock = utc_now_iso,
    env: Mapping[str, str] = os.environ,
    handover: Handover | None = None,
) -> str:
    """Handle one Claude Code hook payload; the text to print on stdout (maybe empty).
    The chat's messages it claims wait in `handover` for the output to be written (without
    one, they count as delivered at once)."""
    if not raw.strip():
        raise HookInputError(
            "no payload: Claude Code passes the hook's JSON on stdin (run the hook from its "
            "settings, or pipe a payload in); nothing written"
        )
    payload = parse_payload(raw)
    # The workdir first: a --workdir that is no folder is said as by every agent command.
    paths = CardPaths(resolve_workdir(workdir_override, payload))
    if not str(payload.get("hook_event_name") or "").strip():
        # Ignored without a word (an empty logs/ folder made), as an event of a later version
        # is: a payload written by hand had no sign of why the card did not move.
        raise HookInputError(
            "hook_event_name: missing or empty; a Claude Code hook payload names its event "
            "(such as PreToolUse): run the hook from its settings, or add it; nothing written"
        )
    name = payload.get("hook_event_name")
    key = _session_key(payload)
    main = not subagent(payload)
    ends_turn = name in TURN_END_EVENTS and main
    usage = read_transcript_usage(transcript_path(payload, paths)) if ends_turn else None
    # A subagent's context is not the agent's: the chat's texts and the card's notices handed
    # to it would read "delivered" while the agent the chat talks to never saw them.
    inbox = (
        take_inbox(
            paths,
            name,
            payload,
            key,
            lambda line: log_error(paths.workdir, line),
            handover=handover,
        )
        if main
        else Delivery()
    )
    if inbox.ends_blocked_turn:
        payload = {**payload, "stop_hook_active": False}  # our block held the turn: end it
    wakes: list[str] = []
    try:
        decision = _record(
            paths,
            key,
            lambda waiting: steer(name, decide(payload, waiting, usage), inbox.messages),
            env,
            clock,
            _beside_other_sessions(paths, key, name if main else None, payload),
        )
        if decision.completed_turn:
            _count_turn(paths)
        reader = WakeReader(paths, CLAUDE_CONSUMER)
        if name == "SessionStart":
            reader.prime()
        wakes = reader.take() if main and name in ("UserPromptSubmit", "PostToolUse") else []
    except Exception as exc:
        if not inbox.messages:
            raise
        _handed_over_anyway(paths, exc)
    output = inbox_output(name, wakes, inbox.messages)
    return json.dumps(output, ensure_ascii=False) if output is not None else ""


def _handed_over_anyway(paths: CardPaths, exc: Exception) -> None:
    """Log what failed in a hook that claimed the chat's messages: they are acknowledged, so
    they go to the agent whatever failed (a full disk, a broken log file), or they would be
    lost while the chat reads "delivered". Call it inside the `except` that caught `exc`."""
    log_error(
        paths.workdir,
        f"{exc.__class__.__name__}: {exc}; the chat's messages were handed over all "
        f"the same\n{traceback.format_exc()}".rstrip(),
    )


def _inside(cwd: object, root: Path) -> bool:
    """Whether the payload's `cwd` is `root` or a folder inside it."""
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        return False  # no session folder (see `resolve_workdir`): not this agent's
    try:
        return Path(os.path.realpath(cwd)).is_relative_to(os.path.realpath(root))
    except (OSError, ValueError):
        return False


def codex(
    raw: bytes | str,
    workdir_override: str | None,
    clock: Clock = utc_now_iso,
    env: Mapping[str, str] = os.environ,
    only_in: str | None = None,
    handover: Handover | None = None,
) -> str:
    """Handle one Codex payload: its `notify` JSON (the program's last argument), or the
    JSON of one of its lifecycle hooks (on stdin; it has `hook_event_name`). Returns the
    text to print on stdout (a hook's output; maybe empty).

    `only_in`: the agent's workdir, for hooks in a Codex config that every project reads
    (`~/.codex/hooks.json`): a payload whose `cwd` is outside it is another project's
    session, and is ignored without a word; one inside it is written there."""
    data = raw.encode("utf-8", errors="replace") if isinstance(raw, str) else raw
    if not data.strip():
        raise HookInputError(
            "no payload: Codex passes its notify JSON as the last argument (notify = [..., "
            '"hook", "codex"] in config.toml) and a hook\'s JSON on stdin (hooks.json); '
            "neither came, nothing written"
        )
    payload = parse_payload(data)
    if only_in is not None:
        root = _directory(only_in, "--only-in")
        _refuse_nul_cwd(payload.get("cwd"))  # said as without --only-in, not passed over
        if not _inside(payload.get("cwd"), root):
            return ""
        workdir_override = str(root)
    paths = CardPaths(resolve_workdir(workdir_override, payload))
    if "hook_event_name" in payload:
        return _codex_hook(payload, paths, clock, env, handover)
    events, completed = codex_events(payload)
    if completed and not _first_end_of(
        paths, payload.get("thread-id"), payload.get("turn-id"), "notify"
    ):
        return ""  # its Stop hook already ended this turn
    _append(paths, with_origin(events, paths, env, at_turn_end=True), clock)
    if completed:
        _count_turn(paths)
    return ""  # Codex reads nothing back from its notify program


def _codex_hook(
    payload: Mapping[str, Any],
    paths: CardPaths,
    clock: Clock,
    env: Mapping[str, str],
    handover: Handover | None = None,
) -> str:
    """One Codex lifecycle hook payload, mapped as Claude Code's (the shapes agree); the text
    to print on stdout (maybe empty).

    The differences: the turn's token usage is read from Codex's own transcript format (its
    rollout); the chat's texts are handed over as for Claude Code (Codex reads the same hook
    output), but not the card's wakes, which reach Codex through the MCP results; and the end
    of a turn that its notify program (or a copy of the hook in another config layer)
    already reported is not written again, nor its usage."""

    name = payload.get("hook_event_name")
    thread, turn = payload.get("session_id"), payload.get("turn_id")
    main = not subagent(payload)
    if name == "PostToolUse" and tool_failed(payload):
        payload = {**payload, "hook_event_name": "PostToolUseFailure"}
    if name == "UserPromptSubmit" and main:
        _turn_started(paths, thread, turn)
    usage = None
    if name in TURN_END_EVENTS and main:
        lines = transcript_tail(transcript_path(payload, paths))
        usage = rollout_usage(lines) if lines is not None else None
    key = _session_key(payload)
    # A subagent's context is not the agent's (see `claude_code`). A blocked stop is marked
    # per turn: a mark left by a turn that ended otherwise (an interrupt) holds no other.
    inbox = (
        take_inbox(
            paths,
            name,
            payload,
            _turn_key(thread, turn) or key,
            lambda line: log_error(paths.workdir, line),
            "codex",
            handover,
        )
        if main
        else Delivery()
    )
    # The end of a response a stop hook's block made Codex go on with (ours or the user's).
    continued = name == "Stop" and main and payload.get("stop_hook_active") is True
    if inbox.ends_blocked_turn:
        payload = {**payload, "stop_hook_active": False}  # our block held the turn: end it

    def make(waiting: str | None) -> HookDecision:
        interrupt = name == "Interrupt"
        if interrupt:
            decision = interrupt_decision(waiting)
        else:
            decision = steer(name, decide(payload, waiting, usage), inbox.messages)
        if continued and not _first_end_of(paths, thread, _response_of(turn, payload), "hook"):
            # Codex runs the copy of this hook from each config layer, and each sees this
            # stop: the copy that claims the response (the turn and its last message) ends
            # the turn, the other does not end it again. The usage and the count of a turn
            # our block held go with the copy that held it, whichever claims the end.
            kept = [event for event in decision.events if event[0] != "turn.end"]
            decision = replace(decision, events=kept)
        if inbox.held_elsewhere:  # the copy in another config layer blocked this stop
            kept = [event for event in decision.events if event[0] != "turn.end"]
            decision = replace(decision, events=kept, completed_turn=False)
        if not decision.completed_turn and not continued:
            # A stop held (our block, or the copy's in another config layer): the turn goes
            # on, and its stops to come write its tokens.
            decision = replace(
                decision, events=[event for event in decision.events if event[0] != "usage"]
            )
        ends = decision.completed_turn or interrupt
        reporter = "interrupt" if interrupt else "failure" if name == "StopFailure" else "hook"
        if ends and not _first_end_of(paths, thread, turn, reporter):
            # Reported already: its end and line (`turn failed ...`, `turn interrupted`) are
            # written; a second copy of them read as a second failure on the card.
            events = [
                (kind, fields)
                for kind, fields in decision.events
                if kind not in ("turn.end", "text")
            ]
            decision = HookDecision(events, decision.waiting, completed_turn=False)
        return _unwritten_usage(paths, thread, turn, decision)

    try:
        if _record(paths, key, make, env, clock).completed_turn:
            _count_turn(paths)
    except Exception as exc:
        if not inbox.messages:
            raise
        _handed_over_anyway(paths, exc)
    output = inbox_output(name, [], inbox.messages)
    return json.dumps(output, ensure_ascii=False) if output is not None else ""


def run_guarded(
    workdir_hint: str | None,
    raw_for_hint: bytes | str,
    action: Callable[[], str],
    command: str = "taskcard hook",
) -> str:
    """Run `action`; on any error log it and return nothing to print. Said on stderr (no
    workdir to log into), a bad input is one line `command: problem; fix`, as the command's
    usage errors are; the log file also names its kind (`HookInputError: ...`)."""
    try:
        return action()
    except Exception as exc:  # a hook must never fail its agent; the log says what happened
        # The log goes where the events would have gone, by the same rule; else to stderr.
        # A payload naming no session folder is not `--only-in`'s: said on stderr.
        workdir: Path | None = None
        with contextlib.suppress(Exception):
            if not isinstance(exc, NoSessionFolder):
                data = read_json(raw_for_hint) if workdir_hint is None else {}
                workdir = resolve_workdir(workdir_hint, data if isinstance(data, dict) else {})
        said: str | None = None
        if isinstance(exc, HookInputError):
            line, said = f"{exc.__class__.__name__}: {exc}", str(exc)
        elif isinstance(exc, OSError):
            # The workdir's files, not a bug: one line naming the file and the fix.
            line = f"{filesystem_problem(exc)}; this event may be missing from the card"
        else:
            line = f"{exc.__class__.__name__}: {exc}\n{traceback.format_exc()}".rstrip()
        log_error(workdir, line, command, said)
        return ""


def filesystem_problem(exc: OSError) -> str:
    """One line for a hook's file that cannot be written (a folder or a pipe where a file
    belongs, a link out of the workdir, a read-only or full disk): the file and the fix,
    never a traceback."""
    # A rename names the file it replaces second: that one is in the way, not the new one.
    name = exc.filename2 or exc.filename
    where = f"{name}: " if name else ""
    reason = exc.strerror or str(exc)
    if isinstance(exc, NotRegularFile | OutsideWorkdir):
        fix = ""  # its reason says what to do with it
    else:
        fix = (
            "; make it a writable folder or file of the workdir (move away whatever stands "
            "in its place, or free some space)"
        )
    return f"cannot write the hook's files: {where}{reason}{fix}"
