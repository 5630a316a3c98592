"""What a chat is answered, through `taskcard serve` and both platforms' fakes: every
command that arrives together with others gets its own answer, asking for help is answered
with the help, and text written as a reply to the board is told where to go."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.harness import eventually
from tests.e2e.test_talk_and_signals import (
    FS_CHAT,
    PERSON,
    FeishuChat,
    platform,  # noqa: F401 (the fixture, used by name)
    queued,
    running_card,
    wait_said,
)

OTHER = 8  # a member not listed in `allowed_user_ids`


async def test_commands_of_several_people_arriving_together_are_each_answered(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Telegram hands the commands people sent within one poll over in one batch. The
    # answers of a chat used to collapse into the latest, whoever asked and whatever:
    # a listed person's misspelt `/taskcard offf` went unanswered because a member not
    # listed wrote `/taskcard` in the same second, and a `/tell` to no agent of the chat
    # was never said to have gone nowhere when its author's `/taskcard` came right after
    # (Feishu, one event per request, answered each). Answers to one person's repeated
    # command still collapse into the latest.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/taskcard offf", user=PERSON)
        await chat.say("/taskcard", user=OTHER)
        await wait_said(chat, "Only the people listed", "the answer to the member not listed")
        await wait_said(chat, "Did you mean /taskcard off?", "the answer to the typo")
        await chat.say("/tell nobody hello", user=PERSON)
        await chat.say("/taskcard", user=PERSON)
        await wait_said(chat, "AGENT is one of builder", "the answer to the /tell")
        await wait_said(chat, "Task cards here: shown", "the answer to /taskcard")


async def test_help_is_answered_with_the_help(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # `/taskcard help` was "Unknown option", as if asking for help were a mistake.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/taskcard Help")
        help_text = await wait_said(chat, "Task card commands here", "the help")
        assert "/taskcard off: hide the cards" in help_text
        assert "a reply to an agent's card or notice" in help_text
        assert not any("Unknown option" in text for text in chat.bot_texts())


async def test_a_reply_to_the_board_is_told_how_to_reach_an_agent(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # The board speaks for every agent of the chat, so text written as a reply to it cannot
    # be given to one; it went nowhere without a word, and its author thought it sent.
    async with running_card(platform, tmp_path, ("builder", "tester")) as chat:
        await chat.say("/taskcard board")
        board = await eventually(
            lambda: chat.message_id_with("Task board"), timeout_s=60, what="the board"
        )
        await chat.say("builder, please stop", reply_to=board)
        answer = await wait_said(chat, "reply to the task board", "the answer to the reply")
        assert "AGENT is one of builder, tester" in answer
        assert "reply to an agent's card or notice" in answer
        assert "please stop" not in answer
        # Told once in a while, as the other hints: each answer spends the chat's budget.
        await chat.say("tester, then", reply_to=board)
        await chat.say("/taskcard 4")
        await wait_said(chat, "show 4 activity rows", "the answer to /taskcard 4")
        assert len([text for text in chat.bot_texts() if "reply to the task board" in text]) == 1
        assert queued(tmp_path) == [] and queued(tmp_path, "tester") == []


async def test_talk_in_a_feishu_thread_on_an_answer_or_the_board_is_not_answered(
    tmp_path: Path,
) -> None:
    # Feishu makes every message of a thread a reply to its root: people talking in a
    # thread opened on the answer to `/taskcard` or on the board were each told how to reach
    # an agent (the board's answer every time), though none tried to. Under a card, such
    # talk still reaches its agent.
    async with running_card("feishu", tmp_path, ("builder", "tester")) as chat:
        assert isinstance(chat, FeishuChat)
        card = chat.message_id_with("compile")
        assert card is not None
        await chat.say("look at the logs", reply_to=card, thread="omt_on_card")
        await chat.say("the second half too", thread="omt_on_card", mention=False)
        await eventually(lambda: len(queued(tmp_path)) == 2, what="both texts queued")
        await chat.say("/taskcard")
        await wait_said(chat, "Task cards here: shown", "the answer to /taskcard")
        answer = chat.message_id_with("Task cards here: shown")
        await chat.say("/taskcard board")
        board = await eventually(
            lambda: chat.message_id_with("Task board"), timeout_s=60, what="the board"
        )
        assert answer is not None
        for root, thread in ((answer, "omt_on_answer"), (board, "omt_on_board")):
            await chat.say("shall we split the work?", reply_to=root, thread=thread)
            await chat.say("yes, after lunch", thread=thread, mention=False)
            await chat.say("fine by me", thread=thread, mention=False, user=OTHER)
        # A reply the person chose, outside any thread, is still told how to reach one.
        await chat.say("builder: stop", reply_to=answer)
        await wait_said(chat, "A reply to this message reaches no agent", "the hint")
        hinted = [m for m in chat.fake.chat(FS_CHAT) if "reaches no agent" in m.text]
        assert [m.thread_id for m in hinted] == [None]
        assert not any("reply to the task board" in text for text in chat.bot_texts())
        assert queued(tmp_path, "tester") == []


async def test_a_reply_to_an_answer_is_told_once_how_to_reach_an_agent(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # The answer to `/taskcard` lists every agent of the chat, the help none: text written
    # as a reply to either reached no agent, and went nowhere without a word.
    async with running_card(platform, tmp_path, ("builder", "tester")) as chat:
        await chat.say("/taskcard")
        await wait_said(chat, "Task cards here: shown", "the answer to /taskcard")
        answer = chat.message_id_with("Task cards here: shown")
        assert answer is not None
        await chat.say("builder: stop <b>now</b> @all", reply_to=answer)
        hint = await wait_said(chat, "A reply to this message reaches no agent", "the hint")
        assert "reply to an agent's card or to a notice about it" in hint
        assert "/tell AGENT TEXT" in hint and "AGENT is one of builder, tester." in hint
        assert "stop" not in hint and "@all" not in hint
        # Told once in a while: a second reply of theirs, to the help this time, and one of
        # a member not listed for the chat, are not answered (each would spend the chat's
        # budget, which the cards share); the command after them is, so they were read.
        await chat.say("/taskcard help")
        await wait_said(chat, "Task card commands here", "the help")
        help_id = chat.message_id_with("Task card commands here")
        assert help_id is not None
        await chat.say("tester, and you", reply_to=help_id)
        await chat.say("me too", reply_to=answer, user=OTHER)
        await chat.say("/taskcard 4")
        await wait_said(chat, "show 4 activity rows", "the answer to /taskcard 4")
        told = [text for text in chat.bot_texts() if "reaches no agent" in text]
        assert len(told) == 1
        assert queued(tmp_path) == [] and queued(tmp_path, "tester") == []
