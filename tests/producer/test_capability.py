"""Points 2-5 and 7-10 through the Python API, with real renderers in a real workdir."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from taskcard.producers.task_card import capability as capability_module
from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.contract import CardPaths
from taskcard.producers.task_card.meta import project_meta
from taskcard.producers.task_card.renderer import RunOutcome, RunRequest
from taskcard.producers.task_card.runtime import HostAlreadyRunning

from .conftest import (
    COUNTER_RENDERER,
    FLAG_RENDERER,
    STATIC_RENDERER,
    envelope,
    notifications,
    wait_for,
    write_renderer,
)

MakeCard = Callable[..., TaskCard]


def start(card: TaskCard, renderer: str = "r.py", **inputs: object) -> dict[str, object]:
    return card.call(envelope("start", renderer_path=renderer, **inputs))


def test_start_publishes_body_then_active_then_descriptor(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    result = start(card, interval_s=3600)
    assert result["status"] == "watching"
    assert result["watch_id"] == "tc_1"
    assert result["status_value"] == "active"
    assert result["refreshes_used"] == 0
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "# Work\nrender 1\n"
    assert (workdir / "taskcard" / "status").read_bytes() == b"active"
    descriptor = json.loads((workdir / "taskcard" / "watch.json").read_text())
    assert descriptor["watch_id"] == "tc_1"
    assert descriptor["renderer_path"] == "r.py"
    assert descriptor["interval_s"] == 3600
    assert descriptor["refreshes_used"] == 0
    assert {"timeout_s", "max_refreshes", "started_at"} <= set(descriptor)


def test_the_updater_keeps_refreshing_on_its_interval(workdir: Path, make_card: MakeCard) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    start(card, interval_s=1)
    wait_for(lambda: card.inspect("tc_1")["refreshes_used"] >= 2)
    body = (workdir / "taskcard" / "taskcard.md").read_text()
    assert body.startswith("# Work\nrender ") and body != "# Work\nrender 1\n"


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import sys\nprint('x')\nsys.exit(4)\n", "renderer_nonzero_exit"),
        ("print('   ')\n", "renderer_blank_output"),
        ("print('\\u200b\\u2060\\ufeff')\n", "renderer_blank_output"),  # shows nothing
        ("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe bad')\n", "renderer_invalid_utf8"),
        ("print('x' * 2001)\n", "body_too_large"),
        ("import time\ntime.sleep(60)\n", "renderer_timeout"),
    ],
)
def test_a_failed_first_run_creates_no_watch(
    workdir: Path, make_card: MakeCard, code: str, expected: str
) -> None:
    write_renderer(workdir, "r.py", code)
    card = make_card()
    result = start(card, timeout_s=1)
    assert result["status"] == "failed"
    assert result["code"] == expected
    assert "no watch was created" in str(result["message"])
    assert not (workdir / "taskcard" / "status").exists()
    assert not (workdir / "taskcard" / "taskcard.md").exists()
    assert not (workdir / "taskcard" / "watch.json").exists()
    write_renderer(workdir, "ok.py", STATIC_RENDERER)
    assert start(card, "ok.py")["status"] == "watching"


def test_renderer_paths_outside_the_workdir_or_not_files_are_refused(
    workdir: Path, tmp_path: Path, make_card: MakeCard
) -> None:
    outside = tmp_path / "evil.py"
    outside.write_text(STATIC_RENDERER)
    (workdir / "link.py").symlink_to(outside)
    (workdir / "dir.py").mkdir()
    card = make_card()
    for path, why in (("link.py", "outside the workdir"), ("dir.py", "not a regular file")):
        result = start(card, path)
        assert result["status"] == "failed"
        assert why in str(result["message"])
    assert not (workdir / "taskcard" / "status").exists()


def test_identical_bodies_are_not_rewritten_but_count_as_publications(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    start(card, interval_s=3600)
    body = workdir / "taskcard" / "taskcard.md"
    before = body.stat()
    result = card.call(envelope("retry", watch_id="tc_1"))
    assert result["status"] == "watching"
    assert result["refreshes_used"] == 1
    after = body.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert card.inspect("tc_1")["last_body_at"] is not None


def test_an_oversized_body_is_refused_and_the_last_valid_body_stays(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(
        workdir,
        "r.py",
        "from pathlib import Path\n"
        "print('x' * 5000 if Path('big.flag').exists() else '# small body')\n",
    )
    card = make_card()
    start(card, interval_s=3600)
    (workdir / "big.flag").touch()
    result = card.call(envelope("retry", watch_id="tc_1"))
    assert result["refresh_error"]["code"] == "body_too_large"
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "# small body\n"
    assert (workdir / "taskcard" / "status").read_bytes() == b"active"
    inspected = card.inspect("tc_1")
    assert inspected["status"] == "error"
    assert inspected["last_body"] == "# small body\n"
    assert inspected["error"]["code"] == "body_too_large"


def test_max_body_chars_is_read_at_every_publication(workdir: Path, make_card: MakeCard) -> None:
    write_renderer(workdir, "r.py", "print('y' * 150)\n")
    card = make_card()
    start(card, interval_s=3600)
    (workdir / "taskcard" / "taskcard.json").write_text('{"max_body_chars": 100}')
    result = card.call(envelope("retry", watch_id="tc_1"))
    assert result["refresh_error"]["code"] == "body_too_large"


def test_inspect_reports_state_body_time_error_and_budget(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", FLAG_RENDERER)
    card = make_card()
    start(card, interval_s=3600, max_refreshes=5)
    first_at = card.inspect("tc_1")["last_body_at"]
    (workdir / "fail.flag").touch()
    card.call(envelope("retry", watch_id="tc_1"))
    result = card.call(envelope("inspect", watch_id="tc_1"))
    assert result["status"] == "error"
    assert result["last_body"] == "# Work\nall good\n"
    assert str(result["last_body_at"]).endswith("Z")
    # A failed attempt moves neither the last valid body nor its time (both manuals' names).
    assert result["last_valid_frame_at"] == result["last_body_at"] == first_at
    assert result["error"] == {
        "code": "renderer_nonzero_exit",
        "message": "the renderer exited with code 3",
        "at": result["error"]["at"],
        "stderr_tail": "boom\n",
    }
    assert (result["refreshes_used"], result["max_refreshes"], result["refreshes_remaining"]) == (
        1,
        5,
        4,
    )
    unknown = card.call(envelope("inspect", watch_id="tc_9"))
    assert unknown["status"] == "failed" and "tc_9" in str(unknown["message"])


def test_error_then_recovery_notify_once_per_episode(workdir: Path, make_card: MakeCard) -> None:
    write_renderer(workdir, "r.py", FLAG_RENDERER)
    card = make_card()
    start(card, interval_s=3600)
    (workdir / "fail.flag").touch()
    for _ in range(3):
        card.call(envelope("retry", watch_id="tc_1"))
    (workdir / "fail.flag").unlink()
    card.call(envelope("retry", watch_id="tc_1"))
    card.call(envelope("retry", watch_id="tc_1"))
    (workdir / "fail.flag").touch()
    card.call(envelope("retry", watch_id="tc_1"))
    lines = notifications(workdir)
    assert [(n["id"], n["extra"]["state"]) for n in lines] == [
        ("task_card.error:tc_1:1:renderer_nonzero_exit", "error"),
        ("task_card.recovered:tc_1:1", "recovered"),
        ("task_card.error:tc_1:2:renderer_nonzero_exit", "error"),
    ]
    first = lines[0]
    assert first["source"] == "task_card.error"
    assert first["channel"] == "system"
    assert first["ref_id"] == "tc_1"
    assert first["extra"] == {"state": "error", "watch_id": "tc_1", "code": "renderer_nonzero_exit"}
    assert lines[1]["source"] == "task_card.error"


def test_budget_exhaustion_retires_the_watch_with_one_limit_notification(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    assert start(card, interval_s=3600, max_refreshes=2)["refreshes_remaining"] == 2
    assert card.call(envelope("retry", watch_id="tc_1"))["refreshes_remaining"] == 1
    last = card.call(envelope("retry", watch_id="tc_1"))
    assert last["status"] == "exhausted"
    assert last["stop_reason"] == "max_refreshes"
    assert last["status_value"] == "inactive"
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "# Work\nrender 3\n"
    assert not (workdir / "taskcard" / "watch.json").exists()
    final = card.call(envelope("retry", watch_id="tc_1"))  # the one final retry
    assert (final["status"], final["refreshes_used"]) == ("exhausted", 2)
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "# Work\nrender 4\n"
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
    again = card.call(envelope("retry", watch_id="tc_1"))
    assert again["status"] == "failed" and "start a new watch" in str(again["message"])
    limits = [n for n in notifications(workdir) if n["source"] == "task_card.limit"]
    assert len(limits) == 1
    assert limits[0]["id"] == "task_card.limit:tc_1:2"
    assert limits[0]["extra"] == {"state": "limit", "watch_id": "tc_1", "max_refreshes": 2}
    assert start(card, interval_s=3600)["watch_id"] == "tc_2"


def test_the_limit_notice_is_written_before_the_watch_is_cleared(
    workdir: Path, make_card: MakeCard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host killed between clearing `watch.json` and writing the limit notice lost the
    notice for good (nothing resumes a cleared watch). The notice comes first now; its key
    makes a repeat after a resume harmless."""
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    start(card, interval_s=3600, max_refreshes=1)
    limits_when_cleared: list[int] = []
    clear_descriptor = capability_module.clear_descriptor

    def clear(paths: CardPaths) -> None:
        limits_when_cleared.append(
            sum(n["source"] == "task_card.limit" for n in notifications(workdir))
        )
        clear_descriptor(paths)

    monkeypatch.setattr(capability_module, "clear_descriptor", clear)
    assert card.call(envelope("retry", watch_id="tc_1"))["status"] == "exhausted"
    assert limits_when_cleared == [1]


def test_failed_refreshes_count_against_the_budget(workdir: Path, make_card: MakeCard) -> None:
    write_renderer(workdir, "r.py", FLAG_RENDERER)
    card = make_card()
    start(card, interval_s=3600, max_refreshes=1)
    (workdir / "fail.flag").touch()
    assert card.call(envelope("retry", watch_id="tc_1"))["status"] == "exhausted"


def test_configured_ceilings_cap_silently_and_interval_is_not_capped(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_text('{"timeout_s": 4, "max_refreshes": 50}')
    card = make_card()
    result = start(card, interval_s=86400, timeout_s=300, max_refreshes=10**6)
    assert result["status"] == "watching"
    assert result["max_refreshes"] == 50
    inspected = card.inspect("tc_1")
    assert (inspected["interval_s"], inspected["timeout_s"]) == (86400, 4)
    card.stop("tc_1")
    lower = start(card, timeout_s=0.5, max_refreshes=3)
    assert lower["max_refreshes"] == 3
    assert card.inspect("tc_2")["timeout_s"] == 0.5
    assert card.inspect("tc_2")["interval_s"] == 5  # the default when not given


def test_one_active_watch_per_agent_and_ids_are_never_reused(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    start(card, interval_s=3600)
    refused = start(card)
    assert refused["status"] == "failed" and "already active" in str(refused["message"])
    assert card.call(envelope("stop", watch_id="tc_1"))["status"] == "stopped"
    assert start(card, interval_s=3600)["watch_id"] == "tc_2"
    card.call(envelope("remove"))
    card.close()
    reopened = make_card()
    assert start(reopened, interval_s=3600)["watch_id"] == "tc_3"


def test_a_host_forgets_old_finished_watches_but_never_reuses_their_ids(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    for _ in range(12):  # an agent that starts and removes cards all day
        assert start(card, interval_s=3600)["status"] == "watching"
        assert card.call(envelope("remove"))["status"] == "removed"
    forgotten = card.inspect("tc_1")
    assert forgotten["status"] == "failed"
    known = str(forgotten["message"]).split("(known: ")[1].split(")")[0].split(", ")
    assert known == [f"tc_{n}" for n in range(4, 13)]  # the latest eight finished, and the last
    assert card.inspect("tc_12")["status"] == "stopped"
    assert start(card, interval_s=3600)["watch_id"] == "tc_13"


def test_a_watch_whose_workdir_is_deleted_stops_instead_of_failing_every_tick(
    workdir: Path, make_card: MakeCard
) -> None:
    """Each tick used to fail (renderer gone, nothing writable) until the budget ran out,
    a million refreshes by default, and the host never went idle."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    assert start(card, interval_s=1)["status"] == "watching"
    # Moved away at once (a renderer writing into it would race a recursive delete).
    os.rename(workdir, workdir.with_name("moved away"))
    wait_for(lambda: card.inspect("tc_1")["status"] == "stopped")
    inspected = card.inspect("tc_1")
    assert inspected["stop_reason"] == "workdir_gone"
    assert not card.has_live_watch()
    used = inspected["refreshes_used"]
    time.sleep(1.5)  # a tick's time: none runs any more, and none made the folder again
    assert card.inspect("tc_1")["refreshes_used"] == used
    assert not workdir.exists()


def test_two_concurrent_starts_exactly_one_wins(workdir: Path, make_card: MakeCard) -> None:
    write_renderer(workdir, "r.py", "import time\ntime.sleep(0.5)\nprint('# slow start')\n")
    card = make_card()
    results: list[dict[str, object]] = []
    barrier = threading.Barrier(2)

    def go() -> None:
        barrier.wait()
        results.append(start(card, interval_s=3600))

    threads = [threading.Thread(target=go) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(str(r["status"]) for r in results) == ["failed", "watching"]


def test_stop_writes_inactive_keeps_the_body_and_clears_the_descriptor(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    start(card, interval_s=1)
    result = card.call(envelope("stop", watch_id="tc_1"))
    assert result["status"] == "stopped"
    assert result["stop_reason"] == "stopped"
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
    assert (workdir / "taskcard" / "taskcard.md").exists()
    assert not (workdir / "taskcard" / "watch.json").exists()
    count = (workdir / "count.txt").read_text()
    assert card.call(envelope("stop", watch_id="tc_1"))["status"] == "stopped"
    # A retry on a stopped watch refreshes the body without reviving it; like every retry,
    # it spends one refresh of the budget.
    retried = card.call(envelope("retry", watch_id="tc_1"))
    assert (retried["status"], retried["status_value"], retried["refreshes_used"]) == (
        "stopped",
        "inactive",
        1,
    )
    assert (workdir / "count.txt").read_text() == str(int(count) + 1)


class StuckRunner:
    """A renderer runner that ignores cancellation until released: an updater that won't quiesce."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls = 0

    def __call__(self, request: RunRequest, cancel: threading.Event) -> RunOutcome:
        self.calls += 1
        if self.calls > 1:
            self.entered.set()
            self.release.wait(60)
        return RunOutcome(0, False, False, b"# body\n", False, b"", None, 0.0)


def test_stop_failed_is_retryable_and_remove_is_blocked_meanwhile(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    runner = StuckRunner()
    card = make_card(runner=runner, quiesce_timeout_s=0.3)
    start(card, interval_s=1)
    assert runner.entered.wait(30)
    stopped = card.call(envelope("stop", watch_id="tc_1"))
    assert stopped["status"] == "stop_failed"
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
    assert card.inspect("tc_1")["status"] == "stop_failed"
    blocked = card.call(envelope("remove"))
    assert blocked["status"] == "remove_blocked"
    assert blocked["body_removed"] is False
    assert (workdir / "taskcard" / "taskcard.md").exists()
    runner.release.set()
    assert card.call(envelope("stop", watch_id="tc_1"))["status"] == "stopped"
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "# body\n"
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"


def test_remove_is_idempotent_and_needs_no_watch(workdir: Path, make_card: MakeCard) -> None:
    card = make_card()
    first = card.call(envelope("remove"))
    assert (first["status"], first["body_removed"]) == ("removed", False)
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    start(card, interval_s=1)
    removed = card.call(envelope("remove"))
    assert (removed["status"], removed["body_removed"]) == ("removed", True)
    assert not (workdir / "taskcard" / "taskcard.md").exists()
    assert not (workdir / "taskcard" / "watch.json").exists()
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
    assert card.call(envelope("remove"))["body_removed"] is False


def test_an_older_watch_cannot_overwrite_the_card_of_the_one_that_replaced_it(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "old.py", 'print("# old card")\n')
    write_renderer(workdir, "new.py", 'print("# new card")\n')
    card = make_card()
    start(card, "old.py", interval_s=3600)
    assert card.call(envelope("stop", watch_id="tc_1"))["status"] == "stopped"
    start(card, "new.py", interval_s=3600)
    refused = card.call(envelope("retry", watch_id="tc_1"))
    assert refused["status"] == "failed"
    assert "tc_2 replaced it; retry tc_2 instead" in str(refused["message"])
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "# new card\n"
    assert (workdir / "taskcard" / "status").read_bytes() == b"active"


def test_a_removed_card_stays_removed_even_with_a_retry_in_flight(
    workdir: Path, make_card: MakeCard
) -> None:
    # Renders slowly while slow.flag exists, and says so in started.flag.
    write_renderer(
        workdir,
        "r.py",
        "import time\nfrom pathlib import Path\n"
        "if Path('slow.flag').exists():\n"
        "    Path('started.flag').touch()\n"
        "    while Path('slow.flag').exists():\n"
        "        time.sleep(0.02)\n"
        "print('# stale card')\n",
    )
    card = make_card()
    start(card, interval_s=3600)
    assert card.call(envelope("stop", watch_id="tc_1"))["status"] == "stopped"
    (workdir / "slow.flag").touch()
    retried: list[dict[str, object]] = []
    retrying = threading.Thread(
        target=lambda: retried.append(card.call(envelope("retry", watch_id="tc_1")))
    )
    retrying.start()
    wait_for(lambda: (workdir / "started.flag").exists())
    removed = card.call(envelope("remove"))
    assert (removed["status"], removed["body_removed"]) == ("removed", True)
    (workdir / "slow.flag").unlink()
    retrying.join()
    assert not (workdir / "taskcard" / "taskcard.md").exists()  # the late render was dropped
    again = card.call(envelope("retry", watch_id="tc_1"))
    assert again["status"] == "failed" and "its card was removed" in str(again["message"])
    assert not (workdir / "taskcard" / "taskcard.md").exists()


def test_closing_the_host_mid_render_records_no_error_and_spends_no_budget(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(
        workdir,
        "r.py",
        "import time\nfrom pathlib import Path\n"
        "if Path('first.done').exists():\n    Path('started').touch()\n    time.sleep(60)\n"
        "Path('first.done').touch()\nprint('# body')\n",
    )
    card = make_card()
    start(card, interval_s=1)
    wait_for(lambda: (workdir / "started").exists())
    card.close()
    assert notifications(workdir) == []
    descriptor = json.loads((workdir / "taskcard" / "watch.json").read_text())
    assert descriptor["refreshes_used"] == 0
    assert (workdir / "taskcard" / "status").read_bytes() == b"active"


def test_a_second_in_process_host_for_the_workdir_is_refused(make_card: MakeCard) -> None:
    make_card()
    with pytest.raises(HostAlreadyRunning, match="held by a Python program's TaskCard"):
        make_card()


def test_a_host_with_another_runtime_dir_is_refused_too_and_told_where_the_host_is(
    workdir: Path, runtime_dir: Path, make_card: MakeCard, other_runtime_dir: Path
) -> None:
    """Runtime folders come from each caller's environment; the workdir is the one truth.
    The holder is this program's own TaskCard, so no runtime dir would reach it: the refusal
    names the program instead (a `taskcard host` is named with its runtime dir, in
    test_cli_host)."""
    make_card()
    with pytest.raises(HostAlreadyRunning) as refused:
        TaskCard(workdir, runtime_dir=other_runtime_dir, environ={"PATH": os.defpath})
    assert f"held by a Python program's TaskCard (pid {os.getpid()}: " in str(refused.value)


@pytest.mark.parametrize("plant", ["symlink", "fifo", "hardlink"])
def test_a_planted_workdir_lock_is_never_written_through_and_the_host_still_starts(
    workdir: Path, make_card: MakeCard, tmp_path: Path, plant: str
) -> None:
    """The workdir lock is the agent's file: a link or pipe planted at its name must not make
    the host truncate or write anything else (a hard link shares the other file's inode)."""
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep me\n")
    lock = workdir / ".taskcard-host" / "lock"
    lock.parent.mkdir()
    if plant == "symlink":
        lock.symlink_to(outside)
    elif plant == "fifo":
        os.mkfifo(lock)
    else:
        os.link(outside, lock)
    card = make_card()
    assert card.call(envelope("settings"))["status"] == "ok"
    assert outside.read_bytes() == b"keep me\n"


def test_a_restarted_host_resumes_the_same_watch_and_budget(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    start(card, interval_s=3600, max_refreshes=10)
    card.call(envelope("retry", watch_id="tc_1"))
    card.call(envelope("retry", watch_id="tc_1"))
    card.close()
    (workdir / "taskcard" / "status").write_bytes(b"inactive")  # whatever was left behind
    resumed = make_card()
    result = resumed.inspect("tc_1")
    assert (result["status"], result["status_value"]) == ("watching", "active")
    assert (result["refreshes_used"], result["refreshes_remaining"]) == (2, 8)
    assert (result["interval_s"], result["renderer_path"]) == (3600, "r.py")
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "# Work\nrender 4\n"


@pytest.mark.parametrize(
    "descriptor",
    [
        "{not json",
        '{"watch_id": "tc_1"}',
        json.dumps(
            {
                "watch_id": "tc_1",
                "renderer_path": "gone.py",
                "interval_s": 5,
                "timeout_s": 5,
                "max_refreshes": 5,
                "refreshes_used": 0,
                "started_at": "2026-01-01T00:00:00Z",
            }
        ),
        json.dumps(
            {
                "watch_id": "tc_1",
                "renderer_path": "r.py",
                "interval_s": 5,
                "timeout_s": 5,
                "max_refreshes": 5,
                "refreshes_used": 5,
                "started_at": "2026-01-01T00:00:00Z",
            }
        ),
    ],
)
def test_a_stale_or_corrupt_descriptor_is_cleared_and_leaves_the_card_inactive(
    workdir: Path, make_card: MakeCard, descriptor: str
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    folder = workdir / "taskcard"
    folder.mkdir()
    (folder / "watch.json").write_text(descriptor)
    (workdir / ".taskcard-host").mkdir()
    (workdir / ".taskcard-host" / "watch-seq").write_text("1")
    (folder / "status").write_bytes(b"active")
    (folder / "taskcard.md").write_text("old body")
    card = make_card()
    assert not (folder / "watch.json").exists()
    assert (folder / "status").read_bytes() == b"inactive"
    refused = card.call(envelope("inspect", watch_id="tc_1"))
    if '"refreshes_used": 5' in descriptor:
        # No budget left: not resumed, but known as exhausted, with its final retry
        # (test_final_retry drives it through processes).
        assert (refused["status"], refused["final_retry_available"]) == ("exhausted", True)
        assert (folder / "taskcard.md").read_text() == "old body"  # nothing rendered
    else:
        assert refused["status"] == "failed"
    if "gone.py" in descriptor:  # a whole descriptor: the agent is told why
        assert "tc_1 was not resumed when this host started: it" in refused["message"]
        assert "start a new watch" in refused["message"]
    assert start(card, interval_s=3600)["watch_id"] == "tc_2"


def test_a_stale_descriptor_id_is_not_reused_even_without_the_counter(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "watch.json").write_text(
        json.dumps(
            {
                "watch_id": "tc_7",
                "renderer_path": "gone.py",
                "interval_s": 5,
                "timeout_s": 5,
                "max_refreshes": 5,
                "refreshes_used": 0,
                "started_at": "2026-01-01T00:00:00Z",
            }
        )
    )
    assert start(make_card(), interval_s=3600)["watch_id"] == "tc_8"


def test_settings_show_five_exact_rows_with_per_field_fallback(
    workdir: Path, make_card: MakeCard
) -> None:
    (workdir / "taskcard").mkdir()
    document = workdir / "taskcard" / "taskcard.json"
    document.write_text(
        '{"interval_s": 2, "timeout_s": true, "max_refreshes": 0, '
        '"reminder_turns": 3, "max_body_chars": 99, "other": "kept"}'
    )
    before = document.read_bytes()
    card = make_card()
    result = card.call(envelope("settings"))
    assert result["status"] == "ok"
    rows = result["settings"]
    assert [row["key"] for row in rows] == [
        "interval-s",
        "timeout-s",
        "max-refreshes",
        "reminder-turns",
        "max-body-chars",
    ]
    for row in rows:
        assert set(row) == {"key", "current", "default", "configurable", "comment"}
        assert row["key"] in row["comment"]
    current = {row["key"]: row["current"] for row in rows}
    assert current == {
        "interval-s": 2,
        "timeout-s": 10,
        "max-refreshes": 2000,
        "reminder-turns": 3,
        "max-body-chars": 2000,
    }
    assert document.read_bytes() == before


def test_settings_never_create_the_document(workdir: Path, make_card: MakeCard) -> None:
    card = make_card()
    assert card.call(envelope("settings"))["status"] == "ok"
    assert not (workdir / "taskcard" / "taskcard.json").exists()


@pytest.mark.parametrize("content", [b"{broken", b"[1, 2]", b"\xff\xfe"])
def test_a_corrupt_settings_document_fails_whole_without_rows(
    workdir: Path, make_card: MakeCard, content: bytes
) -> None:
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_bytes(content)
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    result = card.call(envelope("settings"))
    assert result["status"] == "failed"
    assert "settings" not in result
    assert "taskcard.json" in str(result["message"])
    assert "Traceback" not in str(result["message"])
    refused = start(card)
    assert refused["status"] == "failed" and "taskcard.json" in str(refused["message"])


def test_legacy_max_refreshes_is_previewed_then_migrated_once_at_first_start(
    workdir: Path, make_card: MakeCard
) -> None:
    (workdir / "telegram").mkdir()
    (workdir / "telegram" / "taskcard.json").write_text('{"max_refreshes": 300}')
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    rows = {r["key"]: r for r in card.call(envelope("settings"))["settings"]}
    assert rows["max-refreshes"]["current"] == 300
    assert "legacy" in rows["max-refreshes"]["comment"]
    assert not (workdir / "taskcard" / "taskcard.json").exists()
    assert start(card, interval_s=3600)["max_refreshes"] == 300
    assert json.loads((workdir / "taskcard" / "taskcard.json").read_text()) == {
        "max_refreshes": 300
    }
    (workdir / "telegram" / "taskcard.json").write_text('{"max_refreshes": 7}')
    rows = {r["key"]: r for r in card.call(envelope("settings"))["settings"]}
    assert rows["max-refreshes"]["current"] == 300


def test_the_untouched_legacy_default_is_ignored(workdir: Path, make_card: MakeCard) -> None:
    (workdir / "telegram").mkdir()
    (workdir / "telegram" / "taskcard.json").write_text('{"max_refreshes": 1000}')
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    assert start(card, interval_s=3600)["max_refreshes"] == 2000
    assert not (workdir / "taskcard" / "taskcard.json").exists()


def test_reminders_every_n_quiet_turns_and_publication_resets_the_count(
    workdir: Path, make_card: MakeCard
) -> None:
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_text('{"reminder_turns": 3}')
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()

    def reminders() -> list[dict[str, object]]:
        return [n for n in notifications(workdir) if n["extra"]["state"] == "reminder"]

    for _ in range(2):
        card.on_completed_turn()
    assert reminders() == []
    card.on_completed_turn()
    assert len(reminders()) == 1
    assert reminders()[0]["source"] == "task_card.reminder"
    card.on_completed_turn()
    card.on_completed_turn()
    start(card, interval_s=3600)  # a publication resets the count and clears the reminder
    card.on_completed_turn()
    card.on_completed_turn()
    assert len(reminders()) == 1
    cleared = [n for n in notifications(workdir) if n["extra"]["state"] == "reminder_cleared"]
    assert len(cleared) == 1
    card.on_completed_turn()
    assert len(reminders()) == 2
    assert reminders()[1]["extra"]["watch_id"] == "tc_1"  # type: ignore[index]


def test_meta_projection_is_change_gated_and_covers_every_shape(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    absent = card.meta_update()
    assert absent is not None and absent["present"] is False and "hint" in absent
    assert card.meta_update() is None
    start(card, interval_s=3600)
    assert card.meta_update() == {
        "present": True,
        "status": "active",
        "body": "# Work\nsteady body\n",
    }
    card.call(envelope("retry", watch_id="tc_1"))
    assert card.meta_update() is None  # identical bytes are not re-injected
    (workdir / "taskcard" / "taskcard.md").write_text("z" * 2500)
    refused = card.meta_update()
    assert refused is not None and (refused["present"], refused["status"]) == (True, "refused")
    (workdir / "taskcard" / "status").write_bytes(b"act")
    unreadable = card.meta_update()
    assert unreadable is not None and unreadable["status"] == "unreadable"
    assert unreadable["present"] is True


def test_manual_returns_the_packaged_manual_covering_the_contract(make_card: MakeCard) -> None:
    result = make_card().call({"action": "manual", "input": {}, "reasoning": "learn"})
    text = str(result["manual"])
    for needle in (
        "start",
        "inspect",
        "retry",
        "stop",
        "remove",
        "### interval-s",
        "### timeout-s",
        "### max-refreshes",
        "### reminder-turns",
        "### max-body-chars",
        "renderer contract",
        "Lifecycle",
    ):
        assert needle in text


@pytest.mark.parametrize(("budget", "left"), [(4, "4 refreshes left"), (1, "1 refresh left")])
def test_summarize_adds_a_one_line_summary(
    workdir: Path, make_card: MakeCard, budget: int, left: str
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    result = card.call(
        {
            "action": "start",
            "input": {"renderer_path": "r.py", "max_refreshes": budget, "interval_s": 3600},
            "reasoning": "r",
            "summarize": True,
        }
    )
    assert result["summary"] == f"tc_1: watching, {left}"


def test_invalid_envelopes_come_back_as_failed_results(make_card: MakeCard) -> None:
    result = make_card().call('{"action": "start", "input": {}, "reasoning": "r"}')
    assert result["status"] == "failed"
    assert "input.renderer_path: required" in str(result["message"])


def test_contract_files_are_readable_by_another_user(workdir: Path, make_card: MakeCard) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    start(make_card(), interval_s=3600)
    for name in ("taskcard.md", "status"):
        assert os.stat(workdir / "taskcard" / name).st_mode & 0o044 == 0o044


@pytest.mark.parametrize(
    ("body", "shown"), [("z" * 100 + "\n", True), ("z" * 100, True), ("z" * 101 + "\n", False)]
)
def test_meta_applies_the_same_body_limit_as_publication(
    workdir: Path, body: str, shown: bool
) -> None:
    paths = CardPaths(workdir)
    paths.taskcard_dir.mkdir()
    paths.body.write_text(body)
    paths.status.write_bytes(b"active")
    payload = project_meta(paths, max_body_chars=100)
    assert payload["status"] == ("active" if shown else "refused")


def test_a_closed_card_refuses_calls_and_leaves_the_watch_to_the_next_host(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    card = make_card()
    assert start(card, interval_s=3600)["status"] == "watching"
    card.close()
    # Its updater is gone and its lock released: no call may claim or change the watch.
    for action, inputs in (
        ("inspect", {"watch_id": "tc_1"}),
        ("retry", {"watch_id": "tc_1"}),
        ("stop", {"watch_id": "tc_1"}),
        ("remove", {}),
    ):
        result = card.call(envelope(action, **inputs))
        assert (result["action"], result["status"]) == (action, "failed")
        assert "closed; open a new TaskCard" in result["message"]
    assert card.call(envelope("settings"))["status"] == "ok"
    assert (workdir / "count.txt").read_text() == "1"
    assert (workdir / "taskcard" / "status").read_bytes() == b"active"
    assert (workdir / "taskcard" / "taskcard.md").exists()
    assert (workdir / "taskcard" / "watch.json").exists()
    resumed = make_card().call(envelope("inspect", watch_id="tc_1"))
    assert (resumed["status"], resumed["watch_id"]) == ("watching", "tc_1")


@pytest.mark.parametrize(
    ("envelope", "kind"),
    [(None, "null"), (["start"], "an array"), (5, "a number"), ('"settings"', "a string")],
)
def test_the_python_api_names_what_it_got_instead_of_an_envelope(
    make_card: MakeCard, envelope: object, kind: str
) -> None:
    """`call(None)` said only that an envelope must be an object, not what came instead."""
    result = make_card().call(envelope)  # type: ignore[arg-type]
    assert result["status"] == "failed", result
    assert result["message"].endswith(f"and reasoning; the top level is {kind}"), result
