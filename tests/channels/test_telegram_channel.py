"""Telegram-specific behaviour of `TelegramChannel`, with real PTB against the fake API."""

from __future__ import annotations

import logging

import pytest

from taskcard.channels.base import CardView, ChatRef, RateScope
from taskcard.channels.errors import (
    Forbidden,
    MessageGone,
    OutcomeUnknown,
    Permanent,
    RateLimited,
    Transient,
)
from taskcard.channels.telegram import channel as telegram_channel_module
from taskcard.channels.telegram.channel import TelegramChannel
from taskcard.channels.telegram.config import TelegramConfig, TelegramLimits
from taskcard.channels.telegram.errors import ThreadNotFound
from taskcard.channels.telegram.render import MAX_MESSAGE_UTF16, utf16_len
from tests.channels.conftest import CommandInbox, MemoryCursorStore
from tests.fakes.telegram_api import FakeLimits, FakeTelegram, Window

GROUP = ChatRef("-100555")
PRIVATE = ChatRef("777")


def _card(body: str) -> CardView:
    return CardView(agent_id="builder", state="running", body=body)


def test_rate_scopes_private_group_and_bot(telegram_config: TelegramConfig) -> None:
    limits = TelegramLimits()
    channel = TelegramChannel(telegram_config, "1:x", MemoryCursorStore())
    assert channel.rate_scopes(PRIVATE, "edit", "5") == (
        RateScope("telegram:chat:777", limits.private_chat.max_calls, 1.0),
        RateScope("telegram:bot", limits.bot.max_calls, limits.bot.period_s),
    )
    group_scopes = channel.rate_scopes(ChatRef("-100555", "9"), "send", None)
    assert group_scopes[0] == RateScope("telegram:chat:-100555", 20, 60.0)
    assert [s.key for s in channel.rate_scopes(GROUP, "pin", "5")] == ["telegram:bot"]


def test_rate_scopes_are_built_once_per_chat(
    telegram_config: TelegramConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Asked twice for every request: a chat's scopes are kept, each chat's its own (a topic
    # shares its group's limit), and the kept ones are dropped past a bound.
    channel = TelegramChannel(telegram_config, "1:x", MemoryCursorStore())
    first = channel.rate_scopes(GROUP, "edit", "5")
    assert channel.rate_scopes(GROUP, "send", None) is first
    topic = channel.rate_scopes(ChatRef("-100555", "9"), "edit", "6")
    assert topic == first and topic is not first
    private = channel.rate_scopes(PRIVATE, "edit", "5")
    assert private[0].key == "telegram:chat:777" and private[0].max_calls == 1
    assert private[1] is first[1] is channel.rate_scopes(GROUP, "delete", "5")[0]
    monkeypatch.setattr(telegram_channel_module, "_KEPT_SCOPES", 3)
    for chat_id in range(1, 10):
        scopes = channel.rate_scopes(ChatRef(str(chat_id)), "edit", "1")
        assert scopes[0].key == f"telegram:chat:{chat_id}"
        assert len(channel._message_scopes) <= 3
    assert channel.rate_scopes(GROUP, "edit", "5") == first


async def test_rate_limited_carries_retry_after_and_chat_scope(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    telegram_fake.limits = FakeLimits(private_chat=Window(1, 37.0), group_chat=None, bot=None)
    message_id = await telegram_channel.send(PRIVATE, telegram_channel.render_card(_card("a")))
    with pytest.raises(RateLimited) as caught:
        await telegram_channel.edit(PRIVATE, message_id, telegram_channel.render_card(_card("b")))
    recorded = telegram_fake.rate_limited[-1]
    assert caught.value.retry_after_s == recorded.retry_after_s > 30
    assert caught.value.scope == "telegram:chat:777"
    # Edits share the send limit: the edit, not only sends, was refused.
    assert recorded.method == "editMessageText"


async def test_thread_send_and_thread_free_edit(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    topic = ChatRef("-100555", "42")
    message_id = await telegram_channel.send(topic, telegram_channel.render_card(_card("a")))
    stored = telegram_fake.message(-100555, message_id)
    assert stored is not None and stored.thread_id == 42
    await telegram_channel.edit(topic, message_id, telegram_channel.render_card(_card("b")))
    edit = [r for r in telegram_fake.requests if r.method == "editMessageText"][-1]
    assert "message_thread_id" not in edit.params
    assert [m.text for m in telegram_fake.bot_messages(-100555, 42)] == [stored.text]


async def test_deleted_topic_disables_the_route_like_a_kick(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    telegram_fake.delete_topic(-100555, 42)
    with pytest.raises(ThreadNotFound) as caught:
        await telegram_channel.send(ChatRef("-100555", "42"), telegram_channel.render_text("x"))
    assert isinstance(caught.value, Forbidden)
    assert "forum topic" in caught.value.reason


async def test_markdown_entities_pass_the_fakes_validation(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    body = "# Build\n\n**bold** _it_ `x` ~~old~~ [log](https://example.org)\n\n```sh\nmake\n```"
    message = telegram_channel.render_card(_card(body))
    message_id = await telegram_channel.send(GROUP, message)
    stored = telegram_fake.message(-100555, message_id)
    assert stored is not None
    assert stored.entities == list(message.payload["entities"])
    kinds = {e["type"] for e in stored.entities}
    assert {"bold", "italic", "code", "strikethrough", "text_link", "pre"} <= kinds


async def test_markdown_v2_breaking_body_is_shown(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    body = "_unclosed *star [bracket (paren) ~tilde `tick| 1.5! #x a_b"
    message_id = await telegram_channel.send(GROUP, telegram_channel.render_card(_card(body)))
    stored = telegram_fake.message(-100555, message_id)
    assert stored is not None and "bracket" in stored.text and "1.5!" in stored.text


async def test_unparsable_entities_fall_back_to_plain_text(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    telegram_fake.fail_next(
        "sendMessage", 400, "Bad Request: can't parse entities: unsupported start tag"
    )
    message = telegram_channel.render_card(_card("**bold**"))
    message_id = await telegram_channel.send(GROUP, message)
    stored = telegram_fake.message(-100555, message_id)
    assert stored is not None and stored.text == message.text and stored.entities == []
    assert telegram_fake.count("sendMessage") == 2


async def test_an_edit_with_unparsable_entities_falls_back_to_plain_text(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    message_id = await telegram_channel.send(GROUP, telegram_channel.render_card(_card("x")))
    telegram_fake.fail_next(
        "editMessageText", 400, "Bad Request: can't parse entities: unsupported start tag"
    )
    message = telegram_channel.render_card(_card("**bold**"))
    await telegram_channel.edit(GROUP, message_id, message)
    stored = telegram_fake.message(-100555, message_id)
    assert stored is not None and stored.text == message.text and stored.entities == []
    assert telegram_fake.count("editMessageText") == 2


async def test_server_error_is_transient(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    telegram_fake.fail_next("sendMessage", 502, "Bad Gateway")
    with pytest.raises(Transient):
        await telegram_channel.send(GROUP, telegram_channel.render_text("x"))
    # The next request works: the channel itself never retried or slept.
    await telegram_channel.send(GROUP, telegram_channel.render_text("x"))
    assert telegram_fake.count("sendMessage") == 2


async def test_unreachable_api_is_transient() -> None:
    config = TelegramConfig(api_base_url="http://127.0.0.1:9", request_timeout_s=5.0)
    channel = TelegramChannel(config, "1:x", MemoryCursorStore())
    with pytest.raises(Transient) as caught:
        await channel.start(CommandInbox())
    # Nothing reached Telegram, so nothing can have been performed.
    assert not isinstance(caught.value, OutcomeUnknown)


async def test_a_send_answer_lost_after_posting_is_an_unknown_outcome(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    telegram_fake.drop_after_accept("sendMessage")
    with pytest.raises(OutcomeUnknown):
        await telegram_channel.send(GROUP, telegram_channel.render_text("posted"))
    assert [m.text for m in telegram_fake.bot_messages(-100555)] == ["posted"]


async def test_a_slow_send_is_awaited_while_edits_keep_their_timeout(
    telegram_fake: FakeTelegram, telegram_cursor: MemoryCursorStore
) -> None:
    config = TelegramConfig(
        api_base_url=telegram_fake.base_url,
        commands=False,
        request_timeout_s=0.5,
        send_timeout_s=60.0,
    )
    channel = TelegramChannel(config, telegram_fake.token, telegram_cursor)
    await channel.start(CommandInbox())
    try:
        telegram_fake.delay_answers("sendMessage", 2.0)
        telegram_fake.delay_answers("editMessageText", 5.0)
        message_id = await channel.send(GROUP, channel.render_text("slow"))
        assert telegram_fake.message(-100555, message_id) is not None
        with pytest.raises(OutcomeUnknown):
            await channel.edit(GROUP, message_id, channel.render_text("slow edit"))
    finally:
        telegram_fake.delay_answers("editMessageText", 0)
        await channel.stop()


async def test_invalid_token_fails_start_without_leaking_it(
    telegram_fake: FakeTelegram, telegram_config: TelegramConfig
) -> None:
    secret = "999:wrong-secret-token"
    channel = TelegramChannel(telegram_config, secret, MemoryCursorStore())
    with pytest.raises(Permanent) as caught:
        await channel.start(CommandInbox())
    assert "token" in str(caught.value)
    assert "wrong-secret" not in str(caught.value)
    await channel.stop()


async def test_pin_is_quiet(telegram_fake: FakeTelegram, telegram_channel: TelegramChannel) -> None:
    message_id = await telegram_channel.send(GROUP, telegram_channel.render_text("card"))
    await telegram_channel.pin(GROUP, message_id)
    stored = telegram_fake.message(-100555, message_id)
    assert stored is not None and stored.pinned
    pin = [r for r in telegram_fake.requests if r.method == "pinChatMessage"][-1]
    assert pin.params["disable_notification"] in (True, "true", "True")


async def test_fake_rejects_text_over_4096_utf16(
    telegram_fake: FakeTelegram, telegram_channel: TelegramChannel
) -> None:
    from taskcard.channels.base import Outgoing

    raw = "😀" * 2049  # 4098 UTF-16 units, 2049 code points
    assert utf16_len(raw) > MAX_MESSAGE_UTF16
    with pytest.raises(Permanent, match="too long"):
        await telegram_channel.send(GROUP, Outgoing.build(raw, {"text": raw}))
    fitted = telegram_channel.render_text(raw)
    await telegram_channel.send(GROUP, fitted)


async def test_corrupt_stored_id_is_gone_not_a_crash(telegram_channel: TelegramChannel) -> None:
    with pytest.raises(MessageGone):
        await telegram_channel.edit(GROUP, "not-an-id", telegram_channel.render_text("x"))
    await telegram_channel.delete(GROUP, "not-an-id")


async def test_token_never_reaches_the_logs(
    telegram_fake: FakeTelegram,
    telegram_config: TelegramConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    channel = TelegramChannel(telegram_config, telegram_fake.token, MemoryCursorStore())
    await channel.start(CommandInbox())
    try:
        await channel.send(GROUP, channel.render_text("hello"))
        telegram_fake.fail_next("sendMessage", 500, "Internal Server Error")
        with pytest.raises(Transient):
            await channel.send(GROUP, channel.render_text("hello"))
    finally:
        await channel.stop()
    assert any("sendMessage" in record.getMessage() for record in caplog.records)
    secret = telegram_fake.token.split(":", 1)[1]
    assert secret not in caplog.text


async def test_missing_token_fails_start_clearly(telegram_config: TelegramConfig) -> None:
    channel = TelegramChannel(telegram_config, "", MemoryCursorStore())
    with pytest.raises(Permanent, match="token_env"):
        await channel.start(CommandInbox())
