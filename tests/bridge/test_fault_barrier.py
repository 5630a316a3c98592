"""The service's per-agent fault barrier (`Service._guard`): a failing stage stays with its
agent, is listed for `taskcard status` by its type only, is logged once per episode, and is
cleared by the stage's next success; a cancellation is never taken for a fault."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from taskcard.bridge.config import load_config, parse_config
from taskcard.bridge.deliver.registry import build_channels
from taskcard.bridge.run.service import Service
from taskcard.bridge.store.base import NoticeState
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.producers.ledger.store import DEFAULT_LEDGER, Ledger
from taskcard.producers.task_card.contract import append_jsonl_line, atomic_write, utc_now_iso
from tests.e2e.harness import eventually, notify, publish
from tests.fakes.telegram_api import FakeTelegram

CHAT = 778
PERSON = 7


def test_a_failing_stage_is_listed_logged_once_and_cleared_by_a_success(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = parse_config(
        {
            "console": {"enabled": False},
            "state_dir": "state",
            "agents": [{"id": "a", "workdir": "a"}],
        },
        base_dir=tmp_path,
    )
    store = SqliteStore.in_dir(config.state_dir)
    try:
        service = Service(config, {}, store)
        caplog.set_level(logging.INFO, logger="taskcard.bridge.run.service")
        for attempt in range(3):
            with service._guard("a", "reading its files"):
                raise ValueError(f"secret-looking detail {attempt}")
        problems = service.agent_problems("a")
        assert problems == ["reading its files failed (ValueError); retried on the next change"]
        failures = [r for r in caplog.records if "reading its files failed" in r.getMessage()]
        assert len(failures) == 1 and failures[0].exc_info is not None  # once, with traceback
        assert all("secret-looking" not in p for p in problems)

        with service._guard("a", "notifying"):
            pass  # another stage's success clears nothing else
        assert len(service.agent_problems("a")) == 1
        with service._guard("a", "reading its files"):
            pass
        assert service.agent_problems("a") == []
        assert any("reading its files works again" in r.getMessage() for r in caplog.records)

        with pytest.raises(asyncio.CancelledError), service._guard("a", "notifying"):
            raise asyncio.CancelledError
        assert service.agent_problems("a") == []
    finally:
        store.close()


class OffsetWritesFail(SqliteStore):
    """The real store, except that while `failing` it refuses to save a followed file's
    offset with an error it raises through (`sqlite3.ProgrammingError`, the class the store
    keeps for its own bugs rather than the disk's): every refresh of an agent whose
    notification offset waits to be saved then raises, and the fault barrier catches it.
    While `notices_failing`, recording a notice (a report's signal) fails the same way."""

    failing = False
    notices_failing = False

    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        if self.failing:
            raise sqlite3.ProgrammingError("offset write refused (test)")
        super().set_offset(agent_id, name, inode, offset)

    def add_notice(self, route: str, notice_id: str, text: str, state: NoticeState) -> bool:
        if self.notices_failing:
            raise sqlite3.ProgrammingError("notice refused (test)")
        return super().add_notice(route, notice_id, text, state)


@dataclass
class Served:
    """A `Service` serving one agent, `trainer`, to a chat of a fake Telegram."""

    workdir: Path
    store: OffsetWritesFail
    service: Service
    fake: FakeTelegram

    def card(self) -> str:
        """The resident card's text (the bot's messages that are not notices)."""
        cards = [m.text for m in self.fake.bot_messages(CHAT) if "trainer" in m.text]
        cards = [text for text in cards if "training" in text or "evaluating" in text]
        assert len(cards) <= 1, cards  # one resident, edited in place
        return cards[0] if cards else ""


@contextlib.asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[Served]:
    """The service as `taskcard serve` wires it (the config file, the real channel and
    store), in this process so the store can be made to fail; the rescan is an hour away,
    so what reaches the chat came through the watcher."""
    workdir = tmp_path / "agents" / "trainer"
    workdir.mkdir(parents=True)
    config_path = tmp_path / "taskcard.toml"
    async with FakeTelegram() as fake:
        config_path.write_text(
            'state_dir = "state"\n[[agents]]\nid = "trainer"\nworkdir = "agents/trainer"\n'
            '[console]\nenabled = false\n[watch]\nbackend = "inotify"\n'
            "rescan_interval_s = 3600.0\n"
            f'[telegram]\ntoken_env = "TC_TEST_TOKEN"\napi_base_url = "{fake.base_url}"\n'
            f'poll_timeout_s = 1\n[[telegram.routes]]\nchat_id = {CHAT}\nagents = ["trainer"]\n'
            f"allowed_user_ids = [{PERSON}]\n"
        )
        config = load_config(config_path)
        store = OffsetWritesFail.in_dir(config.state_dir)
        channels = build_channels(config, store, {"TC_TEST_TOKEN": fake.token})
        service = Service(config, channels, store)
        stop = asyncio.Event()
        running = asyncio.create_task(service.run(stop))
        try:
            served = Served(workdir, store, service, fake)
            publish(workdir, "**training** card")
            await eventually(lambda: "training" in served.card(), what="the first card")
            yield served
        finally:
            stop.set()
            await running
            store.close()


def failing_stage(served: Served, stage: str) -> bool:
    failed = f"{stage} failed (ProgrammingError)"
    return any(failed in problem for problem in served.service.agent_problems("trainer"))


def write_lineage(workdir: Path, reason: str) -> None:
    lineage = {"parent": "lead", "reason": reason, "depth": 1}
    atomic_write(workdir / "lineage.json", json.dumps(lineage).encode())


async def test_a_refresh_that_raises_still_brings_ledger_and_lineage_rows_to_the_card(
    tmp_path: Path,
) -> None:
    """A failing refresh keeps the card's last good body, and a change of the ledger or of
    `lineage.json` still shows in its automatic slot at once, not at the agent's next change
    (nor at a rescan: the reading that failed was the one that saw the change)."""
    async with serving(tmp_path) as served:
        served.store.failing = True
        notify(served.workdir, "n-1", "recovered")  # its offset cannot be saved from now on
        await eventually(
            lambda: failing_stage(served, "reading its files"), what="the failing refresh"
        )
        Ledger(served.workdir / DEFAULT_LEDGER).init("train-7", "Train", ["prep", "train"])
        await eventually(
            lambda: "ledger train-7: NOT_STARTED" in served.card(),
            what="the ledger row while refreshes fail",
        )
        write_lineage(served.workdir, "split the training")
        await eventually(
            lambda: "spawned by lead: split the training" in served.card(),
            what="the lineage row while refreshes fail",
        )
        assert "training" in served.card()  # the last good body stays
        served.store.failing = False
        publish(served.workdir, "**evaluating** card")
        await eventually(lambda: "evaluating" in served.card(), what="the card after the fault")
        await eventually(
            lambda: not served.service.agent_problems("trainer"), what="the fault cleared"
        )


async def test_a_lineage_read_beside_a_failing_report_still_reaches_the_card(
    tmp_path: Path,
) -> None:
    """The lineage and a report change together (one batch of events: both are written
    before the service's loop runs again), and saving the report's offset fails after both
    were read: the lineage row still shows now, not at the agent's next change."""
    async with serving(tmp_path) as served:
        served.store.failing = True
        write_lineage(served.workdir, "split the training")
        append_jsonl_line(
            served.workdir / "reports" / "reports.jsonl",
            {"seq": 1, "at": utc_now_iso(), "channel": "cli", "ok": True},
        )
        await eventually(
            lambda: failing_stage(served, "reading its reports and inbox"),
            what="the failing follow-up of the reports",
        )
        await eventually(
            lambda: "spawned by lead: split the training" in served.card(),
            what="the lineage row read beside the failing report",
        )
        assert "training" in served.card()
        # The offset still cannot be saved; a later lineage change shows all the same (every
        # reading used to fail at its start, saving the offset, before it read anything).
        write_lineage(served.workdir, "tune the schedule")
        await eventually(
            lambda: "spawned by lead: tune the schedule" in served.card(),
            what="a later lineage row while the report's offset cannot be saved",
        )
        assert failing_stage(served, "reading its reports and inbox")


async def test_reports_and_acks_read_before_a_failure_are_acted_on_once_it_clears(
    tmp_path: Path,
) -> None:
    """A report's notice cannot be recorded, so the follow-up of a reading fails after the
    report and an inbox ack were read. Both used to be lost: the next reading saved the
    offsets past them (the report was taken as seen, the ack never reached the inbox desk,
    its chat status stayed queued). Now they are read again once the fault clears."""
    async with serving(tmp_path) as served:
        served.fake.inject_message(CHAT, "/tell trainer switch to the small model", PERSON)
        queued = served.workdir / "inbox" / "queued"
        [message] = await eventually(
            lambda: sorted(queued.glob("*.json")) if queued.is_dir() else None,
            what="the message in the inbox",
        )
        served.store.notices_failing = True
        append_jsonl_line(
            served.workdir / "reports" / "reports.jsonl",
            {"seq": 1, "at": utc_now_iso(), "channel": "cli", "ok": True, "summary": "done"},
        )
        os.rename(message, served.workdir / "inbox" / "taken" / message.name)
        append_jsonl_line(
            served.workdir / "inbox" / "acks.jsonl",
            {"id": message.stem, "state": "delivered", "at": utc_now_iso(), "via": "hook"},
        )
        await eventually(
            lambda: failing_stage(served, "reading its reports and inbox"),
            what="the failing follow-up of the reading",
        )
        served.store.notices_failing = False
        publish(served.workdir, "**evaluating** card")  # the next reading of the agent
        texts = lambda: [m.text for m in served.fake.bot_messages(CHAT)]  # noqa: E731
        await eventually(
            lambda: any("trainer reported (#1)" in text for text in texts()),
            what="the report's notice",
        )
        await eventually(
            lambda: any("✉ Message to" in t and "delivered" in t for t in texts()),
            what="the message's status: delivered",
        )
