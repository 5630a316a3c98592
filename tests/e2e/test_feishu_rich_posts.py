"""Feishu rich posts with a title, through `taskcard serve` and the fake Feishu's events.

A post written in Feishu's rich editor may carry a title: a heading the client shows above
the body. The command is the one in the body, as a person sees it; the title reaches the
agent as the first line of its text. Events carry the post as `{"title", "content"}` or under
a locale key (`zh_cn`, `en_us`): each shape reads the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.harness import eventually
from tests.e2e.test_talk_and_signals import (
    FS_CHAT,
    FS_PERSON,
    FS_VERIFY,
    FeishuChat,
    chat_for,
    queued,
    running_agent,
    running_card_shown,
    wait_said,
)

TITLE = "Nightly deploy"


@pytest.mark.parametrize("locale", [None, "zh_cn", "en_us"], ids=["plain", "zh_cn", "en_us"])
async def test_a_titled_post_is_read_from_its_body(tmp_path: Path, locale: str | None) -> None:
    # The title came first in the text the command was looked for in: "@bot /taskcard 6"
    # under a title was no command, and was dropped without a word.
    async with chat_for("feishu", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, FeishuChat)
        running_agent(tmp_path)
        with chat.serve:
            card = await running_card_shown_id(chat)

            async def post(text: str, **options: object) -> None:
                document = chat.fake.command_event(
                    FS_CHAT,
                    text,
                    open_id=FS_PERSON,
                    verification_token=FS_VERIFY,
                    message_type="post",
                    title=TITLE,
                    locale=locale,
                    **options,
                )
                assert (await chat.fake.deliver_event(chat.url, document)).status == 200

            await post("/taskcard 6")
            await wait_said(chat, "6 activity rows", "the answer to the command under a title")
            await post("/tell builder\nlook at the log")
            [told] = await eventually(lambda: queued(tmp_path), what="the /tell's text")
            assert json.loads(told.read_text())["text"] == f"{TITLE}\nlook at the log"
            await post("and the docs", mention_bot=False, parent_id=card, root_id=card)
            await eventually(lambda: len(queued(tmp_path)) == 2, what="the reply's text")
            texts = {json.loads(m.read_text())["text"] for m in queued(tmp_path)}
            assert texts == {f"{TITLE}\nlook at the log", f"{TITLE}\nand the docs"}
            assert await chat.serve.aterminate() == 0


async def running_card_shown_id(chat: FeishuChat) -> str:
    await running_card_shown(chat)
    card = chat.message_id_with("compile")
    assert card is not None
    return card
