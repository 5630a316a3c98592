"""`taskcard ledger ...` as a user runs it: separate processes, files in a workdir."""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from taskcard.producers.task_card.client import request_host
from taskcard.producers.task_card.runtime import HostPaths
from tests.ledger.conftest import notifications


def taskcard(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "ledger", *args, "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(workdir: Path, *args: str) -> dict[str, object]:
    done = taskcard(workdir, *args)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_task_from_init_to_completion(workdir: Path) -> None:
    created = ok(workdir, "init", "build", "--purpose", "Build the index", "--steps", "fetch,index")
    assert created["truth_state"] == "NO_TRUTH"
    assert (workdir / "ledger" / "long-task-ledger.json").is_file()
    ok(workdir, "checkpoint", "build", "--event-type", "STARTED")
    ok(workdir, "checkpoint", "build", "--event-type", "STEP_COMPLETED", "--step", "fetch")
    ok(workdir, "external-job", "build", "--job-id", "j1", "--status", "running", "--evidence", "x")
    ok(workdir, "download-observed", "build", "--name", "corpus", "--bytes", "10")
    waiting = ok(workdir, "heartbeat", "build")
    assert waiting["workflow"] == "WAITING_EXTERNAL"
    assert waiting["next_gate"] == "external job j1"
    ok(workdir, "external-job", "build", "--job-id", "j1", "--status", "succeeded")
    ok(workdir, "checkpoint", "build", "--event-type", "STEP_COMPLETED", "--step", "index")
    done = ok(workdir, "owner-reply", "build", "--reply", "C", "--note", "index in out/")
    assert done["workflow"] == "COMPLETED"
    shown = json.loads(taskcard(workdir, "show", "build").stdout)
    assert [o["event_type"] for o in shown["observations"]][-2:] == [
        "TASK_COMPLETED",
        "OWNER_REPLY_RECORDED",
    ]
    supervised = taskcard(workdir, "supervise", "--apply-supervision")
    assert json.loads(supervised.stdout)["action"] == "STOP_AND_DELETE"
    assert [n["source"] for n in notifications(workdir)] == ["ledger.completed"]


def test_render_is_a_working_task_card_renderer(workdir: Path) -> None:
    ok(workdir, "init", "t", "--purpose", "Train the model", "--steps", "prep,train,eval")
    rendered = subprocess.run(
        [sys.executable, "ledger_renderer.py"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    body = rendered.stdout
    assert "**Train the model**" in body
    for row in ("started: unknown", "last movement: unknown", "next gate: unknown"):
        assert row in body
    ok(workdir, "checkpoint", "t", "--event-type", "STEP_COMPLETED", "--step", "prep")
    ok(
        workdir,
        "block",
        "t",
        "--kind",
        "MISSING_ACCESS",
        "--reason",
        "no GPU quota",
        "--step",
        "train",
    )
    body = taskcard(workdir, "render").stdout
    assert "step: 2 of 3 (`train`, blocked)" in body
    assert "blocked at `train`: MISSING_ACCESS: no GPU quota" in body
    assert "last movement: <1m ago (step completed)" in body


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["checkpoint", "t", "--event-type", "CHECKPOINT"], "--event-type"),
        (["checkpoint", "t", "--event-type", "STEP_PROGRESS"], "step:"),
        (["checkpoint", "t", "--event-type", "TASK_COMPLETED"], "note:"),
        # An option of another event type was dropped without a word (MCP refused it).
        (["checkpoint", "t", "--event-type", "STARTED", "--kind", "OTHER"], "--kind: not taken"),
        (["checkpoint", "t", "--event-type", "HEARTBEAT", "--complete"], "--complete: not taken"),
        # Only a completion keeps artifacts: on another checkpoint they were dropped unsaid.
        (
            ["checkpoint", "t", "--event-type", "STEP_PROGRESS", "--step", "a", "--artifact", "x"],
            "--artifact: only a TASK_COMPLETED",
        ),
        (["checkpoint", "t", "--event-type", "HEARTBEAT", "--artifact", "x"], "--artifact:"),
        # These three keep no note: it was dropped while the checkpoint was reported recorded.
        (
            [
                *("checkpoint", "t", "--event-type", "BLOCKED_CONFIRMED", "--note", "n"),
                *("--kind", "OTHER", "--reason", "r"),
            ],
            "note: BLOCKED_CONFIRMED checkpoints keep no note",
        ),
        (
            [
                *("checkpoint", "t", "--event-type", "EXTERNAL_OBSERVED", "--note", "n"),
                *("--job-id", "j", "--status", "running", "--evidence", "e"),
            ],
            "note: EXTERNAL_OBSERVED checkpoints",
        ),
        (
            [
                *("checkpoint", "t", "--event-type", "DOWNLOAD_OBSERVED", "--note", "n"),
                *("--name", "d", "--bytes", "5"),
            ],
            "note: DOWNLOAD_OBSERVED checkpoints",
        ),
        (
            ["checkpoint", "t", "--event-type", "STEP_PROGRESS", "--step", "a", "--reply", "A"],
            "reply:",
        ),
        # A step on a checkpoint whose record has none was checked, then dropped.
        (
            [
                *("checkpoint", "t", "--event-type", "DOWNLOAD_OBSERVED", "--step", "b"),
                *("--name", "d", "--bytes", "5"),
            ],
            "step: DOWNLOAD_OBSERVED checkpoints keep no step",
        ),
        (
            [
                "checkpoint",
                "t",
                "--event-type",
                "OWNER_REPLY_RECORDED",
                "--reply",
                "A",
                "--step",
                "b",
            ],
            "step: OWNER_REPLY_RECORDED",
        ),
        # The hint lists only what the type takes (it offered the note refused below).
        (
            [
                *("checkpoint", "t", "--event-type", "DOWNLOAD_OBSERVED", "--kind", "OTHER"),
                *("--name", "d", "--bytes", "5"),
            ],
            "(it takes --name, --bytes",
        ),
        (["owner-reply", "t", "--reply", "F"], "--reply"),
        (["owner-reply", "t", "--reply", "B"], "reason:"),
        (["block", "t", "--reason", "x"], "kind:"),
        (["external-job", "t", "--job-id", "j"], "status:"),
        (["heartbeat", "nope"], "task_id:"),
        (["init", "t", "--purpose", "again"], "task_id:"),
        (["init", "bad id", "--purpose", "p"], "task_id:"),
        # An empty item of the plan was dropped without a word (the MCP tool refuses it), and
        # an empty --steps made a task without a plan.
        (["init", "u", "--purpose", "p", "--steps", "prep,,eval"], "steps: item 2"),
        (["init", "u", "--purpose", "p", "--steps", "prep,train,"], "steps: item 3"),
        (["init", "u", "--purpose", "p", "--steps", ""], "steps: item 1"),
        (["init", "u", "--purpose", "p", "--steps", " , "], "steps: item 1"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(workdir: Path, args: list[str], field: str) -> None:
    ok(workdir, "init", "t", "--purpose", "p")
    done = taskcard(workdir, *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_step_not_in_the_plan_is_refused_unless_added_on_purpose(workdir: Path) -> None:
    """A mistyped `--step` joined the plan as a step of its own, open for good (the task
    could never show all steps done), without a word."""
    ok(workdir, "init", "t", "--purpose", "p", "--steps", "prep,train,eval", "--no-renderer")
    before = (workdir / "ledger" / "long-task-ledger.json").read_bytes()
    for args in (
        ["checkpoint", "t", "--event-type", "STEP_PROGRESS", "--step", "trian"],
        ["checkpoint", "t", "--event-type", "STEP_COMPLETED", "--step", "trian"],
        ["block", "t", "--kind", "TIMEOUT", "--reason", "slow", "--step", "trian"],
        ["checkpoint", "t", "--event-type", "HEARTBEAT", "--step", "trian"],
        [
            *("checkpoint", "t", "--event-type", "BLOCKED_CONFIRMED"),
            *("--kind", "TIMEOUT", "--reason", "slow", "--step", "trian"),
        ],
    ):
        done = taskcard(workdir, *args)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("taskcard ledger: --step: 'trian'"), lines
        for words in ("prep, train, eval", "did you mean 'train'?", "--new-step"):
            assert words in lines[0]
    assert (workdir / "ledger" / "long-task-ledger.json").read_bytes() == before
    added = "checkpoint", "t", "--event-type", "STEP_PROGRESS", "--step", "deploy", "--new-step"
    ok(workdir, *added)
    shown = ok(workdir, "show", "t")
    assert [s["step_id"] for s in shown["observed"]["steps"]] == [  # type: ignore[index]
        "prep",
        "train",
        "eval",
        "deploy",
    ]
    ok(workdir, "checkpoint", "t", "--event-type", "STEP_COMPLETED", "--step", "deploy")
    # A task created without a plan takes its steps as they come.
    ok(workdir, "init", "free", "--purpose", "p", "--no-renderer")
    ok(workdir, "checkpoint", "free", "--event-type", "STEP_PROGRESS", "--step", "a")
    ok(workdir, "checkpoint", "free", "--event-type", "STEP_PROGRESS", "--step", "b")


def test_a_broken_ledger_file_is_reported_not_a_crash(workdir: Path) -> None:
    (workdir / "ledger").mkdir()
    (workdir / "ledger" / "long-task-ledger.json").write_text("{not json")
    done = taskcard(workdir, "show")
    assert done.returncode == 2
    assert "not a valid ledger" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["init", "u", "--purpose", "p", "--nudge-after-sec", "inf"], "--nudge-after-sec:"),
        (["init", "u", "--purpose", "p", "--timeout-sec", "nan"], "--timeout-sec:"),
        (["init", "u", "--purpose", "p", "--renotify-sec", "1e300"], "--renotify-sec:"),
        (["init", "u", "--purpose", "p", "--max-nudges", "99999999999"], "--max-nudges:"),
        (["init", "u", "--purpose", " "], "purpose:"),
        (["init", "u", "--purpose", "\u200b\u200d"], "purpose:"),
        (["block", "t", "--kind", "OTHER", "--reason", "\u2060\ufeff"], "reason:"),
        (["checkpoint", "t", "--event-type", "TASK_COMPLETED", "--note", "\u200b"], "note:"),
        (["init", "u", "--purpose", b"p\xff"], "purpose:"),
        (["checkpoint", "t", "--event-type", "STEP_PROGRESS", "--step", "a", "--note", b"n\xff"],
         "note:"),
        (["external-job", "t", "--job-id", "j", "--status", "running", "--max-wait-sec", "nan"],
         "--max-wait-sec:"),
        (["external-job", "t", "--job-id", "j", "--status", "running", "--max-wait-sec", "inf"],
         "--max-wait-sec:"),
        (["checkpoint", "t", "--event-type", "EXTERNAL_OBSERVED", "--job-id", "j", "--status",
          "running", "--max-wait-sec", "1e300"], "--max-wait-sec:"),
        (["heartbeat", "t", "--note", b"\xc3("], "note:"),
        (["block", "t", "--kind", "OTHER", "--reason", b"r\xfe"], "reason:"),
        (["show", "t", "--ledger", "/"], "ledger:"),
    ],
)  # fmt: skip
def test_hostile_values_exit_2_and_every_task_stays_readable(
    workdir: Path, args: list[str | bytes], field: str
) -> None:
    """Infinite, NaN, absurd, blank or undecodable values are refused before anything is
    written: an infinity would be saved as null and make the whole ledger unreadable."""
    ok(workdir, "init", "t", "--purpose", "p", "--steps", "a", "--no-renderer")
    before = (workdir / "ledger" / "long-task-ledger.json").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "ledger", *args, "--workdir", str(workdir)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    stderr = done.stderr.decode("utf-8", errors="replace")
    assert done.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("taskcard ledger"), stderr
    assert field in lines[0], stderr
    assert (workdir / "ledger" / "long-task-ledger.json").read_bytes() == before
    assert ok(workdir, "show", "t")["task"] is not None


def test_without_a_task_id_show_takes_the_newest_open_task_and_supervise_every_task(
    workdir: Path,
) -> None:
    """The help said "the ledger's only open task" for all three; with two open tasks `show`
    and `render` took the newest and `supervise` decided for both, as now written there."""
    ok(workdir, "init", "older", "--purpose", "first job", "--no-renderer")
    ok(workdir, "init", "newer", "--purpose", "second job", "--no-renderer")
    assert ok(workdir, "show")["task"] == ok(workdir, "show", "newer")["task"]
    rendered = taskcard(workdir, "render")
    assert rendered.returncode == 0 and "second job" in rendered.stdout
    supervised = taskcard(workdir, "supervise")
    ids = [json.loads(line)["task_id"] for line in supervised.stdout.splitlines()]
    assert sorted(ids) == ["newer", "older"]
    for command, default in (("show", "the newest task not completed"), ("supervise", "every")):
        shown = subprocess.run(
            [sys.executable, "-m", "taskcard.bridge.cli", "ledger", command, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert f"(default: {default}" in " ".join(shown.stdout.split())


def test_init_help_shows_the_numbers_an_unset_limit_stands_for(workdir: Path) -> None:
    """It said "(default: policy)", or nothing for the counts; the numbers are the ones a task
    made without the options records."""
    shown = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "ledger", "init", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = " ".join(shown.stdout.split())
    ok(workdir, "init", "t", "--purpose", "defaults", "--no-renderer")
    limits = ok(workdir, "show", "t")["task"]
    assert isinstance(limits, dict)
    for name, value in limits["limits"].items():
        option = "--" + name.replace("_", "-")
        after = text.split(f"{option} {name.upper()} ", 1)[1]
        assert after.split(")", 1)[0].endswith(f"(default: {value:g}"), (option, after[:120])


def test_a_hand_written_ledger_with_times_without_an_offset_is_read_as_utc(
    workdir: Path,
) -> None:
    """Other tooling writing the ledger wrote `2026-05-01T12:00:00` (no `Z`, no offset), as
    the other contract files allow. `supervise`, `render` (the card's renderer) and every
    checkpoint on the task died with a traceback: naive and aware times cannot be compared.
    A time without an offset is UTC; one whose offset leaves the calendar is refused."""
    (workdir / "ledger").mkdir()
    path = workdir / "ledger" / "long-task-ledger.json"
    task = {
        "task": {"task_id": "dl", "purpose": "fetch", "created_at": "2026-05-01T12:00:00"},
        "observed": {
            "started_at": "2026-05-01T12:00:01",
            "last_delta_at": "2026-05-01T12:01:00",
            "steps": [{"step_id": "get", "progress_at": "2026-05-01T12:01:00"}, {"step_id": "b"}],
        },
    }
    path.write_text(json.dumps({"version": 1, "tasks": {"dl": task}}))
    assert ok(workdir, "supervise")["action"] == "STALE_PROGRESS"
    rendered = taskcard(workdir, "render")
    assert rendered.returncode == 0, rendered.stderr
    assert "step: 1 of 2" in rendered.stdout
    assert (
        ok(workdir, "checkpoint", "dl", "--event-type", "STEP_COMPLETED", "--step", "get")[
            "current_step"
        ]
        == "b"
    )
    assert ok(workdir, "show", "dl")["task"]["created_at"] == "2026-05-01T12:00:00Z"  # type: ignore[index]
    task["task"]["created_at"] = "0001-01-01T00:00:00+01:00"  # type: ignore[index]
    path.write_text(json.dumps({"version": 1, "tasks": {"dl": task}}))
    done = taskcard(workdir, "show")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "tasks.dl.task.created_at" in done.stderr


def test_a_ledger_saved_with_a_byte_order_mark_is_read_and_written(workdir: Path) -> None:
    """An editor saved a hand edit with a UTF-8 byte-order mark. The service read the file
    (JSON readers take the mark) while every ledger command refused the whole of it as
    "expected value at line 1 column 1", naming neither the mark nor a fix."""
    ok(workdir, "init", "build", "--purpose", "Build the index", "--steps", "fetch,index")
    path = workdir / "ledger" / "long-task-ledger.json"
    path.write_bytes(codecs.BOM_UTF8 + path.read_bytes().replace(b"\n", b"\r\n"))
    assert ok(workdir, "show", "build")["task"]["purpose"] == "Build the index"  # type: ignore[index]
    moved = ok(workdir, "checkpoint", "build", "--event-type", "STEP_COMPLETED", "--step", "fetch")
    assert moved["current_step"] == "index"
    assert json.loads(path.read_bytes())["tasks"]["build"]["observed"]["steps"][0]["completed_at"]


def test_a_movement_dated_ahead_of_the_clock_is_contradictory_not_progress(
    workdir: Path,
) -> None:
    """A ledger shared by machines whose clocks differ, or edited by hand, dated the last
    movement in 2099: the monitor answered OK (progressing) until then, and new checkpoints
    could not replace the stamp (it only moved forward), so a task that stopped was never
    nudged. It is now contradictory truth, and the next recorded movement replaces it."""
    ok(workdir, "init", "t", "--purpose", "p", "--steps", "a", "--no-renderer")
    ok(workdir, "checkpoint", "t", "--event-type", "STEP_PROGRESS", "--step", "a")
    path = workdir / "ledger" / "long-task-ledger.json"
    document = json.loads(path.read_text())
    document["tasks"]["t"]["observed"]["last_delta_at"] = "2099-01-01T00:00:00Z"
    path.write_text(json.dumps(document))
    decision = ok(workdir, "supervise", "--apply-supervision")
    assert (decision["action"], decision["reason"]) == ("TRUTH_INCONSISTENT", "movement_in_future")
    [wake] = [n for n in notifications(workdir) if n["source"] == "ledger.inconsistent"]
    assert "2099-01-01" in wake["body"] and "ahead of this machine's clock" in wake["body"]
    ok(workdir, "heartbeat", "t")
    assert ok(workdir, "supervise")["action"] == "OK"
    assert not ok(workdir, "show", "t")["observed"]["last_delta_at"].startswith("2099")  # type: ignore[index]


def test_a_confirmed_block_is_observed_truth(workdir: Path) -> None:
    """A block recorded before any progress: the card listed the block and yet said
    `state: unknown · truth: no truth` and `next gate: unknown` (the chat's row
    `BLOCKED · next: unknown`), as if nothing had been observed."""
    ok(workdir, "init", "t", "--purpose", "p", "--steps", "a,b", "--no-renderer")
    shown = ok(
        workdir, "block", "t", "--kind", "MISSING_ACCESS", "--reason", "no key", "--step", "a"
    )
    assert (shown["truth_state"], shown["next_gate"]) == (
        "OBSERVED",
        "decision on block MISSING_ACCESS",
    )
    rendered = taskcard(workdir, "render")
    assert rendered.returncode == 0, rendered.stderr
    assert "state: BLOCKED · truth: observed" in rendered.stdout
    assert ok(workdir, "supervise")["action"] == "BLOCKED_ESCALATE"


def test_a_failed_step_retried_and_completed_lets_the_task_complete(workdir: Path) -> None:
    """A step marked failed stayed FAILED for good: resumed, retried and completed, it still
    read FAILED with the gate "complete step a", the next step was out of order, and the
    completion was INCONSISTENT, so the monitor never stopped the card. Progress after the
    failure is the retry; a completion after it makes the step DONE."""
    ok(workdir, "init", "t", "--purpose", "p", "--steps", "a,b", "--no-renderer")
    ok(workdir, "checkpoint", "t", "--event-type", "STARTED")
    failed = ok(
        workdir,
        *("block", "t", "--kind", "EXECUTION_ERROR", "--reason", "crash", "--step", "a"),
        "--failed",
    )
    assert failed["workflow"] == "FAILED"
    assert ok(workdir, "supervise")["action"] == "BLOCKED_ESCALATE"
    # Resumed and nothing moved yet: the failure still stands.
    assert ok(workdir, "checkpoint", "t", "--event-type", "OWNER_RESUMED")["workflow"] == "FAILED"
    retried = ok(workdir, "checkpoint", "t", "--event-type", "STEP_PROGRESS", "--step", "a")
    assert (retried["workflow"], retried["next_gate"]) == ("RUNNING", "complete step a")
    done_a = ok(workdir, "checkpoint", "t", "--event-type", "STEP_COMPLETED", "--step", "a")
    assert (done_a["workflow"], done_a["next_gate"]) == ("RUNNING", "complete step b")
    ok(workdir, "checkpoint", "t", "--event-type", "STEP_COMPLETED", "--step", "b")
    done = ok(workdir, "checkpoint", "t", "--event-type", "TASK_COMPLETED", "--note", "out/")
    assert (done["workflow"], done["inconsistencies"]) == ("COMPLETED", [])
    shown = ok(workdir, "show", "t")
    assert shown["derived"]["step_states"] == {"a": "DONE", "b": "DONE"}  # type: ignore[index]
    supervised = ok(workdir, "supervise", "t", "--apply-supervision")
    assert supervised["action"] == "STOP_AND_DELETE"
    assert [n["source"] for n in notifications(workdir)][-1] == "ledger.completed"
    # A failure recorded again after the retry is the step's state again.
    ok(workdir, "init", "u", "--purpose", "p", "--steps", "a", "--no-renderer")
    ok(workdir, "checkpoint", "u", "--event-type", "STEP_PROGRESS", "--step", "a")
    again = ok(
        workdir,
        *("block", "u", "--kind", "OTHER", "--reason", "broke", "--step", "a", "--failed"),
    )
    assert again["workflow"] == "FAILED"


def test_a_completion_recorded_twice_is_told_once(workdir: Path) -> None:
    """The same TASK_COMPLETED twice (a retried call) put a second "Task t completed" notice
    in the chat; a completion that another decision separates from the first is told again."""
    ok(workdir, "init", "t", "--purpose", "p", "--no-renderer")
    ok(workdir, "checkpoint", "t", "--event-type", "TASK_COMPLETED", "--note", "out/")
    assert ok(workdir, "supervise", "--apply-supervision")["action"] == "STOP_AND_DELETE"
    ok(workdir, "checkpoint", "t", "--event-type", "TASK_COMPLETED", "--note", "out/ again")
    assert ok(workdir, "supervise", "--apply-supervision")["action"] == "STOP_AND_DELETE"
    assert [n["source"] for n in notifications(workdir)] == ["ledger.completed"]
    # Progress after the completion: inconsistent, and told; then completed again, told.
    ok(workdir, "checkpoint", "t", "--event-type", "STEP_PROGRESS", "--step", "more")
    assert ok(workdir, "supervise", "--apply-supervision")["action"] == "TRUTH_INCONSISTENT"
    ok(workdir, "checkpoint", "t", "--event-type", "STEP_COMPLETED", "--step", "more")
    ok(workdir, "checkpoint", "t", "--event-type", "TASK_COMPLETED", "--note", "redone")
    assert ok(workdir, "supervise", "--apply-supervision")["action"] == "STOP_AND_DELETE"
    assert [n["source"] for n in notifications(workdir)] == [
        "ledger.completed",
        "ledger.inconsistent",
        "ledger.completed",
    ]


def test_show_prints_an_agents_steering_characters_as_escapes(workdir: Path) -> None:
    """`ledger show` printed the record as plain JSON, which leaves a right-to-left override
    or a C1 control in the agent's purpose raw on the terminal (every other command printed
    them as escapes). The JSON value is the same."""
    purpose = "Sync \u202eevil\u009b2J done"
    ok(workdir, "init", "sync", "--purpose", purpose)
    done = taskcard(workdir, "show", "sync")
    assert done.returncode == 0, done.stderr
    assert "\u202e" not in done.stdout and "\u009b" not in done.stdout
    assert json.loads(done.stdout)["task"]["purpose"] == purpose


def test_supervise_finds_the_host_in_a_runtime_dir_written_with_a_tilde(
    workdir: Path, tmp_path: Path
) -> None:
    """`--runtime-dir=~/rt` (no shell expands a `~` after `=`, nor an MCP or cron config):
    the card commands expand it, `ledger supervise` did not, so at completion it looked for
    the card's host under a folder literally named `~` and the card kept refreshing."""
    home = Path(tempfile.mkdtemp(prefix="tclh"))  # short: socket paths are limited
    env = {**os.environ, "HOME": str(home)}
    (home / "rt").mkdir(mode=0o700)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "taskcard.bridge.cli", *args, "--workdir", str(workdir)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    # Not the default ledger path: the host's own monitor leaves it to `supervise`.
    ledger = ("--ledger", "work/ledger.json")
    try:
        for args in [
            ("ledger", "init", "t", "--purpose", "p", *ledger),
            ("card", "start", "ledger_renderer.py", "--runtime-dir=~/rt", "--interval-s", "60"),
            (
                "ledger",
                "checkpoint",
                "t",
                "--event-type",
                "TASK_COMPLETED",
                "--note",
                "out/",
                *ledger,
            ),
        ]:
            done = run(*args)
            assert done.returncode == 0, done.stderr
        assert (workdir / "taskcard" / "status").read_text() == "active"
        done = run("ledger", "supervise", "--apply-supervision", "--runtime-dir=~/rt", *ledger)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["action"] == "STOP_AND_DELETE"
        assert (workdir / "taskcard" / "status").read_text() == "inactive"
        assert not (tmp_path / "~").exists()
        (completed,) = [n for n in notifications(workdir) if n["source"] == "ledger.completed"]
        assert completed["extra"]["card_retired"] is True
    finally:
        with contextlib.suppress(OSError, ValueError):
            request_host(HostPaths(home / "rt", workdir.resolve()), {"op": "shutdown"}, 5.0)
        shutil.rmtree(home, ignore_errors=True)


def test_one_broken_task_is_named_and_kept_while_the_other_tasks_work(workdir: Path) -> None:
    """A hand edit broke one task of a shared ledger file (a limit set to null): every
    command on the file used to exit 2. Now the other tasks are read, written and supervised,
    the broken one is named with its field and the fix, and its text is never rewritten."""
    ok(workdir, "init", "good", "--purpose", "p", "--steps", "a", "--no-renderer")
    ok(workdir, "init", "bad", "--purpose", "q", "--steps", "a", "--no-renderer")
    path = workdir / "ledger" / "long-task-ledger.json"
    document = json.loads(path.read_text())
    document["tasks"]["bad"]["task"]["limits"]["timeout_sec"] = None
    broken_text = json.dumps(document["tasks"]["bad"], indent=4)  # as a person wrote it
    document["tasks"]["bad"] = "BROKEN"
    path.write_text(json.dumps(document, indent=2).replace('"BROKEN"', broken_text))

    def named(stderr: str) -> None:
        assert "task bad in" in stderr and "tasks.bad.task.limits.timeout_sec" in stderr, stderr
        assert "fix that field" in stderr and "Traceback" not in stderr

    moved = ok(workdir, "checkpoint", "good", "--event-type", "STEP_PROGRESS", "--step", "a")
    assert moved["workflow"] == "RUNNING"
    assert ok(workdir, "show", "good")["task"] is not None
    assert ok(workdir, "show")["task"] is not None  # the newest sound task
    assert taskcard(workdir, "render", "good").returncode == 0
    for args in (
        ("show", "bad"),
        ("heartbeat", "bad"),
        ("init", "bad", "--purpose", "again", "--no-renderer"),
    ):
        done = taskcard(workdir, *args)
        assert done.returncode == 2, (args, done.stdout)
        if args[0] != "init":
            named(done.stderr)
    supervised = taskcard(workdir, "supervise", "--apply-supervision")
    assert supervised.returncode == 2
    named(supervised.stderr)
    assert [json.loads(line)["task_id"] for line in supervised.stdout.splitlines()] == ["good"]
    assert broken_text in path.read_text()
    assert json.loads(path.read_text())["tasks"]["good"]["derived"]["workflow"] == "RUNNING"
    # The broken task may still be running: finishing the other one does not retire the card.
    ok(workdir, "checkpoint", "good", "--event-type", "STEP_COMPLETED", "--step", "a")
    ok(workdir, "checkpoint", "good", "--event-type", "TASK_COMPLETED", "--note", "out/x")
    assert taskcard(workdir, "supervise", "--apply-supervision").returncode == 2
    (completed,) = [n for n in notifications(workdir) if n["source"] == "ledger.completed"]
    assert completed["extra"]["card_retired"] is False
    assert broken_text in path.read_text()
    # Fixed by hand, the task is read again as it was.
    path.write_text(path.read_text().replace('"timeout_sec": null', '"timeout_sec": 7200'))
    assert ok(workdir, "show", "bad")["task"]["purpose"] == "q"


def test_a_ledger_over_its_size_cap_is_refused_with_the_way_out(workdir: Path) -> None:
    path = workdir / "ledger" / "long-task-ledger.json"
    path.parent.mkdir()
    with path.open("w") as handle:
        handle.write('{"version": 1, "tasks": {}, "pad": "')
        handle.write("x" * 16_000_000)
        handle.write('"}')
    done = taskcard(workdir, "show")
    assert done.returncode == 2 and "larger than 16000000 bytes" in done.stderr
    assert "move it aside" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("link", ["folder", "file"])
def test_a_ledger_linked_out_of_the_workdir_is_neither_read_nor_written(
    workdir: Path, tmp_path: Path, link: str
) -> None:
    """`ledger/` (or the ledger file) as a symlink to another place was followed: `init`
    wrote the ledger and its lock there and `show` read a file from outside the workdir."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    planted = outside / "long-task-ledger.json"
    if link == "folder":
        (workdir / "ledger").symlink_to(outside, target_is_directory=True)
    else:
        (workdir / "ledger").mkdir()
        (workdir / "ledger" / "long-task-ledger.json").symlink_to(planted)
    for args in (["init", "t", "--purpose", "p", "--no-renderer"], ["show"], ["supervise"]):
        done = taskcard(workdir, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        [line] = done.stderr.splitlines()
        assert "leads out of the workdir" in line and "remove the link" in line, line
        assert "Traceback" not in done.stderr
    assert list(outside.iterdir()) == []
    # A ledger given elsewhere on purpose is the caller's choice, and still works.
    ok(workdir, "init", "t", "--purpose", "p", "--no-renderer", "--ledger", str(planted))
    assert planted.is_file()


def test_a_pending_job_with_blank_evidence_is_not_taken_as_evidenced(workdir: Path) -> None:
    """`--evidence " "` (or a zero-width space) was stored as the provider's evidence: the
    job read WAITING_EXTERNAL, the monitor answered OK, and a claim of external work with
    nothing behind it held nudges back. It is refused naming the field, and a blank one
    written by other tooling reads as no evidence."""
    ok(workdir, "init", "fit", "--purpose", "Fit", "--steps", "train")
    for field, value in (("--evidence", " "), ("--evidence", "\u200b"), ("--provider", "\t")):
        done = taskcard(
            workdir, "external-job", "fit", "--job-id", "j1", "--status", "running", field, value
        )
        assert done.returncode == 2, done.stdout
        assert done.stderr.startswith(f"taskcard ledger: {field}: shows no text"), done.stderr
    assert json.loads(taskcard(workdir, "show", "fit").stdout)["observed"]["external_jobs"] == []
    job = ("external-job", "fit", "--job-id", "j1", "--status", "running")
    evidenced = ok(workdir, *job, "--evidence", "4711")
    assert evidenced["workflow"] == "WAITING_EXTERNAL"
    path = workdir / "ledger" / "long-task-ledger.json"
    document = json.loads(path.read_text())
    document["tasks"]["fit"]["observed"]["external_jobs"][0]["evidence"] = " \u200b"
    path.write_text(json.dumps(document))
    shown = json.loads(taskcard(workdir, "show", "fit").stdout)
    assert [i["code"] for i in shown["derived"]["inconsistencies"]] == [
        "external_pending_without_evidence"
    ]
    decided = json.loads(taskcard(workdir, "supervise", "fit").stdout)
    assert decided["action"] == "TRUTH_INCONSISTENT"


def test_hand_edited_counters_neither_repeat_a_seq_nor_fail_without_naming_the_field(
    workdir: Path,
) -> None:
    """A `next_seq` of -5 in the file failed every checkpoint of that task with "seq: Input
    should be greater than or equal to 1" (no field of the file, no fix); one lowered to 1
    numbered the next observation 1 again; `nudges_sent: -3` bought the task more nudges
    than `max_nudges`. Negative counters now make the task broken, naming the field, while
    the file's other tasks carry on; a lowered `next_seq` is not followed."""
    for task in ("a", "b"):
        ok(workdir, "init", task, "--purpose", "P", "--steps", "s")
        ok(workdir, "checkpoint", task, "--event-type", "STEP_PROGRESS", "--step", "s")
    path = workdir / "ledger" / "long-task-ledger.json"
    for field, where in (
        ("next_seq", ()),
        ("observations_dropped", ()),
        ("nudges_sent", ("supervision",)),
        ("retries_requested", ("supervision",)),
    ):
        document = json.loads(path.read_text())
        original = json.loads(json.dumps(document["tasks"]["a"]))
        record = document["tasks"]["a"]
        for key in where:
            record = record[key]
        record[field] = -5 if field == "next_seq" else -3
        path.write_text(json.dumps(document))
        done = taskcard(workdir, "heartbeat", "a")
        assert done.returncode == 2
        assert f"tasks.a.{'.'.join((*where, field))}:" in done.stderr, done.stderr
        assert "fix that field in the file" in done.stderr
        ok(workdir, "heartbeat", "b")
        document = json.loads(path.read_text())
        assert document["tasks"]["a"] != original  # kept as written, not repaired or lost
        document["tasks"]["a"] = original
        path.write_text(json.dumps(document))
    document = json.loads(path.read_text())
    document["tasks"]["a"]["next_seq"] = 1
    path.write_text(json.dumps(document))
    ok(workdir, "heartbeat", "a")
    seqs = [o["seq"] for o in json.loads(taskcard(workdir, "show", "a").stdout)["observations"]]
    assert seqs == [1, 2]


def test_the_card_does_not_call_a_movement_dated_ahead_of_the_clock_fresh(workdir: Path) -> None:
    """A ledger from other tooling dated a step's progress in 2099: the monitor answered
    TRUTH_INCONSISTENT (movement_in_future), while the card read "last movement: <1m ago",
    a task moving right now. The card says the date cannot be used, and why."""
    ok(workdir, "init", "fit", "--purpose", "Fit", "--steps", "train")
    ok(workdir, "external-job", "fit", "--job-id", "j1", "--status", "running", "--evidence", "x")
    path = workdir / "ledger" / "long-task-ledger.json"
    document = json.loads(path.read_text())
    observed = document["tasks"]["fit"]["observed"]
    for key in ("last_delta_at", "started_at"):
        observed[key] = "2099-01-01T00:00:00Z"
    observed["external_jobs"][0]["status_changed_at"] = "2099-01-01T00:00:00Z"
    path.write_text(json.dumps(document))
    assert json.loads(taskcard(workdir, "supervise", "fit").stdout)["reason"] == (
        "movement_in_future"
    )
    card = taskcard(workdir, "render", "fit")
    assert card.returncode == 0, card.stderr
    assert "<1m" not in card.stdout, card.stdout
    assert "started: unknown\n" in card.stdout
    assert "last movement: unknown (dated ahead of the clock)\n" in card.stdout
    assert "`j1` running for unknown" in card.stdout
    assert "⚠ the last movement is dated ahead of the clock" in card.stdout


def test_an_owner_reply_other_than_b_refuses_the_options_only_a_block_records(
    workdir: Path,
) -> None:
    """`owner-reply --reply A --reason ...` (C with `--kind`, E with `--safe-next-step`) was
    taken and the option dropped unsaid: the owner believed it recorded. Refused naming it."""
    ok(workdir, "init", "t", "--purpose", "P", "--no-renderer")
    for reply, option, value in (
        ("A", "--reason", "text"),
        ("C", "--kind", "OTHER"),
        ("E", "--safe-next-step", "text"),
    ):
        done = taskcard(workdir, "owner-reply", "t", "--reply", reply, "--note", "n", option, value)
        assert done.returncode == 2, done.stdout
        assert done.stderr.startswith(f"taskcard ledger: {option}: only reply B"), done.stderr
        assert f"takes {option};" in done.stderr
    assert json.loads(taskcard(workdir, "show", "t").stdout)["observations"] == []
    ok(workdir, "owner-reply", "t", "--reply", "B", "--reason", "r", "--safe-next-step", "s")


def test_a_named_pipe_at_the_notification_file_is_named_not_the_ledger(workdir: Path) -> None:
    """A named pipe at `.notification/system.jsonl` stopped `supervise --apply-supervision`
    with "cannot write the ledger (a named pipe, ...)": the ledger was fine, and the file to
    move aside went unnamed. The line names it; once it is moved the escalation goes out."""
    ok(workdir, "init", "t", "--purpose", "P", "--no-renderer")
    ok(workdir, "block", "t", "--kind", "MISSING_ACCESS", "--reason", "no key")
    pipe = workdir / ".notification" / "system.jsonl"
    pipe.parent.mkdir()
    os.mkfifo(pipe)
    done = taskcard(workdir, "supervise", "--apply-supervision")
    assert done.returncode == 1
    assert f"cannot write {pipe} (a named pipe" in done.stderr, done.stderr
    assert "the ledger" not in done.stderr
    pipe.unlink()
    assert taskcard(workdir, "supervise", "--apply-supervision").returncode == 0
    assert [n["source"] for n in notifications(workdir)] == ["ledger.blocked"]


def test_the_suggested_card_command_works_in_a_shell_for_a_workdir_with_spaces(
    tmp_path: Path,
) -> None:
    """`start_card` printed the workdir unquoted: pasted into a shell, a folder named
    `my agent's run` split into three words (and an open quote)."""
    workdir = tmp_path / "my agent's run"
    workdir.mkdir()
    result = ok(workdir, "init", "t", "--purpose", "p")
    command = result["start_card"]
    assert isinstance(command, str)
    assert shlex.split(command) == [
        "taskcard",
        "card",
        "start",
        "--workdir",
        str(workdir),
        "ledger_renderer.py",
    ]


@pytest.mark.parametrize(
    ("option", "field"), [("--bytes", "observed_bytes"), ("--expected-bytes", "expected_bytes")]
)
def test_a_byte_count_past_a_petabyte_is_refused_naming_the_option(
    workdir: Path, option: str, field: str
) -> None:
    """`--bytes` took any whole number: 4,000 digits were stored in the ledger and shown back
    in its summaries. A download's byte count is at most 10^15 (the contracts' bound on a
    count, a petabyte): past it the command exits 2 naming the option, and records nothing."""
    ok(workdir, "init", "t", "--purpose", "p", "--no-renderer")
    before = (workdir / "ledger" / "long-task-ledger.json").read_bytes()
    base = ("download-observed", "t", "--name", "d", "--bytes", "1")
    for value, shown in [(10**15 + 1, str(10**15 + 1)), (10**4000, "a number of 4001 digits")]:
        done = taskcard(workdir, *base, f"{option}={value}")
        assert done.returncode == 2, done.stdout
        assert done.stderr == (
            f"taskcard ledger: {option}: {shown} is over the largest byte count a download may"
            f" give (1000000000000000, a petabyte); give {option} the size in bytes\n"
        )
        done = taskcard(
            workdir, "checkpoint", "t", "--event-type", "DOWNLOAD_OBSERVED", *base[2:],
            f"{option}={value}",
        )  # fmt: skip
        assert done.returncode == 2 and f"{option}: {shown} is over" in done.stderr, done.stderr
    assert (workdir / "ledger" / "long-task-ledger.json").read_bytes() == before
    # At the bound, taken.
    ok(workdir, *base, f"{option}={10**15}")
    shown_record = ok(workdir, "show", "t")
    download = shown_record["observed"]["downloads"][0]  # type: ignore[index]
    assert download[field] == 10**15


def test_a_byte_count_past_a_petabyte_in_the_file_makes_its_task_broken(workdir: Path) -> None:
    """Only the writers were bounded: a count of 4,000 digits left in the file (a hand edit,
    another writer, an older version) was read, shown by `show` and carried on by the next
    write. Such a task is broken, like one holding a negative count: every command about it
    names the field, the file keeps it as it was, and the other tasks work as before."""
    ok(workdir, "init", "t", "--purpose", "p", "--no-renderer")
    ok(workdir, "init", "u", "--purpose", "p", "--no-renderer")
    ok(workdir, "download-observed", "t", "--name", "d", "--bytes", "10")
    path = workdir / "ledger" / "long-task-ledger.json"
    planted = path.read_text().replace('"observed_bytes": 10', f'"observed_bytes": {"9" * 4000}')
    path.write_text(planted)
    for args in (["show", "t"], ["download-observed", "t", "--name", "d", "--bytes", "30"]):
        done = taskcard(workdir, *args)
        assert done.returncode == 2, done.stdout
        assert "task t in" in done.stderr and "is broken (tasks.t.observed.downloads.0" in (
            done.stderr
        )
        assert ".observed_bytes: Input should be less than or equal to 1000000000000000)" in (
            done.stderr
        )
        assert "9" * 100 not in done.stderr + done.stdout
    assert path.read_text() == planted
    assert ok(workdir, "show", "u")["task"]["task_id"] == "u"  # type: ignore[index]


def test_a_text_the_writers_refuse_makes_its_task_broken_when_read(workdir: Path) -> None:
    """`ledger init` refuses a purpose holding a NUL, but a hand edit that left one in the
    file was read by every command, and the renderer wrote it into the card with the escape
    sequence and the right-to-left override beside it. The same rule now holds on read: the
    task is broken, named with its field; the file's other tasks work as before."""
    hostile = "\x00\u202eevil\x1b[2J"
    ok(workdir, "init", "bad", "--purpose", "p", "--no-renderer")
    ok(workdir, "init", "good", "--purpose", "fine", "--no-renderer")
    path = workdir / "ledger" / "long-task-ledger.json"
    document = json.loads(path.read_text())
    document["tasks"]["bad"]["task"]["purpose"] = hostile
    path.write_text(json.dumps(document))
    for args in (("show", "bad"), ("render", "bad"), ("heartbeat", "bad")):
        done = taskcard(workdir, *args)
        assert done.returncode == 2, (args, done.stdout)
        assert "tasks.bad.task.purpose: contains a NUL character; remove it" in done.stderr
        assert "evil" not in done.stdout + done.stderr
    supervised = taskcard(workdir, "supervise")
    assert supervised.returncode == 2
    assert [json.loads(line)["task_id"] for line in supervised.stdout.splitlines()] == ["good"]
    assert ok(workdir, "heartbeat", "good")["task_id"] == "good"
    assert json.dumps(document["tasks"]["bad"]) in path.read_text()  # kept as it was read


def test_the_ledger_card_writes_no_control_or_direction_mark(workdir: Path) -> None:
    """A purpose and a reason holding an escape sequence and a right-to-left override (which
    the writers take: they are text) reached `taskcard.md` raw from the ledger's renderer."""
    ok(workdir, "init", "t", "--purpose", "\u202eevil\x1b[2J done", "--no-renderer")
    ok(workdir, "block", "t", "--kind", "OTHER", "--reason", "stuck\x1b]0;x\x07 \u2066here")
    card = taskcard(workdir, "render", "t")
    assert card.returncode == 0, card.stderr
    assert card.stdout.startswith("**evil \\[2J done**\n"), card.stdout
    assert "stuck \\]0;x here" in card.stdout
    assert not any(c in card.stdout for c in "\x1b\x07\u202e\u2066"), card.stdout


def test_a_task_under_another_tasks_key_is_broken(workdir: Path) -> None:
    """A hand-copied entry (key `t1` holding the record of `t2`, beside the real `t2`) was
    read silently, and `supervise` printed two results named t2."""
    ok(workdir, "init", "t1", "--purpose", "one", "--no-renderer")
    ok(workdir, "init", "t2", "--purpose", "two", "--no-renderer")
    path = workdir / "ledger" / "long-task-ledger.json"
    document = json.loads(path.read_text())
    document["tasks"]["t1"]["task"]["task_id"] = "t2"
    path.write_text(json.dumps(document))
    supervised = taskcard(workdir, "supervise")
    assert supervised.returncode == 2
    assert [json.loads(line)["task_id"] for line in supervised.stdout.splitlines()] == ["t2"]
    problem = "tasks.t1.task.task_id: 't2' is not the task's key 't1'; write the same id in both"
    assert problem in supervised.stderr
    shown = taskcard(workdir, "show", "t1")
    assert shown.returncode == 2 and problem in shown.stderr
    assert ok(workdir, "show", "t2")["task"]["purpose"] == "two"  # type: ignore[index]
