"""`taskcard serve` against the fake Bot API where the fake once differed from Telegram.

Telegram refuses a whole message for a link whose address has no host ("entity URL
'https://' is invalid: URL host is empty"; before, "Wrong message entity: Wrong URL host"),
which the fake let through and the channel did not take for refused entities: the card was
refused for good instead of going as plain text. Such a link now keeps its words only, and
that answer (for whatever else Telegram finds invalid in an address) sends the card plain.

Telegram deletes a deleted forum topic's messages with it, the bot's resident card too: an
edit of that card is "message to edit not found", not the edit our fake let through, and a
new card in the topic "message thread not found". And the forum topics' names the poll
learnt are kept in the state per chat: when Telegram says the topic or the chat went (the
bot removed, the chat not found), they go too, rather than being named by `taskcard chats`
for ever.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import eventually, publish, run_cli
from tests.e2e.test_serve_telegram import (
    GROUP,
    _builder_and_tester_in_topics,
    agent_dir,
    setup,
)
from tests.fakes.telegram_api import FakeTelegram


def status_routes(config: Path) -> dict[str, dict[str, Any]]:
    result = run_cli("status", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    return {route["route"]: route for route in json.loads(result.stdout)["routes"]}


def topic_names(config: Path) -> dict[str, str]:
    """The topics' names `taskcard chats --json` shows, by thread id."""
    listed = run_cli("chats", "--config", str(config), "--json")
    assert listed.returncode == 0, listed.stderr
    return {
        row["thread_id"]: row["topic"]
        for row in json.loads(listed.stdout)
        if row.get("thread_id") and row.get("topic")
    }


def disabled(config: Path, route: str) -> str | None:
    """The reason `taskcard status` gives for `route` being disabled, None while it is not."""
    found = status_routes(config).get(route)
    return None if found is None else found.get("disabled")


def cards_in(telegram: FakeTelegram, thread: int) -> list[str]:
    return [m.text for m in telegram.bot_messages(GROUP, thread) if m.thread_id == thread]


async def seen_with_names(telegram: FakeTelegram, config: Path, *threads: int) -> None:
    """Ask `/taskcard` in each of `threads`, so `taskcard chats` lists them, and wait until
    it names them."""
    for thread in threads:
        telegram.inject_command(GROUP, "/taskcard", thread_id=thread)
    await eventually(
        lambda: len(topic_names(config)) == len(threads), what="the topics' names listed"
    )


async def test_a_deleted_topics_card_is_gone_and_its_route_disabled(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    # Deleting a topic deletes its messages: the card's edit is refused as a deleted
    # message's, the card sent anew is refused as the topic is gone, and the route is disabled
    # for that reason; the topic's name goes from the state. The other topic's card goes on.
    deploy = telegram.create_topic(GROUP, "Deploy")
    qa = telegram.create_topic(GROUP, "QA")
    serve = _builder_and_tester_in_topics(tmp_path, telegram, deploy, qa)
    route = f"telegram:{GROUP}:{deploy}:builder"
    with serve:
        publish(agent_dir(tmp_path, "builder"), "build one")
        publish(agent_dir(tmp_path, "tester"), "check one")
        await eventually(
            lambda: cards_in(telegram, deploy) and cards_in(telegram, qa), what="cards"
        )
        await seen_with_names(telegram, serve.config, deploy, qa)
        assert topic_names(serve.config) == {str(deploy): "Deploy", str(qa): "QA"}
        telegram.delete_topic(GROUP, deploy)
        publish(agent_dir(tmp_path, "builder"), "build two")
        reason = await eventually(
            lambda: disabled(serve.config, route), what="the deleted topic's route disabled"
        )
        assert "forum topic was deleted" in reason, reason
        assert not cards_in(telegram, deploy)
        publish(agent_dir(tmp_path, "tester"), "check two")
        await eventually(
            lambda: any("check two" in text for text in cards_in(telegram, qa)), what="QA's card"
        )
        assert topic_names(serve.config) == {str(qa): "QA"}
        assert await serve.aterminate() == 0


@pytest.mark.parametrize(
    ("cut", "reason"),
    [
        (lambda fake: fake.kick(GROUP), "kicked"),
        (lambda fake: fake.fail_chat(GROUP, 400, "Bad Request: chat not found"), "chat not found"),
    ],
    ids=["bot-removed", "chat-not-found"],
)
async def test_a_chats_topic_names_go_with_the_chat(
    tmp_path: Path, telegram: FakeTelegram, cut: Callable[[FakeTelegram], None], reason: str
) -> None:
    deploy = telegram.create_topic(GROUP, "Deploy")
    qa = telegram.create_topic(GROUP, "QA")
    serve = _builder_and_tester_in_topics(tmp_path, telegram, deploy, qa)
    route = f"telegram:{GROUP}:{deploy}:builder"
    with serve:
        publish(agent_dir(tmp_path, "builder"), "build one")
        await eventually(lambda: cards_in(telegram, deploy), what="the card")
        await seen_with_names(telegram, serve.config, deploy, qa)
        cut(telegram)
        publish(agent_dir(tmp_path, "builder"), "build two")
        said = await eventually(
            lambda: disabled(serve.config, route), what="the route disabled with its reason"
        )
        assert reason in said, said
        await eventually(lambda: topic_names(serve.config) == {}, what="the names gone")
        assert await serve.aterminate() == 0


async def test_a_link_without_a_host_keeps_its_words_and_the_cards_formatting(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    serve = setup(tmp_path, telegram, ["builder"], [(GROUP, ["builder"])])
    with serve:
        publish(
            agent_dir(tmp_path, "builder"),
            "**build** green, see [the log](https://) and [the site](https://example.org)",
        )
        [card] = await eventually(
            lambda: [m for m in telegram.bot_messages(GROUP) if "the site" in m.text],
            what="the card",
        )
        assert "the log" in card.text, card.text
        kinds = [(e["type"], e.get("url")) for e in card.entities]
        assert ("text_link", "https://example.org") in kinds, kinds
        assert any(kind == "bold" for kind, _ in kinds), kinds
        assert [url for kind, url in kinds if kind == "text_link"] == ["https://example.org"]
        assert await serve.aterminate() == 0


@pytest.mark.parametrize(
    "description",
    [
        "Bad Request: entity URL 'https://exa mple.org' is invalid: URL host is empty",
        "Bad Request: Wrong message entity: Wrong URL host",
    ],
)
async def test_a_link_telegram_finds_invalid_sends_the_card_plain(
    tmp_path: Path, telegram: FakeTelegram, description: str
) -> None:
    serve = setup(tmp_path, telegram, ["builder"], [(GROUP, ["builder"])])
    telegram.fail_next("sendMessage", 400, description)
    with serve:
        publish(agent_dir(tmp_path, "builder"), "**build** green, [the site](https://example.org)")
        [card] = await eventually(
            lambda: [m for m in telegram.bot_messages(GROUP) if "the site" in m.text],
            what="the card sent as plain text",
        )
        assert card.entities == [], card.entities
        assert await serve.aterminate() == 0
