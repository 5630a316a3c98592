"""Who a chat message is from, when `allowed_user_ids` limits who commands a route and when
anyone may: whose /tell rate and /taskcard cancel a message counts under.

Through `taskcard serve` and the fake chat APIs: a person not on the list (both platforms),
a message an administrator posts anonymously (Telegram: `sender_chat` is the group itself,
`from` the GroupAnonymousBot placeholder) and one sent on behalf of a channel (`sender_chat`
another chat).
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

from taskcard.bridge.run.inbox_desk import NOTHING_TO_CANCEL
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
            # The placeholder's id is no person's: the agent reads the name the message shows.
            assert (data["from"]["user"], data["from"]["name"]) == (None, f"Group {GROUP}")
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


async def test_anonymous_admins_each_have_their_own_tell_rate_and_cancel(tmp_path: Path) -> None:
    # Every administrator of a group posting anonymously sends as GroupAnonymousBot, one id
    # for all of them: they shared one /tell rate window, so one used up the others', and
    # "/taskcard cancel" withdrew the latest text of any of them. As a channel's signers do,
    # each custom title counts as its own writer, and the untitled ones as the group's;
    # never as the person whose id a title spells ("7").
    limits = "[inbox]\nmax_messages = 1\nperiod_s = 600"
    async with chat_for("telegram", tmp_path, ["builder"], limits) as chat:
        assert isinstance(chat, TelegramChat)
        running_agent(tmp_path)

        def texts(folder: str) -> list[str]:
            return sorted(
                json.loads(p.read_text())["text"] for p in queued(tmp_path, folder=folder)
            )

        def said(words: str) -> int:
            return sum(words in text for text in chat.bot_texts())

        with chat.serve:
            await running_card_shown(chat)
            chat.fake.inject_on_behalf(GROUP, "/tell builder from Ann", signature="Ann")
            chat.fake.inject_on_behalf(GROUP, "/tell builder from Bob", signature="Bob")
            chat.fake.inject_on_behalf(GROUP, "/tell builder from 7", signature="7")
            chat.fake.inject_on_behalf(GROUP, "/tell builder untitled")
            await chat.say("/tell builder from the person 7")
            await eventually(lambda: len(texts("queued")) == 5, what="every writer's first text")
            chat.fake.inject_on_behalf(GROUP, "/tell builder Ann again", signature="Ann")
            await eventually(lambda: said("Too many messages to builder"), what="Ann refused")
            chat.fake.inject_on_behalf(GROUP, "/taskcard cancel", signature="Bob")
            await eventually(lambda: texts("cancelled") == ["from Bob"], what="Bob's withdrawn")
            chat.fake.inject_on_behalf(GROUP, "/taskcard cancel")
            await eventually(
                lambda: texts("cancelled") == ["from Bob", "untitled"], what="the group's"
            )
            assert texts("queued") == ["from 7", "from Ann", "from the person 7"]
            assert said("Too many messages") == 1
            assert await chat.serve.aterminate() == 0


async def test_each_channel_a_member_sends_as_is_a_writer_of_its_own(tmp_path: Path) -> None:
    # In a group where anyone may command, a member may send as a channel ("Send as"):
    # `sender_chat` is the channel, `from` the Channel_Bot placeholder (one id for every
    # channel). Keyed to that id, every channel shared one /tell rate and one /taskcard
    # cancel, and the agent read the placeholder's id as a person's. Each channel is a
    # writer of its own, and the agent reads the channel's title.
    limits = "[inbox]\nmax_messages = 1\nperiod_s = 600"
    other = -1008888
    async with chat_for("telegram", tmp_path, ["builder"], limits) as chat:
        assert isinstance(chat, TelegramChat)
        anyone = chat.config.read_text().replace("allowed_user_ids = [", "# allowed = [")
        chat.config.write_text(anyone)
        running_agent(tmp_path)

        def texts(folder: str) -> list[str]:
            return sorted(
                json.loads(p.read_text())["text"] for p in queued(tmp_path, folder=folder)
            )

        def said(words: str) -> int:
            return sum(words in text for text in chat.bot_texts())

        with chat.serve:
            await running_card_shown(chat)
            chat.fake.inject_on_behalf(GROUP, "/tell builder from news", channel_id=CHANNEL)
            chat.fake.inject_on_behalf(GROUP, "/tell builder from ops", channel_id=other)
            await chat.say("/tell builder from the person")
            await eventually(lambda: len(texts("queued")) == 3, what="every writer's first text")
            senders = {
                data["text"]: (data["from"]["user"], data["from"].get("name"))
                for data in (json.loads(p.read_text()) for p in queued(tmp_path))
            }
            assert senders["from news"] == (None, f"Channel {CHANNEL}")
            assert senders["from ops"] == (None, f"Channel {other}")
            chat.fake.inject_on_behalf(GROUP, "/tell builder news again", channel_id=CHANNEL)
            await eventually(lambda: said("Too many messages to builder"), what="news refused")
            chat.fake.inject_on_behalf(GROUP, "/taskcard cancel", channel_id=other)
            await eventually(lambda: texts("cancelled") == ["from ops"], what="ops' withdrawn")
            assert texts("queued") == ["from news", "from the person"]
            assert said("Too many messages") == 1
            assert await chat.serve.aterminate() == 0


async def test_a_text_an_anonymous_admin_queued_before_titles_counted_is_no_ones_to_cancel(
    tmp_path: Path,
) -> None:
    # Before anonymous administrators were told apart by their titles, their texts were
    # kept under GroupAnonymousBot's id (1087968824), shared by every one of them, with no
    # title kept beside it. Nothing says which administrator sent such a text, so neither a
    # titled administrator's cancel nor an untitled one's withdraws it: it stays queued for
    # the agent (docs/operators.md). The record is set as that version left it.
    async with chat_for("telegram", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, TelegramChat)
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            chat.fake.inject_on_behalf(GROUP, "/tell builder from long ago", signature="Ann")
            [text] = await eventually(lambda: queued(tmp_path), what="Ann's text queued")
            assert await chat.serve.aterminate() == 0
        with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db, db:
            db.execute("UPDATE inbox SET author = '1087968824' WHERE message_id = ?", (text.stem,))
            assert db.total_changes == 1
        with chat.restart():
            await running_card_shown(chat)
            chat.fake.inject_on_behalf(GROUP, "/taskcard cancel", signature="Ann")
            chat.fake.inject_on_behalf(GROUP, "/taskcard cancel")
            await eventually(
                lambda: sum(NOTHING_TO_CANCEL in t for t in chat.bot_texts()) == 2,
                what="both cancels answered",
            )
            assert queued(tmp_path) == [text]
            assert await chat.serve.aterminate() == 0
