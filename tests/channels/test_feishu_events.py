"""Feishu commands over the HTTP callback and the long connection, delivered by the fake
the way Feishu delivers them (real HTTP, real AES sealing, real lark-oapi websocket)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from taskcard.channels.base import IncomingCommand
from taskcard.channels.feishu.channel import FeishuChannel
from taskcard.channels.feishu.config import FeishuConfig, FeishuWebhook
from taskcard.channels.feishu.content import MessageText, message_text
from taskcard.channels.feishu.events import SeenEvents, command_from_event, named_mentions
from tests.channels.conftest import CommandInbox, MemoryCursorStore, wait_until
from tests.fakes.feishu_api import FakeFeishu, encrypt_event

TOKEN = "verify-me"
KEY = "an encrypt key"
PATH = "/feishu/events"


@pytest.fixture
async def fake() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu() as server:
        yield server


@asynccontextmanager
async def webhook_channel(
    fake: FakeFeishu,
    sink: Callable[[IncomingCommand], Awaitable[None]],
    *,
    cursor: MemoryCursorStore | None = None,
    encrypt_key: str | None = None,
) -> AsyncIterator[str]:
    config = FeishuConfig(
        domain=fake.base_url,
        events="webhook",
        webhook=FeishuWebhook(host="127.0.0.1", port=0, path=PATH),
    )
    channel = FeishuChannel(
        config,
        fake.app_id,
        fake.app_secret,
        cursor or MemoryCursorStore(),
        verification_token=TOKEN,
        encrypt_key=encrypt_key,
    )
    await channel.start(sink)
    try:
        yield f"http://127.0.0.1:{channel.webhook_port}{PATH}"
    finally:
        await channel.stop()


async def test_url_verification_challenge(fake: FakeFeishu) -> None:
    async with webhook_channel(fake, CommandInbox()) as url:
        answer = await fake.url_verification(url, "c-123", verification_token=TOKEN)
        assert (answer.status, answer.body) == (200, {"challenge": "c-123"})
        refused = await fake.url_verification(url, "c-123", verification_token="forged")
        assert refused.status == 401
        assert "challenge" not in json.dumps(refused.body)


async def test_encrypted_challenge(fake: FakeFeishu) -> None:
    async with webhook_channel(fake, CommandInbox(), encrypt_key=KEY) as url:
        answer = await fake.url_verification(
            url, "c-enc", verification_token=TOKEN, encrypt_key=KEY
        )
        assert answer.body == {"challenge": "c-enc"}


async def test_group_command_with_mention(fake: FakeFeishu) -> None:
    inbox = CommandInbox()
    async with webhook_channel(fake, inbox) as url:
        answer = await fake.deliver_command(
            url,
            "oc_group",
            "/taskcard off",
            verification_token=TOKEN,
            open_id="ou_alice",
            message_id="om_cmd_1",
        )
        assert answer.status == 200
        (command,) = await inbox.wait_for(1)
    assert command.chat.chat_id == "oc_group"
    assert (command.args, command.user_id, command.message_id) == ("off", "ou_alice", "om_cmd_1")


async def test_private_command_without_mention_and_chatter_ignored(fake: FakeFeishu) -> None:
    inbox = CommandInbox()
    async with webhook_channel(fake, inbox) as url:
        for text in ("hello there", "/taskcard 3"):
            await fake.deliver_command(
                url,
                "oc_p2p",
                text,
                verification_token=TOKEN,
                mention_bot=False,
                chat_type="p2p",
            )
        commands = await inbox.wait_for(1)
    assert [(c.chat.chat_id, c.args) for c in commands] == [("oc_p2p", "3")]


async def test_group_commands_need_the_bot_mention(fake: FakeFeishu) -> None:
    inbox = CommandInbox()
    async with webhook_channel(fake, inbox) as url:

        async def deliver(text: str, **event: object) -> None:
            answer = await fake.deliver_command(
                url, "oc_g", text, verification_token=TOKEN, **event
            )
            assert answer.status == 200

        # Addressed to Alice, not to us.
        await deliver("/taskcard off", mention_bot=False, mention_users=("ou_alice",))
        # Alice first, then the bot: the command is still Alice's.
        await deliver("/taskcard off", mention_users=("ou_alice",))
        # Read with the read-all-group-messages permission, mentioning nobody.
        await deliver("/taskcard off", mention_bot=False)
        await deliver("/taskcard on")
        await deliver("/taskcard 3", chat_type="p2p", mention_bot=False)
        commands = await inbox.wait_for(2)
    assert [(c.chat.chat_id, c.args) for c in inbox.commands] == [("oc_g", "on"), ("oc_g", "3")]
    assert [(r.code, r.http_status) for r in fake.requests_of("bot_info")] == [(0, 200)]
    assert commands == inbox.commands


async def test_without_bot_info_any_mention_counts(
    fake: FakeFeishu, caplog: pytest.LogCaptureFixture
) -> None:
    fake.bot_info_available = False
    inbox = CommandInbox()
    with caplog.at_level(logging.INFO, logger="taskcard.channels.feishu.channel"):
        async with webhook_channel(fake, inbox) as url:
            await fake.deliver_command(url, "oc_g", "/taskcard off", verification_token=TOKEN)
            await fake.deliver_command(
                url, "oc_g", "/taskcard 4", verification_token=TOKEN, mention_bot=False
            )
            await fake.deliver_command(
                url,
                "oc_g",
                "/taskcard on",
                verification_token=TOKEN,
                mention_bot=False,
                mention_users=("ou_someone",),
            )
            await inbox.wait_for(2)
    assert [c.args for c in inbox.commands] == ["off", "on"]
    assert any("bot info unavailable" in r.getMessage() for r in caplog.records)


async def test_wrong_verification_token_is_rejected(fake: FakeFeishu) -> None:
    inbox = CommandInbox()
    async with webhook_channel(fake, inbox) as url:
        answer = await fake.deliver_command(url, "oc_g", "/taskcard off", verification_token="x")
        assert answer.status == 401
        await fake.deliver_command(url, "oc_g", "/taskcard on", verification_token=TOKEN)
        commands = await inbox.wait_for(1)
    assert [c.args for c in commands] == ["on"]


async def test_encrypted_and_signed_command(fake: FakeFeishu) -> None:
    inbox = CommandInbox()
    async with webhook_channel(fake, inbox, encrypt_key=KEY) as url:
        document = fake.command_event("oc_g", "/taskcard on", verification_token=TOKEN)
        forged = await fake.deliver_event(url, document, encrypt_key=KEY, bad_signature=True)
        assert forged.status == 401
        wrong_key = await fake.deliver_event(url, document, encrypt_key="another key")
        assert wrong_key.status == 400
        answer = await fake.deliver_event(url, document, encrypt_key=KEY)
        assert answer.status == 200
        commands = await inbox.wait_for(1)
    assert [c.args for c in commands] == ["on"]


async def test_duplicate_event_id_is_ignored_also_after_restart(fake: FakeFeishu) -> None:
    inbox = CommandInbox()
    cursor = MemoryCursorStore()
    async with webhook_channel(fake, inbox, cursor=cursor) as url:
        for _ in range(2):
            answer = await fake.deliver_command(
                url, "oc_g", "/taskcard off", verification_token=TOKEN, event_id="ev-1"
            )
            assert answer.status == 200
        await fake.deliver_command(
            url, "oc_g", "/taskcard on", verification_token=TOKEN, event_id="ev-2"
        )
        await inbox.wait_for(2)
    async with webhook_channel(fake, inbox, cursor=cursor) as url:
        await fake.deliver_command(
            url, "oc_g", "/taskcard off", verification_token=TOKEN, event_id="ev-1"
        )
        await fake.deliver_command(
            url, "oc_g", "/taskcard 4", verification_token=TOKEN, event_id="ev-3"
        )
        await inbox.wait_for(3)
    assert [c.args for c in inbox.commands] == ["off", "on", "4"]


async def test_answers_before_the_command_is_handled(fake: FakeFeishu) -> None:
    """Feishu redelivers unless answered within 3 s: the answer must not wait for the work."""
    release = asyncio.Event()
    started: list[IncomingCommand] = []
    finished: list[IncomingCommand] = []

    async def slow_sink(command: IncomingCommand) -> None:
        started.append(command)
        await release.wait()
        finished.append(command)

    async with webhook_channel(fake, slow_sink) as url:
        answer = await fake.deliver_command(url, "oc_g", "/taskcard", verification_token=TOKEN)
        assert answer.status == 200
        assert finished == []
        await wait_until(lambda: len(started) == 1, what="the command to start")
        release.set()
    # stop() awaited the handler task.
    assert [c.args for c in finished] == [""]


async def test_long_connection_receives_commands(fake: FakeFeishu) -> None:
    inbox = CommandInbox()
    config = FeishuConfig(domain=fake.base_url, events="websocket")
    channel = FeishuChannel(config, fake.app_id, fake.app_secret, MemoryCursorStore())
    await channel.start(inbox)
    try:
        await wait_until(lambda: fake.ws_connections == 1, what="the long connection")
        event = fake.command_event("oc_g", "/taskcard off", open_id="ou_bob", event_id="ws-1")
        assert await fake.push_ws_event(event) == 1
        assert await fake.push_ws_event(event) == 1  # redelivered: ignored
        await fake.push_ws_event(fake.command_event("oc_g", "/taskcard on", event_id="ws-2"))
        commands = await inbox.wait_for(2)
        await wait_until(lambda: len(fake.ws_acks) == 3, what="acknowledgements")
    finally:
        await channel.stop()
    assert [(c.args, c.chat.chat_id) for c in commands] == [("off", "oc_g"), ("on", "oc_g")]
    assert commands[0].user_id == "ou_bob"
    assert all(ack.get("code") == 200 for ack in fake.ws_acks)
    await wait_until(lambda: fake.ws_connections == 0, what="the connection to close")


async def test_long_connection_stops_when_endpoint_unreachable(fake: FakeFeishu) -> None:
    fake.ws_endpoint_available = False
    config = FeishuConfig(domain=fake.base_url, events="websocket")
    channel = FeishuChannel(config, fake.app_id, fake.app_secret, MemoryCursorStore())
    await channel.start(CommandInbox())
    await wait_until(lambda: len(fake.requests_of("ws_endpoint")) >= 1, what="an endpoint attempt")
    await channel.stop()  # must return although the client is in its reconnect back-off
    await channel.stop()
    assert fake.ws_connections == 0


def signed_request(
    document: dict[str, object], stamp: str, key: str = KEY
) -> tuple[bytes, dict[str, str]]:
    """One callback request exactly as Feishu would sign it at `stamp`, to send (and resend)."""
    raw = json.dumps({"encrypt": encrypt_event(document, key)}).encode()
    nonce = secrets.token_hex(8)
    headers = {
        "Content-Type": "application/json",
        "X-Lark-Request-Timestamp": stamp,
        "X-Lark-Request-Nonce": nonce,
        "X-Lark-Signature": hashlib.sha256((stamp + nonce + key).encode() + raw).hexdigest(),
    }
    return raw, headers


async def post(url: str, raw: bytes, headers: dict[str, str]) -> tuple[int, object]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=raw, headers=headers) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


@pytest.mark.parametrize(
    ("offset_s", "accepted"),
    [(0, True), (-250, True), (20, True), (-400, False), (-86_400, False), (120, False)],
)
async def test_signed_timestamp_outside_the_window_is_rejected(
    fake: FakeFeishu, offset_s: float, accepted: bool
) -> None:
    inbox = CommandInbox()
    async with webhook_channel(fake, inbox, encrypt_key=KEY) as url:
        document = fake.command_event("oc_g", "/taskcard off", verification_token=TOKEN)
        raw, headers = signed_request(document, str(int(time.time() + offset_s)))
        status, body = await post(url, raw, headers)
        if accepted:
            assert status == 200
            await inbox.wait_for(1)
        else:
            assert status == 401
            assert "timestamp" in json.dumps(body)
            assert inbox.commands == []


@pytest.mark.parametrize("stamp", ["", "soon", "nan", "inf", "1e400"])
async def test_unreadable_signed_timestamp_is_rejected(fake: FakeFeishu, stamp: str) -> None:
    async with webhook_channel(fake, CommandInbox(), encrypt_key=KEY) as url:
        document = fake.command_event("oc_g", "/taskcard off", verification_token=TOKEN)
        status, _ = await post(url, *signed_request(document, stamp))
        assert status == 401


async def test_replay_after_many_other_events_is_still_a_duplicate(fake: FakeFeishu) -> None:
    inbox = CommandInbox()
    async with webhook_channel(fake, inbox, encrypt_key=KEY) as url:
        captured = signed_request(
            fake.command_event("oc_g", "/taskcard off", verification_token=TOKEN),
            str(int(time.time())),
        )
        assert (await post(url, *captured))[0] == 200
        for number in range(600):
            other = fake.command_event("oc_g", f"chatter {number}", verification_token=TOKEN)
            assert (await post(url, *signed_request(other, str(int(time.time())))))[0] == 200
        status, body = await post(url, *captured)
        assert (status, body) == (200, {"msg": "duplicate"})
        await inbox.wait_for(1)
    assert [c.args for c in inbox.commands] == ["off"]


async def test_event_without_id_is_handled_once(fake: FakeFeishu) -> None:
    inbox = CommandInbox()
    async with webhook_channel(fake, inbox) as url:
        document = fake.command_event("oc_g", "/taskcard 4", verification_token=TOKEN)
        del document["header"]["event_id"]  # type: ignore[attr-defined]
        for _ in range(3):
            assert (await fake.deliver_event(url, document)).status == 200
        fresh = fake.command_event("oc_g", "/taskcard 5", verification_token=TOKEN)
        del fresh["header"]["event_id"]  # type: ignore[attr-defined]
        await fake.deliver_event(url, fresh)
        await inbox.wait_for(2)
    assert [c.args for c in inbox.commands] == ["4", "5"]


def test_seen_events_are_kept_by_time_and_across_restarts() -> None:
    now = [1_800_000_000.0]
    cursor = MemoryCursorStore()
    seen = SeenEvents(3600, cursor, clock=lambda: now[0])
    assert seen.first_time("ev-1")
    for number in range(2000):
        seen.first_time(f"other-{number}")
    now[0] += 3000
    assert not seen.first_time("ev-1")
    restarted = SeenEvents(3600, cursor, clock=lambda: now[0])
    assert not restarted.first_time("ev-1")
    assert not restarted.first_time("other-1999")
    now[0] += 700  # ev-1 was first seen 3700 s ago: outside the window
    assert restarted.first_time("ev-1")
    now[0] += 4 * 3600
    again = SeenEvents(3600, cursor, clock=lambda: now[0])
    assert again.first_time("other-5")
    assert not again.first_time("other-5")


def test_tell_needs_the_mention_and_a_reply_names_its_parent(fake: FakeFeishu) -> None:
    bot = fake.bot_open_id
    tell = command_from_event(fake.command_event("oc_g", "/tell builder stop now"), bot)
    assert tell is not None and (tell.command, tell.args) == ("tell", "builder stop now")
    unaddressed = fake.command_event("oc_g", "/tell builder stop", mention_bot=False)
    assert command_from_event(unaddressed, bot) is None
    reply = command_from_event(
        fake.command_event("oc_g", "please stop", mention_bot=False, parent_id="om_card_1"), bot
    )
    assert reply is not None
    assert (reply.command, reply.args, reply.reply_to) == ("reply", "please stop", ("om_card_1",))
    chatter = fake.command_event("oc_g", "please stop", mention_bot=False)
    assert command_from_event(chatter, bot) is None


def test_a_message_in_a_thread_is_told_from_a_reply_its_author_chose(fake: FakeFeishu) -> None:
    # Every message written in a thread replies to its root: only one quoting another message
    # of the thread, or one outside any thread, is a reply its author chose.
    bot = fake.bot_open_id
    events = [
        fake.command_event("oc_g", "a", mention_bot=False, parent_id="om_answer"),
        fake.command_event("oc_g", "b", mention_bot=False, parent_id="om_answer", thread_id="t"),
        fake.command_event("oc_g", "c", mention_bot=False, thread_id="t"),
        fake.command_event("oc_g", "d", mention_bot=False, parent_id="om_x", thread_id="t"),
    ]
    commands = [command_from_event(event, bot) for event in events]
    assert [(c.args, c.reply_to, c.in_thread) for c in commands if c is not None] == [
        ("a", ("om_answer",), False),
        ("b", ("om_answer",), True),
        ("c", ("om_answer",), True),
        ("d", ("om_x",), False),
    ]


def test_event_ids_outlive_the_longest_replayable_request_whatever_the_config() -> None:
    """Kept for max age plus skew both ways, even where the configured window is shorter."""
    webhook = FeishuWebhook(max_request_age_s=3600, clock_skew_s=300)
    config = FeishuConfig.model_construct(event_dedup_window_s=3600.0, webhook=webhook)
    assert config.replay_window_s() == 4200
    now = [1_800_000_000.0]
    seen = SeenEvents(config.replay_window_s(), MemoryCursorStore(), clock=lambda: now[0])
    assert seen.first_time("captured")
    now[0] += 3900  # the oldest a signed request is still accepted, plus a future stamp
    assert not seen.first_time("captured")
    now[0] += 299
    assert not seen.first_time("captured")


def _post(*paragraphs: list[dict[str, object]], title: str = "") -> str:
    return json.dumps({"title": title, "content": list(paragraphs)})


AT_BOT = {"tag": "at", "user_id": "@_user_1", "user_name": "taskcard"}


@pytest.mark.parametrize(
    ("message_type", "content", "expected"),
    [
        (
            "text",
            json.dumps({"text": "@_user_1 /taskcard off"}),
            MessageText("@_user_1 /taskcard off"),
        ),
        (
            "post",
            _post([AT_BOT, {"tag": "text", "text": "/taskcard off"}]),
            MessageText("@_user_1 /taskcard off"),
        ),
        (
            "post",
            _post(
                [{"tag": "text", "text": "/tell builder "}, {"tag": "a", "text": "the log"}],
                [{"tag": "img", "image_key": "img_1"}, {"tag": "text", "text": "line two"}],
            ),
            MessageText("/tell builder the log\nline two"),
        ),
        # The title is a heading, kept apart from the body the command is read from.
        ("post", _post([{"tag": "text", "text": "b"}], title="Note"), MessageText("b", "Note")),
        (
            "post",
            json.dumps({"zh_cn": {"title": "", "content": [[AT_BOT]]}}),
            MessageText("@_user_1"),
        ),
        (
            "post",
            json.dumps({"en_us": {"title": "Note", "content": [[{"tag": "text", "text": "b"}]]}}),
            MessageText("b", "Note"),
        ),
        # The first locale with a body, whatever comes first; the older "post" wrapper too.
        (
            "post",
            json.dumps(
                {
                    "zh_cn": {"title": "空", "content": []},
                    "en_us": {"title": "T", "content": [[{"tag": "text", "text": "b"}]]},
                }
            ),
            MessageText("b", "T"),
        ),
        (
            "post",
            json.dumps({"post": {"ja_jp": {"title": "T", "content": [[AT_BOT]]}}}),
            MessageText("@_user_1", "T"),
        ),
        ("post", json.dumps({"zh_cn": {"title": "T", "content": []}}), MessageText("", "T")),
        # A mention of everyone as the received form writes it, and as a sent post names it.
        (
            "post",
            _post([{"tag": "at", "user_id": "@_all"}, {"tag": "text", "text": "look"}]),
            MessageText("@_all look"),
        ),
        (
            "post",
            _post([{"tag": "text", "text": "look"}, {"tag": "at", "user_id": "all"}]),
            MessageText("look @_all"),
        ),
        ("post", json.dumps({"a": {"b": {"c": {"content": [[AT_BOT]]}}}}), None),
        ("post", json.dumps({"title": "x"}), None),
        ("post", json.dumps({"title": "x", "content": "words"}), None),
        ("post", json.dumps({"content": [[7, None, {"tag": "text", "text": 3}]]}), MessageText("")),
        ("image", json.dumps({"image_key": "img_1"}), None),
        ("text", "not json", None),
        ("text", json.dumps(["a"]), None),
        ("text", None, None),
        (None, json.dumps({"text": "x"}), None),
    ],
)
def test_message_text_of_plain_and_rich_messages(
    message_type: object, content: object, expected: MessageText | None
) -> None:
    assert message_text(message_type, content) == expected


@pytest.mark.parametrize("kind", ["text", "post"])
def test_commands_written_in_the_rich_editor_count_as_typed_ones(
    fake: FakeFeishu, kind: str
) -> None:
    bot = fake.bot_open_id
    off = command_from_event(fake.command_event("oc_g", "/TaskCard OFF", message_type=kind), bot)
    assert off is not None and (off.command, off.args) == ("taskcard", "OFF")
    tell = command_from_event(
        fake.command_event("oc_g", "/tell builder\nfirst\nsecond", message_type=kind), bot
    )
    assert tell is not None and (tell.command, tell.args) == ("tell", "builder\nfirst\nsecond")
    unaddressed = fake.command_event("oc_g", "/taskcard off", mention_bot=False, message_type=kind)
    assert command_from_event(unaddressed, bot) is None
    reply = command_from_event(
        fake.command_event(
            "oc_g", "see\nthis", mention_bot=False, parent_id="om_card", message_type=kind
        ),
        bot,
    )
    assert reply is not None and (reply.command, reply.args) == ("reply", "see\nthis")


ALICE = {"key": "@_user_1", "id": {"open_id": "ou_alice"}, "name": "Alice Wong"}
EVERYONE = {"key": "@_all", "id": {"open_id": ""}, "name": "所有人"}


@pytest.mark.parametrize(
    ("text", "mentions", "expected"),
    [
        ("ask @_user_1 why", [ALICE], "ask @Alice Wong why"),
        # A mention of everyone reached the agent as the placeholder `@_all`; it reads as the
        # chat showed it: its name when listed, else "@all".
        ("@_all please look", [EVERYONE], "@所有人 please look"),
        ("@_all please look", [], "@all please look"),
        ("@_all please look", None, "@all please look"),
        ("@_user_1 and @_all", [ALICE], "@Alice Wong and @all"),
        ("@_all请看", [{**EVERYONE, "name": "@All"}], "@All请看"),
        ("@_user_12 stays", [ALICE], "@_user_12 stays"),
        ("typed @_allison and @_all_x stay", [EVERYONE], "typed @_allison and @_all_x stay"),
        ("no placeholder", [EVERYONE], "no placeholder"),
    ],
)
def test_mentions_read_as_the_chat_showed_them(text: str, mentions: object, expected: str) -> None:
    assert named_mentions(text, mentions) == expected


def _without(path: tuple[str, ...]) -> Callable[[dict[str, Any]], None]:
    def spoil(document: dict[str, Any]) -> None:
        node = document
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return spoil


def _set(path: tuple[str, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def spoil(document: dict[str, Any]) -> None:
        node = document
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return spoil


# A message event as no Feishu sends it (a changed format, a forged callback), and the field
# the warning names.
BROKEN_MESSAGE_EVENTS = {
    "no event": (_without(("event",)), "event.message"),
    "no message": (_without(("event", "message")), "event.message"),
    "a message that is text": (_set(("event", "message"), "hi"), "event.message"),
    "no chat": (_without(("event", "message", "chat_id")), "event.message.chat_id"),
    "an empty chat": (_set(("event", "message", "chat_id"), ""), "event.message.chat_id"),
    "a chat that is a number": (_set(("event", "message", "chat_id"), 7), "event.message.chat_id"),
}


@pytest.mark.parametrize("broken", list(BROKEN_MESSAGE_EVENTS))
@pytest.mark.parametrize("events", ["webhook", "websocket"])
async def test_a_message_event_without_its_message_or_chat_is_one_warning(
    fake: FakeFeishu, caplog: pytest.LogCaptureFixture, events: str, broken: str
) -> None:
    """A message event missing its `message` or its chat was dropped without a word, on the
    HTTP callback and the long connection alike. It is acknowledged (Feishu would only send
    it again) and ignored with a warning naming the missing field, worded the same for every
    such event so the log's repeat limit holds a flood of them back; no id, text or secret
    of the request is in it. The commands after it are handled."""
    spoil, field = BROKEN_MESSAGE_EVENTS[broken]
    inbox = CommandInbox()
    documents = []
    for n in range(2):
        document = fake.command_event("oc_g", "/taskcard off", verification_token=TOKEN)
        document["header"]["event_id"] = f"broken-{n}-{secrets.token_hex(4)}"
        spoil(document)
        documents.append(document)
    good = fake.command_event("oc_g", "/taskcard on", verification_token=TOKEN)
    with caplog.at_level(logging.DEBUG, logger="taskcard"):
        if events == "webhook":
            async with webhook_channel(fake, inbox) as url:
                for document in documents:
                    answer = await fake.deliver_event(url, document)
                    assert answer.status == 200, answer
                assert (await fake.deliver_event(url, good)).status == 200
                commands = await inbox.wait_for(1)
        else:
            config = FeishuConfig(domain=fake.base_url, events="websocket")
            channel = FeishuChannel(config, fake.app_id, fake.app_secret, MemoryCursorStore())
            await channel.start(inbox)
            try:
                await wait_until(lambda: fake.ws_connections == 1, what="the long connection")
                for document in [*documents, good]:
                    assert await fake.push_ws_event(document) == 1
                commands = await inbox.wait_for(1)
                await wait_until(lambda: len(fake.ws_acks) == 3, what="acknowledgements")
            finally:
                await channel.stop()
            assert all(ack.get("code") == 200 for ack in fake.ws_acks)
    assert [c.args for c in commands] == ["on"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and warnings[0] == warnings[1], warnings
    assert f"without {field} " in warnings[0], warnings[0]
    for secret in (TOKEN, fake.app_secret, "broken-", "oc_g", "/taskcard"):
        assert secret not in warnings[0], warnings[0]


def _lone_surrogate(token: str, event_id: str | None) -> bytes:
    """An event whose text holds `\\ud800`: valid JSON, but no text (it cannot be encoded)."""
    header: dict[str, object] = {"token": token, "event_type": "im.message.receive_v1"}
    if event_id is not None:
        header["event_id"] = event_id
    document = {"schema": "2.0", "header": header, "event": {"message": {"content": "\ud800"}}}
    return json.dumps(document).encode()


# name: (the body's plain bytes, the status, words of the reason)
UNREADABLE_BODIES: dict[str, tuple[bytes, int, str]] = {
    "bytes that are not UTF-8": (b'{"schema": "2.0", "x": "\xff\xfe"}', 400, "not UTF-8"),
    "Latin-1 text": ('{"schema": "2.0", "x": "café"}'.encode("latin-1"), 400, "not UTF-8"),
    "truncated JSON": (b'{"schema": "2.0", "header": {"token', 400, "not JSON"),
    "an empty body": (b"", 400, "not JSON"),
    "an array": (b'[{"schema": "2.0"}]', 400, "not a JSON object"),
    "a string": (b'"/taskcard off"', 400, "not a JSON object"),
    "deeply nested arrays": (b"[" * 200_000 + b"]" * 200_000, 400, "nests JSON too deeply"),
    "deeply nested objects": (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, 400, "too deeply"),
    "a lone surrogate as the token": (_lone_surrogate("\ud800", "ev-s"), 400, "lone surrogate"),
    "a lone surrogate, no event id": (_lone_surrogate(TOKEN, None), 400, "lone surrogate"),
    "a body over the limit": (b'{"x": "' + b"x" * (1024 * 1024) + b'"}', 413, "larger than"),
}


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("case", list(UNREADABLE_BODIES))
async def test_a_body_that_cannot_be_read_is_refused_with_its_reason(
    fake: FakeFeishu, caplog: pytest.LogCaptureFixture, case: str, sealed: bool
) -> None:
    """Bytes that are not UTF-8, JSON that is cut short, nests past the parser, is not an
    object or escapes a lone surrogate, and bodies over the limit: each is answered with a
    4xx saying what is wrong, never a 500 and a traceback (a lone surrogate in the token or
    in an event without an id failed the token check or the duplicate hash with a 500; an
    oversized body got aiohttp's plain-text line and no log). One warning says why, with no
    secret in it, and the next good event is served. Encrypted, the same bytes are sealed
    and signed as Feishu would (the oversized one stays over the limit sealed)."""
    plain, status, reason = UNREADABLE_BODIES[case]
    inbox = CommandInbox()
    key = KEY if sealed else None
    with caplog.at_level(logging.INFO):
        async with webhook_channel(fake, inbox, encrypt_key=key) as url:
            answer = await fake.deliver_body(url, plain, encrypt_key=key)
            assert answer.status == status, answer
            assert isinstance(answer.body, dict) and reason in answer.body["msg"], answer
            good = fake.command_event("oc_g", "/taskcard on", verification_token=TOKEN)
            assert (await fake.deliver_event(url, good, encrypt_key=key)).status == 200
            commands = await inbox.wait_for(1)
    assert [c.args for c in commands] == ["on"]
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(problems) == 1, [r.getMessage() for r in problems]
    line = problems[0].getMessage()
    assert reason in line and problems[0].levelno == logging.WARNING, line
    for secret in (TOKEN, KEY, fake.app_secret):
        assert secret not in line + json.dumps(answer.body), line


# name: (the whole body, the status, words of the reason); with the encrypt key configured
BROKEN_ENVELOPES: dict[str, tuple[bytes, int, str]] = {
    "`encrypt` a number": (b'{"encrypt": 5}', 400, "`encrypt` is not a string"),
    "`encrypt` an object": (b'{"encrypt": {"a": 1}}', 400, "`encrypt` is not a string"),
    "`encrypt` not base64": ('{"encrypt": "ÿÿÿÿ"}'.encode(), 400, "cannot decrypt"),
    "`encrypt` empty": (b'{"encrypt": ""}', 400, "cannot decrypt"),
    "`encrypt` cut short": (b'{"encrypt": "AAAAAAAAAAAAAAAAAAAAAA=="}', 400, "cannot decrypt"),
    "`encrypt` null": (b'{"encrypt": null}', 401, "verification token"),
}


@pytest.mark.parametrize("case", list(BROKEN_ENVELOPES))
async def test_an_encrypted_envelope_that_cannot_be_opened_is_refused(
    fake: FakeFeishu, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    outer, status, reason = BROKEN_ENVELOPES[case]
    inbox = CommandInbox()
    with caplog.at_level(logging.INFO):
        async with webhook_channel(fake, inbox, encrypt_key=KEY) as url:
            answer = await fake.deliver_body(url, b"", encrypt_key=KEY, outer=outer)
            assert (answer.status, reason in str(answer.body)) == (status, True), answer
            good = fake.command_event("oc_g", "/taskcard on", verification_token=TOKEN)
            assert (await fake.deliver_event(url, good, encrypt_key=KEY)).status == 200
            await inbox.wait_for(1)
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(problems) == 1 and reason in problems[0], problems


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Lark-Signature": b"\xff\xfe"},
        {"X-Lark-Request-Nonce": b"\xc3\xa9\xff"},
        {"X-Lark-Request-Timestamp": "١٧٠٠٠٠٠٠٠٠".encode()},
    ],
    ids=["signature", "nonce", "timestamp"],
)
async def test_signature_headers_that_are_not_ascii_are_refused(
    fake: FakeFeishu, caplog: pytest.LogCaptureFixture, headers: dict[str, bytes]
) -> None:
    """A signature header holding bytes that are not ASCII reached the hash as surrogates
    and failed it with a 500; it is a 401 now, like any other forged signature."""
    inbox = CommandInbox()
    with caplog.at_level(logging.INFO):
        async with webhook_channel(fake, inbox, encrypt_key=KEY) as url:
            document = fake.command_event("oc_g", "/taskcard off", verification_token=TOKEN)
            raw, signed = signed_request(document, str(int(time.time())))
            sent = {name: value.encode() for name, value in signed.items()} | headers
            status, answer = await _post_raw_headers(url, raw, sent)
            assert status == 401, answer
            good = fake.command_event("oc_g", "/taskcard on", verification_token=TOKEN)
            assert (await fake.deliver_event(url, good, encrypt_key=KEY)).status == 200
            commands = await inbox.wait_for(1)
    assert [c.args for c in commands] == ["on"]
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(problems) == 1 and "rejected" in problems[0], problems


async def _post_raw_headers(url: str, body: bytes, headers: dict[str, bytes]) -> tuple[int, bytes]:
    """POST with header values written as the bytes given (a client library would refuse
    or re-encode bytes that are not ASCII, which is the point of sending them)."""
    _, _, rest = url.partition("://")
    address, _, path = rest.partition("/")
    host, _, port = address.partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        lines = [f"POST /{path} HTTP/1.1".encode(), f"Host: {address}".encode()]
        lines += [name.encode() + b": " + value for name, value in headers.items()]
        lines += [f"Content-Length: {len(body)}".encode(), b"Connection: close", b"", b""]
        writer.write(b"\r\n".join(lines) + body)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


async def test_a_challenge_that_is_not_a_string_is_refused(fake: FakeFeishu) -> None:
    """It was echoed as Python's rendering of the value (`{'a': 1}`)."""
    async with webhook_channel(fake, CommandInbox()) as url:
        document = {"type": "url_verification", "token": TOKEN, "challenge": {"a": 1}}
        answer = await fake.deliver_event(url, document)
    assert answer.status == 400 and "`challenge` is not a string" in str(answer.body), answer


# name: (the frame's payload, words of the warning)
UNREADABLE_FRAMES: dict[str, tuple[bytes, str]] = {
    "bytes that are not UTF-8": (b'{"schema": "2.0", "x": "\xff"}', "not UTF-8"),
    "truncated JSON": (b'{"schema": "2.0", "header": {', "not JSON"),
    "an array": (b"[1, 2]", "not a JSON object"),
    "deeply nested": (b"[" * 200_000 + b"]" * 200_000, "nests JSON too deeply"),
    "a lone surrogate": (_lone_surrogate(TOKEN, None), "lone surrogate"),
}


@pytest.mark.parametrize("case", list(UNREADABLE_FRAMES))
async def test_a_long_connection_event_that_cannot_be_read_is_skipped_and_answered(
    fake: FakeFeishu, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """Over the long connection the sender is Feishu, on a connection it authenticated: an
    event it cannot read is skipped with one warning and acknowledged, since the same bytes
    delivered again would not read better. A payload that is not UTF-8 got no answer at all
    (lark-oapi decodes it for a debug line before calling us, outside its error handling)
    and an ERROR line from the library; one escaping a lone surrogate failed the duplicate
    hash, answered 500, and Feishu would deliver it again forever."""
    payload, reason = UNREADABLE_FRAMES[case]
    inbox = CommandInbox()
    config = FeishuConfig(domain=fake.base_url, events="websocket")
    channel = FeishuChannel(config, fake.app_id, fake.app_secret, MemoryCursorStore())
    with caplog.at_level(logging.INFO):
        await channel.start(inbox)
        try:
            await wait_until(lambda: fake.ws_connections == 1, what="the long connection")
            assert await fake.push_ws_event({}, payload=payload) == 1
            await wait_until(lambda: len(fake.ws_acks) == 1, what="the answer to the bad event")
            await fake.push_ws_event(fake.command_event("oc_g", "/taskcard on", event_id="ws-g"))
            commands = await inbox.wait_for(1)
            await wait_until(lambda: len(fake.ws_acks) == 2, what="the answer to the good one")
        finally:
            await channel.stop()
    assert [c.args for c in commands] == ["on"]
    assert [ack.get("code") for ack in fake.ws_acks] == [200, 200]
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(problems) == 1 and problems[0].levelno == logging.WARNING, problems
    assert reason in problems[0].getMessage(), problems[0].getMessage()
