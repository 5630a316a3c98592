"""Fair admission: requests of many chats that share a scope (the bot's budget) take turns.

Each chat's lane asks the limiter for room before a request. When a shared scope is full
(Telegram's 30 a second per bot, with a hundred groups waiting), letting every lane sleep
until the scope frees a slot and then race for it serves whichever lane the event loop wakes
first: some chats fill up while others wait, although the bot's budget is fully used. Here
the lanes that have to wait queue, and one dispatcher hands out room in turn order
(`turn_order`):

- the chat with the least *credit* goes first, and among equals the one that began to wait
  first. A chat's credit counts the requests let through since it became busy; served chats
  go to the back when they ask again, so chats sharing the bot take turns, and a chat that
  joined late (at start-up the service reads thousands of cards, so the first chats have
  work seconds before the last) catches up with the others until they are level. A chat
  that had nothing let through for `HORIZON_S` starts afresh: its credit is where the turns
  are (the credit of the chat served last) less its catch-up (`catch_up`: what the chat's
  own limit lets through in `HORIZON_S`, as its channel declares it), so a chat quiet for an hour
  cannot hold the bot for long with an old low count, and one that pauses briefly is not
  sent to the back for its history.

  Why counts and not what this queue had before. A count over the last minute evens out the
  window, not the totals: a lead made once (the start-up skew, or a chat skipped while its
  own window was full) came back one window later, when the requests that had evened it out
  left the window, and grew each minute. A credit halving every minute had no echo, but it
  stopped the catching up early: the leader's old requests had faded more than the
  followers' new ones, so a lead of several requests stayed for good (simulated in
  `tests/bridge/test_admission.py`);
- a waiter without room (its own chat's window is full) does not hold up the waiters after it
  whose scopes have room: no capacity is left unused while someone could use it
  (work-conserving);
- a round offers room as it was when the round began (`Limiter.acquire`'s `as_of`): room
  that frees while the dispatcher goes through the waiters waits for the next round, where
  the first in turn gets it. Otherwise a slot of the bot's budget freed in the middle of a
  round (each request frees its slot a second after it ends, so slots free all the time)
  went to the next waiter asked, ahead of the waiters refused a moment before it: a chat
  served just before could get a second turn while others waited a whole round more;
- with nobody waiting, a request asks the limiter at once (no queue, no extra step).

`AdmissionQueue` asks a `Limiter` (in memory, or shared by a cluster) for each waiter in turn
whenever time frees room or a waiter arrives; the limiter stays the only judge of room.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from taskcard.bridge.schedule.ratelimit import Admission, Limiter
from taskcard.channels.aio import wait_first
from taskcard.channels.base import RateScope

log = logging.getLogger(__name__)

# A chat with nothing let through for this long starts afresh (the longest platform window).
HORIZON_S = 60.0


def catch_up(own: Sequence[RateScope]) -> int:
    """How far behind the chat served last a chat that starts afresh begins: what it may
    catch up before it takes plain turns. That is a horizon's worth of the requests its own
    limit allows (`own`: the scopes of a send to it, the chat's own first, as a channel's
    `rate_scopes` lists them): 20 for a Telegram group (20 a minute), 300 for a Feishu chat
    (5 a second). A chat without limits of its own never waits for its turn: 0."""
    if not own:
        return 0
    scope = own[0]
    return max(1, round(scope.max_calls * HORIZON_S / scope.period_s))


def turn_order(waiting: Sequence[Hashable], credit: Mapping[Hashable, int]) -> list[int]:
    """The order in which waiters are offered room: indices into `waiting` (each waiter's
    chat, in the order they began to wait), least `credit` first, then first come first."""
    return sorted(range(len(waiting)), key=lambda index: (credit.get(waiting[index], 0), index))


@dataclass
class _Waiter:
    who: Hashable
    scopes: tuple[RateScope, ...]
    catch_up: int
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    admission: Admission | None = None
    gone: bool = False  # gave up (closing): the dispatcher drops it


class AdmissionQueue:
    """Waiters in arrival order and the dispatcher that admits them (see the module doc)."""

    def __init__(self, limiter: Limiter, clock: Callable[[], float]) -> None:
        self._limiter = limiter
        self._clock = clock
        self._credit: dict[Hashable, tuple[int, float]] = {}  # who: (credit, last let through)
        self._level = 0  # where the turns are: the credit of the chat let through last
        self._waiters: deque[_Waiter] = deque()
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def credit(self, who: Hashable, catch_up: int, now: float | None = None) -> int:
        """`who`'s credit at `now` (default: the clock): the requests let through since it
        became busy, counted from where it started, `catch_up` behind the turns (see the
        module doc)."""
        entry = self._credit.get(who)
        if entry is not None:
            if now is None:
                now = self._clock()
            if now - entry[1] <= HORIZON_S:
                return entry[0]
            del self._credit[who]
        return max(0, self._level - catch_up)

    def _record(self, who: Hashable, catch_up: int) -> None:
        now = self._clock()
        self._level = self.credit(who, catch_up, now)
        self._credit[who] = (self._level + 1, now)

    async def admit(
        self,
        who: Hashable,
        scopes: tuple[RateScope, ...],
        closing: asyncio.Event,
        catch_up: int,
    ) -> Admission | None:
        """Wait for room in every scope, in turn with the other chats (`who`) waiting;
        None when `closing` is set first. `catch_up`: see `catch_up()`."""
        if not self._waiters:
            admitted = await self._limiter.acquire(scopes)
            if isinstance(admitted, Admission):
                self._record(who, catch_up)
                return admitted
        waiter = _Waiter(who, scopes, catch_up)
        self._waiters.append(waiter)
        self._arrived.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._dispatch(), name="admission")
        try:
            await wait_first(waiter.ready, closing)
        finally:
            if waiter.admission is None:
                waiter.gone = True  # closing (or cancelled): the dispatcher drops it
                self._arrived.set()
        return waiter.admission

    async def close(self) -> None:
        """End the dispatcher (the scheduler stops: nobody waits any more)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _dispatch(self) -> None:
        """Hand out room in arrival order until nobody waits."""
        while self._waiters:
            self._arrived.clear()
            wait_s: float | None = None
            try:
                waiters = list(self._waiters)
                now = self._clock()
                credit = {
                    waiter.who: self.credit(waiter.who, waiter.catch_up, now) for waiter in waiters
                }
                for index in turn_order([waiter.who for waiter in waiters], credit):
                    waiter = waiters[index]
                    if waiter.gone:
                        self._waiters.remove(waiter)
                        continue
                    admitted = await self._limiter.acquire(waiter.scopes, as_of=now)
                    if not isinstance(admitted, Admission):
                        wait_s = admitted if wait_s is None else min(wait_s, admitted)
                        continue
                    self._waiters.remove(waiter)
                    if waiter.gone:
                        admitted.complete()  # unused, but counted: errs on the safe side
                        continue
                    self._record(waiter.who, waiter.catch_up)
                    waiter.admission = admitted
                    waiter.ready.set()
            except Exception:  # a shared limiter that cannot answer: try again soon
                log.exception("admission: the rate limiter failed; asking again in 1 s")
                wait_s = 1.0
            if self._waiters:
                await wait_first(self._arrived, timeout_s=wait_s)
