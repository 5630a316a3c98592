"""Feishu's command parsing as tables: message text, mentions and event documents in, the
`/taskcard` command (or nothing) out. The transport paths (webhook, long connection) are
tested against the fake in test_feishu_events.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from taskcard.channels.base import ChatRef, IncomingCommand
from taskcard.channels.feishu.events import (
    bot_mention_key,
    bot_mention_keys,
    command_args,
    command_from_event,
)

BOT = "ou_bot"


@pytest.mark.parametrize(
    ("text", "mention_key", "expected"),
    [
        ("/taskcard", None, ""),
        ("/taskcard off", None, "off"),
        ("  /taskcard   3  ", None, "3"),
        ("/taskcard@bot on", None, None),  # addressed to a bot named "bot", not known as us
        ("@_user_1 /taskcard off", "@_user_1", "off"),
        ("/taskcard @_user_1 off", "@_user_1", "off"),
        ("@_user_12 /taskcard off", "@_user_1", None),  # another user's mention stays
        ("@_user_2 /taskcard off", "@_user_1", None),  # addressed to someone else
        ("/taskcards", None, None),
        ("taskcard off", None, None),
        ("please /taskcard off", None, None),
        ("", None, None),
        ("@_user_1", "@_user_1", None),
        # The command word ends where Telegram ends one; a full-width slash opens it.
        ("/taskcard,off", None, ",off"),
        ("/taskcard\U0001f600 off", None, "\U0001f600 off"),
        ("/taskcard\u00e9 off", None, None),
        ("\uff0ftaskcard off", None, "off"),
        ("@_user_1 \uff0fTASKCARD\u00a0board", "@_user_1", "board"),
        ("\uff0f\uff54askcard off", None, None),  # full-width letters stay look-alikes
        # "@" with no name after it names nobody: no command, as Telegram marks none.
        ("/taskcard@ off", None, None),
        ("/taskcard@\u200b off", None, None),
        # An invisible or control character glued to the command word ends it.
        ("/taskcard\u2060off", None, "off"),
        ("/taskcard\u034f\U000e0020 3\u17b4", None, "3"),
        ("/taskcard\x00off\x1b", None, "off"),
        ("/\u200btaskcard off", None, "off"),  # the service's quoted command, pasted back
        ("/taskcard@_user_1\u200boff", "@_user_1", "off"),
    ],
)
def test_command_args(text: str, mention_key: str | None, expected: str | None) -> None:
    assert command_args(text, mention_key) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@_user_1 /taskcard@OtherBot off", None),  # as on Telegram: another bot's command
        ("@_user_1 /taskcard@_user_2 off", None),  # glued to someone else's mention
        ("/taskcard@_user_1 off", "off"),  # glued to ours
        ("@_user_1 /taskcard@TaskCard off", "off"),  # our app's name, any case
        ("@_user_1 /tell@OtherBot builder hi", None),
    ],
)
def test_a_command_addressed_to_another_bot_is_not_ours(text: str, expected: str | None) -> None:
    command = "/tell" if "/tell" in text else "/taskcard"
    assert command_args(text, "@_user_1", command, bot_name="taskcard") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/tell builder@_user_1 hi", "builder hi"),
        ("/tell builder@_user_1@_user_1\nhi", "builder\nhi"),
        ("/tell builder@_user_2 hi", "builder@_user_2 hi"),  # someone else: no agent
        ("/tell builder@_user_12 hi", "builder@_user_12 hi"),
        ("/tell builder hi@_user_1", "builder hi@_user_1"),  # the text's, named later
    ],
)
def test_the_bots_mention_glued_to_the_agents_name_goes(text: str, expected: str) -> None:
    assert command_args(text, "@_user_1", "/tell") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@_user_1 /taskcard@Task Card off", "off"),
        ("/taskcard@task\u00a0CARD\u200b 3", "3"),
        ("@_user_1 /tell@Task Card builder hi\nthere", "builder hi\nthere"),
        ("@_user_1 /taskcard@Task Cards off", None),  # another app's name
        ("@_user_1 /taskcard@Task Card@Task Card off", "off"),  # the name typed twice
        ("@_user_1 /taskcard@Task Card @task card off", "off"),
        ("@_user_1 /tell@Task Card@Task Card builder hi", "builder hi"),
        ("@_user_1 /taskcard@Task Card@Other off", "@Other off"),  # someone else after it
        ("@_user_1 /taskcard@Task Card @Other off", "@Other off"),
        ("@_user_1 /taskcard@Task Card@Task Cards off", "@Task Cards off"),
        ("@_user_1 @_user_1 /tell builder hi", "builder hi"),  # two leading mentions
        ("/tell @_user_1 @_user_1 builder hi", "builder hi"),
        ("@_user_1 /taskcard@Task off", None),
        ("@_user_1 /taskcard@Task", None),
    ],
)
def test_an_app_name_with_a_space_is_typed_as_it_shows(text: str, expected: str | None) -> None:
    command = "/tell" if "/tell" in text else "/taskcard"
    assert command_args(text, "@_user_1", command, bot_name="Task Card") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Chinese text has no spaces: the app's name with an option glued after it.
        ("/taskcard@任务卡片off", "off"),
        ("/taskcard@任务卡片OFF", "OFF"),
        ("/taskcard@任务卡片help now", "help now"),
        ("@任务卡片/taskcard 3", "3"),
        ("/taskcard@任务卡片 off", "off"),
        # Another app's longer name, or ours glued to a word that is no option: not ours.
        ("/taskcard@任务卡片助手 off", None),
        ("/taskcard@任务卡片Pro off", None),
        ("/taskcard@任务卡片offline", None),
        ("/taskcard@任务卡片on助手", None),
        ("/taskcard@任务卡片3", None),  # "任务卡片3" may be another app's name
        ("/tell@任务卡片builder hi", None),  # an agent's name is no option
    ],
)
def test_a_cjk_app_name_reads_an_option_glued_after_it(text: str, expected: str | None) -> None:
    command = "/tell" if "/tell" in text else "/taskcard"
    assert command_args(text, (), command, bot_name="任务卡片") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@_user_1 /taskcard off @_user_2", "off"),  # the bot mentioned twice
        ("@_user_1 /taskcard @_user_2 off", "off"),
        ("@_user_1 @_user_2 /taskcard 3", "3"),
        ("@_user_1 @_user_3 /taskcard off", None),  # someone else's mention leads
        ("@_user_1 /tell @_user_2 builder hi", "builder hi"),
    ],
)
def test_every_mention_of_the_bot_goes(text: str, expected: str | None) -> None:
    command = "/tell" if "/tell" in text else "/taskcard"
    assert command_args(text, ("@_user_1", "@_user_2"), command) == expected


def mention(key: str, open_id: str) -> dict[str, Any]:
    return {"key": key, "id": {"open_id": open_id}, "name": "someone"}


@pytest.mark.parametrize(
    ("mentions", "bot_open_id", "expected"),
    [
        ([mention("@_user_1", BOT)], BOT, "@_user_1"),
        ([mention("@_user_1", "ou_alice"), mention("@_user_2", BOT)], BOT, "@_user_2"),
        ([mention("@_user_1", "ou_alice")], BOT, None),
        ([mention("@_user_1", "ou_alice")], None, "@_user_1"),  # bot unknown: any user
        ([mention("@_all", "")], None, None),  # not a user mention
        ("not a list", BOT, None),
        ([None, 3, {"key": 5}], BOT, None),
        (None, BOT, None),
    ],
)
def test_bot_mention_key(mentions: object, bot_open_id: str | None, expected: str | None) -> None:
    assert bot_mention_key(mentions, bot_open_id) == expected


def test_bot_mention_keys_are_every_mention_of_the_bot() -> None:
    mentions = [mention("@_user_1", BOT), mention("@_user_2", "ou_alice"), mention("@_user_3", BOT)]
    assert bot_mention_keys(mentions, BOT) == ("@_user_1", "@_user_3")
    # The bot unknown: the first mention's, and every other mention of the same open_id.
    assert bot_mention_keys(mentions, None) == ("@_user_1", "@_user_3")
    unnamed = [{"key": "@_user_1", "id": {}}, mention("@_user_2", BOT)]
    assert bot_mention_keys(unnamed, None) == ("@_user_1",)
    assert bot_mention_keys([mention("@_user_1", "ou_alice")], BOT) == ()


def event(
    text: object,
    *,
    chat_type: str = "group",
    mentions: object = None,
    message_type: str = "text",
    event_type: str = "im.message.receive_v1",
    sender: object = None,
) -> dict[str, Any]:
    content = json.dumps({"text": text}) if not isinstance(text, bytes) else text.decode()
    return {
        "schema": "2.0",
        "header": {"event_id": "e1", "event_type": event_type},
        "event": {
            "sender": {"sender_id": {"open_id": "ou_alice"}} if sender is None else sender,
            "message": {
                "message_id": "om_1",
                "chat_id": "oc_group",
                "chat_type": chat_type,
                "message_type": message_type,
                "content": content,
                "mentions": [mention("@_user_1", BOT)] if mentions is None else mentions,
            },
        },
    }


def command(args: str, user: str | None = "ou_alice") -> IncomingCommand:
    return IncomingCommand(chat=ChatRef("oc_group"), args=args, user_id=user, message_id="om_1")


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (event("@_user_1 /taskcard off"), command("off")),
        (event("@_user_1 /taskcard"), command("")),
        (event("/taskcard off", mentions=[]), None),  # a group needs the bot's mention
        (event("/taskcard off", mentions=[], chat_type="p2p"), command("off")),
        (event("/taskcard off", mentions=[], chat_type="topic_group"), None),
        (event("@_user_1 hello"), None),
        (event("@_user_1 /taskcard off", message_type="image"), None),
        (event("@_user_1 /taskcard off", event_type="im.chat.member.bot.added_v1"), None),
        (event(["not", "text"]), None),
        (event(b"{not json"), None),
        (event("@_user_1 /taskcard 2", sender="nobody"), command("2", user=None)),
        ({"header": "not an object"}, None),
        ({"header": {"event_type": "im.message.receive_v1"}, "event": []}, None),
        ({}, None),
    ],
)
def test_command_from_event(document: dict[str, Any], expected: IncomingCommand | None) -> None:
    assert command_from_event(document, BOT) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("please stop", ("reply", "please stop")),
        ("/home/me@host is full", ("reply", "/home/me@host is full")),  # a path, not a command
        ("/start@OtherBot", None),  # another bot's command is not text for the agent
        ("/help@_user_2 now", None),  # glued to someone else's mention
        ("/taskcard off", ("taskcard", "off")),  # a reply addresses the bot: a command
        # The app's name typed addresses the command as its picked mention does: it is the
        # bot's whatever message it replies to.
        ("/taskcard@taskcard 3", ("taskcard", "3")),
    ],
)
def test_a_reply_without_a_mention(text: str, expected: tuple[str, str] | None) -> None:
    document = event(text, mentions=[])
    document["event"]["message"].update(parent_id="om_card", root_id="om_card")
    found = command_from_event(document, BOT, "taskcard")
    assert (None if found is None else (found.command, found.args)) == expected
    if found is not None:
        assert found.reply_to == (() if "@taskcard" in text else ("om_card",))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@task card /taskcard off", ("taskcard", "off")),
        ("@TASK  CARD @Task Card /tell builder hi", ("tell", "builder hi")),
        ("/tell builder@task card hi", ("tell", "builder hi")),
        ("/tell builder hi @Task Card", ("tell", "builder hi @Task Card")),  # the person's
        ("/taskcard off @Task Card", ("taskcard", "off")),
        ("@Task Cards /taskcard off", None),  # another app's name, starting with ours
        ("/tell builder@Task Cards hi", None),
        ("@Other /taskcard off", None),
    ],
)
def test_the_app_name_typed_in_a_group(text: str, expected: tuple[str, str] | None) -> None:
    # Typed, not picked: Feishu lists no mention, and the name is text.
    found = command_from_event(event(text, mentions=[]), BOT, "Task Card")
    assert (None if found is None else (found.command, found.args)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/taskcard@任务卡片off", ("taskcard", "off")),
        ("@任务卡片/taskcard 3", ("taskcard", "3")),
        ("/taskcard@任务卡片助手off", None),
        ("/taskcard@任务卡片助手 off", None),
        ("@任务卡片助手/taskcard off", None),
        ("@任务卡片off", None),  # no command
        ("/taskcard@任务卡片ＯＦＦ", ("taskcard", "ＯＦＦ")),
        ("@任务卡片ｏｆｆ/taskcard", None),  # an option glued, then a command: no option
        ("/taskcard@任务卡片Ｐｒｏ off", None),
        ("/taskcard@任务卡片ｏｆｆｌｉｎｅ", None),
    ],
)
def test_a_cjk_app_name_typed_in_a_group(text: str, expected: tuple[str, str] | None) -> None:
    found = command_from_event(event(text, mentions=[]), BOT, "任务卡片")
    assert (None if found is None else (found.command, found.args)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/tell@任务卡片builder hi", ("builder hi", True)),
        ("/tell@任务卡片ｂｕｉｌｄｅｒ\nhi", ("ｂｕｉｌｄｅｒ\nhi", True)),
        ("/tell@任务卡片 builder hi", ("builder hi", False)),
        ("/tell@任务卡片助手builder hi", None),
        ("/tell@任务卡片builder", ("builder", True)),
        ("/tell@任务卡片builder@任务卡片 hi", ("builder hi", True)),
        ("hi /tell@任务卡片builder hi", None),
    ],
)
def test_an_agents_name_glued_after_a_cjk_app_name(
    text: str, expected: tuple[str, bool] | None
) -> None:
    found = command_from_event(event(text, mentions=[]), BOT, "任务卡片")
    assert (None if found is None else (found.args, found.agent_glued)) == expected
    assert found is None or found.command == "tell"


def test_a_reply_names_the_message_it_answers_not_the_root_of_its_chain() -> None:
    # A reply to someone's reply to the card: Feishu writes the card as its `root_id`.
    document = event("me too", mentions=[])
    document["event"]["message"].update(parent_id="om_theirs", root_id="om_card")
    found = command_from_event(document, BOT, "taskcard")
    assert found is not None and found.reply_to == ("om_theirs",)
