"""Orchestrator wakes across instances: a chat's wake kept in Redis for its orchestrator's server.

A chat's orchestrator is woken through its inbox (`bridge.run.orchestrators`), a file the
instance that sees another agent's signal writes. Clustered, that instance may not serve the
orchestrator at all (its routes of the chat name other agents; the mark is another instance's
route setting, or the chat's choice of an agent it does not follow). It then keeps the wake in
the chat's sorted set `P:wakes:<chat scope>` (member: the wake's typed fields as JSON; score:
when it was kept), and the instance holding the lease of the chat's orchestrator takes the
chat's wakes at each lease renewal, wakes the orchestrator with each (the inbox desk's wake:
one per signal, recorded in the shared notices, a burst of reports in one) and removes them.

What holds:

- *Restart-safe*: a wake stays in Redis until an instance woke the orchestrator with it, so an
  orchestrator whose instance is stopped (or moving to another) is woken once it is served
  again; one taken and woken but not yet removed (a crash between the two) is taken again,
  and the shared notice refuses it as known.
- *Once in the cluster*: the same signal kept twice (an agent followed in two chats marking the
  same orchestrator, or a wake also written directly) is one notice, so one wake.
- *Typed*: only the agent's id, its folder, the signal's episode, the report's number, whether
  it is a report and the notice's text travel; the pointer the orchestrator reads first is
  built from the first three by the instance that wakes it, and a member that does not parse
  as these fields is dropped, not acted on.
- *Bounded*: wakes are kept only for a chat whose orchestrator an instance served within
  `KEEP_S` (that instance renews the chat's mark `P:orchestrated:<chat scope>` at each lease
  renewal), so a chat without one keeps nothing; none older than `KEEP_S`. An orchestrator
  first served after the signal (a cluster's first start) is not woken by it.
- *Capped per agent, by kind*: each agent keeps at most `MAX_REPORTS_PER_AGENT` report wakes
  and `MAX_SIGNALS_PER_AGENT` others (exited, idle, no output) in a chat, its oldest of that
  kind dropped past that. So an agent reporting very fast drops only its own oldest reports,
  never another agent's wake nor its own exit or idle one. Each agent's wakes of a kind are
  also listed in a sorted set of their own (`P:wakes-of:<kind>:<agent>:<chat scope>`), so
  keeping one costs a few calls whatever the chat holds; a wake taken leaves both. A member
  whose agent and kind cannot be read leaves the chat's set alone (the agent's list lets it
  go with its cap or `KEEP_S`). `MAX_PER_CHAT` bounds the chat's set whatever the agents (its
  memory in Redis); the caps per agent keep it far below that.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the service imports this module unclustered too, without redis
    import redis
    from redis.asyncio import Redis as AsyncRedis

log = logging.getLogger(__name__)

# A wake nobody took for a day is dropped: the orchestrator it was for is gone or was never
# served (a chat without one), and the agent's report is still in its folder.
KEEP_S = 86_400.0
MAX_REPORTS_PER_AGENT = 200
MAX_SIGNALS_PER_AGENT = 50
# A bound on the chat's set for memory's sake only (a wake is at most about 16 KiB): the
# caps per agent keep it below unless about 20 agents of one chat each fill theirs while its
# orchestrator is not served.
MAX_PER_CHAT = 5_000
# Taken per chat at one renewal: each is an inbox write and a few state calls on the loop, so
# a burst (an agent reporting many times a second) is spread over renewals, not one long turn.
TAKE_PER_RENEWAL = 100
MAX_TEXT_CHARS = 16_384
MAX_EPISODE_CHARS = 512
# A member longer than its fields allow (each escaped, six characters for one) is not read.
MAX_WAKE_CHARS = 6 * (MAX_TEXT_CHARS + MAX_EPISODE_CHARS + 8_192)
# Nor carried here: one over this many bytes (four a character at most in UTF-8) is dropped
# in Redis by the take (`_TAKE`), counted in the log.
MAX_WAKE_BYTES = 4 * MAX_WAKE_CHARS

# KEYS: the chat's wakes; ARGV: the most taken, the most bytes of one. The first wakes, those
# over the size removed instead (no instance writes one), and how many were.
_TAKE = """
local found, dropped = {}, {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  if #member > tonumber(ARGV[2]) then
    dropped[#dropped + 1] = member
  else
    found[#found + 1] = member
  end
end
for _, member in ipairs(dropped) do redis.call('ZREM', KEYS[1], member) end
return {found, #dropped}
"""


# KEYS: the chat's wakes (sorted set), its served mark, the agent's wakes of this kind in the
# chat (sorted set); ARGV: the wake, now (s), keep (s), most kept in the chat, most kept of
# the agent's of this kind. Kept only when an instance served the chat's orchestrator within
# `KEEP_S` (it renews the mark while it does): a chat without one, the common case, keeps
# nothing. Past the agent's cap, its oldest of the kind leave both sets (one, usually).
_KEEP = """
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
local now, keep = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], 'NX', now, ARGV[1])
redis.call('ZADD', KEYS[3], 'NX', now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - keep)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - keep)
local excess = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[5])
if excess > 0 then
  local oldest = redis.call('ZRANGE', KEYS[3], 0, excess - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, excess - 1)
  redis.call('ZREM', KEYS[1], unpack(oldest))
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
redis.call('EXPIRE', KEYS[1], math.floor(keep))
redis.call('EXPIRE', KEYS[3], math.floor(keep))
return 1
"""


@dataclass(frozen=True)
class RelayedWake:
    """A signal of `agent_id`, followed in the chat, for that chat's orchestrator."""

    agent_id: str
    workdir: str
    episode: str
    report_seq: int | None
    report: bool
    text: str


def encode_wake(wake: RelayedWake) -> str:
    return json.dumps(
        {
            "agent": wake.agent_id,
            "workdir": wake.workdir,
            "episode": wake.episode,
            "report_seq": wake.report_seq,
            "report": wake.report,
            "text": wake.text,
        },
        ensure_ascii=False,
        sort_keys=True,
    )


def decode_wake(raw: str, valid_agent: Callable[[str], object]) -> RelayedWake | None:
    """The wake `raw` holds, or None when it is not one this version writes (another
    version's, a hand edit's): such a member is dropped. `valid_agent` checks an agent id
    (the config's rule, which this package does not import)."""
    if len(raw) > MAX_WAKE_CHARS:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    agent, workdir, episode = data.get("agent"), data.get("workdir"), data.get("episode")
    seq, report, text = data.get("report_seq"), data.get("report"), data.get("text")
    if not (isinstance(agent, str) and valid_agent(agent)):
        return None
    if not (isinstance(workdir, str) and "\0" not in workdir and workdir.startswith("/")):
        return None
    if not (isinstance(episode, str) and 0 < len(episode) <= MAX_EPISODE_CHARS):
        return None
    if seq is not None and (type(seq) is not int or seq < 1):
        return None
    if not isinstance(report, bool) or not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        return None
    normal = str(PurePosixPath(workdir))
    return RelayedWake(agent, normal, episode, seq, report, text)


class WakeRelay:
    """The chats' kept wakes in Redis: `keep` from the instance seeing the signal, `take` and
    `done` from the one serving the orchestrator."""

    def __init__(
        self,
        client: redis.Redis,
        aio: AsyncRedis,
        prefix: str,
        *,
        max_reports_per_agent: int = MAX_REPORTS_PER_AGENT,
        max_signals_per_agent: int = MAX_SIGNALS_PER_AGENT,
    ) -> None:
        self._aio = aio
        self._prefix = prefix
        self._keep = client.register_script(_KEEP)
        self._caps = {"report": max_reports_per_agent, "signal": max_signals_per_agent}

    def _key(self, scope: str) -> str:
        return f"{self._prefix}:wakes:{scope}"

    def _served_key(self, scope: str) -> str:
        return f"{self._prefix}:orchestrated:{scope}"

    def keep(self, scope: str, wake: RelayedWake) -> None:
        """Keep `wake` for the orchestrator of chat `scope`, if an instance served one there
        within `KEEP_S`; a Redis that refuses it is logged (that orchestrator is not woken by
        this signal)."""
        from redis.exceptions import RedisError

        from taskcard.bridge.store.redis import redis_trouble

        kind = "report" if wake.report else "signal"
        of_agent = self._agent_key(kind, wake.agent_id, scope)
        try:
            self._keep(
                keys=[self._key(scope), self._served_key(scope), of_agent],
                args=[
                    encode_wake(wake),
                    repr(time.time()),
                    KEEP_S,
                    MAX_PER_CHAT,
                    self._caps[kind],
                ],
            )
        except RedisError as error:
            log.warning(
                "agent %s: the wake of chat %s's orchestrator, served by another instance, was"
                " not kept in Redis (%s); that orchestrator is not woken by this signal",
                wake.agent_id,
                scope,
                redis_trouble(error),
            )

    async def take(self, scopes: Iterable[str]) -> dict[str, list[str]]:
        """The wakes kept for each of `scopes`, chats whose orchestrator this instance serves
        (oldest first, as kept; at most `TAKE_PER_RENEWAL`, the rest left for later), noting
        for the others that these chats have one served (raises `RedisError`)."""
        from redis.client import NEVER_DECODE

        wanted = sorted(set(scopes))
        if not wanted:
            return {}
        async with self._aio.pipeline(transaction=False) as pipe:
            for scope in wanted:
                pipe.set(self._served_key(scope), "1", ex=int(KEEP_S))
                # As bytes: a member not UTF-8 (not written by any instance) is removed here,
                # and must not fail the reading of the chats' other wakes.
                pipe.execute_command(
                    "EVAL",
                    _TAKE,
                    1,
                    self._key(scope),
                    TAKE_PER_RENEWAL,
                    MAX_WAKE_BYTES,
                    **{NEVER_DECODE: True},
                )
            found: list[tuple[list[bytes], int]] = (await pipe.execute())[1::2]
        taken: dict[str, list[str]] = {}
        unreadable: dict[str, list[bytes]] = {}
        for scope, (members, dropped) in zip(wanted, found, strict=True):
            if dropped:
                log.warning(
                    "chat %s: %d kept wakes over %d bytes (not written by an instance) were"
                    " dropped unread from Redis key %s",
                    scope,
                    dropped,
                    MAX_WAKE_BYTES,
                    self._key(scope),
                )
            for member in members:
                try:
                    taken.setdefault(scope, []).append(member.decode())
                except UnicodeDecodeError:
                    unreadable.setdefault(scope, []).append(member)
        if unreadable:
            async with self._aio.pipeline(transaction=False) as pipe:
                for scope, members in unreadable.items():
                    pipe.zrem(self._key(scope), *members)
                    log.warning(
                        "chat %s: %d kept wakes not UTF-8 (not written by an instance) were"
                        " dropped",
                        scope,
                        len(members),
                    )
                await pipe.execute()
        return taken

    def _agent_key(self, kind: str, agent_id: str, scope: str) -> str:
        return f"{self._prefix}:wakes-of:{kind}:{agent_id}:{scope}"

    async def done(self, taken: Mapping[str, Iterable[str]]) -> None:
        """Forget the wakes `taken` (woken with, or not wakes at all), in the chat's set and
        in their agents' lists: left there, each agent's list held its last 200 reports'
        texts for a day though every one had been taken."""
        async with self._aio.pipeline(transaction=False) as pipe:
            for scope, members in taken.items():
                listed = list(members)
                if not listed:
                    continue
                pipe.zrem(self._key(scope), *listed)
                for member in listed:
                    if (of := _agent_and_kind(member)) is not None:
                        pipe.zrem(self._agent_key(of[1], of[0], scope), member)
            await pipe.execute()


def _agent_and_kind(member: str) -> tuple[str, str] | None:
    """The agent and kind (`report`, `signal`) a kept wake's member names, None when it is
    not one this version writes."""
    try:
        data = json.loads(member)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    agent, report = data.get("agent"), data.get("report")
    if not isinstance(agent, str) or not isinstance(report, bool):
        return None
    return agent, "report" if report else "signal"
