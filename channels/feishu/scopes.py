"""Feishu's rate scopes: the keys are built here and read back only here.

Feishu limits the app (per second and per minute), sends per chat, and updates per message. A
pause the platform ordered is stored under one of these keys; `taskcard status` asks `covers`
which routes it holds up and `describe` how to say it, so no other module parses a key. Pure
and free of the client library, so `status` loads no platform client.
"""

from __future__ import annotations

from typing import Final

from taskcard.channels.base import ChatRef

APP_SCOPE: Final = "feishu:app"
APP_MINUTE_SCOPE: Final = "feishu:app:minute"
_CHAT_PREFIX: Final = "feishu:chat:"
_MESSAGE_PREFIX: Final = "feishu:message:"


def chat_scope(chat_id: str) -> str:
    return _CHAT_PREFIX + chat_id


def message_scope(message_id: str) -> str:
    return _MESSAGE_PREFIX + message_id


def covers(scope: str, chat: ChatRef, message_id: str | None) -> bool:
    """Whether a pause of `scope` holds up requests of a route in `chat` whose resident
    message is `message_id`."""
    if scope in (APP_SCOPE, APP_MINUTE_SCOPE) or scope == chat_scope(chat.chat_id):
        return True
    return message_id is not None and scope == message_scope(message_id)


def describe(scope: str) -> str | None:
    """The scope for people; None when it is not one of this channel's keys."""
    if scope == APP_SCOPE:
        return "every chat of the app"
    if scope == APP_MINUTE_SCOPE:
        return "every chat of the app (per-minute limit)"
    if scope.startswith(_CHAT_PREFIX):
        return f"sends to chat {scope.removeprefix(_CHAT_PREFIX)}"
    if scope.startswith(_MESSAGE_PREFIX):
        return f"updates of message {scope.removeprefix(_MESSAGE_PREFIX)}"
    return None
