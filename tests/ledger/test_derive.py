"""The root rules of the projection, one test each: `derive` is a pure function of truth."""

from __future__ import annotations

from taskcard.producers.ledger.model import derive
from taskcard.producers.ledger.store import Ledger
from tests.ledger.conftest import FakeClock


def codes(ledger: Ledger, task: str = "t") -> set[str]:
    return {i.code for i in derive(ledger.task(task).observed).inconsistencies}


def test_no_truth_is_never_ok(ledger: Ledger) -> None:
    record = ledger.init("t", "index the corpus", ["fetch", "index"])
    derived = derive(record.observed)
    assert derived.truth_state == "NO_TRUTH"
    assert derived.workflow == "NOT_STARTED"
    assert derived.next_gate == "unknown"


def test_step_progress_is_not_step_completed(ledger: Ledger) -> None:
    ledger.init("t", "p", ["fetch", "index"])
    record = ledger.checkpoint("t", "STEP_PROGRESS", step="fetch", note="90%")
    assert record.derived.step_states == {"fetch": "RUNNING", "index": "PENDING"}
    assert record.derived.steps_done == 0
    record = ledger.checkpoint("t", "STEP_COMPLETED", step="fetch")
    assert record.derived.step_states["fetch"] == "DONE"
    assert record.derived.current_step == "index"


def test_task_completed_only_from_completion_truth(ledger: Ledger) -> None:
    ledger.init("t", "p", ["fetch"])
    record = ledger.checkpoint("t", "STEP_COMPLETED", step="fetch")
    assert record.derived.workflow == "RUNNING", "all steps done is not completion"
    record = ledger.checkpoint("t", "TASK_COMPLETED", note="index at out/index.db")
    assert record.derived.workflow == "COMPLETED"
    assert record.derived.outcome == "SUCCESS"


def test_contradictions_are_inconsistencies_not_guesses(ledger: Ledger) -> None:
    ledger.init("t", "p", ["fetch", "index"])
    ledger.checkpoint("t", "TASK_COMPLETED", note="claimed done")
    assert "completed_with_open_steps" in codes(ledger)
    ledger.external_job("t", job_id="j1", status="running", provider="batch")
    found = codes(ledger)
    assert {"external_pending_after_completion", "external_pending_without_evidence"} <= found
    record = ledger.task("t")
    assert record.derived.workflow == "INCONSISTENT"
    assert record.derived.truth_state == "INCONSISTENT"
    assert record.derived.pending_external == ["j1"], "listed, but not taken as the state"


def test_later_step_moving_before_an_earlier_one_is_an_inconsistency(ledger: Ledger) -> None:
    ledger.init("t", "p", ["fetch", "index"])
    ledger.checkpoint("t", "STEP_PROGRESS", step="index")
    assert codes(ledger) == {"step_out_of_order"}


def test_progress_after_completion_and_bad_downloads(ledger: Ledger, clock: FakeClock) -> None:
    ledger.init("t", "p", ["fetch"])
    ledger.checkpoint("t", "STEP_COMPLETED", step="fetch")
    clock.advance(0.5)
    ledger.checkpoint("t", "STEP_PROGRESS", step="fetch")
    ledger.download_observed("t", name="data", observed_bytes=10, expected_bytes=99, complete=True)
    ledger.download_observed("t", name="model", observed_bytes=10, corrupt=True)
    assert codes(ledger) == {
        "progress_after_step_completed",
        "download_size_mismatch",
        "download_corrupt",
    }


def test_completed_and_blocked(ledger: Ledger) -> None:
    ledger.init("t", "p")
    ledger.block("t", kind="MISSING_ACCESS", reason="no key")
    ledger.checkpoint("t", "TASK_COMPLETED", note="done")
    assert codes(ledger) == {"completed_and_blocked"}


def test_a_resumed_step_completes_instead_of_staying_blocked(ledger: Ledger) -> None:
    ledger.init("t", "p", ["fetch"])
    ledger.block("t", kind="MISSING_ACCESS", reason="no key", step="fetch")
    assert ledger.task("t").derived.step_states["fetch"] == "BLOCKED"
    ledger.checkpoint("t", "OWNER_RESUMED")
    ledger.checkpoint("t", "STEP_COMPLETED", step="fetch")
    record = ledger.checkpoint("t", "TASK_COMPLETED", note="done")
    assert record.derived.step_states["fetch"] == "DONE"
    assert record.derived.workflow == "COMPLETED"


def test_derived_is_recomputed_from_truth_not_from_what_the_file_says(ledger: Ledger) -> None:
    """A hand-written `derived` does not survive the next write."""
    ledger.init("t", "p", ["fetch"])
    with ledger.locked() as document:
        document.tasks["t"].derived.workflow = "COMPLETED"
    record = ledger.heartbeat("t")
    assert record.derived.workflow == "RUNNING"


def test_blocked_with_artifacts_is_a_partial_success(ledger: Ledger) -> None:
    ledger.init("t", "p", ["fetch", "index"])
    ledger.checkpoint("t", "STEP_COMPLETED", step="fetch")
    record = ledger.block("t", kind="OTHER", reason="disk full", step="index")
    assert record.derived.outcome == "PARTIAL_SUCCESS"
    assert record.derived.next_gate == "decision on block OTHER"
