"""Leases in Redis: who polls a bot, who serves an agent.

A lease is one key holding `owner|fence` with a TTL (`SET ... PX`), renewed by its holder every
third of the TTL; when the holder dies the key expires and the next instance to try takes it.
Every acquisition increments a fencing counter, so a holder that lost its lease (a long pause,
a partition) and comes back carries an old token: writes that matter (the committed update
offset) are made by a script that checks the token first, and a stale holder's write is
refused rather than moving the offset under the new holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence

import redis
from redis.asyncio import Redis
from redis.exceptions import RedisError

from taskcard.bridge.store.redis import RELEASE_IF_HELD
from taskcard.channels.base import CursorStore

log = logging.getLogger(__name__)

# KEYS: lease and fence counter of each lease in turn; ARGV: owner, ttl ms. Returns, for each
# lease, the token held (renewed or new), or nil when another owner holds it.
# A key no live holder could have written (not a string, or a lease without a TTL: every
# holder sets one) is free, and a fence counter that is not an integer starts again; either,
# left by an older version or a hand edit, made the script fail for every lease of the batch,
# so no agent of the instance was served. Tokens carry the owner's unique name, so a counter
# started again cannot make a stale holder's token match.
_HOLD = """
local tokens = {}
for i = 1, #KEYS, 2 do
  local current = redis.pcall('GET', KEYS[i])
  if type(current) == 'table' or (current and redis.call('PTTL', KEYS[i]) == -1) then
    current = false
  end
  local token = false
  if current then
    if string.sub(current, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
      token = current
    end
  else
    local fence = redis.pcall('INCR', KEYS[i + 1])
    if type(fence) ~= 'number' then
      redis.call('DEL', KEYS[i + 1])
      fence = redis.call('INCR', KEYS[i + 1])
    end
    token = ARGV[1] .. '|' .. fence
    redis.call('SET', KEYS[i], token, 'PX', ARGV[2])
  end
  tokens[#tokens + 1] = token
end
return tokens
"""
# Leases renewed per script call: one round trip per thousand agents, not one per agent, and
# each call short enough (a few milliseconds in Redis) not to hold up other clients.
HOLD_BATCH = 1000

# KEYS: leases; ARGV: the token held for each. Deletes those still held with that token.
_RELEASE_ALL = """
local released = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then released = released + redis.call('DEL', KEYS[i]) end
end
return released
"""

# KEYS: lease, hash; ARGV: token, field, value. The write happens only under the token.
FENCED_HSET = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""


class LeaseLost(Exception):
    """A fenced write was refused: this instance no longer holds the lease."""


class Lease:
    """One named lease; `hold()` acquires or renews it, `token` is set while held."""

    def __init__(
        self,
        client: Redis,
        key: str,
        owner: str,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = key
        self._owner = owner
        self._ttl_ms = int(ttl_s * 1000)
        self._ttl_s = ttl_s
        self._clock = clock
        self._hold = client.register_script(_HOLD)
        self._release = client.register_script(RELEASE_IF_HELD)
        self.token: str | None = None
        self._held_at = 0.0
        self.changed = asyncio.Event()  # set whenever the lease is gained or lost

    @property
    def held(self) -> bool:
        return self.token is not None

    async def hold(self) -> bool:
        """Acquire or renew; True while held. An unreachable Redis keeps a lease only until
        it would have expired there."""
        await hold_all([self])
        return self.held

    def _answered(self, token: object) -> None:
        if token is not None:
            self._held_at = self._clock()
        self._set(None if token is None else str(token))

    def _unanswered(self) -> None:
        # Said once for all of an instance's leases by its renewal (`Cluster`), not per lease.
        if self.token is not None and self._clock() - self._held_at >= self._ttl_s:
            self._set(None)

    async def release(self) -> None:
        token, self.token = self.token, None
        if token is not None:
            with contextlib.suppress(RedisError):  # else it expires on its own
                await self._release(keys=[self.key], args=[token])

    def _set(self, token: str | None) -> None:
        if (token is None) != (self.token is None) or (token and token != self.token):
            self.changed.set()
        self.token = token


async def hold_all(leases: Sequence[Lease]) -> RedisError | None:
    """Acquire or renew every lease, `HOLD_BATCH` per round trip (they share one client,
    owner and TTL: one instance's leases). Each lease's `held` tells the outcome; the
    error of a batch Redis did not answer is returned (its leases lapse after their TTL)."""
    failed: RedisError | None = None
    for start in range(0, len(leases), HOLD_BATCH):
        batch = leases[start : start + HOLD_BATCH]
        first = batch[0]
        keys = [name for lease in batch for name in (lease.key, f"{lease.key}:fence")]
        try:
            tokens = await first._hold(keys=keys, args=[first._owner, first._ttl_ms])
        except RedisError as error:
            failed = error
            for lease in batch:
                lease._unanswered()
            continue
        for lease, token in zip(batch, tokens, strict=True):
            lease._answered(token)
    return failed


async def release_all(client: Redis, leases: Sequence[Lease]) -> None:
    """Give up every held lease in one round trip, so the others take over at once.

    One call whatever the number of leases: releasing an instance's agents one by one on its
    way out cost one round trip each, and each waited up to the socket timeout when Redis did
    not answer, holding a SIGTERM for minutes with many agents. When this call fails, the
    leases expire on their own after their TTL."""
    held = [(lease.key, lease.token) for lease in leases if lease.token is not None]
    for lease in leases:
        lease.token = None
    if not held:
        return
    keys = [key for key, _ in held]
    tokens = [token for _, token in held if token is not None]
    try:
        await client.eval(_RELEASE_ALL, len(keys), *keys, *tokens)
    except RedisError as error:
        log.warning("could not release the leases (%s); they expire", type(error).__name__)


class PollLease:
    """The `PollGate` of one bot: polling only while this instance holds its lease."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self._polled_with: str | None = None

    async def wait_turn(self) -> bool:
        while self.lease.token is None:
            self.lease.changed.clear()
            await self.lease.changed.wait()
        fresh = self.lease.token != self._polled_with
        if fresh:
            log.info("this instance polls the bot's updates now (%s)", self.lease.key)
        self._polled_with = self.lease.token
        return fresh


class FencedCursors:
    """The cursor store the poller commits its offset to: writes of `fenced_key` go through
    only under the current lease token (else `LeaseLost`); everything else passes through."""

    def __init__(
        self,
        inner: CursorStore,
        client: redis.Redis,
        hash_key: str,
        fenced_key: str,
        lease: Lease,
    ) -> None:
        self._inner = inner
        self._hset = client.register_script(FENCED_HSET)
        self._hash_key = hash_key
        self._fenced_key = fenced_key
        self._lease = lease

    def get_cursor(self, key: str) -> str | None:
        return self._inner.get_cursor(key)

    def delete_cursors(self, keys: Iterable[str]) -> None:
        """Only others than the fenced one: the offset is the lease holder's to write."""
        self._inner.delete_cursors(key for key in keys if key != self._fenced_key)

    def set_cursor(self, key: str, value: str) -> None:
        if key != self._fenced_key:
            self._inner.set_cursor(key, value)
            return
        token = self._lease.token
        if token is None or not self._hset(
            keys=[self._lease.key, self._hash_key], args=[token, key, value]
        ):
            raise LeaseLost(
                f"{self._lease.key} is no longer held by this instance (it lapsed, or another"
                " instance holds it); the offset is left to the lease's holder"
            )
