"""The kept wake's fields (`bridge.cluster.wakes`): only typed values are acted on."""

from __future__ import annotations

import json
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
