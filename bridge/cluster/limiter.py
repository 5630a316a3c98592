"""`RedisLimiter`: the scheduler's rate windows and 429 pauses, shared by every instance.

The same sliding-window rule as `bridge.schedule.ratelimit`: a scope admits a request only
while fewer than `max_calls` requests happened in its last `period_s`. Here each window is a
sorted set of request ids scored by time, and one Lua script checks every scope of a request
and, only when all have room, takes a slot in each: atomically, so three instances racing for
the last slot of a chat cannot all win it. Time is Redis's own clock (`TIME`), so instances with
skewed clocks still agree. A finished request is re-stamped at its completion time (`ZADD XX
GT`), keeping the guarantee that a request delayed in flight never lets the platform observe
more than `max_calls` in any window.

A dispatcher's round is judged as at its start (`Limiter.acquire`'s `as_of`), as in memory:
the script is told how long ago that was on this instance's clock and counts the window as of
then on Redis's clock, so room that frees during a round waits for the next round instead of
going to whichever waiter is asked next.

A 429 seen by one instance is a key with a TTL (capped like every pause), checked by the same
script, so the scope pauses everywhere; `paused_s` reads those keys for a request that waits
for a pause of scopes it does not spend (a pin in a paused chat). The key is written in the
background, so this instance also keeps each pause it draws in memory and holds its own
requests by it from the moment of the 429 until the pause ends: a request asked for before
the write landed would otherwise pass the script and meet the platform's 429 again. A pause
whose write Redis did not take (it was gone at that moment) is held the same way; the other
instances do not learn of it. While Redis cannot be
reached nothing is sent (the script cannot vouch for the window): requests wait and ask again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from taskcard.bridge.schedule.ratelimit import (
    DEFAULT_MAX_PAUSE_S,
    Admission,
    Limiter,
    bounded_pause_s,
)
from taskcard.bridge.store.redis import wrong_type
from taskcard.channels.base import RateScope

log = logging.getLogger(__name__)

# While Redis cannot answer, requests ask again after this long.
UNREACHABLE_WAIT_S = 0.5
# While a window's key holds another type (something else on the prefix), this long.
WRONG_TYPE_WAIT_S = 2.0
# A round judged as of longer ago than this (a clock that is not the dispatcher's) is judged
# as of this long ago: never a window emptied by a wrong reading.
MAX_AGO_MS = 60_000

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: window 1, pause 1, window 2, pause 2, ...; ARGV: request id, how long ago (ms) the room
# is judged as of, then per scope max calls and period in ms. Returns 0 (slots taken), the
# milliseconds to wait, -1 (no room as of then, but room now: ask again in the next round), or
# {window, its type} for a window that is not a sorted set (every call on it failed without
# naming it).
_ACQUIRE = (
    _NOW_MS
    + """
local wait = 0
local full = false
local judged = now - tonumber(ARGV[2])
local n = #KEYS / 2
for i = 1, n do
  local found = redis.call('TYPE', KEYS[2 * i - 1])['ok']
  if found ~= 'zset' and found ~= 'none' then return {KEYS[2 * i - 1], found} end
end
for i = 1, n do
  local window, pause = KEYS[2 * i - 1], KEYS[2 * i]
  local max_calls, period = tonumber(ARGV[2 * i + 1]), tonumber(ARGV[2 * i + 2])
  local paused = redis.call('PTTL', pause)
  if paused > wait then wait = paused end
  redis.call('ZREMRANGEBYSCORE', window, '-inf', judged - period)
  local count = redis.call('ZCARD', window)
  if count >= max_calls then
    full = true
    local oldest = redis.call('ZRANGE', window, count - max_calls, count - max_calls, 'WITHSCORES')
    local release = tonumber(oldest[2]) + period - now
    if release > wait then wait = release end
  end
end
if wait > 0 then return math.ceil(wait) end
if full then return -1 end
for i = 1, n do
  local window, period = KEYS[2 * i - 1], tonumber(ARGV[2 * i + 2])
  redis.call('ZADD', window, now, ARGV[1])
  redis.call('PEXPIRE', window, period * 2 + 60000)
end
return 0
"""
)

# KEYS: windows; ARGV: request id. The slot moves to now, never backwards.
_COMPLETE = (
    _NOW_MS
    + """
for i = 1, #KEYS do redis.call('ZADD', KEYS[i], 'XX', 'GT', now, ARGV[1]) end
return 0
"""
)

# KEYS: pause; ARGV: ms applied, cap ms. A longer running pause is kept, within the cap.
_PAUSE = """
local current = redis.call('PTTL', KEYS[1])
local cap, applied = tonumber(ARGV[2]), tonumber(ARGV[1])
if current > cap then current = cap end
local ms = math.max(current, applied)
if ms > 0 then redis.call('SET', KEYS[1], '1', 'PX', ms) end
return ms
"""


class _SharedAdmission(Admission):
    def __init__(self, limiter: RedisLimiter, member: str, windows: list[str]) -> None:
        self._limiter = limiter
        self._member = member
        self._windows = windows

    def complete(self) -> None:
        self._limiter.later(self._limiter.complete_script(keys=self._windows, args=[self._member]))


class RedisLimiter(Limiter):
    """Every scope's window and pause in Redis, under `prefix`."""

    def __init__(
        self,
        client: Redis,
        prefix: str,
        instance: str,
        *,
        max_pause_s: float = DEFAULT_MAX_PAUSE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._clock = clock
        self._prefix = prefix
        self._instance = instance
        self.max_pause_s = max_pause_s
        self._ids = itertools.count(1)
        self._acquire = client.register_script(_ACQUIRE)
        self.complete_script = client.register_script(_COMPLETE)
        self._pause = client.register_script(_PAUSE)
        self._tasks: set[asyncio.Task[object]] = set()
        self._failing = False
        self._wrong: set[str] = set()  # windows of another type, logged once each
        # Pauses this instance drew (scope -> end, on the clock): honoured here from the 429
        # on, before their write reaches Redis and if it never does, until they end.
        self._drawn: dict[str, float] = {}

    def window_key(self, scope: str) -> str:
        return f"{self._prefix}:rl:{scope}"

    def pause_key(self, scope: str) -> str:
        return f"{self._prefix}:pause:{scope}"

    async def acquire(
        self, scopes: tuple[RateScope, ...], *, as_of: float | None = None
    ) -> Admission | float:
        member = f"{self._instance}:{next(self._ids)}"
        # How long ago the round began, on our clock; Redis counts back from its own now.
        ago_s = 0.0 if as_of is None else self._clock() - as_of
        ago_ms = math.ceil(ago_s * 1000) if 0 < ago_s < math.inf else 0
        keys: list[str] = []
        args: list[str | int] = [member, min(ago_ms, MAX_AGO_MS)]
        for scope in scopes:
            keys += [self.window_key(scope.key), self.pause_key(scope.key)]
            args += [scope.max_calls, max(1, math.ceil(scope.period_s * 1000))]
        drawn_s = self._drawn_s(scope.key for scope in scopes)
        if drawn_s > 0:
            return drawn_s
        try:
            answer = await self._acquire(keys=keys, args=args)
        except RedisError as error:
            return self._unreachable(error)
        self._reachable()
        if isinstance(answer, list):
            key, found = (str(part) for part in answer)
            if key not in self._wrong:
                self._wrong.add(key)
                log.error(
                    "nothing is sent where this rate limit applies until it is fixed: %s",
                    wrong_type(key, found, "sorted set"),
                )
            return WRONG_TYPE_WAIT_S
        for key in self._wrong.intersection(keys[0::2]):
            self._wrong.discard(key)
            log.warning("the Redis key %s is a rate window again: sending resumes", key)
        wait_ms = int(answer)
        if wait_ms < 0:
            return 0.0  # refused as of the round's start: asked again in the next round
        if wait_ms > 0:
            return wait_ms / 1000
        return _SharedAdmission(self, member, keys[0::2])

    def _unreachable(self, error: RedisError) -> float:
        """Redis did not answer: logged once while it lasts; the request asks again."""
        if not self._failing:
            log.error(
                "the shared rate limits in Redis cannot be checked (%s); nothing is sent"
                " until Redis answers again",
                type(error).__name__,
            )
            self._failing = True
        return UNREACHABLE_WAIT_S

    def _reachable(self) -> None:
        if self._failing:
            log.warning("the shared rate limits in Redis answer again")
            self._failing = False

    def pause(self, scope: str, seconds: float) -> float:
        applied = bounded_pause_s(seconds, self.max_pause_s)
        if applied > 0:
            now = self._clock()
            for key in [key for key, end in self._drawn.items() if end <= now]:
                del self._drawn[key]  # a few 429s at most: the ended ones go as one is added
            # As in memory: a longer pause already running is kept, never beyond the cap.
            current = min(self._drawn.get(scope, 0.0), now + self.max_pause_s)
            self._drawn[scope] = max(current, now + applied)
            cap_ms = math.ceil(self.max_pause_s * 1000)
            self.later(
                self._pause(keys=[self.pause_key(scope)], args=[math.ceil(applied * 1000), cap_ms])
            )
        return applied

    def _drawn_s(self, scopes: Iterable[str]) -> float:
        """Seconds left of the longest pause this instance drew over `scopes`."""
        if not self._drawn:
            return 0.0
        now = self._clock()
        return max([0.0, *(self._drawn.get(scope, 0.0) - now for scope in scopes)])

    async def paused_s(self, scopes: Iterable[str]) -> float:
        """The longest pause left over `scopes`, whichever instance drew it: in Redis, or drawn
        here (known here from the 429 on, whether or not its write has landed or ever will).
        While Redis does not answer, nothing can vouch for the chat: ask again shortly."""
        scopes = list(scopes)
        keys = [self.pause_key(scope) for scope in scopes]
        if not keys:
            return 0.0
        drawn_s = self._drawn_s(scopes)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.pttl(key)
                left_ms = await pipe.execute()
        except RedisError as error:
            return max(self._unreachable(error), drawn_s)
        self._reachable()
        # -2: no such pause
        return max(max([0, *(int(ms) for ms in left_ms)]) / 1000, drawn_s)

    def seed(self, scopes: Iterable[RateScope], at: float) -> None:
        """Nothing to do: the shared windows outlive any one instance's restart."""
        del scopes, at

    def later(self, work: Awaitable[Any]) -> asyncio.Task[object]:
        """Run a write in the background, owned here and awaited by `close`."""
        task: asyncio.Task[object] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning(
                "a shared rate-limit write failed (%s); the window expires on its own",
                type(task.exception()).__name__,
            )

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
