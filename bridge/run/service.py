"""`taskcard serve`: files in, one resident message per route out.

The pieces, in the order data flows through them:

    FleetWatcher ─► AgentMonitor (per agent) ─► compose_view ─► channel.render_card
                                   │                                   │
                                   └─► notices (typed, content-safe)   └─► RouteScheduler
    channel commands (/taskcard ...) ─► chat preferences (store) ──────────────┘

The service never executes code from a workdir, and the only place in one it writes is the
agent's `inbox/` (people's messages and wakes, `bridge.inbox.writer`). Every background
task is owned here and awaited on shutdown; SIGTERM lets requests in flight finish.

Each agent sits behind a fault barrier (`_guard`): whatever goes wrong while reading or
composing one agent is caught at that agent's boundary, logged once per episode with the agent
id, recorded as the agent's health (which `taskcard status` shows) and retried on the next
change; it never reaches the loop or another agent.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from taskcard.bridge.compose.board import (
    needs_attention,
)
from taskcard.bridge.compose.redact import Redactor
from taskcard.bridge.compose.view import compose_view
from taskcard.bridge.config import (
    ServiceConfig,
    root_not_yet,
    roots_not_yet,
    workdir_not_yet,
    workdir_problems,
    workdirs_not_yet,
)
from taskcard.bridge.deliver.registry import BuiltChannel, RouteSpec, original_chat, route_specs
from taskcard.bridge.notices.outbox import NoticeOutbox
from taskcard.bridge.observe.metrics import ServiceSnapshot
from taskcard.bridge.run import heap
from taskcard.bridge.run.agent_signals import AgentSignals, ClusterChat
from taskcard.bridge.run.boards import ChatViews
from taskcard.bridge.run.chat_boards import BOARD_COMPOSE_EVERY_S, ChatBoards
from taskcard.bridge.run.chat_commands import ChatCommands, ClusterNames
from taskcard.bridge.run.departures import Departures
from taskcard.bridge.run.fleet import (
    RETIRED_NOTE,
    Discovery,
    Fleet,
    Route,
    desired_fleet,
    discover_agents,
    keyed_origin_chats,
    origin_listed,
    origin_route,
    restart_needed,
)
from taskcard.bridge.run.health import agent_health_key
from taskcard.bridge.run.inbox_desk import (
    InboxDesk,
)
from taskcard.bridge.run.logs import EVERY_TIME
from taskcard.bridge.run.orchestrators import (
    ChatOrchestrators,
)
from taskcard.bridge.run.origins import OriginBook
from taskcard.bridge.schedule.ratelimit import Limiter
from taskcard.bridge.schedule.routes import LaneKey
from taskcard.bridge.schedule.scheduler import (
    RouteKey,
    RoutesAhead,
    RouteScheduler,
    SharedReplies,
)
from taskcard.bridge.store.sqlite import (
    ChatPrefs,
    OffsetsAhead,
    ReadAhead,
    StateStore,
    in_batches,
)
from taskcard.bridge.track.due import DueAgents
from taskcard.bridge.track.files import REPORTS_NAME
from taskcard.bridge.track.ledger import LedgerView, ledger_row
from taskcard.bridge.track.monitor import (
    NOTIFICATIONS_OFFSET,
    ActivitySummary,
    AgentMonitor,
    AgentRefresh,
    CardState,
)
from taskcard.bridge.track.reports import ACKS_OFFSET, REPORTS_OFFSET, AgentSide
from taskcard.bridge.watch.watcher import ROOTS, FleetWatcher
from taskcard.channels.aio import TICK_S, Backoff, sleep_to_tick
from taskcard.channels.base import (
    CardView,
    Channel,
    ChatRef,
    Outgoing,
    counted,
)
from taskcard.channels.errors import ChannelError, RateLimited, Transient
from taskcard.producers.task_card.contract import Origin, one_line_cut, parse_origin

if TYPE_CHECKING:
    from taskcard.bridge.cluster.boards import SharedBoards
    from taskcard.bridge.cluster.wakes import WakeRelay

log = logging.getLogger(__name__)

# One agent's cards may take at most this share of the loop's time (`_project_paced`),
# once composing them costs at least this much CPU (a usual card costs well under 1 ms).
COMPOSE_SHARE: Final = 0.1
COMPOSE_COST_FLOOR_S: Final = 0.05


# Shown instead of a card body that still spelled a configured secret after rendering (for
# example split by Markdown emphasis, `12345**6789:AA...**`, and joined again by the renderer).
WITHHELD_BODY = "(card body withheld: it contained one of this service's own secrets)"
WITHHELD_ROWS = "(activity withheld: it contained one of this service's own secrets)"
# How often a request the start can do without is asked again after a 429 (once per pause).
_PUT_OFF_ATTEMPTS = 3
# The last word of a card retired beside a board (that of a board retired for cards is
# `chat_boards.RETIRED_BOARD_SUMMARY`).
RETIRED_CARD_NOTE = "Needs no one now: followed on this chat's task board."
# The short card shown in place of one the platform refused for good (`_card_refused_marker`).
CARD_REFUSED_NOTE = (
    "⚠ The latest card could not be shown here: the platform refused it (too long, or"
    " markup it would not take; taskcard status says why). The next card that goes"
    " through replaces this one."
)


# The offsets an agent's readers look up at its first reading (`_refresh_many`): the
# notifications' (the monitor), the reports' and the inbox acks' (its side). A name not
# listed is still read, alone.
FIRST_OFFSETS: Final = (NOTIFICATIONS_OFFSET, REPORTS_OFFSET, ACKS_OFFSET)


class ServiceFailed(Exception):
    """The service cannot do anything useful (every channel failed for good)."""


# A closing route whose last edit cannot go out (a long pause, a held send) is dropped anyway
# after this long.
CLOSE_GRACE_S = 120.0


# The service's clock, asked about five times per change: `datetime.now(UTC)` without a
# Python frame of its own (a lambda's).
_utc_now: Final = functools.partial(datetime.now, UTC)


class Service(Departures, ChatBoards, AgentSignals, ChatCommands):
    """Owns monitors, channels, the scheduler and the store for one `serve` run."""

    def __init__(
        self,
        config: ServiceConfig,
        channels: Mapping[str, BuiltChannel],
        store: StateStore,
        *,
        clock: Callable[[], datetime] = _utc_now,
        limiter: Limiter | None = None,
        clustered: bool = False,
        cluster_names: ClusterNames | None = None,
        cluster_chat: ClusterChat | None = None,
        shared_boards: SharedBoards | None = None,
        shared_replies: SharedReplies | None = None,
        wake_relay: WakeRelay | None = None,
    ) -> None:
        """`shared_replies`: clustered, where the unsent command replies are kept for the
        instance that runs on when this one stops (see `bridge.cluster.replies`).
        `wake_relay`: clustered, where a chat's wake is kept for the instance serving its
        orchestrator when this one does not (see `bridge.cluster.wakes`)."""
        self._config = config
        self._channels: dict[str, Channel] = {n: b.channel for n, b in channels.items()}
        self._store = store
        self._clock = clock
        # Clustered: only agents whose lease this instance holds (`take_agents`); else all.
        self._owned: set[str] | None = set() if clustered else None
        # Clustered: the agents every instance routes to a chat (see `routed_agents`).
        self._cluster_names = cluster_names
        self._cluster_chat = cluster_chat
        self._wake_relay = wake_relay
        # Clustered: the other instances' routes' `orchestrator` settings, by chat scope.
        self._route_marks_elsewhere: dict[str, list[str]] = {}
        # Every outgoing text loses the exact values of the configured secrets, not only logs.
        self._redact = Redactor(secret for b in channels.values() for secret in b.secrets)
        # The fleet: configured routes, discovered agents and origin routes (see `apply`).
        self._specs: list[RouteSpec] = [spec for b in channels.values() for spec in b.routes]
        self._origins = OriginBook(store, shared=clustered)
        # The open origin routes the running fleet was last made of (`_apply_desired`).
        self._origins_applied: frozenset[RouteKey] = frozenset()
        self._discovery = Discovery()
        self._origin_refused: set[tuple[str, str]] = set()
        self._origin_allowed: Mapping[str, frozenset[str]] | None = None
        # When each sender was last told they may not command a chat (see `_refuse`), and
        # that their reply to the board or another of the service's messages reaches no agent.
        self._refused: dict[tuple[str, str, str | None, str], float] = {}
        self._hinted: dict[tuple[str, str, str | None, str], float] = {}
        # ... and that their reply could not be delivered, the state being unreadable.
        self._unread_told: dict[tuple[str, str, str | None, str], float] = {}
        # The configured agents whose workdir did not exist when last looked (`_say_not_yet`).
        self._not_yet: set[tuple[str, Path]] = set()
        # ... and the discovery roots that did not (`roots_not_yet`), said the same way.
        self._roots_not_yet: set[Path] = set()
        # ... and the lines said of configured workdirs that cannot be one (`_say_not_yet`).
        self._unusable: set[str] = set()
        self._closing: dict[RouteKey, float] = {}  # route -> when it began closing (monotonic)
        self._scheduled: set[RouteKey] = set()
        self._watcher: FleetWatcher | None = None
        self._outbox = NoticeOutbox(
            store,
            self._channels,
            render=self._render_text,
            scrub=self._redact,
            max_per_minute=config.notices.max_per_minute,
            quiet=self._quiet,
            serves=lambda key: self._serves(key.agent_id),
            clock=lambda: self._clock().timestamp(),
        )
        self._scheduler = RouteScheduler(
            self._channels,
            store,
            max_pause_s=config.limits.max_pause_s,
            outbox=self._outbox,
            limiter=limiter,
            on_credentials_rejected=self._credentials_rejected,
            # Clustered, a reply kept under one name in the shared store would be sent by
            # whichever instance starts next: each is kept as its instance's there instead.
            keep_replies=not clustered,
            shared_replies=shared_replies,
            refusal_marker=self._card_refused_marker,
        )
        self._routes: list[Route] = []
        self._routes_by_agent: dict[str, list[Route]] = {}
        # The routes opened by a turn's origin, which the timer looks at (not every route).
        self._origin_routes: dict[RouteKey, Route] = {}
        self._monitors: dict[str, AgentMonitor] = {}
        # The offsets the agents' readers follow their files by, read ahead for many agents
        # at their first reading (`_refresh_many`), and the agents not read yet.
        self._offsets = OffsetsAhead(store)
        self._unread: set[str] = set()
        # Reports, inbox acks and lineage: what the agent side writes for the service (per
        # agent, made and dropped with its monitor in `apply`).
        self._sides: dict[str, AgentSide] = {}
        self._desk = InboxDesk(
            config.inbox,
            store,
            self._scheduler,
            self._channels,
            {},  # agents join with `apply`
            clock=clock,
            activity=lambda agent_id: self._monitors[agent_id].activity,
            zone=self._chat_zone,
            render=self._render_card,
            shared=clustered,
        )
        self._ledgers = LedgerView()
        self._saved_health: dict[str, str] = {}
        self._prefs: dict[str, ChatPrefs] = {}
        self._due = DueAgents()  # agents whose state changes with time alone, by when
        # Agents that left the fleet, by when their state is forgotten (alone on the state:
        # see `_forget_departed`), and the routes each had here when it left.
        self._departed = DueAgents()
        self._departed_routes: dict[str, list[RouteKey]] = {}
        # Per channel, the residents of agents that left while the service was stopped, each
        # owed the last edit a departure while serving gives (`_owe_retirements`).
        self._retire_owed: dict[str, list[RouteKey]] = {}
        # Per chat, the residents of routes that went while the service was stopped, owed
        # the last edit a reload gives (`_owe_unfollows`); and the routes whose such edit is
        # on its way, marked in the store once shown (`_unfollow`).
        self._unfollow_owed: dict[LaneKey, list[RouteKey]] = {}
        self._unfollowing: set[RouteKey] = set()
        # Per chat owed those last edits or retirements at start: since when (loop time) its
        # next one waits for the lane, and the one that last went ahead of the live cards
        # (see `_held_edit_may_go`).
        self._held_since: dict[LaneKey, float] = {}
        self._held_ahead: dict[LaneKey, RouteKey] = {}
        self._first_read = False  # the watcher's first report was handled: every agent read
        # Agents whose last card cost too much to compose: not again before when (see
        # `_project_paced`), and the agents owed a projection meanwhile.
        self._paced: dict[str, float] = {}
        self._owed: set[str] = set()
        self._paced_told: set[str] = set()  # said once per agent: a hostile body comes back
        self._routes_by_scope: dict[str, list[Route]] = {}
        self._views = ChatViews(store, ())
        self._orchestrators = ChatOrchestrators(store)
        self._board_timer: asyncio.TimerHandle | None = None
        self._board_flush: asyncio.Task[None] | None = None  # clustered: boards composing
        self._stopped = False  # run() has ended
        self._boards_composed_at = -BOARD_COMPOSE_EVERY_S
        self._boards: set[RouteKey] = set()  # board residents the scheduler knows
        # Clustered: the agents' board lines are shared, and only the instance holding a
        # chat's board lease sends its board (see `bridge.cluster.boards`).
        self._shared_boards = shared_boards
        self._boards_held: set[str] = set()  # clustered: the chats whose board is sent here
        self._ready_channels: set[str] = set()
        self._failed_channels: set[str] = set()
        # Per agent: the stage that failed ("reading its files", ...) -> what failed.
        self._faults: dict[str, dict[str, str]] = {}
        self._running = False
        self.started = asyncio.Event()  # set once the loop runs (systemd readiness)
        self._rediscover()
        self._close_unlisted_origins()
        self._apply_desired()

    # Lifecycle ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then shut down cleanly.

        Channels start concurrently and independently: one that is unreachable is retried in
        the background while the others (and the watching) carry on. Raises `ServiceFailed`
        when every channel failed for good (a wrong token, say).
        """
        await self._scheduler.start()
        self._schedule_many(r for r in self._routes if self._serves(r.key.agent_id))
        self._schedule_boards()
        self._desk.load()
        residents = self._residents_at_start()
        if self._owned is None:  # alone on the state, not clustered
            self._forget_departed()
            self._follow_departures(residents)
        self._owe_unfollows(residents)
        self._running = True
        self.started.set()
        starters = [
            asyncio.create_task(self._start_channel(name, channel), name=f"start {name}")
            for name, channel in self._channels.items()
        ]
        tasks = [
            asyncio.create_task(self._watch_loop(), name="watch"),
            asyncio.create_task(self._timer_loop(), name="timer"),
        ]
        if self._shared_boards is not None:
            follow = self._shared_boards.follow(self.board_changed)
            tasks.append(asyncio.create_task(follow, name="board changes"))
        log.info(
            "serving %s on %s (%s)",
            counted(len(self._monitors), "agent", "agents"),
            counted(len(self._routes), "route", "routes"),
            ", ".join(self._channels) or "no channel",
        )
        self._say_not_yet()
        stopper = asyncio.create_task(stop.wait(), name="stop")
        try:
            pending = {stopper, *tasks, *starters}
            while stopper in pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not stopper and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                if self._channels and len(self._failed_channels) == len(self._channels):
                    raise ServiceFailed("no channel could start; see the errors above")
        finally:
            self._running = False
            if self._board_timer is not None:
                self._board_timer.cancel()
            self._stopped = True
            if self._board_flush is not None:
                self._board_flush.cancel()
                await asyncio.gather(self._board_flush, return_exceptions=True)
            stopper.cancel()
            for task in (*tasks, *starters):
                task.cancel()
            await asyncio.gather(stopper, *tasks, *starters, return_exceptions=True)
            await self._scheduler.stop()
            for key in list(self._unfollowing):
                if self._scheduler.settled(key):  # shown before the stop: not again
                    self._mark_unfollowed(key)
            for channel in reversed(list(self._channels.values())):
                try:
                    await channel.stop()
                except ChannelError as error:
                    log.warning("channel %s did not stop cleanly: %s", channel.name, error)
            log.info("stopped")

    async def _start_channel(self, name: str, channel: Channel) -> None:
        """Start one channel, retrying while it is unreachable; then show what is pending.

        The start's own requests (a token, the bot's identity) wait for a rate-limit pause
        over the bot or the app (`Channel.start_scopes`), one an earlier run stored
        included, and a 429 answered to one of them is stored as a pause like any other: it
        holds the cards' requests too, and a restart within it. A 429 on a request the start
        can do without does not hold the start (`_finish_start`)."""
        backoff = Backoff(initial_s=1.0, max_s=60.0)
        waiting = False  # said once per wait (the shared book may answer "ask again" often)
        while True:
            paused_s = await self._scheduler.paused_s(channel.start_scopes())
            if paused_s > 0:
                if not waiting:
                    log.info("channel %s waits %.0fs for a rate-limit pause to end", name, paused_s)
                waiting = True
                await asyncio.sleep(paused_s)
                continue
            waiting = False
            try:
                await channel.start(functools.partial(self._on_command, name))
            except RateLimited as error:
                applied_s = self._scheduler.rate_limited(error, f"the start of channel {name}")
                if applied_s <= 0 or error.scope not in channel.start_scopes():
                    # No usable wait given, or a pause the check above does not read.
                    await asyncio.sleep(applied_s if applied_s > 0 else backoff.next_delay_s())
                continue
            except Transient as error:
                wait_s = backoff.next_delay_s()
                log.warning("channel %s not ready (%s); retrying in %.0fs", name, error, wait_s)
                await asyncio.sleep(wait_s)
                continue
            except ChannelError as error:
                log.error("channel %s disabled: %s", name, error)
                self._failed_channels.add(name)
                self._retire_owed.pop(name, None)  # its agents need not wait to be forgotten
                return
            except Exception:
                # A busy webhook port, a library bug: this channel is out, the others go on.
                log.exception("channel %s could not start and is disabled", name)
                self._failed_channels.add(name)
                self._retire_owed.pop(name, None)
                return
            break
        put_off = channel.start_put_off()
        if put_off is not None:
            # Recorded before any card is let out: it holds those it covers.
            self._scheduler.rate_limited(put_off, f"the start of channel {name}")
        self._ready_channels.add(name)
        log.info("channel %s ready", name)
        self._outbox.channel_ready(name)
        self._scheduler.channel_ready(name)  # the replies a stop left unsent
        self._desk.channel_ready(name)
        for route in list(self._routes):
            if route.key.channel == name:
                self._project_route(route)
        if put_off is not None:
            await self._finish_start(name, channel, put_off)

    async def _finish_start(self, name: str, channel: Channel, error: RateLimited) -> None:
        """A request the start can do without (the Telegram menu, the Feishu bot's identity)
        drew a 429 and the channel started without it (`Channel.start_put_off`). The pause it
        names is recorded like a lane's (it holds the cards only if it covers them: the
        Feishu app's does, the Telegram menu's does not), and the request is made again once
        no pause over it or the start's scopes runs, once per pause and at most
        `_PUT_OFF_ATTEMPTS` times; then it waits for the next start."""
        attempts = 0
        while True:
            if attempts == _PUT_OFF_ATTEMPTS:
                log.warning(
                    "channel %s: a request of its start was rate limited %d times; it serves"
                    " without it until the next start",
                    name,
                    attempts + 1,
                )
                return
            attempts += 1
            scopes = (error.scope, *channel.start_scopes())
            while True:  # the pause ends at a known time: nothing to be woken by
                paused_s = await self._scheduler.paused_s(scopes)
                if paused_s <= 0:
                    break
                await asyncio.sleep(paused_s)
            try:
                again = await channel.finish_start()
            except Exception:
                # The channel logs its own failures; this is a bug, and costs only the request.
                log.exception("channel %s: finishing its start failed", name)
                return
            if again is None:
                return
            error = again
            self._scheduler.rate_limited(error, f"the start of channel {name}")

    def _credentials_rejected(self, name: str, error: ChannelError) -> None:
        """The platform refused the channel's credentials while serving (a token revoked):
        every further request would be refused too, so the channel stops being used (no
        route of it is projected, its readiness and `/healthz` say so) and the others go on.
        The cards stay as they are; a restart with valid credentials edits them again."""
        if name not in self._ready_channels:
            return
        self._ready_channels.discard(name)
        self._outbox.channel_lost(name)  # its notices wait in the store for the restart
        log.error(
            "channel %s disabled: %s; its cards are no longer updated; set valid credentials"
            " and restart the service",
            name,
            error,
        )

    # Ownership (clustered) ---------------------------------------------------------------

    def _serves(self, agent_id: str) -> bool:
        return self._owned is None or agent_id in self._owned

    def agent_ids(self) -> list[str]:
        """The agents of the fleet now: configured, discovered, added by a reload (a
        cluster leases each, and serves those whose lease it holds)."""
        return list(self._monitors)

    def routes_chat(self, channel: str, chat_id: str) -> bool:
        """Whether a route here (configured, reloaded or opened by a turn) is in the chat."""
        return any(r.key.channel == channel and r.key.chat.chat_id == chat_id for r in self._routes)

    def routed_agents(self) -> dict[str, dict[str, dict[str, list[str]]]]:
        """The agents routed here, by channel, chat and topic ("" for a whole chat), which
        a cluster shares: the instance answering a `/tell` that names an agent no route of
        its own knows tells it apart from another instance's agent with them."""
        found: dict[str, dict[str, dict[str, set[str]]]] = {}
        for route in self._routes:
            chat = route.key.chat
            chats = found.setdefault(route.key.channel, {}).setdefault(chat.chat_id, {})
            chats.setdefault(chat.thread_id or "", set()).add(route.key.agent_id)
        return {
            channel: {
                chat: {thread: sorted(agents) for thread, agents in threads.items()}
                for chat, threads in chats.items()
            }
            for channel, chats in found.items()
        }

    def routed_marks(self) -> dict[str, dict[str, dict[str, str]]]:
        """The `orchestrator` setting of each route here that has one, by channel, chat and
        topic (as `routed_agents`), which a cluster shares: the instance answering
        `/taskcard orchestrator` in a chat whose mark another instance's route sets names it
        (it said the chat had none, and refused to mark that instance's agent)."""
        found: dict[str, dict[str, dict[str, str]]] = {}
        for route in self._routes:
            if route.orchestrator is not None:
                chat = route.key.chat
                chats = found.setdefault(route.key.channel, {}).setdefault(chat.chat_id, {})
                chats.setdefault(chat.thread_id or "", route.orchestrator)
        return found

    def take_agents(self, agent_ids: Iterable[str]) -> dict[str, Exception]:
        """Serve these agents here from now on (their leases were gained); returns those
        that could not be served, with why (the cluster tries them again later).

        Each agent's routes start from the shared store, so the resident another instance
        posted is edited, not doubled, and its files are read on from the offsets that
        instance left. What the store keeps for them (residents, kept refusals, offsets,
        pending notices) is read in batches for all the agents, as at start, rather than
        agent by agent: on Redis each read is a round trip, and an instance that takes over
        a stopped one's thousands of agents would make thousands of them. A batch that
        cannot be read is read key by key, so a failure lands on its agent alone."""
        if self._owned is None:
            return {}
        owned = self._owned
        failed: dict[str, Exception] = {}
        taking = [a for a in dict.fromkeys(agent_ids) if a not in owned]
        # The routes turns opened while another instance served them count (one read).
        # Compared with the routes the running fleet was made of, not with the book's copy
        # before the read: a save of this instance's own merges the others' changes into
        # that copy and applies nothing, and it is the fleet that must catch up.
        self._origins.reread()
        closed = self._close_unlisted_origins(frozenset(taking))
        if closed or frozenset(self._origins.open_routes()) != self._origins_applied:
            # Applied before the agents are served here, so a closed route is never scheduled
            # nor shown live first: its card gets the last edit a start gives those of routes
            # gone while stopped (`_owe_unfollows` finds it when the service is not running
            # yet).
            self._apply_desired()
            for key in closed if self._running else ():
                self._unfollow_owed.setdefault(key.lane, []).append(key)
        for batch in in_batches(taking):
            routes = {agent_id: self._routes_by_agent.get(agent_id, []) for agent_id in batch}
            ahead = self._scheduler.read_ahead(
                route.key
                for agent_routes in routes.values()
                for route in agent_routes
                if route.key not in self._scheduled
            )
            taken: list[str] = []
            for agent_id in batch:
                owned.add(agent_id)
                try:
                    for route in routes[agent_id]:
                        self._schedule(route, ahead)
                    self._desk.take_agent(agent_id)
                except Exception as error:
                    self.drop_agent(agent_id)  # not half served
                    failed[agent_id] = error
                    continue
                taken.append(agent_id)
            self._unread.difference_update(taken)  # read here, below
            read = []
            with self._offsets.reading_ahead((a, name) for a in taken for name in FIRST_OFFSETS):
                for agent_id in taken:
                    try:
                        self._refresh(agent_id)
                    except Exception as error:
                        self.drop_agent(agent_id)  # not half served: taken whole next time
                        failed[agent_id] = error
                        continue
                    read.append(agent_id)
            try:  # what another instance left pending, one read for the batch
                self._outbox.routes_ready(route.key for a in read for route in routes[a])
            except Exception:
                log.debug("the pending notices of a batch of agents are read agent by agent")
                ready = []
                for agent_id in read:
                    try:
                        for route in routes[agent_id]:
                            self._outbox.route_ready(route.key)
                    except Exception as error:
                        self.drop_agent(agent_id)
                        failed[agent_id] = error
                        continue
                    ready.append(agent_id)
                read = ready
            for agent_id in read:
                try:
                    for route in routes[agent_id]:
                        self._project_route(route)
                except Exception as error:
                    self.drop_agent(agent_id)
                    failed[agent_id] = error
        return failed

    def drop_agent(self, agent_id: str) -> None:
        """Stop serving this agent (another instance holds its lease now)."""
        if self._owned is None or agent_id not in self._owned:
            return
        self._owned.discard(agent_id)
        self._desk.drop_agent(agent_id)
        # Its queued notices are the new lease holder's, which queues them from the store.
        left = self._outbox.routes_lost(r.key for r in self._routes_by_agent.get(agent_id, []))
        if left:
            log.info(
                "agent %s: %s queued here left for the instance serving it now",
                agent_id,
                counted(left, "notice", "notices"),
            )
        for route in self._routes_by_agent.get(agent_id, []):
            self._scheduler.remove_route(route.key)
            self._scheduled.discard(route.key)
            if self._running and self._views.view(route.key.chat_scope) == "board":
                self._mark_board(route.key.chat_scope)  # its line here is withdrawn
        for key in [key for key in self._unfollowing if key.agent_id == agent_id]:
            # A last edit still to go is the lease holder's now: owed again here, for when
            # this instance holds it again (the resident is read before, so never twice).
            self._scheduler.remove_route(key)
            self._scheduled.discard(key)
            self._closing.pop(key, None)
            self._unfollowing.discard(key)
            self._unfollow_owed.setdefault(key.lane, []).append(key)

    def reply_channels(self) -> list[str]:
        """Clustered: the channels this instance answers on, whose replies a stopped
        instance left unsent it takes over (not a terminal: its messages are this run's)."""
        return sorted(n for n, c in self._channels.items() if c.messages_outlive_process)

    def adopt_replies(self, kept: Mapping[str, Any]) -> None:
        """Clustered: send the replies a stopped instance left unsent (see
        `bridge.cluster.replies`)."""
        self._scheduler.adopt_replies(kept)

    # Watching ----------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        watcher = self._watcher = FleetWatcher(
            {agent_id: m.paths.workdir for agent_id, m in self._monitors.items()},
            debounce_ms=self._config.watch.debounce_ms,
            rescan_interval_s=self._config.watch.rescan_interval_s,
            backend=self._config.watch.backend,
            roots=self._config.discover.roots,
        )

        def handle(agent_ids: frozenset[str]) -> None:
            if ROOTS in agent_ids and self._rediscover():
                self._apply_desired()
            if self._unread and not self._unread.isdisjoint(agent_ids):
                self._refresh_many(agent_ids, watcher.take_changed)
                return
            for agent_id in agent_ids:
                self._refresh(agent_id, watcher.take_changed(agent_id))

        first = True
        # `handle` is also given to the watcher: a change read while this loop waits is
        # handled in the loop's callback that read it, a turn of the loop sooner and cheaper
        # than waking this task (`FleetWatcher.changes`); what it raises ends this loop all
        # the same.
        async for agent_ids in watcher.changes(handle):
            handle(agent_ids)
            if first:
                first = False
                self._first_read = True
                heap.settled()  # the first report covers every agent: all first sights taken

    # The fleet -------------------------------------------------------------------------

    def _apply_desired(self) -> None:
        """`apply` the fleet config, discovery and the open origin routes make now, and
        note the origin routes it was made of (`take_agents` compares)."""
        opened = frozenset(self._origins.open_routes())
        self.apply(desired_fleet(self._config, self._specs, self._discovery.agents, opened))
        self._origins_applied = opened

    def _rediscover(self) -> bool:
        """List the discovery roots again; whether the discovered agents changed."""
        found = discover_agents(self._config.discover.roots, self._config.agent_ids())
        for problem in sorted(found.problems - self._discovery.problems):
            log.warning("%s", problem)
        changed = found.agents != self._discovery.agents
        self._discovery = found
        return changed

    def apply(self, fleet: Fleet) -> None:
        """Make the running agents and routes those of `fleet`.

        Agents that left are retired: each of their residents gets a last edit saying so,
        then their routes close. New agents are read at once; routes that are new start
        showing their card, changed ones take their new settings. Residents (their message
        ids) and chat preferences live in the store and are kept.
        """
        kept = {route.key for route in fleet.routes}
        gone = [r.key for r in self._routes if r.key not in kept and self._serves(r.key.agent_id)]
        for agent_id in [a for a in self._monitors if a not in fleet.agents]:
            self._retire(agent_id)
        self._withdraw_notices(gone)
        fresh: list[str] = []
        store = self._store
        for batch in in_batches(fleet.agents.items()):
            stale = [
                (agent_id, workdir)
                for agent_id, workdir in batch
                if (known := self._monitors.get(agent_id)) is None or known.paths.workdir != workdir
            ]
            health = ReadAhead(
                store.get_cursors, store.get_cursor, [agent_health_key(a) for a, _ in stale]
            )
            for agent_id, workdir in stale:
                monitor = self._monitors.get(agent_id)
                if monitor is not None:
                    self._ledgers.forget(monitor.files)  # the new monitor looks for itself
                monitor = self._monitors[agent_id] = AgentMonitor(
                    agent_id,
                    workdir,
                    self._offsets,
                    clock=self._clock,
                    no_output_after_s=self._config.display.no_output_after_s,
                    start_silence_s=self._config.signals.no_output_after_start_s,
                )
                self._sides[agent_id] = AgentSide(
                    agent_id, workdir, monitor.files, self._offsets, clock=self._clock
                )
                self._desk.add_agent(agent_id, workdir)
                self._returned(agent_id)
                self._saved_health.setdefault(
                    agent_id, health.take(agent_health_key(agent_id)) or "[]"
                )
                self._unread.add(agent_id)
                fresh.append(agent_id)
        wanted = {route.key: route for route in fleet.routes}
        for route in [r for r in self._routes if r.key not in wanted]:
            self._unfollow(route)
        current = {route.key: route for route in self._routes}
        added = [route for key, route in wanted.items() if key not in current]
        # A fold episode saved before a restart still owes its summary.
        self._outbox.add_routes(route.key for route in added)
        for key, route in wanted.items():
            if current.get(key) == route:
                continue
            self._closing.pop(key, None)
            self._unfollowing.discard(key)  # its card comes back to life
            if self._running and self._serves(key.agent_id):
                self._schedule(route)
        self._routes = list(wanted.values())
        self._origin_routes = {route.key: route for route in self._routes if route.origin}
        self._routes_by_agent = {agent_id: [] for agent_id in fleet.agents}
        for route in self._routes:
            self._routes_by_agent.setdefault(route.key.agent_id, []).append(route)
        self._routes_by_scope = {}
        for route in self._routes:
            self._routes_by_scope.setdefault(route.key.chat_scope, []).append(route)
        switched = [
            scope
            for scope, routes in self._routes_by_scope.items()
            if self._views.add_scope(scope, routes[0].view)
        ]
        if self._running:
            self._schedule_boards()
        if self._watcher is not None:
            self._watcher.set_workdirs({a: m.paths.workdir for a, m in self._monitors.items()})
        if not self._running:
            return
        for agent_id in fresh:
            log.info("now serving agent %s", agent_id)
            self._unread.discard(agent_id)  # read here, alone
            self._refresh(agent_id)
        for route in added:
            if route.key.agent_id not in fresh:
                self._project_route(route)
        for scope in switched:  # as `/taskcard board|cards` would, without a chat's choice
            for route in self._routes_by_scope[scope]:
                self._project_route(route)
            self._mark_board(scope)

    def _withdraw_notices(self, keys: list[RouteKey]) -> None:
        """The routes went (a reload or discovery removed them, or their agent): the notices
        still to send there are withdrawn, so that a chat that no longer follows the agent
        is not told about it. Best effort: a store that fails now leaves them to be sent."""
        for key in keys:
            try:
                withdrawn = self._outbox.withdraw([key])
            except Exception as error:
                log.warning(
                    "route %s went, but its unsent notices could not be withdrawn (%s); they"
                    " may still be sent there",
                    key,
                    type(error).__name__,  # not its text: a Redis error's can quote a key
                )
                continue
            if withdrawn:
                log.info(
                    "route %s went: %s withdrawn, not sent to a chat that no longer follows"
                    " agent %s",
                    key,
                    counted(withdrawn, "unsent notice", "unsent notices"),
                    key.agent_id,
                )

    def _schedule_many(self, routes: Iterable[Route]) -> None:
        """`_schedule` of each; the store is read for the new ones in batches (at start,
        every route of the fleet is new)."""
        new: list[tuple[RouteKey, bool]] = []
        for route in routes:
            if route.key in self._scheduled:
                self._scheduler.set_pin(route.key, route.pin)
            else:
                new.append((route.key, route.pin))
        self._scheduler.add_routes(new)
        self._scheduled.update(key for key, _ in new)

    def _schedule(self, route: Route, ahead: RoutesAhead | None = None) -> None:
        if route.key not in self._scheduled:
            self._scheduler.add_route(route.key, pin=route.pin, ahead=ahead)
            self._scheduled.add(route.key)
        else:
            self._scheduler.set_pin(route.key, route.pin)  # a reload may have changed it

    def _retire(self, agent_id: str) -> None:
        """The agent left the fleet: its residents say so, then its routes close."""
        monitor = self._monitors.pop(agent_id)
        self._ledgers.forget(monitor.files)
        log.info("agent %s retired", agent_id)
        self._desk.remove_agent(agent_id, "the agent was retired")
        self._sides.pop(agent_id, None)
        self._due.discard(agent_id)
        self._paced.pop(agent_id, None)
        self._owed.discard(agent_id)
        self._paced_told.discard(agent_id)
        self._faults.pop(agent_id, None)
        self._saved_health.pop(agent_id, None)
        self._unread.discard(agent_id)
        self._departure(agent_id, [route.key for route in self._routes_by_agent.get(agent_id, ())])
        for route in list(self._routes_by_agent.get(agent_id, ())):
            final = None
            channel = self._channels.get(route.key.channel)
            if channel is not None and self._running and self._scheduler.has_message(route.key):
                final = self._last_edit(
                    channel, agent_id, monitor.card, monitor.activity, route.zone, RETIRED_NOTE
                )
            self._close_route(route, final)

    def _last_edit(
        self,
        channel: Channel,
        agent_id: str,
        card: CardState,
        activity: ActivitySummary,
        zone: tzinfo,
        note: str,
    ) -> Outgoing:
        """The last edit of a card that is no longer followed: the agent and its state, no
        activity rows, and `note` where the body was."""
        view = compose_view(
            agent_id, card, activity, hidden=False, activity_rows=0, now=self._clock(), zone=zone
        )
        return self._render_card(channel, replace(view, body=None, body_note=note))

    def _close_route(self, route: Route, final: Outgoing | None) -> None:
        """Stop projecting `route`; its last edit (`final`) still goes out, then it is dropped."""
        if route in self._routes:
            self._routes.remove(route)
        if self._origin_routes.get(route.key) == route:
            del self._origin_routes[route.key]
        by_agent = self._routes_by_agent.get(route.key.agent_id)
        if by_agent is not None and route in by_agent:
            by_agent.remove(route)
        # The chat's board is composed from these: an origin route closing between two
        # applications of the fleet kept its line there, shown stopped, until the next one.
        by_scope = self._routes_by_scope.get(route.key.chat_scope)
        if by_scope is not None and route in by_scope:
            by_scope.remove(route)
            if not by_scope:
                del self._routes_by_scope[route.key.chat_scope]
        if self._running and self._views.view(route.key.chat_scope) == "board":
            self._mark_board(route.key.chat_scope)  # its line leaves the chat's board
        if route.key not in self._scheduled:
            return
        if final is not None:
            self._scheduler.submit(route.key, final, last=True)
        self._closing[route.key] = asyncio.get_running_loop().time() if self._running else 0.0

    def _drop_closed_routes(self) -> None:
        """Forget closing routes in the scheduler once their last edit went out."""
        if not self._closing:
            return
        now = asyncio.get_running_loop().time()
        for key, since in list(self._closing.items()):
            shown = self._scheduler.settled(key)
            if shown or (
                now - since > CLOSE_GRACE_S and self._scheduler.settled(key, in_flight_only=True)
            ):
                if key in self._unfollowing:
                    if shown:
                        self._mark_unfollowed(key)
                    else:  # given up on: the next start tries again
                        self._unfollowing.discard(key)
                self._scheduler.remove_route(key)
                self._scheduled.discard(key)
                self._boards.discard(key)
                del self._closing[key]

    def reload(self, config: ServiceConfig) -> bool:
        """Apply a new configuration (SIGHUP) while serving; False when it needs a restart.

        Agents, discovery roots, display defaults and each channel's routes and origin_chats
        change in place; a change of anything else is refused (logged) and nothing changes.
        """
        needs_restart = restart_needed(self._config, config)
        if needs_restart:
            log.error(
                "config reload refused: %s changed; restart to change channels and those keys"
                " (the running configuration stays)",
                ", ".join(needs_restart),
                extra=EVERY_TIME,
            )
            return False
        try:
            specs = route_specs(config, self._store)
        except Exception as error:
            # The chats' keys depend on the state (a group's upgrade); a guess could key a
            # routed chat anew and post a second resident there.
            log.error(
                "config reload refused: the state could not be read (%s); the running"
                " configuration stays",
                error,
                extra=EVERY_TIME,
            )
            return False
        retime = config.display.no_output_after_s != self._config.display.no_output_after_s
        self._config = config
        self._specs = [spec for spec in specs if spec.channel in self._channels]
        if retime:
            self._retime(config.display.no_output_after_s)
        if self._watcher is not None:
            self._watcher.set_roots(config.discover.roots)  # before the next arming's plan
        self._origin_refused.clear()
        self._origin_allowed = None
        self._rediscover()
        self._close_unlisted_origins()
        self._apply_desired()
        for route in list(self._routes):
            self._project_route(route)  # display defaults may have changed
        log.info(
            "config reloaded: %s on %s",
            counted(len(self._monitors), "agent", "agents"),
            counted(len(self._routes), "route", "routes"),
        )
        self._say_not_yet()
        return True

    def _say_not_yet(self) -> None:
        """Log the configured agents whose workdir does not exist yet (`workdirs_not_yet`),
        and the discovery roots that do not (`roots_not_yet`), and warn of the workdirs
        that cannot be one (`workdir_problems`), one line each, at the start and at a
        reload: served and picked up once the folder is made, but a slip in the path showed
        nothing anywhere. Once: a reload does not say
        again one it said before with the same workdir (it says one that appeared since and
        is gone again)."""
        missing = workdirs_not_yet(self._config)
        for agent in missing:
            if (agent.id, agent.workdir) not in self._not_yet:
                log.info("%s", workdir_not_yet(agent.id, agent.workdir))
        self._not_yet = {(agent.id, agent.workdir) for agent in missing}
        roots = roots_not_yet(self._config)
        for index, root in roots:
            if root not in self._roots_not_yet:
                log.info("%s", root_not_yet(index, root))
        self._roots_not_yet = {root for _, root in roots}
        # A workdir that cannot be one (a file, a loop of links) is that agent's problem
        # alone: a warning, the agent served all the same (it refused the start and every
        # reload, for the whole fleet).
        unusable = workdir_problems(self._config)
        for line in unusable.values():
            if line not in self._unusable:
                log.warning("%s", line)
        self._unusable = set(unusable.values())

    def _retime(self, no_output_after_s: float) -> None:
        """Every agent served takes a reloaded `no_output_after_s`: it kept the value it was
        first read with, so a silent turn went on showing "running" for the old time. The
        reload projects every route afterwards; here each state is worked out again and
        the time it holds until is queued anew."""
        for agent_id, monitor in self._monitors.items():
            with self._guard(agent_id, "reading its files"):
                monitor.retime(no_output_after_s)
                until = monitor.activity.state_valid_until
                if until is not None:
                    self._due.set_earliest(agent_id, until.timestamp())

    # Origins -----------------------------------------------------------------------------

    def _on_origin(self, agent_id: str, written: str, at: datetime) -> None:
        """A turn of `agent_id` came from a chat: open that route when the chat allows it."""
        origin = parse_origin(written)
        if not isinstance(origin, Origin):
            if (agent_id, written) not in self._origin_refused:
                self._origin_refused.add((agent_id, written))
                log.warning("agent %s: unusable turn origin ignored: %s", agent_id, origin)
            return
        allowed = self._origin_chats()
        moved = original_chat(origin.channel, self._store, ChatRef(origin.chat_id))
        origin = replace(origin, chat_id=moved.chat_id)  # a supergroup as the group it was
        key = origin_route(origin, agent_id, allowed) if origin.channel in self._channels else None
        if key is None:
            if (agent_id, str(origin)) not in self._origin_refused:
                self._origin_refused.add((agent_id, str(origin)))
                log.warning(
                    "agent %s: turn origin %s ignored: that chat is not in %s.origin_chats",
                    agent_id,
                    origin,
                    origin.channel,
                )
            return
        if any(route.key == key for route in self._routes):
            return  # already shown there (a configured route, or an open origin route)
        if self._origins.open(key, at.timestamp()):
            log.info("agent %s: route to %s opened by a turn's origin", agent_id, origin)
            self._apply_desired()

    def _origin_chats(self) -> Mapping[str, frozenset[str]]:
        """`origin_chats` with each chat under the id the service keys it by (a supergroup a
        routed group became, under the group's id); worked out again after a reload or a move."""
        if self._origin_allowed is None:
            self._origin_allowed = keyed_origin_chats(self._config, self._store)
        return self._origin_allowed

    def _close_unlisted_origins(self, agent_ids: Collection[str] | None = None) -> list[RouteKey]:
        """At start and at a reload (clustered: when it gains the leases of `agent_ids`),
        the open origin routes of chats `origin_chats` no longer lists close, as a route
        taken out of the configuration does (`apply` gives their cards the last edit,
        `_owe_unfollows` at start). Turns from there open nothing now, and a card left open
        would look live to a chat that no longer follows it. A later turn from the chat,
        listed again, opens its route on the same message. Returns the routes closed.

        Only the routes of agents this instance serves: clustered, the instance holding an
        agent's lease reads its turns, so its `origin_chats` opened the agent's routes and
        it alone closes them. Every instance closing every route its own `origin_chats`
        did not list closed, at each start or reload, those of chats only another instance
        allows. An instance that takes an agent over (a standby) applies its own list."""
        allowed = self._origin_chats()
        now = self._clock().timestamp()
        closed: list[RouteKey] = []
        for key in self._origins.open_routes():
            served = self._serves(key.agent_id) if agent_ids is None else key.agent_id in agent_ids
            if served and not origin_listed(key, allowed):
                self._origins.close(key, now)
                closed.append(key)
                log.info(
                    "route %s closed: its chat is no longer in %s.origin_chats", key, key.channel
                )
        return closed

    def _close_finished_origin_routes(self) -> None:
        """Close origin routes whose card was removed after they opened (once it shows so).
        Runs every second, so it looks at the origin routes alone, not at every route."""
        for route in list(self._origin_routes.values()):
            monitor = self._monitors.get(route.key.agent_id)
            opened = self._origins.opened_at(route.key)
            if (
                monitor is None
                or opened is None
                or route.key.channel not in self._ready_channels
                or not self._serves(route.key.agent_id)  # its card is read elsewhere
            ):
                continue
            card = monitor.card
            stopped = card.status_changed_at
            if card.status != "inactive" or stopped is None or stopped.timestamp() < opened:
                continue
            self._project_route(route)  # the resident shows the card stopped
            self._origins.close(route.key, self._clock().timestamp())
            log.info("route %s closed: its card was removed", route.key)
            self._close_route(route, None)

    async def _timer_loop(self) -> None:
        """Once a second, the work that waits for a time (see `_timer_tick`), at the ticks
        the serve lock's check and the watcher's rescan step keep too (`next_tick`)."""
        while True:
            await sleep_to_tick(TICK_S)
            self._timer_tick()

    def _timer_tick(self) -> None:
        """Recompose agents whose state changes with the passage of time alone, retry held
        back state writes, send owed notice summaries, close finished routes. Each looks only
        at what waits (a heap of due agents, the store's backlog, the open fold episodes,
        routes closing, open inbox messages, wakes owed to an inbox that failed), so an idle
        fleet costs the same here whatever its size."""
        self._scheduler.keep_windows()  # committed with the batched writes just below
        self._store.retry_pending()  # state writes a failing disk held back, when due
        now = self._clock().timestamp()
        for agent_id in self._due.pop_due(now):
            self._refresh(agent_id)
        self._outbox.send_due_summaries()
        self._close_finished_origin_routes()
        self._drop_closed_routes()
        self._retire_left()  # agents that left while the service was stopped
        self._unfollow_stale()  # routes that went while the service was stopped
        self._forget_held_lanes()
        self._forget_due(now)  # agents that left long enough ago
        self._desk.refresh()  # open messages turn unconfirmed with time alone
        for woken in self._desk.retry_wakes():  # wakes owed to an inbox that failed
            if self._serves(woken):
                self._project_paced(woken)
                self._save_health(woken)

    def _refresh_many(
        self, agent_ids: Iterable[str], changed: Callable[[str], frozenset[str] | None]
    ) -> None:
        """`_refresh` of each agent (`changed` tells its changed files), the offsets of the
        agents read for the first time read ahead in batches: at start, every agent's three
        offsets in a few reads rather than three reads per agent."""
        for batch in in_batches(agent_ids):
            first = [agent_id for agent_id in batch if agent_id in self._unread]
            self._unread.difference_update(first)
            ahead = [(a, name) for a in first if self._serves(a) for name in FIRST_OFFSETS]
            with self._offsets.reading_ahead(ahead):
                for agent_id in batch:
                    self._refresh(agent_id, changed(agent_id))

    def _refresh(self, agent_id: str, changed: frozenset[str] | None = None) -> None:
        """Read one agent's files and project what changed; `changed` names the files the
        watcher saw change when that is all it saw (None: look at every file)."""
        monitor = self._monitors.get(agent_id)
        if monitor is None or not self._serves(agent_id):
            return  # another instance reads it (and moves its shared offsets)
        # The three stages below are each behind the per-agent fault barrier (`_guard`),
        # spelled out as `try` blocks: `except Exception` is `_Guard.__exit__`'s failure
        # (a cancellation or an interrupt passes through), `else` its success, which clears
        # a fault of the stage only when the agent has any. A `with` of a `_Guard` cost about
        # 40 bytecodes per stage (the object, `__enter__`, `__exit__`); these run on every
        # change. `tests/bridge/test_fault_barrier.py` drives each stage's failure.
        faults = self._faults
        result: AgentRefresh | None = None
        try:
            try:
                result = monitor.refresh(changed)
            except BaseException:
                monitor.forget_signatures()  # the next change or rescan reads everything again
                raise
            for notification in result.notifications:
                with self._guard(agent_id, "notifying"):
                    routes = [route.key for route in self._routes_by_agent.get(agent_id, ())]
                    self._outbox.notify(routes, agent_id, notification)
            for origin, at in monitor.take_origins():
                self._on_origin(agent_id, origin, at)
            if result.notifications:
                monitor.commit()  # recorded in the store: the offset may move past them
            until = monitor.activity.state_valid_until
            if until is not None:
                self._due.set(agent_id, until.timestamp())
            if result.failure is not None:
                raise result.failure
        except Exception as error:
            self._stage_failed(agent_id, "reading its files", error)
        else:
            if agent_id in faults:
                self._stage_worked(agent_id, "reading its files")
        # The lineage and the ledger are read by their own readers whatever the card's
        # reading did, and each reading is taken once: what they saw is projected now, or a
        # failure above (or after them) would leave their rows stale until the agent's next
        # change, since the next reading finds them unchanged.
        lineage_changed = ledger_changed = False
        try:
            side = self._sides[agent_id]
            try:
                news = side.refresh(changed)
                lineage_changed = news.lineage_changed
                self._follow_agent_side(agent_id, monitor, news)
            except BaseException:
                side.rewind()  # read again at the next refresh what was not acted on
                raise
        except Exception as error:
            self._stage_failed(agent_id, "reading its reports and inbox", error)
        else:
            if agent_id in faults:
                self._stage_worked(agent_id, "reading its reports and inbox")
        try:
            ledger_changed = self._ledgers.refresh(monitor.files, changed)
        except Exception as error:
            self._stage_failed(agent_id, "reading its ledger", error)
        else:
            if agent_id in faults:
                self._stage_worked(agent_id, "reading its ledger")
        # A card reading that raised (None) tells nothing of what it moved before it failed:
        # project anyway; the card is still the last good reading, and an unchanged one
        # sends nothing.
        health = self._health(agent_id) if self._has_problems(agent_id) else "[]"
        if (
            result is None
            or result.card_changed
            or result.activity_changed
            or lineage_changed
            or ledger_changed
            or agent_id in self._owed
            or self._saved_health.get(agent_id, "[]") != health  # the card shows problems
        ):
            self._project_paced(agent_id)
        if self._saved_health.get(agent_id) != health:  # the call only when it saves
            self._save_health(agent_id, health)

    def _project_paced(self, agent_id: str) -> None:
        """`_project`, at most `COMPOSE_SHARE` of the loop's time for one agent.

        Composing and rendering a card costs a fraction of a millisecond, but a body dense
        with Markdown (thousands of marks) costs hundreds: an agent rewriting such a body
        several times a second would hold the loop, and every other agent's card would wait.
        A projection that took `COMPOSE_COST_FLOOR_S` of CPU or more is followed by a pause
        of that agent's projections long enough to keep its share of the time to
        `COMPOSE_SHARE`; changes meanwhile are owed one projection, made when the pause
        ends, with the latest files (latest wins, as everywhere)."""
        now = self._clock().timestamp()
        until = self._paced.get(agent_id)
        if until is not None and now < until:
            self._owed.add(agent_id)
            self._due.set_earliest(agent_id, until)
            return
        self._owed.discard(agent_id)
        started = time.thread_time()
        self._project(agent_id)
        cost_s = time.thread_time() - started
        if cost_s < COMPOSE_COST_FLOOR_S:
            if until is not None:  # most agents were never paced: nothing to drop
                self._paced.pop(agent_id, None)
            return
        pause_s = cost_s * (1 / COMPOSE_SHARE - 1)
        if agent_id not in self._paced_told:
            self._paced_told.add(agent_id)
            log.warning(
                "agent %s: composing its card took %.0f ms; it is composed again at most"
                " every %.1f s while it costs this much, to keep the other cards moving (a"
                " body with fewer Markdown marks renders faster; said once per agent)",
                agent_id,
                cost_s * 1000,
                pause_s,
            )
        self._paced[agent_id] = now + pause_s

    def _chat_zone(self, channel: str, chat: ChatRef) -> tzinfo:
        routes = self._routes_in(channel, chat)
        return routes[0].zone if routes else UTC

    def _guard(self, agent_id: str, stage: str) -> _Guard:
        """The per-agent fault barrier: an exception inside stays with this agent.

        Logged with its traceback once per episode (the first failure after a success of the
        same stage), recorded for `taskcard status` by its type only (a message may quote the
        agent's files), and cleared by the next success.
        """
        return _Guard(self, agent_id, stage)

    def _stage_failed(self, agent_id: str, stage: str, error: Exception) -> None:
        fault = f"{stage} failed ({type(error).__name__}); retried on the next change"
        # Made on the first failure only: an empty dict per healthy agent is 10,000 dicts.
        faults = self._faults.setdefault(agent_id, {})
        if stage not in faults:
            log.error("agent %s: %s", agent_id, fault, exc_info=error)
        faults[stage] = fault
        self._save_health(agent_id)

    def _stage_worked(self, agent_id: str, stage: str) -> None:
        kept = self._faults.get(agent_id)
        if kept is not None and kept.pop(stage, None) is not None:
            log.info("agent %s: %s works again", agent_id, stage)
            if not kept:
                del self._faults[agent_id]

    def _problem_sources(
        self, agent_id: str
    ) -> tuple[Mapping[str, str], str | None, Mapping[str, str], str | None]:
        """Where an agent's problems are kept: its refused files (name -> reason), the broken
        lines of its reports file (a problem of its own: a file's is looked at again at every
        stat, a line's lasts until a good report), its failed stages (stage -> fault) and why
        its inbox cannot be written. `agent_problems` words them and `_has_problems` asks
        whether any is there, both from here alone."""
        monitor = self._monitors.get(agent_id)
        side = self._sides.get(agent_id)
        return (
            monitor.files.problems if monitor is not None else {},
            side.broken_reports if side is not None else None,
            self._faults.get(agent_id, {}),
            self._desk.problems.get(agent_id),
        )

    def agent_problems(self, agent_id: str) -> list[str]:
        """What is wrong with one agent now: its files first, then failed stages."""
        if not self._has_problems(agent_id):
            return []  # the common case: nothing built
        refused, broken_reports, faults, inbox = self._problem_sources(agent_id)
        problems = [f"{name}: {reason}" for name, reason in sorted(refused.items())]
        if broken_reports is not None:
            problems.append(f"{REPORTS_NAME}: {broken_reports}")
        return problems + sorted(faults.values()) + ([inbox] if inbox else [])

    def _has_problems(self, agent_id: str) -> bool:
        """Whether `agent_problems` would list anything: `_problem_sources`' four places
        looked at without building its answer (asked twice per change, and per line of a
        board; the callers ask this first and word the problems only when there are some)."""
        monitor = self._monitors.get(agent_id)
        side = self._sides.get(agent_id)
        return bool(
            (monitor is not None and monitor.files.problems)
            or (side is not None and side.reports_broken)
            or self._faults.get(agent_id)
            or self._desk.problems.get(agent_id)
        )

    def _health(self, agent_id: str) -> str:
        """The agent's problems as saved (a JSON list), to compare with what was saved."""
        problems = self.agent_problems(agent_id)
        return json.dumps(problems) if problems else "[]"

    def _save_health(self, agent_id: str, value: str | None = None) -> None:
        """Persist the agent's problems when they changed, for `taskcard status` (`value`:
        `_health` already read for this change)."""
        if value is None:
            value = self._health(agent_id)
        if self._saved_health.get(agent_id) == value:
            return
        try:
            self._store.set_cursor(agent_health_key(agent_id), value)
        except Exception as error:
            # Health is advisory: the next change tries again; serving goes on meanwhile.
            log.warning("agent %s: its health could not be saved: %s", agent_id, error)
            return
        self._saved_health[agent_id] = value

    # Projection --------------------------------------------------------------------------

    def _chat_prefs(self, scope: str) -> ChatPrefs:
        prefs = self._prefs.get(scope)
        if prefs is None:
            prefs = self._store.prefs(scope)
            self._prefs[scope] = prefs
        return prefs

    def _project(self, agent_id: str) -> None:
        for route in list(self._routes_by_agent.get(agent_id, ())):
            self._project_route(route)

    def _project_route(self, route: Route) -> None:
        key = route.key
        agent_id = key.agent_id
        monitor = self._monitors.get(agent_id)
        if monitor is None or key.channel not in self._ready_channels:
            return
        if not self._serves(agent_id):
            return
        channel = self._channels[key.channel]
        prefs = self._prefs.get(key.chat_scope) or self._chat_prefs(key.chat_scope)
        has_message = self._scheduler.has_message(key)
        if self._views.view(key.chat_scope) == "board":
            self._mark_board(key.chat_scope)
            attention = needs_attention(
                monitor.card, monitor.activity, self._has_problems(agent_id)
            )
            if not attention:
                # Its own card is retired: the board follows it now. So is one still on its
                # way (`/taskcard cards` just before): unsent, it is dropped; in flight, it is
                # edited once posted (it was posted afterwards and stayed, as if live).
                if has_message or not self._scheduler.settled(route.key):
                    self._retire_card(route, channel)
                return
        if monitor.card.status == "none" and not has_message:
            return  # the resident appears with the first card, not before
        if prefs.hidden and not has_message:
            return
        # Behind the fault barrier (`_guard`), spelled out as in `_refresh` (once per change).
        try:
            ledger_line = ledger_row(self._ledgers.current(monitor.files))
            # After the ledger's look: a refusal found by a first look is on this card.
            problems = self.agent_problems(agent_id) if self._has_problems(agent_id) else []
            view = compose_view(
                agent_id,
                monitor.card,
                monitor.activity,
                hidden=prefs.hidden,
                activity_rows=prefs.activity_rows or self._config.display.activity_rows,
                now=self._clock(),
                zone=route.zone,
                ledger_line=ledger_line,
                lineage=self._sides[agent_id].lineage,
                redactor=self._redact,
                problems=problems,
            )
            self._scheduler.submit(key, self._render_card(channel, view))
        except Exception as error:
            self._stage_failed(agent_id, "composing its card", error)
        else:
            if agent_id in self._faults:
                self._stage_worked(agent_id, "composing its card")
            elif not problems and self._saved_health.get(agent_id) == "[]":
                # No problem after the ledger's look, no fault now, none saved: nothing
                # composing does after that look can add one, so there is nothing to save.
                return
        # A composition may take the ledger's first look: a refusal found there shows in
        # `taskcard status` now, not only after the agent's next change.
        self._save_health(agent_id)

    def _retire_card(self, route: Route, channel: Channel) -> None:
        monitor = self._monitors[route.key.agent_id]
        with self._guard(route.key.agent_id, "composing its card"):
            view = compose_view(
                route.key.agent_id,
                monitor.card,
                monitor.activity,
                hidden=self._chat_prefs(route.key.chat_scope).hidden,
                activity_rows=0,
                now=self._clock(),
                zone=route.zone,
            )
            view = replace(
                view, auto_rows=view.auto_rows[:1], body=None, body_note=RETIRED_CARD_NOTE
            )
            self._scheduler.submit(route.key, self._render_card(channel, view), release=True)

    def _card_refused_marker(self, key: RouteKey) -> Outgoing | None:
        """The agent and its state, and a note that its latest card was refused: short, so
        the platform that refused the card takes it; None for a route that is no card."""
        monitor = self._monitors.get(key.agent_id)
        channel = self._channels.get(key.channel)
        route = next((r for r in self._routes_by_agent.get(key.agent_id, ()) if r.key == key), None)
        if route is None or monitor is None or channel is None:
            return None
        if self._chat_prefs(key.chat_scope).hidden:
            return None
        with self._guard(key.agent_id, "composing its card"):
            view = compose_view(
                key.agent_id,
                monitor.card,
                monitor.activity,
                hidden=False,
                activity_rows=0,
                now=self._clock(),
                zone=route.zone,
            )
            view = replace(
                view, auto_rows=view.auto_rows[:1], body=None, body_note=CARD_REFUSED_NOTE
            )
            return self._render_card(channel, view)
        return None

    # Boards ------------------------------------------------------------------------------

    def _render_card(self, channel: Channel, view: CardView) -> Outgoing:
        """`view` rendered for `channel` with every configured secret removed.

        The view's texts are scrubbed before rendering; what the renderer produced is checked
        again, and a body that still spells a secret there is withheld whole.
        """
        scrub = self._redact
        # The body first: `compose_view` redacted it last, and a body it left unchanged is
        # answered by `redact` at once if no other text is redacted in between.
        body = None if view.body is None else scrub(view.body)
        rows = tuple(map(scrub, view.auto_rows))
        note = None if view.body_note is None else scrub(view.body_note)
        if rows != view.auto_rows or body != view.body or note != view.body_note:
            # Only when a secret was removed: copying the view costs more than the check.
            view = replace(view, auto_rows=rows, body=body, body_note=note)
        outgoing = channel.render_card(view)
        # Every string the platform receives is checked on its own (what a chat shows comes
        # from these strings; the JSON punctuation between them never joins two of them),
        # and the plain text too unless it is one of them verbatim. Walking the payload costs
        # half of dumping it as JSON and folding the dump, entity offsets and all; strings
        # too short to hold a secret (keys, entity types) are passed over as they are met.
        leaks_in = self._redact.leaks_in
        leaks = leaks_in(outgoing.payload, outgoing.text)  # again only after a new rendering
        if leaks and view.body is not None:
            log.warning("agent %s: card body spelled a configured secret; withheld", view.agent_id)
            view = replace(view, body=WITHHELD_BODY, body_cut=False)
            outgoing = channel.render_card(view)
            leaks = leaks_in(outgoing.payload, outgoing.text)
        if leaks and view.auto_rows:
            log.warning("agent %s: activity spelled a configured secret; withheld", view.agent_id)
            outgoing = channel.render_card(replace(view, auto_rows=(WITHHELD_ROWS,)))
        return outgoing

    def _render_text(self, channel: Channel, text: str, *, own: bool = False) -> Outgoing:
        """`text` for `channel`; `own`: of the service's own words alone (a command's help or
        acknowledgement, never an agent's or a person's text), so its commands stay commands
        (tappable on Telegram)."""
        if own:
            return channel.render_own_text(self._redact(text))
        return channel.render_text(self._redact(text))

    # Notices -----------------------------------------------------------------------------

    def _quiet(self, key: RouteKey) -> bool:
        """People hid the cards in the route's chat, or its delivery is disabled: notices
        for it are recorded as suppressed, never sent (see `NoticeOutbox`)."""
        hidden = self._chat_prefs(key.chat_scope).hidden
        return hidden or self._scheduler.disabled_reason(key) is not None

    def _announce(self, agent_id: str, notice_id: str, text: str, kind: str) -> None:
        """One notice to each route of the agent, once per id (idempotent across restarts)."""
        routes = [route.key for route in self._routes_by_agent.get(agent_id, ())]
        self._outbox.announce(routes, notice_id, text, kind)

    # Commands ----------------------------------------------------------------------------

    def _routes_in(self, channel: str, chat: ChatRef) -> list[Route]:
        same_chat = [
            r
            for r in self._routes
            if r.key.channel == channel and r.key.chat.chat_id == chat.chat_id
        ]
        exact = [r for r in same_chat if r.key.chat.thread_id == chat.thread_id]
        return exact or [r for r in same_chat if r.key.chat.thread_id is None]

    # Observing ---------------------------------------------------------------------------

    def snapshot(self) -> ServiceSnapshot:
        """The levels metrics and `/healthz` report, read now (on the loop).

        Read per scrape, not on a timer: counting faulted agents and pending residents walks
        the fleet (a few ms at 10,000 agents), which a level needs to be exact; the scraper
        sets the pace, and an unscraped service never pays it."""
        now = self._clock().timestamp()
        store_error = None
        try:
            active_pauses = sum(1 for until in self._store.pauses().values() if until > now)
            notices = self._store.notice_counts()
        except Exception as error:
            # Redis away, or its user may not read: the levels kept in memory still count,
            # and the page and /healthz say the store cannot be read instead of failing.
            store_error = one_line_cut(f"{type(error).__name__}: {error}", 200)
            log.warning("the state store could not be read for /metrics: %s", store_error)
            active_pauses, notices = 0, {}
        return ServiceSnapshot(
            running=self._running,
            channels=tuple(self._channels),
            ready_channels=tuple(n for n in self._channels if n in self._ready_channels),
            agents_watched=len(self._monitors),
            agents_faulted=sum(1 for m in self._monitors.values() if m.card.error_code),
            active_pauses=active_pauses,
            lane_depths={
                (lane.channel, lane.chat_id): n for lane, n in self._scheduler.lane_depths().items()
            },
            notices=notices,
            store_error=store_error,
        )


class _Guard:
    """`Service._guard`: a class rather than a generator-based context manager, since it is
    entered three times per agent change (about a quarter of the generator's cost)."""

    __slots__ = ("_agent_id", "_service", "_stage")

    def __init__(self, service: Service, agent_id: str, stage: str) -> None:
        self._service, self._agent_id, self._stage = service, agent_id, stage

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _tb: object
    ) -> bool:
        if error is None:
            if self._agent_id in self._service._faults:  # else nothing to clear (most often)
                self._service._stage_worked(self._agent_id, self._stage)
            return False
        if isinstance(error, Exception):
            self._service._stage_failed(self._agent_id, self._stage, error)
            return True
        return False  # cancelled or interrupted: not the agent's fault
