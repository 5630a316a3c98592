"""AgentMonitor against real files: card rules, notifications, activity, and every file fault."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from taskcard.bridge.compose.activity import movement_text
from taskcard.bridge.compose.view import compose_view
from taskcard.bridge.follow import safe_read
from taskcard.bridge.follow.safe_read import WorkdirFiles
from taskcard.bridge.follow.tail import TAIL_BYTES
from taskcard.bridge.track.files import BODY_NAME, EVENTS_NAME, STATUS_NAME
from taskcard.bridge.track.legacy import body_markdown, legacy_json_to_markdown
from taskcard.bridge.track.monitor import AgentMonitor, MemoryOffsetStore
from taskcard.producers.task_card.contract import (
    CardPaths,
    append_jsonl_line,
    atomic_write,
    iso_utc,
)

START = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@dataclass
class Clock:
    now: datetime = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def last_text(mon: AgentMonitor) -> str | None:
    """The last movement as a card words it."""
    movement = mon.activity.last_movement
    return None if movement is None else movement_text(movement)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def paths(tmp_path: Path) -> CardPaths:
    return CardPaths(tmp_path / "agent")


def monitor(paths: CardPaths, clock: Clock, store: MemoryOffsetStore | None = None) -> AgentMonitor:
    return AgentMonitor(
        "builder", paths.workdir, store or MemoryOffsetStore(), clock=clock, no_output_after_s=60
    )


def publish(paths: CardPaths, body: bytes | str, status: bytes = b"active") -> None:
    atomic_write(paths.body, body.encode() if isinstance(body, str) else body)
    atomic_write(paths.status, status)


def notify(paths: CardPaths, ident: str, source: str, **extra: Any) -> None:
    append_jsonl_line(
        paths.notifications,
        {
            "id": ident,
            "source": source,
            "channel": "system",
            "ref_id": extra.get("watch_id", "tc_1"),
            "priority": "high",
            "header": "h",
            "body": "b",
            "extra": extra,
            "at": "2026-05-01T11:00:00Z",
        },
    )


def event(paths: CardPaths, kind: str, ts: datetime, **fields: Any) -> None:
    append_jsonl_line(paths.events, {"ts": iso_utc(ts), "kind": kind, **fields})


# -- card ------------------------------------------------------------------------------


def test_missing_workdir_is_tolerated(paths: CardPaths, clock: Clock) -> None:
    mon = monitor(paths, clock)
    result = mon.refresh()
    assert mon.card.status == "none"
    assert mon.activity.state == "unknown"
    assert result.notifications == ()
    assert mon.refresh().card_changed is False


def test_active_card_is_shown_and_identical_bytes_change_nothing(
    paths: CardPaths, clock: Clock
) -> None:
    publish(paths, "# Build\n3/10")
    mon = monitor(paths, clock)
    assert mon.refresh().card_changed is True
    assert (mon.card.status, mon.card.body) == ("active", "# Build\n3/10")
    first_changed = mon.card.body_changed_at
    assert first_changed is not None
    # Same bytes rewritten (a new inode and mtime): nothing changes.
    os.utime(paths.body, (1_900_000_000, 1_900_000_000))
    publish(paths, "# Build\n3/10")
    assert mon.refresh().card_changed is False
    assert mon.card.body_changed_at == first_changed
    # New bytes: the body and its change time move.
    publish(paths, "# Build\n4/10")
    os.utime(paths.body, (1_900_000_000, 1_900_000_000))
    assert mon.refresh().card_changed is True
    assert mon.card.body == "# Build\n4/10"
    assert mon.card.body_changed_at == datetime.fromtimestamp(1_900_000_000, UTC)


def test_a_card_read_again_into_the_same_state_is_no_change(paths: CardPaths, clock: Clock) -> None:
    """The card state is made again when a file it comes from is rewritten: the same watch
    id, the same status at a new time. Equal to the last one, it is no change (a change is
    told by the body first, then by every field)."""
    publish(paths, "same body")
    atomic_write(paths.watch, json.dumps({"watch_id": "tc_1"}).encode())
    mon = monitor(paths, clock)
    assert mon.refresh().card_changed is True
    before = mon.card
    atomic_write(paths.watch, json.dumps({"watch_id": "tc_1"}).encode())
    os.utime(paths.watch, (1_900_000_000, 1_900_000_000))
    publish(paths, "same body")
    os.utime(paths.status, (1_900_000_000, 1_900_000_000))
    assert mon.refresh().card_changed is False
    assert mon.card == before
    atomic_write(paths.watch, json.dumps({"watch_id": "tc_2"}).encode())
    assert mon.refresh().card_changed is True  # the body alone is the same
    assert mon.card.watch_id == "tc_2"


@pytest.mark.parametrize("status", [b"act", b"active\n", b"", b"\xff\xfe", b"ACTIVE"])
def test_unknown_status_bytes_keep_the_last_good_state(
    paths: CardPaths, clock: Clock, status: bytes
) -> None:
    publish(paths, "good body")
    mon = monitor(paths, clock)
    mon.refresh()
    publish(paths, "new body", status=status)
    assert mon.refresh().card_changed is False
    assert (mon.card.status, mon.card.body) == ("active", "good body")


def test_blank_or_missing_body_keeps_the_last_good_state(paths: CardPaths, clock: Clock) -> None:
    publish(paths, "good body")
    mon = monitor(paths, clock)
    mon.refresh()
    publish(paths, "  \n\t ")
    mon.refresh()
    assert mon.card.body == "good body"
    paths.body.unlink()
    mon.refresh()
    assert (mon.card.status, mon.card.body) == ("active", "good body")
    # A workdir that vanishes entirely keeps the card too.
    for path in (paths.status,):
        path.unlink()
    assert mon.refresh().card_changed is False


def test_inactive_stops_and_a_new_activation_shows_again(paths: CardPaths, clock: Clock) -> None:
    publish(paths, "body one")
    mon = monitor(paths, clock)
    mon.refresh()
    atomic_write(paths.status, b"inactive")
    os.utime(paths.status, (1_800_000_000, 1_800_000_000))
    assert mon.refresh().card_changed is True
    assert mon.card.status == "inactive"
    assert mon.card.status_changed_at == datetime.fromtimestamp(1_800_000_000, UTC)
    publish(paths, "body two")
    mon.refresh()
    assert (mon.card.status, mon.card.body) == ("active", "body two")


def test_legacy_json_body_becomes_markdown(paths: CardPaths, clock: Clock) -> None:
    frame = {"title": "Nightly *build*", "lines": ["step 3/10", "eta: unknown"], "footer": "ci"}
    publish(paths, json.dumps(frame))
    mon = monitor(paths, clock)
    mon.refresh()
    assert mon.card.body == "**Nightly \\*build\\***\nstep 3/10\neta: unknown\n_ci_"


@pytest.mark.parametrize(
    ("count", "tail"),
    [
        (0, None),
        (19, None),
        (20, None),
        (21, "_… 1 more line not shown_"),
        (500, "_… 480 more lines not shown_"),
    ],
)
def test_a_legacy_frame_shows_at_most_20_lines_and_counts_the_rest(
    count: int, tail: str | None
) -> None:
    """The older manual caps `lines` at 20: more are counted, never a wall, never silently cut."""
    lines = [f"row {n}" for n in range(1, count + 1)]
    text = legacy_json_to_markdown(json.dumps({"title": "T", "lines": lines, "footer": "f"}))
    assert text is not None
    rows = text.split("\n")
    assert rows[0] == "**T**" and rows[-1] == "_f_"
    shown = [row for row in rows if row.startswith("row ")]
    assert shown == lines[:20]
    assert rows[1:-1] == shown + ([tail] if tail else [])


def test_a_frame_of_only_blank_lines_is_not_a_card() -> None:
    assert legacy_json_to_markdown(json.dumps({"lines": [" "] * 30})) is None


@pytest.mark.parametrize(
    "text",
    ['{"title": 3}', '{"other": "x"}', '{"lines": "not a list"}', "[1, 2]", '{"title": ""}', "{"],
)
def test_non_frames_are_not_converted(text: str) -> None:
    assert legacy_json_to_markdown(text) is None


# -- notifications ---------------------------------------------------------------------


def test_first_sight_does_not_replay_history_but_learns_health(
    paths: CardPaths, clock: Clock
) -> None:
    publish(paths, "body")
    atomic_write(paths.watch, json.dumps({"watch_id": "tc_1"}).encode())
    notify(paths, "e1", "task_card.error", state="error", code="renderer_timeout")
    mon = monitor(paths, clock)
    result = mon.refresh()
    assert result.notifications == ()
    assert mon.card.watch_id == "tc_1"
    assert mon.card.error_code == "renderer_timeout"
    assert mon.card.error_since == datetime(2026, 5, 1, 11, 0, tzinfo=UTC)
    notify(paths, "r1", "task_card.error", state="recovered")
    result = mon.refresh()
    assert [n.id for n in result.notifications] == ["r1"]
    assert result.card_changed is True
    assert mon.card.error_code is None


def test_limit_marks_exhausted_until_a_new_watch(paths: CardPaths, clock: Clock) -> None:
    publish(paths, "body")
    atomic_write(paths.watch, json.dumps({"watch_id": "tc_1"}).encode())
    mon = monitor(paths, clock)
    mon.refresh()
    atomic_write(paths.status, b"inactive")
    paths.watch.unlink()
    notify(paths, "l1", "task_card.limit", state="limit", max_refreshes=5)
    result = mon.refresh()
    assert [n.id for n in result.notifications] == ["l1"]
    assert (mon.card.status, mon.card.exhausted) == ("inactive", True)
    atomic_write(paths.watch, json.dumps({"watch_id": "tc_2"}).encode())
    publish(paths, "fresh")
    mon.refresh()
    assert (mon.card.status, mon.card.exhausted, mon.card.watch_id) == ("active", False, "tc_2")


def test_old_watch_errors_do_not_mark_the_current_card(paths: CardPaths, clock: Clock) -> None:
    publish(paths, "body")
    atomic_write(paths.watch, json.dumps({"watch_id": "tc_2"}).encode())
    notify(paths, "e1", "task_card.error", state="error", code="watch_crash", watch_id="tc_1")
    mon = monitor(paths, clock)
    mon.refresh()
    assert mon.card.error_code is None


def test_half_written_line_waits_for_its_newline(paths: CardPaths, clock: Clock) -> None:
    paths.notification_dir.mkdir(parents=True)
    paths.notifications.write_bytes(b"")
    mon = monitor(paths, clock)
    mon.refresh()
    line = json.dumps({"id": "n1", "source": "task_card.error", "extra": {"state": "error"}})
    with paths.notifications.open("ab") as handle:
        handle.write(line[:20].encode())
    assert mon.refresh().notifications == ()
    with paths.notifications.open("ab") as handle:
        handle.write(line[20:].encode() + b"\n")
    assert [n.id for n in mon.refresh().notifications] == ["n1"]


def test_malformed_lines_are_skipped(paths: CardPaths, clock: Clock) -> None:
    mon = monitor(paths, clock)
    mon.refresh()
    paths.notification_dir.mkdir(parents=True)
    paths.notifications.write_bytes(b"not json\n[1]\n{}\n\xff\xfe\n")
    notify(paths, "ok", "task_card.error", state="error", code="write_failed")
    assert [n.id for n in mon.refresh().notifications] == ["ok"]


def test_rotation_delivers_the_rest_of_the_old_file_then_the_new(
    paths: CardPaths, clock: Clock
) -> None:
    notify(paths, "old", "task_card.error", state="error")
    mon = monitor(paths, clock)
    mon.refresh()
    notify(paths, "a", "task_card.error", state="recovered")
    os.rename(paths.notifications, paths.notifications.with_name("system.jsonl.1"))
    assert [n.id for n in mon.refresh().notifications] == ["a"]
    notify(paths, "b", "task_card.error", state="error")
    assert [n.id for n in mon.refresh().notifications] == ["b"]
    # Rotated again with unseen lines on both sides of the rename.
    notify(paths, "c", "task_card.error", state="recovered")
    os.replace(paths.notifications, paths.notifications.with_name("system.jsonl.1"))
    notify(paths, "d", "task_card.limit", state="limit")
    assert [n.id for n in mon.refresh().notifications] == ["c", "d"]


def test_truncation_and_replacement_read_from_the_start(paths: CardPaths, clock: Clock) -> None:
    notify(paths, "x1", "task_card.error", state="error")
    notify(paths, "x2", "task_card.error", state="recovered")
    mon = monitor(paths, clock)
    mon.refresh()
    with paths.notifications.open("r+b") as handle:
        handle.truncate(0)
    notify(paths, "t1", "task_card.error", state="error")
    assert [n.id for n in mon.refresh().notifications] == ["t1"]
    replacement = paths.notifications.with_name("new.jsonl")
    replacement.write_bytes(b'{"id":"r1","source":"task_card.limit","extra":{}}\n')
    os.replace(replacement, paths.notifications)
    assert [n.id for n in mon.refresh().notifications] == ["r1"]


def test_a_file_appearing_later_is_read_from_its_start(paths: CardPaths, clock: Clock) -> None:
    mon = monitor(paths, clock)
    mon.refresh()
    notify(paths, "first", "task_card.error", state="error")
    assert [n.id for n in mon.refresh().notifications] == ["first"]


def test_offsets_persist_across_a_restart(paths: CardPaths, clock: Clock) -> None:
    store = MemoryOffsetStore()
    notify(paths, "history", "task_card.error", state="error")
    first = monitor(paths, clock, store)
    first.refresh()
    notify(paths, "n1", "task_card.error", state="recovered")
    assert [n.id for n in first.refresh().notifications] == ["n1"]
    first.commit()
    notify(paths, "n2", "task_card.limit", state="limit")
    # A restarted service continues after n1, and learns the health from what it had seen.
    second = monitor(paths, clock, store)
    assert [n.id for n in second.refresh().notifications] == ["n2"]
    assert second.card.exhausted is True


def test_uncommitted_notifications_are_returned_again_after_a_restart(
    paths: CardPaths, clock: Clock
) -> None:
    store = MemoryOffsetStore()
    first = monitor(paths, clock, store)
    first.refresh()
    notify(paths, "n1", "task_card.error", state="error")
    assert [n.id for n in first.refresh().notifications] == ["n1"]
    # Died before committing: n1 comes back (deduplicated by id downstream).
    second = monitor(paths, clock, store)
    assert [n.id for n in second.refresh().notifications] == ["n1"]


# -- activity --------------------------------------------------------------------------


def state_of(mon: AgentMonitor) -> str:
    return mon.activity.state


def test_state_follows_events_and_time(paths: CardPaths, clock: Clock) -> None:
    mon = monitor(paths, clock)
    mon.refresh()
    assert state_of(mon) == "unknown"
    event(paths, "agent.start", START, pid=1)
    event(paths, "turn.start", START)
    event(paths, "tool.start", START, call_id="c1", name="pytest", summary="tests/ -q")
    result = mon.refresh()
    assert result.activity_changed is True
    summary = mon.activity
    assert summary.state == "running"
    assert summary.turn_started_at == START
    assert last_text(mon) == "pytest: tests/ -q"
    assert summary.state_valid_until == START + timedelta(seconds=60)
    clock.advance(59)
    assert state_of(mon) == "running"
    clock.advance(1)
    assert state_of(mon) == "unknown"  # a silent open turn: work cannot be told from silence
    assert mon.refresh().activity_changed is False  # already brought up to date on read
    event(paths, "tool.end", clock.now, call_id="c1", ok=False, duration_s=60.5)
    mon.refresh()
    assert state_of(mon) == "running"
    assert last_text(mon) == "pytest failed in 60.5 s"
    event(paths, "wait.start", clock.now, reason="approve deploy")
    mon.refresh()
    assert (state_of(mon), last_text(mon)) == (
        "waiting",
        "waiting: approve deploy",
    )
    clock.advance(3600)
    assert state_of(mon) == "waiting"
    event(paths, "wait.end", clock.now, reason="approved")
    event(paths, "turn.end", clock.now)
    mon.refresh()
    assert state_of(mon) == "idle"
    event(paths, "agent.exit", clock.now, code=0)
    mon.refresh()
    assert (state_of(mon), last_text(mon)) == ("exited", "agent exited (code 0)")
    event(paths, "agent.start", clock.now)
    mon.refresh()
    assert state_of(mon) == "unknown"
    clock.advance(30)
    assert state_of(mon) == "no output"  # came up and said nothing: a warning
    event(paths, "text", clock.now, text="hello")
    mon.refresh()
    assert state_of(mon) == "at prompt"  # spoke, but never had a turn


def test_usage_is_summed_per_turn_and_is_not_movement(paths: CardPaths, clock: Clock) -> None:
    mon = monitor(paths, clock)
    mon.refresh()
    event(paths, "turn.start", START)
    event(paths, "usage", START, input_tokens=100, output_tokens=10)
    event(paths, "usage", START, input_tokens=50, output_tokens=5)
    mon.refresh()
    assert (mon.activity.tokens_in, mon.activity.tokens_out) == (150, 15)
    assert last_text(mon) == "turn started"
    event(paths, "turn.start", START)
    mon.refresh()
    assert (mon.activity.tokens_in, mon.activity.tokens_out) == (None, None)


def test_recent_rows_are_newest_first_bounded_and_redacted(paths: CardPaths, clock: Clock) -> None:
    mon = monitor(paths, clock)
    mon.refresh()
    event(paths, "turn.start", START)
    for index in range(12):
        event(paths, "text", START + timedelta(seconds=index), text=f"step {index}")
    event(paths, "text", START + timedelta(seconds=20), text="using token=supersecret1\nnext")
    mon.refresh()
    recent = [(movement_text(m), m.at) for m in mon.activity.recent]
    assert len(recent) == 10
    assert recent[0] == ("using token=[redacted] next", START + timedelta(seconds=20))
    assert recent[1] == ("step 11", START + timedelta(seconds=11))


def test_unknown_kinds_and_malformed_lines_are_counted(paths: CardPaths, clock: Clock) -> None:
    mon = monitor(paths, clock)
    mon.refresh()
    event(paths, "turn.start", START)
    with paths.events.open("ab") as handle:
        handle.write(b'garbage\n{"kind":"dance","ts":"2026-05-01T12:00:00Z"}\n{"kind":"text"}\n')
    event(paths, "text", START, text="still fine")
    mon.refresh()
    assert mon.activity.skipped_lines == 3
    assert last_text(mon) == "still fine"


def test_first_sight_reads_a_bounded_tail_of_a_long_log(paths: CardPaths, clock: Clock) -> None:
    paths.logs_dir.mkdir(parents=True)
    filler = json.dumps({"ts": iso_utc(START), "kind": "text", "text": "x" * 200}) + "\n"
    with paths.events.open("w") as handle:
        handle.write(json.dumps({"ts": iso_utc(START), "kind": "agent.exit"}) + "\n")
        handle.write(filler * (2 * TAIL_BYTES // len(filler)))
    event(paths, "turn.start", START)
    event(paths, "text", START, text="latest")
    mon = monitor(paths, clock)
    mon.refresh()
    # The exit lies outside the tail; what is read decides the state.
    assert mon.activity.state == "running"
    assert last_text(mon) == "latest"
    assert mon.activity.skipped_lines == 0


def test_a_replaced_events_log_is_read_from_its_start(paths: CardPaths, clock: Clock) -> None:
    event(paths, "turn.start", START)
    mon = monitor(paths, clock)
    mon.refresh()
    replacement = paths.logs_dir / "tmp.jsonl"
    replacement.write_text(json.dumps({"ts": iso_utc(START), "kind": "turn.end"}) + "\n")
    os.replace(replacement, paths.events)
    mon.refresh()
    assert mon.activity.state == "idle"


def test_card_refreshes_are_never_activity(paths: CardPaths, clock: Clock) -> None:
    mon = monitor(paths, clock)
    mon.refresh()
    for step in range(3):
        publish(paths, f"step {step}")
        result = mon.refresh()
        assert result.activity_changed is False
    assert mon.activity.state == "unknown"
    assert mon.activity.last_movement is None


def test_a_refresh_with_nothing_new_reads_no_file(
    paths: CardPaths, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(paths, "body")
    notify(paths, "n", "task_card.error", state="error")
    event(paths, "turn.start", START)
    mon = monitor(paths, clock)
    mon.refresh()
    mon.refresh()
    opened: list[Path] = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if not (args and args[0] & getattr(os, "O_PATH", 0)):  # O_PATH only names a file
            opened.append(Path(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    result = mon.refresh()
    assert (result.card_changed, result.activity_changed, result.notifications) == (
        False,
        False,
        (),
    )
    assert opened == []
    event(paths, "text", START, text="news")
    opened.clear()  # the writer's own open
    assert mon.refresh().activity_changed is True
    assert opened == [paths.events.resolve()]


def test_a_body_change_reads_the_body_alone_and_a_status_change_is_still_seen(
    paths: CardPaths, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(paths, "first")
    mon = monitor(paths, clock)
    mon.refresh()
    opened: list[Path] = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if not (args and args[0] & getattr(os, "O_PATH", 0)):  # O_PATH only names a file
            opened.append(Path(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    atomic_write(paths.body, b"second")
    opened.clear()  # the writer's own opens
    assert mon.refresh().card_changed is True
    assert mon.card.body == "second"
    assert opened == [paths.body.resolve()]

    atomic_write(paths.status, b"inactive")
    assert mon.refresh().card_changed is True
    assert mon.card.status == "inactive"
    atomic_write(paths.status, b"active")
    atomic_write(paths.body, b"third")
    mon.refresh()
    assert (mon.card.status, mon.card.body) == ("active", "third")


def test_a_refresh_told_which_files_changed_looks_at_those_alone(
    paths: CardPaths, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher names the files it saw change: a body change then costs one read of the
    body (its signature comes from the descriptor read, no separate `stat`), nothing else;
    what no event named waits for a full refresh (the rescan), and a refresh after a failure
    is always full."""
    publish(paths, "first")
    event(paths, "turn.start", START)
    mon = monitor(paths, clock)
    mon.refresh()
    stated: list[str] = []
    real_stat = os.stat

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        stated.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    opened: list[str] = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting_stat)
    atomic_write(paths.body, b"second")
    atomic_write(paths.status, b"inactive")  # named by no event below
    event(paths, "text", START, text="news")  # nor this
    stated.clear()
    monkeypatch.setattr(os, "open", counting_open)
    result = mon.refresh(frozenset({BODY_NAME}))
    monkeypatch.setattr(os, "open", real_open)
    assert (result.card_changed, result.activity_changed) == (True, False)
    assert (mon.card.status, mon.card.body) == ("active", "second")
    assert stated == []
    assert opened == [os.fspath(paths.body)]
    assert mon.refresh(frozenset({BODY_NAME})).card_changed is False  # same file: no change

    assert mon.refresh(frozenset({EVENTS_NAME})).activity_changed is True
    assert mon.card.status == "active"  # the status file was still not named
    assert mon.refresh(frozenset({STATUS_NAME})).card_changed is True
    assert (mon.card.status, mon.card.body) == ("inactive", "second")

    atomic_write(paths.status, b"active")
    atomic_write(paths.body, b"third")
    assert mon.refresh(frozenset()).card_changed is False  # nothing named: nothing looked at
    assert mon.refresh(None).card_changed is True  # the rescan's full look
    assert (mon.card.status, mon.card.body) == ("active", "third")

    atomic_write(paths.body, b"fourth")
    mon.forget_signatures()  # what the service does after a failed refresh
    assert mon.refresh(frozenset()).card_changed is True
    assert mon.card.body == "fourth"


# -- total parsing: one bad value costs that field or that line, never the agent ------------


@pytest.mark.parametrize(
    "line",
    [
        b'{"ts": "2030-01-01T00:00:00Z", "kind": "usage", "input_tokens": 1e309}',
        b'{"ts": "2030-01-01T00:00:00Z", "kind": "usage", "output_tokens": 1' + b"0" * 400 + b"}",
        b'{"ts": "2030-01-01T00:00:00Z", "kind": "usage", "input_tokens": NaN}',
        b'{"ts": "2030-01-01T00:00:00Z", "kind": "tool.end", "duration_s": Infinity}',
        b'{"ts": "2030-01-01T00:00:00Z", "kind": "tool.end", "duration_s": -1e308}',
        b'{"ts": "2030-01-01T00:00:00Z", "kind": "agent.exit", "code": 1e400}',
        b'{"ts": "2030-01-01T00:00:00Z", "kind": "tool.start", "name": [1], "call_id": {}}',
        b'{"ts": "0001-01-01T00:00:00+05:00", "kind": "turn.start"}',
        b'{"ts": "9999-12-31T23:59:59-05:00", "kind": "turn.start"}',
        b'{"ts": "9999-12-31T23:59:59Z", "kind": "turn.start"}',
        b'{"ts": Infinity, "kind": "turn.start"}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"ts": "2030-01-01T00:00:00Z", "kind": "text", "text": "' + b"\xff" * 10 + b'"}',
    ],
)
def test_absurd_values_never_raise_and_the_next_good_line_counts(
    paths: CardPaths, clock: Clock, line: bytes
) -> None:
    publish(paths, "body")
    paths.events.parent.mkdir(parents=True, exist_ok=True)
    paths.events.write_bytes(line + b"\n")
    mon = monitor(paths, clock)
    result = mon.refresh()
    assert result.failure is None
    with paths.events.open("ab") as log:
        log.write(line + b"\n")
    event(paths, "usage", START, input_tokens=1200, output_tokens=300)
    result = mon.refresh()
    assert result.failure is None
    summary = mon.activity
    assert summary.tokens_in == 1200 and summary.tokens_out == 300
    view = compose_view("a", mon.card, summary, hidden=False, activity_rows=10, now=clock.now)
    assert "1.2k" in "\n".join(view.auto_rows)


def test_an_absurd_mtime_is_unknown_not_an_error(paths: CardPaths, clock: Clock) -> None:
    publish(paths, "body")
    os.utime(paths.body, ns=(0, -(2**62)))  # 1823: before any real card
    mon = monitor(paths, clock)
    mon.refresh()
    assert mon.card.body == "body"
    assert mon.card.body_changed_at is None


def test_a_pipe_at_any_file_is_a_problem_of_that_file(paths: CardPaths, clock: Clock) -> None:
    publish(paths, "body")
    paths.events.parent.mkdir(parents=True)
    os.mkfifo(paths.events)
    paths.notifications.parent.mkdir(parents=True)
    os.mkfifo(paths.notifications)
    mon = monitor(paths, clock)
    mon.refresh()
    assert mon.card.body == "body"
    assert set(mon.files.problems) == {"logs/events.jsonl", ".notification/system.jsonl"}


def test_a_named_body_that_cannot_be_read_is_tried_once(
    tmp_path: Path, paths: CardPaths, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An active card's body named by the watcher but missing or refused (a symlink out of
    the workdir) is tried once per change, not read and then read again; a refused status
    is read once too. The card keeps what it showed, the refusal is listed."""
    publish(paths, "first")
    mon = monitor(paths, clock)
    mon.refresh()
    reads: list[str] = []
    real_read = WorkdirFiles._read

    def counting_read(self: WorkdirFiles, path: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(os.fspath(path))
        return real_read(self, path, *args, **kwargs)

    monkeypatch.setattr(WorkdirFiles, "_read", counting_read)
    body = os.fspath(paths.body)
    os.unlink(body)
    mon.refresh(frozenset({BODY_NAME}))
    assert reads == [body]
    assert (mon.card.status, mon.card.body) == ("active", "first")

    (tmp_path / "outside").write_bytes(b"SECRET")
    os.symlink(tmp_path / "outside", body)
    reads.clear()
    mon.refresh(frozenset({BODY_NAME}))
    assert reads == [body]
    assert (mon.card.status, mon.card.body) == ("active", "first")
    assert "outside" in mon.files.problems["taskcard/taskcard.md"]

    status = os.fspath(paths.status)
    os.unlink(status)
    os.symlink(tmp_path / "outside", status)
    atomic_write(paths.body, b"second")
    reads.clear()
    mon.refresh(frozenset({STATUS_NAME, BODY_NAME}))
    assert reads.count(status) == 1


def test_a_body_written_while_it_is_read_is_read_again_at_the_next_change(
    paths: CardPaths, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signature kept with a body read is that of the file before the read, never after:
    a body written in place while it is read (here through a symlink inside the workdir, the
    full check's path) differs at the writer's next event and is read again, not taken for
    the body already shown."""
    real = paths.taskcard_dir / "real.md"
    publish(paths, "first")
    os.replace(paths.body, real)
    os.symlink(real, paths.body)
    mon = monitor(paths, clock)
    mon.refresh()
    assert mon.card.body == "first"
    real_read_up_to = safe_read._read_up_to

    def racing_read(handle: Any, limit: int) -> bytes:
        data = real_read_up_to(handle, limit)
        with open(real, "ab") as writer:  # the agent's writer goes on meanwhile
            writer.write(b" and more")
        os.utime(real, ns=(2_000_000_000_000_000_000, 2_000_000_000_000_000_000))
        return data

    with open(real, "r+b") as writer:  # written in place, not replaced
        writer.write(b"second")
        writer.truncate()
    monkeypatch.setattr(safe_read, "_read_up_to", racing_read)
    mon.refresh(frozenset({BODY_NAME}))
    monkeypatch.setattr(safe_read, "_read_up_to", real_read_up_to)
    assert mon.card.body == "second"
    assert mon.refresh(frozenset({BODY_NAME})).card_changed is True  # the writer's event
    assert mon.card.body == "second and more"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xef\xbb\xbf",
        b"\xef\xbb\xbf# heading\r\nnext",
        b"\xef\xbb\xbf\xef\xbb\xbftwo marks",  # only the first is the signature
        b"\xef\xbbcut mark",
        b"x\xef\xbb\xbf inside",
        b"\xff\xfe not UTF-8 \xc3",
        b'\xef\xbb\xbf{"title": "T", "lines": ["a"]}',
    ],
)
def test_a_body_is_decoded_as_utf_8_with_an_optional_signature(raw: bytes) -> None:
    text = raw.decode("utf-8-sig", errors="replace")
    assert body_markdown(raw) == (legacy_json_to_markdown(text) or text)
