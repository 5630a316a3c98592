"""Applying monitor decisions: wakes to the agent, notices to people, retiring the card.

`supervise` decides for every task of a ledger (or one), and with `apply` delivers each new
decision once: it records the decision in that task's `supervision` bookkeeping (and only
that task's), appends the typed notification, and after a completion retires the workdir's
task card when no other task of the ledger is still open. A decision whose key was already
delivered changes nothing, so running it every few seconds from the host and from cron at
the same time is safe. A task whose record in the file is broken is skipped (the caller is
told) and counts as open.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from taskcard.producers.ledger.model import TaskRecord, derive, moved_at
from taskcard.producers.ledger.monitor import AGENT_ACTIONS, Decision, decide
from taskcard.producers.ledger.notifications import LedgerNotificationPort
from taskcard.producers.ledger.store import Ledger

log = logging.getLogger(__name__)
# Stops the workdir's task card at completion; None where there is no card to stop (no
# watch), and the completion notice then does not call the card retired.
CardRetirer = Callable[[], None]


def _record_delivery(record: TaskRecord, decision: Decision, now: datetime) -> None:
    sup = record.supervision
    sup.last_action, sup.last_action_at, sup.last_action_key = decision.action, now, decision.key
    if decision.action == "NUDGE_MAIN_AGENT" and decision.reason == "no_progress":
        baseline = moved_at(record.observed) or record.task.created_at
        sup.nudges_sent = sup.nudges_sent + 1 if sup.nudged_for == baseline else 1
        sup.nudged_for = baseline
    if decision.action == "OWNER_RECONCILE" and decision.reason == "retry":
        block = record.observed.block
        assert block is not None
        block_key = f"{block.step or '-'}:{block.kind}"
        sup.retries_requested = sup.retries_requested + 1 if sup.retried_block == block_key else 1
        sup.retried_block, sup.last_retry_at = block_key, now
    if decision.action == "STOP_AND_DELETE":
        sup.stopped_at = now


def _already_delivered(record: TaskRecord, decision: Decision) -> bool:
    if decision.action in ("OK", "AWAITING_TRUTH"):
        return True
    # A completion recorded again with nothing else decided since (a retried call, an amended
    # note) is the same completion: the chat heard "completed" once. Between two completions
    # that another decision separates (progress after the first made the truth inconsistent),
    # the second is news.
    if decision.action == "STOP_AND_DELETE" and record.supervision.last_action == decision.action:
        return True
    return record.supervision.last_action_key == decision.key


def supervise(
    ledger: Ledger,
    port: LedgerNotificationPort,
    *,
    apply: bool,
    task_id: str | None = None,
    retire_card: CardRetirer | None = None,
    now: datetime | None = None,
    skipped: list[str] | None = None,
) -> list[Decision]:
    """The decision for each task (or `task_id`); delivered when `apply` is set. Deciding for
    every task, what is wrong with each broken one is added to `skipped`."""
    if not apply:
        document = ledger.read()
        at = now or ledger.clock()
        ids = [task_id] if task_id is not None else sorted(document.tasks)
        if task_id is None and skipped is not None:
            skipped.extend(ledger.broken_problem(document, i) or i for i in sorted(document.broken))
        return [decide(ledger.require(document, i), at) for i in ids]
    decisions: list[Decision] = []
    retire = False
    with ledger.locked() as document:
        at = now or ledger.clock()
        ids = [task_id] if task_id is not None else sorted(document.tasks)
        # Completion truth alone decides STOP_AND_DELETE, so whether every task is finished
        # is known before any delivery; the card is retired only then. A broken task may be
        # one still running: it keeps the card.
        still_open = bool(document.broken) or any(
            decide(record, at).action != "STOP_AND_DELETE" for record in document.tasks.values()
        )
        if task_id is None and skipped is not None:
            skipped.extend(ledger.broken_problem(document, i) or i for i in sorted(document.broken))
        for ident in ids:
            record = ledger.require(document, ident)
            decision = decide(record, at)
            decisions.append(decision)
            # Every reader recomputes `derived`; the file is brought in line too, so the chat's
            # ledger row (which reads the file's) never shows a state written by hand.
            record.derived = derive(record.observed)
            if _already_delivered(record, decision):
                continue
            if decision.action in AGENT_ACTIONS:
                port.wake(decision, record)
            elif decision.action == "BLOCKED_ESCALATE":
                port.blocked(decision, record)
            elif decision.action == "STOP_AND_DELETE":
                card_retired = not still_open and retire_card is not None
                port.completed(decision, record, card_retired=card_retired)
                retire = True
            _record_delivery(record, decision, at)
    if retire and not still_open and retire_card is not None:
        try:
            retire_card()
        except Exception:  # the card is the agent's; a failure to stop it must not undo truth
            log.exception("ledger %s: the task card could not be retired", ledger.path)
    return decisions
