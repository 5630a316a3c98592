"""The monitor's precedence, one row per branch: exactly one action for each situation."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from taskcard.producers.ledger.model import (
    BlockTruth,
    CompletionTruth,
    ExternalJob,
    Limits,
    Observed,
    StepTruth,
    Supervision,
    TaskInfo,
    TaskRecord,
)
from taskcard.producers.ledger.monitor import decide
from tests.ledger.conftest import T0

LIMITS = Limits(
    nudge_after_sec=600,
    timeout_sec=3600,
    heartbeat_every_sec=120,
    renotify_sec=60,
    max_nudges=2,
    max_retries=1,
    external_max_wait_sec=900,
)


def at(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def record(observed: Observed | None = None, supervision: Supervision | None = None) -> TaskRecord:
    return TaskRecord(
        task=TaskInfo(task_id="t", purpose="p", created_at=T0, limits=LIMITS),
        observed=observed or Observed(),
        supervision=supervision or Supervision(),
    )


def moved(seconds: float = 0, **fields: object) -> Observed:
    """Truth whose last progress delta was `seconds` after T0."""
    base: dict[str, object] = {
        "started_at": T0,
        "steps": [StepTruth(step_id="a", progress_at=T0 + at(seconds))],
        "last_delta_at": T0 + at(seconds),
        "last_delta_source": "STEP_PROGRESS",
    }
    base.update(fields)
    return Observed.model_validate(base)


def done() -> Observed:
    return moved(
        steps=[StepTruth(step_id="a", progress_at=T0, completed_at=T0 + at(1))],
        task_completion=CompletionTruth(completed_at=T0 + at(2), source="executor", summary="ok"),
    )


def block(kind: str, *, failed: bool = False, seconds: float = 10) -> BlockTruth:
    return BlockTruth.model_validate(
        {
            "blocked_at": T0 + at(seconds),
            "kind": kind,
            "reason": "r",
            "source": "executor",
            "step": "a",
            "failed": failed,
        }
    )


def job(status: str, changed: float, evidence: str | None = "prov-42") -> ExternalJob:
    return ExternalJob.model_validate(
        {
            "job_id": "j1",
            "provider": "batch",
            "status": status,
            "evidence": evidence,
            "observed_at": T0 + at(changed),
            "status_changed_at": T0 + at(changed),
            "max_wait_sec": 900,
        }
    )


Row = tuple[str, Callable[[], TaskRecord], float, str, str]

ROWS: list[Row] = [
    # 1. terminal
    ("completed → stop", lambda: record(done()), 10, "STOP_AND_DELETE", "completed"),
    (
        "completed wins over staleness",
        lambda: record(done()),
        10_000,
        "STOP_AND_DELETE",
        "completed",
    ),
    # 2. inconsistent truth / suspicious external claims
    (
        "pending job without evidence",
        lambda: record(moved(external_jobs=[job("running", 0, evidence=None)])),
        10,
        "TRUTH_INCONSISTENT",
        "external_pending_without_evidence",
    ),
    (
        "completion with open steps is not terminal",
        lambda: record(
            moved(task_completion=CompletionTruth(completed_at=T0, source="owner", summary="done"))
        ),
        10,
        "TRUTH_INCONSISTENT",
        "completed_with_open_steps",
    ),
    (
        "inconsistency wins over a block",
        lambda: record(
            moved(
                block=block("OTHER"),
                external_jobs=[job("submitted", 0, evidence=None)],
            )
        ),
        10,
        "TRUTH_INCONSISTENT",
        "external_pending_without_evidence",
    ),
    (
        "pending job past its time limit",
        lambda: record(moved(external_jobs=[job("running", 0)])),
        901,
        "OWNER_RECONCILE",
        "external_overdue",
    ),
    (
        "owner could not answer (D)",
        lambda: record(moved(owner={"reply": "D", "reply_at": T0 + at(5)})),
        10,
        "OWNER_RECONCILE",
        "find_external_evidence",
    ),
    # 3. confirmed block: retry first, then escalate
    (
        "transient block gets a retry",
        lambda: record(moved(block=block("TRANSIENT_NETWORK"))),
        20,
        "OWNER_RECONCILE",
        "retry",
    ),
    (
        "retry asked, still within the wait",
        lambda: record(
            moved(block=block("DOWNLOAD_TIMEOUT")),
            Supervision(
                retries_requested=1, retried_block="a:DOWNLOAD_TIMEOUT", last_retry_at=T0 + at(15)
            ),
        ),
        30,
        "OWNER_RECONCILE",
        "retry",
    ),
    (
        "retry used up and waited out → escalate",
        lambda: record(
            moved(block=block("EXECUTION_ERROR")),
            Supervision(
                retries_requested=1, retried_block="a:EXECUTION_ERROR", last_retry_at=T0 + at(15)
            ),
        ),
        200,
        "BLOCKED_ESCALATE",
        "EXECUTION_ERROR",
    ),
    (
        "the retry failed again → escalate at once",
        lambda: record(
            moved(block=block("EXTERNAL_WAIT", seconds=20)),
            Supervision(
                retries_requested=1, retried_block="a:EXTERNAL_WAIT", last_retry_at=T0 + at(15)
            ),
        ),
        25,
        "BLOCKED_ESCALATE",
        "EXTERNAL_WAIT",
    ),
    (
        "non-transient block escalates at once",
        lambda: record(moved(block=block("MISSING_ACCESS"))),
        20,
        "BLOCKED_ESCALATE",
        "MISSING_ACCESS",
    ),
    (
        "a failed step is not retried",
        lambda: record(moved(block=block("TIMEOUT", failed=True))),
        20,
        "BLOCKED_ESCALATE",
        "TIMEOUT",
    ),
    (
        "a block wins over staleness",
        lambda: record(moved(block=block("OTHER"))),
        99_999,
        "BLOCKED_ESCALATE",
        "OTHER",
    ),
    # 4. no material progress delta
    (
        "owner says forgotten (E) → resume now",
        lambda: record(moved(owner={"reply": "E", "reply_at": T0 + at(5)})),
        10,
        "NUDGE_MAIN_AGENT",
        "resume_now",
    ),
    (
        "inactive past timeout",
        lambda: record(moved()),
        3600,
        "STALE_PROGRESS",
        "inactive_past_timeout",
    ),
    (
        "an overdue external job is reconciled, not waited on forever",
        lambda: record(moved(external_jobs=[job("running", 0)])),
        3600,
        "OWNER_RECONCILE",
        "external_overdue",
    ),
    ("idle past nudge_after", lambda: record(moved()), 600, "NUDGE_MAIN_AGENT", "no_progress"),
    (
        "nudges unanswered → stale",
        lambda: record(moved(), Supervision(nudges_sent=2, nudged_for=T0)),
        700,
        "STALE_PROGRESS",
        "nudges_unanswered",
    ),
    (
        "old nudges do not count against new progress",
        lambda: record(moved(1000), Supervision(nudges_sent=2, nudged_for=T0)),
        1600,
        "NUDGE_MAIN_AGENT",
        "no_progress",
    ),
    (
        "heartbeat due",
        lambda: record(moved()),
        120,
        "HEARTBEAT_DUE",
        "no_heartbeat",
    ),
    (
        "waiting on an external job within its limit: no nudge",
        lambda: record(moved(external_jobs=[job("running", 0)])),
        700,
        "OK",
        "progressing",
    ),
    # 5. only then OK, never without truth
    ("fresh progress → OK", lambda: record(moved(100)), 150, "OK", "progressing"),
    ("nothing observed yet", lambda: record(), 30, "AWAITING_TRUTH", "nothing_observed"),
    ("nothing observed for long", lambda: record(), 600, "NUDGE_MAIN_AGENT", "no_progress"),
]


@pytest.mark.parametrize(
    ("name", "make", "after_s", "action", "reason"), ROWS, ids=[r[0] for r in ROWS]
)
def test_precedence(
    name: str, make: Callable[[], TaskRecord], after_s: float, action: str, reason: str
) -> None:
    decision = decide(make(), T0 + at(after_s))
    assert (decision.action, decision.reason) == (action, reason)


def test_progress_resets_every_threshold_for_hours() -> None:
    """Supervision is by progress: a task moving every 100 s is never nudged, even for a day."""
    for hours in (1, 6, 24):
        seconds = hours * 3600
        decision = decide(record(moved(seconds - 100)), T0 + at(seconds))
        assert decision.action == "OK"


def test_heartbeat_is_not_due_while_progress_is_fresh() -> None:
    fresh = moved(500, executor_health={"last_success_at": T0})
    assert decide(record(fresh), T0 + at(510)).action == "OK"


def test_sub_second_times_are_compared_as_times() -> None:
    """Progress 0.4 s after the block in the same second is later, not equal or earlier."""
    blocked = block("MISSING_ACCESS", seconds=10)
    observed = moved(10.4, block=blocked)
    assert observed.last_delta_at is not None and observed.last_delta_at > blocked.blocked_at
    reply_first = moved(10.6, owner={"reply": "E", "reply_at": T0 + at(10.2)})
    assert decide(record(reply_first), T0 + at(11)).reason != "resume_now"


def test_nudges_are_paced_and_keyed() -> None:
    first = decide(record(moved()), T0 + at(600))
    sup = Supervision(
        nudges_sent=1,
        nudged_for=T0,
        last_action="NUDGE_MAIN_AGENT",
        last_action_at=T0 + at(600),
        last_action_key=first.key,
    )
    again = decide(record(moved(), sup), T0 + at(630))
    assert again.key == first.key, "within renotify_sec the same nudge is not repeated"
    later = decide(record(moved(), sup), T0 + at(700))
    assert later.action == "NUDGE_MAIN_AGENT" and later.key != first.key
