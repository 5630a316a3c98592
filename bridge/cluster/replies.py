"""Command replies a cluster's instance had not sent when it stopped, kept for the others.

The instance that claims a command's reply queues it in its scheduler, which sends it when the
chat's window allows. A stop (or a crash) before then lost the answer: the claim was taken,
so no other instance answered. Each unsent reply is kept in the hash `P:replies` (field: the
reply's idempotency key; value: `<owner> <written at, epoch ms> <channel> <entry JSON>`)
from when it is queued until it is sent, refused for good or replaced.

An instance that stops lets go of its replies (their owner becomes `*`); one that dies keeps
them until its entry in `P:instances` lapses (or, not listed there, until `ORPHAN_AFTER` of
its leases after the write). At each lease renewal every live instance takes the replies left
so, for the channels it sends on, in one script: each is taken by exactly one instance, also
when two start together, and sent by it. A reply left so for `STALE_AFTER_S` (its channel is
one no live instance sends on any more, say) is dropped by that script instead of staying in
the hash for good, as a single instance drops at its start the kept replies of a channel it
no longer has. The take hands over at most `TAKE_PER_RENEWAL` replies or `MAX_TAKE_BYTES`
(the rest at the next renewals), and none over `MAX_REPLY_BYTES` (no instance writes one so
large: it is named once in the log and left where it is), so a hash someone filled is never
carried whole to every instance at every renewal.

`keep` and `forget` are called on the event loop: their writes go out in order from one
background task, so a Redis that does not answer holds up nothing else (each write used to wait
its socket timeout on the loop, every chat and agent with it). A reply forgotten is counted as
sent-but-not-yet-removed until its removal went through, so no take hands it back meanwhile;
`release` waits for the writes queued before it. `mark` (a reply about to go out on a platform
that cannot deduplicate sends, kept `unsure`) goes through the same queue, so no older write of
its key lands after it, and is awaited: its send waits for Redis to take it, and does not go
out when Redis refused it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import NoScriptError, RedisError

from taskcard.bridge.store.redis import (
    MAX_OVER,
    NAMED_BYTES,
    delete_field_fix,
    over_cap,
    raw_answer,
    utf8,
)

log = logging.getLogger(__name__)

RELEASED = "*"
# A reply whose owner is not listed in `P:instances` is taken over this many leases after it
# was written: the owner may have written it before it listed itself.
ORPHAN_AFTER = 3
# A reply nobody took for this long after it was written is an answer nobody waits for.
STALE_AFTER_S = 86_400.0

# The most read of the replies at one take (each lease renewal): the bytes of one entry, the
# entries and the bytes in all. An honest entry is the reply's text and its platform payload
# (a message of at most 4,096 characters on Telegram, a card of at most 30 KB on Feishu,
# escaped in JSON), well under 256 KiB; an entry past the cap is not taken, named once in the
# log, and those past the count or the bytes in all are taken at the next renewals.
MAX_REPLY_BYTES = 1024 * 1024
TAKE_PER_RENEWAL = 1_000
MAX_TAKE_BYTES = 64 * 1024 * 1024

# KEYS: replies hash, instances zset; ARGV: taker, now (ms), grace (ms), channels (JSON list),
# stale (ms), the most bytes of an entry, the most entries and bytes handed over, the most
# entries over the size named. Takes every reply whose owner let it go or is gone, for the
# taker's channels, and drops such replies (on any channel) written more than `stale` ago;
# returns {field, value, ...} of the replies taken and of those the taker owns already
# (their values as written, owner aside: a take whose answer was lost took some that the
# taker does not know of), and {field, size, ...} of those over the size, left where they
# are. Past the count or the bytes, nothing more is handed over (those let go first, then
# the taker's own): the next take goes on.
_TAKE = """
local channels = {}
for _, name in ipairs(cjson.decode(ARGV[4])) do channels[name] = true end
local now, grace, stale = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local most, count, budget = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local taken, over, spent = {}, {}, 0
local function room(field, value)
  if #field + #value > most then
    if #over < 2 * tonumber(ARGV[9]) then
      over[#over + 1] = string.sub(field, 1, tonumber(ARGV[10]))
      over[#over + 1] = #field + #value
    end
    return false
  end
  return #taken < 2 * count and spent + #field + #value <= budget
end
local all = redis.call('HGETALL', KEYS[1])
local mine = {}
for i = 1, #all, 2 do
  local owner, at, channel, rest = string.match(all[i + 1], '^(%S+) (%d+) (%S+) (.*)$')
  if owner == ARGV[1] then
    mine[#mine + 1] = i
  elseif owner then
    local gone = owner == '*'
    if not gone then
      local listed = redis.call('ZSCORE', KEYS[2], owner)
      if listed then
        gone = tonumber(listed) <= now
      else
        gone = tonumber(at) + grace <= now
      end
    end
    if gone and tonumber(at) + stale <= now then
      redis.call('HDEL', KEYS[1], all[i])
    elseif gone and channels[channel] and room(all[i], all[i + 1]) then
      redis.call('HSET', KEYS[1], all[i], ARGV[1] .. ' ' .. at .. ' ' .. channel .. ' ' .. rest)
      taken[#taken + 1] = all[i]
      taken[#taken + 1] = rest
      spent = spent + #all[i] + #all[i + 1]
    end
  end
end
for _, i in ipairs(mine) do
  if room(all[i], all[i + 1]) then
    taken[#taken + 1] = all[i]
    taken[#taken + 1] = string.match(all[i + 1], '^%S+ %d+ %S+ (.*)$')
    spent = spent + #all[i] + #all[i + 1]
  end
end
return {taken, over}
"""

# KEYS: replies hash; ARGV: owner. Lets go of the owner's replies.
_RELEASE = """
local all = redis.call('HGETALL', KEYS[1])
local count = 0
for i = 1, #all, 2 do
  local owner, rest = string.match(all[i + 1], '^(%S+) (.*)$')
  if owner == ARGV[1] then
    redis.call('HSET', KEYS[1], all[i], '* ' .. rest)
    count = count + 1
  end
end
return count
"""


# How long a stop waits for the queued writes of `keep` and `forget` before it lets go.
RELEASE_FLUSH_S = 10.0


class ClusterReplies:
    """This instance's side of the replies kept in Redis (see the module's docstring)."""

    def __init__(
        self, client: redis.Redis, aio: AsyncRedis, prefix: str, owner: str, lease_ttl_s: float
    ) -> None:
        self._client = client
        self._aio = aio
        self._key = f"{prefix}:replies"
        self._instances = f"{prefix}:instances"
        self._owner = owner
        self._grace_ms = int(ORPHAN_AFTER * lease_ttl_s * 1000)
        self._take = aio.register_script(_TAKE)
        self._mine: set[str] = set()  # the replies this instance kept or took
        # Those forgotten while a take waits for its answer: not taken back from it.
        self._forgotten: set[str] | None = None
        # Sent, but Redis did not take their removal (or not yet: it is queued): never taken
        # back, removed again at each take and before a release (which would hand them to
        # another instance).
        self._undropped: set[str] = set()
        self._release = aio.register_script(_RELEASE)
        # The writes of `keep` and `mark` (key, value) and `forget` (key, None), in call
        # order; a `mark`'s with the future it awaits.
        self._writes: deque[tuple[str, str | None, asyncio.Future[None] | None]] = deque()
        self._writer: asyncio.Task[None] | None = None

    def keep(self, key: str, entry: dict[str, Any]) -> None:
        self._mine.add(key)
        self._write(key, self._value(entry))

    async def mark(self, key: str, entry: dict[str, Any]) -> None:
        """Keep `entry` (marked `unsure`) once the writes of `key` queued before it went
        through; returns when Redis took it, raises `RedisError` or `OSError` when it did not
        (then the reply is not to be sent now)."""
        self._mine.add(key)
        done = asyncio.get_running_loop().create_future()
        self._write(key, self._value(entry), done)
        await done

    def _value(self, entry: dict[str, Any]) -> str:
        return " ".join(
            (self._owner, str(int(time.time() * 1000)), str(entry["channel"]), json.dumps(entry))
        )

    def forget(self, key: str) -> None:
        self._mine.discard(key)
        if self._forgotten is not None:
            self._forgotten.add(key)
        # Sent: never taken back here until Redis took its removal (see `_undropped`).
        self._undropped.add(key)
        self._write(key, None)

    def _write(self, key: str, value: str | None, done: asyncio.Future[None] | None = None) -> None:
        """Queue one write for the writer task; done at once when no loop runs."""
        self._writes.append((key, value, done))
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._write_now_sync()
            return
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued(), name="cluster_replies")

    def _write_now_sync(self) -> None:
        while self._writes:
            key, value, _ = self._writes[0]  # left queued until done (see `_removal_queued`)
            try:
                if value is None:
                    self._client.hdel(self._key, key)
                else:
                    self._client.hset(self._key, key, value)
            except (RedisError, OSError) as error:
                self._write_failed(key, value, error)
            else:
                self._written(key, value)
            self._writes.popleft()

    async def _write_queued(self) -> None:
        try:
            while self._writes:
                key, value, done = self._writes[0]  # left queued until done (`_removal_queued`)
                try:
                    if value is None:
                        await self._aio.hdel(self._key, key)
                    else:
                        await self._aio.hset(self._key, key, value)
                except (RedisError, OSError) as error:
                    if done is None:
                        self._write_failed(key, value, error)
                    elif not done.done():  # its caller does not send the reply
                        done.set_exception(error)
                else:
                    self._written(key, value)
                    if done is not None and not done.done():
                        done.set_result(None)
                self._writes.popleft()
        finally:
            # Cancelled (a stop that did not wait for it): a mark still queued is not taken
            # (its reply is not sent), and not written later either.
            for _, _, done in self._writes:
                if done is not None and not done.done():
                    done.set_exception(RedisError("the reply writes stopped"))
            self._writes = deque(write for write in self._writes if write[2] is None)

    def _written(self, key: str, value: str | None) -> None:
        if value is None and not self._removal_queued(key, skip_first=True):
            self._undropped.discard(key)

    def _removal_queued(self, key: str, *, skip_first: bool = False) -> bool:
        """Whether a removal of `key` still waits in the queue (or is being written)."""
        writes = list(self._writes)[1:] if skip_first else self._writes
        return any(queued == key and value is None for queued, value, _ in writes)

    def _write_failed(self, key: str, value: str | None, error: Exception) -> None:
        if value is not None:  # kept to be sent (not a mark): a stop before it is sent loses it
            log.warning(
                "could not keep the unsent command reply in Redis (%s): a stop before it is"
                " sent loses it",
                type(error).__name__,
            )
            return
        # Still this instance's in Redis: never taken back here, removed again later.
        log.warning(
            "could not drop a sent command reply from Redis (%s); it is removed once Redis answers",
            type(error).__name__,
        )

    async def flush(self) -> None:
        """Wait for the writes queued so far (each bounded by the client's timeouts)."""
        writer = self._writer
        if writer is not None and not writer.done():
            await asyncio.gather(writer, return_exceptions=True)

    async def _drop_undropped(self) -> None:
        """Remove again the sent replies whose removal Redis did not take; raises
        `RedisError`."""
        if self._undropped:
            keys = sorted(self._undropped)
            await self._aio.hdel(self._key, *keys)
            # One whose queued removal is still to come stays: its `keep` may come first.
            self._undropped.difference_update(k for k in keys if not self._removal_queued(k))

    async def take(self, channels: Iterable[str]) -> dict[str, Any]:
        """The replies stopped instances left unsent on `channels`, now this instance's
        (idempotency key -> entry); raises `RedisError`."""
        names = sorted(channels)
        if not names:
            return {}
        await self._drop_undropped()
        now_ms = int(time.time() * 1000)
        self._forgotten = set()
        # Those sent whose removal is still to be written: the script may find them, and a
        # removal written before its answer is read takes them out of `_undropped`.
        unremoved = set(self._undropped)
        try:
            keys = [self._key, self._instances]
            args = [
                *(self._owner, now_ms, self._grace_ms, json.dumps(names)),
                *(int(STALE_AFTER_S * 1000), MAX_REPLY_BYTES, TAKE_PER_RENEWAL, MAX_TAKE_BYTES),
                *(MAX_OVER, NAMED_BYTES),
            ]
            # As bytes: an entry not UTF-8 (not written by an instance) must not fail the
            # renewal that takes it, and every one after (it is this instance's then).
            try:
                answer = await raw_answer(self._aio, "EVALSHA", self._take.sha, 2, *keys, *args)
            except NoScriptError:
                answer = await raw_answer(self._aio, "EVAL", _TAKE, 2, *keys, *args)
            forgotten = self._forgotten
        finally:
            self._forgotten = None
        found, over = answer
        for raw_key, size in zip(over[::2], over[1::2], strict=True):
            field, fix = delete_field_fix(self._key, raw_key)
            over_cap(
                self._key,
                f"the reply {field} holds {size} bytes, over the {MAX_REPLY_BYTES} taken",
                f"no instance writes one so large; {fix}",
                once=field,
            )
        taken: dict[str, Any] = {}
        for raw_key, raw in zip(found[::2], found[1::2], strict=True):
            key = utf8(self._key, raw_key.decode(errors="backslashreplace"), raw_key)
            sent = key in forgotten or key in unremoved or key in self._undropped
            if key is None or key in self._mine or sent:
                continue
            self._mine.add(key)
            try:
                taken[key] = json.loads(raw.decode())
            except ValueError:  # UnicodeDecodeError too
                taken[key] = None  # the scheduler logs and drops it
        return taken

    async def release(self) -> None:
        """Let go of this instance's unsent replies (it stops): the others take them at
        their next lease renewal. A Redis that does not answer leaves them to lapse with
        this instance's entry in `P:instances`."""
        try:
            # A keep written after the release would stay this instance's. Bounded: in an
            # outage each queued write waits its socket timeout, and a stop must not.
            async with asyncio.timeout(RELEASE_FLUSH_S):
                await self.flush()
        except TimeoutError:
            log.warning(
                "Redis did not take this instance's queued reply writes within %.0f s;"
                " stopping without them (another instance sends its unsent replies once this"
                " one's membership lapses)",
                RELEASE_FLUSH_S,
            )
            return
        try:
            await self._drop_undropped()  # sent: not to be handed over
            await self._release(keys=[self._key], args=[self._owner])
        except RedisError as error:
            log.warning(
                "could not hand this instance's unsent command replies over (%s); another"
                " instance sends them once this one's membership lapses",
                type(error).__name__,
            )
