"""Forms people really type a command in, through `taskcard serve` and both platforms' fakes.

On Feishu a command written in the rich editor (a `post` message rather than `text`) reaches
the agent as a typed one does. (A `/tell` whose text starts on the next line is a case of
`test_talk_and_signals.py::test_tell_is_queued_then_delivered_on_one_edited_message`.)
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import eventually, notify, publish, run_cli
from tests.e2e.test_talk_and_signals import (
    FS_CHAT,
    FS_PERSON,
    FS_VERIFY,
    GROUP,
    PERSON,
    STATUS,
    FeishuChat,
    TelegramChat,
    chat_for,
    platform,  # noqa: F401 (the fixture, used by name)
    queued,
    running_agent,
    running_card,
    running_card_shown,
    wait_said,
    wait_status,
    workdir,
)


async def test_feishu_commands_from_the_rich_editor(tmp_path: Path) -> None:
    async with running_card("feishu", tmp_path) as chat:
        assert isinstance(chat, FeishuChat)
        for text in ("/tell builder\n**bold** request", "/TaskCard board"):
            document = chat.fake.command_event(
                FS_CHAT,
                text,
                open_id=FS_PERSON,
                verification_token=FS_VERIFY,
                message_type="post",
            )
            answer = await chat.fake.deliver_event(chat.url, document)
            assert answer.status == 200
        await wait_status(chat, "queued")
        [message] = queued(tmp_path)
        assert json.loads(message.read_text())["text"] == "**bold** request"
        await wait_said(chat, "now shows one task board", "the board answer")


async def test_a_look_alike_of_the_command_is_not_the_command(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # "/tasKcard" with a Kelvin sign (U+212A) folds to "taskcard" in Python's lower(), but it
    # is no command to Telegram nor to the person reading it: on both platforms it is ignored,
    # while the real command right after it is answered.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/tas\u212acard off")
        await chat.say("/taskcard 7")
        await wait_said(chat, "7 activity rows", "the answer to the real command")
        assert not any("hidden" in t.lower() for t in chat.bot_texts())


async def test_a_command_resumes_a_route_disabled_while_the_bot_was_out_of_the_chat(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # The bot removed from the group disables the route (`taskcard status` says why); once
    # it is back, a /taskcard in the chat resumes the card, as the README says.
    async with running_card(platform, tmp_path) as chat:
        if isinstance(chat, TelegramChat):
            chat.fake.kick(GROUP)
        elif isinstance(chat, FeishuChat):
            chat.fake.remove_bot(FS_CHAT)
        publish(workdir(tmp_path), "**link** 2/3")

        def status() -> str:
            return run_cli("status", "--config", str(chat.serve.config)).stdout

        await eventually(lambda: "DISABLED" in status(), timeout_s=60, what="disabled")
        if isinstance(chat, TelegramChat):
            chat.fake.readmit(GROUP)
        elif isinstance(chat, FeishuChat):
            chat.fake.add_bot(FS_CHAT)
        await chat.say("/taskcard")
        await eventually(lambda: chat.message_id_with("link"), timeout_s=60, what="resumed")
        assert "DISABLED" not in status()


async def test_invisible_characters_a_client_pasted_change_no_command(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Chat clients paste zero-width spaces, directional marks, word joiners, byte-order marks
    # and no-break spaces around what people type. `/taskcard off` followed by a zero-width
    # space was answered "Unknown option"; the command reads as it shows, on both platforms,
    # while a visible typo still gets the answer naming the options.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/taskcard offx")
        await wait_said(chat, "Unknown option", "the answer to a visible typo")
        assert any("/taskcard off: hide the cards" in t for t in chat.bot_texts())
        await chat.say("\ufeff/taskcard off\u200b")
        await wait_said(chat, "Task cards hidden here", "the answer to off")
        await chat.say("/TaskCard\u2060\u00a0\u200e7\u202c\u00a0")
        await wait_said(chat, "7 activity rows", "the answer to 7")
        await chat.say(
            "\u200b/tell\u2061 \u200fbuilder\u200d look \U0001f468\u200d\U0001f4bb\u00a0"
        )
        await wait_status(chat, "queued")
        [message] = queued(tmp_path)
        assert json.loads(message.read_text())["text"] == "look \U0001f468\u200d\U0001f4bb"
        assert not any("AGENT is one of" in t for t in chat.bot_texts())
        assert sum("Unknown option" in t for t in chat.bot_texts()) == 1


async def test_a_command_to_this_bot_by_name_with_invisible_characters(tmp_path: Path) -> None:
    # Telegram: `/taskcard@ThisBot` with a zero-width space after the bot's name is ours.
    async with running_card("telegram", tmp_path) as chat:
        assert isinstance(chat, TelegramChat)
        await chat.say(f"/taskcard@{chat.fake.username}\u200b 4")
        await wait_said(chat, "4 activity rows", "the answer")


async def test_a_feishu_app_whose_name_has_a_space_is_addressed_by_name(tmp_path: Path) -> None:
    # `/taskcard@Name` names this app when Name is its name; "Task Card" has a space, and
    # `/taskcard@Task Card off` was taken for a command to an app named "Task". Picking the
    # bot after the `@` (a mention glued to the command) is ours too; another name is not.
    async with chat_for("feishu", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, FeishuChat)
        chat.fake.app_name = "Task Card"
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            glued = chat.fake.command_event(
                FS_CHAT, "/taskcard 3", open_id=FS_PERSON, verification_token=FS_VERIFY
            )
            glued["event"]["message"]["content"] = json.dumps({"text": "/taskcard@_user_1 3"})
            assert (await chat.fake.deliver_event(chat.url, glued)).status == 200
            await wait_said(chat, "3 activity rows", "the answer to the picked mention")
            await chat.say("/taskcard@Task Cards 5")
            await chat.say("/taskcard@task  card\u200b off")
            await wait_said(chat, "Task cards hidden here", "the answer to the typed name")
            assert not any("5 activity rows" in t for t in chat.bot_texts())
            assert await chat.serve.aterminate() == 0


async def test_a_feishu_app_with_a_cjk_name_is_addressed_with_the_option_glued(
    tmp_path: Path,
) -> None:
    # Chinese text has no spaces: `/taskcard@任务卡片off`, the app's name typed with the
    # option glued after it, went unanswered (read as a command to an app named
    # "任务卡片off"). It is ours when what follows the name is an option; a longer name
    # that starts with ours (`任务卡片助手`, `任务卡片Pro`) is still another app's.
    async with chat_for("feishu", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, FeishuChat)
        chat.fake.app_name = "任务卡片"
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await chat.say("/taskcard@任务卡片助手off", mention=False)
            await chat.say("@任务卡片Pro /taskcard 5", mention=False)
            await chat.say("/taskcard@任务卡片off", mention=False)
            await wait_said(chat, "Task cards hidden here", "the answer to the glued option")
            await chat.say("@任务卡片/taskcard on", mention=False)
            await wait_said(chat, "Task cards shown here", "the answer to the glued command")
            said = chat.bot_texts()
            assert not any("5 activity rows" in t or "Unknown" in t for t in said), said
            assert await chat.serve.aterminate() == 0


async def test_a_full_width_option_glued_after_a_cjk_app_name_is_the_option(
    tmp_path: Path,
) -> None:
    # `@任务卡片off` was read but `@任务卡片ＯＦＦ` (a phone keyboard in full-width mode) was
    # not: the option glued after the name was compared as typed. It is read by the one
    # folding rule of every option (`channels.base.folded`); another app's longer name, also
    # typed full-width (`任务卡片Ｐｒｏ`), is still not ours.
    async with chat_for("feishu", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, FeishuChat)
        chat.fake.app_name = "任务卡片"
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await chat.say("@任务卡片Ｐｒｏ /taskcard 5", mention=False)
            await chat.say("/taskcard@任务卡片Ｐｒｏ 4", mention=False)
            await chat.say("/taskcard@任务卡片ＯＦＦ", mention=False)
            await wait_said(chat, "Task cards hidden here", "the answer to the full-width option")
            await chat.say("/taskcard@任务卡片ｏｎ", mention=False)
            await wait_said(chat, "Task cards shown here", "the answer to the lower-case one")
            said = chat.bot_texts()
            assert not any("activity rows" in t or "Unknown" in t for t in said), said
            assert await chat.serve.aterminate() == 0


async def test_a_ligature_in_an_option_glued_after_a_cjk_app_name_is_read_as_its_letters(
    tmp_path: Path,
) -> None:
    # `/taskcard oﬀ` was read as `off` (`folded`: the ligature `ﬀ` is the letters it joins),
    # but glued after a CJK app's name it was not: the pattern that finds the option there
    # knew only the characters read as one letter each, so the command went unanswered.
    async with chat_for("feishu", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, FeishuChat)
        chat.fake.app_name = "任务卡片"
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await chat.say("/taskcard@任务卡片oﬀline", mention=False)  # another app's name
            await chat.say("/taskcard@任务卡片oﬀ", mention=False)
            await wait_said(chat, "Task cards hidden here", "the answer to the ligature")
            await chat.say("/taskcard@任务卡片ﬆatus", mention=False)
            await wait_said(chat, "Task cards here", "the answer to status")
            said = chat.bot_texts()
            assert not any("activity rows" in t or "Unknown" in t for t in said), said
            assert len([t for t in said if "Task cards hidden here" in t]) == 1, said
            assert await chat.serve.aterminate() == 0


async def test_the_app_name_typed_addresses_a_command_as_its_picked_mention(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Telegram reads "@ThisBot /taskcard 3" and "/tell builder@ThisBot hi" typed. On Feishu
    # the app's name typed after an `@` (not picked from the list, so the event lists no
    # mention) was no mention: "@Task Card /taskcard 3" in a group went unanswered, and so
    # did "/tell builder@Task Card hi". Typed, in any case, it addresses the command as the
    # picked mention does, before the command or glued to the agent's name; another app's
    # name, even one that starts with ours, never does.
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        assert isinstance(chat, TelegramChat | FeishuChat)
        if isinstance(chat, FeishuChat):
            chat.fake.app_name = name = "Task Card"
        else:
            name = chat.fake.username
        running_agent(tmp_path)

        async def typed(text: str) -> None:
            if isinstance(chat, FeishuChat):
                await chat.say(text, mention=False)  # no mention listed: the name is text
            else:
                await chat.say(text)

        with chat.serve:
            await running_card_shown(chat)
            await typed(f"@{name.lower()} /taskcard 3")
            await wait_said(chat, "now show 3 activity rows", "the answer to the name first")
            await typed(f"/tell builder@{name.upper()} one")
            await wait_status(chat, "queued")
            await typed(f"@{name}  /tell builder two")
            await eventually(lambda: len(queued(tmp_path)) == 2, what="the second text")
            if isinstance(chat, FeishuChat):
                # Another app's name, and ours as the start of a longer one: not ours, and a
                # command in a group without our mention is no one's to answer.
                await typed("@Task Cards /taskcard off")
                await typed("@Other App /taskcard off")
                await typed("/tell builder@Task Cards three")
            await typed(f"/taskcard 4 @{name}")
            await wait_said(chat, "now show 4 activity rows", "the answer to the name last")
            texts = sorted(json.loads(p.read_text())["text"] for p in queued(tmp_path))
            assert texts == ["one", "two"], texts
            said = chat.bot_texts()
            assert not any("hidden" in t or "mention" in t or "AGENT" in t for t in said), said
            assert await chat.serve.aterminate() == 0


async def test_an_agents_name_glued_after_the_app_name_is_a_tell_to_it(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Chinese text has no spaces: `/tell@任务卡片builder hi`, the app's CJK name typed with
    # the agent's name glued after it, went unanswered. It is `/tell builder hi` when the
    # glued word names an agent of the chat (full-width too); otherwise it may be another
    # app's longer name (`任务卡片Pro`), and is no one's to answer. On Telegram a username
    # is ASCII as an agent's name is: `/tell@ThisBotbuilder` names another bot, never ours
    # (`/tell@ThisBot builder` is the form), so only the Feishu form is read.
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        assert isinstance(chat, TelegramChat | FeishuChat)
        if isinstance(chat, FeishuChat):
            chat.fake.app_name = "任务卡片"
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            if isinstance(chat, FeishuChat):
                await chat.say("/tell@任务卡片Pro three", mention=False)
                await chat.say("/tell@任务卡片助手builder four", mention=False)
                await chat.say("/tell@任务卡片builder one", mention=False)
                await chat.say("／tell@任务卡片ｂｕｉｌｄｅｒ\ntwo", mention=False)
            else:
                name = chat.fake.username
                await chat.say(f"/tell@{name}builder three")
                await chat.say(f"/tell@{name} builder one")
                await chat.say(f"/tell@{name.upper()}@{name} builder\ntwo")
            await eventually(lambda: len(queued(tmp_path)) == 2, what="the two texts")
            await chat.say("/taskcard 4")
            await wait_said(chat, "now show 4 activity rows", "the answer after them")
            texts = sorted(json.loads(p.read_text())["text"] for p in queued(tmp_path))
            assert texts == ["one", "two"], texts
            said = chat.bot_texts()
            assert not any("AGENT" in t or "mention" in t for t in said), said
            assert await chat.serve.aterminate() == 0


async def say_after_two_mentions(chat: FeishuChat | TelegramChat, text: str) -> None:
    """`text` led by two mentions of the bot, as a person picks them: on Telegram the
    username typed twice, on Feishu two mentions listed with the event, one key each."""
    if isinstance(chat, TelegramChat):
        await chat.say(f"@{chat.fake.username} @{chat.fake.username} {text}")
        return
    document = chat.fake.command_event(
        FS_CHAT, "unused", open_id=FS_PERSON, verification_token=FS_VERIFY
    )
    message = document["event"]["message"]
    [mention] = message["mentions"]
    message["mentions"].append({**mention, "key": "@_user_2"})
    message["content"] = json.dumps({"text": f"@_user_1 @_user_2 {text}"})
    assert (await chat.fake.deliver_event(chat.url, document)).status == 200


async def test_the_bot_named_twice_addresses_a_command_as_once_does(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A Feishu app named "Task Card": `/taskcard@Task Card@Task Card 3` was taken for a
    # command to someone else and `/taskcard@Task Card @Task Card 4` answered that /taskcard
    # takes no mention, while Telegram reads `/taskcard@ThisBot @ThisBot 4` as `4`. Two
    # mentions of the bot leading a `/tell` made it no command on both platforms.
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        assert isinstance(chat, TelegramChat | FeishuChat)
        name = "Task Card"
        if isinstance(chat, FeishuChat):
            chat.fake.app_name = name
        else:
            name = chat.fake.username
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await say_after_two_mentions(chat, "/tell builder one")
            await wait_status(chat, "queued")
            await chat.say(f"/taskcard@{name}@{name} 3")
            await wait_said(chat, "3 activity rows", "the answer to the name glued twice")
            await chat.say(f"/taskcard@{name} @{name.lower()} 4")
            await wait_said(chat, "4 activity rows", "the answer to the name twice")
            [message] = queued(tmp_path)
            assert json.loads(message.read_text())["text"] == "one"
            assert not any("mention" in text for text in chat.bot_texts())
            assert await chat.serve.aterminate() == 0


async def test_a_feishu_bot_mentioned_twice_is_ours_when_its_id_is_unknown(
    tmp_path: Path,
) -> None:
    # Without the bot's info (Feishu would not give it at the start) the first mention is
    # taken as the bot's; its second mention, the same open_id, was someone else's, and
    # `@Task Card @Task Card /taskcard off` was no command.
    async with chat_for("feishu", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, FeishuChat)
        chat.fake.app_name = "Task Card"
        chat.fake.bot_info_available = False
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await say_after_two_mentions(chat, "/taskcard off")
            await wait_said(chat, "Task cards hidden here", "the answer to off")
            assert await chat.serve.aterminate() == 0


async def test_a_picture_sent_with_a_tell_as_its_caption_reaches_the_agent(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A screenshot with "/tell builder ..." under it: on Feishu a rich message with a picture
    # is read by its text; Telegram's caption was not read at all, and nothing answered.
    async with running_card(platform, tmp_path) as chat:
        text = "/tell builder see the failing test"
        if isinstance(chat, TelegramChat):
            chat.fake.inject_message(GROUP, text, user_id=PERSON, photo=True)
        elif isinstance(chat, FeishuChat):
            document = chat.fake.command_event(
                FS_CHAT,
                text,
                open_id=FS_PERSON,
                verification_token=FS_VERIFY,
                message_type="post",
            )
            post = json.loads(document["event"]["message"]["content"])
            post["content"].append([{"tag": "img", "image_key": "img_v2_1"}])
            document["event"]["message"]["content"] = json.dumps(post)
            assert (await chat.fake.deliver_event(chat.url, document)).status == 200
        await wait_status(chat, "queued")
        [message] = queued(tmp_path)
        assert json.loads(message.read_text())["text"].startswith("see the failing test")


async def test_a_telegram_command_beside_a_mention_of_the_bot_is_ours(tmp_path: Path) -> None:
    # On Feishu a command in a group is written beside the bot's mention ("@taskcard
    # /taskcard off", the mention first or last); the same on Telegram was ignored without an
    # answer (the text did not start with the command) or answered "Unknown option".
    async with running_card("telegram", tmp_path) as chat:
        assert isinstance(chat, TelegramChat)
        bot = chat.fake.username
        await chat.say(f"@{bot} /taskcard 6")
        await wait_said(chat, "6 activity rows", "the answer to the mention first")
        await chat.say(f"/taskcard off @{bot.lower()}")
        await wait_said(chat, "Task cards hidden here", "the answer to the mention last")
        assert not any("Unknown option" in t for t in chat.bot_texts())


async def test_words_no_person_typed_here_command_nothing_and_reach_no_agent(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A forwarded "/tell builder ..." (someone else's words from elsewhere), a linked
    # channel's "/taskcard off" that Telegram forwards into its discussion group by itself,
    # and a command another bot (a Feishu app) sent: each was taken as a command of a person
    # of this chat, the text queued for the agent and the cards hidden. They change nothing;
    # the person's own command after them is answered. The route lets anyone command it.
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        assert isinstance(chat, TelegramChat | FeishuChat)
        config = chat.config.read_text()
        chat.config.write_text(
            "\n".join(line for line in config.splitlines() if "allowed_user_ids" not in line)
        )
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            if isinstance(chat, TelegramChat):
                group = {"id": GROUP, "type": "supergroup", "title": "Fleet"}
                person = {"id": PERSON, "is_bot": False, "first_name": "Ann"}
                robot = {"id": 4242, "is_bot": True, "first_name": "Ci", "username": "CiBot"}
                channel = {"id": -1009999, "type": "channel", "title": "News"}
                origin = {"type": "user", "date": 1, "sender_user": robot}
                for index, message in enumerate(
                    [
                        {"from": person, "forward_origin": origin, "text": "/tell builder a"},
                        {
                            "from": {"id": 777000, "is_bot": False, "first_name": "Telegram"},
                            "sender_chat": channel,
                            "is_automatic_forward": True,
                            "forward_origin": {
                                "type": "channel",
                                "date": 1,
                                "chat": channel,
                                "message_id": 5,
                            },
                            "text": "/taskcard off",
                        },
                        {"from": robot, "text": "/tell builder b"},
                        {"from": robot, "text": "/taskcard off"},
                    ]
                ):
                    chat.fake.inject_update(
                        {
                            "message": {
                                "message_id": 900 + index,
                                "date": 1,
                                "chat": group,
                                **message,
                            }
                        }
                    )
            elif isinstance(chat, FeishuChat):
                for text in ("/tell builder b", "/taskcard off"):
                    document = chat.fake.command_event(
                        FS_CHAT, text, open_id="ou_ci_app", verification_token=FS_VERIFY
                    )
                    document["event"]["sender"]["sender_type"] = "app"
                    assert (await chat.fake.deliver_event(chat.url, document)).status == 200
            await chat.say("/taskcard 7")
            await wait_said(chat, "7 activity rows", "the answer to the person's command")
            assert queued(tmp_path) == []
            await chat.say("/taskcard")
            await wait_said(chat, "shown, 7 activity rows", "the state: the cards still shown")
            assert not any("hidden" in t.lower() for t in chat.bot_texts())
            assert await chat.serve.aterminate() == 0


async def test_forwards_and_edits_act_on_nothing(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A forward is someone else's words shown again, not a command of the forwarder: a
    # forwarded "/taskcard off", or a forwarded message that replies to the card, does
    # nothing. An edit is never read: a message edited into "/taskcard off" or into a reply
    # to the card acts on nothing, so nothing acts twice. Feishu forwards many messages as
    # one `merge_forward` message and sends no edit as a message event. Only `text` and
    # `post` messages are read: a `merge_forward` is not, whatever its content holds (here
    # "/taskcard off", where Feishu puts a fixed line, so that the check would catch one read
    # as text), and neither is an event of another type (an edit's, should one come).
    async with running_card(platform, tmp_path) as chat:
        card = chat.message_id_with("compile")
        assert card is not None
        if isinstance(chat, TelegramChat):
            group = {"id": GROUP, "type": "supergroup", "title": "Fleet"}
            person = {"id": PERSON, "is_bot": False, "first_name": "Ann"}
            origin = {"type": "user", "date": 1, "sender_user": person}
            ours = {"id": 123456, "is_bot": True, "first_name": "Taskcard Test"}
            replied = {"message_id": int(card), "date": 1, "chat": group, "text": "compile"}
            replied["from"] = ours | {"username": chat.fake.username}
            command = [{"type": "bot_command", "offset": 0, "length": 9}]
            for index, message in enumerate(
                [
                    {"forward_origin": origin, "text": "/taskcard off", "entities": command},
                    {"forward_origin": origin, "text": "ship it", "reply_to_message": replied},
                ]
            ):
                base = {"message_id": 900 + index, "date": 2, "chat": group, "from": person}
                chat.fake.inject_update({"message": base | message})
            for index, message in enumerate(
                [
                    {"text": "/taskcard off", "entities": command},
                    {"text": "ship it", "reply_to_message": replied},
                ]
            ):
                base = {"message_id": 910 + index, "date": 2, "chat": group, "from": person}
                edited = base | message | {"edit_date": 3}
                chat.fake.inject_update({"edited_message": edited})
        elif isinstance(chat, FeishuChat):
            merged = chat.fake.command_event(
                FS_CHAT,
                "/taskcard off",
                open_id=FS_PERSON,
                verification_token=FS_VERIFY,
                message_type="merge_forward",
            )
            assert "/taskcard off" in merged["event"]["message"]["content"]
            edited = chat.fake.command_event(
                FS_CHAT, "/taskcard off", open_id=FS_PERSON, verification_token=FS_VERIFY
            )
            edited["header"]["event_type"] = "im.message.updated_v1"
            for document in (merged, edited):
                assert (await chat.fake.deliver_event(chat.url, document)).status == 200
        await chat.say("/taskcard 7")
        await wait_said(chat, "7 activity rows", "the answer to the person's own command")
        await chat.say("/taskcard")
        await wait_said(chat, "shown, 7 activity rows", "the state: the cards still shown")
        texts = chat.bot_texts()
        assert queued(tmp_path) == [] and not any(STATUS in t for t in texts), texts
        assert not any("hidden" in t.lower() for t in texts), texts


async def test_a_misspelt_option_is_answered_with_the_one_it_likely_meant(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # "/taskcard borad", "/taskcard off please" and an Arabic-Indic "/taskcard ٥" were
    # answered with the whole help alone; the answer now names the option they likely
    # meant (never quoting what was typed), and does nothing. (A full-width word is the
    # word itself: test_a_full_width_option_is_the_option.)
    async with running_card(platform, tmp_path) as chat:
        for typed, meant in (
            ("borad", "board"),
            ("off please", "off"),
            ("\u0665", "5"),  # an Arabic-Indic digit, read as a mistyped 5
        ):
            await chat.say(f"/taskcard {typed}")
            await wait_said(chat, f"Did you mean /taskcard {meant}?", f"{meant} suggested")
        await chat.say("/taskcard xyzzy")
        answer = await wait_said(chat, "Unknown option. /taskcard:", "the help alone")
        assert "xyzzy" not in answer
        await chat.say("/taskcard")
        await wait_said(chat, "shown, 3 activity rows.", "the state: nothing done")
        assert not any("now shows one task board" in t for t in chat.bot_texts())


async def test_a_full_width_option_is_the_option(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A phone's CJK keyboard types full-width letters and digits. `/taskcard ＯＦＦ` was
    # answered "Did you mean /taskcard off?" while `/taskcard orchestrator ＯＦＦ` was taken;
    # every option word is now read in its compatibility form (NFKC), as agents' names are.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/taskcard \uff2f\uff26\uff26")
        await wait_said(chat, "Task cards hidden here.", "the cards hidden")
        await chat.say("/taskcard \uff4f\uff4e")
        await wait_said(chat, "Task cards shown here.", "the cards shown again")
        await chat.say("/taskcard \uff15")
        await wait_said(chat, "now show 5 activity rows", "five rows")
        await chat.say("/taskcard \uff22\uff2f\uff21\uff32\uff24")
        await wait_said(chat, "now shows one task board", "the board")
        assert not any("Did you mean" in t or "Unknown option" in t for t in chat.bot_texts())


async def test_a_row_count_out_of_range_is_answered_with_the_range(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # "/taskcard 0", "/taskcard 11", "/taskcard -3" and a number too long to read were
    # answered "Unknown option" and the whole help, as if a count were no option; the
    # answer now says the range, and the rows stay as they were. A number of more than
    # 4,300 digits (Python's limit for `int`) got no answer at all, a traceback in the log.
    huge = "9" * 5000
    async with running_card(platform, tmp_path) as chat:
        typed_forms = ("0", "11", "-3", "99999999999999999999999", "\uff11\uff12", "\u0661\u0662")
        for typed in (*typed_forms, huge, f"-{huge}"):
            before = len(chat.bot_texts())
            await chat.say(f"/taskcard {typed}")
            await eventually(
                lambda before=before: any(
                    "shows 1 to 10 activity rows: /taskcard 10 shows the most" in t
                    for t in chat.bot_texts()[before:]
                ),
                timeout_s=60,
                what=f"the range in the answer to /taskcard {typed[:30]}",
            )
        assert not any("Unknown option" in t for t in chat.bot_texts())
        await chat.say("/taskcard")
        await wait_said(chat, "shown, 3 activity rows.", "the state: the rows unchanged")


async def test_one_activity_row_is_said_in_the_singular(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    """`/taskcard 1` was answered "now show 1 activity rows", and the state said so too."""
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/taskcard 1")
        await wait_said(chat, "now show 1 activity row.", "the answer in the singular")
        await chat.say("/taskcard")
        await wait_said(chat, "shown, 1 activity row.", "the state in the singular")
        assert not any("1 activity rows" in t for t in chat.bot_texts())


async def test_a_reply_to_the_status_of_a_text_reaches_its_agent(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # The status message of a text sent to an agent is headed with the agent's line, as its
    # card is, so people reply to it with more text; the reply was dropped without a word on
    # both platforms. It reaches that agent, as a reply to its card does.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/tell builder first")
        await wait_status(chat, "queued")
        status = chat.message_id_with(STATUS)
        assert status is not None
        await chat.say("and a second thing", reply_to=status)
        await eventually(lambda: len(queued(tmp_path)) == 2, what="the reply queued")
        texts = sorted(json.loads(m.read_text())["text"] for m in queued(tmp_path))
        assert texts == ["and a second thing", "first"]


async def test_a_reply_to_a_notice_reaches_the_agent_it_is_about_also_after_a_restart(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A notice is about one agent (its card broke here), so people reply to it with what the
    # agent should do; the reply was dropped without a word on both platforms. It reaches
    # that agent, not the other one of the chat, as a reply to its card does, also after a
    # restart (the state keeps whose notice each message is). A Feishu reply to a person's
    # message (not the service's) stays silent.
    async with chat_for(platform, tmp_path, ["builder", "tester"]) as chat:
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            notify(workdir(tmp_path), "task_card.error:tc_1:1:renderer_timeout", "error")
            await wait_said(chat, "builder: task card error", "the error notice")
            notice = chat.message_id_with("builder: task card error")
            assert notice is not None
            if isinstance(chat, FeishuChat):
                person = chat.fake.command_event(FS_CHAT, "hi", verification_token=FS_VERIFY)
                said = str(person["event"]["message"]["message_id"])
                await chat.say("words between people", reply_to=said)
            await chat.say("fix the renderer", reply_to=notice)
            status = await wait_status(chat, "queued")
            assert "Message to builder" in status
            assert await chat.serve.aterminate() == 0
        with chat.restart():
            await chat.say("then run the checks", reply_to=notice)
            await eventually(lambda: len(queued(tmp_path)) == 2, what="the second reply queued")
            assert await chat.serve.aterminate() == 0
    texts = sorted(json.loads(m.read_text())["text"] for m in queued(tmp_path))
    assert texts == ["fix the renderer", "then run the checks"]
    assert queued(tmp_path, "tester") == []
    assert len([t for t in chat.bot_texts() if STATUS in t]) == 2
    assert not any("AGENT is one of" in t or "words between" in t for t in chat.bot_texts())


async def test_a_picture_replying_to_a_card_is_told_that_only_text_reaches_the_agent(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # A picture or sticker sent as a reply to an agent's card reached no one and got no
    # answer on Feishu; on Telegram a captionless one was dropped as well. The person is now
    # told that only text reaches the agent (once in a while: stickers answering a card are
    # common talk), and words replied after it are queued as ever. The captionless pictures
    # of a Telegram album (one update each, with the reply) are not answered at all.
    async with running_card(platform, tmp_path) as chat:
        card = chat.message_id_with("compile")
        assert card is not None

        async def picture(number: int, album: str | None = None) -> None:
            if isinstance(chat, TelegramChat):
                replied = chat.fake.message(GROUP, card)
                assert replied is not None
                group = {"id": GROUP, "type": "supergroup", "title": "Fleet"}
                message: dict[str, object] = {
                    "message_id": number,
                    "date": replied.date,
                    "chat": group,
                    "from": {"id": PERSON, "is_bot": False, "first_name": "Pat"},
                    "reply_to_message": {
                        "message_id": int(card),
                        "date": replied.date,
                        "chat": group,
                        "from": {
                            "id": chat.fake.bot_id,
                            "is_bot": True,
                            "first_name": "Taskcard",
                            "username": chat.fake.username,
                        },
                        "text": replied.text,
                    },
                }
                if album is None:
                    message["sticker"] = {
                        "file_id": "s1",
                        "file_unique_id": "u1",
                        "width": 512,
                        "height": 512,
                        "is_animated": False,
                        "is_video": False,
                        "type": "regular",
                    }
                else:
                    message["media_group_id"] = album
                    message["photo"] = [
                        {"file_id": "p1", "file_unique_id": "q1", "width": 90, "height": 90}
                    ]
                chat.fake.inject_update({"message": message})
            else:
                assert isinstance(chat, FeishuChat)
                document = chat.fake.command_event(
                    FS_CHAT,
                    "",
                    open_id=FS_PERSON,
                    mention_bot=False,
                    parent_id=card,
                    verification_token=FS_VERIFY,
                )
                document["event"]["message"]["message_type"] = "image"
                document["event"]["message"]["content"] = json.dumps({"image_key": "img_v2_1"})
                answer = await chat.fake.deliver_event(chat.url, document)
                assert answer.status == 200

        if isinstance(chat, TelegramChat):
            await picture(899, album="album-1")  # handled before the text replied after it
            await chat.say("see the log", reply_to=card)
            await wait_status(chat, "queued")
            assert not any("Only text reaches" in t for t in chat.bot_texts())
        await picture(900)
        await wait_said(chat, "Only text reaches builder", "the answer to the picture")
        await picture(901)  # told a moment ago: not again
        await chat.say("see more", reply_to=card)
        texts_sent = 2 if isinstance(chat, TelegramChat) else 1
        await eventually(lambda: len(queued(tmp_path)) == texts_sent, what="the text queued")
        texts = sorted(json.loads(m.read_text())["text"] for m in queued(tmp_path))
        assert "see more" in texts
        assert sum("Only text reaches" in t for t in chat.bot_texts()) == 1


async def test_commands_beside_and_inside_characters_outside_the_bmp(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Telegram counts every entity's offset and length in UTF-16 code units, in which an
    # emoji or a letter such as 𝔘 is two; the fake now marks a person's commands that way,
    # wherever they stand. A command after such a character is no command (it does not start
    # the message), one inside a /tell's text is the person's words, and a command and its
    # arguments holding them read as typed, on both platforms.
    async with running_card(platform, tmp_path) as chat:
        addressed = "/taskcard"
        if isinstance(chat, TelegramChat):
            addressed = f"/taskcard@{chat.fake.username}"
        await chat.say(f"😀 {addressed} off")
        await chat.say(f"/tell builder 😀 fix 𝔘nicode, then {addressed} off 🎉")
        await wait_status(chat, "queued")
        [message] = queued(tmp_path)
        text = "😀 fix 𝔘nicode, then " + addressed + " off 🎉"
        assert json.loads(message.read_text())["text"] == text
        await chat.say(f"{addressed} 4 \U0001f600")
        await wait_said(chat, "Unknown option", "the answer to an emoji as an option")
        await chat.say(f"{addressed} 4")
        await wait_said(chat, "4 activity rows", "the answer to 4")
        if isinstance(chat, TelegramChat):
            chat.fake.inject_message(GROUP, "/tell builder 🖼️ 𝔰𝔢𝔢 this", user_id=PERSON, photo=True)
            await eventually(lambda: len(queued(tmp_path)) == 2, what="the caption's /tell")
            texts = sorted(json.loads(m.read_text())["text"] for m in queued(tmp_path))
            assert "🖼️ 𝔰𝔢𝔢 this" in texts, texts
        # Commands of one chat are handled in order: the ignored "off" came first.
        assert not any("hidden" in t.lower() for t in chat.bot_texts()), chat.bot_texts()
