"""Telegram's rate scopes: the keys are built here and read back only here.

Telegram limits a bot as a whole and each chat as a whole (forum topics share their chat's
limit). A pause the platform ordered is stored under one of these keys; `taskcard status`
asks `covers` which routes it holds up and `describe` how to say it, so no other module
parses a key. Pure and free of the client library, so `status` loads no platform client.
"""

from __future__ import annotations

from typing import Final

from taskcard.channels.base import ChatRef

BOT_SCOPE_KEY: Final = "telegram:bot"
# The command menu (`setMyCommands`): a 429 answered to it pauses only the menu, no route.
MENU_SCOPE_KEY: Final = "telegram:menu"
_CHAT_PREFIX: Final = "telegram:chat:"


def chat_scope_key(chat: ChatRef) -> str:
    """Telegram limits a chat as a whole, so forum topics share their chat's scope."""
    return _CHAT_PREFIX + chat.chat_id


def covers(scope: str, chat: ChatRef, message_id: str | None) -> bool:
    """Whether a pause of `scope` holds up requests of a route in `chat`."""
    return scope == BOT_SCOPE_KEY or scope == chat_scope_key(chat)


def describe(scope: str) -> str | None:
    """The scope for people; None when it is not one of this channel's keys."""
    if scope == BOT_SCOPE_KEY:
        return "every chat of the bot"
    if scope == MENU_SCOPE_KEY:
        return "the bot's command menu (no chat)"
    if scope.startswith(_CHAT_PREFIX):
        return f"chat {scope.removeprefix(_CHAT_PREFIX)}"
    return None
