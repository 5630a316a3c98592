"""How `/tell` and replies find the agent and the text a person meant, through `taskcard serve`.

Both platforms run through the chat adapters of `test_talk_and_signals` (the fake Telegram
Bot API and the fake Feishu Open API); the text reaches the agent's `inbox/queued/`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import eventually
from tests.e2e.test_talk_and_signals import (
    FS_CHAT,
    FS_PERSON,
    FS_VERIFY,
    GROUP,
    Chat,
    FeishuChat,
    TelegramChat,
    chat_for,
    platform,
    queued,
    report,
    running_agent,
    running_card,
    running_card_shown,
    wait_said,
    wait_status,
    workdir,
)

__all__ = ["platform"]  # the fixture, parametrized over both platforms


async def say_mentioning_the_bot(chat: Chat, text: str, *, reply_to: str | None = None) -> None:
    """Write `text` with each `{bot}` a mention of the bot, as the platform carries one: on
    Telegram `@username` as typed; on Feishu the placeholder key of a mention listed with
    the event (the fake names the app `taskcard`)."""
    if isinstance(chat, TelegramChat):
        await chat.say(text.format(bot="@" + chat.fake.username), reply_to=reply_to)
        return
    assert isinstance(chat, FeishuChat)
    document = chat.fake.command_event(
        FS_CHAT,
        "unused",
        open_id=FS_PERSON,
        verification_token=FS_VERIFY,
        parent_id=reply_to or "",
    )
    message = document["event"]["message"]
    [mention] = message["mentions"]
    message["content"] = json.dumps({"text": text.format(bot=mention["key"])})
    answer = await chat.fake.deliver_event(chat.url, document)
    assert answer.status == 200


def bot_name(chat: Chat) -> str:
    """How a mention of the bot reads in the text an agent gets."""
    return "@" + (chat.fake.username if isinstance(chat, TelegramChat) else "taskcard")


def texts_queued(tmp_path: Path, agent: str) -> list[str]:
    return [json.loads(p.read_text())["text"] for p in queued(tmp_path, agent)]


async def test_a_tell_finds_the_agent_whatever_the_case_and_asks_when_two_differ_only_so(
    platform: str, tmp_path: Path
) -> None:
    # `/tell Builder hi` was refused as naming no agent of the chat, and `builder` listed as
    # the one to use; so was `/tell builder: hi`. A name is matched exactly first, else
    # regardless of case; when several agents differ only in case, the answer names them
    # and nothing is queued.
    async with running_card(platform, tmp_path, ("builder", "Keeper", "keeper")) as chat:
        await chat.say("/tell Builder look at the logs")
        await wait_status(chat, "queued")
        assert texts_queued(tmp_path, "builder") == ["look at the logs"]
        # "builder:" is how people address someone; no agent id holds a ':' or ','.
        await chat.say("/tell builder: check the disk")
        await eventually(
            lambda: len(texts_queued(tmp_path, "builder")) == 2, what="builder's second"
        )
        await chat.say("/tell KEEPER roll back")
        answer = await wait_said(chat, "differ only in case", "the question")
        assert "Keeper, keeper" in answer and "KEEPER" not in answer
        await chat.say("/tell keeper roll back")
        await eventually(lambda: texts_queued(tmp_path, "keeper"), what="keeper's text")
        # `/taskcard orchestrator` reads the name as `/tell` does, and asks alike: it
        # answered only "AGENT is one of Keeper, builder, keeper", as if no agent had it.
        await chat.say("/taskcard orchestrator KEEPER")
        answer = await wait_said(chat, "orchestrator AGENT: the agents", "the question")
        assert "Keeper, keeper differ only in case" in answer and "KEEPER" not in answer
        assert not any("orchestrator" in text for text in chat.bot_texts() if "is now" in text)
        # A look-alike from another script is no name: a Cyrillic "е" is not an "e".
        await chat.say("/tell k\u0435eper nothing")
        await wait_said(chat, "AGENT is one of Keeper, builder, keeper.", "the refusal")
        assert texts_queued(tmp_path, "Keeper") == []
        assert texts_queued(tmp_path, "keeper") == ["roll back"]
        assert sorted(texts_queued(tmp_path, "builder")) == [
            "check the disk",
            "look at the logs",
        ]


async def test_a_tell_finds_the_agent_in_the_full_width_letters_a_phone_typed(
    platform: str, tmp_path: Path
) -> None:
    # A phone's Chinese or Japanese keyboard types full-width letters (ｂｕｉｌｄｅｒ), and the
    # ideographic space and colon with them: `/tell ｂｕｉｌｄｅｒ hi` was refused as naming no
    # agent. A name is compared in its compatibility form (NFKC), regardless of case; one
    # that folds to several agents is answered with their names, never with the typed one.
    async with running_card(platform, tmp_path, ("builder", "Keeper", "keeper")) as chat:
        await chat.say("/tell ｂｕｉｌｄｅｒ\u3000look at the logs")
        await wait_status(chat, "queued")
        await chat.say("/tell ＢＵＩＬＤＥＲ： check the disk")
        await eventually(
            lambda: len(texts_queued(tmp_path, "builder")) == 2, what="builder's second"
        )
        await chat.say("/tell ＫＥＥＰＥＲ roll back")
        answer = await wait_said(chat, "differ only in case", "the question")
        assert "Keeper, keeper" in answer
        # The exact name wins over a fold after a full-width colon too, as after ":".
        await chat.say("/tell keeper： once more")
        await eventually(lambda: texts_queued(tmp_path, "keeper"), what="keeper's text")
        assert sorted(texts_queued(tmp_path, "builder")) == [
            "check the disk",
            "look at the logs",
        ]
        assert texts_queued(tmp_path, "Keeper") == []
        assert texts_queued(tmp_path, "keeper") == ["once more"]
        typed = ("ｂｕｉｌｄｅｒ", "ＢＵＩＬＤＥＲ", "ＫＥＥＰＥＲ")
        assert not any(name in text for text in chat.bot_texts() for name in typed)


async def test_a_tell_finds_the_agent_through_the_invisible_characters_pasted_with_its_name(
    platform: str, tmp_path: Path
) -> None:
    # A name copied from a card or a message often carries characters that show as nothing:
    # an emoji variation selector (U+FE0F, U+FE0E), a Hangul filler, a zero-width joiner or
    # non-joiner. `/tell builder` + U+FE0F was answered "AGENT is one of builder". Names are
    # compared without Unicode's default-ignorable code points (no agent id holds one); the
    # exact name still wins over a fold, and names that differ in case still ask which.
    async with running_card(platform, tmp_path, ("builder", "Keeper", "keeper")) as chat:
        await chat.say("/tell builder\ufe0f look at the logs")
        await wait_status(chat, "queued")
        typed = (
            "/tell buil\ufe0ed\u200der: one",
            "/tell \u200cbuilder\u3164\U000e0100 two",
            "/tell BUILDER\ufe0f\uffa0 three",
        )
        for count, text in enumerate(typed, start=2):
            await chat.say(text)
            await eventually(
                lambda count=count: len(texts_queued(tmp_path, "builder")) == count,
                what=f"builder's text {count}",
            )
        await chat.say("/tell keeper\ufe0f roll back")
        await eventually(lambda: texts_queued(tmp_path, "keeper"), what="keeper's text")
        await chat.say("/tell KEEPER\ufe0f roll back")
        answer = await wait_said(chat, "differ only in case", "the question")
        assert "Keeper, keeper" in answer
        await chat.say("/taskcard orchestrator builder\ufe0f")
        await wait_said(chat, "builder is now this chat's orchestrator", "the orchestrator")
        await chat.say("/taskcard orchestrator off\ufe0f")
        await wait_said(chat, "This chat has no orchestrator now", "the mark taken off")
        assert sorted(texts_queued(tmp_path, "builder")) == [
            "look at the logs",
            "one",
            "three",
            "two",
        ]
        assert texts_queued(tmp_path, "keeper") == ["roll back"]
        assert texts_queued(tmp_path, "Keeper") == []
        assert not any("AGENT is one of" in t for t in chat.bot_texts()), chat.bot_texts()


async def test_only_the_mention_that_addresses_a_tell_is_taken_out_of_its_text(
    platform: str, tmp_path: Path
) -> None:
    # "/tell builder ask @ThisBot why" reached the agent as "ask   why" (Telegram) and
    # "ask  why" (Feishu, the placeholder dropped): every mention of the bot was removed,
    # not only the one addressing the command. On Feishu the mention reads as the name.
    async with running_card(platform, tmp_path) as chat:
        card = chat.message_id_with("compile")
        assert card is not None
        name = bot_name(chat)
        await say_mentioning_the_bot(chat, "{bot} /tell builder one: ask {bot} why")
        await say_mentioning_the_bot(chat, "/tell {bot} builder two: {bot}")
        await say_mentioning_the_bot(chat, "{bot} three: thanks {bot}", reply_to=card)
        await eventually(lambda: len(texts_queued(tmp_path, "builder")) == 3, what="three texts")
        assert sorted(texts_queued(tmp_path, "builder")) == [
            f"one: ask {name} why",
            f"three: thanks {name}",
            f"two: {name}",
        ]


async def test_the_bots_name_glued_to_the_agents_is_the_bots_agent(
    platform: str, tmp_path: Path
) -> None:
    # A Telegram client completes a name to "builder@ThisBot" (on Feishu, the bot picked right
    # after the name): `/tell builder@ThisBot hi` was answered that no agent has that name.
    # The bot's name there, in any case and once or more, names the bot's agent; another
    # bot's name glued on still names no agent here.
    async with running_card(platform, tmp_path) as chat:
        await say_mentioning_the_bot(chat, "/tell builder{bot} one")
        await wait_status(chat, "queued")
        if isinstance(chat, TelegramChat):
            upper = "@" + chat.fake.username.upper()
            await chat.say(f"/tell builder{upper}{upper}\ntwo")
        else:
            await say_mentioning_the_bot(chat, "/tell builder{bot}{bot}\ntwo")
        await eventually(lambda: len(texts_queued(tmp_path, "builder")) == 2, what="two texts")
        await chat.say("/tell builder@OtherBot three")
        answer = await wait_said(chat, "AGENT is one of builder", "the answer to another bot")
        assert "OtherBot" not in answer
        assert sorted(texts_queued(tmp_path, "builder")) == ["one", "two"]


async def test_a_command_replying_to_a_report_notice_is_the_bots_on_both_platforms(
    platform: str, tmp_path: Path
) -> None:
    # Telegram's update says the notice was the bot's, so `/taskcard` or `/tell` written as
    # a reply to it is a command. A Feishu reply names only the message it answers, and the
    # service knew only its cards, boards and status messages as its own: the same reply to
    # a report notice (or to any answer of the service) was ignored without the mention.
    async with running_card(platform, tmp_path) as chat:
        report(workdir(tmp_path), 1, ok=True, summary="all green")
        await wait_said(chat, "builder reported", "the report notice")
        notice = chat.message_id_with("builder reported")
        assert notice is not None
        await chat.say("/tell builder about that report", reply_to=notice)
        await wait_status(chat, "queued")
        assert texts_queued(tmp_path, "builder") == ["about that report"]
        await chat.say("/taskcard 4", reply_to=notice)
        await wait_said(chat, "now show 4 activity rows", "the answer")


async def test_a_rich_feishu_tell_keeps_the_spacing_around_the_mentions_it_holds(
    tmp_path: Path,
) -> None:
    # From the rich editor a mention is an element of its own between the words; each was
    # padded with a space on both sides, so "ask @Alice why" reached the agent as
    # "ask  @Alice  why", unlike the same text typed in the plain box.
    async with chat_for("feishu", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, FeishuChat)
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            document = chat.fake.command_event(
                FS_CHAT,
                "unused",
                open_id=FS_PERSON,
                mention_users=("ou_alice",),
                verification_token=FS_VERIFY,
                message_type="post",
            )
            message = document["event"]["message"]
            alice, bot = message["mentions"]
            alice["name"] = "Alice"

            def at(mention: dict[str, object]) -> dict[str, object]:
                return {"tag": "at", "user_id": mention["key"], "user_name": mention["name"]}

            words = [
                at(bot),
                {"tag": "text", "text": " /tell builder ask "},
                at(alice),
                {"tag": "text", "text": " why, then "},
                at(bot),
            ]
            message["content"] = json.dumps({"title": "", "content": [words]})
            answer = await chat.fake.deliver_event(chat.url, document)
            assert answer.status == 200
            await wait_status(chat, "queued")
            assert texts_queued(tmp_path, "builder") == ["ask @Alice why, then @taskcard"]
            assert await chat.serve.aterminate() == 0


def last_person_message(chat: Chat) -> str:
    """The id of the latest message a person wrote in the chat."""
    if isinstance(chat, TelegramChat):
        return str([m for m in chat.fake.messages(GROUP) if not m.from_bot][-1].message_id)
    assert isinstance(chat, FeishuChat)
    return list(chat.fake.user_messages)[-1]


async def test_a_reply_to_a_persons_reply_to_the_card_is_not_for_the_agent(
    platform: str, tmp_path: Path
) -> None:
    # A Feishu reply to a reply names the first message of the chain as its `root_id`, and
    # that was read as replying to the card: a person answering someone's reply to the card
    # had their words queued for the agent. On Telegram (and by the message it answers, on
    # Feishu) such a reply is to the person, not to the bot.
    async with running_card(platform, tmp_path) as chat:
        card = chat.message_id_with("compile")
        assert card is not None
        await chat.say("first: for the agent", reply_to=card)
        await wait_status(chat, "queued")
        theirs = last_person_message(chat)
        await chat.say("second: I agree, between us", reply_to=theirs)
        # A text after it, to know the one before was handled.
        await chat.say("third: for the agent too", reply_to=card)
        await eventually(lambda: len(texts_queued(tmp_path, "builder")) >= 2, what="the third text")
        assert sorted(texts_queued(tmp_path, "builder")) == [
            "first: for the agent",
            "third: for the agent too",
        ]
        # Nor is it answered: the person's message is no message of the service's, so the
        # hint given to a reply to one (how to reach an agent) is not for it.
        assert not any("reaches no agent" in text for text in chat.bot_texts())
