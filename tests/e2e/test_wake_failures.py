"""A parent's wake that cannot be queued, through `taskcard serve` against the fake Bot API:
the wake it took back to join goes back whole, and the lost one comes once the inbox can be
written again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path

import pytest
import redis

from taskcard.bridge.run.inbox_desk import OWED_AGENTS_PLAUSIBLE
from taskcard.producers.task_card.contract import parse_iso, utc_now_iso
from tests.e2e.harness import ServeProcess, eventually, publish, run_cli
from tests.e2e.test_cluster import instance
from tests.e2e.test_inbox_faults import NO_OVERRIDE
from tests.e2e.test_orchestrator import spawned_by
from tests.e2e.test_talk_and_signals import (
    GROUP,
    SIGNALS,
    Chat,
    chat_for,
    queued,
    report,
    wait_said,
    workdir,
)
from tests.fakes.telegram_api import FakeTelegram

# Near the summary's 300 characters: twelve reports fill most of one wake's 4000.
FILLER = "steady progress " * 18


def lead_and_worker(tmp_path: Path) -> tuple[Path, Path]:
    """lead's and worker's workdirs, worker spawned by lead, each with a card to show."""
    lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
    spawned_by(worker, "lead")
    publish(worker, "**migrating**")
    publish(lead, "**leading**")
    return lead, worker


async def both_cards(chat: Chat) -> None:
    """Until the chat shows worker's card and lead's (the service serves both)."""
    await wait_said(chat, "migrating", "worker card")
    await wait_said(chat, "leading", "lead card")


def report_wake_files(tmp_path: Path) -> list[Path]:
    """lead's queued wakes about worker's reports ([] while one is withdrawn to join
    the next: the service takes it back to queue one carrying it too). A wake about one of
    worker's other signals (idle past `idle_floor_s` on a slow machine) may sit beside them."""
    try:
        return [
            p
            for p in queued(tmp_path, "lead")
            if p.is_file()  # not a folder put in a wake's way
            and "worker reported" in str(json.loads(p.read_text())["text"])
        ]
    except FileNotFoundError:
        return []


def kind_of(message: Path) -> object:
    """The `kind` of a queued inbox item (None once it is gone)."""
    try:
        return json.loads(message.read_text()).get("kind")
    except FileNotFoundError:
        return None


def report_wakes(tmp_path: Path) -> list[str]:
    """The texts of lead's queued wakes about worker's reports (`report_wake_files`)."""
    try:
        return [str(json.loads(p.read_text())["text"]) for p in report_wake_files(tmp_path)]
    except FileNotFoundError:
        return []


def report_wake_file(child: str, seq: int, at: str) -> str:
    """The name of the wake file the service writes for `child`'s report `seq` dated `at`
    (its id is derived from the report's episode)."""
    moment = parse_iso(at)
    assert moment is not None
    episode = f"signal:report:{seq}:{int(moment.timestamp() * 1000)}"
    return "wake_" + hashlib.sha256(f"{child}:{episode}".encode()).hexdigest()[:24] + ".json"


async def test_a_wake_that_cannot_be_queued_puts_back_whole_the_wake_it_took_back(
    tmp_path: Path,
) -> None:
    """worker's twelve reports wait in one wake in lead's inbox; the thirteenth does not fit
    with them, so its wake takes that one back to carry its head and is cut, and cannot be
    queued (a folder is in its way). The wake taken back is queued again as it was: it was
    written again with the cut text, and the reports the cut left out were lost."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = lead_and_worker(tmp_path)
        with chat.serve:
            await both_cards(chat)
            for seq in range(1, 13):
                report(worker, seq, ok=True, summary=f"part {seq} {FILLER}")
            await eventually(
                lambda: any("part 12 " in text for text in report_wakes(tmp_path)),
                what="one wake with the twelve reports",
            )
            [whole] = report_wakes(tmp_path)
            assert all(f"(#{seq})" in whole for seq in range(1, 13)), whole
            assert "left out" not in whole and len(whole) > 3600, len(whole)
            at = utc_now_iso()
            (lead / "inbox" / "queued" / report_wake_file("worker", 13, at)).mkdir()  # in the way
            report(worker, 13, ok=True, summary=f"part 13 {FILLER}", at=at)
            await wait_said(chat, "⚠ inbox:", "lead's card naming its inbox")
            assert report_wakes(tmp_path) == [whole]
            assert chat.serve.proc is not None and chat.serve.proc.poll() is None
            assert await chat.serve.aterminate() == 0


async def test_a_wake_taken_back_that_cannot_be_put_back_travels_in_the_owed_wake(
    tmp_path: Path,
) -> None:
    """worker's first two reports wait in one wake in lead's inbox. The third takes it back
    to carry it, and then nothing can be written: `inbox/tmp` is not writable by the service
    (run as root without the capabilities that pass over permissions), and the wake taken
    back cannot leave `inbox/cancelled`, sticky and another user's, as the file is. So the
    new wake, the move back and writing the wake taken back again all fail. Once the inbox
    works, the owed wake carries all three reports, and the copy in `cancelled/` goes. It
    carried only the third: the first two stayed in `cancelled/`, which no agent reads."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the service without permission overrides")
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = lead_and_worker(tmp_path)
        chat.serve = ServeProcess(chat.serve.config, env=chat.serve.env, prefix=NO_OVERRIDE)
        with chat.serve:
            await both_cards(chat)
            for seq in (1, 2):
                report(worker, seq, ok=True, summary=f"part {seq} done")
            await eventually(
                lambda: any("part 2 done" in text for text in report_wakes(tmp_path)),
                what="one wake with the first two reports",
            )
            [first] = report_wake_files(tmp_path)
            assert "part 1 done" in first.read_text()
            inbox, other_user = lead / "inbox", 54321
            os.chown(first, other_user, other_user)
            os.chown(inbox / "cancelled", other_user, other_user)
            (inbox / "cancelled").chmod(0o1777)
            (inbox / "tmp").chmod(0o500)
            report(worker, 3, ok=True, summary="part 3 done")
            await wait_said(chat, "⚠ inbox:", "lead's card naming its inbox")
            await eventually(
                lambda: (
                    "the wake about worker taken back could not be queued again" in chat.serve.logs
                ),
                what="the wake taken back failing to go back",
            )
            assert report_wakes(tmp_path) == []
            assert [p.name for p in queued(tmp_path, "lead", "cancelled")] == [first.name]
            os.chown(inbox / "cancelled", 0, 0)
            (inbox / "cancelled").chmod(0o700)
            (inbox / "tmp").chmod(0o700)
            [wake] = await eventually(
                lambda: report_wakes(tmp_path), timeout_s=60, what="the owed wake queued"
            )
            assert all(f"part {seq} done" in wake for seq in (1, 2, 3)), wake
            await eventually(
                lambda: queued(tmp_path, "lead", "cancelled") == [],
                what="the wake it carries gone from cancelled/",
            )
            assert await chat.serve.aterminate() == 0


def owed_in_state(tmp_path: Path) -> list[str]:
    """The keys of the owed wakes the service's state file keeps, read as an operator would."""
    with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db:
        query = "SELECT key FROM cursors WHERE substr(key, 1, 9) = 'owed-wake'"
        return sorted(str(key) for (key,) in db.execute(query))


async def test_a_wake_owed_when_the_service_stops_is_queued_after_its_restart(
    tmp_path: Path,
) -> None:
    """lead's `inbox` is a file when worker reports: the wake is owed. The service is stopped
    (SIGTERM) before the inbox works, the file is removed and the service started again: the
    owed wake is queued, with no other signal to bring it, and leaves the state. Kept in
    memory only, the restart forgot it and lead was never woken for that report. An owed
    wake in the state that the service would not have written is skipped, logged: one that
    names the wake it took back by an id with a line break after it among them (taken, as
    the id's pattern ended in `$`)."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = lead_and_worker(tmp_path)
        (lead / "inbox").write_text("not a folder\n")
        with chat.serve:
            await both_cards(chat)
            report(worker, 1, ok=True, summary="part 1 done")
            await wait_said(chat, "⚠ inbox:", "lead's card naming its inbox")
            assert await chat.serve.aterminate() == 0
        assert owed_in_state(tmp_path), "the owed wake is kept in the state"
        with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db:
            # The set of agents that owe wakes serves a cluster's look alone: not kept here.
            assert db.execute("SELECT key FROM cursors WHERE key LIKE 'set:%'").fetchall() == []
        (lead / "inbox").unlink()
        forged = {
            'owed-wake:["lead", "worker:forged"]': json.dumps({"child": "worker", "text": 7}),
            "owed-wake:not json": "{",
            # Nested past the JSON parser's depth: its RecursionError stopped the start.
            'owed-wake:["lead", "worker:deep"]': "[" * 100_000,
            "owed-wake:" + "[" * 100_000: "{}",
            # The wake it took back is named by an id with a line break after it.
            'owed-wake:["lead", "worker:signal:exit:9"]': json.dumps(
                {
                    "child": "worker",
                    "episode": "signal:exit:9",
                    "text": "worker exited",
                    "report": False,
                    "withdrawn": "wake_" + "0" * 24 + "\n",
                    "seq": 5,
                }
            ),
        }
        with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db, db:
            db.executemany("INSERT INTO cursors (key, value) VALUES (?, ?)", forged.items())
        with chat.restart():
            await eventually(
                lambda: any("part 1 done" in text for text in report_wakes(tmp_path)),
                timeout_s=60,
                what="the owed wake queued after the restart",
            )
            assert await chat.serve.aterminate() == 0
        assert len(report_wakes(tmp_path)) == 1
        assert chat.serve.logs.count("skipped: ") == len(forged), chat.serve.logs
        assert "skipped: a withdrawn wake that is no message id" in chat.serve.logs
        assert owed_in_state(tmp_path) == []


async def test_an_owed_wake_queued_before_a_stop_is_not_written_again_after_it(
    tmp_path: Path,
) -> None:
    """lead's owed wake is queued once its inbox works, and lead takes it. The service stops
    with the wake's rows still in its state, as a stop right after the write leaves them (or
    a state disk that failed then and held the change back): the restart finds the wake in
    lead's inbox and does not write it again. It was written again, and lead woken twice."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = lead_and_worker(tmp_path)
        (lead / "inbox").write_text("not a folder\n")
        state = tmp_path / ".taskcard" / "state.sqlite3"
        with chat.serve:
            await both_cards(chat)
            report(worker, 1, ok=True, summary="part 1 done")
            await wait_said(chat, "⚠ inbox:", "lead's card naming its inbox")
            with closing(sqlite3.connect(state)) as db:
                query = "SELECT key, value FROM cursors WHERE substr(key, 1, 9) = 'owed-wake'"
                rows = list(db.execute(query))
            assert rows
            (lead / "inbox").unlink()
            [wake] = await eventually(
                lambda: report_wake_files(tmp_path), timeout_s=60, what="the owed wake queued"
            )
            (lead / "inbox" / "taken").mkdir(exist_ok=True)
            wake.rename(lead / "inbox" / "taken" / wake.name)
            assert await chat.serve.aterminate() == 0
        with closing(sqlite3.connect(state)) as db, db:
            db.executemany("INSERT OR REPLACE INTO cursors (key, value) VALUES (?, ?)", rows)
        with chat.restart():
            await eventually(
                lambda: "the wake about worker owed is in its inbox already" in chat.serve.logs,
                timeout_s=60,
                what="the owed wake found in lead's inbox",
            )
            assert report_wake_files(tmp_path) == []
            assert await chat.serve.aterminate() == 0
        assert owed_in_state(tmp_path) == []


async def test_a_wake_cut_short_between_its_write_and_its_rename_is_queued_after_a_restart(
    tmp_path: Path,
) -> None:
    """lead's wake is owed (its `inbox` is a file) when the service stops. The inbox is made
    again holding what writes cut short between `inbox/tmp/` and the rename into `queued/`
    left (a crash there, two hours ago): a half file of that wake under the name versions
    before per-write names gave it, and one under a per-write name. The restart queues the
    wake, and the write deletes both. The half file once refused the wake at every try
    ('File exists; remove that file, which is in the way'), until the tries ran out."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = lead_and_worker(tmp_path)
        (lead / "inbox").write_text("not a folder\n")
        with chat.serve:
            await both_cards(chat)
            at = utc_now_iso()
            report(worker, 1, ok=True, summary="part 1 done", at=at)
            await wait_said(chat, "⚠ inbox:", "lead's card naming its inbox")
            assert await chat.serve.aterminate() == 0
        (lead / "inbox").unlink()
        for folder in ("queued", "taken", "cancelled", "tmp"):
            (lead / "inbox" / folder).mkdir(parents=True, mode=0o700)
        tmp = lead / "inbox" / "tmp"
        crashed = time.time() - 2 * 3600
        for half in (tmp / report_wake_file("worker", 1, at), tmp / ".m_1.0123456789abcdef.tmp"):
            half.write_text('{"v":1,"id":"wa')
            os.utime(half, (crashed, crashed))
        with chat.restart():
            await eventually(
                lambda: any("part 1 done" in text for text in report_wakes(tmp_path)),
                timeout_s=60,
                what="the owed wake queued over the half file",
            )
            assert list(tmp.iterdir()) == []
            assert await chat.serve.aterminate() == 0


async def test_a_wake_whose_write_a_stop_cut_short_is_queued_at_the_next_start(
    tmp_path: Path,
) -> None:
    """A stop during a wake's write leaves its notice recorded as pending (it is recorded
    first, so that the signal read again does not wake twice) and no file in the inbox: the
    state is set so by hand here, as such a stop leaves it. The next start queues that wake;
    one pending for longer than its tries would have taken is left alone. It was never
    written: the notice said the wake was known."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead_and_worker(tmp_path)
        with chat.serve:
            await both_cards(chat)
            assert await chat.serve.aterminate() == 0
        now = time.time()
        cut_short = [
            ("worker:signal:report:1:1", "📋 worker reported (#1): ok.\npart 1 done", now - 5),
            (
                "worker:signal:report:0:1",
                "📋 worker reported (#0): ok.\npart 0 done",
                now - 3 * 3600,
            ),
        ]
        with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db, db:
            db.executemany(
                "INSERT INTO notices (route, notice_id, text, state, created_at, updated_at)"
                " VALUES ('wake:lead', ?, ?, 'pending', ?, ?)",
                [(notice, text, at, at) for notice, text, at in cut_short],
            )
        with chat.restart():
            [wake] = await eventually(
                lambda: report_wakes(tmp_path), timeout_s=60, what="the wake cut short queued"
            )
            assert "part 1 done" in wake
            assert await chat.serve.aterminate() == 0
        assert report_wakes(tmp_path) == [wake]
        assert owed_in_state(tmp_path) == []


async def test_a_report_wake_taken_back_for_a_wake_a_stop_kept_unwritten_is_queued_again(
    tmp_path: Path,
) -> None:
    """worker's first report wakes lead. Its second takes that wake back (to `cancelled/`)
    for the wake carrying both, and the service stops before that wake is written: the
    state is set by hand as such a stop leaves it (the first wake in `cancelled/`, the
    take back noted with the wake to carry it, that wake's notice pending). The next start
    moves the first wake back to `queued/`, and the second report's wake goes alone. The
    first report stayed in `cancelled/`, which no agent reads."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = lead_and_worker(tmp_path)
        with chat.serve:
            await both_cards(chat)
            report(worker, 1, ok=True, summary="part 1 done")
            [first] = await eventually(
                lambda: report_wakes(tmp_path), timeout_s=60, what="the first report's wake"
            )
            assert await chat.serve.aterminate() == 0
        inbox = lead / "inbox"
        [queued_file] = report_wake_files(tmp_path)
        os.rename(queued_file, inbox / "cancelled" / queued_file.name)  # taken back
        at = utc_now_iso()
        carrier = report_wake_file("worker", 2, at)
        moment = parse_iso(at)
        assert moment is not None
        notice = f"worker:signal:report:2:{int(moment.timestamp() * 1000)}"
        with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db, db:
            db.execute(
                "INSERT INTO notices (route, notice_id, text, state, created_at, updated_at)"
                " VALUES ('wake:lead', ?, ?, 'pending', ?, ?)",
                (notice, "📋 worker reported (#2): ok.\npart 2 done", time.time(), time.time()),
            )
            db.execute(
                "UPDATE cursors SET value = ? WHERE key = ?",
                (
                    json.dumps([queued_file.stem, first, carrier.removesuffix(".json")]),
                    "report-wake:" + json.dumps(["lead", "worker"]),
                ),
            )
            assert db.total_changes == 2
        with chat.restart():
            await eventually(
                lambda: len(report_wakes(tmp_path)) == 2, timeout_s=60, what="both wakes queued"
            )
            wakes = report_wakes(tmp_path)
            assert first in wakes
            assert any("part 2 done" in w and "part 1 done" not in w for w in wakes), wakes
            assert not list((inbox / "cancelled").iterdir())
            await eventually(
                lambda: "is queued again" in chat.serve.logs, what="the put back logged"
            )
            assert await chat.serve.aterminate() == 0


async def test_hand_written_report_wake_rows_neither_stop_the_start_nor_move_a_message(
    tmp_path: Path,
) -> None:
    """The state keeps report-wake rows the service would not write: one whose parent is
    a list, one whose wake taken back names a person's message that lead's inbox keeps in
    `cancelled/`, and three whose keys are not two names. The service starts all the same,
    names each row once, wakes lead for worker's report, and leaves the person's message
    where it is. The first row stopped the start (a TypeError); the second moved the
    cancelled message back into `queued/`; the last three were skipped without a word and
    kept for good. Each is deleted once named, so the next start names none (the first two
    were named at every start), and a good row beside them (lead's report wake noted as
    still queued for worker) stays."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = lead_and_worker(tmp_path)
        with chat.serve:
            await both_cards(chat)
            assert await chat.serve.aterminate() == 0
        cancelled = lead / "inbox" / "cancelled"
        for folder in ("tmp", "queued", "taken", "cancelled"):
            (lead / "inbox" / folder).mkdir(parents=True, exist_ok=True)
        person = cancelled / "m_person1.json"
        person.write_text(json.dumps({"id": "m_person1", "text": "never mind"}))
        carrier = report_wake_file("worker", 9, utc_now_iso()).removesuffix(".json")
        forged = {
            "report-wake:" + json.dumps([["lead"], "worker"]): json.dumps(
                [carrier, "text", carrier]
            ),
            "report-wake:" + json.dumps(["lead", "worker"]): json.dumps(
                ["m_person1", "never mind", carrier]
            ),
            # Keys that are not two names: skipped without a word, and kept for good.
            "report-wake:" + json.dumps(["lead", "worker", "x"]): json.dumps([carrier, "text"]),
            "report-wake:not json": json.dumps([carrier, "text", carrier]),
            "report-wake:" + json.dumps(["", "worker"]): json.dumps([carrier, "text"]),
        }
        good = {"report-wake:" + json.dumps(["worker", "lead"]): json.dumps([carrier, "text"])}
        state = tmp_path / ".taskcard" / "state.sqlite3"
        with closing(sqlite3.connect(state)) as db, db:
            db.executemany(
                "INSERT INTO cursors (key, value) VALUES (?, ?)", [*forged.items(), *good.items()]
            )
        with chat.restart():
            report(worker, 1, ok=True, summary="part 1 done")
            await eventually(
                lambda: any("part 1 done" in text for text in report_wakes(tmp_path)),
                timeout_s=60,
                what="the report's wake queued after the start",
            )
            assert await chat.serve.aterminate() == 0
        assert person.is_file()
        assert not (lead / "inbox" / "queued" / person.name).exists()
        assert chat.serve.logs.count("report wake row") == len(forged), chat.serve.logs
        assert chat.serve.logs.count("skipped and deleted") == len(forged), chat.serve.logs
        with chat.restart():
            await eventually(lambda: "serving 2 agents" in chat.serve.logs, what="the start")
            assert await chat.serve.aterminate() == 0
        assert "report wake row" not in chat.serve.logs, chat.serve.logs
        with closing(sqlite3.connect(state)) as db:
            rows = dict(db.execute("SELECT key, value FROM cursors WHERE key LIKE 'report-wake:%'"))
        assert not forged.items() & rows.items(), rows
        assert rows.items() >= good.items(), rows
        assert person.is_file()


async def test_a_report_wake_row_naming_a_persons_message_takes_back_no_message(
    tmp_path: Path,
) -> None:
    """A person's text waits in lead's inbox, and the state notes it, by hand, as worker's
    report wake still queued there (a row of two items: an id and a text). After a restart
    worker reports: lead gets a wake of its own for it, the person's text stays queued as
    it was, and the row is named once in the log and deleted. The service took the text
    back as a wake: withdrawn from `queued/`, folded into the wake's text and deleted."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        _, worker = lead_and_worker(tmp_path)
        with chat.serve:
            await both_cards(chat)
            await chat.say("/tell lead please also check the docs")
            # Only the person's text: a start or idle wake of lead's may be queued first
            # on a loaded machine (SIGNALS has short floors).
            [person] = await eventually(
                lambda: [p for p in queued(tmp_path, "lead") if kind_of(p) == "message"],
                timeout_s=60,
                what="the person's text queued",
            )
            assert await chat.serve.aterminate() == 0
        said = json.loads(person.read_text())
        assert said["kind"] == "message" and said["text"] == "please also check the docs"
        row = "report-wake:" + json.dumps(["lead", "worker"])
        with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db, db:
            db.execute(
                "INSERT INTO cursors (key, value) VALUES (?, ?)",
                (row, json.dumps([said["id"], said["text"]])),
            )
        with chat.restart():
            report(worker, 1, ok=True, summary="part 1 done")
            [wake] = await eventually(
                lambda: report_wakes(tmp_path), timeout_s=60, what="the report's wake"
            )
            assert await chat.serve.aterminate() == 0
        assert "check the docs" not in wake
        assert json.loads(person.read_text()) == said  # still queued, as it was
        assert chat.serve.logs.count("report wake row") == 1, chat.serve.logs
        assert "a person's message" in chat.serve.logs
        with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db:
            [(kept,)] = db.execute("SELECT value FROM cursors WHERE key = ?", (row,))
        assert json.loads(kept)[1] == wake  # now worker's wake still queued


@pytest.fixture(params=["telegram", "feishu"])
def platform(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_wake_lost_to_a_broken_inbox_is_queued_once_the_inbox_works(
    platform: str, tmp_path: Path
) -> None:
    """lead's `inbox` is a file when worker reports: the wake cannot be queued and lead's card
    says so. Once the file is gone the wake is queued, with no other signal to bring it, and
    the line goes. It was lost before: only the next signal woke lead."""
    async with chat_for(platform, tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = lead_and_worker(tmp_path)
        (lead / "inbox").write_text("not a folder\n")
        with chat.serve:
            await both_cards(chat)
            report(worker, 1, ok=True, summary="part 1 done")
            # Announced in the same step as the wake is tried (another signal of worker's
            # may have failed to wake lead before).
            await wait_said(chat, "worker reported (#1)", "the report in the chat")
            await wait_said(chat, "⚠ inbox:", "lead's card naming its inbox")
            (lead / "inbox").unlink()
            await eventually(
                lambda: any("part 1 done" in text for text in report_wakes(tmp_path)),
                timeout_s=60,
                what="the lost wake queued once the inbox works",
            )
            await eventually(
                lambda: not any("⚠ inbox:" in t for t in chat.bot_texts()),
                what="lead's card without the inbox line",
            )
            assert "leading" in "\n".join(chat.bot_texts())
            assert await chat.serve.aterminate() == 0


async def lead_on_i0_worker_on_i1(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> tuple[ServeProcess, ServeProcess]:
    """Two instances: i0 serves lead; i1 serves worker, lead's child, and follows lead too, so
    worker's report is woken into lead's inbox by i1, which does not serve lead. lead's
    inbox is a file, so that wake fails on i1."""
    i0 = fleet.enter_context(
        instance(tmp_path, "i0", telegram, ["lead"], redis_url=redis_url, prefix=prefix)
    )
    await eventually(lambda: "agent lead: this instance serves it now" in i0.logs, what="lead")
    i1 = fleet.enter_context(
        instance(tmp_path, "i1", telegram, ["lead", "worker"], redis_url=redis_url, prefix=prefix)
    )
    await eventually(
        lambda: "agent worker: this instance serves it now" in i1.logs, what="worker on i1"
    )
    lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
    spawned_by(worker, "lead")
    (lead / "inbox").write_text("not a folder\n")
    return i0, i1


async def test_clustered_a_wake_into_an_agent_served_elsewhere_leaves_its_record_to_its_server(
    tmp_path: Path,
    telegram: FakeTelegram,
    redis_url: str,
    prefix: str,
    fleet: ExitStack,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """i0 serves lead; i1 serves worker and follows lead too, so worker's report is woken into
    lead's inbox by i1, which does not serve lead. lead's inbox is a file: the wake fails on
    i1, and i1 keeps that to itself. It wrote its view of lead into the shared record (and
    projected lead's card), over the record of lead's server, which never saw a failure."""
    i0, i1 = await lead_on_i0_worker_on_i1(tmp_path, telegram, redis_url, prefix, fleet)
    lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
    publish(lead, "**leading**")
    publish(worker, "**migrating**")

    def said(words: str) -> list[str]:
        return [m.text for m in telegram.bot_messages(GROUP) if words in m.text]

    await eventually(lambda: said("migrating") and said("leading"), timeout_s=60, what="cards")
    monkeypatch.setenv("TC_REDIS_URL", redis_url)  # for `taskcard status`

    def lead_record() -> str:
        status = run_cli("status", "--config", str(i0.config))
        return status.stdout.split("agent lead", 1)[-1].split("agent worker", 1)[0]

    report(worker, 1, ok=True, summary="part 1 done")
    await eventually(
        lambda: "agent lead: wake about worker not queued" in i1.logs,
        timeout_s=60,
        what="the wake failing on i1",
    )
    # i1 records a problem, when it does, in the same step as it logs the failure.
    assert "inbox" not in lead_record(), lead_record()
    assert not said("⚠ inbox:"), said("⚠ inbox:")
    for serve in (i0, i1):
        assert await serve.aterminate() == 0


async def test_clustered_a_wake_owed_by_a_stopped_instance_is_queued_by_the_agents_server(
    tmp_path: Path,
    telegram: FakeTelegram,
    redis_url: str,
    prefix: str,
    fleet: ExitStack,
) -> None:
    """i0 serves lead; i1 serves worker and follows lead too, so worker's report is woken into
    lead's inbox by i1. lead's inbox is a file: the wake fails on i1 and is owed there. i1 is
    stopped before the inbox works again: i0, which holds lead's lease, finds the owed wake
    i1 left in Redis and queues it once the inbox works. Kept by i1 alone, it went with i1.
    Owed wakes in Redis that no instance would have written are skipped with one line each,
    and so are members of the set of agents that owe wakes that no instance adds (not UTF-8,
    200,000 bytes), and removed from it. Once the wake is queued, i0's look removes lead's
    rows and lead from that set. The odd members stayed, read at every look for good."""
    forged = {
        'owed-wake:["lead", "worker:forged"]': json.dumps({"child": "worker", "text": 7}),
        "owed-wake:not json": "{",
    }
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.hset(f"{prefix}:cursors", mapping=forged)
    finally:
        client.close()
    owing = f"{prefix}:set:owed-wakes"  # the agents that owe wakes; these two no instance adds
    with closing(redis.Redis.from_url(redis_url)) as raw:
        raw.sadd(owing, b"\xffnot utf-8", b"H" * 200_000)
    i0, i1 = await lead_on_i0_worker_on_i1(tmp_path, telegram, redis_url, prefix, fleet)
    lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
    publish(worker, "**migrating**")
    report(worker, 1, ok=True, summary="part 1 done")
    await eventually(
        lambda: "agent lead: wake about worker not queued" in i1.logs,
        timeout_s=60,
        what="the wake failing on i1",
    )
    assert await i1.aterminate() == 0
    (lead / "inbox").unlink()
    await eventually(
        lambda: any("part 1 done" in text for text in report_wakes(tmp_path)),
        timeout_s=120,
        what="the wake i1 owed queued by i0",
    )
    assert "agent lead: 1 wake owed to its inbox taken up from the state" in i0.logs
    assert i0.logs.count("skipped: ") == len(forged), i0.logs
    assert len(report_wakes(tmp_path)) == 1
    await eventually(
        lambda: lead_owes_none(redis_url, prefix), timeout_s=120, what="lead no longer owing"
    )
    # Each named once, though read at every look (the holder's look, every 30 s: the wake
    # may be queued before it comes round).
    # Named by whichever instance read the set first (and removed by it): i1 too, before it
    # stopped, when its read came before i0's look.
    odd = await eventually(
        lambda: (
            (lines := [line for line in (i0.logs + i1.logs).splitlines() if owing in line])[1:]
            and lines
        ),
        timeout_s=120,
        what="the odd members named",
    )
    assert len(odd) == 2 and "not UTF-8" in odd[0] + odd[1], odd
    assert all(len(line) < 1000 for line in odd), odd
    with closing(redis.Redis.from_url(redis_url)) as raw:
        assert raw.smembers(owing) == set(), "the odd members removed once named"
    assert await i0.aterminate() == 0


def lead_owes_none(redis_url: str, prefix: str) -> bool:
    """Whether Redis keeps no wake owed to lead, nor lead as an agent that owes some."""
    with closing(redis.Redis.from_url(redis_url, decode_responses=True)) as client:
        rows = [key for key in client.hkeys(f"{prefix}:cursors") if key.startswith("owed-wake")]
        return rows == [] and not client.sismember(f"{prefix}:set:owed-wakes", "lead")


def redis_commands(log: Path, prefix: str) -> list[str]:
    """The commands MONITOR wrote into `log` that name a key under `prefix`."""
    with open(log, "rb") as lines:
        return [
            line.decode(errors="backslashreplace")
            for line in lines
            if f'"{prefix}:'.encode() in line
        ]


@contextmanager
def monitored(redis_url: str, log: Path) -> Iterator[None]:
    """Every command the Redis at `redis_url` runs meanwhile, written into `log` (MONITOR)."""
    with open(log, "wb") as out:
        monitor = subprocess.Popen(
            ["redis-cli", "-u", redis_url, "monitor"], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield
    finally:
        monitor.terminate()
        monitor.wait(timeout=30)


async def test_clustered_the_look_for_owed_wakes_reads_no_row_per_agent_held(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """An instance holding forty idle agents' leases looks every 30 s for wakes another
    instance left them (`OWED_LOOK_S`). Watched on the real Redis with MONITOR from one look
    to the next, a look reads the set of agents that owe wakes, one command whatever the
    number held, and no agent's row: none owes any. It read the row of tries of each agent
    held (an HMGET of forty fields here; ten thousand per instance every 30 s for a fleet of
    ten thousand agents)."""
    agents = [f"agent{n}" for n in range(40)]
    watched = tmp_path / "monitor.log"
    with monitored(redis_url, watched):
        i0 = fleet.enter_context(
            instance(tmp_path, "i0", telegram, agents, redis_url=redis_url, prefix=prefix)
        )
        await eventually(
            lambda: all(f"agent {a}: this instance serves it now" in i0.logs for a in agents),
            timeout_s=120,
            what="every agent's lease held",
        )

        def looks() -> list[str]:
            return [
                line
                for line in redis_commands(watched, prefix)
                if f'"SMEMBERS" "{prefix}:set:owed-wakes"' in line
                or ('"HMGET"' in line and '"owed-wake-tries:' in line)
            ]

        await eventually(lambda: len(looks()) >= 2, timeout_s=120, what="two looks")
        read_rows = [
            line for line in redis_commands(watched, prefix) if '"owed-wake-tries:' in line
        ]
        assert read_rows == [], read_rows[:2]
        assert "the wakes other instances owe were not read" not in i0.logs
        assert await i0.aterminate() == 0


async def test_clustered_a_wrong_typed_set_of_agents_owing_wakes_loses_no_wake(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """The key of the set of agents that owe wakes holds a string (another program on the
    prefix). lead's inbox is a file when worker reports: the wake fails, and its row is kept
    in Redis all the same; once the inbox works it is queued. The log names the key and the
    fix once, though every look reads the set. The refused mark stopped the row being
    written: the wake was lost, and the look logged Redis's bare WRONGTYPE every 30 s."""
    watched = tmp_path / "monitor.log"
    fleet.enter_context(monitored(redis_url, watched))
    i0 = fleet.enter_context(
        instance(tmp_path, "i0", telegram, ["lead", "worker"], redis_url=redis_url, prefix=prefix)
    )
    await eventually(
        lambda: (
            "agent worker: this instance serves it now" in i0.logs
            and "agent lead: this instance serves it now" in i0.logs
        ),
        what="both agents served",
    )
    owing = f"{prefix}:set:owed-wakes"
    with closing(redis.Redis.from_url(redis_url, decode_responses=True)) as client:
        client.set(owing, "not a set")
    lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
    spawned_by(worker, "lead")
    (lead / "inbox").write_text("not a folder\n")
    report(worker, 1, ok=True, summary="part 1 done")
    await eventually(
        lambda: "agent lead: wake about worker not queued" in i0.logs,
        timeout_s=60,
        what="the wake failing",
    )
    with closing(redis.Redis.from_url(redis_url, decode_responses=True)) as client:
        rows = [k for k in client.hkeys(f"{prefix}:cursors") if k.startswith('owed-wake:["lead"')]
    assert len(rows) == 1, (rows, i0.logs)
    (lead / "inbox").unlink()
    await eventually(
        lambda: any("part 1 done" in text for text in report_wakes(tmp_path)),
        timeout_s=120,
        what="the owed wake queued once the inbox works",
    )

    def looks_since() -> int:
        commands = redis_commands(watched, prefix)
        made = max(i for i, line in enumerate(commands) if f'"SET" "{owing}"' in line)
        return sum(f'"SMEMBERS" "{owing}"' in line for line in commands[made:])

    await eventually(lambda: looks_since() >= 2, timeout_s=150, what="two looks")
    refused = [line for line in i0.logs.splitlines() if "WRONGTYPE" in line or owing in line]
    assert len(refused) == 1 and "key_prefix" in refused[0], refused
    assert len(report_wakes(tmp_path)) == 1
    assert await i0.aterminate() == 0


def owed_row(agent: str) -> tuple[str, str]:
    """A stored owed wake for `agent` as an instance writes one (field, value)."""
    field = "owed-wake:" + json.dumps([agent, "worker:signal:exit:1"])
    value = {
        "child": "worker",
        "episode": "signal:exit:1",
        "text": "worker exited",
        "report": False,
        "withdrawn": None,
        "seq": 0,
    }
    return field, json.dumps(value)


async def test_clustered_members_of_agents_nobody_serves_go_once_they_owe_nothing(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """The set of agents that owe wakes names `ghost`, written by hand with a row of tries
    and no wake, and 10,001 agents no instance serves whose wakes Redis keeps (a cluster
    keeps a departed agent's state for its return). Two instances serving other agents look
    every 30 s: `ghost` is removed with its row of tries, the others stay with their rows,
    the set's key and size are named in each instance's log once, and after the first
    looks no look reads the owed rows again. `ghost` stayed for good, read at every look."""
    owing = f"{prefix}:set:owed-wakes"
    gone = [f"gone{n}" for n in range(OWED_AGENTS_PLAUSIBLE + 1)]
    with closing(redis.Redis.from_url(redis_url, decode_responses=True)) as client:
        pipe = client.pipeline(transaction=False)
        pipe.sadd(owing, "ghost", *gone)
        pipe.hset(f"{prefix}:cursors", "owed-wake-tries:ghost", '{"tries": 1, "due_s": 0}')
        pipe.hset(f"{prefix}:cursors", mapping=dict(owed_row(agent) for agent in gone))
        pipe.execute()
    watched = tmp_path / "monitor.log"
    fleet.enter_context(monitored(redis_url, watched))
    serves = [
        fleet.enter_context(
            instance(tmp_path, name, telegram, [agent], redis_url=redis_url, prefix=prefix)
        )
        for name, agent in (("i0", "lead"), ("i1", "worker"))
    ]

    def said_many(serve: ServeProcess) -> list[str]:
        return [line for line in serve.logs.splitlines() if "agents are marked as owing" in line]

    def ghost_gone() -> bool:
        with closing(redis.Redis.from_url(redis_url, decode_responses=True)) as client:
            return not client.sismember(owing, "ghost") and not client.hexists(
                f"{prefix}:cursors", "owed-wake-tries:ghost"
            )

    await eventually(ghost_gone, timeout_s=60, what="ghost removed with its row of tries")
    await eventually(
        lambda: any("1 agent removed from Redis key" in serve.logs for serve in serves),
        what="the removal logged",
    )
    await eventually(
        lambda: all(said_many(serve) for serve in serves), timeout_s=120, what="both looked"
    )

    def smembers() -> list[int]:
        commands = redis_commands(watched, prefix)
        return [i for i, line in enumerate(commands) if f'"SMEMBERS" "{owing}"' in line]

    # Two more looks: each instance's first one is over (one look every 30 s each).
    after = len(smembers())
    await eventually(lambda: len(smembers()) >= after + 2, timeout_s=150, what="two looks")
    since = smembers()[after + 1]
    await eventually(lambda: len(smembers()) >= after + 5, timeout_s=150, what="three looks more")
    rows_read = [
        line
        for line in redis_commands(watched, prefix)[since:]
        if '"HSCAN"' in line and "owed-wake" in line
    ]
    assert rows_read == [], rows_read[:2]
    for serve in serves:
        [line] = said_many(serve)  # once, though every look reads the set
        assert owing in line and "10,00" in line and "key_prefix" in line, line
    with closing(redis.Redis.from_url(redis_url, decode_responses=True)) as client:
        assert client.smembers(owing) == set(gone)
        rows = [key for key in client.hkeys(f"{prefix}:cursors") if key.startswith("owed-wake:")]
        assert len(rows) == len(gone)
    for serve in serves:
        assert await serve.aterminate() == 0


async def test_clustered_a_report_wake_taken_back_for_a_wake_a_stop_kept_unwritten_is_queued_again(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """Clustered: i0 serves lead and worker, lead's child. worker's first report wakes lead;
    i0 stops, and Redis and lead's inbox are set as a stop between the second report's take
    back and its wake's write leaves them (the first wake in `cancelled/`, the take back
    noted with the wake to carry it). When an instance gains lead's lease (i2, beside i1
    serving another agent), it moves the first wake back to `queued/`; the next report of
    worker joins it. Clustered, no start read the note: the wake stayed in `cancelled/`,
    which no agent reads, and the next report dropped the note."""
    i0 = fleet.enter_context(
        instance(tmp_path, "i0", telegram, ["lead", "worker"], redis_url=redis_url, prefix=prefix)
    )
    lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
    spawned_by(worker, "lead")
    await eventually(
        lambda: (
            "agent worker: this instance serves it now" in i0.logs
            and "agent lead: this instance serves it now" in i0.logs
        ),
        what="both agents served",
    )
    report(worker, 1, ok=True, summary="part 1 done")
    [first] = await eventually(
        lambda: report_wakes(tmp_path), timeout_s=60, what="the first report's wake"
    )
    assert await i0.aterminate() == 0
    [queued_file] = report_wake_files(tmp_path)
    os.rename(queued_file, lead / "inbox" / "cancelled" / queued_file.name)  # taken back
    carrier = report_wake_file("worker", 2, utc_now_iso()).removesuffix(".json")
    with closing(redis.Redis.from_url(redis_url, decode_responses=True)) as client:
        client.hset(
            f"{prefix}:cursors",
            "report-wake:" + json.dumps(["lead", "worker"]),
            json.dumps([queued_file.stem, first, carrier]),
        )
    fleet.enter_context(
        instance(tmp_path, "i1", telegram, ["other"], redis_url=redis_url, prefix=prefix)
    )
    i2 = fleet.enter_context(
        instance(tmp_path, "i2", telegram, ["lead", "worker"], redis_url=redis_url, prefix=prefix)
    )
    await eventually(
        lambda: report_wakes(tmp_path) == [first], timeout_s=120, what="the first wake put back"
    )
    assert not list((lead / "inbox" / "cancelled").iterdir())
    # The file moves before the line is logged, and the log is read from a pipe: waited for.
    await eventually(lambda: "is queued again" in i2.logs, what="the put back logged")
    report(worker, 2, ok=True, summary="part 2 done")
    await eventually(
        lambda: any("part 1 done" in w and "part 2 done" in w for w in report_wakes(tmp_path)),
        timeout_s=60,
        what="the next report joining the wake put back",
    )
    assert len(report_wakes(tmp_path)) == 1
