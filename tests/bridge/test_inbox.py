"""The inbox as the service writes it (bridge.inbox) and the states people see."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from taskcard.bridge.inbox.states import MessageState, message_state, state_line
from taskcard.bridge.inbox.writer import InboxRefused, InboxWriter
from taskcard.bridge.run.inbox_desk import AuthorRate
from taskcard.bridge.store.sqlite import InboxRecord
from taskcard.bridge.track.monitor import ActivitySummary
from taskcard.channels.base import AgentState
from taskcard.producers.reports.contract import inbox_message, parse_ack

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def message(ident: str = "m_1", text: str = "stop now") -> dict[str, object]:
    return inbox_message(
        ident=ident,
        kind="message",
        text=text,
        channel="telegram",
        chat_id="-100",
        thread_id=None,
        user="42",
        queued_at=T0,
    )


def test_queue_writes_one_file_through_tmp_with_private_folders(tmp_path: Path) -> None:
    InboxWriter(tmp_path).queue(message())
    inbox = tmp_path / "inbox"
    for folder in ("queued", "taken", "cancelled", "tmp"):
        assert stat.S_IMODE((inbox / folder).stat().st_mode) == 0o700
    assert list((inbox / "tmp").iterdir()) == []
    data = json.loads((inbox / "queued" / "m_1.json").read_text())
    assert data["v"] == 1 and data["kind"] == "message" and data["text"] == "stop now"
    assert data["origin"] == "telegram:-100"
    assert data["from"] == {
        "channel": "telegram",
        "chat_id": "-100",
        "thread_id": None,
        "user": "42",
    }


@pytest.mark.parametrize("where", ["inbox", "inbox/queued", "inbox/tmp"])
def test_a_symlink_in_the_inbox_is_refused_never_followed(tmp_path: Path, where: str) -> None:
    workdir, outside = tmp_path / "agent", tmp_path / "outside"
    workdir.mkdir()
    outside.mkdir()
    target = workdir / where
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(outside, target_is_directory=True)
    with pytest.raises(InboxRefused, match="symlink or not a directory"):
        InboxWriter(workdir).queue(message())
    assert list(outside.iterdir()) == []


def test_a_file_where_the_inbox_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "inbox").write_text("not a folder")
    with pytest.raises(InboxRefused, match="inbox is a symlink or not a directory"):
        InboxWriter(tmp_path).queue(message())


def test_too_large_and_bad_ids_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InboxRefused, match="KiB"):
        InboxWriter(tmp_path).queue(message(text="x" * 20_000))
    with pytest.raises(InboxRefused, match="id"):
        InboxWriter(tmp_path).queue(message(ident="../evil"))


def test_a_message_the_disk_cuts_short_is_refused_and_never_queued(tmp_path: Path) -> None:
    """One write of a message larger than the room left took the part that fitted, and the
    cut message was renamed into `queued/` for the agent. Past a file size limit (a full
    disk's short write), the writer now refuses the message and queues nothing."""
    script = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from taskcard.bridge.inbox.writer import InboxRefused, InboxWriter\n"
        "from tests.bridge.test_inbox import message\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    InboxWriter(Path(sys.argv[1])).queue(message(text='x' * 10_000))\n"
        "except InboxRefused as refused:\n"
        "    print('refused:', refused)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    assert done.stdout.startswith("refused: inbox/tmp cannot take m_1.json"), done.stdout
    assert "File too large" in done.stdout, done.stdout
    assert os.listdir(tmp_path / "inbox" / "queued") == []
    assert os.listdir(tmp_path / "inbox" / "tmp") == []


def test_cancel_and_claim_race_one_winner(tmp_path: Path) -> None:
    writer = InboxWriter(tmp_path)
    writer.queue(message("m_a"))
    writer.queue(message("m_b"))
    inbox = tmp_path / "inbox"
    os.rename(inbox / "queued" / "m_a.json", inbox / "taken" / "m_a.json")  # the agent side
    assert writer.cancel("m_a") is False
    assert writer.cancel("m_b") is True
    assert (writer.location("m_a"), writer.location("m_b")) == ("taken", "cancelled")
    assert writer.location("m_c") == "missing"


class Held:
    """Holds the thread that runs `work` at its first call of the C function `at` (`os.rename`,
    `os.write`: a step of a real write into real files) until `go` is set; `reached` is
    set once it waits there. Nothing of the writer is replaced: only the thread is held."""

    def __init__(self, at: Callable[..., Any], work: Callable[[], None]) -> None:
        self.at, self.work = at, work
        self.reached, self.go = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self._held = False
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "c_call" and arg is self.at and not self._held:
            self._held = True
            self.reached.set()
            self.go.wait(60)

    def _run(self) -> None:
        sys.setprofile(self._profile)
        try:
            self.work()
        except BaseException as error:
            self.errors.append(error)
        finally:
            sys.setprofile(None)

    def release(self) -> None:
        self.go.set()
        self.thread.join(60)
        assert not self.thread.is_alive()


def test_two_writers_of_the_same_message_never_touch_each_others_file(tmp_path: Path) -> None:
    """Two writers of the same wake (two instances of a cluster, or a retry beside a write
    still on its way), interleaved: the first has written its file in `tmp/` and is about to
    rename it; the second has created its own and not yet written it. The first's rename
    moves in its own whole file, then the second's replaces it whole; both succeed and
    `tmp/` is left empty. Both wrote `tmp/<id>.json`: the second deleted the first's file as
    a leftover, the first's rename moved the second's empty file into `queued/`, where a
    reader found half a message, and the second failed ('cannot be moved in')."""
    inbox = tmp_path / "inbox"
    first = Held(os.rename, lambda: InboxWriter(tmp_path).queue(message("wake_1", "first")))
    assert first.reached.wait(60)
    second = Held(os.write, lambda: InboxWriter(tmp_path).queue(message("wake_1", "second")))
    assert second.reached.wait(60)
    try:
        first.release()
        queued = inbox / "queued" / "wake_1.json"
        assert json.loads(queued.read_text())["text"] == "first"
    finally:
        first.release()
        second.release()
    assert first.errors == [] and second.errors == []
    assert json.loads(queued.read_text())["text"] == "second"
    assert list((inbox / "tmp").iterdir()) == []


def test_a_file_a_write_cut_short_left_in_tmp_goes_at_a_later_write(tmp_path: Path) -> None:
    """A stop (or a crash) between a write and its rename leaves the file in `tmp/`; its
    message may never be written again (a person's text, failed for good). The next write
    into the same inbox deletes such files once they are an hour old: the service's names
    only, regular files only. A younger one may be another writer's on its way, and stays;
    so do a name the service never writes and a link. They piled up, one per write cut
    short, for as long as the inbox lived."""
    writer = InboxWriter(tmp_path)
    writer.queue(message("m_0"))
    tmp, outside = tmp_path / "inbox" / "tmp", tmp_path / "outside"
    outside.write_text("keep")
    old = time.time() - 2 * 3600
    for name in ("m_cut.json", ".wake_2.0123456789abcdef.tmp", "notes.txt"):
        (tmp / name).write_text('{"v":1,"id":"m_c')
        os.utime(tmp / name, (old, old))
    (tmp / ".wake_3.fedcba9876543210.tmp").write_text("{")  # another writer's, on its way
    (tmp / ".wake_4.0000000000000000.tmp").symlink_to(outside)
    os.utime(tmp / ".wake_4.0000000000000000.tmp", (old, old), follow_symlinks=False)
    InboxWriter(tmp_path).queue(message("m_1"))  # the next start's writer
    assert sorted(p.name for p in tmp.iterdir()) == [
        ".wake_3.fedcba9876543210.tmp",
        ".wake_4.0000000000000000.tmp",
        "notes.txt",
    ]
    assert outside.read_text() == "keep"
    assert json.loads((tmp_path / "inbox" / "queued" / "m_1.json").read_text())["id"] == "m_1"


def test_leftovers_in_tmp_go_past_many_entries_and_are_looked_for_once_an_hour(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`tmp/` holds twenty leftovers two hours old and five thousand files not the
    service's. A writer's first write deletes every leftover and names the crowded folder
    in the log once; its next writes within the hour do not look again. Looking at the
    first 256 entries of each write, nineteen of the twenty stayed after fifty writes, and
    every write paid the look."""
    tmp = tmp_path / "inbox" / "tmp"
    tmp.mkdir(parents=True)
    old = time.time() - 2 * 3600
    leftovers = [tmp / f".wake_{n}.0123456789abcdef.tmp" for n in range(20)]
    for path in leftovers:  # made first: on tmpfs a listing starts with the newest
        path.write_text("{")
        os.utime(path, (old, old))
    for n in range(5000):
        (tmp / f"junk{n}").touch()
    writer = InboxWriter(tmp_path)
    writer.queue(message("m_1"))
    assert not any(path.exists() for path in leftovers)
    late = tmp / ".wake_late.0123456789abcdef.tmp"
    late.write_text("{")
    os.utime(late, (old, old))
    writer.queue(message("m_2"))
    assert late.exists(), "looked at again within the hour"
    crowded = [r for r in caplog.records if "inbox/tmp holds 5020 entries" in r.getMessage()]
    assert len(crowded) == 1, caplog.text


def test_ack_lines_are_parsed_totally() -> None:
    good = b'{"id":"m_1","state":"delivered","at":"2026-05-01T12:00:00Z","via":"mcp"}'
    assert parse_ack(good) is not None and parse_ack(good).via == "mcp"  # type: ignore[union-attr]
    for bad in (b"", b"[]", b'{"id":"../x","state":"delivered"}', b'{"id":"m_1","state":"x"}'):
        assert parse_ack(bad) is None


RECORD = InboxRecord("m_1", "builder", "telegram", "-100", None, "42", T0.timestamp())
RUNNING = ActivitySummary(state="running", last_event_at=T0)

STATE_CASES = [
    ("running turn, fresh", RECORD, RUNNING, 10, "queued"),
    ("running turn, overdue", RECORD, RUNNING, 120, "unconfirmed"),
    ("idle session", RECORD, ActivitySummary(state="idle", last_event_at=T0), 999, "parked"),
    ("no host at all", RECORD, ActivitySummary(), 1, "unconfirmed"),
    ("exited", RECORD, ActivitySummary(state="exited", last_event_at=T0), 1, "unconfirmed"),
    ("acked", InboxRecord(**{**RECORD.__dict__, "outcome": "delivered"}), RUNNING, 1, "delivered"),
    (
        "cancelled",
        InboxRecord(**{**RECORD.__dict__, "outcome": "cancelled"}),
        RUNNING,
        1,
        "cancelled",
    ),
]


@pytest.mark.parametrize(
    ("name", "record", "activity", "after_s", "state"), STATE_CASES, ids=[c[0] for c in STATE_CASES]
)
def test_message_state(
    name: str, record: InboxRecord, activity: ActivitySummary, after_s: float, state: str
) -> None:
    now = T0 + timedelta(seconds=after_s)
    assert message_state(record, activity, now, unconfirmed_after_s=120)[0] == state


def test_state_line_says_parked_is_not_delivered() -> None:
    idle = ActivitySummary(state="idle", last_event_at=T0)
    line = state_line(RECORD, "parked", idle, T0, UTC)
    assert "parked" in line and "Not delivered yet" in line and "builder" in line


@pytest.mark.parametrize(
    ("agent_state", "state", "says"),
    [
        ("running", "queued", "the running turn's host hands it over"),
        ("waiting", "queued", "the running turn's host hands it over"),
        ("unknown", "queued", "builder's state is unknown, so no running turn is known"),
        ("no output", "queued", "builder has written nothing since it started, so no running"),
        ("running", "unconfirmed", "a turn is running but no host has acknowledged it"),
        ("unknown", "unconfirmed", "no host has acknowledged it yet (builder's state is unknown)"),
    ],
)
def test_a_state_line_promises_a_running_turn_only_when_one_runs(
    agent_state: AgentState, state: MessageState, says: str
) -> None:
    activity = ActivitySummary(state=agent_state, last_event_at=T0)
    assert says in state_line(RECORD, state, activity, T0, UTC)


def test_author_rate_is_a_sliding_window_per_author_and_agent() -> None:
    rate = AuthorRate(5, 10.0)
    assert all(rate.allow("ann", "builder", float(i)) for i in range(5))
    assert not rate.allow("ann", "builder", 5.0)
    assert rate.allow("bob", "builder", 5.0) and rate.allow("ann", "tester", 5.0)
    assert rate.allow("ann", "builder", 10.5)


def test_a_look_at_a_tmp_folder_filled_by_the_agent_stops_and_names_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent owns its `tmp/` and may fill it with millions of entries: the hourly look
    went through every one on the service's loop. It stops after `LEFTOVER_SCAN` entries
    (made small here, for the test's own speed) and says the folder holds more; the write
    itself goes through."""
    from taskcard.bridge.inbox import writer as writer_module

    monkeypatch.setattr(writer_module, "LEFTOVER_SCAN", 300)
    tmp = tmp_path / "inbox" / "tmp"
    tmp.mkdir(parents=True)
    for n in range(1000):
        (tmp / f"junk{n}").touch()
    InboxWriter(tmp_path).queue(message("m_1"))
    assert (tmp_path / "inbox" / "queued" / "m_1.json").exists()
    crowded = [
        r for r in caplog.records if "inbox/tmp holds more than 300 entries" in r.getMessage()
    ]
    assert len(crowded) == 1, caplog.text
