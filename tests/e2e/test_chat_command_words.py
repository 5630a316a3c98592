"""Where a chat command's word ends, through `taskcard serve` and both platforms' fakes.

Telegram marks a command (a `bot_command` entity) as `/` and 1-64 ASCII letters, digits or
underscores, optionally `@` and a bot's username, ended by the text's end or by any character
that is not a letter or digit of any script, `_`, `/`, `<` or `>`. So `/tell😀 builder hi` holds
the command `/tell` and `/taskcard,off` the command `/taskcard`: both were read as one unknown
first word and ignored without an answer. What follows the command word is its arguments, on
Telegram and Feishu alike: ",off" is an unknown option, answered with the one it likely meant;
"😀" is no agent, answered with the agents there are. On Feishu, where a command in a group
comes beside the bot's mention, each mention of the bot goes (Feishu gives a second mention of
the same bot its own placeholder, which was left in the arguments), and a full-width slash, as
a Chinese input method types it, opens a command (Feishu marks no commands of its own).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import eventually
from tests.e2e.test_talk_and_signals import (
    FS_CHAT,
    FS_PERSON,
    FS_VERIFY,
    Chat,
    FeishuChat,
    TelegramChat,
    platform,  # noqa: F401 (the fixture, used by name)
    queued,
    running_card,
    wait_said,
    wait_status,
)


async def answered(chat: Chat, words: str, times: int, what: str) -> None:
    """Wait until `times` of the bot's messages in the chat say `words` (each command is
    answered before the next is sent: a person's repeated command is answered once)."""
    await eventually(
        lambda: sum(words in t for t in chat.bot_texts()) >= times, timeout_s=60, what=what
    )


async def test_a_command_word_ends_where_the_platform_ends_it(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    async with running_card(platform, tmp_path) as chat:
        addressed = "/taskcard"
        if isinstance(chat, TelegramChat):
            addressed = f"/taskcard@{chat.fake.username.lower()}"
        await chat.say("/taskcard,off")
        await answered(chat, "Did you mean /taskcard off?", 1, "the answer to /taskcard,off")
        await chat.say("/tell\U0001f600 builder hi")
        await answered(chat, "AGENT is one of builder", 1, "the answer to /tell😀")
        assert queued(tmp_path) == []
        # A letter of any script, `/`, `<` or `>` continues the word: no command, no answer.
        for text in ("/taskcard\u00e9 off", "/taskcard/off", "/taskcard<off"):
            await chat.say(text)
        # White space of any kind ends it, in any case, addressed to this bot or not.
        await chat.say("/TASKCARD\n5")
        await answered(chat, "5 activity rows", 1, "the answer to a line break")
        await chat.say(f"{addressed.upper()}\u00a06")
        await answered(chat, "6 activity rows", 1, "the answer to a no-break space")
        await chat.say(f"{addressed}\U0001f389 7")
        await answered(chat, "Unknown option", 2, "the answer to an emoji glued to it")
        await chat.say(f"/tell;builder {addressed}")
        await answered(chat, "AGENT is one of builder", 2, "the answer to /tell;builder")
        await chat.say(f"  {addressed}\t/tell")
        await answered(chat, "Unknown option", 3, "the answer to a command after white space")
        await chat.say("/tell builder ok")
        await wait_status(chat, "queued")
        [message] = queued(tmp_path)
        assert json.loads(message.read_text())["text"] == "ok"
        # Commands of one chat are handled in order: the words that held no command came first.
        assert not any("hidden" in t.lower() for t in chat.bot_texts()), chat.bot_texts()
        assert sum("Unknown option" in t for t in chat.bot_texts()) == 3, chat.bot_texts()


async def test_a_feishu_command_with_a_full_width_slash(tmp_path: Path) -> None:
    async with running_card("feishu", tmp_path) as chat:
        await chat.say("\uff0ftaskcard 3")
        await wait_said(chat, "3 activity rows", "the answer to a full-width slash")
        await chat.say("\uff0fTELL builder ok")
        await wait_status(chat, "queued")
        [message] = queued(tmp_path)
        assert json.loads(message.read_text())["text"] == "ok"


async def test_a_feishu_command_mentioning_the_bot_twice(tmp_path: Path) -> None:
    async with running_card("feishu", tmp_path) as chat:
        assert isinstance(chat, FeishuChat)
        # "@bot /taskcard 4 @bot": Feishu writes each mention as its own placeholder.
        document = chat.fake.command_event(
            FS_CHAT, "/taskcard 4", open_id=FS_PERSON, verification_token=FS_VERIFY
        )
        message = document["event"]["message"]
        [ours] = chat.fake.command_event(
            FS_CHAT, "", open_id=FS_PERSON, mention_bot=True, verification_token=FS_VERIFY
        )["event"]["message"]["mentions"]
        message["mentions"] = [ours, {**ours, "key": "@_user_2"}]
        message["content"] = json.dumps({"text": "@_user_1 /taskcard 4 @_user_2"})
        assert (await chat.fake.deliver_event(chat.url, document)).status == 200
        await wait_said(chat, "4 activity rows", "the answer to two mentions of the bot")
        assert not any("Unknown option" in t for t in chat.bot_texts()), chat.bot_texts()
