"""`RedisStore`: the state of several `taskcard serve` instances in one shared Redis.

Why synchronous: `StateStore` is called directly from the event loop, and each call here is one
round trip (or one short Lua script) to a Redis that should sit next to the instances, well
under a millisecond; making the interface async would touch every caller in the data path for
no gain. A Redis that restarts is bridged by the client's retries (capped backoff), which
briefly hold the loop; a longer outage raises `redis.RedisError`, which the service's per-agent
and per-lane barriers catch and retry like any other failure.

The retries are bounded by time, not only by count (`BudgetRetry`): while a call retries, the
loop is held and nothing else runs, not even the SIGTERM handler. Twelve retries of a Redis
that does not answer at all (a host gone, a partition: every attempt waits out its socket
timeout) held the loop for half a minute per call; the budget keeps one call to a few seconds
whatever the failure looks like.

Read-modify-write steps (a notice recorded once cluster-wide, a resident's replacement) are
Lua scripts, so two instances never interleave inside one; a cursor changed from what was read
(`change_cursor`, the shared origin route book) is written by a compare-and-set on a version
kept beside it (`P:cursor-version:<field>`, see `change_cursor`), and a writer that keeps
losing to others takes the field's turn (`P:cursor-turn:<field>`) so that it is not starved.
Durability is Redis's: run it with `appendonly yes` so that an acknowledged write survives a
restart of Redis itself.

Layout under the prefix `P`: `P:res:<route>` hashes of resident fields (and the set
`P:residents`), hashes `P:prefs`, `P:offsets`, `P:cursors` (with `P:cursor-version:<field>`
and, while contended, `P:cursor-turn:<field>` for a cursor `change_cursor` writes), `P:pauses`,
`P:chats`, and for notices the hashes `P:n:text`, `P:n:state`, `P:n:at` keyed by route and id,
with the sorted set `P:n:pending` (by creation time) as the index of pending ones; sets
`P:set:<name>` (an index the service reads often, `StateStore.add_to_set`: the agents that owe
wakes); `P:sent:<channel>:<message id>` for each message posted on a platform whose replies do
not say who wrote the message replied to, expiring after `SENT_KEEP_S`; `P:nm:["<channel>",
"<chat>", "<message id>"]` (the agent a notice posted on any platform was about, so a reply to
it reaches that agent), expiring alike (kept when the agent leaves, see
`StateStore.remember_notice`).

Every value is read defensively: a field that does not parse (written by hand, by an older
version, or damaged) is logged once by its key and read as absent, so one bad entry never stops
an instance at start nor hides the good entries beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, TypeVar, cast

import redis
from redis.backoff import ExponentialBackoff
from redis.client import NEVER_DECODE
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from taskcard.bridge.store.base import (
    MAX_MEMBER_BYTES,
    SENT_KEEP_S,
    UNSURE_KEEP_PER_ROUTE,
    UNSURE_KEEP_S,
    ChatPrefs,
    InboxOutcome,
    InboxRecord,
    NoticeState,
    PendingNotice,
    ResidentRecord,
    SeenChat,
    StateFileError,
    StateStore,
    UnsureNotice,
    in_batches,
    shown_key,
    stored_time,
)

# Enough to ride out a Redis restart (a second or two) without failing the call...
_RETRIES = 12
# ...and never more than this in all: the loop waits for the call (see the module's doc).
RETRY_BUDGET_S = 3.0

T = TypeVar("T")

log = logging.getLogger(__name__)
_CORRUPT = (ValueError, TypeError, KeyError, AttributeError, RecursionError)
_reported: set[str] = set()


def _corrupt(key: str, field: str, why: str = "does not parse") -> None:
    """Log (once per key and field) that a stored value does not parse (or is not `why`)
    and is skipped."""
    where = f"{key} {field}".strip()
    if where not in _reported:
        _reported.add(where)
        log.warning("Redis %s: the stored value %s; it is ignored", shown_key(where, 300), why)


# Read as bytes, then as UTF-8 one entry at a time: a value (or field, or member) that is not
# (another instance's, a hand edit, a hostile writer with the Redis user's rights) must
# leave that entry out, not fail the whole reading. The client decodes every answer else.
RAW = {NEVER_DECODE: True}
NOT_UTF8 = "is not UTF-8"


def raw_answer(client: Any, *command: object) -> Any:
    """Redis's answer to `command` sent through `client` (a client or a pipeline), as bytes."""
    return client.execute_command(*command, **RAW)


def utf8(key: str, field: str, raw: bytes | str | None) -> str | None:
    """`raw` (read with `RAW`) as text; None when absent, or not UTF-8 (logged once, naming
    `key` and `field`)."""
    if raw is None or isinstance(raw, str):
        return raw
    try:
        return raw.decode()
    except UnicodeDecodeError:
        _corrupt(key, field, NOT_UTF8)
        return None


def _field_name(raw: bytes | str) -> str:
    """A field or member to name in a log line, whatever its bytes."""
    return raw if isinstance(raw, str) else raw.decode(errors="backslashreplace")


# The scripts that name what they leave out hand over at most this many bytes of a name.
NAMED_BYTES = 200


def delete_field_fix(key: str, raw: bytes | str) -> tuple[str, str]:
    """A field of the hash `key` as a log line shows it, and how to delete it: `HDEL` with
    its name when the line shows the name whole (a script hands over `NAMED_BYTES` of it at
    most), else how to find it by its start first."""
    name = _field_name(raw)
    shown = shown_key(name)
    cut = len(raw.encode() if isinstance(raw, str) else raw) >= NAMED_BYTES
    if not cut and shown == name and " " not in name and '"' not in name:
        return shown, f"delete it (HDEL {key} {name})"
    start = re.match(r"[^\s\\\"']*", name[:40])
    printable = "".join(c for c in (start.group() if start else "") if c.isprintable())
    pattern = re.sub(r"([*?\[\]])", r"\\\1", printable)
    return (
        f"{shown}... (its start)" if cut else shown,
        f"find it with HSCAN {key} 0 MATCH {pattern}* and delete it with HDEL",
    )


def readable(key: str, stored: Mapping[bytes, bytes]) -> dict[str, str]:
    """The fields and values of the hash `key` (read with `RAW`) that are UTF-8; the others
    are left out, each logged once."""
    found: dict[str, str] = {}
    for raw_field, raw_value in stored.items():
        field = utf8(key, _field_name(raw_field), raw_field)
        value = None if field is None else utf8(key, field, raw_value)
        if field is not None and value is not None:
            found[field] = value
    return found


def readable_members(key: str, members: Iterable[bytes]) -> list[str]:
    """The members (or fields, or values) of `key` (read with `RAW`) that are UTF-8, in
    order; the others are left out, each logged once."""
    found = []
    for raw in members:
        if (member := utf8(key, _field_name(raw), raw)) is not None:
            found.append(member)
    return found


# Bounded reads of what every instance reads again and again (at each lease renewal, each
# command): any writer with the Redis user's rights can make a value, a hash or a listing
# huge, and every instance would read and parse it each time. Each is read by a script that
# hands over only what fits its caps, and names what it left out (logged once by `over_cap`).

# The most live instances read of a listing (`P:instances`, `P:versioned`), and the most bytes
# of a member: a name is at most 73 (the instance's 64, `#` and 8 hex digits). A fleet has a
# few dozen; a member past these is no instance's.
MAX_LIVE = 1_000
MAX_OWNER_BYTES = 1_024
# The most bytes read of one field and value of the shared state's hashes read whole (the
# inbox's records, the pauses, the chats seen, a resident): each is a few hundred bytes.
MAX_STATE_VALUE_BYTES = 1024 * 1024

# The most values over their cap named by one read (the others are left out all the same).
MAX_OVER = 10

# KEYS: strings; ARGV[1]: the most bytes read of one. Each value as it is stored, or its
# length when over the cap, or false when it is missing or not a string.
CAPPED_GET = """
local found = {}
for i, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok ~= 'string' then
    found[i] = false
  else
    local size = redis.call('STRLEN', key)
    if size > tonumber(ARGV[1]) then found[i] = size else found[i] = redis.call('GET', key) end
  end
end
return found
"""

# KEYS[1]: a hash; ARGV: the most bytes of one field and its value, the most fields, the most
# bytes in all, the most fields over the first cap named. Returns {field, value, ...}, {the
# first 200 bytes of each field over the first cap, its size, ...} (those past the names are
# left out unnamed), and 1 when fields were left for want of room (else 0). Read by
# HSCAN pages, so a hash of millions of fields is not loaded whole.
CAPPED_HASH = """
local most, fields, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local found, over, kept, spent, left = {}, {}, 0, 0, 0
local named = tonumber(ARGV[4])
local cursor = '0'
repeat
  local page = redis.call('HSCAN', KEYS[1], cursor, 'COUNT', 500)
  cursor = page[1]
  local entries = page[2]
  for i = 1, #entries, 2 do
    local size = #entries[i] + #entries[i + 1]
    if size > most then
      if #over < 2 * named then
        over[#over + 1] = string.sub(entries[i], 1, tonumber(ARGV[5]))
        over[#over + 1] = size
      end
    elseif kept < fields and spent + size <= budget then
      found[#found + 1] = entries[i]
      found[#found + 1] = entries[i + 1]
      kept, spent = kept + 1, spent + size
    else
      left = 1
    end
  end
until cursor == '0' or left == 1
return {found, over, left}
"""

# KEYS[1]: a sorted set of instances; ARGV: the lowest score (now), the most members, the
# most bytes of one. Returns the members scored from then on, at most that many, and how many
# were over the size (left out), and 1 when members were left for want of room (else 0).
CAPPED_LIVE = """
local most, size = tonumber(ARGV[2]), tonumber(ARGV[3])
local listed = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf', 'LIMIT', 0, most + 1)
local found, over, left = {}, 0, 0
for i, member in ipairs(listed) do
  if i > most then left = 1
  elseif #member > size then over = over + 1
  else found[#found + 1] = member end
end
return {found, over, left}
"""


def capped_get(client: Any, keys: list[str], most: int) -> Any:
    """`CAPPED_GET` of `keys` through `client` (a client or a pipeline, awaited if async)."""
    return raw_answer(client, "EVAL", CAPPED_GET, len(keys), *keys, most)


def capped_hash(client: Any, key: str, most: int, fields: int, budget: int) -> Any:
    """`CAPPED_HASH` of `key` through `client` (awaited if async); `capped_fields` reads it."""
    return raw_answer(
        client, "EVAL", CAPPED_HASH, 1, key, most, fields, budget, MAX_OVER, NAMED_BYTES
    )


def capped_live(client: Any, key: str, now_ms: int) -> Any:
    """`CAPPED_LIVE` of `key` through `client` (awaited if async); `live_members` reads it."""
    return raw_answer(client, "EVAL", CAPPED_LIVE, 1, key, now_ms, MAX_LIVE, MAX_OWNER_BYTES)


def over_cap(key: str, what: str, fix: str, *, once: str = "") -> None:
    """Log once per key and `once` (else `what`, which may carry a size that changes) that
    a value over its cap was left out of a read."""
    where = f"{key} {once or what} over the read"
    if where not in _reported:
        _reported.add(where)
        log.warning("Redis key %s: %s; it is left out of what is read; %s", key, what, fix)


def capped_fields(key: str, answer: Any, most: int, fields: int, budget: int) -> dict[str, str]:
    """The UTF-8 fields and values of the hash `key` that `CAPPED_HASH` handed over; those
    over a cap are named once (`over_cap`)."""
    found, over, left = answer
    for raw_field, size in zip(over[::2], over[1::2], strict=True):
        field, fix = delete_field_fix(key, raw_field)
        over_cap(
            key,
            f"field {field} holds {size} bytes, over the {most} read of one",
            f"no instance writes one so large; {fix}",
            once=f"field {field}",
        )
    if left:
        over_cap(
            key,
            f"more than {fields} fields or {budget} bytes",
            f"the fields past that are not read; delete the fields no instance wrote ({key})",
        )
    return readable(key, dict(zip(found[::2], found[1::2], strict=True)))


def live_members(key: str, answer: Any) -> tuple[list[str], bool]:
    """The UTF-8 members `CAPPED_LIVE` handed over of `key`, and whether every live one was
    (none left for want of room: a caller that must see them all can tell; one over the size
    is no instance's name)."""
    found, over, left = answer
    if over:
        over_cap(
            key,
            f"{over} members over {MAX_OWNER_BYTES} bytes",
            f"no instance writes such a name; remove them (ZREM {key} ...)",
            once="members over",
        )
    if left:
        over_cap(
            key,
            f"more than {MAX_LIVE} live members",
            f"the members past that are not read; remove those no instance wrote (ZREM {key} ...)",
        )
    return readable_members(key, found), not left


def wrong_type(key: str, found: str, expected: str) -> str:
    """What to do about a key of the fleet that holds another Redis type than taskcard's."""
    return (
        f"the Redis key {key} is a {found}, not the {expected} taskcard keeps there (something"
        f" else uses this prefix); delete it (DEL {key}) or give the fleet another"
        " cluster.key_prefix"
    )


_NOPERM_COMMAND = re.compile(r"permissions to run the '([a-z|_-]+)' command")


def refused_permission(error: redis.RedisError) -> tuple[str, str] | None:
    """When `error` is an ACL refusal (NOPERM, or a script's call refused): what the Redis
    user of the cluster may not use ("the command HSET") and the ACL rule that grants it
    ("+hset"); None for any other error."""
    text = str(error)
    if isinstance(error, redis.exceptions.NoPermissionError):
        if found := _NOPERM_COMMAND.search(text):
            name = found.group(1)
            return f"the command {name.replace('|', ' ').upper()}", f"+{name}"
        if "channels" in text:
            return "the fleet's channels", "&<key_prefix>:*"
        if "keys" in text:
            return "the fleet's keys", "~<key_prefix>:*"
        return "a command the service needs", "+@all"
    if text.startswith("EXEC without MULTI"):  # redis-py's word for a MULTI refused
        return "the command MULTI", "+multi"
    if "can't run this command" in text and "script" in text:
        return "a command one of the service's scripts calls", "+@all"
    return None


def permission_fix(refused: Iterable[tuple[str, str]]) -> str:
    """What to do about the refusals `refused_permission` found."""
    found = list(refused)
    what = ", ".join(dict.fromkeys(what for what, _ in found))
    grant = " ".join(dict.fromkeys(rule for _, rule in found))
    return (
        f"the Redis user of [cluster] may not use {what} (NOPERM): grant it"
        f" (ACL SETUSER <user> {grant}; docs/operators.md, section 8 lists what the fleet needs)"
    )


def redis_trouble(error: redis.RedisError) -> str:
    """What a Redis failure is and what the operator does about it, in a few words (never the
    error's own text, which can quote a key or a URL)."""
    code = type(error).__name__
    if isinstance(error, redis.BusyLoadingError):
        return "Redis is loading its data (LOADING): wait until it has"
    if isinstance(error, RedisConnectionError | RedisTimeoutError):
        return f"Redis is out of reach ({code}): check that it runs and this host reaches it"
    if isinstance(error, redis.ReadOnlyError):
        return (
            "Redis is a read-only replica (READONLY): point the cluster's Redis URL at the primary"
        )
    if isinstance(error, redis.OutOfMemoryError):
        return "Redis is out of memory (OOM): raise its maxmemory or free memory there"
    if (refused := refused_permission(error)) is not None:
        return permission_fix([refused])
    for prefix, meaning in _REFUSALS:
        if answered(error, prefix):
            return meaning
    return f"Redis refused the call ({code}); see the Redis server's log"


_SCRIPT_ERROR = re.compile(
    r"(?:ERR )?Error running script \(call to [^)]*\): (?:@user_script:\d+: )?"
)


def answered(error: BaseException, code: str) -> bool:
    """Whether Redis answered `error` with the error `code` (WRONGTYPE, NOREPLICAS...): as
    the command's answer, or as a command's inside one of our scripts, which Redis before 7.0
    wraps in "ERR Error running script (call to f_...): @user_script:N: WRONGTYPE ..." (7.0
    and later pass it on as it is; redis-py drops the leading "ERR ")."""
    text = _SCRIPT_ERROR.sub("", str(error), count=1)
    return text.startswith(code + " ") or text == code


_REFUSALS = (
    (
        "NOREPLICAS",
        "Redis refuses writes for want of replicas (NOREPLICAS): check its replicas or"
        " min-replicas-to-write",
    ),
    ("MISCONF", "Redis cannot save to disk (MISCONF): fix its disk or its save settings"),
    (
        "WRONGTYPE",
        "a key of the fleet holds another Redis type (WRONGTYPE): something else uses this"
        " cluster.key_prefix; delete its keys there or give the fleet another key_prefix",
    ),
    ("BUSY", "Redis is busy running a script (BUSY): wait, or end the script there"),
)


class WrongKeyType(redis.RedisError, StateFileError):
    """A key of the fleet holds another type (left by another program on the prefix);
    the message names it and the fix (`wrong_type`). A `StateFileError` too, so `taskcard
    status` says it in one line, as it does an unusable state file."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key  # the key, when one key is at fault

    @classmethod
    def of(cls, client: redis.Redis, key: str, expected: str) -> WrongKeyType:
        """The error for `key`, found holding another type than `expected`."""
        return cls(wrong_type(key, str(client.type(key)), expected), key)


# ARGV[4], the time of the call, is the same in each attempt of one call (the client's retries
# send it again as it was): a record with it is this call's, written by an attempt whose
# answer was lost (Redis took it, then answered after the socket's timeout), not a replay.
_ADD_NOTICE = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  if redis.call('HGET', KEYS[3], ARGV[1]) == ARGV[4] then return 1 end
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
if ARGV[3] == 'pending' then redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1]) end
return 1
"""

_NOTICE_STATE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[2] == 'pending' then
  redis.call('ZADD', KEYS[2], redis.call('HGET', KEYS[3], ARGV[1]), ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
end
if ARGV[2] == 'unsure' then
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
else
  redis.call('ZREM', KEYS[4], ARGV[1])
end
return 1
"""

# A send begins: the notice is recorded unsure only while it is still pending, in one step,
# so that of two instances that both queued it (the lease of its agent moved meanwhile) one
# sends it. KEYS: the state hash, the pending and unsure sets; ARGV: member, time.
_NOTICE_UNSURE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= 'pending' then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], 'unsure')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return 1
"""

# Forget the unsure notices ARGV names, each only while it is still unsure (read before): each
# is failed, its text gone, its id kept (so that the same notice read again is not taken as new
# and sent a second time, `add_notice`).
# KEYS: the notices' text, state and time hashes, then the unsure set.
_PRUNE_UNSURE = """
for _, member in ipairs(ARGV) do
  if redis.call('HGET', KEYS[2], member) == 'unsure' then
    redis.call('HSET', KEYS[1], member, '')
    redis.call('HSET', KEYS[2], member, 'failed')
    redis.call('ZREM', KEYS[4], member)
  end
end
return 1
"""

# replace_message: the fingerprint stays only when the id stays; without an id the send key
# goes too (the replacement is a new send with a new key).
# ARGV: message id, stale id ('' for None each), route.
_REPLACE = """
local current = redis.call('HGET', KEYS[1], 'message_id') or ''
if ARGV[1] == '' then redis.call('HDEL', KEYS[1], 'message_id')
else redis.call('HSET', KEYS[1], 'message_id', ARGV[1]) end
if ARGV[2] == '' then redis.call('HDEL', KEYS[1], 'stale_message_id')
else redis.call('HSET', KEYS[1], 'stale_message_id', ARGV[2]) end
if current ~= ARGV[1] then redis.call('HDEL', KEYS[1], 'fingerprint') end
if ARGV[1] == '' then redis.call('HDEL', KEYS[1], 'send_key') end
redis.call('SADD', KEYS[2], ARGV[3])
return 1
"""

# change_cursor's write (see `RedisStore.change_cursor`): a compare-and-set on the field's
# version, and on its value too while a writer of an older version may be live (named by its
# SHA-1, '' for a field not set), refused while another writer holds the field's turn; moves the
# version on and gives back a turn the writer held. A turn without a lapse, or with a longer one
# than any writer gives it, was not set by a writer: it is ignored and cleared.
# KEYS: the cursors, the field's version, the field's turn.
# ARGV: field, the version read ('' for none), the value's SHA-1 ('-' when the version alone
# decides), the new value, the writer's token, TURN_MS.
# Answers 1 when written, 0 when another writer wrote meanwhile, -1 when another holds the turn,
# -2 when another writer wrote meanwhile though this one held the turn throughout (one that
# ignores turns: an older release).
_CHANGE_FIELD = """
local turn = redis.call('GET', KEYS[3])
if turn and turn ~= ARGV[5] then
  local left = redis.call('PTTL', KEYS[3])
  if left >= 0 and left <= tonumber(ARGV[6]) then return -1 end
end
local beaten = (turn == ARGV[5]) and -2 or 0
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[2] then return beaten end
if ARGV[3] ~= '-' then
  local current = redis.call('HGET', KEYS[1], ARGV[1])
  if (current and redis.sha1hex(current) or '') ~= ARGV[3] then return beaten end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
redis.call('INCR', KEYS[2])
if turn then redis.call('DEL', KEYS[3]) end
return 1
"""
# KEYS: a key held under a token (a lease, a cursor's turn); ARGV: the token. Deletes it only
# while it is still held under that token (not once it lapsed and another took it).
RELEASE_IF_HELD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: the cursors, the field's version. ARGV: field, the value expected, the new value, '1'
# to write it ('0' to delete the field). Writes only while the field still holds the value
# expected (not while absent); the version goes as `set_cursor` and `delete_cursors` drop it.
CURSOR_IF_UNCHANGED = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
else redis.call('HDEL', KEYS[1], ARGV[1]) end
redis.call('DEL', KEYS[2])
return 1
"""
# A change_cursor that lost this many tries in a row to other writers takes the field's turn:
# the others wait for it (see `RedisStore.change_cursor`).
CLAIM_AFTER = 3
# How long a turn is held at most. A merge takes milliseconds; a writer that took the turn and
# stopped (killed, its host gone) holds up the field's other writers this long. A turn that
# lapses under a slow writer costs it nothing unless another writer takes the turn meanwhile.
TURN_MS = 500
# How long one change_cursor keeps at it (losing to writers, waiting out others' turns) before
# it gives up: the event loop is held meanwhile, so no longer than a call's retries may hold it
# (`RETRY_BUDGET_S`, see the module's docstring).
CHANGE_BUDGET_S = RETRY_BUDGET_S
# The first and longest pause while another writer holds the field's turn.
TURN_POLL_S, TURN_POLL_MAX_S = 0.001, 0.02


class CursorContended(redis.RedisError):
    """`change_cursor` found the cursor changed by other writers, or their turn held, for
    the whole of `CHANGE_BUDGET_S`."""


class BudgetRetry(Retry):
    """redis-py's retry, plus a time budget: no new attempt once `budget_s` has passed since
    the first, or would pass during the backoff before it. The count alone bounds a Redis that
    refuses connections (each attempt fails at once) but not one that does not answer (each
    attempt waits its socket timeout)."""

    def __init__(
        self,
        retries: int,
        *,
        budget_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            ExponentialBackoff(cap=0.5, base=0.05),
            retries,
            supported_errors=(RedisConnectionError, RedisTimeoutError, ConnectionError),
        )
        self.budget_s = budget_s
        self._clock = clock
        self._sleep = sleep

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        self._backoff.reset()  # type: ignore[no-untyped-call]
        started = self._clock()
        failures = 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if is_retryable is not None and not is_retryable(error):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                delay_s = self._backoff.compute(failures)
                spent_s = self._clock() - started
                if failures > self._retries or spent_s + delay_s >= self.budget_s:
                    raise error
                if delay_s > 0:
                    self._sleep(delay_s)


def raise_if_cancel_swallowed() -> None:
    """Raise `CancelledError` when the current task was cancelled and no `CancelledError`
    reached it: redis-py's asyncio client can swallow one that lands in a call (in a
    timeout's exit). A loop that catches a call's errors and goes on checks this each turn,
    or whoever cancelled it (a stop) waits for it forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def connect(
    url: str, *, timeout_s: float = 2.0, retry_budget_s: float = RETRY_BUDGET_S
) -> redis.Redis:
    """A synchronous client for `url` that retries through a short outage, for at most
    `retry_budget_s` per call."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=BudgetRetry(_RETRIES, budget_s=retry_budget_s),
        health_check_interval=10,
    )


def _glob(text: str) -> str:
    """`text` as a literal in a MATCH pattern (a glob: its own glob characters escaped)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _member(*parts: str) -> str:
    """One hash field or set member for a tuple of strings (any characters allowed)."""
    return json.dumps(parts, ensure_ascii=False)


def _parts(member: str, count: int) -> list[str] | None:
    """The `count` strings of a member written by `_member`; None when it is not one."""
    try:
        value = json.loads(member)
    except _CORRUPT:
        return None
    if not isinstance(value, list) or len(value) != count:
        return None
    return [str(part) for part in value]


def _object(raw: str | None) -> dict[str, Any] | None:
    """A JSON object, or None when absent or not one."""
    try:
        data = None if raw is None else json.loads(raw)
    except _CORRUPT:
        return None
    return data if isinstance(data, dict) else None


class RedisStore(StateStore):
    """Every `StateStore` call against one Redis, keys under `prefix`."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._r = client
        self._p = prefix
        self._add_notice = client.register_script(_ADD_NOTICE)
        self._notice_state = client.register_script(_NOTICE_STATE)
        self._notice_unsure = client.register_script(_NOTICE_UNSURE)
        self._prune_unsure = client.register_script(_PRUNE_UNSURE)
        self._replace = client.register_script(_REPLACE)
        self._change_field = client.register_script(_CHANGE_FIELD)
        self._release_if_held = client.register_script(RELEASE_IF_HELD)
        self._cursor_if_unchanged = client.register_script(CURSOR_IF_UNCHANGED)

    @property
    def client(self) -> redis.Redis:
        return self._r

    def key(self, *parts: str) -> str:
        return ":".join((self._p, *parts))

    def close(self) -> None:
        self._r.close()

    # Reads of what any instance (or anyone with the Redis user's rights) may have written:
    # an entry that is not UTF-8 is left out, logged once (`utf8`), as one that does not
    # parse is.

    def _hget(self, key: str, field: str) -> str | None:
        return utf8(key, field, raw_answer(self._r, "HGET", key, field))

    def _hmget(self, key: str, fields: list[str]) -> list[str | None]:
        found = raw_answer(self._r, "HMGET", key, *fields)
        return [utf8(key, field, raw) for field, raw in zip(fields, found, strict=True)]

    def _hgetall(self, key: str) -> dict[str, str]:
        """The hash `key` whole but for a value over `MAX_STATE_VALUE_BYTES` (named once):
        the inbox is read at each takeover and each clustered `/taskcard cancel`, the
        pauses at each metrics scrape."""
        caps = (MAX_STATE_VALUE_BYTES, 2**31, 2**53)  # no count: each message counts
        return capped_fields(key, capped_hash(self._r, key, *caps), *caps)

    def _listed(self, key: str, *command: object) -> list[str]:
        """The UTF-8 entries of the list `command` (naming `key`) answers."""
        return readable_members(key, raw_answer(self._r, *command))

    def _scanned(self, command: str, key: str, match: str | None) -> Iterator[Any]:
        """What each call of the scan `command` (HSCAN, SSCAN) of `key` answers, as bytes."""
        cursor = 0
        while True:
            where = ("MATCH", match) if match else ()
            cursor, found = raw_answer(self._r, command, key, cursor, *where, "COUNT", 500)
            yield found
            if cursor == 0:
                return

    def _hscan(self, key: str, match: str | None = None) -> Iterator[tuple[str, str]]:
        """As `hscan_iter`, the entries that are UTF-8."""
        for found in self._scanned("HSCAN", key, match):
            yield from readable(key, found).items()

    def _sscan(self, key: str, match: str | None = None) -> Iterator[str]:
        """As `sscan_iter`, the members that are UTF-8."""
        for found in self._scanned("SSCAN", key, match):
            yield from readable_members(key, found)

    # Residents -----------------------------------------------------------------------------

    def _res(self, route: str) -> str:
        return self.key("res", route)

    def _update(self, route: str, set_: dict[str, str], delete: tuple[str, ...] = ()) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.sadd(self.key("residents"), route)
        if set_:
            pipe.hset(self._res(route), mapping=cast(dict[Any, Any], set_))
        if delete:
            pipe.hdel(self._res(route), *delete)
        pipe.hset(self._res(route), "route", route)
        pipe.execute()

    def resident(self, route: str) -> ResidentRecord | None:
        """The route's record; `WrongKeyType` when its key holds something not ours (read
        as absent, a second resident would be posted and its id could not be kept)."""
        key = self._res(route)
        try:
            data = self._hgetall(key)
        except redis.ResponseError as error:
            if not answered(error, "WRONGTYPE"):
                raise
            raise WrongKeyType.of(self._r, key, "hash") from None
        return _record(key, route, data) if data else None

    def residents(self) -> list[ResidentRecord]:
        """Every resident, read in batches (`residents_of`): a start reads them all, and one
        round trip per resident made that minutes on a large fleet."""
        key = self.key("residents")
        routes = sorted(self._listed(key, "SMEMBERS", key))
        return list(self.residents_of(routes).values())

    def residents_of(self, routes: Iterable[str]) -> dict[str, ResidentRecord]:
        """As `resident` of each, one round trip per batch (`WrongKeyType` alike)."""
        found: dict[str, ResidentRecord] = {}
        for batch in in_batches(dict.fromkeys(routes)):
            pipe = self._r.pipeline(transaction=False)
            for route in batch:
                raw_answer(pipe, "HGETALL", self._res(route))
            answers = pipe.execute(raise_on_error=False)
            for route, data in zip(batch, answers, strict=True):
                if isinstance(data, redis.ResponseError):
                    if not answered(data, "WRONGTYPE"):
                        raise data
                    raise WrongKeyType.of(self._r, self._res(route), "hash")
                if isinstance(data, Exception):
                    raise data
                if stored := readable(self._res(route), data):
                    found[route] = _record(self._res(route), route, stored)
        return found

    def set_message_id(self, route: str, message_id: str | None) -> None:
        if message_id is None:
            self._update(route, {}, ("message_id", "fingerprint", "send_key"))
        else:
            self._update(
                route, {"message_id": message_id, "unsure_sends": "0"}, ("fingerprint", "send_key")
            )

    def replace_message(
        self, route: str, *, message_id: str | None = None, stale_message_id: str | None = None
    ) -> None:
        self._replace(
            keys=[self._res(route), self.key("residents")],
            args=[message_id or "", stale_message_id or "", route],
        )
        self._r.hset(self._res(route), "route", route)

    def set_send_key(self, route: str, key: str | None) -> None:
        if key is None:
            self._update(route, {}, ("send_key",))
        else:
            self._update(route, {"send_key": key})

    def set_unsure_sends(self, route: str, count: int, at: float | None) -> None:
        if at is None:
            self._update(route, {"unsure_sends": str(count)}, ("unsure_at",))
        else:
            self._update(route, {"unsure_sends": str(count), "unsure_at": repr(at)})

    def before_send(
        self, route: str, send_key: str | None, unsure: tuple[int, float | None] | None
    ) -> None:
        fields: dict[str, str] = {}
        gone: tuple[str, ...] = ()
        if send_key is not None:
            fields["send_key"] = send_key
        if unsure is not None:
            fields["unsure_sends"] = str(unsure[0])
            if unsure[1] is None:
                gone = ("unsure_at",)
            else:
                fields["unsure_at"] = repr(unsure[1])
        if fields:
            self._update(route, fields, gone)

    def set_pin_owed(self, route: str, message_id: str | None) -> None:
        if message_id is None:
            self._update(route, {}, ("pin_owed_id",))
        else:
            self._update(route, {"pin_owed_id": message_id})

    def set_committed(self, route: str, fingerprint: str, at: float) -> None:
        self._update(route, {"fingerprint": fingerprint, "committed_at": repr(at)})

    def set_disabled(self, route: str, reason: str | None) -> None:
        if reason is None:
            self._update(route, {}, ("disabled_reason",))
        else:
            self._update(route, {"disabled_reason": reason})

    # Preferences ---------------------------------------------------------------------------

    def prefs(self, scope: str) -> ChatPrefs:
        raw = self._hget(self.key("prefs"), scope)
        if raw is None:
            return ChatPrefs()
        data = _object(raw)
        if data is None:
            _corrupt(self.key("prefs"), scope)
            return ChatPrefs()
        rows = data.get("activity_rows")
        return ChatPrefs(
            hidden=bool(data.get("hidden")),
            activity_rows=rows if isinstance(rows, int) and not isinstance(rows, bool) else None,
        )

    def set_prefs(self, scope: str, prefs: ChatPrefs) -> None:
        value = json.dumps({"hidden": prefs.hidden, "activity_rows": prefs.activity_rows})
        self._r.hset(self.key("prefs"), scope, value)

    # Notices -------------------------------------------------------------------------------

    def _notice_keys(self) -> list[str]:
        return [self.key("n", "text"), self.key("n", "state"), self.key("n", "at")]

    def add_notice(self, route: str, notice_id: str, text: str, state: NoticeState) -> bool:
        keys = [*self._notice_keys(), self.key("n", "pending")]
        added = self._add_notice(
            keys=keys, args=[_member(route, notice_id), text, state, repr(time.time())]
        )
        return bool(added)

    def pending_notices(self, route: str | None = None) -> list[PendingNotice]:
        pending = self.key("n", "pending")
        members = self._listed(pending, "ZRANGE", pending, 0, -1)
        if not members:
            return []
        text_key = self.key("n", "text")
        texts = raw_answer(self._r, "HMGET", text_key, *members)
        ats = self._hmget(self.key("n", "at"), members)
        found = []
        for member, raw_text, at in zip(members, texts, ats, strict=True):
            parts = _parts(member, 2)
            if parts is None:
                _corrupt(self.key("n", "pending"), member)
                continue
            text = utf8(text_key, member, raw_text)
            if text is None and raw_text is not None:
                continue  # not UTF-8 (logged): nothing to send
            notice_route, notice_id = parts
            if route is not None and notice_route != route:
                continue
            created = stored_time(at) or 0.0
            found.append(PendingNotice(notice_route, notice_id, text or "", created))
        return sorted(found, key=lambda n: (n.created_at, n.notice_id))

    def set_notice_state(self, route: str, notice_id: str, state: NoticeState) -> None:
        keys = [
            self.key("n", "state"),
            self.key("n", "pending"),
            self.key("n", "at"),
            self.key("n", "unsure"),  # when each unsure notice became so, for status
        ]
        self._notice_state(keys=keys, args=[_member(route, notice_id), state, repr(time.time())])

    def mark_notice_unsure(self, route: str, notice_id: str) -> bool:
        keys = [self.key("n", "state"), self.key("n", "pending"), self.key("n", "unsure")]
        marked = self._notice_unsure(keys=keys, args=[_member(route, notice_id), repr(time.time())])
        return bool(marked)

    def unsure_notices(self, route: str | None = None) -> list[UnsureNotice]:
        unsure = self.key("n", "unsure")
        # The client answers (member, score) pairs, the score a float.
        listed = raw_answer(self._r, "ZRANGE", unsure, 0, -1, "WITHSCORES")
        pairs = [
            (member, score)
            for raw, score in listed
            if (member := utf8(unsure, _field_name(raw), raw)) is not None
        ]
        if not pairs:
            return []
        members, scores = [m for m, _ in pairs], [score for _, score in pairs]
        text_key = self.key("n", "text")
        texts = raw_answer(self._r, "HMGET", text_key, *members)
        found = []
        for member, score, raw_text in zip(members, scores, texts, strict=True):
            parts = _parts(member, 2)
            if parts is None:
                _corrupt(unsure, member)
                continue
            notice_route, notice_id = parts
            if route is not None and notice_route != route:
                continue
            text = utf8(text_key, member, raw_text)
            found.append(UnsureNotice(notice_route, notice_id, text or "", stored_time(score)))
        return found

    def prune_unsure_notices(self, now: float, route: str | None = None) -> None:
        unsure = self.key("n", "unsure")
        listed = raw_answer(self._r, "ZRANGE", unsure, 0, -1, "WITHSCORES")
        kept: dict[str, int] = {}
        doomed = []
        # The newest first, as `SqliteStore.prune_unsure_notices` counts them.
        for raw, score in sorted(listed, key=lambda pair: (pair[1], pair[0]), reverse=True):
            member = utf8(unsure, _field_name(raw), raw)
            parts = None if member is None else _parts(member, 2)
            if member is None or parts is None:
                continue  # (logged by `unsure_notices`)
            if route is None or parts[0] == route:
                kept[parts[0]] = kept.get(parts[0], 0) + 1
                if kept[parts[0]] > UNSURE_KEEP_PER_ROUTE:
                    doomed.append(member)
                    continue
            if score < now - UNSURE_KEEP_S:
                doomed.append(member)
        for batch in in_batches(doomed):
            self._prune_unsure(keys=[*self._notice_keys(), unsure], args=batch)

    def notice_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        states = self.key("n", "state")
        for state in self._listed(states, "HVALS", states):
            counts[state] = counts.get(state, 0) + 1
        return counts

    # Offsets and cursors -------------------------------------------------------------------

    def get_offset(self, agent_id: str, name: str) -> tuple[int, int] | None:
        raw = self._hget(self.key("offsets"), _member(agent_id, name))
        if raw is None:
            return None
        inode, _, offset = raw.partition(":")
        try:
            return int(inode), int(offset)
        except ValueError:
            _corrupt(self.key("offsets"), _member(agent_id, name))
            return None

    def set_offset(self, agent_id: str, name: str, inode: int, offset: int) -> None:
        self._r.hset(self.key("offsets"), _member(agent_id, name), f"{inode}:{offset}")

    def get_offsets(
        self, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, int]]:
        """As `get_offset` of each (a value that does not parse is absent), one HMGET per
        batch."""
        found: dict[tuple[str, str], tuple[int, int]] = {}
        for batch in in_batches(dict.fromkeys(keys)):
            members = [_member(agent_id, name) for agent_id, name in batch]
            values = self._hmget(self.key("offsets"), members)
            for key, member, raw in zip(batch, members, values, strict=True):
                if raw is None:
                    continue
                inode, _, offset = raw.partition(":")
                try:
                    found[key] = (int(inode), int(offset))
                except ValueError:
                    _corrupt(self.key("offsets"), member)
        return found

    # Messages sent where a reply does not say who wrote the message ------------------------

    def remember_sent(self, channel: str, message_id: str, at: float) -> None:
        del at  # Redis keeps the time: the key expires after SENT_KEEP_S
        self._r.set(self.key("sent", channel, message_id), "1", ex=int(SENT_KEEP_S))

    def sent_any(self, channel: str, message_ids: Iterable[str], now: float) -> bool:
        del now
        keys = [self.key("sent", channel, message_id) for message_id in set(message_ids)]
        return bool(keys) and int(self._r.exists(*keys)) > 0

    def remember_notice(
        self, channel: str, chat_id: str, message_id: str, agent_id: str, at: float
    ) -> None:
        del at  # Redis keeps the time: the key expires after SENT_KEEP_S
        key = self.key("nm", _member(channel, chat_id, message_id))
        self._r.set(key, agent_id, ex=int(SENT_KEEP_S))

    def notice_agent(
        self, channel: str, chat_id: str, message_ids: Iterable[str], now: float
    ) -> str | None:
        del now
        keys = [self.key("nm", _member(channel, chat_id, m)) for m in dict.fromkeys(message_ids)]
        found = raw_answer(self._r, "MGET", *keys) if keys else []
        agents = (utf8(key, "", raw) for key, raw in zip(keys, found, strict=True))
        return next((agent for agent in agents if agent), None)

    def get_cursor(self, key: str) -> str | None:
        return self._hget(self.key("cursors"), key)

    def set_cursor(self, key: str, value: str) -> None:
        # Written without a version (a change under way sees its version go): the next
        # `change_cursor` compares the value itself.
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(self.key("cursors"), key, value)
        pipe.delete(self._version_key(key))
        pipe.execute()

    def _version_key(self, key: str) -> str:
        return self.key("cursor-version", key)

    def change_cursor(self, key: str, change: Callable[[str | None], str]) -> None:
        """Change the field from the value it holds: a compare-and-set, so a writer that came
        in between is seen and the change made again on what it wrote, never written over it.

        Each change moves on a version kept beside the value, a key of its own
        (`P:cursor-version:<field>`): read the version and the value, make the change, and
        write it with a script that refuses when the version moved meanwhile. What it costs
        Redis is the write's, whatever the value's size (comparing the value by its SHA-1
        held Redis about 5 ms per change of a 5,000-entry origin book). Not a version of the
        hash of cursors: every instance's other cursors change it all the time.

        A compare-and-set alone lets a writer starve: one that writes without pause wins every
        race against one whose read, change and write take longer (a larger change, a busier
        host), since each of its writes lands inside the other's try. A writer that lost
        `CLAIM_AFTER` tries in a row takes the field's turn (`P:cursor-turn:<field>`, its
        token, lapsing after `TURN_MS`): the others' writes are refused while it is held, and
        they wait until the turn's writer gives it back with its write. Only a writer that
        ignores turns (an older version) can beat the turn's writer; one that loses while
        holding the turn gives it back and does not take it again, so as not to hold up the
        writers that do wait. An uncontended change reads the turn in the same round trip as
        the version and the value, and costs nothing more.

        The value itself is compared as well when the version cannot tell: the field has no
        version (stored by an older version, or by `set_cursor`, which drops it) or a live
        instance is listed in `P:instances` but not in `P:versioned`, which every instance of
        this version lists itself in first: an older version, which writes the value without
        moving the version. What is not seen: a write of an older version not listed as live
        (one whose listing lapsed while it stalled, or one too old to list itself) made
        between this change's read and its write.

        Gives up with `CursorContended` after `CHANGE_BUDGET_S`: the loop is held meanwhile.
        A change Redis applied but whose answer was lost is made again on what it wrote, so a
        change must be one that can be made twice (the origin book's merge is)."""
        turn_key = self.key("cursor-turn", key)
        token = uuid.uuid4().hex
        deadline = time.monotonic() + CHANGE_BUDGET_S
        lost, pause, may_claim, claimed = 0, TURN_POLL_S, True, False
        while True:
            try:
                written, beaten = self._try_change(key, change, turn_key, token)
            except (redis.ConnectionError, redis.TimeoutError):
                raise  # a turn taken lapses by itself: no retries against a Redis gone
            except BaseException:
                if claimed:
                    self._give_turn_back(turn_key, token)
                raise
            if written:
                return
            if time.monotonic() >= deadline:
                if claimed:
                    self._give_turn_back(turn_key, token)
                raise CursorContended(
                    f"the cursor {shown_key(key)} was changed by other instances, or held by"
                    f" their turn, for {CHANGE_BUDGET_S:g} s of tries to change it; it is"
                    " left as they wrote it"
                )
            if written is None:  # another writer's turn: wait until it is given back
                time.sleep(pause)
                pause = min(pause * 2, TURN_POLL_MAX_S)
                continue
            lost += 1
            if beaten:  # under our own turn: by a writer that ignores turns
                self._give_turn_back(turn_key, token)
                may_claim = claimed = False
            elif may_claim and lost >= CLAIM_AFTER:
                claimed = bool(self._r.set(turn_key, token, nx=True, px=TURN_MS)) or claimed

    def _try_change(
        self, key: str, change: Callable[[str | None], str], turn_key: str, token: str
    ) -> tuple[bool | None, bool]:
        """One try of `change_cursor`: whether the change was written (None when another
        writer holds the field's turn, nothing tried), and whether it lost to a writer that
        ignores turns (another wrote though this one held the turn throughout; not one whose
        turn lapsed during a slow change, which may take it again)."""
        cursors, version_key = self.key("cursors"), self._version_key(key)
        pipe = self._r.pipeline(transaction=False)
        for command in (("GET", turn_key), ("PTTL", turn_key), ("GET", version_key)):
            raw_answer(pipe, *command)
        raw_answer(pipe, "HGET", cursors, key)
        turn, left, version, stored = pipe.execute()
        if turn is not None and turn != token.encode() and 0 <= left <= TURN_MS:
            return None, False
        current = utf8(cursors, key, stored)  # not UTF-8: changed as absent
        seen = "-"
        if version is None or self._older_writer_live(self._r):
            seen = "" if stored is None else hashlib.sha1(stored, usedforsecurity=False).hexdigest()
        answer = self._change_field(
            keys=[cursors, version_key, turn_key],
            args=[key, version or b"", seen, change(current), token, TURN_MS],
        )
        return (None if answer == -1 else answer == 1), answer == -2

    def _give_turn_back(self, turn_key: str, token: str) -> None:
        """Give back a field's turn this writer took and did not write under, so the field's
        other writers need not wait for it to lapse; a Redis that fails here leaves it to lapse."""
        with contextlib.suppress(redis.RedisError):
            self._release_if_held(keys=[turn_key], args=[token])

    def _older_writer_live(self, pipe: Any) -> bool:
        """Whether a live instance may be of a version that writes cursors without their
        versions (see `change_cursor`)."""
        now_ms = int(time.time() * 1000)
        try:
            listings = [
                live_members(key, capped_live(pipe, key, now_ms))
                for key in (self.key("instances"), self.key("versioned"))
            ]
        except redis.ResponseError:
            return True  # a listing Redis refuses (another type) cannot vouch for anyone
        (live, whole), (versioned, _) = ((set(found), whole) for found, whole in listings)
        if not whole:
            return True  # an instance not read may be of an older version
        # By members, not counts: a newer instance in `P:versioned` alone (its live listing
        # refused, or a stale entry) must not stand in for an older one listed as live.
        return bool(live - versioned)

    def get_cursors(self, keys: Iterable[str]) -> dict[str, str]:
        """As `get_cursor` of each, one HMGET per batch."""
        found: dict[str, str] = {}
        for batch in in_batches(dict.fromkeys(keys)):
            values = self._hmget(self.key("cursors"), batch)
            found.update(
                (key, value) for key, value in zip(batch, values, strict=True) if value is not None
            )
        return found

    def cursor_keys(self, prefix: str) -> list[str]:
        pattern = _glob(prefix) + "*"
        found = {field for field, _ in self._hscan(self.key("cursors"), match=pattern)}
        return sorted(key for key in found if key.startswith(prefix))

    def delete_cursors(self, keys: Iterable[str]) -> None:
        wanted = sorted(set(keys))
        if wanted:
            pipe = self._r.pipeline(transaction=True)
            pipe.hdel(self.key("cursors"), *wanted)
            pipe.delete(*(self._version_key(key) for key in wanted))
            pipe.execute()

    def replace_cursor_if(self, key: str, expected: str, value: str | None) -> bool:
        """One script: another instance's write between the caller's read and this one is
        never written over or deleted."""
        answer = self._cursor_if_unchanged(
            keys=[self.key("cursors"), self._version_key(key)],
            args=[key, expected, value or "", "0" if value is None else "1"],
        )
        return bool(answer)

    # Sets of names -------------------------------------------------------------------------

    def _set_key(self, name: str) -> str:
        return self.key("set", name)

    @contextmanager
    def _of_set(self, key: str) -> Iterator[None]:
        """`WrongKeyType`, naming `key` and the fix, for Redis's bare WRONGTYPE answer."""
        try:
            yield
        except redis.ResponseError as error:
            if not answered(error, "WRONGTYPE"):
                raise
            raise WrongKeyType.of(self._r, key, "set") from None

    def add_to_set(self, name: str, members: Iterable[str]) -> None:
        wanted = sorted(set(members))
        if wanted:
            with self._of_set(self._set_key(name)):
                self._r.sadd(self._set_key(name), *wanted)

    def set_members(self, name: str) -> list[str]:
        """SMEMBERS; a member that is not UTF-8 or is over `MAX_MEMBER_BYTES` (no instance
        writes one: a hand's, or a hostile writer's with the Redis user's rights) is left
        out, named once in the log (by its start, for a long one), and removed.
        `WrongKeyType` when the key holds another type."""
        key = self._set_key(name)
        found: list[str] = []
        with self._of_set(key):
            members = raw_answer(self._r, "SMEMBERS", key)
        odd: list[bytes] = []
        for raw in members:
            if len(raw) > MAX_MEMBER_BYTES:
                shown = _field_name(raw[:64]) + f"... ({len(raw)} bytes)"
                _corrupt(key, shown, f"is longer than {MAX_MEMBER_BYTES} bytes")
                odd.append(raw)
            elif readable := readable_members(key, [raw]):
                found.extend(readable)
            else:
                odd.append(raw)
        if odd:
            # Only the service writes these sets: an odd member is nobody's, and left there
            # it was read (and the log's memory of it kept) at every look, for good.
            with self._of_set(key):
                self._r.srem(key, *odd)
        return sorted(found)

    def remove_from_set(self, name: str, members: Iterable[str]) -> None:
        wanted = sorted(set(members))
        if wanted:
            with self._of_set(self._set_key(name)):
                self._r.srem(self._set_key(name), *wanted)

    def set_shown(self, name: str) -> str:
        return f"Redis key {self._set_key(name)}"

    # An agent that left for good -----------------------------------------------------------

    def offset_agents(self) -> set[str]:
        agents = set()
        offsets = self.key("offsets")
        for field in self._listed(offsets, "HKEYS", offsets):
            parts = _parts(field, 2)
            if parts is not None:
                agents.add(parts[0])
        return agents

    def forget_agent(
        self,
        agent_id: str,
        *,
        routes: Iterable[str] = (),
        cursors: Iterable[str] = (),
        cursor_prefixes: Iterable[str] = (),
    ) -> None:
        # Each scan filters on the server (MATCH), so only the agent's own entries travel.
        suffix = ":" + agent_id
        named = set(routes)
        found = set(self._sscan(self.key("residents"), match="*" + _glob(suffix)))
        gone = sorted(r for r in found if r.endswith(suffix)) + sorted(named)
        members: set[str] = set()
        # A notice's field is `_member(route, id)`: `["<route>", "<id>"]`.
        patterns = [_glob("[" + json.dumps(route, ensure_ascii=False)) + ", *" for route in named]
        patterns.append(_glob('["') + "*" + _glob(suffix + '", ') + "*")
        for pattern in patterns:
            for member, _ in self._hscan(self.key("n", "text"), match=pattern):
                parts = _parts(member, 2)
                if parts is not None and (parts[0].endswith(suffix) or parts[0] in named):
                    members.add(member)
        offsets = [
            field
            for field, _ in self._hscan(
                self.key("offsets"),
                match=_glob("[" + json.dumps(agent_id, ensure_ascii=False)) + ", *",
            )
            if (_parts(field, 2) or [""])[0] == agent_id
        ]
        # MATCH reads fields, not values: the inbox (keyed by message id) is read whole,
        # once per agent that left (`inbox_messages` reads it whole at every start).
        needle = f'"agent_id": {json.dumps(agent_id)}'
        inbox = [
            message_id
            for message_id, raw in self._hscan(self.key("inbox"))
            if needle in raw and (_object(raw) or {}).get("agent_id") == agent_id
        ]
        keys = set(cursors)
        for prefix in set(cursor_prefixes):
            for field, _ in self._hscan(
                self.key("cursors"), match=_glob(prefix) + "*" + _glob(suffix)
            ):
                if field.startswith(prefix) and field.endswith(suffix):
                    keys.add(field)
        pipe = self._r.pipeline(transaction=True)
        for route in gone:
            pipe.delete(self._res(route))
        if gone:
            pipe.srem(self.key("residents"), *gone)
        if members:
            for name in ("text", "state", "at"):
                pipe.hdel(self.key("n", name), *members)
            pipe.zrem(self.key("n", "pending"), *members)
            pipe.zrem(self.key("n", "unsure"), *members)
        if offsets:
            pipe.hdel(self.key("offsets"), *offsets)
        if inbox:
            pipe.hdel(self.key("inbox"), *inbox)
            pipe.zrem(self.key("inbox", "queued"), *inbox)
        if keys:
            pipe.hdel(self.key("cursors"), *sorted(keys))
            pipe.delete(*(self._version_key(key) for key in sorted(keys)))
        pipe.execute()

    def first_claim(self, key: str, value: str, keep_s: float) -> str:
        """The first value claimed under `key`; `WrongKeyType` when the key holds another
        type (`SET NX` failed on it as on a claim already taken, and reading it failed)."""
        name = self.key("claim", key)
        if self._r.set(name, value, nx=True, ex=max(1, int(keep_s))):
            return value
        try:
            first = utf8(name, "", raw_answer(self._r, "GET", name))
        except redis.ResponseError as error:
            if not answered(error, "WRONGTYPE"):
                raise
            raise WrongKeyType.of(self._r, name, "string") from None
        return value if first is None else first  # expired in between: ours is as good

    # Pauses --------------------------------------------------------------------------------

    def pauses(self) -> dict[str, float]:
        raw = self._hgetall(self.key("pauses"))
        pauses = {}
        for scope, value in raw.items():
            until = stored_time(value)
            if until is None:
                _corrupt(self.key("pauses"), scope)
            else:
                pauses[scope] = until
        return pauses

    def set_pause(self, scope: str, until_epoch: float) -> None:
        self._r.hset(self.key("pauses"), scope, repr(until_epoch))

    # Chats ---------------------------------------------------------------------------------

    def record_chat(self, chat: SeenChat) -> None:
        field = _member(chat.channel, chat.chat_id, chat.thread_id or "")
        title = chat.title
        if title is None:
            known = self._hget(self.key("chats"), field)
            title = (_object(known) or {}).get("title")
            title = title if isinstance(title, str) else None
        self._r.hset(
            self.key("chats"), field, json.dumps({"title": title, "last_seen": chat.last_seen})
        )

    def seen_chats(self) -> list[SeenChat]:
        raw = self._hgetall(self.key("chats"))
        chats = []
        for field, value in raw.items():
            parts, data = _parts(field, 3), _object(value)
            if parts is None or data is None:
                _corrupt(self.key("chats"), field)
                continue
            channel, chat_id, thread_id = parts
            title = data.get("title")
            last_seen = stored_time(data.get("last_seen"))
            unread: frozenset[str] = frozenset()
            if last_seen is None and data.get("last_seen") is not None:
                _corrupt(self.key("chats"), f"{field} last_seen")
                unread = frozenset({"last_seen"})
            chats.append(
                SeenChat(
                    channel,
                    chat_id,
                    thread_id or None,
                    title if isinstance(title, str) else None,
                    last_seen or 0.0,
                    unread,
                )
            )
        return sorted(chats, key=lambda c: (-c.last_seen, c.channel, c.chat_id, c.thread_id or ""))

    # Messages to agents (the inbox) ------------------------------------------------------

    def add_inbox_message(self, record: InboxRecord) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(self.key("inbox"), record.message_id, json.dumps(asdict(record)))
        pipe.zadd(self.key("inbox", "queued"), {record.message_id: record.queued_at})
        pipe.execute()

    def set_inbox_outcome(
        self, message_id: str, outcome: InboxOutcome, reason: str | None, at: float
    ) -> None:
        raw = self._hget(self.key("inbox"), message_id)
        if raw is None:
            return
        data = _object(raw)
        if data is None:
            _corrupt(self.key("inbox"), message_id)
            return
        data.update(outcome=outcome, reason=reason, closed_at=at)
        self._r.hset(self.key("inbox"), message_id, json.dumps(data))

    def inbox_messages(self, since: float) -> list[InboxRecord]:
        raw = self._hgetall(self.key("inbox"))
        records = []
        for message_id, value in raw.items():
            try:
                record = InboxRecord(**(_object(value) or {}))
            except _CORRUPT:
                record = None
            if record is None or not isinstance(record.queued_at, int | float):
                _corrupt(self.key("inbox"), message_id)
                continue
            records.append(record)
        wanted = [r for r in records if r.outcome == "open" or r.queued_at >= since]
        return sorted(wanted, key=lambda r: (r.queued_at, r.message_id))


def _record(key: str, route: str, data: dict[str, str]) -> ResidentRecord:
    try:
        unsure_sends = int(data.get("unsure_sends") or 0)
    except ValueError:
        _corrupt(key, "unsure_sends")
        unsure_sends = 0
    unread = set()
    for name in ("committed_at", "unsure_at"):
        if data.get(name) is not None and stored_time(data[name]) is None:
            _corrupt(key, name)
            unread.add(name)
    return ResidentRecord(
        route=route,
        message_id=data.get("message_id"),
        fingerprint=data.get("fingerprint"),
        committed_at=stored_time(data.get("committed_at")),
        disabled_reason=data.get("disabled_reason"),
        send_key=data.get("send_key"),
        stale_message_id=data.get("stale_message_id"),
        unsure_sends=unsure_sends,
        unsure_at=stored_time(data.get("unsure_at")),
        pin_owed_id=data.get("pin_owed_id"),
        unreadable=frozenset(unread),
    )
