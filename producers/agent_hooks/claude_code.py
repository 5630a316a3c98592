"""Claude Code hook payloads to activity events: pure decisions, table-tested.

Mapping (hook event -> activity kinds):

- `SessionStart` -> `agent.start`; `SessionEnd` -> `agent.exit`. Not a `SessionStart` with
  source `compact`: Claude Code sends it when a compaction ends, often in the middle of a
  turn, and an `agent.start` there would drop the running turn (the card read "at prompt").
  Nor a `SessionEnd` with reason `clear` or `resume`: `/clear` and an interactive `/resume`
  end the conversation, not the process, and a `SessionStart` (source `clear` / `resume`)
  follows; an `agent.exit` would tell the chats the agent exited without a report. Any other
  source (`startup`, `resume`, `clear`, `fork`) starts a session; a fork (`source: fork`)
  runs beside the session it came from, and `sessions.merge` writes the events of each so
  that the card reads as the agent and its forks together.
- `UserPromptSubmit` -> `turn.start`.
- `PreToolUse` -> `tool.start` (call_id = `tool_use_id`, name = `tool_name`); no summary, as
  a tool's input may hold secrets. A name is cut to 256 characters, an id over 128 is
  written as its digest (`sha256:<hex>`), so one line of the log stays small.
  `PostToolUse` / `PostToolUseFailure` -> `tool.end` with `ok` true / false. A failure
  with `is_interrupt` (the person pressed Esc) also ends the turn (`turn.end` with `error`
  `interrupted`, `text` "turn interrupted"): `Stop` does not fire after an interrupt. It
  is not counted for reminders (parallel calls each report it).
- `Notification` of a permission prompt, and `PermissionRequest` (the dialog is about to be
  shown) -> `wait.start` reason `permission`; of an input prompt (idle prompt, an MCP
  server's elicitation form or its request to open a URL in the browser), and `Elicitation`
  (an MCP server asks the person for input) -> `wait.start` reason `input`; an answered
  elicitation (`elicitation_response`, `elicitation_complete`) ends an input wait; other
  notifications change nothing (`agent_needs_input` and `agent_completed` are about a
  background session, not the one whose event it is). The wait also ends with the next event
  of that session that shows it moved on (`MOVING_EVENTS`: a tool's start or end, a prompt,
  a stop, `PermissionDenied`, `ElicitationResult`, ...); an event that can fire while the
  dialog is still open (`ConfigChange`, `FileChanged`, a background subagent's start or stop,
  an event this version does not know) leaves it open. A wait that `PermissionRequest` or
  `Elicitation` opened knows whose dialog it is (the main thread, or the subagent of its
  `agent_id`): the tool events of another thread (a second subagent at work beside it) leave
  it open; its own thread's, or the turn's (a prompt, a stop, the session's start or end),
  end it.
- `Stop` -> `usage` (the turn's tokens, when the transcript has them) then `turn.end`; it is
  also the completed turn that reminders count. Every `Stop` is the end of a response:
  `stop_hook_active` only says that this response is one a stop hook's block made Claude
  go on with (the hook's reason is then in the transcript as a user message, so the usage
  counts only that part). Whether Claude goes on again depends on the answers to this very
  event, as at any stop, so it ends the turn too (a tool call after it starts the next);
  the turn counted for reminders at its first stop already.
  A `Stop` whose `background_tasks` lists running work that reports back (a subagent, a
  workflow, a teammate, a cloud session, an MCP task, or a type of a later version) is not
  the end of the turn: the session pauses until that work wakes it. A background shell or
  monitor does not hold the turn (it may be a server or a watcher that runs as long as the
  session, and the session is at its prompt meanwhile), nor does a scheduled prompt
  (`session_crons`: work for later, perhaps tomorrow). It writes `usage` and `text`
  "working in the background (<n> tasks)", no `turn.end`: the card reads running
  (then unknown when silent for long), never idle, and the idle signal never says the turn
  was declared finished (its silence notice still comes, as for any quiet turn; the
  "waiting" state is not used, as it reads "waiting for a person"). Nor does it count for
  reminders; the stop that ends the turn does.
- `StopFailure` (the turn ended in an API error; `Stop` does not fire then) -> `usage` as for
  `Stop`, `turn.end` with `error` (the error's category, one word, for the idle signal), then
  `text` "turn failed (<error>): <error_details>", one short line (the card redacts it like
  any agent text); a completed turn for reminders, like `Stop`. `last_assistant_message` is
  never copied.
- `SubagentStop` -> nothing: the `Task` tool call that ran the subagent already shows as a
  tool start and end in the parent session.
- `PreCompact` -> `text` "compacting the conversation": it can take a while, and the card
  should not look stuck on the last tool meanwhile.
- Any other event (`SubagentStart`, `TaskCreated`, `ConfigChange`, a future one) -> nothing.

An event with `agent_id` fired inside a subagent (the field is absent on the main thread, even
in an `--agent` session, where only `agent_type` is set). Its tool calls and waits show as
usual, but it never starts or ends the session's turn or the agent: a subagent's `Stop` or
`StopFailure` is not the end of the turn that runs it (its failure is a `text` line only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from taskcard.producers.agent_hooks.payload_json import loads_at_any_depth
from taskcard.producers.task_card.contract import MAX_COUNT, open_regular, turn_error_word

Event = tuple[str, dict[str, Any]]

# Events after which Claude Code reads `hookSpecificOutput.additionalContext`.
CONTEXT_EVENTS: Final = frozenset({"UserPromptSubmit", "PostToolUse"})
TRANSCRIPT_TAIL_BYTES: Final = 4_000_000
# Prompts that wait on the person's input: the idle prompt, an MCP server's elicitation form,
# and its request to open a URL (`elicitation_url_dialog`, for a browser sign-in).
_INPUT_PROMPTS: Final = frozenset({"idle_prompt", "elicitation_dialog", "elicitation_url_dialog"})
# Notifications that the person answered an elicitation dialog (form or URL): its wait is over.
_INPUT_ANSWERED: Final = frozenset({"elicitation_response", "elicitation_complete"})
# Events that start a wait on a person, and its reason.
WAIT_EVENTS: Final = {"PermissionRequest": "permission", "Elicitation": "input"}
# Events after which a person's dialog is over: the session moved on.
MOVING_EVENTS: Final = frozenset(
    {
        "SessionStart",
        "SessionEnd",
        "UserPromptSubmit",
        "PreToolUse",
        "PostToolUse",
        "PostToolUseFailure",
        "PostToolBatch",
        "Stop",
        "StopFailure",
        "PreCompact",
        "PostCompact",
        "PermissionDenied",
        "ElicitationResult",
    }
)
# Events that end a wait whichever thread opened it: the turn itself moved on.
_TURN_EVENTS: Final = frozenset(
    {"SessionStart", "SessionEnd", "UserPromptSubmit", "Stop", "StopFailure"}
)
# Between a wait's reason and the thread (`agent_id`, or `main`) whose dialog it is, in the
# session's wait as the hooks keep it.
_THREAD_MARK: Final = "@"
# Events that read the transcript for the turn's usage.
TURN_END_EVENTS: Final = frozenset({"Stop", "StopFailure"})
# `SessionEnd` reasons after which the same process starts a session again at once: `/clear`,
# and an interactive `/resume` that switches to another conversation.
_SWITCHES: Final = frozenset({"clear", "resume"})
FAILURE_TEXT_CHARS: Final = 200
# A background task's `status` once it is over (the host lists running ones; an older one
# may list others).
_FINISHED_TASKS: Final = frozenset({"completed", "failed", "killed", "stopped", "cancelled"})
# Background task types that do not hold a turn: they may run for the whole session.
_LASTING_TASKS: Final = frozenset({"shell", "monitor"})


@dataclass(frozen=True)
class HookDecision:
    """What one payload means: the events to append, and the session's wait afterwards."""

    events: list[Event]
    waiting: str | None
    completed_turn: bool


def _text(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    return value if isinstance(value, str) and value else None


def wait_reason(payload: Mapping[str, Any]) -> str | None:
    """`permission` or `input` for a notification that blocks on a person, else None."""
    kind = _text(payload, "notification_type")
    if kind == "permission_prompt":
        return "permission"
    if kind in _INPUT_PROMPTS:
        return "input"
    if kind is not None:
        return None
    message = (_text(payload, "message") or "").lower()  # hosts before notification_type
    if "permission" in message:
        return "permission"
    if "waiting for your input" in message:
        return "input"
    return None


def subagent(payload: Mapping[str, Any]) -> bool:
    """Whether the event fired inside a subagent (`agent_id` is set only there)."""
    return _text(payload, "agent_id") is not None


def interrupted(payload: Mapping[str, Any]) -> bool:
    """A main-thread tool call that the person interrupted: the turn is over, with no `Stop`."""
    return (
        payload.get("hook_event_name") == "PostToolUseFailure"
        and payload.get("is_interrupt") is True
        and not subagent(payload)
    )


def ends_turn_without_stop(payload: Mapping[str, Any]) -> bool:
    """The main thread's turn ended, and no `Stop` of it will come (an API error, Esc)."""
    name = payload.get("hook_event_name")
    return (name == "StopFailure" and not subagent(payload)) or interrupted(payload)


def error_category(payload: Mapping[str, Any]) -> str:
    """The failed turn's error as one word (`rate_limit`), for `turn.end` `error`."""
    for key in ("error_type", "error"):  # an early shape: error_type, and error a code
        word = turn_error_word(payload.get(key))
        if word is not None:
            return word
    return "unknown"


def failure_text(payload: Mapping[str, Any]) -> str:
    """One short line saying why a turn failed, from the error's typed fields only."""
    details = _text(payload, "error_details") or _text(payload, "error_message")
    text = f"turn failed ({error_category(payload)})" + (f": {details}" if details else "")
    flat = " ".join(text.split())
    if len(flat) > FAILURE_TEXT_CHARS:
        # Cut between words, never inside one: the service redacts secrets by their whole
        # shape, so half a key left at the cut would be shown as it is.
        kept = flat[: FAILURE_TEXT_CHARS - 2]
        if flat[len(kept)] != " ":
            kept = kept[: kept.rfind(" ")]
        flat = kept.rstrip() + " …"
    return flat if not subagent(payload) else f"a subagent's {flat}"


def background_text(payload: Mapping[str, Any]) -> str | None:
    """The line for a `Stop` that pauses the session for its own background work that
    reports back (a subagent still running, ...): the turn goes on when that work wakes it.
    None for a stop with no such work (see the module's `Stop`)."""
    tasks = payload.get("background_tasks")
    count = sum(
        1
        for task in (tasks if isinstance(tasks, list) else ())
        if isinstance(task, dict)
        and task.get("status") not in _FINISHED_TASKS
        and task.get("type") not in _LASTING_TASKS
    )
    if not count:
        return None
    return f"working in the background ({count} task{'' if count == 1 else 's'})"


def wait_reason_of(waiting: str) -> str:
    """The reason (`permission`, `input`) of a session's wait as the hooks keep it."""
    return waiting.partition(_THREAD_MARK)[0]


_ID_MAX_CHARS = 128
# A tool's name as written; the hosts' are far shorter (an MCP tool's is server and tool).
_TOOL_NAME_MAX_CHARS = 256


def bounded_id(text: str) -> str:
    """An id as written: one longer than any a host makes is kept as its digest, which
    still tells it from every other id and stays small."""
    if len(text) > _ID_MAX_CHARS:
        return "sha256:" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()
    return text


def _thread(payload: Mapping[str, Any]) -> str:
    """The thread an event comes from: a subagent's id, else the main thread. An oversized
    id is kept as its digest (`bounded_id`), so the saved wait stays small (the waits file
    is read with a size limit, and one oversized value would lose every open wait)."""
    return bounded_id(_text(payload, "agent_id") or "main")


def _ends_wait(payload: Mapping[str, Any], waiting: str) -> bool:
    """Whether this moving event ends the open wait. A wait a `PermissionRequest` or an
    `Elicitation` opened knows its thread: another thread's tool events (a second subagent
    at work beside the one whose dialog is open) leave it open; only that thread's moving
    on, or the turn's, ends it. A wait a `Notification` opened does not know its thread:
    any moving event ends it."""
    _, mark, thread = waiting.partition(_THREAD_MARK)
    name = payload.get("hook_event_name")
    if not mark or (name in _TURN_EVENTS and not subagent(payload)):
        return True
    return _thread(payload) == thread


def _start_wait(reason: str | None, waiting: str | None, thread: str = "") -> HookDecision:
    if reason is None or (waiting is not None and reason == wait_reason_of(waiting)):
        return HookDecision([], waiting, completed_turn=False)
    events: list[Event] = []
    if waiting is not None:
        events.append(("wait.end", {"reason": wait_reason_of(waiting)}))
    events.append(("wait.start", {"reason": reason}))
    kept = f"{reason}{_THREAD_MARK}{thread}" if thread else reason
    return HookDecision(events, kept, completed_turn=False)


def decide(
    payload: Mapping[str, Any],
    waiting: str | None,
    usage: tuple[int, int] | None = None,
) -> HookDecision:
    """The events for one hook payload, given the session's open wait (if any)."""
    name = payload.get("hook_event_name")
    if name == "Notification":
        answered = _text(payload, "notification_type") in _INPUT_ANSWERED
        if waiting is not None and wait_reason_of(waiting) == "input" and answered:
            return HookDecision([("wait.end", {"reason": "input"})], None, completed_turn=False)
        return _start_wait(wait_reason(payload), waiting)
    if isinstance(name, str) and name in WAIT_EVENTS:
        return _start_wait(WAIT_EVENTS[name], waiting, _thread(payload))
    moving = name in MOVING_EVENTS and (waiting is None or _ends_wait(payload, waiting))
    events: list[Event] = []
    if waiting is not None and moving:
        events.append(("wait.end", {"reason": wait_reason_of(waiting)}))
    # Both bounded: a tool name or id of megabytes was written whole into a line of the
    # activity log, which the service reads in bounded steps, so that line (and the lines
    # before it in the same step) never reached the card.
    tool = (_text(payload, "tool_name") or "tool")[:_TOOL_NAME_MAX_CHARS]
    call_id = bounded_id(_text(payload, "tool_use_id") or tool)
    completed = False
    main = not subagent(payload)  # a subagent never starts or ends the session's turn
    if name == "SessionStart" and main:
        if payload.get("source") != "compact":  # the same session goes on after compacting
            events.append(("agent.start", {}))
    elif name == "SessionEnd" and main:
        if _text(payload, "reason") not in _SWITCHES:  # the process goes on, started again next
            events.append(("agent.exit", {}))
    elif name == "UserPromptSubmit" and main:
        events.append(("turn.start", {}))
    elif name == "PreToolUse":
        events.append(("tool.start", {"call_id": call_id, "name": tool}))
    elif name in ("PostToolUse", "PostToolUseFailure"):
        events.append(("tool.end", {"call_id": call_id, "ok": name == "PostToolUse"}))
        if interrupted(payload):
            events += [
                ("turn.end", {"error": "interrupted"}),
                ("text", {"text": "turn interrupted"}),
            ]
    elif name in TURN_END_EVENTS and main:
        if usage is not None:
            events.append(("usage", {"input_tokens": usage[0], "output_tokens": usage[1]}))
        background = background_text(payload) if name == "Stop" else None
        if name == "StopFailure":
            events.append(("turn.end", {"error": error_category(payload)}))
            events.append(("text", {"text": failure_text(payload)}))
        elif background is not None:  # paused for its own work: the turn is not done
            events.append(("text", {"text": background}))
        else:
            events.append(("turn.end", {}))
        completed = payload.get("stop_hook_active") is not True and background is None
    elif name == "StopFailure":
        events.append(("text", {"text": failure_text(payload)}))
    elif name == "PreCompact":
        events.append(("text", {"text": "compacting the conversation"}))
    return HookDecision(events, None if moving else waiting, completed)


def hook_output(event_name: object, wakes: list[str]) -> dict[str, Any] | None:
    """The JSON Claude Code reads from stdout, or None to print nothing."""
    if not wakes or event_name not in CONTEXT_EVENTS:
        return None
    return {
        "hookSpecificOutput": {
            "hookEventName": event_name,
            "additionalContext": "\n".join(wakes),
        }
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _is_prompt(entry: Mapping[str, Any]) -> bool:
    """A person's prompt (the start of a turn), not a tool result fed back to the model."""
    if entry.get("type") != "user":
        return False
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return True
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "text" for block in content
    )


def turn_usage(lines: list[bytes]) -> tuple[int, int] | None:
    """Input and output tokens of the last turn in transcript lines, None when none are known.

    Input counts the cached prompt tokens too (created and read), since the turn consumed
    them. One API message is written as several lines (one per content block) repeating its
    usage, so each message id counts once, with its last line's figures.
    """
    per_message: dict[str, tuple[int, int]] = {}
    for raw in lines:
        try:
            entry = loads_at_any_depth(raw)  # a tool's deep input cost the line's usage
        except (ValueError, RecursionError):
            continue
        if not isinstance(entry, dict):
            continue
        if _is_prompt(entry):
            per_message.clear()
            continue
        message = entry.get("message")
        if entry.get("type") != "assistant" or not isinstance(message, dict):
            continue
        usage = message.get("usage")
        if not isinstance(usage, dict):
            continue
        tokens_in = sum(
            _count(usage.get(key))
            for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        ident = message.get("id")
        key = ident if isinstance(ident, str) else f"line{len(per_message)}"
        per_message[key] = (tokens_in, _count(usage.get("output_tokens")))
    if not per_message:
        return None
    # Capped at what the activity log takes: an absurd count must not cost the turn's events.
    return (
        min(MAX_COUNT, sum(tokens for tokens, _ in per_message.values())),
        min(MAX_COUNT, sum(tokens for _, tokens in per_message.values())),
    )


def read_transcript_usage(path: object) -> tuple[int, int] | None:
    """`turn_usage` of the transcript's tail (bounded), None when it cannot be read."""
    lines = transcript_tail(path)
    return None if lines is None else turn_usage(lines)


def transcript_tail(path: object) -> list[bytes] | None:
    """The whole lines of a transcript's last `TRANSCRIPT_TAIL_BYTES`, None when it cannot be
    read. Only a regular file is opened (a pipe there must not hang the hook)."""
    if not isinstance(path, str) or not path:
        return None
    try:
        with open_regular(Path(path)) as handle:
            size = handle.seek(0, 2)
            start = max(0, size - TRANSCRIPT_TAIL_BYTES)
            handle.seek(start)
            data = handle.read(TRANSCRIPT_TAIL_BYTES)
    except (OSError, ValueError):
        return None
    lines = data.splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # the first line of a tail is likely cut
    return lines
