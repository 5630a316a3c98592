"""Point 8: the file notification port: wire shape, dedupe across rotation, bounded size."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from taskcard.producers.task_card.contract import CardPaths, parse_notification
from taskcard.producers.task_card.notifications import (
    FileNotificationPort,
    TaskCardErrorNotification,
    TaskCardLimitNotification,
    TaskCardRecoveredNotification,
)

from .conftest import wait_for


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_each_typed_event_has_the_wire_shape_consumers_parse(workdir: Path) -> None:
    paths = CardPaths(workdir)
    port = FileNotificationPort(paths)
    port.notify(TaskCardErrorNotification("tc_1", 1, "renderer_timeout", "slow"))
    port.notify(TaskCardRecoveredNotification("tc_1", 1))
    port.notify(TaskCardLimitNotification("tc_1", 40))
    parsed = [parse_notification(line) for line in paths.notifications.read_bytes().splitlines()]
    assert [(n.id, n.source, n.ref_id, n.priority) for n in parsed if n] == [
        ("task_card.error:tc_1:1:renderer_timeout", "task_card.error", "tc_1", "high"),
        ("task_card.recovered:tc_1:1", "task_card.error", "tc_1", "normal"),
        ("task_card.limit:tc_1:40", "task_card.limit", "tc_1", "normal"),
    ]
    assert all(n is not None and n.at is not None for n in parsed)
    raw = lines(paths.notifications)
    assert {r["channel"] for r in raw} == {"system"}
    assert raw[2]["extra"] == {"state": "limit", "watch_id": "tc_1", "max_refreshes": 40}


def test_an_id_already_present_is_not_appended_again_even_after_rotation(workdir: Path) -> None:
    paths = CardPaths(workdir)
    rotated = paths.notifications.with_name("system.jsonl.1")
    port = FileNotificationPort(paths, rotate_bytes=1)  # every append rotates the previous file
    first = TaskCardErrorNotification("tc_1", 1, "renderer_timeout", "slow")
    port.notify(first)
    port.notify(first)
    assert len(lines(paths.notifications)) == 1
    port.notify(TaskCardRecoveredNotification("tc_1", 1))
    assert [r["id"] for r in lines(rotated)] == ["task_card.error:tc_1:1:renderer_timeout"]
    port.notify(first)  # present in the rotated file: still a duplicate
    assert [r["id"] for r in lines(paths.notifications)] == ["task_card.recovered:tc_1:1"]


def test_the_file_is_rotated_past_its_bound(workdir: Path) -> None:
    paths = CardPaths(workdir)
    port = FileNotificationPort(paths, rotate_bytes=1000)
    for epoch in range(1, 40):
        port.notify(TaskCardErrorNotification("tc_1", epoch, "renderer_timeout", "slow"))
    assert paths.notifications.stat().st_size < 1000 + 500
    assert paths.notifications.with_name("system.jsonl.1").stat().st_size >= 1000


def test_reminders_get_fresh_ids_and_can_be_cleared(workdir: Path) -> None:
    paths = CardPaths(workdir)
    port = FileNotificationPort(paths)
    port.submit_reminder(10, None)
    port.submit_reminder(10, "tc_2")
    port.clear_reminder()
    port.clear_reminder()
    raw = lines(paths.notifications)
    assert [r["extra"]["state"] for r in raw] == [  # type: ignore[index]
        "reminder",
        "reminder",
        "reminder_cleared",
    ]
    assert {r["source"] for r in raw} == {"task_card.reminder"}
    assert raw[0]["id"] != raw[1]["id"]
    assert raw[2]["extra"]["clears"] == raw[1]["id"]  # type: ignore[index]


def _waiting_for_a_lock(pid: int) -> bool:
    """Whether process `pid` is blocked on an `flock` (a `->` line of /proc/locks)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and "FLOCK" in fields and str(pid) in fields:
            return True
    return False


def test_writers_in_two_processes_take_turns_around_the_rotation(workdir: Path) -> None:
    """A writer past the size bound waits for the writer already rotating (the host, a hook,
    a CLI call), so the file is never rotated twice and lines not yet read stay in `.1`."""
    paths = CardPaths(workdir)
    port = FileNotificationPort(paths, rotate_bytes=300)
    for epoch in range(1, 4):
        port.notify(TaskCardErrorNotification("tc_1", epoch, "renderer_timeout", "slow"))
    assert paths.notifications.stat().st_size >= 300  # the next append rotates
    unread = [r["id"] for r in lines(paths.notifications)]
    lock = paths.notification_dir / ".system.jsonl.lock"
    with lock.open("a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another writer is in the middle of its append
        script = (
            "import sys; from pathlib import Path\n"
            "from taskcard.producers.task_card.contract import CardPaths\n"
            "from taskcard.producers.task_card.notifications import (\n"
            "    FileNotificationPort, TaskCardLimitNotification)\n"
            "port = FileNotificationPort(CardPaths(Path(sys.argv[1])), rotate_bytes=300)\n"
            "port.notify(TaskCardLimitNotification('tc_1', 40))\n"
        )
        writer = subprocess.Popen([sys.executable, "-c", script, str(workdir)])
        try:
            wait_for(lambda: _waiting_for_a_lock(writer.pid) or writer.poll() is not None)
            assert writer.poll() is None, "the second writer did not wait for the lock"
            assert [r["id"] for r in lines(paths.notifications)] == unread
            # The holder rotates and appends meanwhile, as a writer would.
            port_rotated = paths.notifications.with_name("system.jsonl.1")
            os.replace(paths.notifications, port_rotated)
            fcntl.flock(held, fcntl.LOCK_UN)
            assert writer.wait(timeout=60) == 0
        finally:
            writer.kill()
            writer.wait()
    # The waiting writer found a fresh file below the bound: it appended, it did not rotate
    # again over the unread lines.
    assert [r["id"] for r in lines(port_rotated)] == unread
    assert [r["id"] for r in lines(paths.notifications)] == ["task_card.limit:tc_1:40"]


def test_a_line_with_a_number_too_large_for_a_float_is_read_not_raised(workdir: Path) -> None:
    """The reader of `system.jsonl` is total: the service and the agent's wakes read lines an
    agent may have written. A header given as 401 digits raised OverflowError out of it
    (`math.isfinite` of a whole number past the largest float); it is now an unset field."""
    huge = "1" + "0" * 400
    line = (
        '{"id": "task_card.error:tc_1:1:renderer_timeout", "source": "task_card.error",'
        f' "channel": "system", "ref_id": "tc_1", "priority": "high", "header": {huge},'
        ' "body": 12, "extra": {"state": "error"}, "at": "2026-01-01T00:00:00Z"}'
    ).encode()
    parsed = parse_notification(line)
    assert parsed is not None
    assert (parsed.id, parsed.header, parsed.body) == (
        "task_card.error:tc_1:1:renderer_timeout",
        "",
        "12",
    )
