"""The channel contract suite: behaviour every transport must show, run once per harness.

Channel-neutral on purpose: it only uses `channel_harness` (see conftest), so a new
transport runs it by adding a harness. Each test drives the real client library over real
HTTP against the transport's stateful fake.
"""

from __future__ import annotations

import pytest

from taskcard.channels.base import CardView
from taskcard.channels.errors import Forbidden, MessageGone, NotModified, RateLimited
from tests.channels.conftest import ChannelHarness, CommandInbox, wait_until


def _card(body: str, state: str = "running") -> CardView:
    return CardView(agent_id="builder", state=state, auto_rows=("last: tests 1m ago",), body=body)  # type: ignore[arg-type]


async def test_send_then_edit_in_place(channel_harness: ChannelHarness) -> None:
    channel = await channel_harness.started_channel()
    chat = channel_harness.group_chat()
    first = channel.render_card(_card("step **1** of 3"))
    message_id = await channel.send(chat, first)
    assert channel_harness.shown_text(chat, message_id) == first.text

    second = channel.render_card(_card("step **2** of 3"))
    await channel.edit(chat, message_id, second)
    assert channel_harness.shown_text(chat, message_id) == second.text
    assert channel_harness.shown_messages(chat) == [second.text], "edited, not re-posted"


async def test_unchanged_edit_is_not_modified(channel_harness: ChannelHarness) -> None:
    channel = await channel_harness.started_channel()
    chat = channel_harness.private_chat()
    message = channel.render_card(_card("same"))
    message_id = await channel.send(chat, message)
    with pytest.raises(NotModified):
        await channel.edit(chat, message_id, message)
    assert channel_harness.shown_messages(chat) == [message.text]


async def test_deleted_message_is_gone(channel_harness: ChannelHarness) -> None:
    channel = await channel_harness.started_channel()
    chat = channel_harness.group_chat()
    message_id = await channel.send(chat, channel.render_card(_card("v1")))
    channel_harness.user_delete(chat, message_id)
    with pytest.raises(MessageGone):
        await channel.edit(chat, message_id, channel.render_card(_card("v2")))
    # Deleting what is already gone is not an error.
    await channel.delete(chat, message_id)
    assert channel_harness.shown_messages(chat) == []


async def test_delete_removes_the_message(channel_harness: ChannelHarness) -> None:
    channel = await channel_harness.started_channel()
    chat = channel_harness.group_chat()
    message_id = await channel.send(chat, channel.render_text("temporary notice"))
    await channel.delete(chat, message_id)
    assert channel_harness.shown_text(chat, message_id) is None


async def test_removed_bot_is_forbidden(channel_harness: ChannelHarness) -> None:
    channel = await channel_harness.started_channel()
    group, private = channel_harness.group_chat(), channel_harness.private_chat()
    message_id = await channel.send(group, channel.render_card(_card("v1")))
    channel_harness.remove_bot(group)
    with pytest.raises(Forbidden) as caught:
        await channel.edit(group, message_id, channel.render_card(_card("v2")))
    assert caught.value.reason
    # Other chats keep working.
    await channel.send(private, channel.render_text("still here"))
    assert channel_harness.shown_messages(private) == ["still here"]


async def test_platform_limit_is_rate_limited_on_a_declared_scope(
    channel_harness: ChannelHarness,
) -> None:
    channel = await channel_harness.started_channel()
    chat = channel_harness.group_chat()
    channel_harness.limit_chat(max_calls=2, period_s=30.0)
    message_id = await channel.send(chat, channel.render_card(_card("v1")))
    await channel.edit(chat, message_id, channel.render_card(_card("v2")))
    with pytest.raises(RateLimited) as caught:
        await channel.edit(chat, message_id, channel.render_card(_card("v3")))
    declared = {scope.key for scope in channel.rate_scopes(chat, "edit", message_id)}
    assert caught.value.scope in declared
    assert 0 < caught.value.retry_after_s <= 30.0
    assert channel_harness.shown_text(chat, message_id) == channel.render_card(_card("v2")).text


async def test_over_long_body_is_accepted(channel_harness: ChannelHarness) -> None:
    channel = await channel_harness.started_channel()
    chat = channel_harness.group_chat()
    body = ("😀 进度 **步骤** `code` " * 1000)[:10_000]
    rows = tuple(f"activity row {i}" for i in range(10))
    message = channel.render_card(CardView("builder", "running", rows, body=body))
    message_id = await channel.send(chat, message)
    assert channel_harness.shown_text(chat, message_id) == message.text


async def test_hidden_notice_replaces_card(channel_harness: ChannelHarness) -> None:
    channel = await channel_harness.started_channel()
    chat = channel_harness.group_chat()
    message_id = await channel.send(chat, channel.render_card(_card("visible")))
    hidden = channel.render_card(CardView("builder", "running", body="visible", hidden=True))
    await channel.edit(chat, message_id, hidden)
    shown = channel_harness.shown_text(chat, message_id)
    assert shown is not None and "hidden" in shown and "visible" not in shown


async def test_new_command_is_delivered_and_edit_is_not(channel_harness: ChannelHarness) -> None:
    inbox = CommandInbox()
    await channel_harness.started_channel(inbox)
    chat = channel_harness.group_chat()
    channel_harness.inject_command(chat, "/taskcard on", user_id=7, edited=True)
    channel_harness.inject_command(chat, "/taskcard off", user_id=7)
    commands = await inbox.wait_for(1)
    assert [(c.chat.chat_id, c.args, c.user_id) for c in commands] == [(chat.chat_id, "off", "7")]
    # Nothing else arrives: the edit was confirmed past, not queued.
    channel_harness.inject_command(chat, "/taskcard 3", user_id=8)
    commands = await inbox.wait_for(2)
    assert [c.args for c in commands] == ["off", "3"]


async def test_stop_is_idempotent(channel_harness: ChannelHarness) -> None:
    channel = await channel_harness.started_channel(CommandInbox())
    await channel.stop()
    await channel.stop()
    await wait_until(lambda: True)
