"""The shared backoff and wait helpers, as tables and with real events (no sleeping on time)."""

from __future__ import annotations

import asyncio

import pytest

from taskcard.channels.aio import AnyEvent, Backoff, next_tick, sleep_to_tick, wait_first


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (0, 0.0, 0.0),  # no failure yet: no wait
        (-3, 0.5, 0.0),
        (1, 0.0, 1.0),  # jitter drawn 0: the full exponential delay
        (2, 0.0, 2.0),
        (4, 0.0, 8.0),
        (7, 0.0, 60.0),  # capped
        (10_000, 0.0, 60.0),  # no overflow far past the cap
        (1, 1.0, 0.9),  # jitter only shortens, by at most `jitter` of the delay
        (7, 1.0, 54.0),
        (3, 0.5, 3.8),
    ],
)
def test_delay_is_exponential_capped_and_jittered_down(
    attempt: int, rand: float, expected: float
) -> None:
    backoff = Backoff(initial_s=1.0, max_s=60.0, jitter=0.1, rand=lambda: rand)
    assert backoff.delay_s(attempt) == pytest.approx(expected)


def test_failures_count_up_and_reset_starts_over() -> None:
    backoff = Backoff(initial_s=0.5, max_s=4.0, jitter=0.0)
    assert [backoff.next_delay_s() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert backoff.attempts == 5
    backoff.reset()
    assert backoff.next_delay_s() == 0.5


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"initial_s": 0.0}, "initial_s"),
        ({"initial_s": 5.0, "max_s": 1.0}, "initial_s <= max_s"),
        ({"max_s": 100_000.0}, "max_s"),
        ({"factor": 0.5}, "factor"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(fields: dict[str, float], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        Backoff(**fields)  # type: ignore[arg-type]


async def test_asleep_counts_and_sleeps_the_delay() -> None:
    backoff = Backoff(initial_s=0.001, max_s=0.002, jitter=0.0)
    assert await backoff.asleep() == 0.001
    assert await backoff.asleep() == 0.002
    assert backoff.attempts == 2


async def test_wait_first_returns_when_any_event_is_set() -> None:
    first, second = asyncio.Event(), asyncio.Event()
    waiting = asyncio.create_task(wait_first(first, second))
    await asyncio.sleep(0)
    assert not waiting.done()
    second.set()
    assert await asyncio.wait_for(waiting, timeout=30) is True


async def test_wait_first_times_out_with_none_set() -> None:
    assert await wait_first(asyncio.Event(), timeout_s=0.01) is False
    assert await wait_first(timeout_s=0.01) is False


async def test_wait_first_leaves_no_waiter_behind() -> None:
    event = asyncio.Event()
    before = len(asyncio.all_tasks())
    await wait_first(event, asyncio.Event(), timeout_s=0.01)
    assert len(asyncio.all_tasks()) == before


async def test_any_event_is_set_while_one_is_and_sets_the_first() -> None:
    stop, rearm = asyncio.Event(), asyncio.Event()
    either = AnyEvent(stop, rearm)
    assert not either.is_set()
    rearm.set()
    assert either.is_set()
    assert await asyncio.wait_for(either.wait(), timeout=30) is True
    rearm.clear()
    either.set()  # what an API does with its stop event when it ends
    assert stop.is_set() and either.is_set()


@pytest.mark.parametrize(
    ("now", "period_s", "expected"),
    [
        (0.0, 1.0, 1.0),
        (0.5, 1.0, 1.0),
        (41.25, 1.0, 42.0),
        (42.0, 1.0, 43.0),  # on a tick: the next one
        (41.9995, 1.0, 43.0),  # a timer run a hair early for 42: counts as 42's
        (41.998, 1.0, 42.0),
        (1000.1, 300.0, 1200.0),
        (7.0, 0.5, 7.5),
    ],
)
def test_next_tick_is_the_next_multiple_of_the_period(
    now: float, period_s: float, expected: float
) -> None:
    assert next_tick(now, period_s) == expected


async def _periodic(period_s: float, order: list[str], name: str, queue: bool) -> None:
    await sleep_to_tick(period_s)
    order.append(name)
    if queue:
        asyncio.get_running_loop().call_soon(order.append, f"queued by the {name}")


async def test_periodic_sleeps_begun_apart_end_in_one_turn_of_the_loop() -> None:
    """Two once-a-period sleeps begun a quarter period apart wake in the same turn: the
    second resumes before a callback the first one queued as it resumed."""
    loop = asyncio.get_running_loop()
    period_s = 0.4
    for _ in range(5):  # a round that a stalled machine let pass the tick is tried again
        await sleep_to_tick(period_s)  # just past a tick: the next is a period away
        tick = next_tick(loop.time(), period_s)
        order: list[str] = []
        one = asyncio.create_task(_periodic(period_s, order, "first", queue=True))
        await asyncio.sleep(period_s / 4)  # the second begins later, before the same tick
        if loop.time() >= tick - period_s / 8:
            await one
            continue
        await asyncio.gather(one, _periodic(period_s, order, "second", queue=False))
        await asyncio.sleep(0)
        assert order == ["first", "second", "queued by the first"]
        return
    pytest.fail("the machine never left a quarter period between the two starts")


async def test_a_cancelled_periodic_sleep_leaves_no_timer() -> None:
    loop = asyncio.get_running_loop()
    sleeper = asyncio.create_task(sleep_to_tick(3600.0))
    await asyncio.sleep(0)
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    assert not [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
