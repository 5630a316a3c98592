"""Typed ledger notifications on the workdir's system channel (`.notification/system.jsonl`).

Wakes (`ledger.nudge`, `ledger.reconcile`, `ledger.inconsistent`, `ledger.stale`,
`ledger.heartbeat`) are for the agent: their header and body tell it what to do next.
People notices (`ledger.blocked`, `ledger.completed`) are for the chats: the service builds
their text from `extra` only (task id, failure kind, outcome), never from header or body.

The port reuses the task card's file port (dedup by id, size-bounded rotation, one whole
line per `write`), so both capabilities share one well-behaved file; ledger code can only
say which typed event happened, never write a free-form source.
"""

from __future__ import annotations

from typing import Final

from taskcard.producers.ledger.contract import (
    SOURCE_BLOCKED,
    SOURCE_COMPLETED,
    SOURCE_HEARTBEAT,
    SOURCE_INCONSISTENT,
    SOURCE_NUDGE,
    SOURCE_RECONCILE,
    SOURCE_STALE,
)
from taskcard.producers.ledger.model import OWNER_REPLIES, TaskRecord, moved_at
from taskcard.producers.ledger.monitor import Decision
from taskcard.producers.task_card.notifications import FileNotificationPort

WAKE_SOURCES: Final[dict[str, str]] = {
    "NUDGE_MAIN_AGENT": SOURCE_NUDGE,
    "OWNER_RECONCILE": SOURCE_RECONCILE,
    "TRUTH_INCONSISTENT": SOURCE_INCONSISTENT,
    "STALE_PROGRESS": SOURCE_STALE,
    "HEARTBEAT_DUE": SOURCE_HEARTBEAT,
}

_OWNER_ASK: Final = (
    "Observe first (the process, the files, the provider), record what you see with "
    "`taskcard ledger checkpoint|external-job|download-observed`, then resume, complete or "
    "block. Do not write a state by hand. Then answer with `taskcard ledger owner-reply "
    "--reply` one of: " + "; ".join(f"{k} = {v}" for k, v in OWNER_REPLIES.items()) + "."
)


def _wake_body(decision: Decision, record: TaskRecord) -> str:
    task = record.task.task_id
    if decision.action == "NUDGE_MAIN_AGENT" and decision.reason == "resume_now":
        return f"The owner says task {task} was forgotten: resume it now and record progress."
    if decision.action == "NUDGE_MAIN_AGENT":
        return (
            f"Task {task} has recorded no progress for a while. If it is moving, record a "
            "checkpoint (STEP_PROGRESS, STEP_COMPLETED) or a heartbeat; if it is stuck, record "
            "a block with its kind and reason."
        )
    if decision.action == "HEARTBEAT_DUE":
        return f"Task {task} expects a heartbeat: run `taskcard ledger heartbeat {task}`."
    if decision.action == "TRUTH_INCONSISTENT" and decision.reason == "movement_in_future":
        moved = moved_at(record.observed)
        return (
            f"The ledger of task {task} dates its last movement"
            f" {moved.isoformat() if moved else 'unknown'}, ahead of this machine's clock, so"
            " it could never look idle. " + _OWNER_ASK
        )
    if decision.action == "TRUTH_INCONSISTENT":
        details = "; ".join(i.detail for i in record.derived.inconsistencies) or decision.reason
        return f"The ledger of task {task} contradicts itself ({details}). " + _OWNER_ASK
    if decision.reason == "retry":
        block = record.observed.block
        kind = block.kind if block else "unknown"
        return (
            f"Task {task} is blocked by a transient failure ({kind}). Retry it once now; if "
            "the retry fails, record the block again and it will be escalated to people."
        )
    if decision.reason == "external_overdue":
        return f"An external job of task {task} is pending past its time limit. " + _OWNER_ASK
    if decision.reason == "find_external_evidence":
        return f"No answer is known for task {task}: find external evidence. " + _OWNER_ASK
    return f"Task {task} made no progress past its inactivity limit. " + _OWNER_ASK


class LedgerNotificationPort(FileNotificationPort):
    """The ledger's typed events on the shared system channel file."""

    def wake(self, decision: Decision, record: TaskRecord) -> None:
        source = WAKE_SOURCES[decision.action]
        self._append(
            decision.key,
            decision.task_id,
            {
                "source": source,
                "priority": "high" if decision.action != "HEARTBEAT_DUE" else "normal",
                "header": f"Ledger: {decision.action} for task {decision.task_id}",
                "body": _wake_body(decision, record),
                "extra": {
                    "state": decision.action,
                    "task_id": decision.task_id,
                    "reason": decision.reason,
                },
            },
        )

    def blocked(self, decision: Decision, record: TaskRecord) -> None:
        block = record.observed.block
        self._append(
            decision.key,
            decision.task_id,
            {
                "source": SOURCE_BLOCKED,
                "priority": "high",
                "header": f"Task {decision.task_id} is blocked",
                "body": block.reason if block else "",
                "extra": {
                    "state": "blocked",
                    "task_id": decision.task_id,
                    "kind": block.kind if block else "OTHER",
                    "step": block.step if block else None,
                },
            },
        )

    def completed(
        self, decision: Decision, record: TaskRecord, *, card_retired: bool = False
    ) -> None:
        """`card_retired`: this completion ends the ledger's card (no other task is open and
        a card host was asked to stop it); the chat notice says so only then."""
        self._append(
            "ledger.completed:" + decision.key.removeprefix("ledger.stop_and_delete:"),
            decision.task_id,
            {
                "source": SOURCE_COMPLETED,
                "priority": "normal",
                "header": f"Task {decision.task_id} completed",
                "body": record.observed.task_completion.summary
                if record.observed.task_completion
                else "",
                "extra": {
                    "state": "completed",
                    "task_id": decision.task_id,
                    "outcome": record.derived.outcome,
                    "steps_done": record.derived.steps_done,
                    "step_count": record.derived.step_count,
                    "card_retired": card_retired,
                },
            },
        )
