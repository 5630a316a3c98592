"""Route identities: which resident message, in which chat, for which agent.

Kept apart from the scheduler so that the notice outbox (which addresses notices to routes)
and the scheduler (which delivers them) share the identity without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from taskcard.channels.base import ChatRef


@dataclass(frozen=True)
class RouteKey:
    """Identity of one resident message: channel, chat (and thread), agent."""

    channel: str
    chat: ChatRef
    agent_id: str

    def __post_init__(self) -> None:
        # Worked out once: a route's key is looked up in dicts and sets many times per card
        # change, and the generated hash hashed the chat's own fields again each time. The
        # same value as the generated one (the hash of the fields in order).
        object.__setattr__(self, "_hash", hash((self.channel, self.chat, self.agent_id)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]

    def __str__(self) -> str:
        return self.store_key

    @property
    def store_key(self) -> str:
        """The route's key in the state store (stable across releases: stored rows use it)."""
        return f"{self.channel}:{self.chat.chat_id}:{self.chat.thread_id or ''}:{self.agent_id}"

    @property
    def lane(self) -> LaneKey:
        """The chat whose limits the route shares (forum topics share their chat's lane)."""
        return LaneKey(self.channel, self.chat.chat_id)

    @property
    def chat_scope(self) -> str:
        """The key of the chat (and thread) the route belongs to, used for preferences."""
        return chat_scope(self.channel, self.chat)


def route_of_store_key(key: str) -> RouteKey | None:
    """The route whose `RouteKey.store_key` is `key` (None: not such a key). The channel's
    name is the part before the first colon and the thread and the agent the last two
    parts, so a chat id with a colon in it reads back whole. Only for routes whose agent part
    holds no colon (an agent's id): others (the inbox desk's `inbox:<id>`) read wrong."""
    head, found_agent, agent_id = key.rpartition(":")
    head, found_thread, thread_id = head.rpartition(":")
    channel, found_chat, chat_id = head.partition(":")
    if not (found_agent and found_thread and found_chat and channel and chat_id and agent_id):
        return None
    return RouteKey(channel, ChatRef(chat_id, thread_id or None), agent_id)


class LaneKey(NamedTuple):
    """One chat of one channel: the unit of pacing (one request at a time). A named pair, so
    that layers that may not import this one (metrics) read it as `(channel, chat_id)`."""

    channel: str
    chat_id: str

    def __str__(self) -> str:
        return f"{self.channel}:{self.chat_id}"


def chat_scope(channel: str, chat: ChatRef) -> str:
    return f"{channel}:{chat.chat_id}:{chat.thread_id or ''}"
