"""A ledger block escalated by the monitor reaches the Telegram chat as a notice, built from
typed fields only (never the agent's free-text reason); the resident card shows the
ledger's state and next gate in its automatic slot."""

from __future__ import annotations

import html
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.e2e.harness import (
    TOKEN_ENV,
    ServeProcess,
    eventually,
    publish,
    run_cli,
    telegram_config,
)
from tests.e2e.test_serve_feishu import Setup, card_texts
from tests.e2e.test_talk_and_signals import chat_for, wait_said, workdir
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

CHAT = 778


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def ledger(workdir: Path, *args: str) -> None:
    done = run_cli("ledger", *args, "--workdir", str(workdir))
    assert done.returncode == 0, done.stderr


async def test_blocked_escalate_reaches_the_chat(tmp_path: Path, fake: FakeTelegram) -> None:
    config = telegram_config(tmp_path, fake.base_url, CHAT, ("trainer",))
    workdir = tmp_path / "agents" / "trainer"
    secret_reason = "token sk-live-123 rejected at /home/me/keys"
    with ServeProcess(config, env={TOKEN_ENV: fake.token}) as serve:
        ledger(workdir, "init", "train-7", "--purpose", "Train", "--steps", "prep,train")
        ledger(workdir, "checkpoint", "train-7", "--event-type", "STARTED")
        ledger(
            workdir,
            "block",
            "train-7",
            "--kind",
            "MISSING_ACCESS",
            "--step",
            "train",
            "--reason",
            secret_reason,
        )
        publish(workdir, "**training** card")
        await eventually(
            lambda: any(
                "ledger train-7: BLOCKED" in m.text and "decision on block MISSING_ACCESS" in m.text
                for m in fake.bot_messages(CHAT)
            ),
            what="the ledger row in the automatic slot",
            timeout_s=60,
        )
        ledger(workdir, "supervise", "--apply-supervision")
        notice = await eventually(
            lambda: next((m.text for m in fake.bot_messages(CHAT) if "blocked" in m.text), None),
            what="the block notice",
            timeout_s=60,
        )
        assert "trainer" in notice and "train-7" in notice and "MISSING_ACCESS" in notice
        assert "sk-live" not in notice and "/home" not in notice
        ledger(workdir, "supervise", "--apply-supervision")  # idempotent: no second notice
        lines = (workdir / ".notification" / "system.jsonl").read_text().splitlines()
        assert len([line for line in lines if '"ledger.blocked"' in line]) == 1
        assert await serve.aterminate() == 0


async def test_a_ledger_change_alone_updates_the_card(tmp_path: Path, fake: FakeTelegram) -> None:
    """The card is not published again: the ledger's own change brings its row up to date."""
    config = telegram_config(tmp_path, fake.base_url, CHAT, ("trainer",))
    workdir = tmp_path / "agents" / "trainer"
    with ServeProcess(config, env={TOKEN_ENV: fake.token}) as serve:
        publish(workdir, "**training** card")
        await eventually(
            lambda: any("training" in m.text for m in fake.bot_messages(CHAT)),
            what="the first card",
            timeout_s=60,
        )
        assert not any("ledger" in m.text for m in fake.bot_messages(CHAT))
        ledger(workdir, "init", "train-7", "--purpose", "Train", "--steps", "prep,train")
        await eventually(
            lambda: any("ledger train-7: NOT_STARTED" in m.text for m in fake.bot_messages(CHAT)),
            what="the ledger row after init",
            timeout_s=60,
        )
        ledger(workdir, "checkpoint", "train-7", "--event-type", "STARTED")
        await eventually(
            lambda: any("ledger train-7: RUNNING" in m.text for m in fake.bot_messages(CHAT)),
            what="the ledger row after a checkpoint",
            timeout_s=60,
        )
        assert len(fake.bot_messages(CHAT)) == 1  # the resident, edited in place
        assert await serve.aterminate() == 0


def rows_showing(texts: list[str], row: str) -> int:
    return sum(row in text for text in texts)


async def test_agents_sharing_a_workdir_both_see_a_ledger_change(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """Two agents may share one workdir (the watcher names the ledger to both): a ledger
    change alone brings both cards up to date, not only the first agent read."""
    workdir = tmp_path / "agents" / "shared"
    workdir.mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        '[[agents]]\nid = "trainer"\nworkdir = "agents/shared"\n'
        '[[agents]]\nid = "twin"\nworkdir = "agents/shared"\n'
        f'[telegram]\ntoken_env = "TC_TEST_TOKEN"\napi_base_url = "{fake.base_url}"\n'
        "poll_timeout_s = 1\n"
        f'[[telegram.routes]]\nchat_id = {CHAT}\nagents = ["*"]\n'
    )
    with ServeProcess(config, env={TOKEN_ENV: fake.token}) as serve:
        publish(workdir, "**training** card")
        ledger(workdir, "init", "train-7", "--purpose", "Train", "--steps", "prep,train")
        texts = lambda: [m.text for m in fake.bot_messages(CHAT)]  # noqa: E731
        await eventually(
            lambda: rows_showing(texts(), "ledger train-7: NOT_STARTED") == 2,
            what="both cards with the ledger row",
            timeout_s=60,
        )
        ledger(workdir, "checkpoint", "train-7", "--event-type", "STARTED")
        await eventually(
            lambda: rows_showing(texts(), "ledger train-7: RUNNING") == 2,
            what="both cards after a ledger change alone",
            timeout_s=60,
        )
        assert len(texts()) == 2  # the two residents, edited in place
        assert await serve.aterminate() == 0


async def test_agents_sharing_a_workdir_both_see_a_ledger_change_in_feishu(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, feishu, ["shared"])
    config = setup.config.read_text()
    setup.config.write_text(
        config.replace(
            "[feishu]\n", '[[agents]]\nid = "twin"\nworkdir = "agents/shared"\n[feishu]\n'
        )
    )
    workdir = tmp_path / "agents" / "shared"
    with setup.serve() as serve:
        publish(workdir, "**training** card")
        ledger(workdir, "init", "train-7", "--purpose", "Train", "--steps", "prep,train")
        await eventually(
            lambda: rows_showing(card_texts(feishu), "ledger train-7: NOT_STARTED") == 2,
            what="both cards with the ledger row",
            timeout_s=60,
        )
        ledger(workdir, "checkpoint", "train-7", "--event-type", "STARTED")
        await eventually(
            lambda: rows_showing(card_texts(feishu), "ledger train-7: RUNNING") == 2,
            what="both cards after a ledger change alone",
            timeout_s=60,
        )
        assert len(card_texts(feishu)) == 2  # the two residents, patched in place
        assert await serve.aterminate() == 0


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_ledger_written_by_other_tooling_counts_its_truth(
    platform: str, tmp_path: Path
) -> None:
    """An agent's own tooling wrote the ledger: the task and its observed truth (a step in
    progress a moment ago), no `last_delta_at` (the ledger commands' bookkeeping) and a
    `derived` claiming completion. The monitor counted nothing observed (NO_TRUTH, next gate
    unknown) and measured idleness from the task's creation, waking the agent about progress
    it had just made, and the chat's row kept the hand-written COMPLETED until some command
    wrote the task again. Supervision now takes the truths' own times and writes the
    projection back, so the row follows the truth."""
    async with chat_for(platform, tmp_path, ["fetcher"]) as chat:
        wd = workdir(tmp_path, "fetcher")
        now = datetime.now(UTC).isoformat()
        task = {
            "task": {"task_id": "dl", "purpose": "fetch", "created_at": "2026-01-01T00:00:00Z"},
            "observed": {"steps": [{"step_id": "get", "progress_at": now}, {"step_id": "check"}]},
            "derived": {"workflow": "COMPLETED", "next_gate": "none: completed"},
        }
        (wd / "ledger").mkdir(parents=True)
        (wd / "ledger" / "long-task-ledger.json").write_text(
            json.dumps({"version": 1, "tasks": {"dl": task}})
        )
        publish(wd, "**fetching** card")
        with chat.serve:
            await wait_said(chat, "ledger dl: COMPLETED", "the hand-written row")
            done = run_cli("ledger", "supervise", "--apply-supervision", "--workdir", str(wd))
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["action"] == "OK"
            await wait_said(
                chat,
                "ledger dl: RUNNING · 0/2 steps done · next: complete step get",
                "the row from the truth",
            )
            assert not (wd / ".notification" / "system.jsonl").exists()
            assert await chat.serve.aterminate() == 0


PURPOSE = "Fix foo_bar in *.py and *.md files, then **lint** <b>all</b>"
REASON = "needs `sudo` for [etc](https://example.com/etc) ~~now~~"


def card_markdown_line(markdown: str, start: str) -> str:
    """The line of a Feishu card's Markdown that starts with `start`."""
    return next((line for line in markdown.splitlines() if line.startswith(start)), "")


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_the_ledger_card_shows_the_purpose_and_reason_as_written(
    platform: str, tmp_path: Path
) -> None:
    """The ledger's renderer wrote the agent's purpose and block reason into its Markdown as
    they were: "*.py and *.md" lost both stars and made the rest italic (the purpose's bold
    left as a literal `**` on Telegram), a `**` inside ended the bold early, a link became a
    link. Both are now shown as typed, the purpose in bold, on Telegram and Feishu alike."""
    async with chat_for(platform, tmp_path, ["fixer"]) as chat:
        wd = workdir(tmp_path, "fixer")
        ledger(wd, "init", "fix", "--purpose", PURPOSE, "--steps", "lint", "--no-renderer")
        ledger(wd, "block", "fix", "--kind", "MISSING_ACCESS", "--reason", REASON)
        body = run_cli("ledger", "render", "--workdir", str(wd))
        assert body.returncode == 0, body.stderr
        publish(wd, body.stdout)
        with chat.serve:
            await wait_said(chat, "blocked: MISSING_ACCESS", "the ledger's card")
            assert await chat.serve.aterminate() == 0
        if isinstance(chat.fake, FakeTelegram):
            [card] = chat.fake.bot_messages(chat_id=-1001234567890)
            assert PURPOSE in card.text and f"MISSING_ACCESS: {REASON}" in card.text
            bold = {(e["offset"], e["length"]) for e in card.entities if e["type"] == "bold"}
            assert (card.text.index(PURPOSE), len(PURPOSE)) in bold
            assert {e["type"] for e in card.entities} <= {"bold", "code"}
        else:
            [markdown] = [
                element["content"]
                for card in chat.fake.cards("oc_fleet_group")
                for element in card["body"]["elements"]
                if element["tag"] == "markdown"
            ]
            purpose = card_markdown_line(markdown, "**")
            assert html.unescape(purpose) == f"**{PURPOSE}**"
            assert not set("*_`[<~") & set(purpose[2:-2])  # each mark a character reference
            reason = card_markdown_line(markdown, "blocked: MISSING_ACCESS: ")
            assert html.unescape(reason) == f"blocked: MISSING_ACCESS: {REASON}"
            assert not set("*_`[<~") & set(reason.removeprefix("blocked: MISSING_ACCESS: "))
