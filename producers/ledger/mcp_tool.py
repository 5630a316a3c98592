"""The `ledger` MCP tool: the ledger commands as one flat JSON object.

The input schema is a single top-level object (no `oneOf`/`anyOf` at the root, which some
MCP clients refuse): `command` picks the operation and the other properties are its fields,
exactly the options of `taskcard ledger COMMAND`. The call runs in-process (a ledger is only
files, there is no host to reach), always answers a dict, and never raises for bad input.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import ValidationError

from taskcard.producers.ledger.model import (
    EVENT_TYPES,
    FAILURE_KINDS,
    MAX_BYTES,
    MAX_NOTE_CHARS,
    MAX_SECONDS,
    OWNER_REPLIES,
    Limits,
    TaskRecord,
    derive,
)
from taskcard.producers.ledger.render import RENDERER_FILE, render_markdown, write_renderer
from taskcard.producers.ledger.store import (
    DEFAULT_LEDGER,
    EVENT_FIELDS,
    Ledger,
    LedgerError,
    cannot_write,
    not_taken,
    worded,
)
from taskcard.producers.task_card.contract import quoted
from taskcard.producers.task_card.runtime import HostPaths
from taskcard.producers.task_card.tool_failure import BAD_ARGUMENTS, WRITE_FAILED, failed

TOOL_NAME: Final = "ledger"
COMMANDS: Final = (
    "init",
    "checkpoint",
    "block",
    "external-job",
    "download-observed",
    "owner-reply",
    "heartbeat",
    "show",
    "supervise",
    "render",
)
TOOL_DESCRIPTION: Final = (
    "Long task ledger: record observed truth (checkpoint with one of ten event types, block, "
    "external-job, download-observed, owner-reply, heartbeat), read the derived state (show, "
    "render) and run the monitor (supervise). Never write a state by hand: observe, record, "
    "and the state is derived."
)
_LIMITS: Final = {
    "nudge_after_sec": "seconds without progress before the agent is nudged",
    "timeout_sec": "seconds without progress before the task counts as stale",
    "heartbeat_every_sec": "seconds between expected heartbeats (0: none)",
    "renotify_sec": "seconds before the same action is sent again",
    "external_max_wait_sec": "longest wait on pending external work",
    "max_nudges": "nudges",
    "max_retries": "retries",
}
# An id (task, step, job, download) and a text of the ledger, as the store checks them.
_ID: Final = {
    "type": "string",
    "minLength": 1,
    "maxLength": 64,
    "description": "1-64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit",
}
_TEXT: Final = {"type": "string", "maxLength": MAX_NOTE_CHARS}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _limit_field(name: str, text: str) -> dict[str, Any]:
    """An init limit with the bounds the `Limits` model enforces, in the portable subset
    (`minimum`/`maximum` only: a bound that excludes 0 is said in the description)."""
    field = Limits.model_fields[name]
    bounds = {
        key: getattr(meta, key)
        for meta in field.metadata
        for key in ("gt", "ge", "le")
        if getattr(meta, key, None) is not None
    }
    kind = "integer" if field.annotation is int else "number"
    above = "above" if "gt" in bounds else "at least"
    low, high = bounds["gt"] if "gt" in bounds else bounds["ge"], bounds["le"]
    return {
        "type": kind,
        "minimum": low,
        "maximum": high,
        "description": f"init: {text}; {above} {_number(low)}, at most {_number(high)}",
    }


# What a command cannot go without besides `command`, as the store refuses it when missing;
# a checkpoint of one of these event types needs what the command of the same name needs.
_REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    "init": ("task_id", "purpose"),
    "checkpoint": ("task_id", "event_type"),
    "block": ("task_id", "kind", "reason"),
    "external-job": ("task_id", "job_id", "status"),
    "download-observed": ("task_id", "name", "observed_bytes"),
    "owner-reply": ("task_id", "reply"),
    "heartbeat": ("task_id",),
}
_EVENT_COMMANDS: Final = {
    "BLOCKED_CONFIRMED": "block",
    "OWNER_REPLY_RECORDED": "owner-reply",
    "EXTERNAL_OBSERVED": "external-job",
    "DOWNLOAD_OBSERVED": "download-observed",
}


def _takers(name: str) -> str:
    """Which commands take the field `name`, each marked when it needs it: the schema is one
    flat object, so without this a caller learnt that `block` needs `kind` and `reason` only
    from a refused call."""
    takers = [
        f"{command} (required)" if name in _REQUIRED.get(command, ()) else command
        for command in COMMANDS
        if name in command_fields(command)
    ]
    for event, command in _EVENT_COMMANDS.items():
        if name in EVENT_FIELDS[event]:
            needed = " (required)" if name in _REQUIRED[command] else ""
            takers.append(f"checkpoint {event}{needed}")
    return f"for: {', '.join(takers)}"


def _described(properties: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every field but `command` with the commands that take it added to its description
    (the limits, which only init takes and never needs, say so at their start)."""
    out: dict[str, dict[str, Any]] = {}
    for name, spec in properties.items():
        if name != "command" and not spec.get("description", "").startswith("init: "):
            text = spec.get("description")
            spec = {**spec, "description": f"{text}; {_takers(name)}" if text else _takers(name)}
        out[name] = spec
    return out


def input_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": _described(
            {
                "command": {
                    "type": "string",
                    "enum": list(COMMANDS),
                    "description": "the operation; each other field says which commands take it",
                },
                "task_id": {
                    **_ID,
                    "description": f"the task (optional for show/render/supervise): "
                    f"{_ID['description']}",
                },
                "purpose": {
                    **_TEXT,
                    "minLength": 1,
                    "description": "what the task is for, in one line",
                },
                "steps": {
                    "type": "array",
                    "items": _ID,
                    "description": "planned step ids, each once",
                },
                "event_type": {
                    "type": "string",
                    "enum": list(EVENT_TYPES),
                    "description": "what was observed",
                },
                "step": {
                    **_ID,
                    "description": "the step that moved or is blocked (checkpoint STEP_PROGRESS "
                    f"and STEP_COMPLETED need it): {_ID['description']}",
                },
                "new_step": {
                    "type": "boolean",
                    "description": "true when step is not in the plan yet and is to join it (else "
                    "such a step is refused)",
                },
                "note": {
                    **_TEXT,
                    "description": "what was observed; the evidence of a completion (checkpoint "
                    "TASK_COMPLETED and owner-reply C need it)",
                },
                "kind": {
                    "type": "string",
                    "enum": list(FAILURE_KINDS),
                    "description": "the kind of failure that blocks the task",
                },
                "reason": {**_TEXT, "description": "what stops the task, in one sentence"},
                "safe_next_step": {**_TEXT, "description": "what is safe to do next"},
                "failed": {"type": "boolean", "description": "true: the step failed for good"},
                "job_id": {**_ID, "description": f"the external job's id: {_ID['description']}"},
                "status": {
                    "type": "string",
                    "enum": ["submitted", "running", "succeeded", "failed", "cancelled"],
                    "description": "the external job's status, as its provider says it",
                },
                "provider": {**_TEXT, "description": "who runs the external job"},
                "evidence": {**_TEXT, "description": "the provider's own id, URL or status line"},
                "max_wait_sec": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_SECONDS,
                    "description": f"seconds, above 0, at most {_number(MAX_SECONDS)}",
                },
                "name": {**_ID, "description": f"the download's id: {_ID['description']}"},
                "observed_bytes": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_BYTES,
                    "description": f"bytes of the download seen on disk, at most {MAX_BYTES}",
                },
                "expected_bytes": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_BYTES,
                    "description": f"the download's full size in bytes, at most {MAX_BYTES}",
                },
                "complete": {
                    "type": "boolean",
                    "description": "true: the download says it finished",
                },
                "corrupt": {"type": "boolean", "description": "true: a check found it corrupt"},
                "reply": {
                    "type": "string",
                    "enum": list(OWNER_REPLIES),
                    "description": "; ".join(f"{k} = {v}" for k, v in OWNER_REPLIES.items()),
                },
                "apply_supervision": {
                    "type": "boolean",
                    "description": "true: deliver the actions decided (wakes, notices, retiring "
                    "the card), not only list them",
                },
                **{name: _limit_field(name, text) for name, text in _LIMITS.items()},
            }
        ),
        "required": ["command"],
    }


_INIT_LIMITS: Final = tuple(_LIMITS)
_JSON_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "array": (list,),
}
_TYPE_NAMES: Final = {
    "string": "text",
    "boolean": "true or false",
    "integer": "a whole number",
    "number": "a number",
    "array": "a list of text",
}


def type_error(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """The first argument whose JSON type is not the schema's, as a message naming it and the
    fix (None: all fine). MCP servers do not check inputs against the schema; without this a
    string given for `steps` became one step per character and `true` counted as 1 byte.
    A null counts as left out."""
    for name, value in arguments.items():
        spec = schema["properties"].get(name, {})
        kind = spec.get("type")
        if value is None or kind not in _JSON_TYPES:
            continue
        fits = isinstance(value, _JSON_TYPES[kind])
        if kind in ("integer", "number") and isinstance(value, bool):
            fits = False
        if kind == "array" and fits:
            fits = all(isinstance(item, str) for item in value)
        if not fits:
            return f"{name}: must be {_TYPE_NAMES[kind]}, not {_json_type(value)}"
    return None


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list" if all(isinstance(i, str) for i in value) else "a list with non-text items"
    return "an object"


_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "block": ("kind", "reason", "step", "new_step", "safe_next_step", "failed"),
    "external-job": ("job_id", "status", "provider", "evidence", "max_wait_sec"),
    "download-observed": ("name", "observed_bytes", "expected_bytes", "complete", "corrupt"),
    "owner-reply": ("reply", "note", "reason", "safe_next_step", "kind"),
    "heartbeat": ("note",),
}


def command_fields(command: str, event_type: object = None) -> tuple[str, ...]:
    """The fields `command` takes besides `command` itself (a checkpoint's depend on its
    event type), as the options of `taskcard ledger COMMAND`."""
    if command == "init":
        return ("task_id", "purpose", "steps", *_INIT_LIMITS)
    if command == "checkpoint":
        extra = EVENT_FIELDS.get(event_type, ()) if isinstance(event_type, str) else ()
        return ("task_id", "event_type", "step", "new_step", "note", *extra)
    if command == "supervise":
        return ("task_id", "apply_supervision")
    return ("task_id", *_FIELDS.get(command, ()))


def stray_field(command: str, arguments: dict[str, Any]) -> str | None:
    """The message for the first given field `command` does not take, else None: it was
    dropped without a word (a `step` on a heartbeat, a `note` on init), where the command
    line refuses an option its command lacks."""
    takes = command_fields(command, arguments.get("event_type"))
    given = (name for name, value in arguments.items() if value is not None)  # null: left out
    stray = sorted(name for name in given if name != "command" and name not in takes)
    if not stray:
        return None
    if command == "checkpoint":
        # A field of another event type, refused as the store and the command line refuse
        # it; without a known event type, the store refuses that first (what the checkpoint
        # takes depends on it).
        event_type = arguments.get("event_type")
        return (
            worded(not_taken(event_type, stray) or "", "mcp") if event_type in EVENT_TYPES else None
        )
    return f"{stray[0]}: not a field of {command}; remove it ({command} takes: {', '.join(takes)})"


def _failed(message: str) -> dict[str, Any]:
    """A call refused for an argument (the message names the field)."""
    return failed(BAD_ARGUMENTS, message)


def call_ledger(paths: HostPaths, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run one ledger command for the workdir of `paths`; a result dict, never an exception."""
    wrong = type_error(arguments, input_schema())
    if wrong is not None:
        return _failed(f"{wrong}; see the ledger tool's schema")
    command = arguments.get("command")
    if command is None:  # left out: say it is required, not that None is no command
        return _failed(f"command: required; use one of {', '.join(COMMANDS)}")
    if command not in COMMANDS:
        return _failed(
            f"command: {quoted(command)} is not a command; use one of {', '.join(COMMANDS)}"
        )
    stray = stray_field(command, arguments)
    if stray is not None:
        return _failed(stray)
    ledger = Ledger(paths.workdir / DEFAULT_LEDGER, inside=paths.workdir, way="mcp")
    try:
        return {"status": "ok", "command": command, **_run(ledger, paths, command, arguments)}
    except LedgerError as exc:  # its code: an argument, or the ledger's file; its words the
        return failed(exc.code, worded(str(exc), "mcp"))  # tool's (said so already, mostly)
    except (TypeError, ValidationError):
        return _failed(f"a field of {command} has the wrong type; see the ledger tool's schema")
    except OSError as exc:
        # A file where the `ledger/` folder belongs, a folder the agent cannot write: it went
        # up to the SDK as a protocol error with a traceback, and the session lost the call.
        return failed(WRITE_FAILED, cannot_write(exc))


def _run(ledger: Ledger, paths: HostPaths, command: str, args: dict[str, Any]) -> dict[str, Any]:
    task_id = args.get("task_id")
    if command in ("show", "render") and task_id is None:
        task_id = ledger.default_task_id()
    if command == "supervise":
        from taskcard.producers.ledger.card import retirer_via_host
        from taskcard.producers.ledger.notifications import LedgerNotificationPort
        from taskcard.producers.ledger.supervise import supervise
        from taskcard.producers.task_card.contract import CardPaths

        skipped: list[str] = []
        decisions = supervise(
            ledger,
            LedgerNotificationPort(CardPaths(paths.workdir)),
            apply=bool(args.get("apply_supervision")),
            task_id=task_id,
            retire_card=retirer_via_host(paths),
            skipped=skipped,
        )
        result: dict[str, Any] = {
            "decisions": [
                {"task_id": d.task_id, "action": d.action, "reason": d.reason} for d in decisions
            ]
        }
        if skipped:
            result["skipped"] = [worded(problem, "mcp") for problem in skipped]
        return result
    if not isinstance(task_id, str):
        raise LedgerError(f"task_id: {command} needs task_id (a string)")
    if command == "show":
        record = ledger.task(task_id)
        record.derived = derive(record.observed)
        return {"record": record.model_dump(mode="json")}
    if command == "render":
        return {"markdown": render_markdown(ledger.task(task_id), ledger.clock())}
    if command == "init":
        limits = {k: args[k] for k in _INIT_LIMITS if args.get(k) is not None}
        record = ledger.init(
            task_id, str(args.get("purpose") or ""), list(args.get("steps") or []), **limits
        )
        if write_renderer(paths.workdir, ledger.path, task_id):
            return {**_summary(task_id, record), "renderer": RENDERER_FILE}
    else:
        if command == "checkpoint":
            event_type: Any = args.get("event_type")  # the store refuses a missing one
            names = ("step", "new_step", "note", *EVENT_FIELDS.get(str(event_type), ()))
            fields = {k: args[k] for k in names if k in args}
            record = ledger.checkpoint(task_id, event_type, **fields)
            return _summary(task_id, record)
        fields = {k: args[k] for k in _FIELDS[command] if k in args}
        if command == "block":
            record = ledger.block(task_id, **fields)
        elif command == "external-job":
            record = ledger.external_job(task_id, **fields)
        elif command == "download-observed":
            record = ledger.download_observed(task_id, **fields)
        elif command == "owner-reply":
            record = ledger.owner_reply(task_id, **fields)
        else:
            record = ledger.heartbeat(task_id, **fields)
    return _summary(task_id, record)


def _summary(task_id: str, record: TaskRecord) -> dict[str, Any]:
    derived = derive(record.observed)
    return {
        "task_id": task_id,
        "workflow": derived.workflow,
        "truth_state": derived.truth_state,
        "next_gate": derived.next_gate,
        "inconsistencies": [i.code for i in derived.inconsistencies],
    }
