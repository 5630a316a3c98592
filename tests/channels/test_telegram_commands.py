"""`/taskcard` commands over getUpdates long polling, real PTB against the fake API."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from telegram import Bot, MessageEntity, Update

from taskcard.channels.aio import Backoff
from taskcard.channels.base import ChatRef
from taskcard.channels.errors import MessageGone
from taskcard.channels.telegram.channel import TelegramChannel
from taskcard.channels.telegram.commands import (
    OFFSET_CURSOR_KEY,
    CommandPoller,
    command_from_update,
    parse_command,
    poll_backoff,
    with_mentions_marked,
)
from taskcard.channels.telegram.config import TelegramConfig, TelegramRoute
from tests.channels.conftest import CommandInbox, MemoryCursorStore, wait_until
from tests.fakes.telegram_api import FakeTelegram

GROUP = -100777


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/taskcard", ""),
        ("/taskcard off", "off"),
        ("  /taskcard   3  ", "3"),
        ("/TaskCard on", "on"),
        ("/taskcard@TaskcardTestBot off", "off"),
        ("/taskcard@taskcardtestbot", ""),
        ("/taskcard@OtherBot off", None),
        ("/taskcard\noff", "off"),  # the command ends at any white space
        ("/taskcard@TaskcardTestBot\tboard", "board"),
        ("/taskcard@OtherBot\noff", None),
        ("/taskcard\u00a0off", "off"),
        ("/taskcards", None),
        ("/start", None),
        ("taskcard off", None),
        ("", None),
        ("@TaskcardTestBot /taskcard off", "off"),  # beside the bot's mention, as on Feishu
        ("/taskcard 3 @taskcardtestbot", "3"),
        ("@TaskcardTestBots /taskcard off", None),  # another name
        ("@OtherBot /taskcard off", None),
        ("mail@TaskcardTestBot /taskcard off", None),
        ("\u200b/taskcard off\u200b", "off"),  # invisible characters count as not typed
        ("/taskcard o\u200bff", "off"),
        ("\uff0ftaskcard off", None),  # a full-width slash is a look-alike
        # Characters outside the BMP (two UTF-16 units each, as Telegram counts entities):
        ("\U0001f600 /taskcard off", None),  # not the first word
        ("\U0001d518\U0001d51b /taskcard@TaskcardTestBot on", None),
        ("/taskcard@TaskcardTestBot \U0001f600 3", "\U0001f600 3"),
        # The command word ends where Telegram ends one: at any character that is not a
        # letter, digit, `_`, `/`, `<` or `>`; what follows is the arguments, as typed.
        ("/taskcard\U0001f600 off", "\U0001f600 off"),
        ("/taskcard,off", ",off"),
        ("/taskcard@TaskcardTestBot,off", ",off"),
        ("/taskcard\u00e9 off", None),  # a letter of another script continues the word
        ("/taskcard/off", None),
        ("/taskcard@TaskcardTestBot\u00e9 off", None),
        ("/taskcard@OtherBot,off", None),
        ("@TaskcardTestBot \U0001f600 /taskcard off", None),
        # Telegram marks a command glued to `@` only with 3 to 32 name characters after it.
        ("/taskcard@ off", None),
        ("/taskcard@ab off", None),
        ("/taskcard@" + "b" * 33 + " off", None),
        # An invisible or control character glued to the command word ends it.
        ("/taskcard\u2060off", "off"),
        ("/taskcard@TaskcardTestBot\u200boff", "off"),
        ("/taskcard\x00off", "off"),
        ("/\u200btaskcard off", "off"),  # the service's quoted command, pasted back
        ("/task\u200bcard off", "off"),  # read as it shows first
    ],
)
def test_parse_command(text: str, expected: str | None) -> None:
    assert parse_command(text, "TaskcardTestBot") == expected


def test_a_tell_glued_to_what_ends_its_command_word() -> None:
    assert parse_command("/tell\U0001f600 builder hi", "TaskcardTestBot", "tell") == (
        "\U0001f600 builder hi"
    )
    assert parse_command("/tell,builder hi", "TaskcardTestBot", "tell") == ",builder hi"
    assert parse_command("/tellme builder hi", "TaskcardTestBot", "tell") is None
    assert parse_command("/tell\u200bbuilder hi", "TaskcardTestBot", "tell") == "builder hi"
    assert parse_command("/tell\x07builder hi", "TaskcardTestBot", "tell") == "builder hi"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/tell builder@TaskcardTestBot hi", "builder hi"),
        ("/tell builder@taskcardtestbot@TASKCARDTESTBOT\nhi", "builder\nhi"),
        ("/tell builder@TaskcardTestBot", "builder"),
        ("/tell builder@OtherBot hi", "builder@OtherBot hi"),  # another bot's: no agent
        ("/tell builder@TaskcardTestBots hi", "builder@TaskcardTestBots hi"),
        ("/tell builder hi@TaskcardTestBot", "builder hi@TaskcardTestBot"),  # the text's
    ],
)
def test_the_bots_name_glued_to_the_agents_goes(text: str, expected: str) -> None:
    assert parse_command(text, "TaskcardTestBot", "tell") == expected


def test_the_bot_named_twice_before_a_tell() -> None:
    text = "@TaskcardTestBot @taskcardtestbot /tell @TaskcardTestBot builder hi"
    assert parse_command(text, "TaskcardTestBot", "tell") == "builder hi"


def test_a_long_run_of_invisible_words_before_a_command() -> None:
    """Each invisible "word" is passed over in place (slicing the rest at each one cost the
    square of the text's length); the command and the text after it read as typed."""
    text = "\u200b " * 50_000 + "/tell builder line one\nline two"
    assert parse_command(text, "TaskcardTestBot", "tell") == "builder line one\nline two"
    assert parse_command("\u200b " * 50_000, "TaskcardTestBot") is None


def test_poll_backoff_is_capped() -> None:
    backoff = replace(poll_backoff(), jitter=0.0)
    assert backoff.delay_s(1) == 0.5
    assert backoff.delay_s(3) == 2.0
    assert backoff.delay_s(50) == 30.0


def _config(fake: FakeTelegram) -> TelegramConfig:
    return TelegramConfig(api_base_url=fake.base_url, poll_timeout_s=1, request_timeout_s=10.0)


async def _started(
    fake: FakeTelegram, cursor: MemoryCursorStore, inbox: CommandInbox
) -> TelegramChannel:
    channel = TelegramChannel(_config(fake), fake.token, cursor)
    await channel.start(inbox)
    return channel


async def test_mentions_threads_and_users(
    telegram_fake: FakeTelegram, telegram_cursor: MemoryCursorStore
) -> None:
    inbox = CommandInbox()
    channel = await _started(telegram_fake, telegram_cursor, inbox)
    try:
        telegram_fake.inject_command(GROUP, "/taskcard@OtherBot off", user_id=5)
        telegram_fake.inject_command(GROUP, "hello everyone", user_id=5)
        telegram_fake.inject_command(GROUP, "/taskcard@TASKCARDTESTBOT 4", user_id=6, thread_id=9)
        telegram_fake.inject_command(4242, "/taskcard", user_id=4242)
        commands = await inbox.wait_for(2)
        assert [(c.chat, c.args, c.user_id) for c in commands] == [
            (ChatRef(str(GROUP), "9"), "4", "6"),
            (ChatRef("4242"), "", "4242"),
        ]
        assert all(c.message_id for c in commands)
    finally:
        await channel.stop()


async def test_commands_beside_characters_outside_the_bmp_are_read_as_telegram_sends_them(
    telegram_fake: FakeTelegram, telegram_cursor: MemoryCursorStore
) -> None:
    """The fake marks each command with its offset in UTF-16 units, as Telegram does, so a
    command after an emoji arrives with an entity two units further on than its characters;
    the commands are read from the text, and only a command that starts the message is one."""
    inbox = CommandInbox()
    channel = await _started(telegram_fake, telegram_cursor, inbox)
    try:
        for text in (
            "\U0001f600\U0001f600 /taskcard@TaskcardTestBot off",
            "/taskcard@TaskcardTestBot 4 \U0001f389",
            "/tell builder \U0001f600 then /taskcard off \U0001d518",
            "/taskcard on",
        ):
            telegram_fake.inject_command(GROUP, text, user_id=5)
        commands = await inbox.wait_for(3)
        assert [(c.command, c.args) for c in commands] == [
            ("taskcard", "4 \U0001f389"),
            ("tell", "builder \U0001f600 then /taskcard off \U0001d518"),
            ("taskcard", "on"),
        ]
    finally:
        await channel.stop()


async def test_offset_persisted_and_not_replayed_after_restart(
    telegram_fake: FakeTelegram,
) -> None:
    cursor = MemoryCursorStore()
    first_inbox = CommandInbox()
    first = await _started(telegram_fake, cursor, first_inbox)
    telegram_fake.inject_command(GROUP, "/taskcard off", user_id=1)
    await first_inbox.wait_for(1)
    await wait_until(lambda: cursor.get_cursor(OFFSET_CURSOR_KEY) is not None, what="offset")
    await first.stop()

    second_inbox = CommandInbox()
    second = await _started(telegram_fake, cursor, second_inbox)
    try:
        telegram_fake.inject_command(GROUP, "/taskcard on", user_id=1)
        commands = await second_inbox.wait_for(1)
        assert [c.args for c in commands] == ["on"], "the 'off' before the restart is not replayed"
        await wait_until(lambda: not telegram_fake.pending_updates, what="updates confirmed")
    finally:
        await second.stop()


async def test_commands_disabled_means_no_polling(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    telegram_fake.inject_command(GROUP, "/taskcard off")
    await telegram_channel.send(ChatRef(str(GROUP)), telegram_channel.render_text("x"))
    assert telegram_fake.count("getUpdates") == 0


async def test_failing_sink_and_conflict_do_not_kill_the_loop(
    telegram_fake: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[str] = []

    async def flaky_sink(command: object) -> None:
        received.append(getattr(command, "args", ""))
        if len(received) == 1:
            raise RuntimeError("sink failed")

    cursor = MemoryCursorStore()
    backoff = Backoff(initial_s=0.01, max_s=0.05)
    async with (
        Bot(telegram_fake.token, base_url=f"{telegram_fake.base_url}/bot") as bot,
        Bot(telegram_fake.token, base_url=f"{telegram_fake.base_url}/bot") as rival_bot,
    ):
        poller = CommandPoller(bot, bot.username, cursor, flaky_sink, 1, backoff)
        task = asyncio.create_task(poller.run())
        try:
            # A rival poller ends our long poll with 409 Conflict; we must keep polling.
            await wait_until(lambda: telegram_fake.waiting_pollers == 1, what="a held poll")
            await rival_bot.get_updates(timeout=0)
            telegram_fake.inject_command(GROUP, "/taskcard 1")
            await wait_until(lambda: len(received) >= 1, what="first command")
            telegram_fake.inject_command(GROUP, "/taskcard 2")
            await wait_until(lambda: received[-1] == "2", what="second command")
            assert any(r.status == 409 for r in telegram_fake.requests)
            # The log says what two serve on one bot do besides, and the way out.
            conflict = [r.getMessage() for r in caplog.records if "conflict" in r.getMessage()]
            assert conflict and "its own card in every chat" in conflict[0]
            assert "[cluster]" in conflict[0]
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


def _update(kind: str, text: str, thread_id: int | None = None) -> Update:
    message: dict[str, Any] = {
        "message_id": 3,
        "date": 0,
        "chat": {"id": GROUP, "type": "supergroup", "title": "g"},
        "from": {"id": 9, "is_bot": False, "first_name": "u"},
        "text": text,
    }
    if thread_id is not None:
        message.update(message_thread_id=thread_id, is_topic_message=True)
    return Update.de_json({"update_id": 1, kind: message}, None)


def test_edited_message_is_never_a_command() -> None:
    assert command_from_update(_update("edited_message", "/taskcard off"), "Bot") is None
    command = command_from_update(_update("message", "/taskcard off", thread_id=5), "Bot")
    assert command is not None
    assert (command.chat, command.args, command.user_id, command.message_id) == (
        ChatRef(str(GROUP), "5"),
        "off",
        "9",
        "3",
    )


@pytest.mark.parametrize(
    ("sender_chat", "author", "expected"),
    [
        (None, {"id": 9, "is_bot": False, "first_name": "u"}, (None, "9")),
        # An administrator posting anonymously: the group itself, GroupAnonymousBot as `from`.
        (GROUP, {"id": 1087968824, "is_bot": True, "first_name": "Group"}, ("admin", None)),
        # A linked channel, or a channel a member posts as: Channel_Bot as `from`.
        (-100555, {"id": 136817688, "is_bot": True, "first_name": "Channel"}, ("chat", None)),
    ],
    ids=["person", "anonymous-admin", "channel"],
)
def test_a_message_sent_on_behalf_of_a_chat_says_so(
    sender_chat: int | None, author: dict[str, Any], expected: tuple[str | None, str | None]
) -> None:
    update = _update("message", "/taskcard off").to_dict()
    update["message"]["from"] = author
    if sender_chat is not None:
        update["message"]["sender_chat"] = {"id": sender_chat, "type": "channel", "title": "c"}
    command = command_from_update(Update.de_json(update, None), "Bot")
    assert command is not None and command.args == "off"
    sent_as, person = expected
    assert command.sent_as == sent_as
    assert person is None or command.user_id == person


async def test_a_webhook_left_on_the_bot_is_removed_so_commands_arrive(
    telegram_fake: FakeTelegram, telegram_cursor: MemoryCursorStore
) -> None:
    telegram_fake.webhook_url = "https://old.example/hook"
    inbox = CommandInbox()
    channel = await _started(telegram_fake, telegram_cursor, inbox)
    try:
        telegram_fake.inject_command(GROUP, "/taskcard", user_id=5)
        commands = await inbox.wait_for(1)
        assert [c.args for c in commands] == [""]
        assert telegram_fake.webhook_url is None
        assert telegram_fake.count("deleteWebhook") == 1
    finally:
        await channel.stop()


def _reply(text: str, to_bot: bool, username: str = "Bot") -> Update:
    update = _update("message", text).to_dict()
    update["message"]["reply_to_message"] = {
        "message_id": 77,
        "date": 0,
        "chat": {"id": GROUP, "type": "supergroup", "title": "g"},
        "from": {"id": 1, "is_bot": to_bot, "first_name": "b", "username": username},
        "text": "card",
    }
    return Update.de_json(update, None)


def test_tell_and_replies_to_the_bot_reach_the_service() -> None:
    tell = command_from_update(_update("message", "/tell@Bot builder stop\nnow"), "Bot")
    assert tell is not None and (tell.command, tell.args) == ("tell", "builder stop\nnow")
    tell = command_from_update(_update("message", "/tell\nbuilder\nstop now"), "Bot")
    assert tell is not None and (tell.command, tell.args) == ("tell", "builder\nstop now")
    reply = command_from_update(_reply("please stop", to_bot=True), "bot")
    assert reply is not None
    assert (reply.command, reply.args, reply.reply_to) == ("reply", "please stop", ("77",))
    assert command_from_update(_reply("hi", to_bot=False), "Bot") is None
    assert command_from_update(_reply("hi", to_bot=True, username="OtherBot"), "Bot") is None
    # Another bot's command replying to ours is not text for the agent; a path is.
    assert command_from_update(_reply("/start@OtherBot", to_bot=True), "bot") is None
    path = command_from_update(_reply("/home/me@host is full", to_bot=True), "bot")
    assert path is not None and path.args == "/home/me@host is full"
    assert command_from_update(_update("message", "just chatting"), "Bot") is None


def test_commands_replying_to_another_bots_message_are_that_bots() -> None:
    # A command, `/tell` included, replying to another bot's message without naming ours is
    # that bot's: another card service in the chat may route an agent of the same name.
    # Named with our bot, it is ours and comes without the message it replies to.
    assert command_from_update(_reply("/taskcard off", True, "CiBot"), "Bot") is None
    assert command_from_update(_reply("/tell builder look", True, "CiBot"), "Bot") is None
    ours = command_from_update(_reply("/tell@Bot builder look", True, "CiBot"), "Bot")
    assert ours is not None and ours.reply_to == ()


def test_a_reply_in_a_channel_to_its_post_names_no_author_of_that_post() -> None:
    channel = {"id": GROUP, "type": "channel", "title": "Release desk"}
    card = {"message_id": 77, "date": 0, "chat": channel, "sender_chat": channel, "text": "c"}
    post = {"message_id": 78, "date": 1, "chat": channel, "sender_chat": channel}
    post |= {"text": "ship it", "reply_to_message": card}
    signed = {**post, "author_signature": "Ann"}
    for sent, author in ((post, "Release desk"), (signed, "Ann")):
        reply = command_from_update(
            Update.de_json({"update_id": 1, "channel_post": sent}, None), "Bot"
        )
        assert reply is not None and reply.replied_author_unknown
        assert (reply.command, reply.reply_to) == ("reply", ("77",))
        assert (reply.user_id, reply.author_name) == (None, author)
    # In a group, a reply to a message without an author is no reply to the bot.
    group = {"id": GROUP, "type": "supergroup", "title": "g"}
    lost = {
        **post,
        "chat": group,
        "sender_chat": group,
        "reply_to_message": {**card, "chat": group},
    }
    lost["from"] = {"id": 5, "is_bot": False, "first_name": "a"}
    assert (
        command_from_update(Update.de_json({"update_id": 2, "message": lost}, None), "Bot") is None
    )


async def test_an_upgraded_group_is_followed_and_its_commands_arrive_under_its_old_id(
    telegram_fake: FakeTelegram,
) -> None:
    """The two service messages of an upgrade make one `moved` command; from then on,
    requests for the group go to the supergroup, a plain (old group) message id is gone
    without a request, even where the supergroup has a bot message of the same number, and
    commands and replies from the supergroup arrive under the group's id."""
    basic, supergroup = -4242, -1009876543210
    cursor, inbox = MemoryCursorStore(), CommandInbox()
    channel = await _started(telegram_fake, cursor, inbox)
    chat = ChatRef(str(basic))
    try:
        old = await channel.send(chat, channel.render_text("card in the group"))
        await channel.send(chat, channel.render_text("another in the group"))
        telegram_fake.migrate(basic, supergroup)
        (moved,) = await inbox.wait_for(1)
        assert (moved.command, moved.chat, moved.args) == ("moved", chat, str(supergroup))
        # The supergroup's message 2 is the bot's too: an old id must never edit it.
        first = await channel.send(chat, channel.render_text("first in the supergroup"))
        new = await channel.send(chat, channel.render_text("card in the supergroup"))
        assert new == f"3@{supergroup}" and old == "1" and first == f"2@{supergroup}"
        requests = telegram_fake.count()
        with pytest.raises(MessageGone):
            await channel.edit(chat, "2", channel.render_text("overwritten?"))
        assert telegram_fake.count() == requests, "no request for a message of the old group"
        await channel.edit(chat, new, channel.render_text("card edited"))
        assert [m.text for m in telegram_fake.bot_messages(supergroup)] == [
            "first in the supergroup",
            "card edited",
        ]
        telegram_fake.inject_command(supergroup, "/taskcard off")
        telegram_fake.inject_message(supergroup, "for the agent", reply_to=3)
        off, reply = (await inbox.wait_for(3))[1:]
        assert (off.chat, off.args) == (chat, "off")
        assert reply.chat == chat and reply.reply_to == (new,), "never the group's plain 3"
        assert telegram_fake.count(chat_id=basic) == 2  # the two sends before the upgrade
    finally:
        await channel.stop()
    assert cursor.values["telegram:chat_moved_to:-4242"] == str(supergroup)


async def test_a_move_learned_from_a_refused_send_is_retried_there_once(
    telegram_fake: FakeTelegram,
) -> None:
    """No service message seen: the refused send goes to the supergroup at once (one post),
    the service is told once, and a channel started later on the same store sends there
    without asking the old id."""
    basic, supergroup = -4242, -1009876543210
    cursor, inbox = MemoryCursorStore(), CommandInbox()
    channel = await _started(telegram_fake, cursor, inbox)
    chat = ChatRef(str(basic))
    try:
        telegram_fake.migrate(basic, supergroup, announce=False)
        sent = await channel.send(chat, channel.render_text("notice"))
        await channel.send(chat, channel.render_text("another"))
        assert sent == f"1@{supergroup}"
        assert [c.command for c in await inbox.wait_for(1)] == ["moved"]
    finally:
        await channel.stop()
    config = TelegramConfig(
        api_base_url=telegram_fake.base_url,
        poll_timeout_s=1,
        routes=[TelegramRoute(chat_id=basic, agents=["builder"])],
    )
    later = TelegramChannel(config, telegram_fake.token, cursor)
    await later.start(CommandInbox())
    try:
        before = telegram_fake.count(chat_id=basic)
        await later.send(chat, later.render_text("after a restart"))
        assert telegram_fake.count(chat_id=basic) == before
        assert len(telegram_fake.bot_messages(supergroup)) == 3
    finally:
        await later.stop()
    assert len(inbox.commands) == 1


class _MovesUnwritable(MemoryCursorStore):
    """A store whose writes of upgrades fail (a disk or Redis outage), offsets still work."""

    def set_cursor(self, key: str, value: str) -> None:
        if key.startswith("telegram:chat_moved"):
            raise OSError("no space left on device")
        super().set_cursor(key, value)


async def test_an_upgrade_that_cannot_be_recorded_is_followed_and_polling_goes_on(
    telegram_fake: FakeTelegram,
) -> None:
    basic, supergroup = -4242, -1009876543210
    inbox = CommandInbox()
    channel = await _started(telegram_fake, _MovesUnwritable(), inbox)
    try:
        telegram_fake.migrate(basic, supergroup)
        telegram_fake.inject_command(supergroup, "/taskcard 2")
        telegram_fake.inject_command(GROUP, "/taskcard on")
        moved, rows, on = await inbox.wait_for(3)
        assert moved.command == "moved"
        assert (rows.chat, rows.args) == (ChatRef(str(basic)), "2")
        assert (on.chat, on.args) == (ChatRef(str(GROUP)), "on")
        sent = await channel.send(ChatRef(str(basic)), channel.render_text("card"))
        assert sent.endswith(f"@{supergroup}")
    finally:
        await channel.stop()


class _OffsetUnwritable(MemoryCursorStore):
    """A store that cannot record the update offset (the poll lease lapsed while Redis was
    away, or a full disk)."""

    def set_cursor(self, key: str, value: str) -> None:
        if key == OFFSET_CURSOR_KEY:
            raise OSError("no space left on device")
        super().set_cursor(key, value)


async def test_an_offset_that_cannot_be_recorded_is_one_line_and_polling_goes_on(
    telegram_fake: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failed offset write logged a traceback (in a cluster, a lease that lapsed during
    a Redis outage); the command was handed over before, so one warning line is enough."""
    inbox = CommandInbox()
    channel = await _started(telegram_fake, _OffsetUnwritable(), inbox)
    try:
        telegram_fake.inject_command(GROUP, "/taskcard off")
        await inbox.wait_for(1)
        telegram_fake.inject_command(GROUP, "/taskcard on")
        assert [c.args for c in await inbox.wait_for(2)] == ["off", "on"]
    finally:
        await channel.stop()
    failures = [r for r in caplog.records if "update offset" in r.getMessage()]
    assert failures, "the failure is logged"
    assert all(r.exc_info is None and r.levelname == "WARNING" for r in failures)
    assert "no space left on device" in failures[0].getMessage()


@pytest.mark.parametrize(
    ("text", "spans", "marked"),
    [
        ("/taskcard off Alice Smith", [(14, 11)], "/taskcard off  @_mention "),
        # Offsets count UTF-16 units: an emoji before the name is two.
        ("/taskcard 😀Alice", [(12, 5)], "/taskcard 😀 @_mention "),
        ("/taskcard Ann and Bo", [(10, 3), (18, 2)], "/taskcard  @_mention  and  @_mention "),
        # Inside the emoji, or past the text's end: the text as it is.
        ("/taskcard 😀Alice", [(11, 6)], "/taskcard 😀Alice"),
        ("/taskcard off", [(10, 9)], "/taskcard off"),
        ("/taskcard off", [], "/taskcard off"),
        # Each entity on its own: a bad one is left out, the good ones still count, and
        # overlapping ones are one mention of what they cover together.
        ("/taskcard 😀Alice", [(11, 6), (12, 5), (12, 0), (-1, 3)], "/taskcard 😀 @_mention "),
        ("/taskcard Ann and Bo", [(10, 5), (12, 8)], "/taskcard  @_mention "),
        ("/taskcard Ann and Bo", [(10, 3), (10, 3), (11, 1)], "/taskcard  @_mention  and Bo"),
    ],
)
def test_a_mention_of_someone_without_a_username_is_marked_as_a_mention(
    text: str, spans: list[tuple[int, int]], marked: str
) -> None:
    entities = [MessageEntity(MessageEntity.TEXT_MENTION, offset, size) for offset, size in spans]
    assert with_mentions_marked(text, entities) == marked
