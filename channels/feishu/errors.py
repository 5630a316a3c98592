"""Feishu Open API answers translated into `channels.errors`, once, as a pure function.

Feishu signals errors by a `code` in the JSON body, sometimes with an HTTP error status:
rate limiting is HTTP 429 (on some APIs 400) with code 99991400 and the seconds to wait in
the `x-ogw-ratelimit-reset` header; a message-level throttle is code 230020. The codes we
act on are listed here and nowhere else.

The same answer can mean different things per operation. Feishu answers a PATCH or DELETE
of a message id it does not know (deleted long ago, or never ours) with HTTP 400 and the
generic "invalid request parameter" code 230001 naming `message_id`: for a request about an
existing message (`edit`, `delete`, `pin`) that is `MessageGone`, so the service replaces the
card once; on `send` the same code is a malformed request and stays `Permanent`. Code 231003
("the message is not found, maybe not exist or deleted", documented for the message APIs
that act on an existing message) is read the same way.

Each code below is checked against the error tables of the Open API pages of the calls we
make (send `POST im/v1/messages`, reply, card `PATCH`, `DELETE`, `POST im/v1/pins`) and the
server-side generic error codes page; `docs/operators.md` (Feishu, scopes) says what each
one does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from taskcard.channels.base import Operation
from taskcard.channels.errors import (
    AppUnavailable,
    ChannelError,
    Forbidden,
    MessageGone,
    Permanent,
    RateLimited,
    Transient,
    sane_retry_after_s,
)

INVALID_PARAMETER = 230001
APP_RATE_LIMITED = 99991400
MESSAGE_RATE_LIMITED = 230020
# The message service's own limits as the server error codes page lists them: "create
# message service trigger rate limit" (11232) and "internal send message trigger rate
# limit" (11247) for the app, "create message chat trigger rate limit" (11233) for a chat.
SERVICE_RATE_LIMITED = frozenset({11232, 11247})
CHAT_RATE_LIMITED = 11233
MESSAGE_RECALLED = 230011
MESSAGE_TOO_OLD = 230031
MESSAGE_DELETED = 230110
CONTENT_TOO_LONG = 230025
BOT_NOT_IN_CHAT = 230002
NO_AVAILABILITY = 230013
NO_PERMISSION = 230027
SEND_PERMISSION_DENIED = 230035
# The chat of the message does not exist: it was disbanded (documented for pins).
CHAT_NOT_FOUND = 230045
# "Your request specifies a chat which has already been dissolved": documented for every
# call we make (send, reply, card update, delete, pin) and for the chat APIs.
CHAT_DISSOLVED = 232009
# "The user has stopped the bot from sending messages": the person of a p2p chat turned the
# bot's messages off (documented for sends and forwards).
BOT_STOPPED_BY_USER = 230053
# "The message is not found, maybe not exist or deleted" (a wrong id, or a message recalled):
# documented for the message APIs that act on an existing message (its reactions).
MESSAGE_NOT_FOUND = 231003
SCOPE_MISSING = 99991672
# "The message is being sent" (documented for sends and replies): a send repeated with the
# uuid of one still in progress. Tried again later, the same uuid answers with the message
# once it is posted; refused for good, the card posted meanwhile would be unknown and a
# later send would post a second one.
BEING_SENT = 230049
# The tenant token refused: missing (99991661), invalid (99991663, and 99991665 "Illegal
# tenant access token"), not a token's form (99991671, "must start with t-/u-"), or
# expired (99991668, 99991677), as the server error codes page lists them.
TOKEN_INVALID = frozenset({99991661, 99991663, 99991665, 99991668, 99991671, 99991677})

# Answers by which Feishu refuses the whole app, for a cause its operator fixes in the
# developer console (or the tenant's admin console), with what each means and the fix. Every
# request fails the same way until then: not a card's or a chat's fault, so the app is held
# (`AppUnavailable`, a pause with a growing wait) and goes on by itself once it works again.
APP_UNAVAILABLE: Mapping[int, str] = {
    230006: (
        "the app's bot ability is not turned on; turn on Bot among the app's features in the"
        " Feishu developer console and publish a version"
    ),
    99991401: (
        "Feishu refused this host's IP address (the app's IP allow-list); add the service's"
        " outbound address to the allow-list in the app's security settings in the Feishu"
        " developer console"
    ),
    99991662: (
        "the app is disabled; enable it again (its version in the Feishu developer console,"
        " the tenant's admin console)"
    ),
    99991673: (
        "the app is not available; check its status in the Feishu developer console and in"
        " the tenant's admin console"
    ),
}
# "These operations are not allowed in current group settings": the group's own settings
# forbid the bot's request there (a setting of that group, not of the app).
GROUP_SETTINGS_FORBID = 230018

# Pins (`POST im/v1/pins`): 230047, pinned or unpinned too often (that message; "try again
# later"), is a wait, not a refusal; 230046, only the group's owner and administrators may
# pin there, stays a refusal (the group's setting), which the service says once per chat.
PIN_TOO_OFTEN = 230047
PIN_NOT_ALLOWED = 230046

GONE_CODES = frozenset({MESSAGE_RECALLED, MESSAGE_TOO_OLD, MESSAGE_DELETED})
# Answers by which Feishu says the bot cannot reach the chat at all: the route is disabled
# with the reason (shown by `taskcard status`) instead of failing on every change.
FORBIDDEN_CODES = frozenset(
    {
        BOT_NOT_IN_CHAT,
        NO_AVAILABILITY,
        NO_PERMISSION,
        SEND_PERMISSION_DENIED,
        CHAT_NOT_FOUND,
        CHAT_DISSOLVED,
        BOT_STOPPED_BY_USER,
        SCOPE_MISSING,
        GROUP_SETTINGS_FORBID,
    }
)

# The channel's operations, and Feishu's own: "reply" posts a reply to a chat message.
FeishuOperation = Operation | Literal["reply"]
# Requests about one existing message: an unknown id there means the message is gone (for a
# reply, the message replied to).
MESSAGE_OPERATIONS = frozenset({"edit", "delete", "pin", "reply"})
# How 230001 names the offending parameter: "..., ext=invalid message_id."
_NAMES_MESSAGE_ID = re.compile(r"message[_ ]?id", re.IGNORECASE)

RESET_HEADER = "x-ogw-ratelimit-reset"
DEFAULT_RETRY_AFTER_S = 1.0


def retry_after_s(headers: Mapping[str, str]) -> float:
    """Seconds from `x-ogw-ratelimit-reset` (any header case), else one second.

    The header is untrusted text: a zero, negative, non-numeric or NaN value means one
    second, and a huge or infinite one is bounded (see `sane_retry_after_s`).
    """
    for key, value in headers.items():
        if key.lower() == RESET_HEADER:
            seconds = sane_retry_after_s(value.strip(), DEFAULT_RETRY_AFTER_S)
            return seconds if seconds > 0 else DEFAULT_RETRY_AFTER_S
    return DEFAULT_RETRY_AFTER_S


def answer_code(code: object) -> int | None:
    """The Open API `code` of an answer as an integer, or None when there is none.

    Feishu writes it as a JSON integer; a gateway in between may write it as a string of
    digits ("0") or a number with a fraction part of zero, which mean the same. Anything
    else (a word, true, a fraction) is no code: the answer is not the Open API's."""
    if isinstance(code, bool):
        return None
    if isinstance(code, int):
        return code
    if isinstance(code, float) and code.is_integer():
        return int(code)
    if isinstance(code, str):
        text = code.strip()
        if text.lstrip("-").isascii() and text.lstrip("-").isdigit():
            return int(text)
    return None


def translate(
    *,
    status: int,
    code: int | None,
    msg: str | None,
    headers: Mapping[str, str],
    app_scope: str,
    narrow_scope: str,
    operation: FeishuOperation,
    app_hold_s: float = 30.0,
) -> ChannelError | None:
    """The error for one answer to `operation`, or None when it is a success.

    `app_scope` is the per-app bucket key; `narrow_scope` the message (edit) or chat (send)
    bucket that a 230020 throttle pauses. `app_hold_s`: how long an answer refusing the
    whole app (`APP_UNAVAILABLE`) holds it (the channel grows it while the cause lasts).
    """
    if code == 0 and status < 400:
        return None
    detail = f"feishu: HTTP {status}, code {code}: {msg or 'no message'}"
    if status == 429 or code == APP_RATE_LIMITED or code in SERVICE_RATE_LIMITED:
        return RateLimited(retry_after_s(headers), app_scope, detail)
    if code in (MESSAGE_RATE_LIMITED, CHAT_RATE_LIMITED):
        return RateLimited(retry_after_s(headers), narrow_scope, detail)
    if code is not None and code in APP_UNAVAILABLE:
        reason = f"feishu: {APP_UNAVAILABLE[code]} (code {code}: {msg or 'no message'})"
        return AppUnavailable(app_hold_s, app_scope, reason)
    if code in GONE_CODES:
        return MessageGone(detail)
    if operation in MESSAGE_OPERATIONS and (
        status == 404
        or code == MESSAGE_NOT_FOUND
        or (code == INVALID_PARAMETER and _NAMES_MESSAGE_ID.search(msg or "") is not None)
    ):
        return MessageGone(detail)
    if code == CONTENT_TOO_LONG:
        return Permanent(detail)
    if code == BEING_SENT or (code == PIN_TOO_OFTEN and operation == "pin"):
        return Transient(detail)
    if code in TOKEN_INVALID:
        # The cached tenant token was refused (whatever the HTTP status); the caller drops it
        # and a retry fetches anew. Not a reason to disable the route.
        return Transient(detail)
    if code is None:
        # No Open API answer at all (an empty or cut body, a gateway's page), whatever the
        # status (a proxy's 403 page says nothing about the chat): nothing says the request
        # is wrong, so it is tried again. A send repeated this way is deduplicated by its uuid.
        return Transient(detail)
    if code in FORBIDDEN_CODES or status == 403:
        return Forbidden(detail)
    if status >= 500 or status in (408,):
        return Transient(detail)
    return Permanent(detail)
