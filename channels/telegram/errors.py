"""The one place where python-telegram-bot exceptions become `channels.errors` types.

Order matters: PTB's `BadRequest` and `TimedOut` both subclass `NetworkError`, so the
specific classes are matched before the generic network case, and a bad request is never
mistaken for something worth retrying. Messages carry Telegram's description, which never
contains the token (it is only in the URL, which PTB does not echo).
"""

from __future__ import annotations

from telegram import error as tg

from taskcard.channels.errors import (
    ChannelError,
    CredentialsRejected,
    Forbidden,
    MessageGone,
    NotModified,
    OutcomeUnknown,
    Permanent,
    RateLimited,
    Transient,
    sane_retry_after_s,
)
from taskcard.channels.telegram.request import AnswerLost, FloodWait


class ParseEntitiesFailed(Permanent):
    """Telegram rejected our entities (or their total size); the channel retries once as
    plain text."""


class ChatUpgraded(MessageGone):
    """The basic group was upgraded to a supergroup with `new_chat_id`; Telegram refuses the
    old id for good. What the old group shows stays there, read-only, so its messages count
    as gone; the channel sends on to the new id (`channels.telegram.moves`)."""

    def __init__(self, new_chat_id: int | str) -> None:
        super().__init__(f"the group was upgraded to a supergroup (chat id {new_chat_id})")
        self.new_chat_id = str(new_chat_id)


class ChatGone(Forbidden):
    """The bot is out of the chat: removed from it, blocked, the chat deleted or unknown to
    Telegram. Like any `Forbidden` the route is disabled; what the channel kept of the chat
    (its forum topics' names, `channels.telegram.topics`) is dropped with it."""


class ThreadNotFound(Forbidden):
    """The forum topic of the route was deleted: like a kick, nothing can be posted there
    any more, so the route is disabled with this reason instead of failing on every change."""

    def __init__(self, description: str = "") -> None:
        super().__init__("the forum topic was deleted (message thread not found)")
        self.description = description


_GONE_MARKERS = (
    "message to edit not found",
    "message can't be edited",
    "message_id_invalid",
    "message to delete not found",
    "message to pin not found",
)
# Telegram refused the entities, not the text: the message goes again as plain text. Their
# total size is bounded too (ENTITIES_TOO_LONG, links' addresses included), past which every
# edit of the card would be refused for as long as its body stays.
# A link's address Telegram finds invalid ("entity URL '...' is invalid: URL host is empty",
# formerly "Wrong message entity: Wrong URL host") is refused the same way.
_ENTITIES_REFUSED = (
    "can't parse entities",
    "can't find end of",
    "entities_too_long",
    "entity url",
    "wrong message entity",
)
_FORBIDDEN_REASONS = (
    ("blocked", "bot was blocked by the user"),
    ("kicked", "bot was kicked from the chat"),
    ("deactivated", "the user is deactivated"),
    ("not a member", "bot is not a member of the chat"),
    # Telegram's words for a basic group upgraded, or deleted, without a new id to go to.
    ("chat was deleted", "the chat was deleted"),
    ("can't initiate", "bot can't initiate a conversation with the user"),
    ("not enough rights", "bot lacks the rights for this action"),
)
# The 403s by which the bot is out of the chat (`ChatGone`), not merely short of a right.
_OUT_OF_CHAT = ("blocked", "kicked", "deactivated", "not a member", "chat was deleted")


# Bad requests by which Telegram says the bot cannot post to the chat (or topic) at all, like
# a 403: the route is disabled with the reason instead of failing on every change. A chat
# not found is out of the bot's reach for good (`ChatGone`).
_CHAT_NOT_FOUND = (
    "chat not found",
    "chat not found: the bot is not in this chat, or the chat id is wrong",
)
_UNREACHABLE = (
    ("topic_closed", "the forum topic is closed"),
    ("rights to send", "bot lacks the rights to post in the chat"),
    ("chat_write_forbidden", "bot lacks the rights to post in the chat"),
    # A channel whose administrators the bot is not among (or lost "Post Messages"): only
    # they post there.
    ("need administrator rights", "bot lacks the administrator rights to post in the channel"),
)


def forbidden_reason(description: str) -> str:
    """A short, stable reason for a 403, for the operator view and logs."""
    lowered = description.lower()
    for marker, reason in _FORBIDDEN_REASONS:
        if marker in lowered:
            return reason
    return f"forbidden: {description}"


def translate(exc: tg.TelegramError, chat_scope: str) -> ChannelError:
    """The channel error for a PTB exception raised by a request to the chat of `chat_scope`."""
    description = exc.message
    lowered = description.lower()
    if isinstance(exc, FloodWait):
        return RateLimited(exc.retry_after_s, chat_scope, "Telegram flood control")
    if isinstance(exc, tg.RetryAfter):
        # `_retry_after` is always a timedelta; the public property warns about its type.
        wait_s = sane_retry_after_s(exc._retry_after.total_seconds())
        return RateLimited(wait_s, chat_scope, "Telegram flood control")
    if isinstance(exc, tg.InvalidToken):
        # `Bot.initialize` raises its own InvalidToken from the one that holds the answer.
        cause = exc.__cause__
        answered = cause.message if isinstance(cause, tg.TelegramError) else description
        if "not found" in answered.lower():
            # The Bot API's answer for a path it does not serve (PTB raises a 404 as an
            # invalid token): a malformed token, or an address that is not the API's root.
            return CredentialsRejected(
                "Telegram answered Not Found for this bot: the token is malformed, or"
                " telegram.api_base_url is not the Bot API root (e.g. https://api.telegram.org,"
                " or a local Bot API server's address, without /bot)"
            )
        return CredentialsRejected("Telegram rejected the bot token (invalid or revoked)")
    if isinstance(exc, tg.Forbidden):
        if any(marker in lowered for marker in _OUT_OF_CHAT):
            return ChatGone(forbidden_reason(description))
        return Forbidden(forbidden_reason(description))
    if isinstance(exc, tg.ChatMigrated):
        return ChatUpgraded(exc.new_chat_id)
    if isinstance(exc, tg.BadRequest):
        return _translate_bad_request(description, lowered)
    if isinstance(exc, tg.Conflict):
        return Permanent(f"conflict: {description}")
    if isinstance(exc, AnswerLost):
        return OutcomeUnknown(f"Telegram may have performed the request: {description}")
    if isinstance(exc, tg.TimedOut | tg.NetworkError):
        return Transient(f"Telegram unreachable or failing: {description}")
    return Permanent(f"Telegram error: {description}")


def _translate_bad_request(description: str, lowered: str) -> ChannelError:
    if "message is not modified" in lowered:
        return NotModified(description)
    if any(marker in lowered for marker in _GONE_MARKERS):
        return MessageGone(description)
    if any(marker in lowered for marker in _ENTITIES_REFUSED):
        return ParseEntitiesFailed(description)
    if "message thread not found" in lowered or "topic_deleted" in lowered:
        return ThreadNotFound(description)
    if _CHAT_NOT_FOUND[0] in lowered:
        return ChatGone(_CHAT_NOT_FOUND[1])
    for marker, reason in _UNREACHABLE:
        if marker in lowered:
            return Forbidden(reason)
    return Permanent(description)
