"""A `/taskcard` command typed in capitals does what it says in lower case, in Telegram and
Feishu alike: a chat member types `/TaskCard BOARD` on a phone keyboard that capitalises, and
the words of the chat commands are read in any case (the configuration file, written once by
an operator, is held to the exact spelling instead and names the one meant). Driven through
`taskcard serve` with a config file against the fake Bot API and the fake Feishu."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.harness import eventually, publish
from tests.e2e.test_serve_board import (
    GROUP,
    FeishuSetup,
    board_text,
    feishu_board,
    feishu_card_of,
    telegram_serve,
)
from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram


async def test_telegram_takes_a_command_in_capitals(tmp_path: Path, telegram: FakeTelegram) -> None:
    with telegram_serve(tmp_path, telegram, ["alpha"], "cards") as serve:
        publish(tmp_path / "agents" / "alpha", "alpha card v1")
        await eventually(lambda: len(telegram.bot_messages(GROUP)) == 1, what="the card")
        telegram.inject_command(GROUP, "/TaskCard BOARD")
        await eventually(lambda: "alpha card v1" in board_text(telegram), what="the board")
        assert not any("Unknown option" in m.text for m in telegram.bot_messages(GROUP))
        assert await serve.aterminate() == 0


async def test_feishu_takes_a_command_in_capitals(tmp_path: Path, feishu: FakeFeishu) -> None:
    setup = FeishuSetup(tmp_path, feishu, ["alpha"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "alpha", "alpha card v1")
        await eventually(lambda: "alpha card v1" in feishu_board(feishu), what="the board")
        answer = await feishu.deliver_command(
            setup.url, CHAT, "/TASKCARD Cards", verification_token=VERIFY, encrypt_key=ENCRYPT
        )
        assert answer.status == 200
        await eventually(lambda: feishu_card_of(feishu, "alpha"), what="the agent's own card")
        await eventually(
            lambda: "replaced by one card per agent" in feishu_board(feishu), what="board retired"
        )
        assert await serve.aterminate() == 0
