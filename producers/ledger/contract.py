"""The ledger's file contract for consumers: the path, the notification sources, a summary.

The projection service imports only this module from the ledger (standard library and the
task card contract only).
`parse_summary` is total: any bytes give a `LedgerSummary`, with `unknown` wherever the file
does not say something it can trust. Every value it returns is from a closed vocabulary or
a short id, so it is safe to show in a chat.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from taskcard.producers.task_card.contract import count_field

LEDGER_DIR: Final = "ledger"
LEDGER_FILE: Final = "long-task-ledger.json"
MAX_SUMMARY_BYTES: Final = 4_000_000

# Notification sources the ledger writes; the people-facing ones carry typed `extra` fields.
SOURCE_NUDGE: Final = "ledger.nudge"
SOURCE_RECONCILE: Final = "ledger.reconcile"
SOURCE_INCONSISTENT: Final = "ledger.inconsistent"
SOURCE_STALE: Final = "ledger.stale"
SOURCE_HEARTBEAT: Final = "ledger.heartbeat"
SOURCE_BLOCKED: Final = "ledger.blocked"  # extra: task_id, kind, step
SOURCE_COMPLETED: Final = "ledger.completed"  # extra: task_id, outcome, steps_done, step_count

# The closed vocabularies of the ledger file, stated once: the pydantic model (`model.py`)
# types its fields with these `Literal`s, and a consumer reading the file checks a value
# against the set of the same words (a `Literal` is standard library, so this module stays
# free of pydantic). A word added here is at once a value the model writes and one the chat
# shows; there is no second list to forget.
Workflow = Literal[
    "NOT_STARTED", "RUNNING", "WAITING_EXTERNAL", "BLOCKED", "FAILED", "COMPLETED", "INCONSISTENT"
]
Outcome = Literal["SUCCESS", "PARTIAL_SUCCESS", "BLOCKED", "FAILED", "IN_PROGRESS"]
FailureKind = Literal[
    "TIMEOUT",
    "DOWNLOAD_TIMEOUT",
    "DOWNLOAD_INCOMPLETE",
    "TRANSIENT_NETWORK",
    "EXECUTION_ERROR",
    "EXTERNAL_WAIT",
    "NEEDS_OWNER_DECISION",
    "MISSING_ACCESS",
    "MISSING_INPUT",
    "OTHER",
]
WORKFLOWS: Final[frozenset[str]] = frozenset(get_args(Workflow))
OUTCOMES: Final[frozenset[str]] = frozenset(get_args(Outcome))
FAILURE_KIND_NAMES: Final[frozenset[str]] = frozenset(get_args(FailureKind))
SAFE_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_GATE: Final = re.compile(
    r"(unknown|none: completed|owner reconciles the truth|task completion"
    r"|decision on block [A-Z_]{1,40}|external job [A-Za-z0-9][A-Za-z0-9_.:-]{0,63}"
    r"|complete step [A-Za-z0-9][A-Za-z0-9_.:-]{0,63})"
)


def safe_id(value: object) -> str | None:
    return value if isinstance(value, str) and SAFE_ID.fullmatch(value) else None


@dataclass(frozen=True)
class LedgerSummary:
    """What a chat may see of a ledger: the newest open task's state and next gate."""

    task_id: str | None = None
    workflow: str = "unknown"
    next_gate: str = "unknown"
    steps_done: int | None = None
    step_count: int | None = None


def _int(value: Any) -> int | None:
    """A step count, or None: the task card contract's total count parser (no 4,000-digit
    number reaches a row, which could not even be printed)."""
    return count_field(value)


# What to do about a ledger file the service cannot read a row from (`judged_summary`).
LEDGER_FIX: Final = "write it with `taskcard ledger` or the ledger MCP tool, not by hand"


def parse_summary(data: bytes) -> LedgerSummary:
    """The summary of the newest task not completed (else the newest). Never raises."""
    return judged_summary(data)[0]


def judged_summary(data: bytes) -> tuple[LedgerSummary, str | None]:
    """`parse_summary`, and why the bytes are no ledger the row can be read from, in words
    that follow the file's name (None for a ledger, also one with no task yet, and for an
    empty file, a write under way). Such a file read as "ledger: unknown" and nothing said
    which file or why."""
    if not data.strip():
        return LedgerSummary(), None
    try:
        document = json.loads(data)
    except UnicodeDecodeError:
        return LedgerSummary(), f"is not UTF-8 text; {LEDGER_FIX}"
    except RecursionError:
        return LedgerSummary(), f"nests deeper than JSON is read; {LEDGER_FIX}"
    except ValueError:
        return LedgerSummary(), f"is not JSON; {LEDGER_FIX}"
    if not isinstance(document, dict):
        return LedgerSummary(), f"is not a JSON object; {LEDGER_FIX}"
    tasks = document.get("tasks")
    if not isinstance(tasks, dict):
        return LedgerSummary(), f'has no "tasks" object; {LEDGER_FIX}'
    summary = _summary_of(tasks)
    if tasks and summary is None:
        return LedgerSummary(), f"holds no task with its task and derived objects; {LEDGER_FIX}"
    return summary or LedgerSummary(), None


def _summary_of(tasks: dict[str, Any]) -> LedgerSummary | None:
    """The summary of the newest task not completed (else the newest), None when no
    record is a task."""
    candidates: list[tuple[bool, str, dict[str, Any]]] = []
    for record in tasks.values():
        if not isinstance(record, dict):
            continue
        task, derived = record.get("task"), record.get("derived")
        if not isinstance(task, dict) or not isinstance(derived, dict):
            continue
        created = task.get("created_at")
        open_task = derived.get("workflow") != "COMPLETED"
        candidates.append((open_task, created if isinstance(created, str) else "", record))
    if not candidates:
        return None
    _, _, record = max(candidates, key=lambda item: (item[0], item[1]))
    derived = record["derived"]
    workflow = derived.get("workflow")
    gate = derived.get("next_gate")
    return LedgerSummary(
        task_id=safe_id(record["task"].get("task_id")),
        # Only text is tested against the set: a list or an object there would raise.
        workflow=workflow if isinstance(workflow, str) and workflow in WORKFLOWS else "unknown",
        next_gate=gate if isinstance(gate, str) and _GATE.fullmatch(gate) else "unknown",
        steps_done=_int(derived.get("steps_done")),
        step_count=_int(derived.get("step_count")),
    )
