"""The fake Bot API itself: wire shapes the channel tests rely on, over raw HTTP."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp
import pytest

from tests.fakes.telegram_api import (
    EDIT_NOT_FOUND,
    ENTITIES_TOO_LONG,
    NOT_MODIFIED,
    TOO_LONG,
    FakeLimits,
    FakeTelegram,
    Window,
)


async def _call(
    fake: FakeTelegram, method: str, how: str = "json", token: str | None = None, **params: Any
) -> tuple[int, dict[str, Any]]:
    url = f"{fake.base_url}/bot{token or fake.token}/{method}"
    async with aiohttp.ClientSession() as session:
        if how == "json":
            response = await session.post(url, json=params)
        elif how == "form":
            response = await session.post(url, data={k: str(v) for k, v in params.items()})
        else:
            response = await session.get(url, params={k: str(v) for k, v in params.items()})
        async with response:
            return response.status, await response.json()


@pytest.mark.parametrize("how", ["json", "form", "query"])
async def test_send_accepts_every_encoding(how: str) -> None:
    async with FakeTelegram() as fake:
        status, body = await _call(fake, "sendMessage", how, chat_id=-5, text="hi")
        assert status == 200 and body["result"]["message_id"] == 1
        assert [m.text for m in fake.messages(-5)] == ["hi"]


@pytest.mark.parametrize("how", ["json", "form", "query"])
async def test_a_text_that_looks_like_json_is_a_text(how: str) -> None:
    """Only the parameters typed as arrays or objects are read as JSON: a text is a String,
    whatever it looks like."""
    async with FakeTelegram() as fake:
        for text in ("[WIP] build", '{"a": 1}'):
            status, body = await _call(fake, "sendMessage", how, chat_id=-5, text=text)
            assert status == 200, body
            assert fake.messages(-5)[-1].text == text


async def test_wrong_token_is_unauthorized() -> None:
    async with FakeTelegram() as fake:
        status, body = await _call(fake, "getMe", token="1:bad")
        assert (status, body["description"]) == (401, "Unauthorized")


async def test_edit_errors_and_history() -> None:
    async with FakeTelegram() as fake:
        await _call(fake, "sendMessage", chat_id=-5, text="v1")
        status, body = await _call(fake, "editMessageText", chat_id=-5, message_id=1, text="v1")
        assert (status, body["description"]) == (400, NOT_MODIFIED)
        await _call(fake, "editMessageText", chat_id=-5, message_id=1, text="v2")
        assert fake.edit_history(-5, 1) == ["v1", "v2"]
        status, body = await _call(fake, "editMessageText", chat_id=-5, message_id=9, text="x")
        assert (status, body["description"]) == (400, EDIT_NOT_FOUND)


async def test_entities_and_length_are_validated() -> None:
    async with FakeTelegram() as fake:
        bad = [{"type": "bold", "offset": 1, "length": 5}]
        status, body = await _call(fake, "sendMessage", chat_id=-5, text="abc", entities=bad)
        assert status == 400 and "can't parse entities" in body["description"]
        # An emoji is two UTF-16 units, so this entity covers it exactly.
        ok = [{"type": "bold", "offset": 0, "length": 2}]
        status, _ = await _call(fake, "sendMessage", chat_id=-5, text="😀", entities=ok)
        assert status == 200
        status, body = await _call(fake, "sendMessage", chat_id=-5, text="😀" * 2049)
        assert (status, body["description"]) == (400, TOO_LONG)
        # No entity may begin or end between the two halves of an emoji.
        split = [{"type": "bold", "offset": 0, "length": 1}]
        status, body = await _call(fake, "sendMessage", chat_id=-5, text="😀", entities=split)
        assert status == 400 and "can't parse entities" in body["description"]


async def test_entities_past_the_hundredth_are_ignored() -> None:
    """Telegram applies the first 100 entities of a message and drops the rest silently."""
    async with FakeTelegram() as fake:
        many = [{"type": "code", "offset": 2 * i, "length": 1} for i in reversed(range(150))]
        status, _ = await _call(fake, "sendMessage", chat_id=-5, text="a " * 150, entities=many)
        assert status == 200
        kept = fake.messages(-5)[0].entities
        assert [entity["offset"] for entity in kept] == [2 * i for i in range(100)]


async def test_entities_too_large_in_total_are_refused() -> None:
    """Links' addresses count towards the entities' size: past the bound, ENTITIES_TOO_LONG,
    however short the text."""
    async with FakeTelegram() as fake:
        url = "https://example.com/" + "a" * 200

        def links(count: int) -> list[dict[str, Any]]:
            return [
                {"type": "text_link", "offset": i, "length": 1, "url": url} for i in range(count)
            ]

        status, body = await _call(
            fake, "sendMessage", chat_id=-5, text="x" * 40, entities=links(40)
        )
        assert (status, body["description"]) == (400, ENTITIES_TOO_LONG)
        status, _ = await _call(fake, "sendMessage", chat_id=-5, text="x" * 40, entities=links(10))
        assert status == 200


async def test_real_429_body_and_record() -> None:
    limits = FakeLimits(private_chat=None, group_chat=Window(1, 10.0), bot=None)
    async with FakeTelegram(limits=limits) as fake:
        await _call(fake, "sendMessage", chat_id=-5, text="a")
        status, body = await _call(fake, "editMessageText", chat_id=-5, message_id=1, text="b")
        assert status == 429
        retry = body["parameters"]["retry_after"]
        assert body == {
            "ok": False,
            "error_code": 429,
            "description": f"Too Many Requests: retry after {retry}",
            "parameters": {"retry_after": retry},
        }
        assert 1 <= retry <= 10
        assert [(r.scope, r.chat_id) for r in fake.rate_limited] == [("chat:-5", -5)]
        # Another chat is not affected.
        status, _ = await _call(fake, "sendMessage", chat_id=-6, text="a")
        assert status == 200
        fake.reset_counters()
        assert fake.count() == 0 and not fake.rate_limited


async def test_kicked_and_blocked() -> None:
    async with FakeTelegram() as fake:
        fake.kick(-5)
        fake.block(7)
        _, group = await _call(fake, "sendMessage", chat_id=-5, text="a")
        _, private = await _call(fake, "sendMessage", chat_id=7, text="a")
        assert group["description"] == "Forbidden: bot was kicked from the group chat"
        assert private["description"] == "Forbidden: bot was blocked by the user"


async def test_standalone_process_serves(unused_tcp_port: int) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.telegram_api",
        "--port",
        str(unused_tcp_port),
        "--token",
        "5:T",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        assert str(unused_tcp_port) in line.decode()
        url = f"http://127.0.0.1:{unused_tcp_port}/bot5:T/getMe"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert (await response.json())["result"]["is_bot"] is True
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 60)


async def test_a_dropped_send_is_performed_but_never_answered() -> None:
    async with FakeTelegram() as fake:
        fake.drop_after_accept("sendMessage")
        with pytest.raises(aiohttp.ClientError):
            await _call(fake, "sendMessage", chat_id=-5, text="lost answer")
        status, body = await _call(fake, "sendMessage", chat_id=-5, text="answered")
        assert status == 200 and body["result"]["message_id"] == 2
        assert [m.text for m in fake.messages(-5)] == ["lost answer", "answered"]


async def test_a_delayed_send_exists_before_its_answer() -> None:
    async with FakeTelegram() as fake:
        fake.delay_answers("sendMessage", 30.0)
        call = asyncio.create_task(_call(fake, "sendMessage", chat_id=-5, text="slow"))
        for _ in range(200):
            if fake.messages(-5):
                break
            await asyncio.sleep(0.05)
        assert [m.text for m in fake.messages(-5)] == ["slow"]
        assert not call.done()
        fake.delay_answers("sendMessage", 0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call


async def test_set_my_commands_is_validated_and_read_back() -> None:
    async with FakeTelegram() as fake:
        menu = [{"command": "taskcard", "description": "show the cards"}]
        status, body = await _call(fake, "setMyCommands", commands=menu)
        assert (status, body["result"]) == (200, True)
        status, body = await _call(fake, "getMyCommands")
        assert body["result"] == menu
        status, body = await _call(
            fake, "setMyCommands", commands=[{"command": "Task-Card", "description": "x"}]
        )
        assert (status, body["description"]) == (400, "Bad Request: BOT_COMMAND_INVALID")
        assert fake.my_commands[("default", "")] == menu


async def test_an_upgraded_group_refuses_every_method_and_announces_the_move() -> None:
    async with FakeTelegram() as fake:
        await _call(fake, "sendMessage", chat_id=-42, text="card")
        fake.migrate(-42, -1009876543210)
        refusal = {
            "ok": False,
            "error_code": 400,
            "description": "Bad Request: group chat was upgraded to a supergroup chat",
            "parameters": {"migrate_to_chat_id": -1009876543210},
        }
        calls: list[dict[str, Any]] = [
            {"method": "sendMessage", "text": "x"},
            {"method": "editMessageText", "message_id": 1, "text": "x"},
            {"method": "deleteMessage", "message_id": 1},
            {"method": "pinChatMessage", "message_id": 1},
        ]
        for params in calls:
            status, body = await _call(fake, chat_id=-42, **params)
            assert (status, body) == (400, refusal), params["method"]
        status, body = await _call(fake, "sendMessage", chat_id=-1009876543210, text="here")
        assert status == 200 and [m.text for m in fake.messages(-1009876543210)] == ["here"]
        _, updates = await _call(fake, "getUpdates", timeout=0)
        moves = [u["message"] for u in updates["result"]]
        assert [(m["chat"]["id"], m["chat"]["type"]) for m in moves] == [
            (-42, "group"),
            (-1009876543210, "supergroup"),
        ]
        assert moves[0]["migrate_to_chat_id"] == -1009876543210
        assert moves[1]["migrate_from_chat_id"] == -42


async def test_get_chat_finds_a_public_chat_by_username_as_telegram_does() -> None:
    async with FakeTelegram() as fake:
        fake.add_public_chat("Build_News", -100777)
        fake.add_public_chat("left_channel", -100888, kind="channel", member=False)
        fake.kick(-100999)
        fake.add_public_chat("gone_group", -100999)
        status, found = await _call(fake, "getChat", chat_id="@build_news")
        assert status == 200 and found["result"]["id"] == -100777
        assert found["result"]["username"] == "Build_News"
        for username, answer in (
            ("@nobody_here", (400, "Bad Request: chat not found")),
            ("@left_channel", (403, "Forbidden: bot is not a member of the channel chat")),
            ("@gone_group", (403, "Forbidden: bot was kicked from the group chat")),
        ):
            status, body = await _call(fake, "getChat", chat_id=username)
            assert (status, body["error_code"], body["description"]) == (answer[0], *answer)


def _units(text: str, start: int, length: int) -> str:
    """The part of `text` at UTF-16 offset `start`, `length` units long."""
    units = text.encode("utf-16-le", "surrogatepass")
    return units[2 * start : 2 * (start + length)].decode("utf-16-le")


# text: the commands Telegram marks in it, as written
COMMANDS_MARKED: dict[str, list[str]] = {
    "/taskcard off": ["/taskcard"],
    "😀 /taskcard off": ["/taskcard"],
    "😀😀 /taskcard@TaskcardTestBot on": ["/taskcard@TaskcardTestBot"],
    "𝔘𝔫𝔦 /tell builder 🎉 /taskcard": ["/tell", "/taskcard"],
    "/tell builder 👨\u200d💻 done": ["/tell"],
    "/tell😀 builder": ["/tell"],
    "/taskcard@ab on": [],  # a bot name of 3 to 32 characters, or no command (tdlib)
    "a/taskcard and 😀/b": ["/b"],
    "/taskcard/off <b>/x</b>": [],
    "x" * 3 + " /" + "c" * 65: [],
    "no command 😀 here": [],
}


@pytest.mark.parametrize("text", list(COMMANDS_MARKED))
async def test_a_persons_commands_are_marked_in_utf16_units(text: str) -> None:
    """Telegram marks every command in a message a person sends, wherever it stands, with
    its offset and length in UTF-16 code units; the fake marked only a command at the start,
    and measured it in characters (a command word holding an emoji came out a unit short)."""
    async with FakeTelegram() as fake:
        fake.inject_message(-5, text)
        fake.inject_message(-5, text, photo=True)
        _, body = await _call(fake, "getUpdates")
    text_message, photo_message = (update["message"] for update in body["result"])
    for message, key in ((text_message, "entities"), (photo_message, "caption_entities")):
        entities = message.get(key, [])
        assert all(entity["type"] == "bot_command" for entity in entities)
        marked = [_units(text, entity["offset"], entity["length"]) for entity in entities]
        assert marked == COMMANDS_MARKED[text], entities


async def test_a_topic_is_named_as_telegram_names_it() -> None:
    # Opening a topic is a service message (`forum_topic_created`) whose id is the topic's
    # thread id; every message in it that replies to nothing else carries it; a rename is a
    # `forum_topic_edited` service message, and the message that opened it stays as it was.
    async with FakeTelegram() as fake:
        thread = fake.create_topic(-100, "Deploy")
        fake.inject_message(-100, "hi", thread_id=thread)
        fake.edit_topic(-100, thread, "Deploy v2")
        opened, said, renamed = (u["message"] for u in fake.pending_updates)
        assert opened["message_id"] == opened["message_thread_id"] == thread
        assert opened["forum_topic_created"]["name"] == "Deploy" and opened["is_topic_message"]
        assert said["reply_to_message"] == opened
        assert renamed["forum_topic_edited"] == {"name": "Deploy v2"}
        assert renamed["message_thread_id"] == thread


async def test_a_deleted_topics_messages_go_with_it() -> None:
    # Telegram deletes a forum topic's messages with the topic: the bot's message there can
    # no longer be edited, and nothing more can be posted in the topic.
    async with FakeTelegram() as fake:
        thread = fake.create_topic(-100, "Deploy")
        status, sent = await _call(
            fake, "sendMessage", chat_id=-100, message_thread_id=thread, text="card"
        )
        assert status == 200
        fake.delete_topic(-100, thread)
        message_id = sent["result"]["message_id"]
        status, body = await _call(
            fake, "editMessageText", chat_id=-100, message_id=message_id, text="card 2"
        )
        assert (status, body["description"]) == (400, EDIT_NOT_FOUND)
        status, body = await _call(
            fake, "sendMessage", chat_id=-100, message_thread_id=thread, text="again"
        )
        assert (status, body["description"]) == (400, "Bad Request: message thread not found")
        assert fake.messages(-100, thread) == []
