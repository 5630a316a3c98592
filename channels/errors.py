"""Platform errors, translated once at each channel's edge.

Nothing upstream of a channel matches error strings or codes; it sees only this tree::

    ChannelError
    ├── RateLimited(retry_after_s, scope)   the platform asked us to wait; pause `scope`
    │   └── AppUnavailable(reason)          the platform refuses the whole app for now (a
    │                                       setting of its console): hold it, with a backoff
    ├── NotModified                         the chat already shows these bytes: success
    ├── MessageGone                         deleted, recalled, too old or not editable:
    │                                       send one replacement and persist its id
    ├── Forbidden(reason)                   blocked, kicked, no permission: disable the route
    ├── Transient                           network error, timeout, 5xx: retry with backoff
    │   └── OutcomeUnknown                  the request went out, no answer came back: it
    │                                       may have taken effect (a send may have posted)
    └── Permanent                           a request the platform will never accept
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from urllib.parse import quote

# A platform's wait hint above this is not a wait but a fault (a 429 once asked for 1e9 s);
# the service then applies its own, configurable cap below it.
RETRY_AFTER_CEILING_S = 86_400.0
DEFAULT_RETRY_AFTER_S = 1.0


def secrets_pattern(
    secrets: Iterable[str | None], *, json_escaped: bool = False
) -> re.Pattern[str] | None:
    """One pattern for every spelling of each secret (4 characters or more; a shorter value
    would match ordinary text), in any case: as given, URL-encoded and, with `json_escaped`,
    as a JSON string holds it. A platform's answer may quote the request it refuses (a URL
    with the bot token, an `Authorization` header), and a client library may change its
    case. None when there is nothing to look for."""
    spellings: set[str] = set()
    for secret in secrets:
        if secret and len(secret) >= 4:
            spellings |= {secret, quote(secret, safe="")}
            if json_escaped:
                spellings.add(json.dumps(secret)[1:-1])
    if not spellings:
        return None
    ordered = sorted(spellings, key=len, reverse=True)  # the longest spelling wins
    return re.compile("|".join(map(re.escape, ordered)), re.IGNORECASE)


def without_secrets(text: str, secrets: Iterable[str | None], marker: str = "<secret>") -> str:
    """`text` with every spelling of each secret (`secrets_pattern`) replaced by `marker`."""
    pattern = secrets_pattern(secrets)
    return text if pattern is None else pattern.sub(marker, text)


def sane_retry_after_s(value: object, default_s: float = DEFAULT_RETRY_AFTER_S) -> float:
    """A usable wait from a platform's retry hint, whatever it sent.

    A hint that is not a number, negative or NaN says "wait" without saying how long: the
    default. One that is huge or infinite is bounded by `RETRY_AFTER_CEILING_S`, so no
    header or body can pause a chat for years.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return default_s
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        return default_s
    if math.isnan(seconds) or seconds < 0:
        return default_s
    return min(seconds, RETRY_AFTER_CEILING_S)


class ChannelError(Exception):
    """Base of every error a channel raises. The message never contains a secret."""


class RateLimited(ChannelError):
    """Wait `retry_after_s` before sending anything in `scope` (a key from `rate_scopes`)."""

    def __init__(self, retry_after_s: float, scope: str, detail: str = "rate limited") -> None:
        super().__init__(f"{detail}; retry after {retry_after_s:g}s (scope {scope})")
        self.retry_after_s = retry_after_s
        self.scope = scope


class AppUnavailable(RateLimited):
    """The platform refuses every request of the app, for a cause its operator fixes in the
    platform's console (the bot ability off, this host's address not allowed, the app
    disabled): not this card's or this chat's fault. Like a rate limit it pauses `scope`
    (the app's) for `retry_after_s`, a wait the channel grows while the cause lasts, so every
    route is held, nothing is refused for good, and all go on by themselves once the app
    works again. `reason` names the cause and the fix, for the log and `taskcard status`."""

    def __init__(self, retry_after_s: float, scope: str, reason: str) -> None:
        super().__init__(retry_after_s, scope, reason)
        self.reason = reason


class NotModified(ChannelError):
    """The message already shows exactly this content."""


class MessageGone(ChannelError):
    """The message can no longer be edited (deleted, recalled, too old, foreign)."""


class Forbidden(ChannelError):
    """The bot may not post to this chat any more (blocked, kicked, no permission)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Transient(ChannelError):
    """A failure that may succeed later: network errors, timeouts, server errors."""


class OutcomeUnknown(Transient):
    """The request was written but no answer arrived (a read timeout, a connection dropped
    before the answer): the platform may have performed it. Harmless for an edit; for a send
    on a platform that cannot deduplicate, a retry may post a second copy."""


class Permanent(ChannelError):
    """A request the platform rejects for good (bad chat id, malformed request, too long)."""


class CredentialsRejected(Permanent):
    """The platform no longer accepts the channel's credentials (a revoked bot token):
    nothing the channel sends can succeed until they are replaced and the service restarted."""
