"""Platform errors, translated once at each channel's edge.

Nothing upstream of a channel matches error strings or codes; it sees only this tree::

    ChannelError
    ├── RateLimited(retry_after_s, scope)   the platform asked us to wait; pause `scope`
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


class ChannelError(Exception):
    """Base of every error a channel raises. The message never contains a secret."""


class RateLimited(ChannelError):
    """Wait `retry_after_s` before sending anything in `scope` (a key from `rate_scopes`)."""

    def __init__(self, retry_after_s: float, scope: str, detail: str = "rate limited") -> None:
        super().__init__(f"{detail}; retry after {retry_after_s:g}s (scope {scope})")
        self.retry_after_s = retry_after_s
        self.scope = scope


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
