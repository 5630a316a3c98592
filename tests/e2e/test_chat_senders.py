"""Who a chat message is from, when `allowed_user_ids` limits who commands a route.

Through `taskcard serve` and the fake Telegram Bot API: a message an administrator posts
anonymously (Telegram: `sender_chat` is the group itself, `from` the GroupAnonymousBot
placeholder) and one sent on behalf of a channel (`sender_chat` another chat).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import eventually
from tests.e2e.test_talk_and_signals import (
    GROUP,
    TelegramChat,
    chat_for,
    queued,
    running_agent,
    running_card_shown,
    wait_said,
)
from tests.fakes.telegram_api import GROUP_ANONYMOUS_BOT_ID

CHANNEL = -1009999
REFUSAL = "Send it again as yourself"


async def test_an_anonymous_admin_commands_and_a_channel_is_told_to_post_as_a_person(
    tmp_path: Path,
) -> None:
    # The route lets only PERSON command it. An administrator of the group posting anonymously
    # was ignored without a word (the message's `from` is GroupAnonymousBot, on no list); the
    # platform lets only the group's administrators send so, and they are let in. A message
    # sent on behalf of a channel names no person: it is refused, with an answer saying why
    # and what to do, where it used to be ignored without a word too.
    async with chat_for("telegram", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, TelegramChat)
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            chat.fake.inject_on_behalf(GROUP, "/taskcard off", channel_id=CHANNEL)
            refusal = await wait_said(chat, REFUSAL, "the answer to the channel's command")
            assert "on behalf of a channel" in refusal
            chat.fake.inject_on_behalf(GROUP, "/tell builder from the channel", channel_id=CHANNEL)
            chat.fake.inject_on_behalf(GROUP, "/tell builder from an admin")
            # Commands are handled in order: once the admin's text is queued, the channel's
            # was refused before it.
            [message] = await eventually(lambda: queued(tmp_path), what="the admin's text")
            data = json.loads(message.read_text())
            assert data["text"] == "from an admin"
            assert data["from"]["user"] == str(GROUP_ANONYMOUS_BOT_ID)
            chat.fake.inject_on_behalf(GROUP, "/taskcard off")
            await wait_said(chat, "Task cards hidden here", "the answer to the admin's command")
            assert len(queued(tmp_path)) == 1
            assert await chat.serve.aterminate() == 0
