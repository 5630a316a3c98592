"""Edge cases of a chat command's words, through `taskcard serve` and both platforms' fakes.

Telegram marks no command in `/taskcard@ off` (tdlib's `match_bot_commands` wants 3 to 32
name characters after the `@`), ends a command word at an invisible character glued to it
(`/taskcard` + a word joiner + `off`) and turns control characters into spaces before a bot
sees them. Feishu reads the same words alike. No option takes a mention of a person: the
answer says so, naming neither the person nor Feishu's placeholder for them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import eventually
from tests.e2e.test_chat_command_words import answered
from tests.e2e.test_talk_and_signals import (
    FS_CHAT,
    FS_PERSON,
    FS_VERIFY,
    GROUP,
    PERSON,
    Chat,
    FeishuChat,
    TelegramChat,
    platform,  # noqa: F401 (the fixture, used by name)
    queued,
    running_card,
    wait_said,
    wait_status,
)


async def test_a_command_glued_to_an_at_sign_without_a_bot_name_is_none(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # `/taskcard@ off` was taken as `/taskcard off`, and `/start@` replying to a card as
    # another bot's command; Telegram marks no command in either.
    async with running_card(platform, tmp_path) as chat:
        for text in ("/taskcard@ off", "/taskcard@\u200b off", "/taskcard@ab off"):
            await chat.say(text)
        await chat.say("/taskcard@" + "b" * 33 + " off")
        await chat.say("/taskcard 7")
        await wait_said(chat, "7 activity rows", "the answer to the real command")
        assert not any("hidden" in t.lower() for t in chat.bot_texts()), chat.bot_texts()
        assert not any("Unknown option" in t for t in chat.bot_texts()), chat.bot_texts()


async def test_an_invisible_character_glued_to_the_command_word_ends_it(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A word joiner, a zero-width space or a combining grapheme joiner a client pasted
    # instead of the space made the message no command (no answer) or an unknown option.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/taskcard\u20604")
        await wait_said(chat, "4 activity rows", "the answer to a word joiner")
        await chat.say("/taskcard\ufeff\u034f5\u034f")
        await wait_said(chat, "5 activity rows", "the answer to a byte-order mark")
        await chat.say("/tell\u200bbuilder\u2060 look")
        await wait_status(chat, "queued")
        [message] = queued(tmp_path)
        assert json.loads(message.read_text())["text"] == "look"
        # "/" and a zero-width space is how the service quotes a command without making it
        # one: copied back into the chat by a person, it is the command they see.
        await chat.say("/\u200btask\u200bcard 6")
        await wait_said(chat, "6 activity rows", "the answer to the quoted command")
        assert not any("Unknown option" in t for t in chat.bot_texts()), chat.bot_texts()


async def test_control_characters_in_a_command_count_as_spaces(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Telegram's servers turn control characters into spaces; Feishu passes them on, and
    # `/taskcard off` with a NUL was an unknown option there (and on the fake Bot API).
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/taskcard\x003\x1b")
        await wait_said(chat, "3 activity rows", "the answer to a NUL and an escape")
        await chat.say("/tell\x07builder\x1f look")
        await wait_status(chat, "queued")
        [message] = queued(tmp_path)
        assert json.loads(message.read_text())["text"] == "look"
        assert not any("Unknown option" in t for t in chat.bot_texts()), chat.bot_texts()
        assert not any("AGENT is one of" in t for t in chat.bot_texts()), chat.bot_texts()


async def test_a_mention_of_a_person_among_the_options_is_named_as_such(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # `/taskcard off @alice` was answered "Unknown option. Did you mean /taskcard off?", as
    # if `off` had not been typed; on Feishu the same with the placeholder `@_user_1`.
    async with running_card(platform, tmp_path) as chat:
        if isinstance(chat, FeishuChat):
            document = chat.fake.command_event(
                FS_CHAT,
                "",
                open_id=FS_PERSON,
                mention_users=("ou_alice",),
                verification_token=FS_VERIFY,
            )
            message = document["event"]["message"]
            # @_user_1 is alice, @_user_2 the bot.
            message["content"] = json.dumps({"text": "@_user_2 /taskcard off @_user_1"})
            assert (await chat.fake.deliver_event(chat.url, document)).status == 200
        else:
            await chat.say("/taskcard off @alice_person")
        await answered(chat, "send /taskcard off without it", 1, "the answer to the mention")
        await chat.say("/taskcard @alice_person")
        await answered(chat, "send /taskcard without it", 1, "the answer to a mention alone")
        await chat.say("/taskcard borad @alice_person")
        await answered(chat, "Unknown option: /taskcard takes no mention", 1, "unknown + mention")
        texts = chat.bot_texts()
        assert not any("hidden" in t.lower() for t in texts), texts
        assert not any("@_user" in t or "alice" in t for t in texts), texts


async def test_the_orchestrator_is_named_as_a_tell_names_an_agent(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # `/tell ｂｕｉｌｄｅｒ hi` reaches builder (a phone's keyboard typed it full-width), while
    # `/taskcard orchestrator ｂｕｉｌｄｅｒ` was answered with the list of agents and
    # `/taskcard orchestrator ｏｆｆ` took `ｏｆｆ` for an agent's name.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/taskcard orchestrator \uff42\uff55\uff49\uff4c\uff44\uff45\uff52")
        await wait_said(chat, "builder is now this chat's orchestrator", "the mark")
        await chat.say("/taskcard orchestrator \uff2f\uff26\uff26")
        await wait_said(chat, "This chat has no orchestrator now", "the mark taken off")
        assert not any("AGENT is one of" in t for t in chat.bot_texts()), chat.bot_texts()


async def test_a_mention_of_someone_without_a_name_to_type_is_named_as_such(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Telegram marks a mention of a person without a username as a `text_mention` entity
    # over their name: "/taskcard off Alice Smith" was an unknown option ("Did you mean
    # /taskcard off?"). Feishu writes a mention where it was typed, glued to the word before
    # it ("off@_user_1"), also one of someone it gives no open_id or of another bot.
    async with running_card(platform, tmp_path) as chat:
        if isinstance(chat, FeishuChat):
            document = chat.fake.command_event(
                FS_CHAT, "", open_id=FS_PERSON, verification_token=FS_VERIFY
            )
            message = document["event"]["message"]
            ours = message["mentions"][0]
            unnamed = {"key": "@_user_2", "id": {"union_id": "on_guest"}, "name": "Alice Smith"}
            message["mentions"] = [{**ours, "key": "@_user_1"}, unnamed]
            message["content"] = json.dumps({"text": "@_user_1 /taskcard off@_user_2"})
            assert (await chat.fake.deliver_event(chat.url, document)).status == 200
        else:
            mentioned = {"Alice Smith": 4242}
            text = "/taskcard off Alice Smith"
            chat.fake.inject_message(GROUP, text, user_id=PERSON, text_mentions=mentioned)
        await answered(chat, "send /taskcard off without it", 1, "the answer to the mention")
        texts = chat.bot_texts()
        assert not any("hidden" in t.lower() or "Unknown option" in t for t in texts), texts
        assert not any("@_" in t or "Alice" in t for t in texts), texts


async def test_a_command_to_someone_else_replying_to_a_card_is_neither_ours_nor_the_agents(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A command addressed to another bot is that bot's, also written as a reply to our card:
    # `/start@ab` (a name Telegram marks no command for, yet no one's command but another
    # bot's), `/taskcard@OtherBot off`, and a command led by a mention of someone else
    # ("@OtherBot /taskcard off"; on Feishu a mention of another app, the only way to
    # address one there), which reached the agent as text for it.
    async with running_card(platform, tmp_path) as chat:
        card = chat.message_id_with("compile")
        assert card is not None
        for text in ("/start@ab now", "/taskcard@OtherBot off"):
            await chat.say(text, reply_to=card)
        if isinstance(chat, FeishuChat):
            document = chat.fake.command_event(
                FS_CHAT,
                "/taskcard off",
                open_id=FS_PERSON,
                mention_bot=False,
                mention_users=("ou_other_app",),
                parent_id=card,
                verification_token=FS_VERIFY,
            )
            assert (await chat.fake.deliver_event(chat.url, document)).status == 200
        else:
            await chat.say("@OtherBot /taskcard off", reply_to=card)
        await chat.say("a real answer", reply_to=card)
        await wait_status(chat, "queued")
        await eventually(lambda: queued(tmp_path), what="the text queued")
        texts = [json.loads(p.read_text())["text"] for p in queued(tmp_path)]
        assert texts == ["a real answer"], texts
        said = chat.bot_texts()
        assert not any("hidden" in t.lower() or "Unknown option" in t for t in said), said


async def test_words_a_direction_override_shows_reversed_are_answered_as_typed(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # "/taskcard", a right-to-left override and "ffo" shows as "/taskcard off"; it is read
    # as typed, as Telegram reads it, and was answered "Unknown option. Did you mean
    # /taskcard off?", which told the person that the "off" they see is unknown. Likewise
    # "/tell" and "redliub", shown as "builder": "AGENT is one of builder".
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/taskcard \u202effo\u202c")
        answer = await wait_said(chat, 'typed: "ffo"', "the answer to the reversed option")
        assert "right-to-left" in answer and "Did you mean" not in answer, answer
        await chat.say("/tell \u202eredliub\u202c hi")
        answer = await wait_said(chat, 'typed: "redliub"', "the answer to the reversed name")
        assert "AGENT is one of builder" in answer, answer
        await chat.say("/taskcard orchestrator \u202eredliub\u202c")
        answer = await wait_said(chat, "orchestrator AGENT: AGENT is one of", "the orchestrator")
        assert 'typed: "redliub"' in answer, answer
        # Words in a right-to-left isolate show in reverse order ("on off" as "off on").
        await chat.say("/taskcard \u2067on off\u2069")
        await wait_said(chat, 'typed: "on off"', "the answer to the isolated words")
        texts = chat.bot_texts()
        assert not any(
            set(t) & set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069") for t in texts
        ), texts
        assert queued(tmp_path) == [] and not any("hidden" in t.lower() for t in texts), texts


async def test_a_command_replying_to_another_bots_card_is_that_bots(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Two card services in one chat: "/taskcard off" written as a reply to the other bot's
    # card is for that bot (Telegram delivers a command replying to a bot's message to that
    # bot), as on Feishu, where a command replying to another app's message without our
    # mention is not ours. On Telegram it hid our cards. Addressed to us by name, it is ours.
    # So is "/tell builder hi" that service's, though we route a `builder` here too: the
    # other service may route one of that name, and one message must get one answer.
    async with running_card(platform, tmp_path) as chat:
        if isinstance(chat, FeishuChat):
            other_card = "om_other_app_card"
            await chat.say("/taskcard off", reply_to=other_card)
            await chat.say("/tell builder hi", reply_to=other_card)
            document = chat.fake.command_event(
                FS_CHAT,
                "/taskcard 6",
                open_id=FS_PERSON,
                parent_id=other_card,
                verification_token=FS_VERIFY,
            )
            assert (await chat.fake.deliver_event(chat.url, document)).status == 200
        else:
            group = {"id": GROUP, "type": "supergroup", "title": "Fleet"}
            person = {"id": PERSON, "is_bot": False, "first_name": "Ann"}
            robot = {"id": 4242, "is_bot": True, "first_name": "Ci", "username": "OtherCardsBot"}
            card = {"message_id": 800, "date": 1, "chat": group, "from": robot, "text": "tests"}
            named = f"/taskcard@{chat.fake.username} 6"
            for index, text in enumerate(("/taskcard off", "/tell builder hi", named)):
                command = {"type": "bot_command", "offset": 0, "length": text.index(" ")}
                message = {"message_id": 900 + index, "date": 1, "chat": group, "from": person}
                message |= {"text": text, "entities": [command], "reply_to_message": card}
                chat.fake.inject_update({"message": message})
        await wait_said(chat, "6 activity rows", "the answer to the command naming us")
        await chat.say("/taskcard 7")
        await wait_said(chat, "7 activity rows", "the answer to the command to us")
        texts = chat.bot_texts()
        assert not any("hidden" in t.lower() for t in texts), texts
        assert queued(tmp_path) == [], texts


async def test_a_command_in_a_topic_another_bot_opened_is_ours(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Telegram gives every message of a forum topic that replies to nothing else the topic's
    # first message as the one it replies to; in a topic another bot opened, a command was
    # taken for one replying to that bot's message, and ignored. It is answered in the topic.
    async with running_card(platform, tmp_path) as chat:
        if isinstance(chat, FeishuChat):
            document = chat.fake.command_event(
                FS_CHAT,
                "/taskcard 6",
                open_id=FS_PERSON,
                parent_id="om_other_app_topic",
                thread_id="omt_other_app",
                verification_token=FS_VERIFY,
            )
            assert (await chat.fake.deliver_event(chat.url, document)).status == 200
        else:
            group = {"id": GROUP, "type": "supergroup", "title": "Fleet", "is_forum": True}
            person = {"id": PERSON, "is_bot": False, "first_name": "Ann"}
            robot = {"id": 4242, "is_bot": True, "first_name": "Ci", "username": "OtherCardsBot"}
            opened = {"name": "Builds", "icon_color": 7322096}
            root = {"message_id": 55, "date": 1, "chat": group, "from": robot}
            root |= {"message_thread_id": 55, "forum_topic_created": opened}
            text = "/taskcard 6"
            message = {"message_id": 56, "date": 1, "chat": group, "from": person, "text": text}
            message |= {"message_thread_id": 55, "is_topic_message": True}
            message |= {"entities": [{"type": "bot_command", "offset": 0, "length": 9}]}
            chat.fake.inject_update({"message": {**message, "reply_to_message": root}})
        await wait_said(chat, "6 activity rows", "the answer in the topic")
        if not isinstance(chat, FeishuChat):
            [answer] = [m for m in chat.fake.bot_messages(GROUP) if "6 activity rows" in m.text]
            assert answer.thread_id == 55


async def say_naming(chat: Chat, text: str) -> None:
    """Write `text` with `{bot}` and `{again}` two mentions of the bot and `{other}` one of
    someone else, as the platform carries them: on Telegram `@username` as typed (the bot's
    in another case the second time); on Feishu each a placeholder key of its own listed with
    the event (the bot mentioned twice gets two keys)."""
    if isinstance(chat, TelegramChat):
        name = "@" + chat.fake.username
        await chat.say(text.format(bot=name, again=name.upper(), other="@OtherBot"))
        return
    assert isinstance(chat, FeishuChat)
    document = chat.fake.command_event(
        FS_CHAT,
        "",
        open_id=FS_PERSON,
        mention_users=("ou_other_app",),
        verification_token=FS_VERIFY,
    )
    message = document["event"]["message"]
    other, bot = message["mentions"]
    message["mentions"] = [other, bot, {**bot, "key": "@_user_3"}]
    words = text.format(bot=bot["key"], again="@_user_3", other=other["key"])
    message["content"] = json.dumps({"text": words})
    assert (await chat.fake.deliver_event(chat.url, document)).status == 200


async def test_a_command_addressed_to_the_bot_twice_is_the_bots(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # "/taskcard@OurBot@OurBot off" was answered "/taskcard takes no mention: send /taskcard
    # off without it", the mention being the bot's own; on Feishu "/tell" glued to two
    # mentions of the bot, or led by them glued together, was ignored without an answer.
    # The bot named again, glued, in any case, or glued to an option, addresses the
    # command as once does; someone else named after the bot is a mention, said so; a
    # command to someone else first is theirs.
    async with running_card(platform, tmp_path) as chat:
        rows = [
            ("/taskcard{bot}{again} 3", 3),
            ("/taskcard{bot}\n{again} 4", 4),
            ("{bot}{again} /taskcard 5", 5),
            ("/taskcard 6{bot}", 6),
        ]
        for text, count in rows:
            await say_naming(chat, text)
            await answered(chat, f"now show {count} activity rows", 1, f"the answer to {text!r}")
        # The name typed after the `@`, twice, in another case the second time.
        name = chat.fake.username if isinstance(chat, TelegramChat) else chat.fake.app_name
        await chat.say(f"/taskcard@{name}@{name.upper()} 7")
        await answered(chat, "now show 7 activity rows", 1, "the answer to the name twice")
        await say_naming(chat, "/taskcard{bot}{other} 8")
        await answered(chat, "send /taskcard 8 without it", 1, "the answer to the other's")
        await say_naming(chat, "/tell{bot}{again} builder one")
        await wait_status(chat, "queued")
        await say_naming(chat, "{bot}{again} /tell builder two")
        await eventually(lambda: len(queued(tmp_path)) == 2, what="the second text")
        await say_naming(chat, "/tell{bot}{other} builder three")
        answer = await wait_said(chat, "takes no mention before", "the answer to the /tell")
        assert "AGENT is one of builder" in answer, answer
        await say_naming(chat, "/taskcard{other}{bot} off")
        await chat.say("/taskcard 9")
        await answered(chat, "now show 9 activity rows", 1, "the command after")
        texts = [json.loads(p.read_text())["text"] for p in queued(tmp_path)]
        assert sorted(texts) == ["one", "two"], texts
        said = chat.bot_texts()
        assert not any("hidden" in t.lower() or "Unknown option" in t for t in said), said
        assert not any("@_user" in t or "@OtherBot" in t or "ou_other" in t for t in said), said
