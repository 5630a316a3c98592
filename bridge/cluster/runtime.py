"""One instance's membership of a cluster: its Redis clients, leases and their renewal.

`Cluster.connect` proves Redis answers before anything starts (an unreachable Redis is one
line and exit 2, not a service that half-runs). `run` renews this instance's leases every third
of their TTL: the poll lease of each bot it receives commands for, and one lease per configured
agent. Gaining an agent's lease makes this instance serve the agent's routes (`take`); losing
it stops that (`drop`). The resident ids live in the shared store, so the instance that takes
over edits the message the previous owner posted instead of posting a second one. With the
leases it shares what it routes (`P:routed:<owner>`, listed in the sorted set `P:instances`
until it lapses), so a `/tell` naming an agent no instance routes to the chat is refused once.
It also leases the board of each chat it routes to: the holder sends the chat's one board
(see `bridge.cluster.boards`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError, ResponseError

from taskcard.bridge.cluster.boards import SharedBoards
from taskcard.bridge.cluster.config import ClusterConfig
from taskcard.bridge.cluster.lease import (
    FencedCursors,
    Lease,
    PollLease,
    hold_all,
    release_all,
)
from taskcard.bridge.cluster.limiter import RedisLimiter
from taskcard.bridge.cluster.replies import ClusterReplies
from taskcard.bridge.cluster.wakes import WakeRelay
from taskcard.bridge.store.base import OWED_AGENTS, shown_key
from taskcard.bridge.store.redis import (
    MAX_LIVE,
    RedisStore,
    WrongKeyType,
    capped_fields,
    capped_get,
    capped_hash,
    capped_live,
    connect,
    live_members,
    over_cap,
    permission_fix,
    raise_if_cancel_swallowed,
    raw_answer,
    redis_trouble,
    refused_permission,
    wrong_type,
)
from taskcard.channels.base import ChatRef, CursorStore, counted

log = logging.getLogger(__name__)


# The keys under the prefix with fixed names, and the Redis type each holds.
_FIXED_KEYS = {
    **dict.fromkeys(
        (
            "prefs",
            "offsets",
            "cursors",
            "pauses",
            "chats",
            "inbox",
            "n:text",
            "n:state",
            "n:at",
        ),
        "hash",
    ),
    "versioned": "zset",
    "routes-changed": "string",
    "bots:telegram": "hash",
    "bots:feishu": "hash",
    "residents": "set",
    f"set:{OWED_AGENTS}": "set",
    "n:pending": "zset",
    "instances": "zset",
    "inbox:queued": "zset",
    **dict.fromkeys(("cmd:telegram", "cmd:feishu"), "stream"),
}


# Where an instance's routed record (`P:routed:<owner>`) keeps the `orchestrator` settings of
# its routes, beside the channels' names (no channel is named so): `{channel: {chat: {topic or
# "": agent}}}`, left out while no route sets one, so such a record reads as before.
MARKS_KEY = "@orchestrators"


# Where a routed record says that its instance moves `P:routes-changed` whenever it rewrites
# the record (`_follow_marks`): an older release's record does not say so.
COUNTED_KEY = "@counted"


def _with_marks(routed: Mapping[str, Any], marks: Mapping[str, Any]) -> Mapping[str, Any]:
    """The routed record shared: `routed`, with `marks` under `MARKS_KEY` when there are any,
    and `COUNTED_KEY`."""
    return {**routed, **({MARKS_KEY: marks} if marks else {}), COUNTED_KEY: True}


def _in_chat(chats: Mapping[str, Any], chat: ChatRef) -> object:
    """What a routed record's `chats` (`{chat: {topic or "": value}}`) holds for `chat`, as
    its instance's routes would take a command from it: the chat's topic, else the whole
    chat."""
    threads = chats.get(chat.chat_id, {})
    return threads.get(chat.thread_id or "") or threads.get("")


# The most bytes read of a routed record: one past this is not read (a hand edit, a hostile
# writer), so neither a renewal nor a command's answer carries it whole. The largest honest
# one: each route of an agent is its id (at most 64 characters) quoted and a comma, 68 bytes,
# so 10,000 agents each routed to 3 chats take about 2 MB, marks and chats' ids aside: the
# cap leaves twice that.
MAX_ROUTED_BYTES = 4 * 1024 * 1024

# The most bytes read of the count of routes rewritten (an INCR's: 20 digits at most), and of
# a bot's record in `P:bots:<channel>` (a bot's id and a time).
MAX_COUNT_BYTES = 64
MAX_BOT_RECORD_BYTES = 1_024

# How many lease periods a live instance with no routed record keeps the others reading every
# record at each renewal (an older release lists itself before writing its record, within a
# renewal): past that it is taken for a record that will not come (logged once).
UNRECORDED_LEASES = 3


# KEYS: routed records; ARGV[1]: the most bytes read of one, ARGV[1 + i]: the SHA-1 of the
# i-th as last read ('' when none). Each: false when missing or not a string, its length when
# over the cap, {its SHA-1} when unchanged, else {its SHA-1, its value}.
_READ_CHANGED = """
local found = {}
for i, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok ~= 'string' then
    found[i] = false
  else
    local size = redis.call('STRLEN', key)
    if size > tonumber(ARGV[1]) then
      found[i] = size
    else
      local value = redis.call('GET', key)
      local digest = redis.sha1hex(value)
      if digest == ARGV[i + 1] then found[i] = {digest} else found[i] = {digest, value} end
    end
  end
end
return found
"""


class _RefusedRecord(ValueError):
    """A routed record that is not one: said as the reason it was left out."""


def _routed_record(raw: object) -> Mapping[str, Any] | None:
    """The routed record `raw` (as `CAPPED_GET` gives it) holds; None when there is none;
    raises (`_RefusedRecord`, `ValueError`, `RecursionError`) when it cannot be read."""
    if raw is None:
        return None
    if isinstance(raw, int):
        raise _RefusedRecord(f"{raw} bytes, over the {MAX_ROUTED_BYTES} read")
    if not isinstance(raw, bytes):
        raise _RefusedRecord(f"a {type(raw).__name__} from Redis")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise _RefusedRecord("not UTF-8") from None
    record = json.loads(text)
    if not isinstance(record, dict):
        raise _RefusedRecord(f"a JSON {type(record).__name__}, not an object")
    return record


def _why_refused(error: Exception) -> str:
    if isinstance(error, _RefusedRecord):
        return str(error)
    if isinstance(error, RecursionError):
        return "nested deeper than can be read"
    if isinstance(error, ValueError):
        return "not JSON"
    return "not of the shape this version writes"


def routed_in_chat(
    records: Iterable[Mapping[str, Any]], channel: str, chat: ChatRef
) -> tuple[list[str], list[str]]:
    """The agents `records` (routed records) route to `chat` on `channel`, and their routes'
    `orchestrator` settings (both sorted); parts of another shape are passed over."""
    names: set[str] = set()
    marks: set[str] = set()
    for record in records:
        with contextlib.suppress(AttributeError, TypeError):
            agents = _in_chat(record.get(channel, {}), chat)
            if isinstance(agents, list):
                names.update(agent for agent in agents if isinstance(agent, str))
        with contextlib.suppress(AttributeError, TypeError):
            mark = _in_chat(record.get(MARKS_KEY, {}).get(channel, {}), chat)
            if isinstance(mark, str):
                marks.add(mark)
    return sorted(names), sorted(marks)


def live_routed_records(store: RedisStore) -> list[Mapping[str, Any]]:
    """The routed records of the live instances that can be read (`taskcard status`: the
    chat's orchestrator as the cluster decides it); one listing and one script call."""
    now_ms = int(time.time() * 1000)
    listed = store.key("instances")
    owners, _ = live_members(listed, capped_live(store.client, listed, now_ms))
    keys = [store.key("routed", owner) for owner in owners]
    if not keys:
        return []
    found: list[object] = capped_get(store.client, keys, MAX_ROUTED_BYTES)
    records: list[Mapping[str, Any]] = []
    for raw in found:
        with contextlib.suppress(ValueError, RecursionError):
            if (record := _routed_record(raw)) is not None:
                records.append(record)
    return records


class BoardHolder(Protocol):
    """The service's side of the boards' leases (see `bridge.cluster.boards`)."""

    def board_scopes(self) -> Iterable[str]:
        """The chats this instance routes agents to: it competes for their boards."""
        ...

    def take_board(self, scope: str) -> None:
        """This instance sends the chat's board from now on."""
        ...

    def drop_board(self, scope: str) -> None:
        """Another instance sends the chat's board now."""
        ...


class ReplyTaker(Protocol):
    """The service's side of the command replies stopped instances left unsent (see
    `bridge.cluster.replies`)."""

    def reply_channels(self) -> Iterable[str]:
        """The channels this instance sends on: it takes their replies."""
        ...

    def adopt_replies(self, kept: Mapping[str, Any]) -> None:
        """Send these replies (idempotency key -> entry), now this instance's."""
        ...


class WakeTaker(Protocol):
    """What wakes the chats' orchestrators this instance serves with the wakes other instances
    kept for them (see `bridge.cluster.wakes`)."""

    def orchestrated_scopes(self) -> Iterable[str]:
        """The chats whose orchestrator this instance serves now."""
        ...

    def wake_relayed(self, scope: str, members: list[str]) -> list[str]:
        """Wake the chat's orchestrator with the kept wakes `members`; returns those done
        with (woken, known already, or not wakes at all), which are forgotten."""
        ...

    def others_route_marks(self, marks: list[tuple[str, str, str, str]]) -> None:
        """The `orchestrator` settings of the other live instances' routes, each as
        (channel, chat, topic or "", agent): all of them, replacing those told before."""
        ...


class ClusterUnreachable(Exception):
    """Redis did not answer at start; the message is one line without the URL's secret."""


def _scrub(text: str, url: str) -> str:
    password = urlsplit(url).password
    text = " ".join(text.split())
    return text.replace(password, "<password>") if password else text


def _bad_option(error: Exception, url: str) -> ClusterUnreachable:
    reason = _scrub(str(error), url)
    return ClusterUnreachable(
        f"the Redis URL of [cluster] has an option redis cannot use ({reason}); fix or"
        " remove the part after '?' in cluster.redis_url_env / cluster.redis_url"
    )


def probe(url: str) -> None:
    """Raise `ClusterUnreachable` unless the Redis at `url` answers a PING within seconds."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    except (TypeError, ValueError) as error:
        raise _bad_option(error, url) from None
    try:
        # The PING makes the first connection from the pool (so a `max_connections=1` is
        # kept); options in the URL's query are handed to it as they are: an unknown one is a
        # TypeError there, a malformed value a ValueError (both used to be a traceback).
        client.ping()
    except (TypeError, ValueError) as error:
        raise _bad_option(error, url) from None
    except redis.AuthenticationError as error:
        reason = _scrub(f"{type(error).__name__}: {error}", url)
        raise ClusterUnreachable(
            f"the Redis of [cluster] refused the login ({reason}); put its password in the URL"
            " (redis://:PASSWORD@host:6379/0) held by cluster.redis_url_env"
        ) from None
    except redis.RedisError as error:
        if (refused := refused_permission(error)) is not None:
            raise ClusterUnreachable(permission_fix([refused])) from None
        reason = _scrub(f"{type(error).__name__}: {error}", url)
        raise ClusterUnreachable(
            f"cannot reach the Redis of [cluster] ({reason}); start Redis or fix"
            " cluster.redis_url_env / cluster.redis_url"
        ) from None
    finally:
        client.close()


def shared_store(config: ClusterConfig, url: str) -> RedisStore:
    """The cluster's state store alone (for `taskcard status` and `chats`), after a probe;
    `WrongKeyType` (one line, as `serve` says it) when a fixed key holds another type."""
    probe(url)
    store = RedisStore(connect(url), config.key_prefix)
    try:
        misplaced = misplaced_key(store)
    except RedisError:
        misplaced = None  # the reads that follow say it
    if misplaced is not None:
        store.close()
        raise WrongKeyType(f"cluster.key_prefix {config.key_prefix!r}: {wrong_type(*misplaced)}")
    return store


def misplaced_key(store: RedisStore) -> tuple[str, str, str] | None:
    """A key the fleet keeps under a fixed name that holds another type (left by something
    else on this prefix): (key, its type, the type expected); None if none. Every call on
    such a key fails, so the service would run without posting anything, saying little
    about why."""
    keys = [store.key(*name.split(":")) for name in _FIXED_KEYS]
    pipe = store.client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    for key, expected, found in zip(keys, _FIXED_KEYS.values(), pipe.execute(), strict=True):
        if found not in ("none", expected):
            return key, str(found), expected
    return None


# A script with no effect, to learn whether the user may load and run scripts.
_NOOP_SCRIPT = "return 1"


def refused_permissions(store: RedisStore, owner: str) -> list[tuple[str, str]]:
    """The ACL refusals (`refused_permission`) of the commands the fleet uses, each tried
    once in a form with no effect on keys of its own under the prefix (removed after) and on
    the boards' channel (an empty message, which every instance ignores). A user without one
    of them would meet the refusal at run time only, retried for ever where it is met."""
    key = functools.partial(store.key, "acl-check", owner)
    text, table, ranks, members, stream, count = (
        key(part) for part in ("s", "h", "z", "set", "x", "n")
    )
    sha = hashlib.sha1(_NOOP_SCRIPT.encode()).hexdigest()
    pipe = store.client.pipeline(transaction=False)
    pipe.ping()
    pipe.set(text, "1", px=60_000)
    pipe.get(text)
    pipe.exists(text)
    pipe.mget([text])
    pipe.strlen(text)  # with TYPE and GET, in a script (`Cluster.routed_chat`)
    pipe.type(text)
    pipe.pexpire(text, 60_000)
    pipe.expire(text, 60)
    pipe.pttl(text)
    # redis-py's `incr` sends INCRBY; the leases' script calls INCR, which the ACL may allow alone.
    pipe.execute_command("INCR", count)  # type: ignore[no-untyped-call]
    # The release before this one changed cursors under WATCH and UNWATCH: kept while a
    # rolling update mixes the two on one ACL user.
    pipe.execute_command("UNWATCH")  # type: ignore[no-untyped-call]
    pipe.hset(table, "f", "v")
    pipe.hsetnx(table, "f", "v")
    pipe.hget(table, "f")
    pipe.hmget(table, ["f"])
    pipe.hgetall(table)
    pipe.hvals(table)
    pipe.hkeys(table)
    pipe.hscan(table, 0)
    pipe.hexists(table, "f")
    pipe.hdel(table, "f")
    pipe.zadd(ranks, {"m": 1})
    pipe.zscore(ranks, "m")
    pipe.zcard(ranks)
    pipe.zcount(ranks, "-inf", "+inf")
    pipe.zrange(ranks, 0, 0)
    pipe.zrangebyscore(ranks, "-inf", "+inf")
    pipe.zrem(ranks, "m")
    pipe.zremrangebyscore(ranks, "-inf", "+inf")
    pipe.zremrangebyrank(ranks, 0, -1)
    pipe.sadd(members, "m")
    pipe.smembers(members)
    pipe.sscan(members, 0)
    pipe.srem(members, "m")
    pipe.xadd(stream, {"f": "v"}, maxlen=1)
    pipe.xrevrange(stream, count=1)
    pipe.xread({stream: "0-0"}, count=1)
    pipe.publish(store.key("board", "changed"), "")
    pipe.time()
    pipe.script_load(_NOOP_SCRIPT)
    pipe.evalsha(sha, 0)
    pipe.eval(_NOOP_SCRIPT, 0)
    pipe.delete(text, table, ranks, members, stream, count)
    answers = pipe.execute(raise_on_error=False)
    refused = [
        found
        for answer in answers
        if isinstance(answer, RedisError) and (found := refused_permission(answer)) is not None
    ]
    # WATCH, MULTI and EXEC (transactions; WATCH as for UNWATCH above)
    transaction: Any = store.client.pipeline(transaction=True)
    try:
        transaction.watch(text)
        transaction.multi()
        transaction.get(text)
        transaction.execute()
    except RedisError as error:
        if (found := refused_permission(error)) is not None:
            refused.append(found)
    finally:
        transaction.reset()
    # Typed from redis-py 8.2 on, untyped before: read through `Any` so both type-check.
    client: Any = store.client
    pubsub: Any = client.pubsub()
    try:
        pubsub.subscribe(store.key("board", "changed"))
        pubsub.get_message(timeout=1)
    except RedisError as error:
        if (found := refused_permission(error)) is not None:
            refused.append(found)
    finally:
        with contextlib.suppress(RedisError):
            pubsub.close()
    return refused


class Cluster:
    """The clients, store, limiter and leases of this instance."""

    def __init__(self, config: ClusterConfig, url: str) -> None:
        self.config = config
        self.prefix = config.key_prefix
        self.instance = config.instance_name()
        # Unique per process: a restarted instance of the same name never mistakes the dead
        # process's lease for its own.
        self.owner = f"{self.instance}#{uuid.uuid4().hex[:8]}"
        self._url = url
        self.store = RedisStore(connect(url), self.prefix)
        self.aio = AsyncRedis.from_url(
            url, decode_responses=True, socket_timeout=5, socket_connect_timeout=2
        )
        self._poll_leases: list[PollLease] = []
        self._agent_leases: dict[str, Lease] = {}
        self._serving: set[str] = set()  # agents whose `take` went through
        self._refused: dict[str, str] = {}  # agent -> why its `take` failed (logged once)
        self._renewed = False  # after the first renewal, a lease gained is a takeover...
        self._fresh: set[str] = set()  # ...unless its agent joined the fleet just now
        self._silent_since: float | None = None  # when Redis stopped answering (monotonic)
        self._bots: dict[str, str] = {}  # channel -> the bot this instance posts as
        self._routes_shared: str | None = None  # what `_share_routes` last wrote
        self._share_refused: str | None = None  # the refusal `_share_routes` last logged
        # The routed records left out (`routed_chat`): key -> digest of the value logged.
        self._routed_refused: dict[str, str] = {}
        # The routed records as last read: key -> their SHA-1 and what they hold (None: left
        # out), so an unchanged one is neither carried nor parsed again (`_routed_records`).
        self._routed_read: dict[str, tuple[str, Mapping[str, Any] | None]] = {}
        # What `_follow_marks` last read the others' marks at: the change counter, the owners.
        self._marks_seen: tuple[object, tuple[str, ...]] | None = None
        # The other live instances whose routed record says they move the change counter.
        self._uncounted: set[str] = set()
        # Live instances with no routed record: when this instance first found them so
        # (monotonic), None once it stopped waiting for it (`_record_awaited`).
        self._unrecorded: dict[str, float | None] = {}
        self.boards = SharedBoards(self.aio, self.prefix, self.owner)
        self._board_leases: dict[str, Lease] = {}
        self._boards_held: set[str] = set()  # chats whose board `take_board` was told of
        self.replies = ClusterReplies(
            self.store.client, self.aio, self.prefix, self.owner, config.lease_ttl_s
        )
        self.wakes = WakeRelay(self.store.client, self.aio, self.prefix)

    @classmethod
    def connect(cls, config: ClusterConfig, url: str) -> Cluster:
        probe(url)
        return cls(config, url)

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def misplaced_key(self) -> tuple[str, str, str] | None:
        """See `misplaced_key`: checked at start, before anything runs."""
        return misplaced_key(self.store)

    def refused_permissions(self) -> list[tuple[str, str]]:
        """See `refused_permissions`: checked at start, before anything runs."""
        return refused_permissions(self.store, self.owner)

    def claim_bot(self, channel: str, bot: str) -> bool:
        """Record that this instance posts on `channel` as `bot`; False when a live instance
        on this key prefix posts as another bot. Every key under one prefix (the poll lease,
        the update offset, the command stream, resident ids) belongs to one bot: a second bot
        there was never polled and got the first bot's commands and message ids."""
        key, now_ms = self.key("bots", channel), int(time.time() * 1000)
        caps = (MAX_BOT_RECORD_BYTES, MAX_LIVE, MAX_LIVE * MAX_BOT_RECORD_BYTES)
        live = capped_fields(key, capped_hash(self.store.client, key, *caps), *caps)
        for other, until in live.items():
            if other != bot and until.isdigit() and int(until) > now_ms:
                return False
        self._bots[channel] = bot
        self.store.client.hset(key, bot, str(now_ms + self._bot_ttl_ms))
        return True

    @property
    def _bot_ttl_ms(self) -> int:
        # Three leases, not one: renewed every third of a lease, a record outlives an event
        # loop that stalls for a moment (a loaded machine), so another bot is never let in
        # while this one still serves; a crashed instance's record lapses after three.
        return int(self.config.lease_ttl_s * 3000)

    def forget_bots(self) -> None:
        """Drop this instance's bot records at once: it stops before serving (a refused
        secret, a busy metrics port), and a corrected restart must not be taken for another
        bot's instance until the records lapse."""
        with contextlib.suppress(RedisError):
            for channel, bot in self._bots.items():
                self.store.client.hdel(self.key("bots", channel), bot)
        self._bots.clear()

    async def _renew_bots(self) -> None:
        """Keep this instance's bot recorded; a Redis that does not answer is the leases'
        business (they lapse on their own), so it is not raised here."""
        now_ms = int(time.time() * 1000)
        with contextlib.suppress(RedisError):
            for channel, bot in self._bots.items():
                key = self.key("bots", channel)
                await self.aio.hset(key, bot, str(now_ms + self._bot_ttl_ms))
                await self.aio.pexpire(key, self._bot_ttl_ms)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values to scrub from logs and everything sent: the Redis password, if any."""
        password = urlsplit(self._url).password
        return (password,) if password else ()

    def limiter(self, max_pause_s: float) -> RedisLimiter:
        return RedisLimiter(self.aio, self.prefix, self.owner, max_pause_s=max_pause_s)

    def lease(self, *parts: str) -> Lease:
        return Lease(self.aio, self.key("lease", *parts), self.owner, self.config.lease_ttl_s)

    def poll_gate(
        self, channel: str, inner: CursorStore, offset_key: str
    ) -> tuple[PollLease, FencedCursors]:
        """The gate a channel polls through, and the cursors whose `offset_key` it fences."""
        gate = PollLease(self.lease("poll", channel))
        self._poll_leases.append(gate)
        cursors = FencedCursors(
            inner, self.store.client, self.key("cursors"), offset_key, gate.lease
        )
        return gate, cursors

    async def _share_routes(self, routed: Mapping[str, Any]) -> None:
        """Keep what this instance routes (`Service.routed_agents`) where the others read
        it (`routed_names`): rewritten when it changed or is gone from Redis, else only kept
        from expiring; a dead instance's lapses with its bot record. A Redis that does not
        answer is the leases' business, as in `_renew_bots`. (Only kept from expiring, a
        key lost by a Redis restarted empty or evicted was never written again: another
        instance then refused a `/tell` to this instance's agents as naming no agent.)"""
        now_ms, key = int(time.time() * 1000), self.key("routed", self.owner)
        text = json.dumps(routed, sort_keys=True)
        try:
            await self._write_routes(key, text, now_ms)
            self._share_refused = None
        except ResponseError as error:  # NOPERM, WRONGTYPE, OOM: said once, until it works
            if str(error) != self._share_refused:
                self._share_refused = str(error)
                # What it is and its fix (`redis_trouble`), not the error's text, which can
                # quote a key: a Redis out of memory was told to grant permissions.
                log.error(
                    "Redis refused keeping this instance listed in the cluster: %s. The other"
                    " instances do not see its routes until it is fixed",
                    redis_trouble(error),
                )
        except RedisError:
            pass  # a Redis that does not answer is the leases' business

    async def _write_routes(self, key: str, text: str, now_ms: int) -> None:
        """`_share_routes`' writes: the routed record, the change count, both listings."""
        if text != self._routes_shared or not await self.aio.pexpire(key, self._bot_ttl_ms):
            await self.aio.set(key, text, px=self._bot_ttl_ms)
            # Tells the others to read the records again (`_follow_marks`). INCR, as
            # the ACL list has it: redis-py's `incr` sends INCRBY.
            await self.aio.execute_command("INCR", self.key("routes-changed"))  # type: ignore[no-untyped-call]
            self._routes_shared = text
        members = self.key("instances")
        # Listed as live before as a writer of cursor versions (`RedisStore.change_cursor`
        # compares both lists' members), and unlisted in the other order at the stop: an
        # instance in `P:instances` alone is taken for an older version, which is safe.
        await self.aio.zadd(members, {self.owner: now_ms + self._bot_ttl_ms})
        versioned = self.key("versioned")
        await self.aio.zadd(versioned, {self.owner: now_ms + self._bot_ttl_ms})
        await self.aio.zremrangebyscore(versioned, "-inf", now_ms)
        if await self.aio.zremrangebyscore(members, "-inf", now_ms):
            # An instance died: its board lines are ignored now (their agents' leases
            # lapsed), so the boards that showed them are composed again.
            await self.boards.every_board_changed()

    async def routed_names(self, channel: str, chat: ChatRef) -> list[str]:
        """The agents the live instances route to `chat` (each as its own routes would
        take a command from it: the chat's topic, else the whole chat). A Redis that does
        not answer raises: the command asking is handled again once Redis answers (it got
        no answer at all when this said nothing instead)."""
        return (await self.routed_chat(channel, chat))[0]

    async def routed_chat(self, channel: str, chat: ChatRef) -> tuple[list[str], list[str]]:
        """The agents the live instances route to `chat` (as `routed_names`), and the
        `orchestrator` settings of those routes (sorted: one when the instances agree).
        Read when a command asks, never periodically: one script reading an entry per live
        instance.

        Each entry is another process's writing, read as untrusted: one this version cannot
        use (not JSON, nested past what the parser takes, not UTF-8, over
        `MAX_ROUTED_BYTES`, of another shape) is left out, and logged once by its key, and
        the answer is made from the others (that instance answers its own chats alone)."""
        now_ms = int(time.time() * 1000)
        listed = self.key("instances")
        owners, _ = live_members(listed, await capped_live(self.aio, listed, now_ms))
        names: set[str] = set()
        marks: set[str] = set()
        for key, record in await self._routed_records(owners):
            try:
                agents = _in_chat(record.get(channel, {}), chat)
                if isinstance(agents, list):
                    names.update(agent for agent in agents if isinstance(agent, str))
                mark = _in_chat(record.get(MARKS_KEY, {}).get(channel, {}), chat)
                if isinstance(mark, str):
                    marks.add(mark)
            except (AttributeError, TypeError) as error:
                self._refuse_routed(key, record, error)
        return sorted(names), sorted(marks)

    async def _routed_records(self, owners: list[str]) -> list[tuple[str, Mapping[str, Any]]]:
        """The routed records of `owners` that can be read, each with its key; those that
        cannot are left out (logged once by `_refuse_routed`). One script call, which hands
        over only the records changed since this instance last read them (by their SHA-1):
        an unchanged one, read at every renewal while the fallback of `_follow_marks` lasts,
        costs its digest, not its bytes and their parsing."""
        keys = [self.key("routed", owner) for owner in owners]
        kept = self._routed_read
        own = self.key("routed", self.owner)  # `routed_chat` reads it, `_follow_marks` not
        for key in [key for key in kept if key not in keys and key != own]:
            del kept[key]
        if not keys:
            return []
        known = {key: kept[key] for key in keys if key in kept}  # as the script is told
        # Raw bytes, and a value over the cap as its length: a record not UTF-8 must not
        # fail the others' decoding, nor a huge one be carried here whole.
        found: list[object] = await raw_answer(
            self.aio,
            "EVAL",
            _READ_CHANGED,
            len(keys),
            *keys,
            MAX_ROUTED_BYTES,
            *(known[key][0] if key in known else "" for key in keys),
        )
        records: list[tuple[str, Mapping[str, Any]]] = []
        for key, raw in zip(keys, found, strict=True):
            record: Mapping[str, Any] | None
            if isinstance(raw, list) and len(raw) == 1:  # as last read
                record = known[key][1]
            else:
                digest, raw = (raw[0].decode(), raw[1]) if isinstance(raw, list) else ("", raw)
                try:
                    record = _routed_record(raw)
                except (ValueError, RecursionError) as error:
                    self._refuse_routed(key, raw, error)
                    record = None
                if digest:
                    kept[key] = (digest, record)
                else:
                    kept.pop(key, None)
            if record is not None:
                records.append((key, record))
        return records

    async def _follow_marks(self, wakes: WakeTaker) -> None:
        """Tell `wakes` the `orchestrator` settings of the other live instances' routes, when
        they may have changed: an instance rewrote its record (`P:routes-changed` moved) or
        the live instances are others. One GET and one listing per renewal; the records are
        read only on such a change, or at every renewal while a live instance's readable
        record does not say it moves the counter (`COUNTED_KEY`: an older release, during a
        rolling update, whose rewritten routes would be followed only when the live ones
        change), or has none yet (for `UNRECORDED_LEASES` lease periods: a member of the
        listing anyone can add kept it going for good). A record refused (too large, not
        UTF-8, not JSON: logged) keeps no fallback going: reading it again gives the same
        refusal, and every instance would read and parse every record at every renewal
        while it stays. Each reading carries only the records changed since the last
        (`_routed_records`).
        The instance serving an agent another instance's route marks (discovered only here,
        say) wakes it with the wakes kept for its chat."""
        now_ms = int(time.time() * 1000)
        listed, counter = self.key("instances"), self.key("routes-changed")
        async with self.aio.pipeline(transaction=False) as pipe:
            # As bytes: the count is compared, never read; an owner not UTF-8 is left out.
            capped_get(pipe, [counter], MAX_COUNT_BYTES)
            capped_live(pipe, listed, now_ms)
            [changed], owners = await pipe.execute()
        if isinstance(changed, int):  # the count, compared by its size: no INCR wrote it
            over_cap(counter, f"{changed} bytes", f"delete it (DEL {counter})", once="-")
        live, _ = live_members(listed, owners)
        others = sorted(owner for owner in live if owner != self.owner)
        seen = (changed, tuple(others))
        if seen == self._marks_seen and not self._uncounted:
            return
        marked: set[tuple[str, str, str, str]] = set()
        uncounted: set[str] = set()
        records = dict(await self._routed_records(others))
        for owner in others:
            key = self.key("routed", owner)
            if (record := records.get(key)) is None:
                if key not in self._routed_refused and self._record_awaited(owner, listed, key):
                    uncounted.add(owner)  # listed before its first record: it may be older
                continue
            self._unrecorded.pop(owner, None)
            if record.get(COUNTED_KEY) is not True:
                uncounted.add(owner)
            try:
                for channel, chats in record.get(MARKS_KEY, {}).items():
                    for chat, threads in chats.items():
                        for topic, agent in threads.items():
                            if all(isinstance(v, str) for v in (channel, chat, topic, agent)):
                                marked.add((channel, chat, topic, agent))
            except (AttributeError, TypeError) as error:
                self._refuse_routed(key, record, error)
        wakes.others_route_marks(sorted(marked))
        self._marks_seen, self._uncounted = seen, uncounted
        for owner in [owner for owner in self._unrecorded if owner not in live]:
            del self._unrecorded[owner]

    def _record_awaited(self, owner: str, listed: str, key: str) -> bool:
        """Whether the live instance `owner`, listed with no routed record, may still write
        one (an older release lists itself first): for `UNRECORDED_LEASES` lease periods from
        when this instance first found it so. Past that it is said once, and the others'
        records are no longer read at every renewal for it (a member any writer can add)."""
        now = time.monotonic()
        since = self._unrecorded.setdefault(owner, now)
        if since is None:
            return False
        waited_s = now - since
        if waited_s <= UNRECORDED_LEASES * self.config.lease_ttl_s:
            return True
        self._unrecorded[owner] = None
        log.warning(
            "Redis key %s lists %s as a running instance, which wrote no routed record (%s) in"
            " %.0f s: the other instances' records are read at each renewal no longer for"
            " it; nothing to do if it is an instance still starting, else remove it (ZREM %s"
            " %s)",
            listed,
            shown_key(owner),
            key,
            waited_s,
            listed,
            shown_key(owner),
        )
        return False

    def _refuse_routed(self, key: str, raw: object, error: Exception) -> None:
        """Log, once per value, that the routed record at `key` was left out, and why."""
        seen = hashlib.sha1(repr(raw).encode(), usedforsecurity=False).hexdigest()
        if self._routed_refused.get(key) == seen:
            return
        self._routed_refused[key] = seen
        if len(self._routed_refused) > 1_000:  # keys of instances long gone
            del self._routed_refused[next(iter(self._routed_refused))]
        log.warning(
            "Redis key %s: an instance's routed record was left out of the cluster's answers"
            " (%s); its instance answers for its own routes alone; nothing to do if it runs"
            " another version, else delete the key (the instance writes it again)",
            key,
            _why_refused(error),
        )

    async def run(
        self,
        agents: Callable[[], Iterable[str]],
        take: Callable[[list[str]], Mapping[str, Exception]],
        drop: Callable[[str], None],
        routed: Callable[[], Mapping[str, Any]] = dict,
        boards: BoardHolder | None = None,
        replies: ReplyTaker | None = None,
        wakes: WakeTaker | None = None,
        marks: Callable[[], Mapping[str, Any]] = dict,
    ) -> None:
        """Renew every lease until cancelled: one per agent `agents` names at each renewal
        (configured, discovered, added by a reload), and one per chat `boards` routes to;
        call `take` with the agents whose leases a renewal gained, all at once (it returns
        those it could not serve, with why), and `drop` with each agent whose lease was
        lost, as they change (`boards` as the boards' do), share
        what `routed` says this instance routes, hand `replies` the command replies
        stopped instances left unsent, and `wakes` the wakes other instances kept for the
        orchestrators it serves; `marks` (the routes' `orchestrator` settings) is shared
        with `routed`."""
        interval_s = self.config.lease_ttl_s / 3
        log.info("cluster member %s on Redis (key prefix %s)", self.instance, self.prefix)
        while True:
            try:
                await self._follow(agents(), drop)
                if boards is not None:
                    await self._follow_boards(boards)
                await self._renew(take, drop, lambda: _with_marks(routed(), marks()))
                if boards is not None:
                    await self._hand_boards(boards)
                if replies is not None:
                    await self._take_replies(replies)
                if wakes is not None:
                    with contextlib.suppress(RedisError):  # read again at the next renewal
                        await self._follow_marks(wakes)
                    await self._take_wakes(wakes)
            except Exception:
                # Renewal must go on whatever happened: a lease left to lapse while this
                # instance still serves its agent would give the agent two servers.
                log.exception("renewing the cluster leases failed; trying again")
            raise_if_cancel_swallowed()
            await asyncio.sleep(interval_s)

    async def _take_replies(self, replies: ReplyTaker) -> None:
        """Take over the replies stopped instances left unsent; a Redis that does not answer
        is the leases' business (the next renewal tries again)."""
        try:
            kept = await self.replies.take(replies.reply_channels())
        except RedisError:
            return
        if kept:
            replies.adopt_replies(kept)

    async def _take_wakes(self, wakes: WakeTaker) -> None:
        """Wake the orchestrators served here with the wakes kept for their chats; a Redis
        that does not answer is the leases' business (the wakes stay for the next renewal)."""
        try:
            kept = await self.wakes.take(wakes.orchestrated_scopes())
        except RedisError:
            return
        done: dict[str, list[str]] = {}
        for scope, members in kept.items():
            try:
                done[scope] = wakes.wake_relayed(scope, members)
            except Exception:
                log.exception("chat %s: the wakes kept for its orchestrator failed", scope)
        with contextlib.suppress(RedisError):
            await self.wakes.done(done)

    async def _follow(self, agents: Iterable[str], drop: Callable[[str], None]) -> None:
        """Lease the agents this instance serves now: a lease for each new one (an agent
        added by a reload or discovered was never leased, so never served); an agent gone
        from the fleet gives its lease up at once, for a standby that still has it."""
        wanted = set(agents)
        for agent in [agent for agent in self._agent_leases if agent not in wanted]:
            await self._agent_leases.pop(agent).release()
            self._refused.pop(agent, None)
            if agent in self._serving:
                self._serving.discard(agent)
                drop(agent)
        self._fresh = wanted - self._agent_leases.keys()
        for agent in sorted(self._fresh):
            self._agent_leases[agent] = self.lease("agent", agent)

    async def _follow_boards(self, boards: BoardHolder) -> None:
        """A lease for the board of each chat this instance routes to now; a chat it no
        longer routes to gives its board up at once."""
        wanted = set(boards.board_scopes())
        for scope in [scope for scope in self._board_leases if scope not in wanted]:
            await self._board_leases.pop(scope).release()
            if scope in self._boards_held:
                self._boards_held.discard(scope)
                boards.drop_board(scope)
        for scope in sorted(wanted - self._board_leases.keys()):
            self._board_leases[scope] = self.lease("board", scope)

    async def _hand_boards(self, boards: BoardHolder) -> None:
        """Tell the service which boards it sends, after their leases' renewal."""
        await self.boards.retry()
        for scope, lease in self._board_leases.items():
            if lease.held and scope not in self._boards_held:
                try:
                    boards.take_board(scope)
                except Exception:
                    log.exception("chat %s: its board could not be taken over", scope)
                    continue
                self._boards_held.add(scope)
                log.info("chat %s: this instance sends its board now", scope)
            elif not lease.held and scope in self._boards_held:
                self._boards_held.discard(scope)
                boards.drop_board(scope)

    async def _renew(
        self,
        take: Callable[[list[str]], Mapping[str, Exception]],
        drop: Callable[[str], None],
        routed: Callable[[], Mapping[str, Any]],
    ) -> None:
        # Needed for correctness at every interval whatever the fleet's size (a lease not
        # renewed lapses and the agent moves), so it is batched: `HOLD_BATCH` per round trip.
        polled = [gate.lease.held for gate in self._poll_leases]
        error = await hold_all(
            [g.lease for g in self._poll_leases]
            + list(self._agent_leases.values())
            + list(self._board_leases.values())
        )
        if error is not None and self._silent_since is None:
            self._silent_since = time.monotonic()
            log.warning(
                "Redis does not answer (%s): this instance goes on serving its agents for at"
                " most lease_ttl_s (%g s), then stops until Redis answers, so that no agent is"
                " ever served twice; nothing to do if Redis is restarting, else check it",
                type(error).__name__,
                self.config.lease_ttl_s,
            )
        await self._renew_bots()
        await self._share_routes(routed())
        resumed = error is None and self._silent_since is not None
        lost: list[str] = []
        gained = [
            agent
            for agent, lease in self._agent_leases.items()
            if lease.held and agent not in self._serving
        ]
        if gained:
            # Together: the service reads their state in batches, not agent by agent.
            self._take(gained, take, resumed=resumed)
        for agent, lease in self._agent_leases.items():
            if agent in self._serving and not lease.held:
                self._serving.discard(agent)
                drop(agent)
                lost.append(agent)
                if error is None:
                    log.warning(
                        "agent %s: another instance serves it now, since this one did not"
                        " renew its lease within lease_ttl_s (the process stalled or Redis"
                        " answered late); nothing to do unless it recurs",
                        agent,
                    )
        stopped_polling = any(
            was and not gate.lease.held for was, gate in zip(polled, self._poll_leases, strict=True)
        )
        if error is None and stopped_polling:
            log.warning(
                "another instance polls the bot's updates now, since this one did not renew"
                " the poll lease within lease_ttl_s (the process stalled or Redis answered"
                " late); nothing to do unless it recurs"
            )
        if error is not None and (lost or stopped_polling):
            log.warning(
                "Redis has not answered for lease_ttl_s (%s): this instance stopped serving"
                " %s%s; they are served again, by this or another instance, once Redis"
                " answers",
                type(error).__name__,
                counted(len(lost), "agent", "agents"),
                " and polling the bot's updates" if stopped_polling else "",
            )
        if resumed and self._silent_since is not None:
            log.warning(
                "Redis answers again after %.0f s: this instance serves %s; nothing to do",
                time.monotonic() - self._silent_since,
                counted(len(self._serving), "agent", "agents"),
            )
            self._silent_since = None
        self._renewed = True

    def _take(
        self,
        agents: list[str],
        take: Callable[[list[str]], Mapping[str, Exception]],
        *,
        resumed: bool,
    ) -> None:
        """Serve `agents` (their leases are held here); one that cannot be served now (its
        state in Redis unusable) is logged once and tried again at each renewal, and never
        keeps the others from being served."""
        try:
            failed: Mapping[str, Exception] = take(agents)
        except Exception as error:
            failed = dict.fromkeys(agents, error)
        for agent in agents:
            why = failed.get(agent)
            if why is not None:
                reason = " ".join(str(why).split()) or type(why).__name__
                if self._refused.get(agent) != reason:
                    self._refused[agent] = reason
                    log.error(
                        "agent %s: this instance holds its lease but cannot serve it: %s; it"
                        " is tried again at each lease renewal",
                        agent,
                        reason,
                    )
                continue
            self._refused.pop(agent, None)
            self._serving.add(agent)
            if self._renewed and not resumed and agent not in self._fresh:
                log.warning(
                    "agent %s: this instance serves it now, taking over from the instance that"
                    " served it (stopped, or cut off from Redis for lease_ttl_s); its card goes"
                    " on in the same message; nothing to do if that instance was stopped on"
                    " purpose",
                    agent,
                )
            else:
                log.info("agent %s: this instance serves it now", agent)

    async def close(self) -> None:
        """Hand the unsent replies over and release every lease (others take over at once,
        not after the TTL), close clients."""
        await self.replies.release()
        leases = [
            *(g.lease for g in self._poll_leases),
            *self._agent_leases.values(),
            *self._board_leases.values(),
        ]
        await release_all(self.aio, leases)
        await self.boards.withdraw_all()  # a line a standby wrote since is its own: it stays
        with contextlib.suppress(RedisError):  # else it expires after the lease TTL
            for channel, bot in self._bots.items():
                await self.aio.hdel(self.key("bots", channel), bot)
            await self.aio.delete(self.key("routed", self.owner))
            await self.aio.zrem(self.key("versioned"), self.owner)
            await self.aio.zrem(self.key("instances"), self.owner)
        await self.aio.aclose()
        self.store.close()
