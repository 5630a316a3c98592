"""The Feishu channel over real HTTP against the stateful fake Open API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from taskcard.channels.base import CardView, ChatRef, RateLimit, ReplyTo
from taskcard.channels.errors import (
    CredentialsRejected,
    Forbidden,
    MessageGone,
    NotModified,
    Permanent,
    RateLimited,
    Transient,
)
from taskcard.channels.feishu.card import CARD_LIMIT_BYTES, card_plain_text
from taskcard.channels.feishu.channel import FeishuChannel, send_uuid
from taskcard.channels.feishu.config import FeishuConfig, FeishuLimits
from tests.channels.conftest import CommandInbox, MemoryCursorStore
from tests.fakes.feishu_api import FakeFeishu, FakeLimits

CHAT = ChatRef("oc_group_1")


def _view(body: str, state: str = "running") -> CardView:
    return CardView("builder", state, ("last: tests 1m ago",), body=body)  # type: ignore[arg-type]


@pytest.fixture
async def fake() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu() as server:
        yield server


def _config(fake: FakeFeishu, **overrides: object) -> FeishuConfig:
    return FeishuConfig(domain=fake.base_url, events="none", request_timeout_s=10.0, **overrides)  # type: ignore[arg-type]


@pytest.fixture
async def channel(fake: FakeFeishu) -> AsyncIterator[FeishuChannel]:
    channel = FeishuChannel(_config(fake), fake.app_id, fake.app_secret, MemoryCursorStore())
    await channel.start(CommandInbox())
    try:
        yield channel
    finally:
        await channel.stop()


async def test_create_then_patch_in_place(fake: FakeFeishu, channel: FeishuChannel) -> None:
    message_id = await channel.send(CHAT, channel.render_card(_view("step 1")))
    second = channel.render_card(_view("step 2", state="waiting"))
    await channel.edit(CHAT, message_id, second)

    shown = fake.chat(CHAT.chat_id)
    assert [m.message_id for m in shown] == [message_id], "updated in place, not re-posted"
    assert shown[0].update_count == 1
    assert card_plain_text(shown[0].card) == second.text
    assert shown[0].card["header"]["template"] == "orange"
    assert [r.operation for r in fake.requests] == ["token", "send", "patch"]
    assert [r.method for r in fake.requests[1:]] == ["POST", "PATCH"], "never the text PUT"


async def test_identical_edit_is_not_modified(fake: FakeFeishu, channel: FeishuChannel) -> None:
    message = channel.render_card(_view("same"))
    message_id = await channel.send(CHAT, message)
    with pytest.raises(NotModified):
        await channel.edit(CHAT, message_id, message)
    assert fake.requests_of("patch") == []


async def test_huge_body_is_accepted_within_30_kb(fake: FakeFeishu, channel: FeishuChannel) -> None:
    body = '进度 😀 **步骤** `code` "quoted" <tag>\n' * 5000
    rows = tuple(f"activity row {i}" for i in range(10))
    message = channel.render_card(CardView("builder", "running", rows, body=body))
    message_id = await channel.send(CHAT, message)
    await channel.edit(
        CHAT, message_id, channel.render_card(CardView("builder", "idle", rows, body=body * 2))
    )
    stored = fake.messages[message_id]
    for content in stored.contents:
        assert len(json.dumps(content, ensure_ascii=False).encode()) <= CARD_LIMIT_BYTES
    assert "card cut to fit" in stored.text
    assert fake.errors() == []


async def test_text_messages_for_notices(fake: FakeFeishu, channel: FeishuChannel) -> None:
    await channel.send(CHAT, channel.render_text("agent builder: renderer failing"))
    assert fake.texts(CHAT.chat_id) == ["agent builder: renderer failing"]


async def test_a_text_longer_than_a_text_message_may_be_is_cut_to_fit(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    """Feishu refuses a text message over 150 KB as it travels (230025), as the fake does; a
    longer notice or reply arrives cut, with a marker, as Telegram's are cut to fit."""
    text = "".join(f"line {number:06d}: 条目 {'x' * 40}\n" for number in range(4000))
    await channel.send(CHAT, channel.render_text(text))
    [shown] = fake.texts(CHAT.chat_id)
    assert shown.endswith("…") and text.startswith(shown[:-1])
    assert len(shown) > len(text) // 2  # cut near the limit, not far below it
    assert fake.errors() == []


async def test_rate_scopes(channel: FeishuChannel) -> None:
    app = [("feishu:app", 50, 1.0), ("feishu:app:minute", 1000, 60.0)]
    send = channel.rate_scopes(CHAT, "send", None)
    assert [(s.key, s.max_calls, s.period_s) for s in send] == [
        ("feishu:chat:oc_group_1", 5, 1.0),
        *app,
    ]
    edit = channel.rate_scopes(CHAT, "edit", "om_9")
    assert [(s.key, s.max_calls, s.period_s) for s in edit] == [
        ("feishu:message:om_9", 5, 1.0),
        *app,
    ]
    for operation in ("delete", "pin"):
        scopes = channel.rate_scopes(CHAT, operation, "om_9")  # type: ignore[arg-type]
        assert [(s.key, s.max_calls, s.period_s) for s in scopes] == app


async def test_rate_scopes_follow_configured_limits(fake: FakeFeishu) -> None:
    limits = FeishuLimits(
        message_update=RateLimit(max_calls=2, period_s=3.0),
        app_minute=RateLimit(max_calls=600, period_s=60.0),
    )
    channel = FeishuChannel(
        _config(fake, limits=limits), fake.app_id, fake.app_secret, MemoryCursorStore()
    )
    (message, app, app_minute) = channel.rate_scopes(CHAT, "edit", "om_1")
    assert (message.max_calls, message.period_s) == (2, 3.0)
    assert (app.max_calls, app.period_s) == (50, 1.0)
    assert (app_minute.key, app_minute.max_calls, app_minute.period_s) == (
        "feishu:app:minute",
        600,
        60.0,
    )


def test_limits_without_app_minute_keep_the_default() -> None:
    """Configs written before the minute window still load, and get Feishu's 1000/min."""
    limits = FeishuLimits.model_validate({"app": {"max_calls": 20, "period_s": 1.0}})
    assert (limits.app.max_calls, limits.app_minute.max_calls) == (20, 1000)
    assert limits.app_minute.period_s == 60.0


async def test_app_minute_limit_of_the_fake(fake: FakeFeishu, channel: FeishuChannel) -> None:
    fake.limits = FakeLimits(app_per_minute=2)
    await channel.send(CHAT, channel.render_text("one"))
    await channel.send(ChatRef("oc_other"), channel.render_text("two"))
    with pytest.raises(RateLimited) as caught:
        await channel.send(ChatRef("oc_third"), channel.render_text("three"))
    assert caught.value.scope == "feishu:app"


async def test_send_with_the_same_key_posts_once(fake: FakeFeishu, channel: FeishuChannel) -> None:
    """A send retried with its idempotency key (say after a timeout) gets the first card."""
    card = channel.render_card(_view("v1"))
    first = await channel.send(CHAT, card, idempotency_key="route-a:1")
    again = await channel.send(CHAT, card, idempotency_key="route-a:1")
    assert again == first
    other = await channel.send(CHAT, card, idempotency_key="route-a:2")
    assert other != first
    assert [m.message_id for m in fake.chat(CHAT.chat_id)] == [first, other]
    assert len(fake.requests_of("send")) == 3
    assert fake.errors() == []


async def test_long_key_is_hashed_to_a_valid_uuid(fake: FakeFeishu, channel: FeishuChannel) -> None:
    key = "feishu/oc_group_1/代理-builder:" + "x" * 100
    first = await channel.send(CHAT, channel.render_text("hi"), idempotency_key=key)
    again = await channel.send(CHAT, channel.render_text("hi"), idempotency_key=key)
    near = await channel.send(CHAT, channel.render_text("hi"), idempotency_key=key + "y")
    assert again == first != near
    assert len(fake.texts(CHAT.chat_id)) == 2
    assert fake.errors() == [], "the fake refuses a uuid longer than 50 characters"
    assert len(send_uuid(key)) <= 50
    assert send_uuid("short-key") == "short-key"


async def test_sends_without_a_key_are_not_deduplicated(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    await channel.send(CHAT, channel.render_text("hi"))
    await channel.send(CHAT, channel.render_text("hi"))
    assert fake.texts(CHAT.chat_id) == ["hi", "hi"]


async def test_key_deduplicates_for_one_hour(fake: FakeFeishu, channel: FeishuChannel) -> None:
    first = await channel.send(CHAT, channel.render_text("hi"), idempotency_key="k")
    fake.advance_time(3601)
    later = await channel.send(CHAT, channel.render_text("hi"), idempotency_key="k")
    assert later != first
    assert len(fake.texts(CHAT.chat_id)) == 2


async def test_app_limit_is_rate_limited_on_app_scope(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    fake.script_rate_limit("patch", reset_s=7)
    message_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    with pytest.raises(RateLimited) as caught:
        await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
    assert caught.value.scope == "feishu:app"
    assert caught.value.retry_after_s == 7.0
    assert caught.value.scope in {s.key for s in channel.rate_scopes(CHAT, "edit", message_id)}
    assert "v1" in fake.messages[message_id].text


async def test_rate_limit_code_with_http_400(fake: FakeFeishu, channel: FeishuChannel) -> None:
    fake.script_error("send", 99991400, http_status=400, headers={"x-ogw-ratelimit-reset": "4"})
    with pytest.raises(RateLimited) as caught:
        await channel.send(CHAT, channel.render_card(_view("v1")))
    assert (caught.value.scope, caught.value.retry_after_s) == ("feishu:app", 4.0)
    assert fake.chat(CHAT.chat_id) == []


async def test_per_message_limit_pauses_that_message(fake: FakeFeishu) -> None:
    fake.limits = FakeLimits(message_update=2, window_s=60.0)
    channel = FeishuChannel(_config(fake), fake.app_id, fake.app_secret, MemoryCursorStore())
    await channel.start(CommandInbox())
    try:
        message_id = await channel.send(CHAT, channel.render_card(_view("v0")))
        await channel.edit(CHAT, message_id, channel.render_card(_view("v1")))
        await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
        with pytest.raises(RateLimited) as caught:
            await channel.edit(CHAT, message_id, channel.render_card(_view("v3")))
        assert caught.value.scope == f"feishu:message:{message_id}"
        # Another message in the same chat is not paused.
        other = await channel.send(CHAT, channel.render_card(_view("w0")))
        await channel.edit(CHAT, other, channel.render_card(_view("w1")))
    finally:
        await channel.stop()
    assert [e.code for e in fake.errors()] == [230020]


async def test_per_chat_send_limit(fake: FakeFeishu) -> None:
    fake.limits = FakeLimits(chat_send=1, window_s=60.0, reset_s=9)
    channel = FeishuChannel(_config(fake), fake.app_id, fake.app_secret, MemoryCursorStore())
    await channel.start(CommandInbox())
    try:
        await channel.send(CHAT, channel.render_text("first"))
        with pytest.raises(RateLimited) as caught:
            await channel.send(CHAT, channel.render_text("second"))
        # Feishu's 230020 (the chat's throttle, no reset header): that chat alone, a second.
        assert (caught.value.scope, caught.value.retry_after_s) == (
            f"feishu:chat:{CHAT.chat_id}",
            1.0,
        )
        assert caught.value.scope in {s.key for s in channel.rate_scopes(CHAT, "send", None)}
        await channel.send(ChatRef("oc_other"), channel.render_text("elsewhere"))
    finally:
        await channel.stop()
    assert fake.texts(CHAT.chat_id) == ["first"]
    assert [(e.http_status, e.code) for e in fake.errors()] == [(400, 230020)]


async def test_card_older_than_14_days_is_gone(fake: FakeFeishu, channel: FeishuChannel) -> None:
    message_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    fake.age_message(message_id, days=14.5)
    with pytest.raises(MessageGone):
        await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
    assert [e.code for e in fake.errors()] == [230031]


async def test_card_gone_after_clock_advance(fake: FakeFeishu, channel: FeishuChannel) -> None:
    message_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
    fake.advance_time(13 * 24 * 3600)
    await channel.edit(CHAT, message_id, channel.render_card(_view("v3")))
    fake.advance_time(2 * 24 * 3600)
    with pytest.raises(MessageGone):
        await channel.edit(CHAT, message_id, channel.render_card(_view("v4")))


@pytest.mark.parametrize("how", ["recall", "delete"])
async def test_recalled_or_deleted_card_is_gone(
    fake: FakeFeishu, channel: FeishuChannel, how: str
) -> None:
    message_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    if how == "recall":
        fake.recall(message_id)
    else:
        fake.delete_message(message_id)
    with pytest.raises(MessageGone):
        await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
    await channel.delete(CHAT, message_id)  # already gone: not an error
    assert fake.chat(CHAT.chat_id) == []


async def test_unknown_message_id_is_gone(fake: FakeFeishu, channel: FeishuChannel) -> None:
    """Feishu answers an id it does not know with 400 / 230001 "invalid message_id": for an
    edit that means the card is gone and must be replaced, not retried forever."""
    with pytest.raises(MessageGone):
        await channel.edit(CHAT, "om_never_issued", channel.render_card(_view("v2")))
    await channel.delete(CHAT, "om_never_issued")  # gone already: not an error
    assert [(e.operation, e.http_status, e.code) for e in fake.errors()] == [
        ("patch", 400, 230001),
        ("delete", 400, 230001),
    ]


async def test_http_404_on_edit_is_gone(fake: FakeFeishu, channel: FeishuChannel) -> None:
    message_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    fake.script_error("patch", 230001, http_status=404, msg="not found")
    with pytest.raises(MessageGone):
        await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))


async def test_invalid_parameter_on_send_stays_permanent(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    fake.script_error(
        "send",
        230001,
        msg="Your request contains an invalid request parameter, ext=invalid message_id.",
    )
    with pytest.raises(Permanent):
        await channel.send(CHAT, channel.render_card(_view("v1")))


async def test_delete_recalls_and_pin_pins(fake: FakeFeishu, channel: FeishuChannel) -> None:
    card_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    await channel.pin(CHAT, card_id)
    assert fake.messages[card_id].pinned
    notice_id = await channel.send(CHAT, channel.render_text("bye"))
    await channel.delete(CHAT, notice_id)
    assert [m.message_id for m in fake.chat(CHAT.chat_id)] == [card_id]


async def test_removed_bot_is_forbidden(fake: FakeFeishu, channel: FeishuChannel) -> None:
    message_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    fake.remove_bot(CHAT.chat_id)
    with pytest.raises(Forbidden):
        await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
    with pytest.raises(Forbidden):
        await channel.send(CHAT, channel.render_card(_view("v2")))


async def test_a_dissolved_chat_is_forbidden_for_every_call(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    """Feishu documents 232009 ("a chat which has already been dissolved") for each call we
    make: the route is disabled, never retried change by change nor replaced by a new card."""
    card_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    fake.dissolve_chat(CHAT.chat_id)
    with pytest.raises(Forbidden, match="232009"):
        await channel.edit(CHAT, card_id, channel.render_card(_view("v2")))
    with pytest.raises(Forbidden, match="232009"):
        await channel.send(CHAT, channel.render_card(_view("v2")))
    with pytest.raises(Forbidden, match="232009"):
        await channel.pin(CHAT, card_id)
    with pytest.raises(Forbidden, match="232009"):
        await channel.delete(CHAT, card_id)
    assert {e.code for e in fake.errors()} == {232009}


async def test_a_person_who_stopped_the_bot_forbids_sends(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    """230053: the person of a one-to-one chat turned the bot's messages off."""
    private = ChatRef("oc_p2p_1")
    fake.stop_bot(private.chat_id)
    with pytest.raises(Forbidden, match="230053"):
        await channel.send(private, channel.render_card(_view("v1")), idempotency_key="k1")
    assert fake.chat(private.chat_id) == []


MESSAGE_NOT_FOUND = "The message is not found, maybe not exist or deleted."


async def test_a_message_not_found_is_gone_for_calls_about_it(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    """231003 says the message a call names is not found: the card is replaced once (an
    edit), a delete is done, a pin finds no card; a send names no message, so there the
    code is a refusal, not a reason to post again."""
    card_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    for operation in ("patch", "delete", "pin", "send"):
        fake.script_error(operation, 231003, msg=MESSAGE_NOT_FOUND)
    with pytest.raises(MessageGone):
        await channel.edit(CHAT, card_id, channel.render_card(_view("v2")))
    await channel.delete(CHAT, card_id)  # gone already: not an error
    with pytest.raises(MessageGone):
        await channel.pin(CHAT, card_id)
    with pytest.raises(Permanent):
        await channel.send(CHAT, channel.render_card(_view("v3")))
    assert [(e.operation, e.code) for e in fake.errors()] == [
        ("patch", 231003),
        ("delete", 231003),
        ("pin", 231003),
        ("send", 231003),
    ]


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        (230027, 400, Forbidden),
        (230025, 400, Permanent),
        (230001, 400, Permanent),
        (1, 500, Transient),
        (230020, 400, RateLimited),
        # A refused tenant token is fetched again whatever the status, never a disabled route.
        (99991663, 403, Transient),
    ],
)
async def test_scripted_errors_are_translated(
    fake: FakeFeishu, channel: FeishuChannel, code: int, status: int, kind: type[Exception]
) -> None:
    message_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    fake.script_error("patch", code, http_status=status)
    with pytest.raises(kind):
        await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
    # The script is used up: the same edit now succeeds.
    await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
    assert "v2" in fake.messages[message_id].text


async def test_non_json_answer_is_transient(fake: FakeFeishu, channel: FeishuChannel) -> None:
    fake.script_error("send", 0, http_status=502)
    with pytest.raises(Transient):
        await channel.send(CHAT, channel.render_text("x"))


async def test_refused_token_is_fetched_again(fake: FakeFeishu, channel: FeishuChannel) -> None:
    message_id = await channel.send(CHAT, channel.render_card(_view("v1")))
    fake.revoke_tokens()
    with pytest.raises(Transient):
        await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
    await channel.edit(CHAT, message_id, channel.render_card(_view("v2")))
    assert [r.operation for r in fake.requests].count("token") == 2


async def test_unreachable_api_is_transient(fake: FakeFeishu, channel: FeishuChannel) -> None:
    await fake.stop()
    with pytest.raises(Transient):
        await channel.send(CHAT, channel.render_text("x"))


async def test_wrong_secret_fails_start(fake: FakeFeishu) -> None:
    channel = FeishuChannel(_config(fake), fake.app_id, "wrong", MemoryCursorStore())
    with pytest.raises(CredentialsRejected) as caught:
        await channel.start(CommandInbox())
    assert "wrong" not in str(caught.value)
    await channel.stop()


def test_plain_http_only_on_loopback() -> None:
    config = FeishuConfig(domain="http://open.example.com", events="none")
    with pytest.raises(ValueError, match="https"):
        FeishuChannel(config, "cli", "secret", MemoryCursorStore())


async def test_a_reply_goes_into_the_commands_thread_once_per_key(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    document = fake.command_event(CHAT.chat_id, "/taskcard", thread_id="omt_1")
    asked = document["event"]["message"]["message_id"]
    target = ReplyTo(asked, "omt_1")
    first = await channel.send(
        CHAT, channel.render_text("hi"), idempotency_key="r:1", reply_to=target
    )
    again = await channel.send(
        CHAT, channel.render_text("hi"), idempotency_key="r:1", reply_to=target
    )
    assert first == again and [m.message_id for m in fake.replies_to(asked)] == [first]
    assert fake.messages[first].thread_id == "omt_1"


@pytest.mark.parametrize("gone", ["recalled", "deleted", "unknown"])
async def test_a_reply_to_a_gone_command_is_posted_to_the_chat(
    fake: FakeFeishu, channel: FeishuChannel, gone: str
) -> None:
    asked = "om_never_issued"
    if gone != "unknown":
        document = fake.command_event(CHAT.chat_id, "/taskcard", thread_id="omt_1")
        asked = document["event"]["message"]["message_id"]
        (fake.recall if gone == "recalled" else fake.delete_message)(asked)
    target = ReplyTo(asked, "omt_1")
    sent = await channel.send(
        CHAT, channel.render_text("hi"), idempotency_key="r:1", reply_to=target
    )
    expected = {"recalled": 230011, "deleted": 230110, "unknown": 230001}[gone]
    assert [r.code for r in fake.requests_of("reply")] == [expected]
    message = fake.messages[sent]
    assert message.chat_id == CHAT.chat_id and message.thread_id is None and not message.parent_id


async def test_a_reply_in_a_chat_the_bot_left_is_forbidden(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    document = fake.command_event(CHAT.chat_id, "/taskcard")
    fake.remove_bot(CHAT.chat_id)
    target = ReplyTo(document["event"]["message"]["message_id"])
    with pytest.raises(Forbidden):
        await channel.send(CHAT, channel.render_text("hi"), reply_to=target)
    assert not fake.requests_of("send")  # not posted to the chat instead
