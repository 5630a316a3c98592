"""The kept wake's fields (`bridge.cluster.wakes`): only typed values are acted on."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace

import pytest

from taskcard.bridge.cluster.wakes import RelayedWake, decode_wake, encode_wake
from taskcard.bridge.config import AGENT_ID_PATTERN

WAKE = RelayedWake("worker", "/srv/agents/worker", "report:3", 3, True, "worker reported (#3)")


def fields(**changed: object) -> str:
    data = json.loads(encode_wake(WAKE))
    data.update(changed)
    return json.dumps(data)


def test_a_kept_wake_reads_back_as_written() -> None:
    assert decode_wake(encode_wake(WAKE), AGENT_ID_PATTERN.fullmatch) == WAKE


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1, 2]",
        fields(agent="../lead"),
        fields(agent=7),
        fields(workdir="agents/worker"),
        fields(workdir="/srv/\0/worker"),
        fields(episode=""),
        fields(report_seq="3"),
        fields(report_seq=True),
        fields(report_seq=0),
        fields(report="yes"),
        fields(text=None),
        fields(text="x" * 20_000),
        "[" * 200_000,  # nested past what the parser takes
        fields(text="x" * 1_000, padding=" " * 500_000),  # far longer than its fields
    ],
)
def test_a_member_that_is_not_a_wake_of_this_version_is_not_acted_on(raw: str) -> None:
    assert decode_wake(raw, AGENT_ID_PATTERN.fullmatch) is None


async def test_a_burst_of_kept_wakes_is_taken_a_share_at_each_renewal(redis_url: str) -> None:
    """150 wakes kept for one chat (an agent reporting fast) were all taken at one renewal,
    each an inbox write and state calls in one turn of the serving instance's loop."""
    import redis
    from redis.asyncio import Redis as AsyncRedis

    from taskcard.bridge.cluster.wakes import TAKE_PER_RENEWAL, WakeRelay

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    aio = AsyncRedis.from_url(redis_url, decode_responses=True)
    relay = WakeRelay(client, aio, f"t-{uuid.uuid4().hex}")
    try:
        assert await relay.take(["chat"]) == {}  # the orchestrator is served: wakes are kept
        for seq in range(1, 151):
            relay.keep("chat", replace(WAKE, episode=f"report:{seq}", report_seq=seq))
        taken = (await relay.take(["chat"]))["chat"]
        assert len(taken) == TAKE_PER_RENEWAL < 150
        assert decode_wake(taken[0], AGENT_ID_PATTERN.fullmatch) == replace(
            WAKE, episode="report:1", report_seq=1
        )  # oldest first
        await relay.done({"chat": taken})
        rest = (await relay.take(["chat"]))["chat"]
        assert len(rest) == 150 - TAKE_PER_RENEWAL
        await relay.done({"chat": rest})
        assert await relay.take(["chat"]) == {}
    finally:
        client.close()
        await aio.aclose()


async def test_kept_wakes_not_utf8_are_dropped_and_the_others_taken(redis_url: str) -> None:
    """A member of a chat's wakes that is not UTF-8 (no instance writes one) failed the
    reading of every chat's wakes at each renewal, so no orchestrator was woken. Now it is
    removed, and the chat's other wakes are taken."""
    import redis
    from redis.asyncio import Redis as AsyncRedis

    from taskcard.bridge.cluster.wakes import WakeRelay

    prefix = f"t-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    raw = redis.Redis.from_url(redis_url)
    aio = AsyncRedis.from_url(redis_url, decode_responses=True)
    relay = WakeRelay(client, aio, prefix)
    try:
        assert await relay.take(["chat", "other"]) == {}
        # Kept a moment ago (older than a day would be dropped as stale).
        now = time.time()
        raw.zadd(f"{prefix}:wakes:chat", {b'{"agent": "\xff\xfe"}': now - 2})
        raw.zadd(f"{prefix}:wakes:chat", {b"\xff\xfe": now - 1})
        relay.keep("chat", WAKE)
        relay.keep("other", WAKE)
        taken = await relay.take(["chat", "other"])
        assert taken == {"chat": [encode_wake(WAKE)], "other": [encode_wake(WAKE)]}
        assert raw.zcard(f"{prefix}:wakes:chat") == 1
    finally:
        client.close()
        raw.close()
        await aio.aclose()


async def test_a_chatty_reporter_drops_only_its_own_oldest_reports(redis_url: str) -> None:
    """While the chat's orchestrator is not taken (its instance stopped), one agent reports
    more than a thousand times: the cap was the chat's 1,000 wakes, the oldest dropped
    whatever they were, so another agent's exit wake and report were pushed out. Now each
    agent keeps its own newest reports and, apart, its other signals: only the chatty agent's
    oldest reports go, and another agent's many idle signals are capped on their own."""
    import redis
    from redis.asyncio import Redis as AsyncRedis

    from taskcard.bridge.cluster.wakes import (
        MAX_REPORTS_PER_AGENT,
        MAX_SIGNALS_PER_AGENT,
        TAKE_PER_RENEWAL,
        WakeRelay,
    )

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    aio = AsyncRedis.from_url(redis_url, decode_responses=True)
    relay = WakeRelay(client, aio, f"t-{uuid.uuid4().hex}")
    exited = RelayedWake("other", "/srv/agents/other", "signal:exited:1", None, False, "exited")
    other_report = replace(WAKE, agent_id="other", workdir="/srv/agents/other")
    try:
        assert await relay.take(["chat"]) == {}  # served once: the chat keeps wakes
        relay.keep("chat", exited)
        relay.keep("chat", other_report)
        chatty = [replace(WAKE, episode=f"report:{seq}", report_seq=seq) for seq in range(1, 1051)]
        for wake in chatty:
            relay.keep("chat", wake)
        idle = [
            replace(exited, agent_id="idler", episode=f"signal:idle:{n}")
            for n in range(MAX_SIGNALS_PER_AGENT + 10)
        ]
        for wake in idle:
            relay.keep("chat", wake)
        kept = [*chatty[-MAX_REPORTS_PER_AGENT:], *idle[-MAX_SIGNALS_PER_AGENT:]]
        expected = [exited, other_report, *kept]
        taken: list[RelayedWake | None] = []
        while found := (await relay.take(["chat"])).get("chat"):
            assert len(found) <= TAKE_PER_RENEWAL
            taken += [decode_wake(member, AGENT_ID_PATTERN.fullmatch) for member in found]
            await relay.done({"chat": found})
        assert taken == expected
        # Taken and done with, then more: the agent's list of the taken ones makes room.
        relay.keep("chat", replace(exited, episode="signal:exited:2"))
        [member] = (await relay.take(["chat"]))["chat"]
        assert decode_wake(member, AGENT_ID_PATTERN.fullmatch) == replace(
            exited, episode="signal:exited:2"
        )
    finally:
        client.close()
        await aio.aclose()


async def test_wakes_taken_leave_their_agents_lists_too(redis_url: str) -> None:
    """A wake taken was removed from the chat's set only: each agent's list of its wakes kept
    the texts of its last 200 reports (up to 16 KiB each) for a day, though every one had been
    taken and woken with. Taken and done with, nothing of them is left in Redis."""
    import redis
    from redis.asyncio import Redis as AsyncRedis

    from taskcard.bridge.cluster.wakes import WakeRelay

    prefix = f"t-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    aio = AsyncRedis.from_url(redis_url, decode_responses=True)
    relay = WakeRelay(client, aio, prefix)
    exited = RelayedWake("other", "/srv/agents/other", "signal:exited:1", None, False, "exited")
    try:
        assert await relay.take(["chat"]) == {}  # served once: the chat keeps wakes
        relay.keep("chat", exited)
        for seq in range(1, 31):
            relay.keep("chat", replace(WAKE, episode=f"report:{seq}", report_seq=seq))
        assert len(client.keys(f"{prefix}:wakes-of:*")) == 2
        while found := (await relay.take(["chat"])).get("chat"):
            await relay.done({"chat": found})
        assert client.keys(f"{prefix}:wakes*") == []
    finally:
        client.close()
        await aio.aclose()


async def test_a_kept_wake_over_its_size_is_dropped_in_redis_unread(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A member of a chat's wakes far past what a wake holds (a writer with the Redis user's
    rights): each of the first wakes was carried to the serving instance whole at each
    renewal, to be refused there. Now the take drops it in Redis, unread, counted in the
    log by the chat's key, and the chat's other wakes are taken."""
    import redis
    from redis.asyncio import Redis as AsyncRedis

    from taskcard.bridge.cluster.wakes import MAX_WAKE_BYTES, WakeRelay

    prefix = f"t-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    aio = AsyncRedis.from_url(redis_url, decode_responses=True)
    relay = WakeRelay(client, aio, prefix)
    try:
        assert await relay.take(["chat"]) == {}  # the chat's orchestrator is served
        client.zadd(f"{prefix}:wakes:chat", {"x" * (MAX_WAKE_BYTES + 1): time.time() - 1})
        relay.keep("chat", WAKE)
        assert await relay.take(["chat"]) == {"chat": [encode_wake(WAKE)]}
        assert client.zcard(f"{prefix}:wakes:chat") == 1
        assert f"1 kept wakes over {MAX_WAKE_BYTES} bytes" in caplog.text
        assert f"{prefix}:wakes:chat" in caplog.text
    finally:
        client.close()
        await aio.aclose()
