"""The chats' board lines shared through a real Redis (`SharedBoards`): when the board's
sender is told to compose a board again. Each announcement on the boards' channel makes the
sender compose that board (read every line and every agent's lease, render, submit), so the
test counts announcements."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from taskcard.bridge.cluster.boards import UNOBSERVED_KEEP_S, SharedBoards
from taskcard.bridge.store.redis import connect

SCOPE = "telegram:-100:"
LINE = {"agent_id": "builder", "headline": "compiling"}
END = "end of the test's messages"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    sync = connect(redis_url)
    yield sync
    sync.close()


def announced(client: redis.Redis, pubsub: Any, channel: str) -> list[str]:
    """The chats announced on `channel` since the last call: Redis delivers in order, so a
    message of our own closes the list (no wait for messages that may never come)."""
    client.publish(channel, END)
    scopes = []
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "the closing message never came"
        # None also for a subscription's confirmation (ignored): read on.
        message = pubsub.get_message(timeout=1.0)
        if message is None or message["type"] != "message":
            continue
        if message["data"] == END:
            return scopes
        scopes.append(message["data"])


async def test_a_board_with_a_dead_instances_line_is_composed_again_only_when_that_line_changes(
    client: redis.Redis, redis_url: str
) -> None:
    """The sender composed the board with a line of a dead instance (not observed). It was
    told to compose it again at every lease renewal, though the board showed the same; now
    only when the line would show otherwise: its writer holds the agent's lease again, or
    its day on the board is over."""
    prefix = f"t-{uuid.uuid4().hex}"
    aio = AsyncRedis.from_url(redis_url, decode_responses=True)
    writer = SharedBoards(aio, prefix, "i0#aaaa")
    sender = SharedBoards(aio, prefix, "i1#bbbb")
    lease = f"{prefix}:lease:agent:builder"
    client.set(lease, "i0#aaaa|1")
    await writer.share(SCOPE, {"builder": LINE})
    assert await sender.lines(SCOPE) == {"builder": (LINE, True)}
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(sender.channel)
    client.delete(lease)  # the writer died: its lease lapsed
    assert await sender.lines(SCOPE, now=1000.0) == {"builder": (LINE, False)}
    for renewal in range(3):
        await sender.retry(now=1010.0 + renewal)
    assert announced(client, pubsub, sender.channel) == [], "nothing changed"
    client.set(lease, "i0#aaaa|2")  # the writer is back, its line unchanged (not rewritten)
    await sender.retry(now=1020.0)
    await sender.retry(now=1021.0)
    assert announced(client, pubsub, sender.channel) == [SCOPE], "once, until composed"
    assert await sender.lines(SCOPE, now=1030.0) == {"builder": (LINE, True)}
    await sender.retry(now=1040.0)
    assert announced(client, pubsub, sender.channel) == []
    client.delete(lease)
    assert await sender.lines(SCOPE, now=2000.0) == {"builder": (LINE, False)}
    await sender.retry(now=2000.0 + UNOBSERVED_KEEP_S - 1)
    assert announced(client, pubsub, sender.channel) == []
    await sender.retry(now=2000.0 + UNOBSERVED_KEEP_S)
    assert announced(client, pubsub, sender.channel) == [SCOPE], "its day is over"
    assert await sender.lines(SCOPE, now=2000.0 + UNOBSERVED_KEEP_S) == {}
    pubsub.close()
    await aio.aclose()
