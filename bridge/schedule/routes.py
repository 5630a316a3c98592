"""Route identities: which resident message, in which chat, for which agent.

Kept apart from the scheduler so that the notice outbox (which addresses notices to routes)
and the scheduler (which delivers them) share the identity without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from taskcard.channels.base import ChatRef


@dataclass(frozen=True)
class RouteKey:
    """Identity of one resident message: channel, chat (and thread), agent."""

    channel: str
    chat: ChatRef
    agent_id: str
    # Worked out once, in `__post_init__`, from the three fields above (so not compared,
    # shown or passed): each is asked several times per card change, and as properties
    # they built their string or pair again each time.
    store_key: str = field(init=False, repr=False, compare=False)
    """The route's key in the state store (stable across releases: stored rows use it)."""
    lane: LaneKey = field(init=False, repr=False, compare=False)
    """The chat whose limits the route shares (forum topics share their chat's lane)."""
    chat_scope: str = field(init=False, repr=False, compare=False)
    """The key of the chat (and thread) the route belongs to, used for preferences."""

    def __post_init__(self) -> None:
        # Worked out once: a route's key is looked up in dicts and sets many times per card
        # change, and the generated hash hashed the chat's own fields again each time. The
        # same value as the generated one (the hash of the fields in order).
        set_field = object.__setattr__
        chat = self.chat
        set_field(self, "_hash", hash((self.channel, chat, self.agent_id)))
        scope = chat_scope(self.channel, chat)
        set_field(self, "chat_scope", scope)
        set_field(self, "store_key", f"{scope}:{self.agent_id}")
        set_field(self, "lane", LaneKey(self.channel, chat.chat_id))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]

    def __str__(self) -> str:
        return self.store_key


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
