"""Who a chat message is from, when `allowed_user_ids` limits who commands a route.

Through `taskcard serve` and the fake chat APIs: a person not on the list (both platforms),
a message an administrator posts anonymously (Telegram: `sender_chat` is the group itself,
`from` the GroupAnonymousBot placeholder) and one sent on behalf of a channel (`sender_chat`
another chat).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import eventually
from tests.e2e.test_talk_and_signals import (
    GROUP,
    FeishuChat,
    TelegramChat,
    chat_for,
    platform,  # noqa: F401 (the fixture, used by name)
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


async def test_a_person_not_listed_is_told_how_to_be_added(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A person not on `allowed_user_ids` who sent a command was ignored without a word. They
    # are told why, with the id the operator would add; a reply of theirs to a card (maybe
    # people talking about it among themselves) stays unanswered. Nothing reaches the agent.
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        assert isinstance(chat, TelegramChat | FeishuChat)
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            card = chat.message_id_with("compile")
            await chat.say("/taskcard off", user=99)
            told = await wait_said(chat, "your user id:", "the answer to the stranger")
            assert told.startswith("Only the people listed for this chat")
            assert told.rstrip().endswith("99")  # Telegram's 99, the fake Feishu's ou_other_99
            await chat.say("/tell builder from a stranger", user=99)
            await chat.say("and from a stranger", user=99, reply_to=card)
            await chat.say("/taskcard")
            await wait_said(chat, "Task cards here: shown", "the listed person's answer")
            assert queued(tmp_path) == []
            assert len([t for t in chat.bot_texts() if "your user id" in t]) == 1
            assert await chat.serve.aterminate() == 0
