"""The cluster's kept command replies against a real Redis: a reply this instance sent is
never sent again, even when Redis did not take its removal."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from taskcard.bridge.cluster.replies import ClusterReplies


@pytest.fixture
async def aio(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


class _DeafToDeletes(redis.Redis):
    """A client whose HDEL never reaches Redis, as during a network cut."""

    def hdel(self, name: str, *keys: str) -> int:  # type: ignore[override]
        raise RedisConnectionError("cut")


async def test_a_sent_reply_whose_removal_redis_missed_is_not_sent_again(
    aio: Redis, redis_url: str
) -> None:
    prefix = f"t-{uuid.uuid4().hex}"
    sync = _DeafToDeletes.from_url(redis_url, decode_responses=True)
    replies = ClusterReplies(sync, aio, prefix, "i0#1", lease_ttl_s=1.0)
    entry = {"channel": "telegram", "chat_id": "5", "thread_id": None, "text": "done"}
    replies.keep("reply:1", entry)
    replies.forget("reply:1")  # sent; its removal is lost
    assert await aio.hexists(f"{prefix}:replies", "reply:1"), "still kept in Redis"
    assert await replies.take(["telegram"]) == {}, "taken back, it would be sent twice"
    assert not await aio.hexists(f"{prefix}:replies", "reply:1"), "removed at the next take"
    # A stop hands over only what is unsent: a sent reply kept by a missed removal is not.
    replies.keep("reply:2", entry)
    replies.forget("reply:2")
    await replies.release()
    assert not await aio.hexists(f"{prefix}:replies", "reply:2")
    sync.close()
