"""Telegram's entities around a `/taskcard` command, through `taskcard serve` and the fake
Bot API.

A mention of a person without a username is a `text_mention` entity over their name: the
service reads it as a mention ("/taskcard off Alice Smith" is answered as "/taskcard off
@alice" is), counting the entity's offsets in UTF-16 units. A client nests formatting in a
mention (bold inside it, a bold command around it), and a hostile one may send mentions that
overlap, reach past the text, are empty or cut a character in half: each such entity is left
out on its own, overlapping mentions are read as one, and the good ones still count. Nothing
crashes, nothing is applied that was not typed, and the answer names neither the person nor
the entities.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.test_chat_command_words import answered
from tests.e2e.test_talk_and_signals import GROUP, PERSON, TelegramChat, queued, running_card
from tests.fakes.telegram_api import Json

ANSWER = "send /taskcard off without it"


def mention(offset: int, length: int) -> Json:
    return {
        "type": "text_mention",
        "offset": offset,
        "length": length,
        "user": {"id": 4242, "is_bot": False, "first_name": "Alice"},
    }


def marked(kind: str, offset: int, length: int) -> Json:
    return {"type": kind, "offset": offset, "length": length}


async def test_mention_entities_nested_overlapping_or_out_of_range_are_read_one_by_one(
    tmp_path: Path,
) -> None:
    # An entity that overlapped another, reached past the text or split an emoji made the
    # service read the whole text unmarked: "/taskcard off Alice Smith" was answered
    # "Unknown option. Did you mean /taskcard off?", as if `off` had not been typed.
    text = "/taskcard off Alice Smith"  # the name is UTF-16 units 14 to 24
    # A person named with an emoji outside the Basic Multilingual Plane, which takes two
    # UTF-16 units (14 and 15): "🦊 Fox" is units 14 to 19 (six), "Alice Smith" 21 to 31.
    fox = "/taskcard off \U0001f98a Fox Alice Smith"
    cases: list[tuple[str, list[Json]]] = [
        # Formatting nested inside and around the mention counts for nothing.
        (text, [marked("bold", 0, 13), mention(14, 11), marked("italic", 20, 5)]),
        # Two mentions overlapping: one mention of the text they cover together.
        (text, [mention(14, 8), mention(18, 7)]),
        (text, [mention(14, 11), mention(14, 11), marked("mention", 20, 5)]),
        # One good mention, and ones that are no mention at all: past the text's end,
        # empty, negative, starting before the text.
        (text, [mention(14, 11), mention(20, 500), mention(30, 2)]),
        (text, [mention(14, 11), mention(16, 0), mention(-3, 5), mention(-2, -1)]),
        # Offsets in UTF-16 units, after the emoji too.
        (fox, [mention(14, 6), mention(21, 11)]),
        # An edge inside the emoji's surrogate pair: that entity alone is left out.
        (fox, [mention(15, 5), mention(14, 6), mention(21, 11), mention(20, 12)]),
    ]
    async with running_card("telegram", tmp_path) as chat:
        assert isinstance(chat, TelegramChat)
        for times, (typed, entities) in enumerate(cases, start=1):
            chat.fake.inject_message(GROUP, typed, user_id=PERSON, entities=entities)
            await answered(chat, ANSWER, times, f"the answer to case {times}")
        # A mention over the command word itself makes the message no command, as Telegram
        # marks no command inside a mention; the next command is answered as usual.
        chat.fake.inject_message(GROUP, text, user_id=PERSON, entities=[mention(0, 13)])
        await chat.say("/taskcard 7")
        await answered(chat, "7 activity rows", 1, "the answer to the next command")
        texts = chat.bot_texts()
        assert sum(ANSWER in t for t in texts) == len(cases), texts
        assert not any("hidden" in t.lower() or "Unknown option" in t for t in texts), texts
        assert not any("Alice" in t or "@_" in t for t in texts), texts
        assert queued(tmp_path) == []
