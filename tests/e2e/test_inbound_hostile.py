"""What reaches `taskcard serve` from the chats, under hostile or unusual input.

Feishu callbacks are posted to the service's webhook endpoint as Feishu sends them (sealed
and signed); Telegram updates are served by the fake Bot API to the service's long poll.
Each must get its documented answer, never a traceback, and never stop later input.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import eventually, publish
from tests.e2e.test_serve_feishu import (
    CHAT,
    ENCRYPT,
    VERIFY,
    Setup,
    card_texts,
)
from tests.e2e.test_serve_telegram import GROUP, setup, shown
from tests.e2e.test_talk_and_signals import (
    FS_CHAT,
    FS_PERSON,
    FS_VERIFY,
    FeishuChat,
    queued,
    running_card,
)
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu() as server:
        yield server


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def _answers(fake: FakeFeishu) -> list[str]:
    return [text for text in fake.texts(CHAT) if "Task cards here" in text]


async def test_a_rich_message_with_an_odd_element_still_carries_its_command(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    # A `post` element whose `tag` is not a string (a list here) is not text; it must not
    # fail the whole callback (a 500 and a traceback), and the command beside it counts.
    setup = Setup(tmp_path, feishu, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "body")
        await eventually(lambda: card_texts(feishu), what="the card")
        document = feishu.command_event(CHAT, "/taskcard", verification_token=VERIFY)
        message = document["event"]["message"]
        message["message_type"] = "post"
        message["content"] = json.dumps(
            {
                "content": [
                    [
                        {"tag": ["text"], "text": "not text"},
                        {"tag": {"a": 1}},
                        {"tag": "at", "user_id": "@_user_1"},
                        {"tag": "text", "text": " /taskcard"},
                    ]
                ]
            }
        )
        answer = await feishu.deliver_event(setup.url, document, encrypt_key=ENCRYPT)
        assert (answer.status, answer.body) == (200, {"msg": "success"})
        await eventually(lambda: _answers(feishu), what="the answer to the command")
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs


async def test_a_schema_1_event_with_the_right_token_is_accepted(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    # Schema 1.0 events (a bot added to a chat, say) carry the verification token at the top,
    # as the URL verification does; Feishu retries every answer but 200, so a genuine one must
    # not be refused as forged. One with a wrong token still is.
    setup = Setup(tmp_path, feishu, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "body")
        await eventually(lambda: card_texts(feishu), what="the card")
        legacy = {
            "uuid": "0f3a-legacy",
            "token": VERIFY,
            "ts": "1700000000.0",
            "type": "event_callback",
            "event": {"type": "add_bot", "chat_id": CHAT, "app_id": feishu.app_id},
        }
        answer = await feishu.deliver_event(setup.url, legacy, encrypt_key=ENCRYPT)
        assert (answer.status, answer.body) == (200, {"msg": "success"})
        again = await feishu.deliver_event(setup.url, legacy, encrypt_key=ENCRYPT)
        assert (again.status, again.body) == (200, {"msg": "duplicate"})
        forged = dict(legacy, uuid="0f3a-forged", token="not-the-token")
        refused = await feishu.deliver_event(setup.url, forged, encrypt_key=ENCRYPT)
        assert refused.status == 401
        assert "verification token" in str(refused.body)
        # A 2.0 event still needs the token in its header, not at the top.
        document = feishu.command_event(CHAT, "/taskcard", verification_token="wrong")
        document["token"] = VERIFY
        refused = await feishu.deliver_event(setup.url, document, encrypt_key=ENCRYPT)
        assert refused.status == 401
        # And the service goes on answering commands.
        await feishu.deliver_command(
            setup.url, CHAT, "/taskcard", verification_token=VERIFY, encrypt_key=ENCRYPT
        )
        await eventually(lambda: _answers(feishu), what="the answer to a later command")
        assert await serve.aterminate() == 0


async def test_an_update_that_cannot_be_read_does_not_stop_later_commands(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    # A message without its date (PTB cannot read it) and one whose text is a number come
    # in the same batch as a command: the poll goes on, confirms them, and the command
    # after them is answered.
    with setup(tmp_path, telegram, ["builder"], [(GROUP, ["builder"])]) as serve:
        publish(tmp_path / "agents" / "builder", "body")
        await eventually(lambda: shown(telegram, GROUP), what="the card")
        chat = {"id": GROUP, "type": "supergroup", "title": "Fleet"}
        person = {"id": 1000, "is_bot": False, "first_name": "Ann"}
        telegram.inject_update({"message": {"message_id": 900, "chat": chat, "text": "/taskcard"}})
        telegram.inject_update(
            {"message": {"message_id": 901, "date": 1, "chat": chat, "from": person, "text": 5}}
        )
        telegram.inject_command(GROUP, "/taskcard 4")
        await eventually(
            lambda: any("4 activity rows" in t for t in shown(telegram, GROUP)),
            what="the answer to the command after the unreadable updates",
        )
        await eventually(lambda: not telegram.pending_updates, what="every update confirmed")
        assert await serve.aterminate() == 0
    assert "poller had failed" not in serve.logs
    assert "Traceback" not in serve.logs


async def test_a_command_with_an_empty_addressee_is_read_alike_on_both_platforms(
    tmp_path: Path, feishu: FakeFeishu, telegram: FakeTelegram
) -> None:
    # "/taskcard@ 4" names no bot: Telegram marks no command there (tdlib's
    # `match_bot_commands` wants 3 to 32 name characters after the `@`), and the same text
    # typed on Feishu is none either; the command after it is answered.
    with setup(tmp_path / "tg", telegram, ["builder"], [(GROUP, ["builder"])]) as serve:
        publish(tmp_path / "tg" / "agents" / "builder", "body")
        await eventually(lambda: shown(telegram, GROUP), what="the Telegram card")
        telegram.inject_command(GROUP, "/taskcard@ 4")
        telegram.inject_command(GROUP, "/taskcard 5")
        await eventually(
            lambda: any("now show 5 activity rows" in t for t in shown(telegram, GROUP)),
            what="the Telegram answer",
        )
        assert await serve.aterminate() == 0
    assert not any("4 activity rows" in t for t in shown(telegram, GROUP))
    fs = Setup(tmp_path / "fs", feishu, ["builder"])
    with fs.serve() as serve:
        publish(tmp_path / "fs" / "agents" / "builder", "body")
        await eventually(lambda: card_texts(feishu), what="the Feishu card")
        for text in ("/taskcard@ 4", "/taskcard 5"):
            await feishu.deliver_command(
                fs.url, CHAT, text, verification_token=VERIFY, encrypt_key=ENCRYPT
            )
        await eventually(
            lambda: any("now show 5 activity rows" in t for t in feishu.texts(CHAT)),
            what="the Feishu answer",
        )
        assert await serve.aterminate() == 0
    assert not any("4 activity rows" in t for t in feishu.texts(CHAT))


async def test_a_callback_body_that_is_not_text_is_refused_and_the_next_served(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    # Bytes that are not UTF-8, and JSON escaping a lone surrogate (valid JSON, no text: it
    # failed the token check with a 500 and a traceback), each sealed and signed as Feishu
    # would send an event: a 400 saying why, one warning line naming it with no secret in
    # it, and the next command is answered.
    setup = Setup(tmp_path, feishu, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "body")
        await eventually(lambda: card_texts(feishu), what="the card")
        surrogate = json.dumps({"schema": "2.0", "header": {"token": "\ud800"}}).encode()
        for plain, reason in [
            (b'{"schema": "2.0", "x": "\xff"}', "not UTF-8"),
            (surrogate, "lone surrogate"),
        ]:
            answer = await feishu.deliver_body(setup.url, plain, encrypt_key=ENCRYPT)
            assert answer.status == 400 and reason in str(answer.body), answer
            await eventually(
                lambda reason=reason: (
                    "feishu callback rejected: decrypted event" in serve.logs
                    and reason in serve.logs
                ),
                what=f"the warning saying {reason}",
            )
        await feishu.deliver_command(
            setup.url, CHAT, "/taskcard", verification_token=VERIFY, encrypt_key=ENCRYPT
        )
        await eventually(lambda: _answers(feishu), what="the answer to the next command")
        assert await serve.aterminate() == 0
    rejected = [line for line in serve.logs.splitlines() if "callback rejected" in line]
    assert len(rejected) == 2, rejected
    assert "Traceback" not in serve.logs
    for secret in (VERIFY, ENCRYPT, feishu.app_secret):
        assert secret not in serve.logs


async def test_a_message_whose_content_escapes_a_lone_surrogate_is_no_text(
    tmp_path: Path,
) -> None:
    # The content of a Feishu message is JSON inside the event's JSON: an escaped lone
    # surrogate there passes the body's check, and a `/tell` holding one failed writing the
    # agent's inbox with a traceback, leaving the person without an answer. Such content
    # reads as no text (a Feishu client never sends it); the next /tell is queued.
    async with running_card("feishu", tmp_path) as chat:
        assert isinstance(chat, FeishuChat)
        document = chat.fake.command_event(
            FS_CHAT, "/tell builder x", open_id=FS_PERSON, verification_token=FS_VERIFY
        )
        content = json.dumps({"text": "@_user_1 /tell builder broken \ud800 text"})
        document["event"]["message"]["content"] = content
        assert (await chat.fake.deliver_event(chat.url, document)).status == 200
        await chat.say("/tell builder fine text")
        await eventually(lambda: queued(tmp_path), what="the second /tell queued")
        [message] = queued(tmp_path)
        assert json.loads(message.read_text())["text"] == "fine text"
    assert "Traceback" not in chat.serve.logs
