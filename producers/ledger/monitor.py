"""The monitor: exactly one control action per task, chosen by a fixed precedence.

1. terminal (completion truth, consistent) → STOP_AND_DELETE;
2. contradictory truth (or a last movement dated ahead of the clock) → TRUTH_INCONSISTENT;
   a suspicious external claim (a pending job past its time limit) or an owner who could not
   answer (reply D) → OWNER_RECONCILE;
3. a confirmed block → a retry first for the transient kinds (OWNER_RECONCILE, reason
   `retry`) while the retry budget lasts, then BLOCKED_ESCALATE;
4. no material progress delta → NUDGE_MAIN_AGENT, STALE_PROGRESS or HEARTBEAT_DUE;
5. only then OK (or AWAITING_TRUTH while nothing has been observed yet: no OK without truth).

Supervision is by progress, not by the clock on the wall: every threshold counts from the
last progress delta (`observed.last_delta_at`), which any step progress or completion,
download, external status change, heartbeat or owner resume moves. A task that keeps
moving is never stopped, however long it runs.

Pure: `decide(record, now)` reads the record's truth, limits and the monitor's bookkeeping
and returns a `Decision`; the caller applies it. Each decision carries an idempotency key,
so applying the same decision twice tells nobody anything new.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from taskcard.producers.ledger.model import RETRYABLE_KINDS, TaskRecord, derive, moved_at

Action = Literal[
    "STOP_AND_DELETE",
    "TRUTH_INCONSISTENT",
    "OWNER_RECONCILE",
    "BLOCKED_ESCALATE",
    "NUDGE_MAIN_AGENT",
    "STALE_PROGRESS",
    "HEARTBEAT_DUE",
    "AWAITING_TRUTH",
    "OK",
]
# How far ahead of this machine's clock a recorded movement may be (clocks of the machines
# writing one ledger differ a little) before it is taken as contradictory truth.
FUTURE_SKEW_S: Final = 300.0
# Who hears about an action: the agent (a wake), people (a notice), or nobody.
AGENT_ACTIONS: Final = frozenset(
    {"TRUTH_INCONSISTENT", "OWNER_RECONCILE", "NUDGE_MAIN_AGENT", "STALE_PROGRESS", "HEARTBEAT_DUE"}
)


@dataclass(frozen=True)
class Decision:
    """One action, why (a short closed-vocabulary reason) and its idempotency key."""

    task_id: str
    action: Action
    reason: str
    key: str


def _iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment is not None else "-"


def _seconds(since: datetime | None, now: datetime) -> float:
    return (now - since).total_seconds() if since is not None else 0.0


def decide(record: TaskRecord, now: datetime) -> Decision:
    """The one action for `record` at `now`. Recomputes the projection instead of trusting it."""
    task_id = record.task.task_id
    limits = record.task.limits
    observed = record.observed
    sup = record.supervision
    derived = derive(observed)
    last_moved = moved_at(observed)

    def make(action: Action, reason: str, episode: str) -> Decision:
        return Decision(task_id, action, reason, f"ledger.{action.lower()}:{task_id}:{episode}")

    # 1. terminal
    if derived.workflow == "COMPLETED" and observed.task_completion is not None:
        return make("STOP_AND_DELETE", "completed", _iso(observed.task_completion.completed_at))

    # 2. inconsistent truth, suspicious external claims, an owner without an answer
    if derived.inconsistencies:
        codes = ",".join(sorted({i.code for i in derived.inconsistencies}))
        return make("TRUTH_INCONSISTENT", codes, f"{codes}:{_iso(last_moved)}")
    if last_moved is not None and (last_moved - now).total_seconds() > FUTURE_SKEW_S:
        # Dated ahead of the clock, it would count as movement until that date: never idle.
        return make("TRUTH_INCONSISTENT", "movement_in_future", _iso(last_moved))
    for job in observed.external_jobs:
        if job.job_id in derived.pending_external and now - job.status_changed_at > timedelta(
            seconds=job.max_wait_sec
        ):
            return make(
                "OWNER_RECONCILE", "external_overdue", f"{job.job_id}:{_iso(job.status_changed_at)}"
            )
    owner = observed.owner
    fresh_reply = owner.reply_at is not None and (
        last_moved is None or owner.reply_at >= last_moved
    )
    if fresh_reply and owner.reply == "D":
        return make("OWNER_RECONCILE", "find_external_evidence", _iso(owner.reply_at))

    # 3. a confirmed block: retry first for transient kinds, then escalate
    block = observed.block
    if block is not None and block.active:
        block_key = f"{block.step or '-'}:{block.kind}"
        retries = sup.retries_requested if sup.retried_block == block_key else 0
        if block.kind in RETRYABLE_KINDS and not block.failed:
            if retries < limits.max_retries:
                return make("OWNER_RECONCILE", "retry", f"{block_key}:{retries + 1}")
            waiting = (
                sup.last_retry_at is not None
                and block.blocked_at <= sup.last_retry_at
                and _seconds(sup.last_retry_at, now) < limits.renotify_sec
            )
            if waiting:  # the retry was asked for and has not failed yet: give it time
                return make("OWNER_RECONCILE", "retry", f"{block_key}:{retries}")
        return make("BLOCKED_ESCALATE", block.kind, _iso(block.blocked_at))

    # 4. no material progress delta
    baseline = last_moved or record.task.created_at
    idle_s = _seconds(baseline, now)
    if fresh_reply and owner.reply == "E":
        return make("NUDGE_MAIN_AGENT", "resume_now", f"reply:{_iso(owner.reply_at)}")
    waiting_external = bool(derived.pending_external)
    if idle_s >= limits.timeout_sec:
        return make("STALE_PROGRESS", "inactive_past_timeout", _iso(baseline))
    if idle_s >= limits.nudge_after_sec and not waiting_external:
        nudges = sup.nudges_sent if sup.nudged_for == baseline else 0
        recently = (
            nudges > 0
            and sup.last_action == "NUDGE_MAIN_AGENT"
            and _seconds(sup.last_action_at, now) < limits.renotify_sec
        )
        if recently:
            return make("NUDGE_MAIN_AGENT", "no_progress", f"{_iso(baseline)}:{nudges}")
        if nudges < limits.max_nudges:
            return make("NUDGE_MAIN_AGENT", "no_progress", f"{_iso(baseline)}:{nudges + 1}")
        return make("STALE_PROGRESS", "nudges_unanswered", _iso(baseline))
    if (
        limits.heartbeat_every_sec > 0
        and idle_s >= limits.heartbeat_every_sec
        and not waiting_external
        and last_moved is not None
    ):
        return make("HEARTBEAT_DUE", "no_heartbeat", _iso(baseline))

    # 5. only then OK, and never without truth
    if derived.truth_state == "NO_TRUTH":
        return make("AWAITING_TRUTH", "nothing_observed", "-")
    return make("OK", "progressing", _iso(baseline))
