"""Writes: locked and atomic across processes, bounded, one task at a time; supervision."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from taskcard.producers.ledger.model import MAX_OBSERVATIONS
from taskcard.producers.ledger.notifications import LedgerNotificationPort
from taskcard.producers.ledger.store import Ledger, LedgerError
from taskcard.producers.ledger.supervise import supervise
from taskcard.producers.task_card.contract import CardPaths
from tests.ledger.conftest import FakeClock, notifications

WRITER = """
import sys
from taskcard.producers.ledger.store import Ledger, LedgerError
Ledger(sys.argv[1]).checkpoint("t", "STEP_PROGRESS", step="s" + sys.argv[2], note=sys.argv[2])
"""


def test_twenty_concurrent_checkpoints_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    Ledger(path).init("t", "p")
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n)]) for n in range(20)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0] * 20
    record = Ledger(path).task("t")
    assert sorted(o.note or "" for o in record.observations) == sorted(str(n) for n in range(20))
    assert {s.step_id for s in record.observed.steps} == {f"s{n}" for n in range(20)}
    assert [o.seq for o in record.observations] == list(range(1, 21))


def test_observations_are_bounded_and_truth_survives(ledger: Ledger) -> None:
    ledger.init("t", "p", ["a"])
    ledger.checkpoint("t", "STEP_COMPLETED", step="a")
    for _ in range(MAX_OBSERVATIONS + 20):
        ledger.heartbeat("t")
    record = ledger.task("t")
    assert len(record.observations) == MAX_OBSERVATIONS
    assert record.observations_dropped == 21
    assert record.observations[-1].seq == MAX_OBSERVATIONS + 21
    assert record.derived.step_states == {"a": "DONE"}


def test_supervising_one_task_never_changes_another(
    ledger: Ledger, clock: FakeClock, workdir: Path
) -> None:
    ledger.init("quiet", "p", nudge_after_sec=60)
    ledger.init("other", "p", nudge_after_sec=60)
    ledger.checkpoint("quiet", "STARTED")
    ledger.checkpoint("other", "STARTED")
    clock.advance(120)
    before = ledger.read().tasks["other"].model_dump_json()
    port = LedgerNotificationPort(CardPaths(workdir))
    decisions = supervise(ledger, port, apply=True, task_id="quiet")
    assert [(d.task_id, d.action) for d in decisions] == [("quiet", "NUDGE_MAIN_AGENT")]
    assert ledger.read().tasks["other"].model_dump_json() == before
    assert ledger.task("quiet").supervision.nudges_sent == 1


def test_wakes_are_typed_and_idempotent(ledger: Ledger, clock: FakeClock, workdir: Path) -> None:
    ledger.init("t", "p", nudge_after_sec=60, renotify_sec=600)
    ledger.checkpoint("t", "STARTED")
    clock.advance(61)
    port = LedgerNotificationPort(CardPaths(workdir))
    for _ in range(3):
        supervise(ledger, port, apply=True)
    lines = notifications(workdir)
    assert len(lines) == 1
    assert lines[0]["source"] == "ledger.nudge"
    assert lines[0]["extra"] == {
        "state": "NUDGE_MAIN_AGENT",
        "task_id": "t",
        "reason": "no_progress",
    }


def test_a_pending_external_job_does_not_suppress_staleness_forever(
    ledger: Ledger, clock: FakeClock, workdir: Path
) -> None:
    ledger.init("t", "p", nudge_after_sec=60)
    ledger.external_job("t", job_id="j", status="running", evidence="prov-1", max_wait_sec=300)
    port = LedgerNotificationPort(CardPaths(workdir))
    clock.advance(200)
    assert supervise(ledger, port, apply=True)[0].action == "OK"
    clock.advance(101)
    assert supervise(ledger, port, apply=True)[0].reason == "external_overdue"
    assert notifications(workdir)[-1]["source"] == "ledger.reconcile"


def test_repeating_the_same_job_status_is_not_progress(ledger: Ledger, clock: FakeClock) -> None:
    ledger.init("t", "p")
    first = ledger.external_job("t", job_id="j", status="running", evidence="e")
    clock.advance(30)
    same = ledger.external_job("t", job_id="j", status="running", evidence="e")
    assert same.observed.last_delta_at == first.observed.last_delta_at
    clock.advance(30)
    changed = ledger.external_job("t", job_id="j", status="succeeded")
    assert changed.observed.last_delta_at == clock.now


def test_retry_first_then_escalate(ledger: Ledger, clock: FakeClock, workdir: Path) -> None:
    ledger.init("t", "p", ["dl"], renotify_sec=60)
    ledger.block("t", kind="DOWNLOAD_TIMEOUT", reason="mirror slow", step="dl")
    port = LedgerNotificationPort(CardPaths(workdir))
    assert supervise(ledger, port, apply=True)[0].reason == "retry"
    clock.advance(30)
    assert supervise(ledger, port, apply=True)[0].reason == "retry"
    clock.advance(31)
    assert supervise(ledger, port, apply=True)[0].action == "BLOCKED_ESCALATE"
    sources = [line["source"] for line in notifications(workdir)]
    assert sources == ["ledger.reconcile", "ledger.blocked"]
    blocked = notifications(workdir)[-1]["extra"]
    assert blocked == {"state": "blocked", "task_id": "t", "kind": "DOWNLOAD_TIMEOUT", "step": "dl"}


def test_completion_notifies_once_and_retires_the_card_after_the_last_open_task(
    ledger: Ledger, workdir: Path
) -> None:
    ledger.init("a", "p")
    ledger.init("b", "p")
    retired: list[str] = []
    port = LedgerNotificationPort(CardPaths(workdir))
    ledger.checkpoint("a", "TASK_COMPLETED", note="done")
    supervise(ledger, port, apply=True, retire_card=lambda: retired.append("card"))
    assert retired == [], "task b is still open"
    ledger.checkpoint("b", "TASK_COMPLETED", note="done")
    supervise(ledger, port, apply=True, retire_card=lambda: retired.append("card"))
    supervise(ledger, port, apply=True, retire_card=lambda: retired.append("card"))
    assert retired == ["card"]
    completed = [n for n in notifications(workdir) if n["source"] == "ledger.completed"]
    assert [n["extra"]["task_id"] for n in completed] == ["a", "b"]


def test_a_corrupt_ledger_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"version": 1, "tasks": {"t": {"task": {}}}}))
    with pytest.raises(LedgerError, match=r"task t in .* is broken \(tasks\.t\.task\.task_id"):
        Ledger(path).task("t")
    path.write_text(json.dumps({"version": 2, "tasks": {}}))  # wrong outside any one task
    with pytest.raises(LedgerError, match=r"not a valid ledger \(version"):
        Ledger(path).task("t")


# Each call of the Python API with one value of the wrong type, and the field it must name.
# A text byte count or wait reached a comparison as a TypeError, a text note reached `len`,
# `True` counted as one byte or one nudge, a text `steps` became one step per character, and
# a field a STARTED checkpoint does not take was dropped without a word.
WRONG_TYPES: list[tuple[str, dict[str, object], str]] = [
    ("init", {"task_id": "n", "purpose": "p", "steps": "abc"}, "steps"),
    ("init", {"task_id": "n", "purpose": "p", "max_nudges": True}, "max_nudges"),
    ("init", {"task_id": "n", "purpose": "p", "timeout_sec": "60"}, "timeout_sec"),
    ("checkpoint", {"task_id": "t", "event_type": "HEARTBEAT", "note": 5}, "note"),
    ("checkpoint", {"task_id": "t", "event_type": "STARTED", "kind": "OTHER"}, "kind"),
    (
        "checkpoint",
        {"task_id": "t", "event_type": "STEP_PROGRESS", "step": "s1", "artifacts": ["out.bin"]},
        "artifacts",
    ),
    (
        "checkpoint",
        {"task_id": "t", "event_type": "DOWNLOAD_OBSERVED", "name": "d", "observed_bytes": 5}
        | {"note": "half of it"},
        "note",
    ),
    ("checkpoint", {"task_id": "t", "event_type": None}, "event_type"),
    ("download_observed", {"task_id": "t", "name": "d", "observed_bytes": "5"}, "observed_bytes"),
    ("download_observed", {"task_id": "t", "name": "d", "observed_bytes": True}, "observed_bytes"),
    (
        "download_observed",
        {"task_id": "t", "name": "d", "observed_bytes": 1, "complete": 1},
        "complete",
    ),
    (
        "external_job",
        {"task_id": "t", "job_id": "j", "status": "running", "max_wait_sec": "5"},
        "max_wait_sec",
    ),
    ("block", {"task_id": "t", "kind": "OTHER", "reason": ["r"]}, "reason"),
    ("owner_reply", {"task_id": "t", "reply": "A", "note": 5}, "note"),
    ("heartbeat", {"task_id": "t", "note": 5.0}, "note"),
]


@pytest.mark.parametrize(("method", "arguments", "field"), WRONG_TYPES)
def test_a_value_of_the_wrong_type_is_a_ledger_error_naming_it(
    ledger: Ledger, method: str, arguments: dict[str, object], field: str
) -> None:
    ledger.init("t", "p", ["s1"])
    before = ledger.path.read_bytes()
    with pytest.raises(LedgerError, match=f"^{field}: "):
        getattr(ledger, method)(**arguments)
    assert ledger.path.read_bytes() == before


def test_the_python_apis_errors_name_its_parameters_not_the_command_lines_options(
    ledger: Ledger,
) -> None:
    """The ledger's errors were worded for `taskcard ledger` whatever the way in: a Python
    caller read "needs --step STEP_ID", "give --bytes" and "see `taskcard ledger init
    --help`", and `max_nudges=2.5` was "must be a whole number, not a number". The same
    errors now name the API's parameters (the MCP tool's say its fields, and the command
    line's its options, from the one wording)."""
    ledger.init("t", "p", steps=["a"])
    refused: list[tuple[Callable[[], object], str]] = [
        (
            lambda: ledger.init("u", "p", timeout_sec=0),
            "timeout_sec: must be a number of seconds above 0, at most 315360000 (ten years),"
            " not 0; give one in that range, or leave it out for the default, 7200",
        ),
        (
            lambda: ledger.init("u", "p", max_nudges=2.5),
            "max_nudges: must be a whole number, not 2.5",
        ),
        (lambda: ledger.heartbeat("nope"), "; call Ledger.init first"),
        (lambda: ledger.checkpoint("t", "STEP_PROGRESS"), "STEP_PROGRESS needs step= (which"),
        (lambda: ledger.download_observed("t", name="d"), "observed_bytes: give observed_bytes="),
        (lambda: ledger.owner_reply("t", reply="B"), "needs reason= and safe_next_step="),
        (lambda: ledger.block("t", reason="r"), "give kind=, one of"),
        (
            lambda: ledger.checkpoint("t", "HEARTBEAT", artifacts=["x"]),
            "remove artifacts=, or say what was produced in note=",
        ),
    ]
    for call, words in refused:
        with pytest.raises(LedgerError) as raised:
            call()
        message = str(raised.value)
        assert words in message, message
        assert "--" not in message and "taskcard ledger" not in message, message
    cli = Ledger(ledger.path, way="cli")
    with pytest.raises(LedgerError, match=r"needs --step STEP_ID \(which step moved\)$"):
        cli.checkpoint("t", "STEP_PROGRESS")
    mcp = Ledger(ledger.path, way="mcp")
    with pytest.raises(LedgerError, match=r"^observed_bytes: give observed_bytes with the size"):
        mcp.download_observed("t", name="d")
