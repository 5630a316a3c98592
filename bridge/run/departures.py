"""Agents that leave the fleet, and cards whose route went: the last edits and forgetting.

An agent that leaves while the service runs gets one last edit on each of its cards (it
retired) and is forgotten `forget_departed_after_s` later unless it comes back
(`_departure`, `_returned`, `_forget_due`). One that left while the service was stopped is
found at the start and owed the same edit (`_follow_departures`, `_owe_retirements`,
`_retire_left`). A route that goes while its agent stays served (a reload, or found at the
start with no route) gets the edit saying its chat no longer follows the agent (`_unfollow`,
`_owe_unfollows`, `_unfollow_stale`). The edits a start owes wait for a quiet moment in
their chat, or go ahead of the live cards once they have waited past a bound
(`_held_edit_may_go`).

A mixin of `Service`, not a collaborator: every step here reads and writes the route tables
the rest of the service keeps (`_routes`, `_scheduled`, `_closing`, `_boards`) and calls on
the scheduler, the store, the desk, the outbox and the channels, so a separate object would
need a reference to nearly all of the service. The state of its own (`_departed`,
`_departed_routes`, `_retire_owed`, `_unfollow_owed`, `_unfollowing`, `_held_since`,
`_held_ahead`) is made in `Service.__init__` with the rest; what it uses of the service is
declared below, for the type checker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Literal

from taskcard.bridge.config import AGENT_ID_PATTERN, ServiceConfig
from taskcard.bridge.notices.outbox import FOLDED_CURSOR_PREFIX, NoticeOutbox
from taskcard.bridge.run.boards import BOARD_AGENT
from taskcard.bridge.run.fleet import RETIRED_NOTE, UNROUTED_NOTE, Route
from taskcard.bridge.run.health import AGENT_HEALTH_PREFIX, agent_health_key
from taskcard.bridge.run.inbox_desk import STATUS_AGENT_PREFIX, WAKE_ROUTE_PREFIX, InboxDesk
from taskcard.bridge.run.orchestrators import ChatOrchestrators
from taskcard.bridge.run.origins import OriginBook
from taskcard.bridge.schedule.routes import LaneKey, route_of_store_key
from taskcard.bridge.schedule.scheduler import CARD_REFUSED_PREFIX, RouteKey, RouteScheduler
from taskcard.bridge.store.sqlite import ChatPrefs, ResidentRecord, StateStore
from taskcard.bridge.track.due import DueAgents
from taskcard.bridge.track.monitor import ActivitySummary, AgentMonitor, CardState
from taskcard.channels.base import Channel, ChatRef, Outgoing, counted

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

log = logging.getLogger(__name__)

# When an agent left the fleet (epoch seconds), kept until its state is forgotten
# (`forget_departed_after_s` later) or it comes back.
DEPARTED_PREFIX = "departed:"
# A departed agent whose last edits are still on their way is forgotten this much later.
FORGET_RETRY_S = 30.0
# At most this many departed agents are forgotten per timer tick; the others stay due for
# the next ticks. Agents that left together (a discovery root unmounted, the first start
# after an upgrade marking every old agent) come due in the same second, and the timer runs
# on the event loop: unbounded, thousands of them would hold up every card and command.
FORGET_PER_TICK = 10
# A start edits at most this many cards per chat to say their agent left while the service
# was stopped: they share the chat's budget with its live cards (a Telegram group's 20 edits
# a minute), so a mass departure (a root not mounted yet, an upgrade) leaves the rest as
# they are, said in the log, rather than holding the live cards back for minutes.
RETIRE_AT_START_PER_CHAT = 10
# Kept as the resident's disabled reason once its last edit said that its chat no longer
# follows the agent (`Service._unfollow`): no later start says it again, and the route
# there again clears it (`RouteScheduler.add_route`) and edits the card back.
UNFOLLOWED_REASON = (
    "no longer followed: the configuration stopped routing this agent here, and its card says so"
)
# A start edits the cards of routes that went while the service was stopped a few a second
# per channel, each in a chat whose lane has nothing else to do (`Service._unfollow_stale`):
# thousands of them never hold up a live card nor spend much of the bot's (the app's)
# budget. At most this many chats are looked at a second (the others wait their turn).
UNFOLLOW_PER_TICK = 3
UNFOLLOW_LANES_PER_TICK = 100
# Those last edits, and a start's retirements (`Service._retire_left`), wait for their chat's
# lane to be idle; in a chat whose cards change faster than its limit lets them out it never
# is, and they waited for good, the cards showing agents the chat no longer follows. So one
# that has waited this many of its chat's paces (`RouteScheduler.lane_pace_s`), and at least
# `HELD_EDIT_FLOOR_S`, takes the lane's next turn ahead of the live cards, one at a time
# (`Service._held_edit_may_go`): 30 s in a Telegram group (20 a minute), 10 s in a private
# chat or on Feishu, so a busy chat gives them at most one request in ten of its own.
HELD_EDIT_PACES = 10
HELD_EDIT_FLOOR_S = 10.0


class Departures:
    """The departures, retirements and unfollows of `Service` (see the module docstring)."""

    # Made by `Service.__init__`.
    _config: ServiceConfig
    _channels: dict[str, Channel]
    _store: StateStore
    _clock: Callable[[], datetime]
    _owned: set[str] | None
    _origins: OriginBook
    _outbox: NoticeOutbox
    _scheduler: RouteScheduler
    _desk: InboxDesk
    _orchestrators: ChatOrchestrators
    _routes: list[Route]
    _routes_by_agent: dict[str, list[Route]]
    _monitors: dict[str, AgentMonitor]
    _unread: set[str]
    _closing: dict[RouteKey, float]
    _scheduled: set[RouteKey]
    _boards: set[RouteKey]
    _ready_channels: set[str]
    _first_read: bool
    _running: bool
    _departed: DueAgents
    _departed_routes: dict[str, list[RouteKey]]
    _retire_owed: dict[str, list[RouteKey]]
    _unfollow_owed: dict[LaneKey, list[RouteKey]]
    _unfollowing: set[RouteKey]
    _held_since: dict[LaneKey, float]
    _held_ahead: dict[LaneKey, RouteKey]

    if TYPE_CHECKING:  # the service's, used here

        def _serves(self, agent_id: str) -> bool: ...
        def _chat_zone(self, channel: str, chat: ChatRef) -> tzinfo: ...
        def _chat_prefs(self, scope: str) -> ChatPrefs: ...
        def _guard(self, agent_id: str, stage: str) -> AbstractContextManager[None]: ...
        def _close_route(self, route: Route, final: Outgoing | None) -> None: ...
        def _board_unrouted(self, key: RouteKey) -> bool: ...
        def _unfollow_board(self, key: RouteKey) -> None: ...
        def _last_edit(
            self,
            channel: Channel,
            agent_id: str,
            card: CardState,
            activity: ActivitySummary,
            zone: tzinfo,
            note: str,
        ) -> Outgoing: ...

    def _forget_departed(self) -> None:
        """At start, alone on the state (a cluster's instances may serve other fleets): the
        state rows that only matter while an agent is served, of agents no longer in the
        fleet. Only rows safe to drop at once: the report-wake cursors (`forget_departed`)
        and the health kept for `taskcard status`, which the agent's files tell again. What
        an agent that comes back needs stays: its files' offsets (so what it wrote while away
        is neither lost nor said twice), its residents, notices and inbox records. A
        discovered agent whose folder the first scan missed loses its report-wake cursor
        too, which is as harmless as for one that left."""
        fleet = set(self._monitors)
        try:
            wakes = self._desk.forget_departed(fleet)
            health = [
                key
                for key in self._store.cursor_keys(AGENT_HEALTH_PREFIX)
                if key[len(AGENT_HEALTH_PREFIX) :] not in fleet
            ]
            self._store.delete_cursors(health)
        except Exception as error:
            # Housekeeping: a state file that fails now is the writes' business (logged and
            # retried there); the next start forgets these rows instead.
            log.warning("the state of agents no longer served was not forgotten: %s", error)
            return
        if wakes or health:
            log.info(
                "forgot the state of agents no longer served: %s, %s",
                counted(wakes, "report-wake cursor", "report-wake cursors"),
                counted(len(health), "health record", "health records"),
            )

    def _residents_at_start(self) -> list[ResidentRecord] | None:
        """Every resident the state keeps, read once at start for the cards owed a last
        edit (`_owe_retirements`, `_owe_unfollows`); None when the state cannot be read
        now (logged: those cards are looked at again at the next start)."""
        try:
            return self._store.residents()
        except Exception as error:
            log.warning("the cards of routes no longer served were not looked up: %s", error)
            return None

    def _follow_departures(self, residents: list[ResidentRecord] | None) -> None:
        """At start, alone on the state: the agents that left the fleet, each due to be
        forgotten `forget_departed_after_s` after it left. Those that left while the service
        was stopped (or before departures were recorded) are found by their offsets, which
        every agent read has, and count as leaving now. One read of the departures and of
        the offsets' agents; from then on a departure is recorded when it happens and
        forgotten by the once-a-second timer, which looks only at those due."""
        keep_s = self._config.forget_departed_after_s
        now = self._clock().timestamp()
        try:
            marked: dict[str, float] = {}
            for key in self._store.cursor_keys(DEPARTED_PREFIX):
                try:
                    marked[key[len(DEPARTED_PREFIX) :]] = float(self._store.get_cursor(key) or "")
                except ValueError:
                    marked[key[len(DEPARTED_PREFIX) :]] = now  # not ours: from now on
            back = [agent for agent in marked if agent in self._monitors]
            self._store.delete_cursors(DEPARTED_PREFIX + agent for agent in back)
            unmarked = self._store.offset_agents() - marked.keys() - self._monitors.keys()
        except Exception as error:
            log.warning("the agents no longer served were not looked up: %s", error)
            return
        left = {agent_id for agent_id in unmarked if AGENT_ID_PATTERN.fullmatch(agent_id)}
        # Before the departures are recorded: a failure here retires none of them later.
        if residents is not None:
            self._owe_retirements(left, residents)
        for agent_id in sorted(left):
            self._store.set_cursor(DEPARTED_PREFIX + agent_id, repr(now))
            marked[agent_id] = now
        for agent_id, left_at in marked.items():
            if agent_id not in self._monitors:
                self._departed.set(agent_id, min(left_at, now) + keep_s)
        if self._departed:
            log.info(
                "%s no longer served: each is forgotten %.0f s after it left, unless it comes back",
                counted(len(self._departed), "agent", "agents"),
                keep_s,
            )

    def _owe_retirements(self, agents: set[str], records: list[ResidentRecord]) -> None:
        """At start, alone on the state: the resident messages of `agents`, which left while
        the service was stopped, are owed the last edit a departure while serving gives them
        (`_retire`: the card says the agent retired), made once their channel is ready and
        their chat's live cards are out (`_retire_left`). Their agents are forgotten only
        after it, as for a departure while serving."""
        if not agents:
            return
        now = self._clock().timestamp()
        per_chat: dict[LaneKey, list[tuple[float, RouteKey]]] = {}
        for record in records:
            # The inbox desk's status messages (`inbox:<id>` in the agent's place) are not cards.
            if record.message_id is None or f":{STATUS_AGENT_PREFIX}" in record.route:
                continue
            key = route_of_store_key(record.route)
            if key is None or key.agent_id not in agents or key.channel not in self._channels:
                continue
            edited = now if record.committed_at is None else record.committed_at
            per_chat.setdefault(key.lane, []).append((edited, key))
        left = 0
        for found in per_chat.values():
            found.sort(key=lambda item: item[0], reverse=True)  # the latest edited first
            left += max(0, len(found) - RETIRE_AT_START_PER_CHAT)
            for _, key in found[:RETIRE_AT_START_PER_CHAT]:
                self._scheduler.add_route(key)
                self._scheduled.add(key)
                self._retire_owed.setdefault(key.channel, []).append(key)
                self._departed_routes.setdefault(key.agent_id, []).append(key)
        if self._retire_owed:
            owed = sum(len(keys) for keys in self._retire_owed.values())
            log.info(
                "%s of agents that left while the service was stopped %s marked"
                " retired once their chat's live cards are out",
                counted(owed, "card", "cards"),
                "is" if owed == 1 else "are",
            )
        if left:
            log.info(
                "%s of agents that left while the service was stopped %s left as %s: a"
                " start marks the %d edited last in each chat, so that its live cards keep"
                " the chat's budget",
                counted(left, "card", "cards"),
                "is" if left == 1 else "are",
                "it is" if left == 1 else "they are",
                RETIRE_AT_START_PER_CHAT,
            )

    def _owe_unfollows(self, records: list[ResidentRecord] | None) -> None:
        """At start: the residents of routes the fleet no longer has (a route, an agent taken
        out of a route, or a chat out of `origin_chats`, while the service was stopped) whose
        agent it still serves are owed the last edit a reload gives them (`_unfollow`), and
        get it a few at a time once the live cards are out (`_unfollow_stale`). Those of
        agents gone from the fleet are the retirements' (`_owe_retirements`); a resident
        already told (`UNFOLLOWED_REASON`) or refused by its chat is left as it is.
        Clustered, only the instance that serves the agent edits its cards, once its lease
        is held (`_unfollow_stale` asks)."""
        if not records:
            return
        wanted = {route.key for route in self._routes}
        owed = 0
        for record in records:
            if (
                record.message_id is None
                or record.disabled_reason is not None
                or f":{STATUS_AGENT_PREFIX}" in record.route  # the inbox desk's, not cards
            ):
                continue
            key = route_of_store_key(record.route)
            if key is None or key in wanted:
                continue
            if key.agent_id == BOARD_AGENT:
                if not self._board_unrouted(key):
                    continue
            elif key.agent_id not in self._monitors:
                continue
            channel = self._channels.get(key.channel)
            if channel is None or not channel.messages_outlive_process:
                continue  # a channel gone, or the console's panels, gone with their run
            self._unfollow_owed.setdefault(key.lane, []).append(key)
            owed += 1
        if owed:
            log.info(
                "%s of routes the configuration no longer has %s marked no longer followed,"
                " a few a second once their chats' live cards are out",
                counted(owed, "card", "cards"),
                "is" if owed == 1 else "are",
            )

    def _unfollow_stale(self) -> None:
        """Once a second, after the agents' first reading: the next of the residents
        `_owe_unfollows` found get their last edit, each in a chat whose lane has nothing
        else to do (`RouteScheduler.lane_idle`), at most `UNFOLLOW_PER_TICK` per channel. So
        a start that finds thousands never bursts past a limit (the lanes pace each as any
        request), puts one before a live card of its chat only when the chat stayed busy
        past the bound (`_held_edit_may_go`), and leaves most of the bot's (the app's)
        budget to the live cards of the other chats."""
        if not self._unfollow_owed or not self._first_read:
            return
        now = asyncio.get_running_loop().time()
        budget = dict.fromkeys(self._ready_channels, UNFOLLOW_PER_TICK)
        for lane in list(itertools.islice(self._unfollow_owed, UNFOLLOW_LANES_PER_TICK)):
            keys = [key for key in self._unfollow_owed.pop(lane) if self._unwanted(key)]
            # Clustered: an agent whose lease another instance holds is that one's.
            key = next((k for k in keys if self._serves(k.agent_id)), None)
            way = None
            if (
                budget.get(lane.channel, 0) > 0
                and key is not None
                and key.agent_id not in self._unread
            ):
                way = self._held_edit_may_go(lane, now)
            if key is not None and way is not None:
                keys.remove(key)
                budget[lane.channel] -= 1
                try:
                    self._unfollow_resident(key)
                except Exception as error:
                    log.warning(
                        "route %s: its card was not marked no longer followed (%s); the"
                        " next start tries again",
                        key,
                        error,
                    )
                self._held_edit_went(key, way, now)
            if keys:
                self._unfollow_owed[lane] = keys  # behind the other chats: each in turn

    def _unwanted(self, key: RouteKey) -> bool:
        """Whether a resident `_owe_unfollows` found is still owed its last edit: its agent
        is still served, and no reload routed it again meanwhile (a board: its chat is still
        routed no agent)."""
        if key.agent_id == BOARD_AGENT:
            return key not in self._boards and self._board_unrouted(key)
        return (
            key.agent_id in self._monitors
            and key not in self._scheduled
            and all(route.key != key for route in self._routes_by_agent.get(key.agent_id, ()))
        )

    def _unfollow_resident(self, key: RouteKey) -> None:
        """The last edit of a resident whose route went while the service was stopped, the
        way a reload gives it (`_unfollow`). Its record is read again first: clustered,
        another instance serving the agent before may have told it meanwhile."""
        record = self._store.resident(key.store_key)
        if record is None or record.message_id is None or record.disabled_reason is not None:
            if record is not None and record.disabled_reason == UNFOLLOWED_REASON:
                log.info("route %s: its card says already that it is no longer followed", key)
            return
        if key.agent_id == BOARD_AGENT:
            self._scheduler.add_route(key, paced=True)
            self._boards.add(key)
            self._unfollow_board(key)
            return
        self._scheduler.add_route(key)
        self._scheduled.add(key)
        zone = self._chat_zone(key.channel, key.chat)
        self._unfollow(Route(key, pin=False, allowed_user_ids=None, zone=zone))

    def _mark_unfollowed(self, key: RouteKey) -> None:
        """The route's last edit saying its chat no longer follows the agent was shown:
        kept with its resident, so that no later start says it again."""
        self._unfollowing.discard(key)
        try:
            self._store.set_disabled(key.store_key, UNFOLLOWED_REASON)
        except Exception as error:
            log.warning(
                "route %s: its card's last edit was not recorded (%s); the next start edits it"
                " again",
                key,
                error,
            )

    def _retire_left(self) -> None:
        """Once a second, after the agents' first reading: the residents owed their agent's
        retirement (see `_owe_retirements`) get it, then close, in each chat once its lane
        has nothing else to do (`RouteScheduler.lane_idle`), or one at a time ahead of the
        live cards once the chat stayed busy past the bound (`_held_edit_may_go`). So the
        chat's live cards, which people follow, go first (made at the channel's start, these
        went before them); the lane paces these as any request. Nothing is known of the
        agent now (its files are gone): the card says its state is unknown, and that it
        retired."""
        if not self._retire_owed or not self._first_read:
            return
        now = asyncio.get_running_loop().time()
        for name in [name for name in self._retire_owed if name in self._ready_channels]:
            channel = self._channels[name]
            keys = self._retire_owed[name]
            ways = {lane: self._held_edit_may_go(lane, now) for lane in {key.lane for key in keys}}
            for key in list(keys):
                way = ways.get(key.lane)
                if way is None:
                    continue
                if way == "ahead":
                    ways[key.lane] = None  # one at a time: the lane's others wait on
                keys.remove(key)
                if self._scheduler.has_message(key):
                    zone = self._chat_zone(key.channel, key.chat)
                    final = self._last_edit(
                        channel, key.agent_id, CardState(), ActivitySummary(), zone, RETIRED_NOTE
                    )
                    self._scheduler.submit(key, final, last=True)
                self._closing[key] = now
                self._held_edit_went(key, way, now)
            if not keys:
                del self._retire_owed[name]

    def _held_edit_may_go(self, lane: LaneKey, now: float) -> Literal["idle", "ahead"] | None:
        """How the next last edit a start owes in `lane` (`_unfollow_stale`, `_retire_left`)
        may go now: "idle", the lane has nothing else to do, so it queues behind nothing;
        "ahead", it has waited `HELD_EDIT_PACES` of the chat's paces (at least
        `HELD_EDIT_FLOOR_S`) for that and none of the lane's went ahead still waits to be
        shown, so it takes the lane's next turn ahead of the live cards; None, it waits on.
        Its wait starts when first asked (its channel ready, the agents read)."""
        since = self._held_since.setdefault(lane, now)
        if self._scheduler.lane_idle(lane):
            return "idle"
        if self._held_ahead.get(lane) in self._closing:
            return None  # one at a time: the last one ahead is not shown yet
        pace_s = self._scheduler.lane_pace_s(lane)
        return "ahead" if now - since >= max(HELD_EDIT_FLOOR_S, HELD_EDIT_PACES * pace_s) else None

    def _held_edit_went(self, key: RouteKey, way: Literal["idle", "ahead"], now: float) -> None:
        """The last edit of `key` was handed to its lane (`_held_edit_may_go` said `way`):
        the lane's next one waits from now; one ahead takes the lane's next turn."""
        self._held_since[key.lane] = now
        if way == "ahead":
            self._scheduler.go_next(key)
            self._held_ahead[key.lane] = key
            log.info(
                "route %s: its last edit waited for a quiet moment in its chat past the bound"
                " and goes ahead of the live cards",
                key,
            )

    def _forget_held_lanes(self) -> None:
        """The chats no longer owed a start's last edit forget when their next one waited
        from (a later one, given back by a lease lost, waits anew)."""
        if not self._held_since:
            return
        owed = set(self._unfollow_owed)
        owed.update(key.lane for keys in self._retire_owed.values() for key in keys)
        for lane in [lane for lane in self._held_since if lane not in owed]:
            del self._held_since[lane]
            self._held_ahead.pop(lane, None)

    def _retire_owed_to(self, agent_id: str) -> list[RouteKey]:
        return [
            key for keys in self._retire_owed.values() for key in keys if key.agent_id == agent_id
        ]

    def _departure(self, agent_id: str, routes: Iterable[RouteKey]) -> None:
        """The agent left the fleet (alone on the state): its state is forgotten
        `forget_departed_after_s` from now, unless it comes back first."""
        if self._owned is not None:
            # Clustered: it may be in another instance's fleet, and while that instance is
            # stopped no record says so (its lease lapses), so nothing of it is forgotten.
            log.info("agent %s left this instance's fleet: clustered, its state is kept", agent_id)
            return
        now = self._clock().timestamp()
        self._store.set_cursor(DEPARTED_PREFIX + agent_id, repr(now))
        self._departed.set(agent_id, now + self._config.forget_departed_after_s)
        self._departed_routes[agent_id] = list(routes)

    def _returned(self, agent_id: str) -> None:
        """The agent is in the fleet again: nothing of it is forgotten."""
        if agent_id in self._departed:
            self._departed.discard(agent_id)
            self._departed_routes.pop(agent_id, None)
            # Not told it retired after all: its routes close, but those it has again (apply,
            # next) stay open and edit the same messages.
            for key in self._retire_owed_to(agent_id):
                self._retire_owed[key.channel].remove(key)
                self._closing[key] = asyncio.get_running_loop().time() if self._running else 0.0
            self._store.delete_cursors([DEPARTED_PREFIX + agent_id])
            log.info("agent %s is back: its resident messages are edited again", agent_id)

    def _forget_due(self, now: float) -> None:
        """Forget the agents whose time away has run out (only those: a heap by time), at
        most `FORGET_PER_TICK` of them; the rest wait for the next ticks."""
        due = self._departed.pop_due(now, FORGET_PER_TICK)
        for agent_id in due:
            routes = self._departed_routes.get(agent_id, [])
            if any(key in self._closing for key in routes) or self._retire_owed_to(agent_id):
                # Its last edits are still on their way: after them.
                self._departed.set(agent_id, now + FORGET_RETRY_S)
                continue
            try:
                self._forget_agent(agent_id)
            except Exception as error:
                log.warning(
                    "the state of agent %s, which left, was not forgotten (%s); trying again"
                    " in %.0f s",
                    agent_id,
                    error,
                    FORGET_RETRY_S,
                )
                self._departed.set(agent_id, now + FORGET_RETRY_S)
                continue
            self._departed_routes.pop(agent_id, None)
        waiting = self._departed.next_due()
        if len(due) == FORGET_PER_TICK and waiting is not None and waiting <= now:
            log.info(
                "%s handled this second, the most one second takes: more are due and follow"
                " in the next seconds",
                counted(len(due), "departed agent", "departed agents"),
            )

    def _forget_agent(self, agent_id: str) -> None:
        """Forget all that is kept of an agent that left `forget_departed_after_s` ago: its
        residents (the messages stay in the chats, last edited to say it retired), notices,
        offsets, inbox records, wakes, origin routes, chats' choices of it as orchestrator
        and cursors. Back later, it is a new
        agent: new cards, and its files read from their ends."""
        if agent_id in self._monitors:
            return  # back in the meantime
        self._store.forget_agent(
            agent_id,
            routes=[WAKE_ROUTE_PREFIX + agent_id],
            cursors=[DEPARTED_PREFIX + agent_id, agent_health_key(agent_id)],
            cursor_prefixes=[FOLDED_CURSOR_PREFIX, CARD_REFUSED_PREFIX],
        )
        self._desk.forget_owed(agent_id)
        self._origins.forget_agent(agent_id)
        self._orchestrators.forget_agent(agent_id)
        for key in self._departed_routes.get(agent_id, []):
            self._outbox.forget_route(key)
        log.info(
            "forgot agent %s, gone for forget_departed_after_s (%.0f s): a return posts new cards",
            agent_id,
            self._config.forget_departed_after_s,
        )

    def _unfollow(self, route: Route) -> None:
        """`route` goes while its agent stays served: a reload dropped the chat's route, the
        agent from it, or the chat from `origin_chats`, or the start found its resident with
        no route (`_unfollow_resident`). The one way both take: its card is edited a last
        time to say the chat no longer follows the agent (`_unrouted_edit`), then the route
        closes; once that edit is shown, the resident is marked (`UNFOLLOWED_REASON`), so no
        later start says it again, and a route there again clears the mark and edits the
        same card back."""
        final = self._unrouted_edit(route)
        self._close_route(route, final)
        if final is not None and route.key in self._closing:
            self._unfollowing.add(route.key)

    def _unrouted_edit(self, route: Route) -> Outgoing | None:
        """The last edit of the card of a route that goes while its agent stays served
        (see `_unfollow`), or None.

        Why: the card stopped being edited but went on showing its last state, "running"
        for good, to a chat that is no longer told anything about the agent. A card people
        hid or one another instance sends is left as it is. (An origin route that closes
        while serving because its card shows the watch stopped, or on `/taskcard off`,
        does not come here: its card says so already. The next start finds its resident
        with no route, and gives it this edit unless the chat hid its cards.)
        """
        agent_id = route.key.agent_id
        monitor = self._monitors.get(agent_id)
        channel = self._channels.get(route.key.channel)
        if (
            monitor is None
            or channel is None
            or not self._running
            or not self._serves(agent_id)
            or not self._scheduler.has_message(route.key)
            or self._chat_prefs(route.key.chat_scope).hidden
        ):
            return None
        with self._guard(agent_id, "composing its card"):
            return self._last_edit(
                channel, agent_id, monitor.card, monitor.activity, route.zone, UNROUTED_NOTE
            )
        return None
