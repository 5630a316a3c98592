"""The forum topics' names kept in the cursor store (`channels.telegram.topics`): bounded per
chat, cleaned when read back (a shared store's value is untrusted), a row that is not one
ignored with a line naming it, and a name the topic was opened with never replacing a newer
one the store holds."""

from __future__ import annotations

import json
import logging

import pytest

from taskcard.channels.telegram.topics import (
    TOPIC_NAMES_PER_CHAT,
    TOPIC_NAMES_PREFIX,
    TopicNames,
    stored_topic_names,
)


class Cursors(dict[str, str]):
    def get_cursor(self, key: str) -> str | None:
        return self.get(key)

    def set_cursor(self, key: str, value: str) -> None:
        self[key] = value


def test_a_chats_names_are_bounded_oldest_learnt_going_first() -> None:
    cursors = Cursors()
    topics = TopicNames(cursors)
    for thread in range(TOPIC_NAMES_PER_CHAT + 5):
        topics.learn("-100", str(thread), f"topic {thread}", newer=True)
    kept = stored_topic_names(cursors, "-100")
    assert len(kept) == TOPIC_NAMES_PER_CHAT
    assert (
        "0" not in kept
        and kept[str(TOPIC_NAMES_PER_CHAT + 4)] == f"topic {TOPIC_NAMES_PER_CHAT + 4}"
    )


def test_a_stored_name_is_cleaned_and_a_row_not_an_object_is_named_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cursors = Cursors()
    cursors[TOPIC_NAMES_PREFIX + "-100"] = json.dumps(
        {"7": "Deploy\nnow\u200b", "x": "not a thread", "8": 5, "9": "   "}
    )
    cursors[TOPIC_NAMES_PREFIX + "-200"] = "[1, 2]"
    assert stored_topic_names(cursors, "-100") == {"7": "Deploy now"}
    with caplog.at_level(logging.WARNING):
        assert stored_topic_names(cursors, "-200") == {}
    assert f"({TOPIC_NAMES_PREFIX}-200) are not a JSON object" in caplog.text
    topics = TopicNames(cursors)
    topics.learn("-200", "3", "Lobby", newer=False)  # written anew
    assert stored_topic_names(cursors, "-200") == {"3": "Lobby"}


def test_a_row_nested_too_deep_to_parse_is_ignored_like_any_row_not_an_object(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A shared store's row is anyone's: one nested past the parser's depth raised
    RecursionError out of `taskcard chats` (only ValueError was caught)."""
    cursors = Cursors()
    cursors[TOPIC_NAMES_PREFIX + "-300"] = "[" * 200_000
    with caplog.at_level(logging.WARNING):
        assert stored_topic_names(cursors, "-300") == {}
    assert f"({TOPIC_NAMES_PREFIX}-300) are not a JSON object" in caplog.text


def test_the_opening_name_never_replaces_a_newer_one_the_store_holds() -> None:
    cursors = Cursors()
    TopicNames(cursors).learn("-100", "7", "QA nightly", newer=True)
    restarted = TopicNames(cursors)
    restarted.learn("-100", "7", "QA", newer=False)
    assert restarted.get("-100", "7") == "QA nightly"
    restarted.learn("-100", "7", "QA weekly", newer=True)
    assert TopicNames(cursors).get("-100", "7") == "QA weekly"
