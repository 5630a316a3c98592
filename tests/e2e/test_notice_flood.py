"""Issue 8, item 14: a flood of notices from one agent is capped per route and folded.

500 distinct notifications arrive at once; the chat gets at most the configured cap of
notices plus one summary that accounts for every other one, each folded notice is recorded
as folded in the state, and a restart posts nothing again.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import STATE_FILE
from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, notify, publish, telegram_config
from tests.fakes.telegram_api import FakeTelegram

GROUP = -1001234567890
CAP = 4
ERRORS, RECOVERIES = 450, 50
SUMMARY = re.compile(r"(\d+) more from builder: (\d+) errors, (\d+) recoveries")


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def serve(tmp_path: Path, fake: FakeTelegram) -> ServeProcess:
    extra = ["[notices]", f"max_per_minute = {CAP}"]
    config = telegram_config(tmp_path, fake.base_url, GROUP, extra=extra)
    return ServeProcess(config, env={TOKEN_ENV: fake.token})


def notices(fake: FakeTelegram) -> list[str]:
    return [
        m.text for m in fake.bot_messages(GROUP) if "task card" in m.text or "more from" in m.text
    ]


def summarised(fake: FakeTelegram) -> int:
    return sum(int(match.group(1)) for t in notices(fake) for match in SUMMARY.finditer(t))


def notice_states(tmp_path: Path) -> dict[str, int]:
    with sqlite3.connect(tmp_path / ".taskcard" / STATE_FILE) as db:
        rows = db.execute("SELECT state, COUNT(*) FROM notices GROUP BY state").fetchall()
    return {state: count for state, count in rows}


async def test_500_errors_reach_the_chat_as_cap_plus_one_summary(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    workdir = tmp_path / "agents" / "builder"
    with serve(tmp_path, fake) as first:
        publish(workdir, "building")
        await eventually(lambda: fake.bot_messages(GROUP), what="the card")
        for number in range(ERRORS + RECOVERIES):
            if number % 10 == 9:
                notify(workdir, f"task_card.recovered:tc_1:{number}", "recovered")
            else:
                notify(
                    workdir,
                    f"task_card.error:tc_1:{number}:renderer_nonzero_exit",
                    "error",
                    code="renderer_nonzero_exit",
                )
        await eventually(
            lambda: (
                len(notices(fake)) - 1 + summarised(fake) == ERRORS + RECOVERIES
                and summarised(fake) > 0
            ),
            timeout_s=150.0,
            what="the capped notices and the summary",
        )
        assert await first.aterminate() == 0
    shown = notices(fake)
    assert len(shown) == CAP + 1
    (summary,) = [t for t in shown if "more from" in t]
    match = SUMMARY.search(summary)
    assert match is not None
    folded, errors, recoveries = (int(group) for group in match.groups())
    assert folded == ERRORS + RECOVERIES - CAP == errors + recoveries
    states = notice_states(tmp_path)
    assert states.get("folded") == folded
    assert states.get("delivered") == CAP + 1

    # A restart reads nothing new and posts nothing again.
    before = len(fake.bot_messages(GROUP))
    with serve(tmp_path, fake) as again:
        fake.inject_command(GROUP, "/taskcard")
        await eventually(lambda: any("Task cards here" in m.text for m in fake.bot_messages(GROUP)))
        assert await again.aterminate() == 0
    assert len(fake.bot_messages(GROUP)) == before + 1
    assert notice_states(tmp_path) == states
