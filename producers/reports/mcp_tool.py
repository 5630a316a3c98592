"""The `report`, `reports` and `spawn` MCP tools: flat input schemas, results as dicts,
never raising.

The server is bound to one workdir (the calling agent's): `report` reports for it with the
channel `mcp`; `reports` reads its reports, or a child's (an orchestrator reading what the
agent it spawned returned, with the last seq it read, as `taskcard reports --after` does);
`spawn` records a child with this agent as the parent (its id defaults to the
workdir's directory name, which is the agent id a discovering service gives it, and its folder
is this workdir) and this workdir's lineage for the depth and the loop check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from taskcard.producers.reports.contract import MAX_SEQ
from taskcard.producers.reports.lineage import (
    AGENT_ID,
    AGENT_ID_RULE,
    DEFAULT_MAX_DEPTH,
    MAX_DEPTH_LIMIT,
    MAX_REASON_CHARS,
    LineageError,
    spawn,
)
from taskcard.producers.reports.store import (
    MAX_SUMMARY_CHARS,
    SKIPPED_SHOWN,
    VERDICTS,
    ReportError,
    Reports,
    after_problem,
    write_problem,
)
from taskcard.producers.task_card.contract import json_kind, quoted
from taskcard.producers.task_card.runtime import HostPaths
from taskcard.producers.task_card.tool_failure import (
    BAD_ARGUMENTS,
    READ_FAILED,
    WRITE_FAILED,
    failed,
)
from taskcard.producers.task_card.workdir_arg import WorkdirError, expand_workdir

REPORT_TOOL: Final = "report"
READ_TOOL: Final = "reports"
SPAWN_TOOL: Final = "spawn"
REPORT_DESCRIPTION: Final = (
    "Report the result of your work, numbered, kept after you exit: ok=true when it "
    "succeeded, false for a declared failure; verdict approved/rejected when it is a review; "
    "your role now; a short summary; details in payload (at most 64 KiB)."
)
READ_DESCRIPTION: Final = (
    "Read a report, yours or a child agent's (child_workdir): the first one numbered above "
    "after (the last seq you read), or the latest without it; report is null when there is "
    "none newer. Read with the seq of the last one you got: nothing skipped, nothing repeated."
    " skipped names the broken lines of the file read past where a report could have been."
)
SPAWN_DESCRIPTION: Final = (
    "Record that you create another agent: its workdir, why (required), its provider. "
    "Refused past the depth cap. Call it before you start the child."
)
_STR: Final = {"type": "string"}


def report_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean", "description": "true: succeeded; false: a declared failure"},
            "verdict": {"type": "string", "enum": list(VERDICTS), "description": "reviews only"},
            "role": {
                **_STR,
                "minLength": 1,
                "maxLength": 64,
                "description": "your role at this moment, e.g. reviewer: 1-64 letters (of any"
                " script), digits, spaces, '_', '.' or '-'",
            },
            "summary": {**_STR, "minLength": 1, "maxLength": MAX_SUMMARY_CHARS},
            "payload": {**_STR, "description": "details, at most 64 KiB of text"},
        },
        "required": ["ok"],
    }


def read_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "after": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_SEQ,
                "description": "the seq of the last report you read (default: the latest)",
            },
            "child_workdir": {
                **_STR,
                "minLength": 1,
                "description": "a child agent's workdir (absolute, or relative to yours), to"
                " read its reports; default: your own",
            },
        },
    }


def read_result_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "status": {"type": "string", "description": "ok, or failed with a message"},
            "report": {
                "type": ["object", "null"],
                "description": "seq, at, ok, verdict, role, channel, summary, payload_file,"
                " payload_bytes and payload; null when there is none newer",
            },
            "skipped": {
                "type": "array",
                "maxItems": SKIPPED_SHOWN,
                "items": {
                    "type": "object",
                    "properties": {
                        "line": {"type": "integer", "minimum": 1},
                        "problem": {"type": "string"},
                    },
                    "required": ["line", "problem"],
                },
                "description": "present when broken lines of reports/reports.jsonl were read"
                " past where a report could have been (after the last report at or below"
                " after, or after the latest): the first ones by line number, what is wrong"
                " and the fix; a report written there is lost",
            },
            "skipped_more": {
                "type": "integer",
                "minimum": 0,
                "description": "with skipped: how many more broken lines were read past",
            },
            "message": {"type": "string", "description": "Why a call failed, and the fix."},
        },
        "required": ["status"],
    }


def spawn_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "child_workdir": {
                **_STR,
                "minLength": 1,
                "description": "absolute, or relative to your workdir; never your workdir,"
                " a folder above it, one inside its inbox/, reports/, taskcard/, ledger/,"
                " logs/ or .notification/, or an agent above you in your lineage",
            },
            "reason": {
                **_STR,
                "minLength": 1,
                "maxLength": MAX_REASON_CHARS,
                "description": "why the child is created (required)",
            },
            "provider": {
                **_STR,
                "minLength": 1,
                "maxLength": 64,
                "description": "e.g. claude-code, codex: 1-64 letters, digits, spaces or _.:/-",
            },
            "parent": {
                **_STR,
                "minLength": 1,
                "maxLength": 64,
                "description": f"your agent id ({AGENT_ID_RULE}); default: your workdir's name",
            },
            "max_depth": {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH_LIMIT},
        },
        "required": ["child_workdir", "reason"],
    }


def result_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "status": {"type": "string", "description": "ok, or failed with a message"},
            "message": {"type": "string", "description": "Why a call failed, and the fix."},
        },
        "required": ["status"],
    }


def _failed(message: str) -> dict[str, Any]:
    """A call refused for an argument (the message names the field)."""
    return failed(BAD_ARGUMENTS, message)


def call_report(paths: HostPaths, arguments: dict[str, Any]) -> dict[str, Any]:
    if "ok" not in arguments:
        return _failed("ok: required (true or false)")
    try:
        record = Reports(paths.workdir, channel="mcp").add(**arguments)
    except ReportError as exc:
        return failed(exc.code, str(exc))
    except OSError as exc:
        return failed(WRITE_FAILED, write_problem(exc, paths.workdir))
    return {"status": "ok", **record}


def call_reports(paths: HostPaths, arguments: dict[str, Any]) -> dict[str, Any]:
    after = arguments.get("after")
    problem = None if after is None else after_problem(after)
    if problem is not None:  # before the child's folder is looked at, as ever
        return _failed(f"after: {problem}")
    workdir = Path(paths.workdir)
    child = arguments.get("child_workdir")
    if child is not None:
        if not isinstance(child, str) or not child.strip():
            return _failed(
                "child_workdir: give the child agent's working directory (absolute, or"
                " relative to yours), or leave it out to read your own reports"
            )
        try:
            workdir = expand_workdir(child, base=workdir)
        except WorkdirError as exc:
            return _failed(f"child_workdir: {exc}")
    try:
        reports = Reports(workdir, channel="mcp")
        report = reports.after(after)
    except ReportError as exc:
        message = str(exc)
        if child is not None and message.startswith("workdir:"):
            message = "child_" + message
        return failed(exc.code, message)
    except OSError as exc:
        where = "child_workdir" if child is not None else "reports"
        problem = f"{where}: cannot read {quoted(str(workdir / 'reports'))} ({exc.strerror})"
        return failed(READ_FAILED, problem)
    result: dict[str, Any] = {"status": "ok", "report": report}
    shown, more = reports.skipped_lines()
    if shown:  # as `taskcard reports` says them on stderr: a report there is lost
        result["skipped"] = [{"line": number, "problem": text} for number, text in shown]
        result["skipped_more"] = more
    return result


def call_spawn(paths: HostPaths, arguments: dict[str, Any]) -> dict[str, Any]:
    child = arguments.get("child_workdir")
    if child is None:
        return _failed("child_workdir: required, the child's working directory")
    if not isinstance(child, str):
        return _failed(
            f"child_workdir: must be text, not {json_kind(child)}; give the child's working"
            " directory (absolute, or relative to your workdir)"
        )
    if not child.strip():
        # The workdirs' own hint, "for this one: .", named the parent's workdir here, which
        # the next check refuses.
        return _failed(
            "child_workdir: is empty; give the child's working directory (absolute, or "
            "relative to your workdir, such as a folder inside it or beside it)"
        )
    workdir = Path(paths.workdir)
    try:
        child_workdir = expand_workdir(child, base=workdir)
    except WorkdirError as exc:
        return _failed(f"child_workdir: {exc}")
    if child_workdir == workdir.resolve():
        # The lineage check says `parent_workdir`, which this tool has no field for.
        return _failed(
            "child_workdir: is your own workdir, and an agent is not its own parent; give the"
            " child's working directory"
        )
    parent = arguments.get("parent", workdir.resolve().name)
    if "parent" not in arguments and not AGENT_ID.fullmatch(parent):
        return _failed(
            f"parent: defaults to this workdir's folder name, and {parent[:64]!r} is not an "
            f"agent id ({AGENT_ID_RULE}); pass parent, the id the service "
            "knows this agent by"
        )
    try:
        record = spawn(
            child_workdir,
            parent=parent,
            reason=arguments.get("reason", ""),
            provider=arguments.get("provider"),
            parent_workdir=workdir,
            max_depth=arguments.get("max_depth", DEFAULT_MAX_DEPTH),
            way="mcp",  # the child's folder is `child_workdir` (this tool's own is the parent's)
        )
    except LineageError as exc:  # a lineage.json it cannot write too (`write_failed`)
        return failed(exc.code, str(exc))
    return {"status": "ok", **record}
