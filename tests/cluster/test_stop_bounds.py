"""What could hold a clustered instance on SIGTERM, each shown bounded without a stopwatch.

The state store's calls are synchronous on the event loop: while one retries, nothing else
runs, not even the SIGTERM handler. redis-py retries a command and, inside each attempt, the
connection's handshake, so twelve retries against a Redis that accepts connections but never
answers made 13 x 13 attempts, each waiting its socket timeout: minutes for one call. The retry
now has a time budget; these tests count attempts (on a fake clock, or connections accepted
by a silent server) instead of timing anything. Leases are given up in one round trip, not one
per agent (each of which could wait out a socket timeout). And the command stream's blocking
read is interrupted by `stop`, not waited out.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from taskcard.bridge.cluster.commands import ClusteredChannel
from taskcard.bridge.cluster.lease import Lease, release_all
from taskcard.bridge.store.redis import BudgetRetry, RedisStore, connect
from taskcard.channels.base import CommandSink, IncomingCommand
from tests.bridge.test_outbox import TextOnly


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.parametrize(
    ("attempt_s", "budget_s", "attempts"),
    [
        (0.0, 3.0, 8),  # refused at once: the backoffs alone (0.1, 0.2, 0.4, 0.5...) use it
        (2.0, 3.0, 2),  # no answer: each attempt waits its 2 s socket timeout
        (2.0, 100.0, 13),  # a large budget: the count (12 retries) still bounds it
        (5.0, 3.0, 1),  # one attempt longer than the budget: no second one
    ],
)
def test_a_failing_call_stops_retrying_when_its_budget_is_spent(
    attempt_s: float, budget_s: float, attempts: int
) -> None:
    clock = FakeClock()
    retry = BudgetRetry(12, budget_s=budget_s, clock=clock, sleep=clock.sleep)
    tried: list[float] = []
    failures: list[int] = []

    def attempt() -> str:
        tried.append(clock.now)
        clock.now += attempt_s
        raise RedisTimeoutError("no answer")

    with pytest.raises(RedisTimeoutError):
        retry.call_with_retry(attempt, lambda _error, count: failures.append(count), None, True)
    assert len(tried) == attempts
    assert failures == list(range(1, attempts + 1)), "each failure reported (connection reset)"
    assert tried[-1] < budget_s or attempts == 1, "no attempt started after the budget"


def test_a_call_that_recovers_within_the_budget_returns_its_answer() -> None:
    clock = FakeClock()
    retry = BudgetRetry(12, budget_s=3.0, clock=clock, sleep=clock.sleep)
    answers: Iterator[Exception | str] = iter(
        [RedisConnectionError("restarting"), RedisConnectionError("restarting"), "ok"]
    )

    def attempt() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retry.call_with_retry(attempt, lambda _error: None) == "ok"
    assert clock.sleeps == [0.1, 0.2], "the capped exponential backoff between attempts"


def test_an_error_that_is_not_an_outage_is_not_retried() -> None:
    clock = FakeClock()
    retry = BudgetRetry(12, budget_s=3.0, clock=clock, sleep=clock.sleep)
    calls: list[int] = []

    def attempt() -> str:
        calls.append(1)
        raise redis.ResponseError("WRONGTYPE")

    with pytest.raises(redis.ResponseError):
        retry.call_with_retry(attempt, lambda _error: None)
    assert calls == [1]


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A TCP port that accepts connections and never answers: a hung or partitioned Redis."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(512)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            accepted.append(connection)

    threading.Thread(target=accept, daemon=True).start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0", accepted
    server.close()
    for connection in accepted:
        connection.close()


def test_a_store_call_to_a_redis_that_never_answers_gives_up_after_two_attempts(
    silent_server: tuple[str, list[socket.socket]],
) -> None:
    url, accepted = silent_server
    store = RedisStore(connect(url, timeout_s=0.5, retry_budget_s=0.8), "silent")
    try:
        with pytest.raises(redis.RedisError):
            store.get_cursor("offset")
    finally:
        store.close()
    # 169 connections (every command retry reconnecting with its own handshake retries)
    # before the budget; now the budget ends it after the second.
    assert 1 <= len(accepted) <= 2, len(accepted)


async def test_stop_interrupts_the_blocking_read_of_the_command_stream(redis_url: str) -> None:
    prefix = f"stop-{uuid.uuid4().hex[:8]}"
    client = AsyncRedis.from_url(redis_url, decode_responses=True)
    observer = redis.Redis.from_url(redis_url, decode_responses=True)
    # A read blocking for ten minutes: only an interruption ends it within the test.
    channel = ClusteredChannel(TextOnly(), client, prefix, "i0", frozenset(), read_block_ms=600_000)
    received: list[IncomingCommand] = []

    async def sink(command: IncomingCommand) -> None:
        received.append(command)

    def blocked_reads() -> int:
        clients = observer.client_list()
        return sum(1 for c in clients if c.get("cmd") == "xread" and "b" in c.get("flags", ""))

    on_command: CommandSink = sink
    await channel.start(on_command)
    for _ in range(600):  # the reader reaches its blocking XREAD
        if blocked_reads():
            break
        await asyncio.sleep(0.05)
    assert blocked_reads() == 1, "the reader waits in Redis for commands"
    await channel.stop()
    for _ in range(600):  # Redis notices the closed connection (no answer is awaited)
        if not blocked_reads():
            break
        await asyncio.sleep(0.05)
    assert blocked_reads() == 0, "stop closed the blocked read instead of waiting it out"
    assert await client.ping(), "the shared client still works after the interrupted read"
    await client.aclose()
    observer.close()


async def test_every_lease_is_released_in_one_round_trip(redis_url: str) -> None:
    client = AsyncRedis.from_url(redis_url, decode_responses=True)
    prefix = f"rel-{uuid.uuid4().hex[:8]}"
    mine = [Lease(client, f"{prefix}:lease:agent:a{n}", "i0#1", 30.0) for n in range(5)]
    theirs = [Lease(client, lease.key, "i1#2", 30.0) for lease in mine]
    for lease in mine:
        assert await lease.hold()
    stolen = Lease(client, f"{prefix}:lease:agent:x", "i0#1", 30.0)
    assert await stolen.hold()
    await client.delete(stolen.key)
    other = Lease(client, stolen.key, "i2#3", 30.0)
    assert await other.hold(), "another instance holds it now"
    await release_all(client, [*mine, stolen])
    assert all(lease.token is None for lease in [*mine, stolen])
    for lease in theirs:
        assert await lease.hold(), "free at once, not after the TTL"
    assert await client.get(stolen.key) == other.token, "a lease held by another is left alone"
    await client.aclose()


async def test_releasing_many_leases_to_a_redis_that_never_answers_is_one_attempt(
    silent_server: tuple[str, list[socket.socket]],
) -> None:
    url, accepted = silent_server
    client = AsyncRedis.from_url(url, decode_responses=True, socket_timeout=0.5)
    leases = [Lease(client, f"p:lease:agent:a{n}", "i0#1", 30.0) for n in range(20)]
    for n, lease in enumerate(leases):
        lease.token = f"i0#1|{n}"  # held (acquired before Redis stopped answering)
    await release_all(client, leases)
    assert all(lease.token is None for lease in leases)
    # One connection for twenty leases: one by one, each would have waited out its timeout.
    assert len(accepted) == 1, len(accepted)
    await client.aclose()


class _SwallowingClient:
    """Stands in for the asyncio Redis client where a call swallows the task's cancellation
    (a known fault of redis-py's asyncio client): it returns as if answered instead."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def hset(self, *args: object) -> int:
        if not self.entered.is_set():  # the first call only: then answers at once
            self.entered.set()
            with contextlib.suppress(asyncio.CancelledError):  # the fault: it goes no further
                await asyncio.sleep(3600)
        return 0

    async def pexpire(self, *args: object) -> bool:
        return True


async def test_the_lease_loop_stops_when_a_redis_call_swallowed_its_cancellation(
    redis_url: str,
) -> None:
    """A SIGTERM cancels the lease loop; when the cancel lands in a Redis call that swallows
    it, the loop used to go back to sleep and renew forever, and the instance never exited."""
    from taskcard.bridge.cluster.config import ClusterConfig
    from taskcard.bridge.cluster.runtime import Cluster

    cluster = Cluster(ClusterConfig(key_prefix=f"cancel-{uuid.uuid4().hex[:8]}"), redis_url)
    real, swallowing = cluster.aio, _SwallowingClient()
    cluster.aio = swallowing  # type: ignore[assignment]
    cluster._bots["telegram"] = "bot"
    task = asyncio.create_task(cluster.run(list, lambda agents: {}, lambda agent: None))
    await asyncio.wait_for(swallowing.entered.wait(), timeout=30)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=30)  # a bound on a hang, not a timing
    assert task in done, "the lease loop went on after it was cancelled"
    assert task.cancelled()
    cluster.aio = real
    await real.aclose()
    cluster.store.close()


class _SwallowingStream:
    """The command stream's client where the blocking read swallows the cancellation once
    (the redis-py fault above), then answers "nothing new" at once."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    def register_script(self, script: str) -> object:
        return None

    async def xrevrange(self, *args: object, **kwargs: object) -> list[object]:
        return []

    async def execute_command(self, *args: object, **kwargs: object) -> list[object]:
        assert args[0] == "XREAD", args  # the reader's blocking read, as bytes
        if not self.entered.is_set():
            self.entered.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)
        else:
            await asyncio.sleep(0.01)
        return []


async def test_stop_ends_the_command_reader_when_its_read_swallowed_the_cancellation() -> None:
    client = _SwallowingStream()
    channel = ClusteredChannel(TextOnly(), client, "p", "i0", frozenset())  # type: ignore[arg-type]

    async def sink(command: IncomingCommand) -> None:
        del command

    await channel.start(sink)
    await asyncio.wait_for(client.entered.wait(), timeout=30)
    stopping = asyncio.create_task(channel.stop())
    done, _ = await asyncio.wait({stopping}, timeout=30)  # a bound on a hang, not a timing
    assert stopping in done, "stop waited for a reader that went on reading"
