"""A chat's board in a cluster: each instance shares its agents' lines, one instance sends it.

The agents of one chat are usually served by several instances, while the chat has one board
message. So the board is split in two:

- every instance keeps the line (`bridge.compose.board.facts_record`: already scrubbed and
  cut, no time of day written into it) of each agent it serves in the chat's hash
  `P:board:<chat scope>`, one field per agent, written only when it changed, and removed when
  it stops serving the agent there (only if the field is still its own: a new owner's line is
  never removed);
- the instance holding the chat's board lease (`P:lease:board:<chat scope>`, renewed with the
  agents' leases) composes the board from the whole hash and is the only one to send it. A
  line is live only while the instance that wrote it still holds the agent's lease: the lines
  of an instance that died stay, marked as not observed, once its leases lapse (a person
  still sees the agent, and that nobody watches it now), until the next owner of the agent
  writes its line again, or for a day (`UNOBSERVED_KEEP_S`) after the sender found it so.
  An instance that stops withdraws its lines (its agents leave the board with it, as the
  operator chose).

The owner learns of a change from the channel `P:board:changed`: the writer publishes the
chat's scope after each write (one message per change, whatever the fleet's size); `*` asks
every owner to compose each board it holds (an instance stopped or died, or the subscription
was lost and messages may have been missed).

A chat's lines are read within `BOARD_CAPS` and an agent's lease within `MAX_LEASE_BYTES`
(`bridge.store.redis.CAPPED_HASH`, `CAPPED_GET`): a line or lease someone made huge is left
out and named once in the log, not read at each composition.

Every Redis call here is made with the asyncio client: a Redis that is slow to answer (a
failover, a `DEBUG SLEEP`, a paused client) holds only the composition waiting for it, never
the event loop and the rest of the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError

from taskcard.bridge.store.redis import (
    answered,
    capped_fields,
    capped_get,
    capped_hash,
    over_cap,
    raise_if_cancel_swallowed,
    utf8,
    wrong_type,
)

log = logging.getLogger(__name__)

EVERY_BOARD = "*"
# How long a dead instance's line stays on the board, marked as not observed, after the board's
# sender first found it so: then it is removed (its agent is taken to be gone for good).
UNOBSERVED_KEEP_S = 86_400.0

# KEYS: hash; ARGV: field, value. Removes the field only while it holds `value` (this
# instance's own line, not one a new owner of the agent wrote since).
_WITHDRAW = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""

# KEYS: hash; ARGV: field, value, new value. Replaces the field only while it holds `value`.
_RESTAMP = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 0
"""


def _encode(record: Mapping[str, Any], writer: str, lost_at: float | None = None) -> str:
    data: dict[str, Any] = {"writer": writer, "line": record}
    if lost_at is not None:
        data["lost_at"] = lost_at
    return json.dumps(data, sort_keys=True)


# The most read of a chat's lines at each composition (and each answer peeking at them): the
# bytes of one agent's field and line, the agents, and the bytes in all. An honest line is
# under 2 KB (a headline of 80 characters and a movement of 60, each escaped in JSON as 12
# bytes at most, and a few fields more), so a chat of 10,000 agents holds at most 20 MB;
# each cap leaves room. A line past them is left out, named once in the log.
MAX_LINE_BYTES = 16 * 1024
MAX_LINES = 20_000
MAX_BOARD_BYTES = 64 * 1024 * 1024
BOARD_CAPS = (MAX_LINE_BYTES, MAX_LINES, MAX_BOARD_BYTES)
# An agent's lease holds `<owner>|<fence>`: under 100 bytes.
MAX_LEASE_BYTES = 1_024


def _decode(raw: str) -> tuple[str, dict[str, Any], float | None] | None:
    """The writer, the line and when it was found unobserved (`lost_at`) of a stored value;
    None for one this version cannot read (another version's, a hand edit): that agent's
    line is left out, the others stay."""
    try:
        data = json.loads(raw)
        writer, line, lost_at = data["writer"], data["line"], data.get("lost_at")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    if not isinstance(writer, str) or not isinstance(line, dict):
        return None
    if lost_at is not None and (
        isinstance(lost_at, bool)
        or not isinstance(lost_at, int | float)
        or not math.isfinite(lost_at)
    ):
        return None
    return writer, line, lost_at


class SharedBoards:
    """This instance's side of the cluster's boards (see the module's docstring)."""

    def __init__(self, aio: AsyncRedis, prefix: str, owner: str) -> None:
        self._aio = aio
        self._prefix = prefix
        self._owner = owner
        self._withdraw = aio.register_script(_WITHDRAW)
        self._restamp = aio.register_script(_RESTAMP)
        self._written: dict[str, dict[str, str]] = {}  # scope -> agent -> the value written
        # Chats whose lines Redis may have lost (the connection was lost: Redis may have
        # restarted empty): written again whole at their next `share`.
        self._reshare: set[str] = set()
        # Chats whose board this instance composes again at each lease renewal (`retry`):
        # Redis failed while it was composed, or did not take its lines' stamps (`lines`).
        self._recompose: set[str] = set()
        # The lines not observed on the boards this instance composed: chat -> agent -> its
        # writer, and when the line is due to leave the board (epoch). The board is composed
        # again when one of them changes (`retry`): its writer holds the agent's lease again,
        # or its time is up.
        self._unobserved: dict[str, dict[str, tuple[str, float]]] = {}
        # Redis fails (logged once): "write" when it refused a write, which only a write
        # taken ends (a Redis out of memory still answers reads), else "read".
        self._failing: str | None = None
        self._wrong_type: set[str] = set()  # chats' keys of another type (each logged once)

    async def _holders(self, leases: list[str]) -> list[str | None]:
        """Who holds each of the agents' `leases` (None: nobody, or a value not UTF-8 or
        over `MAX_LEASE_BYTES`, not written by an instance and logged once: read as bytes,
        it must not fail the board, nor a huge one be read at each composition)."""
        if not leases:
            return []
        found = await capped_get(self._aio, leases, MAX_LEASE_BYTES)
        holders: list[str | None] = []
        for lease, raw in zip(leases, found, strict=True):
            if isinstance(raw, int):
                over_cap(
                    lease, f"{raw} bytes, no instance's lease", f"delete it (DEL {lease})", once="-"
                )
                raw = None
            holders.append(utf8(lease, "", raw))
        return holders

    async def _stored(self, key: str) -> dict[str, str]:
        """The chat's lines as stored (agent -> value), within `BOARD_CAPS`; a line over
        them is left out, named once in the log."""
        answer = await capped_hash(self._aio, key, *BOARD_CAPS)
        return capped_fields(key, answer, *BOARD_CAPS)

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    @property
    def channel(self) -> str:
        return self._key("board", "changed")

    async def share(self, scope: str, lines: Mapping[str, Mapping[str, Any]]) -> None:
        """Make this instance's lines in the chat `lines` (agent -> its line, of the agents
        it serves there now): the changed ones are written, those of agents it no longer
        serves there removed, in one round trip (none when nothing changed)."""
        wanted = {agent: _encode(line, self._owner) for agent, line in lines.items()}
        written = self._written.get(scope, {})
        gone = {agent: value for agent, value in written.items() if agent not in wanted}
        fresh = {agent: value for agent, value in wanted.items() if written.get(agent) != value}
        if not gone and not fresh:
            return
        key = self._key("board", scope)
        try:
            pipe = self._aio.pipeline(transaction=False)
            for agent, value in gone.items():
                await self._withdraw(keys=[key], args=[agent, value], client=pipe)
            if fresh:
                pipe.hset(key, mapping=cast(dict[Any, Any], fresh))
            pipe.publish(self.channel, scope)
            await pipe.execute()
        except RedisError as error:
            await self._said(error, key, wrote=True)
            # Shared again at the next lease renewal (`retry`): a Redis that refuses writes
            # but stays connected (OOM, READONLY) announces no reconnection.
            self._reshare.add(scope)
            return
        await self._said(None, key, wrote=True)
        self._reshare.discard(scope)
        if wanted:
            self._written[scope] = wanted
        else:
            self._written.pop(scope, None)

    async def lines(
        self, scope: str, now: float | None = None
    ) -> dict[str, tuple[dict[str, Any], bool]] | None:
        """Every agent's line in the chat (agent -> its line, and whether its writer still
        holds the agent's lease: False when no instance observes the agent now, its
        instance died); None (logged) when Redis does not answer.

        A line found unobserved is stamped with the time (`lost_at`, once: this is read
        only when a board is composed, so the cost follows the changes) and left out, and
        removed, `UNOBSERVED_KEEP_S` after that: an agent whose instance died is shown as
        not observed for a day, not for ever. The stamps are written at best: a Redis that
        refuses writes (OOM, READONLY) still lets the board be composed."""
        now = time.time() if now is None else now
        key = self._key("board", scope)
        try:
            stored = await self._stored(key)
            found = [(agent, raw, _decode(raw)) for agent, raw in sorted(stored.items())]
            usable = [(agent, raw, item) for agent, raw, item in found if item is not None]
            leases = [self._key("lease", "agent", agent) for agent, _, _ in usable]
            holders = await self._holders(leases)
        except RedisError as error:
            await self._said(error, key)
            self._recompose.add(scope)  # composed again at the next lease renewal
            return None
        await self._said(None, key)
        self._recompose.discard(scope)
        shown: dict[str, tuple[dict[str, Any], bool]] = {}
        unobserved: dict[str, tuple[str, float]] = {}
        pipe = self._aio.pipeline(transaction=False)
        for (agent, raw, (writer, line, lost_at)), holder in zip(usable, holders, strict=True):
            if holder is not None and holder.startswith(writer + "|"):
                shown[agent] = (line, True)
                if lost_at is not None:  # its writer has its lease back (a Redis outage)
                    # Unstamped again: the value its writer knows, and withdraws at stop.
                    await self._restamp(
                        keys=[key], args=[agent, raw, _encode(line, writer)], client=pipe
                    )
            elif lost_at is None:
                stamped = _encode(line, writer, now)
                await self._restamp(keys=[key], args=[agent, raw, stamped], client=pipe)
                shown[agent] = (line, False)
                unobserved[agent] = (writer, now + UNOBSERVED_KEEP_S)
            elif now - lost_at < UNOBSERVED_KEEP_S:
                shown[agent] = (line, False)
                unobserved[agent] = (writer, lost_at + UNOBSERVED_KEEP_S)
            else:
                await self._withdraw(keys=[key], args=[agent, raw], client=pipe)
        if len(pipe):
            try:
                await pipe.execute()
            except RedisError:
                self._recompose.add(scope)  # stamped at the next composition then
        if unobserved:
            self._unobserved[scope] = unobserved
        else:
            self._unobserved.pop(scope, None)
        return shown

    async def peek(self, scope: str) -> dict[str, dict[str, Any]] | None:
        """The lines in the chat whose writer still observes their agent (agent -> its
        line), for an answer: two reads, nothing stamped or removed (see `lines` for the
        board's); None when Redis does not answer (the answer goes without). A line whose
        writer lost the agent's lease (its instance died) is left out: the answer would give
        a dead instance's last state as the agent's now."""
        try:
            key = self._key("board", scope)
            stored = await self._stored(key)
            usable = [
                (agent, item) for agent, raw in stored.items() if (item := _decode(raw)) is not None
            ]
            leases = [self._key("lease", "agent", agent) for agent, _ in usable]
            holders = await self._holders(leases)
        except RedisError as error:
            log.warning(
                "chat %s: the other instances' board lines were not read for an answer (%s)",
                scope,
                type(error).__name__,
            )
            return None
        return {
            agent: line
            for (agent, (writer, line, lost_at)), holder in zip(usable, holders, strict=True)
            if lost_at is None and holder is not None and holder.startswith(writer + "|")
        }

    async def withdraw_all(self) -> None:
        """Remove every line this instance wrote (it stops) and tell the boards' owners."""
        if not self._written:
            return
        try:  # one round trip: a stop while Redis does not answer waits for one call only
            pipe = self._aio.pipeline(transaction=False)
            for scope, written in sorted(self._written.items()):
                for agent, value in written.items():
                    await self._withdraw(
                        keys=[self._key("board", scope)], args=[agent, value], client=pipe
                    )
                pipe.publish(self.channel, scope)
            await pipe.execute()
        except RedisError as error:
            log.warning(
                "could not remove this instance's board lines (%s); they leave the boards"
                " when its leases lapse",
                type(error).__name__,
            )
        self._written.clear()

    def failed(self, scope: str) -> bool:
        """Whether the chat's lines must be shared again: its key held another type when
        last used (shared again when the key is gone: see `retry`), or Redis may have lost
        them (see `follow`)."""
        return scope in self._reshare or self._key("board", scope) in self._wrong_type

    async def retry(self, now: float | None = None) -> None:
        """Announce the chats whose key held another type, so that their lines are shared
        and their boards composed again once the key is deleted (each lease renewal).

        Also the chats whose lines Redis did not take (`share`), whose board could not be
        composed (`lines`: a Redis that refuses but stays connected announces no
        reconnection), and whose board this instance composed with a line not observed
        that changed since: its writer got the agent's lease back (a Redis outage, a Redis
        restarted empty) without writing anything, since its line did not change, so
        nothing else announces that the line is live again; or its day on the board is
        over. A board whose unobserved lines did not change is not composed again: what
        it shows is the same. This costs one read of those agents' leases per renewal,
        and one message per chat to compose again."""
        head = self._key("board", "")
        scopes = {key.removeprefix(head) for key in self._wrong_type}
        scopes |= self._reshare | self._recompose
        with contextlib.suppress(RedisError):
            changed = await self._unobserved_changed(time.time() if now is None else now)
            for scope in sorted(scopes | changed):
                await self._aio.publish(self.channel, scope)
            for scope in changed:  # watched again once composed (`lines`), if still so
                self._unobserved.pop(scope, None)

    async def _unobserved_changed(self, now: float) -> set[str]:
        """The chats with a line not observed when composed that would show otherwise now."""
        watched = [
            (scope, agent, writer, due)
            for scope, lines in self._unobserved.items()
            for agent, (writer, due) in lines.items()
        ]
        if not watched:
            return set()
        leases = [self._key("lease", "agent", agent) for _, agent, _, _ in watched]
        holders = await self._holders(leases)
        return {
            scope
            for (scope, _, writer, due), holder in zip(watched, holders, strict=True)
            if now >= due or (holder is not None and holder.startswith(writer + "|"))
        }

    async def every_board_changed(self) -> None:
        """Ask every board's owner to compose it again (an instance left the cluster)."""
        try:
            await self._aio.publish(self.channel, EVERY_BOARD)
        except RedisError as error:
            await self._said(error)

    async def _said(
        self, error: RedisError | None, key: str | None = None, *, wrote: bool = False
    ) -> None:
        """Log a failure once while it lasts (a chat's key of another type once by name,
        with the fix), and its end: a refused write ends only when a write is taken (`wrote`),
        since a Redis out of memory or read-only still answers the reads."""
        if error is None:
            if key is not None and key in self._wrong_type:
                self._wrong_type.discard(key)
                log.info("the board of Redis key %s is shared again", key)
            if self._failing is not None and (wrote or self._failing == "read"):
                self._failing = None
                log.info("sharing the chats' board lines works again")
            return
        if key is not None and answered(error, "WRONGTYPE"):
            if key not in self._wrong_type:
                self._wrong_type.add(key)
                found = "other type"
                with contextlib.suppress(RedisError):
                    found = str(await self._aio.type(key))
                log.error("a chat's board cannot be shared: %s", wrong_type(key, found, "hash"))
            return
        failing = self._failing
        if wrote:
            self._failing = "write"
        elif failing is None:
            self._failing = "read"
        if failing is None:
            log.warning(
                "sharing the chats' board lines through Redis failed (%s); the boards are"
                " composed again once Redis answers",
                type(error).__name__,
            )

    async def follow(self, changed: Callable[[str], None]) -> None:
        """Call `changed(scope)` for each board change any instance announces, until
        cancelled; after (re)subscribing, `changed(EVERY_BOARD)`, since messages sent
        while this instance was not subscribed are lost. After a lost connection, this
        instance's lines are written again too, each chat's whole (`changed(scope)`): Redis
        may have restarted empty, and a line is written only when it changes, so an agent
        that did not change left the board. This costs one write per chat served here, at
        each reconnection only."""
        failures = 0
        while True:
            pubsub: Any = self._aio.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                if failures:
                    log.info("following the boards' changes works again")
                    self._reshare.update(self._written)
                    self._written.clear()
                failures = 0
                changed(EVERY_BOARD)
                for scope in sorted(self._reshare):
                    changed(scope)
                while True:
                    message = await pubsub.get_message(timeout=None)
                    raise_if_cancel_swallowed()
                    if message is not None and message.get("type") == "message":
                        changed(str(message["data"]))
            except RedisError as error:
                failures += 1
                if failures == 1:
                    log.warning(
                        "following the boards' changes through Redis failed (%s); retrying",
                        type(error).__name__,
                    )
            except Exception:
                failures += 1
                log.exception("following the boards' changes failed; retrying")
            finally:
                with contextlib.suppress(RedisError, asyncio.CancelledError):
                    await asyncio.shield(pubsub.aclose())
            raise_if_cancel_swallowed()
            await asyncio.sleep(min(5.0, 0.2 * 2**failures))
