"""Wakes of a chat's orchestrator against hostile agent files, through `taskcard serve`
against the fake Bot API and Feishu: an orchestrator whose inbox cannot be written, an agent
that reports faster than the orchestrator takes its wakes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskcard.producers.task_card.contract import utc_now_iso
from tests.e2e.harness import eventually, publish
from tests.e2e.test_orchestrator import wake_texts
from tests.e2e.test_talk_and_signals import SIGNALS, chat_for, report, wait_said, workdir


@pytest.fixture(params=["telegram", "feishu"])
def platform(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_an_orchestrator_whose_inbox_is_not_a_folder_shows_it_on_its_card(
    platform: str, tmp_path: Path
) -> None:
    """lead's `inbox` made a file: worker's report still reaches the chat, and lead's card
    says its inbox cannot be written and how to fix it (the wake was only logged before);
    once the file is gone the next report wakes lead and the line goes."""
    async with chat_for(platform, tmp_path, ["lead", "worker"], SIGNALS) as chat:
        with chat.config.open("a") as config:  # the route's table is the file's last
            config.write('orchestrator = "lead"\n')
        lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
        (lead / "inbox").write_text("not a folder\n")
        publish(worker, "**migrating**")
        publish(lead, "**leading**")
        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            await wait_said(chat, "leading", "lead card")
            report(worker, 1, ok=True, summary="part 1 done")
            await wait_said(chat, "worker reported (#1)", "worker's report in the chat")
            card = await wait_said(chat, "⚠ inbox:", "lead's card naming its inbox")
            assert "leading" in card and "worker" not in card.split("⚠")[0], card
            assert "inbox is a symlink or not a directory" in card, card
            assert "remove it so the service can create a real folder" in card, card
            assert chat.serve.proc is not None and chat.serve.proc.poll() is None
            (lead / "inbox").unlink()
            report(worker, 2, ok=True, summary="part 2 done")
            # The wake about part 1 is owed and part 2's waits behind it, both written at
            # the owed wake's next try: its backoff doubles from 5 s (5, 10, 20, 40 s), and
            # on a loaded machine the card above may take a few tries' time to show.
            await eventually(
                lambda: settled_wakes(tmp_path, "part 2 done"),
                timeout_s=180,
                what="lead woken once its inbox is a folder",
            )
            await eventually(
                lambda: not any("⚠ inbox:" in t for t in chat.bot_texts()),
                what="lead's card without the inbox line",
            )
            assert "leading" in "\n".join(chat.bot_texts())
            assert await chat.serve.aterminate() == 0


def settled_wakes(tmp_path: Path, words: str = "") -> list[str]:
    """`wake_texts` of lead about worker (holding `words`), [] while one of them was
    withdrawn as it was read (the service takes back the wake still queued to queue one
    carrying it too)."""
    try:
        return wake_texts(tmp_path, "lead", "worker", words)
    except FileNotFoundError:
        return []


async def test_a_flood_of_reports_leaves_the_orchestrator_one_wake(
    platform: str, tmp_path: Path
) -> None:
    """worker writes 150 reports at once, more than one wake's text holds: lead is left one
    wake about worker, from the first report's pointer to the newest, the ones between
    left out with how to read them. Each wake that could take no more went alone before,
    so a child reporting fast put a full wake in the orchestrator's inbox after another."""
    async with chat_for(platform, tmp_path, ["lead", "worker"], SIGNALS) as chat:
        with chat.config.open("a") as config:  # the route's table is the file's last
            config.write('orchestrator = "lead"\n')
        worker = workdir(tmp_path, "worker")
        publish(worker, "**migrating**")
        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            lines = [
                {
                    "seq": seq,
                    "at": utc_now_iso(),
                    "ok": True,
                    "channel": "cli",
                    "summary": f"step {seq} done " + "." * 60,
                }
                for seq in range(1, 151)
            ]
            (worker / "reports").mkdir()
            with (worker / "reports" / "reports.jsonl").open("a") as reports:
                reports.write("".join(json.dumps(line) + "\n" for line in lines))
            await eventually(
                lambda: any("step 150 done" in t for t in settled_wakes(tmp_path)),
                timeout_s=60,
                what="lead's wake with the newest report",
            )
            [wake] = [t for t in settled_wakes(tmp_path) if "reported" in t]
            assert "Read report #1:" in wake and "--after 0" in wake, wake
            assert "reports in between left out" in wake, wake
            assert "step 150 done" in wake, wake
            # The wakes it replaced are not kept: their texts travel in this one.
            cancelled = workdir(tmp_path, "lead") / "inbox" / "cancelled"
            assert list(cancelled.glob("wake_*.json")) == []
            assert chat.serve.proc is not None and chat.serve.proc.poll() is None
            assert await chat.serve.aterminate() == 0
