"""What a chat is answered, through `taskcard serve` and both platforms' fakes: every
command that arrives together with others gets its own answer, and asking for help is
answered with the help."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.test_talk_and_signals import (
    PERSON,
    chat_for,
    platform,  # noqa: F401 (the fixture, used by name)
    running_agent,
    running_card_shown,
    wait_said,
)

OTHER = 8  # a member not listed in `allowed_user_ids`


async def test_commands_of_several_people_arriving_together_are_each_answered(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # Telegram hands the commands people sent within one poll over in one batch. The
    # answers of a chat used to collapse into the latest, whoever asked: a listed person's
    # misspelt `/taskcard offf` went unanswered because a member not listed wrote
    # `/taskcard` in the same second (Feishu, one event per request, answered both). One
    # person's answers still collapse into their latest.
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await chat.say("/taskcard offf", user=PERSON)
            await chat.say("/taskcard", user=OTHER)
            await wait_said(chat, "Only the people listed", "the answer to the member not listed")
            await wait_said(chat, "Did you mean /taskcard off?", "the answer to the typo")
            assert await chat.serve.aterminate() == 0


async def test_help_is_answered_with_the_help(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    # `/taskcard help` was "Unknown option", as if asking for help were a mistake.
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await chat.say("/taskcard Help")
            help_text = await wait_said(chat, "Task card commands here", "the help")
            assert "/taskcard off: hide the cards" in help_text
            assert not any("Unknown option" in text for text in chat.bot_texts())
            assert await chat.serve.aterminate() == 0
