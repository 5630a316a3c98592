"""Small asyncio helpers shared by the service and the channels: one backoff, one wait, one
clock for the work done once a second.

Every retry loop in the project (the scheduler's lanes and items, a channel's start, the file
watcher, the Telegram command poller, the state store's write retry) backs off the same way:
exponentially from `initial_s`, capped at `max_s`, with jitter so that many loops failing at
the same moment do not retry in lockstep. Jitter only shortens a delay (by up to `jitter` of
it), so a delay never exceeds the cap an operator reads in the configuration.

`wait_first` is the one "wait until the first of these events is set, or a timeout" helper;
`AnyEvent` is the same as an `asyncio.Event` for APIs that take one event and poll `is_set`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal


@dataclass
class Backoff:
    """Capped exponential backoff with jitter.

    `delay_s(attempt)` is the delay after the `attempt`-th failure in a row (1 is the first);
    `next_delay_s()`/`asleep()` count a failure and give (or sleep) its delay; `reset()`
    after a success starts again from `initial_s`. `rand` is injected for tests.
    """

    initial_s: float = 1.0
    max_s: float = 60.0
    factor: float = 2.0
    jitter: float = 0.1
    rand: Callable[[], float] = field(default=random.random, repr=False, compare=False)
    attempts: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"backoff: need 0 < initial_s <= max_s, got {self!r}")
        if self.max_s > 86_400:
            raise ValueError(f"backoff: max_s must be at most a day, got {self.max_s}")
        if not 1.0 <= self.factor <= 10.0:
            raise ValueError(f"backoff: factor must be within 1-10, got {self.factor}")
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"backoff: jitter must be within [0, 1), got {self.jitter}")

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after the `attempt`-th failure in a row (0 and below: none)."""
        if attempt <= 0:
            return 0.0
        exponent = min(attempt - 1, 64)  # large attempts stay at the cap, without overflow
        base = min(self.max_s, self.initial_s * self.factor**exponent)
        return base * (1.0 - self.jitter * self.rand())

    def next_delay_s(self) -> float:
        """Count one more failure; the delay it calls for."""
        self.attempts += 1
        return self.delay_s(self.attempts)

    async def asleep(self) -> float:
        """Count one more failure and sleep its delay; returns the seconds slept."""
        delay = self.next_delay_s()
        await asyncio.sleep(delay)
        return delay

    def reset(self) -> None:
        """A success: the next failure waits `initial_s` again."""
        self.attempts = 0


async def wait_first(*events: asyncio.Event, timeout_s: float | None = None) -> bool:
    """Wait until any of `events` is set or `timeout_s` passed; whether one is set.

    The waiters are cancelled and awaited before returning, so nothing is left pending.
    """
    if any(event.is_set() for event in events):
        return True
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        if waiters:
            await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        elif timeout_s is not None:
            await asyncio.sleep(timeout_s)
        else:
            await asyncio.Event().wait()  # nothing to wait for and no timeout: until cancelled
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    return any(event.is_set() for event in events)


# The period of the service's work done once a second (see `next_tick`).
TICK_S = 1.0


def next_tick(now: float, period_s: float) -> float:
    """The first multiple of `period_s` after `now` (a time on the loop's clock): the next tick.

    The service's periodic work (its timer, the serve lock's check, the watcher's rescan
    step, each once a second) is timed by this one clock: their timers stand at the very
    same times and fire in one turn of the loop, so a service wakes once a second for all
    of them, not once for each (each wake-up is a turn of the loop, and the task it resumes
    another). A timer may run up to the clock's resolution early: a `now` within a
    thousandth of the period before a tick counts as that tick, whose next one is given."""
    return ((now + period_s * 0.001) // period_s + 1.0) * period_s


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # not cancelled meanwhile
        future.set_result(None)


async def sleep_to_tick(period_s: float) -> None:
    """Sleep until the next tick of the `period_s` clock (`next_tick`)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    timer = loop.call_at(next_tick(loop.time(), period_s), _wake, future)
    try:
        await future
    except BaseException:
        timer.cancel()
        raise


class AnyEvent(asyncio.Event):
    """Set while any of its events is set, for an API that takes one event.

    `set()` sets the first event: an API that sets its stop event when it ends (watchfiles
    does when cancelled) then reaches the event that means "stop".
    """

    def __init__(self, first: asyncio.Event, *others: asyncio.Event) -> None:
        super().__init__()
        self.events = (first, *others)

    def is_set(self) -> bool:
        return any(event.is_set() for event in self.events)

    def set(self) -> None:
        self.events[0].set()

    async def wait(self) -> Literal[True]:
        await wait_first(*self.events)
        return True
