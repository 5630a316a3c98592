"""Leases against a real Redis: one holder at a time, renewal keeps it, expiry hands it over
with a new fencing token, and a holder that lost its lease cannot move the update offset."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from taskcard.bridge.cluster.lease import (
    HOLD_BATCH,
    FencedCursors,
    Lease,
    LeaseLost,
    PollLease,
    hold_all,
    release_all,
)
from taskcard.bridge.store.redis import RedisStore, connect


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    redis = Redis.from_url(redis_url, decode_responses=True)
    yield redis
    await redis.aclose()


async def test_one_holder_then_takeover_with_a_new_fence(client: Redis, redis_url: str) -> None:
    key = f"t-{uuid.uuid4().hex}:lease:poll:telegram"
    first, second = Lease(client, key, "a#1", 1.0), Lease(client, key, "b#2", 1.0)
    assert await first.hold() and not await second.hold()
    assert await first.hold(), "renewed by its holder"
    old_token = first.token
    store = RedisStore(connect(redis_url), f"t-{uuid.uuid4().hex}")
    cursors = FencedCursors(store, store.client, store.key("cursors"), "offset", first)
    cursors.set_cursor("offset", "10")
    cursors.set_cursor("other", "x")  # not fenced
    cursors.delete_cursors(["other", "offset"])  # the fenced offset is never deleted here
    assert (store.get_cursor("other"), store.get_cursor("offset")) == (None, "10")
    await asyncio.sleep(1.2)  # the holder stops renewing (it died, or paused)
    assert await second.hold() and second.token != old_token
    with pytest.raises(LeaseLost):
        cursors.set_cursor("offset", "11")
    assert store.get_cursor("offset") == "10", "the stale holder did not move the offset"
    assert not await first.hold(), "the old holder learns it lost"
    assert first.token is None
    gate = PollLease(second)
    assert await gate.wait_turn() is True, "a new turn: re-read the offset"
    assert await gate.wait_turn() is False
    await second.release()
    assert await first.hold(), "a released lease is free at once"
    store.close()


async def test_many_leases_are_renewed_in_batches_with_each_outcome_kept(
    client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An instance's agent leases are acquired and renewed `HOLD_BATCH` per round trip (not
    one per agent); a lease another owner holds stays theirs, and a lease that lapsed in
    Redis is taken again with a new fence."""
    prefix = f"t-{uuid.uuid4().hex}:lease:agent"
    count = 2 * HOLD_BATCH + 5
    theirs = Lease(client, f"{prefix}:a0007", "other#9", 30.0)
    assert await theirs.hold()
    mine = [Lease(client, f"{prefix}:a{index:04d}", "me#1", 30.0) for index in range(count)]
    # Script calls made by this process (each one round trip), counted at the client.
    script_type = type(mine[0]._hold)
    real_call = script_type.__call__
    calls: list[int] = []

    async def counted(self: Any, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        calls.append(len(keys or ()) // 2)
        return await real_call(self, keys=keys, args=args, client=client)

    monkeypatch.setattr(script_type, "__call__", counted)
    await hold_all(mine)
    assert calls == [HOLD_BATCH, HOLD_BATCH, 5], "three calls for the whole fleet"
    assert [lease.held for lease in mine].count(False) == 1
    assert not mine[7].held and theirs.held
    tokens = [lease.token for lease in mine]
    await client.delete(mine[3].key)  # lapsed in Redis (an expiry while paused)
    calls.clear()
    await hold_all(mine)
    assert calls == [HOLD_BATCH, HOLD_BATCH, 5]
    assert [lease.token for lease in mine][4:] == tokens[4:], "renewed, same tokens"
    assert mine[3].held and mine[3].token != tokens[3], "taken again with a new fence"
    assert not mine[7].held
    await release_all(client, [*mine, theirs])
