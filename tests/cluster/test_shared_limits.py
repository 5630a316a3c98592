"""The shared limiter against a real Redis: three limiters (three instances) racing for one
chat's window never admit more than the limit in any window, and a 429 pause taken by one
pauses the scope for all, bounded by the cap, and holds every instance's pins there too."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from taskcard.bridge.cluster.limiter import RedisLimiter
from taskcard.bridge.schedule.ratelimit import Admission
from taskcard.bridge.schedule.scheduler import RouteKey, RouteScheduler
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.channels.base import ChatRef, RateScope
from taskcard.channels.errors import RateLimited
from tests.bridge.test_scheduler import BotWidePinChannel, settle, text


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    redis = Redis.from_url(redis_url, decode_responses=True)
    yield redis
    await redis.aclose()


def limiters(client: Redis, count: int, max_pause_s: float = 3600) -> list[RedisLimiter]:
    prefix = f"t-{uuid.uuid4().hex}"
    return [RedisLimiter(client, prefix, f"i{n}", max_pause_s=max_pause_s) for n in range(count)]


async def test_racing_instances_never_exceed_the_window(client: Redis) -> None:
    scope = RateScope("telegram:chat:-1", max_calls=5, period_s=1.0)
    bot = RateScope("telegram:bot", max_calls=30, period_s=1.0)
    ends: list[float] = []

    async def worker(limiter: RedisLimiter) -> None:
        for _ in range(5):
            while True:
                got = await limiter.acquire((scope, bot))
                if isinstance(got, Admission):
                    break
                assert 0 < got <= 1.0
                await asyncio.sleep(got)
            await asyncio.sleep(0.01)  # the request in flight
            ends.append(time.monotonic())
            got.complete()

    shared = limiters(client, 3)
    await asyncio.wait_for(asyncio.gather(*(worker(limiter) for limiter in shared)), 60)
    for limiter in shared:
        await limiter.close()
    assert len(ends) == 15
    ends.sort()
    # Completion times: any 5 + 1 consecutive ones span at least the period (less a clock
    # tick: Redis stamps in milliseconds).
    for first, sixth in zip(ends, ends[5:], strict=False):
        assert sixth - first >= 1.0 - 0.01, (first, sixth)


async def test_a_pause_seen_by_one_instance_pauses_every_instance(client: Redis) -> None:
    one, other = limiters(client, 2, max_pause_s=2.0)
    scope = RateScope("telegram:chat:-2", max_calls=100, period_s=1.0)
    assert one.pause("telegram:chat:-2", 1e9) == 2.0, "capped"
    await one.close()
    waited = await other.acquire((scope,))
    assert isinstance(waited, float) and 1.0 < waited <= 2.0
    unrelated = await other.acquire((RateScope("telegram:chat:-3", 100, 1.0),))
    assert isinstance(unrelated, Admission)
    unrelated.complete()
    await other.close()


async def test_a_round_is_judged_as_at_its_start_as_in_memory(client: Redis) -> None:
    """The shared limiter ignored `as_of`: room that freed during a dispatcher's round went to
    whichever waiter was asked next, where the in-memory limiter keeps it for the next round."""
    [limiter] = limiters(client, 1)
    scope = RateScope("telegram:chat:-4", max_calls=1, period_s=0.2)
    round_began = time.monotonic()
    first = await limiter.acquire((scope,))
    assert isinstance(first, Admission)
    first.complete()
    # Until the slot has left the window as of now (waiting on the clock, not timing it).
    while (free := await limiter.acquire((scope,), as_of=round_began)) != 0.0:
        assert isinstance(free, float), "admitted as of the round's start, when it was full"
        await asyncio.sleep(free)
    later = await limiter.acquire((scope,))  # the next round finds the room
    assert isinstance(later, Admission)
    later.complete()
    await limiter.close()


async def test_paused_s_answers_for_a_pause_any_instance_drew(client: Redis) -> None:
    one, other = limiters(client, 2)
    assert await other.paused_s(["telegram:chat:-5", "telegram:bot"]) == 0.0
    one.pause("telegram:chat:-5", 30)
    assert 25 < await one.paused_s(["telegram:chat:-5"]) <= 30, "known at once where drawn"
    await one.close()  # its write has landed
    left = await other.paused_s(["telegram:bot", "telegram:chat:-5"])
    assert 25 < left <= 30
    assert await other.paused_s([]) == 0.0
    await other.close()


async def test_a_request_right_after_a_429_waits_for_the_pause_still_on_its_way(
    client: Redis,
) -> None:
    """The pause goes to Redis in the background. A request the same instance asked for at
    once (a lane's next step, with no turn of the loop between) reached the script before the
    pause did and was admitted: the chat's next message went out inside the window the
    platform had just asked for, and drew another 429."""
    [limiter] = limiters(client, 1)
    scope = RateScope("telegram:chat:-6", max_calls=100, period_s=1.0)
    assert limiter.pause(scope.key, 5.0) == 5.0
    waited = await limiter.acquire((scope,))
    assert isinstance(waited, float) and 4.0 < waited <= 5.0, waited
    other = await limiter.acquire((RateScope("telegram:chat:-7", 100, 1.0),))
    assert isinstance(other, Admission), "another chat is not held"
    other.complete()
    await limiter.close()


async def test_a_pin_waits_for_a_pause_another_instance_drew(client: Redis, tmp_path: Path) -> None:
    """Two instances share the limits. A 429 on instance A's edit pauses the chat; instance
    B's pin there (its own scopes do not include the chat's) goes only once that pause has
    ended. B knew only the pauses it drew itself, so it pinned inside the window."""
    prefix = f"t-{uuid.uuid4().hex}"
    chat = RateScope("x", 100, 1.0)
    channel_a, channel_b = BotWidePinChannel(per_chat=chat), BotWidePinChannel(per_chat=chat)
    a, b = RouteKey("fake", ChatRef("5"), "a"), RouteKey("fake", ChatRef("5"), "b")
    stores = [SqliteStore.in_dir(tmp_path / name) for name in ("a", "b")]
    one = RouteScheduler({"fake": channel_a}, stores[0], limiter=RedisLimiter(client, prefix, "a"))
    other = RouteScheduler(
        {"fake": channel_b}, stores[1], limiter=RedisLimiter(client, prefix, "b")
    )
    one.add_route(a)
    other.add_route(b)
    await one.start()
    await other.start()
    one.submit(a, text("a1"))
    other.submit(b, text("b1"))
    await settle(one)
    await settle(other)
    channel_a.errors["edit"].append(RateLimited(3.0, "fake:chat:5"))
    one.submit(a, text("a2"))
    pause = f"{prefix}:pause:fake:chat:5"
    deadline = time.monotonic() + 30
    while True:
        asked_at = time.monotonic()  # the pause ends no sooner than this plus what is left
        left_ms = await client.pttl(pause)
        if left_ms > 0:
            break
        assert time.monotonic() < deadline, "the pause never reached Redis"
        await asyncio.sleep(0.01)
    ends_at = asked_at + left_ms / 1000
    other.set_pin(b, True)
    deadline = time.monotonic() + 30
    while not [op for _, op, _, _ in channel_b.calls if op == "pin"]:
        assert time.monotonic() < deadline, "the pin never went"
        await asyncio.sleep(0.01)
    await settle(one)
    for scheduler in (one, other):
        await scheduler.stop()
    for store in stores:
        store.close()
    [pinned_at] = [at for at, op, _, _ in channel_b.calls if op == "pin"]
    assert pinned_at >= ends_at - 0.01, "pinned inside the window another instance drew"
