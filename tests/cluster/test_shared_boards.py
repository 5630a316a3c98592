"""The cluster's shared board lines against a real Redis that is slow to answer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
from redis.asyncio import Redis

from taskcard.bridge.cluster.boards import SharedBoards

SCOPE = "telegram:-100123:"


@pytest.fixture
async def aio(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_a_paused_redis_holds_the_board_calls_but_not_the_event_loop(
    redis_url: str, aio: Redis
) -> None:
    """`SharedBoards` called Redis with the synchronous client on the event loop: while
    Redis was slow to answer (a failover, a paused client), the whole service stood still,
    every chat's lane, the watcher, the stop signal. Now the calls wait for Redis while the
    loop goes on; once Redis answers they do what they did before."""
    prefix = f"boards-{uuid.uuid4().hex[:8]}"
    boards = SharedBoards(aio, prefix, "one")
    await aio.set(f"{prefix}:lease:agent:builder", "one|1")  # this instance serves it
    await aio.ping()  # the connection is made before Redis pauses
    admin = redis.Redis.from_url(redis_url)
    try:
        admin.execute_command("CLIENT", "PAUSE", 3000, "ALL")
        sharing = asyncio.create_task(boards.share(SCOPE, {"builder": {"headline": "compile"}}))
        reading = asyncio.create_task(boards.lines(SCOPE))
        announcing = asyncio.create_task(boards.every_board_changed())
        # Other work runs on the loop meanwhile: Redis answers nobody for 3 s, so the calls
        # cannot be done unless they held the loop all that time.
        ran = asyncio.Event()
        asyncio.get_running_loop().call_soon(ran.set)
        await asyncio.wait_for(ran.wait(), timeout=60)
        assert not (sharing.done() or reading.done() or announcing.done())
        await asyncio.wait_for(asyncio.gather(sharing, reading, announcing), timeout=60)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
    assert await boards.lines(SCOPE) == {"builder": ({"headline": "compile"}, True)}
    await boards.share(SCOPE, {})  # it no longer serves the agent there: its line goes
    assert await boards.lines(SCOPE) == {}
    assert await aio.hlen(f"{prefix}:board:{SCOPE}") == 0


async def test_lines_another_writer_left_unreadable_leave_only_their_agents_out(
    redis_url: str, aio: Redis
) -> None:
    """A chat's hash holds, beside a line this instance shared, values nested past what the
    parser takes and bytes not UTF-8 (field or value): the first raised a RecursionError and
    the second a UnicodeDecodeError out of `lines`, so the chat's board was never composed.
    Now those agents are left out and the board has the others."""
    prefix = f"boards-{uuid.uuid4().hex[:8]}"
    boards = SharedBoards(aio, prefix, "one")
    await aio.set(f"{prefix}:lease:agent:builder", "one|1")
    await boards.share(SCOPE, {"builder": {"headline": "compile"}})
    raw = redis.Redis.from_url(redis_url)
    try:
        key = f"{prefix}:board:{SCOPE}"
        raw.hset(key, "deep", b'{"writer": "two", "line": ' + b"[" * 200_000)
        raw.hset(key, "deeper", b"[" * 200_000)
        raw.hset(key, "bytes", b'{"writer": "two", "line": {"headline": "\xff"}}')
        raw.hset(key, b"\xfe", b'{"writer": "two", "line": {}}')
    finally:
        raw.close()
    assert await boards.lines(SCOPE) == {"builder": ({"headline": "compile"}, True)}


async def test_an_answer_peeks_only_at_lines_whose_writer_still_observes_the_agent(
    aio: Redis,
) -> None:
    """`/taskcard` lists another instance's agents with the state their shared lines give.
    A line whose writer lost the agent's lease (its instance died) gave that dead instance's
    last state as the agent's now, for up to a day; it is left out of the answer (the agent
    is then named alone), and comes back once an instance observes the agent again."""
    prefix = f"boards-{uuid.uuid4().hex[:8]}"
    one, two = SharedBoards(aio, prefix, "one"), SharedBoards(aio, prefix, "two")
    await aio.set(f"{prefix}:lease:agent:builder", "one|1")
    await aio.set(f"{prefix}:lease:agent:tester", "two|1")
    await one.share(SCOPE, {"builder": {"headline": "compile"}})
    await two.share(SCOPE, {"tester": {"headline": "tests"}})
    assert await one.peek(SCOPE) == {
        "builder": {"headline": "compile"},
        "tester": {"headline": "tests"},
    }
    await aio.delete(f"{prefix}:lease:agent:tester")  # instance two died
    assert await one.peek(SCOPE) == {"builder": {"headline": "compile"}}
    await aio.set(f"{prefix}:lease:agent:tester", "three|1")  # another took it, not written yet
    assert await one.peek(SCOPE) == {"builder": {"headline": "compile"}}
