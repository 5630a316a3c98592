"""Rate-scope keys: built and read back only by the channel that defines them (a table)."""

from __future__ import annotations

import pytest

from taskcard.bridge.deliver.registry import describe_scope, scope_rules
from taskcard.channels.base import ChatRef
from taskcard.channels.feishu import scopes as feishu
from taskcard.channels.feishu.channel import FeishuChannel
from taskcard.channels.telegram import scopes as telegram
from taskcard.channels.telegram.channel import TelegramChannel

GROUP = ChatRef("-100123")
TOPIC = ChatRef("-100123", "7")
OTHER = ChatRef("-100999")
FEISHU_CHAT = ChatRef("oc_abc")


@pytest.mark.parametrize(
    ("channel", "scope", "chat", "message_id", "covered"),
    [
        ("telegram", telegram.BOT_SCOPE_KEY, GROUP, None, True),
        ("telegram", telegram.chat_scope_key(GROUP), GROUP, "5", True),
        ("telegram", telegram.chat_scope_key(GROUP), TOPIC, None, True),  # topics share it
        ("telegram", telegram.chat_scope_key(GROUP), OTHER, None, False),
        ("telegram", feishu.APP_SCOPE, GROUP, None, False),  # another channel's key
        ("feishu", feishu.APP_SCOPE, FEISHU_CHAT, None, True),
        ("feishu", feishu.APP_MINUTE_SCOPE, FEISHU_CHAT, None, True),
        ("feishu", feishu.chat_scope("oc_abc"), FEISHU_CHAT, None, True),
        ("feishu", feishu.chat_scope("oc_xyz"), FEISHU_CHAT, None, False),
        ("feishu", feishu.message_scope("om_1"), FEISHU_CHAT, "om_1", True),
        ("feishu", feishu.message_scope("om_1"), FEISHU_CHAT, "om_2", False),
        ("feishu", feishu.message_scope("om_1"), FEISHU_CHAT, None, False),
        ("feishu", telegram.BOT_SCOPE_KEY, FEISHU_CHAT, None, False),
    ],
)
def test_which_routes_a_pause_holds_up(
    channel: str, scope: str, chat: ChatRef, message_id: str | None, covered: bool
) -> None:
    rules = scope_rules(channel)
    assert rules is not None
    assert rules.covers(scope, chat, message_id) is covered
    cls = TelegramChannel if channel == "telegram" else FeishuChannel
    assert cls.scope_covers(scope, chat, message_id) is covered


@pytest.mark.parametrize(
    ("scope", "words"),
    [
        (telegram.BOT_SCOPE_KEY, "every chat of the bot"),
        (telegram.chat_scope_key(GROUP), "chat -100123"),
        (feishu.APP_SCOPE, "every chat of the app"),
        (feishu.APP_MINUTE_SCOPE, "every chat of the app (per-minute limit)"),
        (feishu.chat_scope("oc_abc"), "sends to chat oc_abc"),
        (feishu.message_scope("om_1"), "updates of message om_1"),
        ("something:else", "an unknown scope"),
    ],
)
def test_a_scope_is_described_by_its_own_channel(scope: str, words: str) -> None:
    assert describe_scope(scope) == words


def test_the_console_has_no_scopes() -> None:
    assert scope_rules("console") is None
