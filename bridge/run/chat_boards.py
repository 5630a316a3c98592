"""Each chat's board, when the chat shows one: composed, sent, retired, shared in a cluster.

A board is one message per chat with one line per agent (`/taskcard board`). Any change of
an agent on it marks the chat (`_mark_board`), and the marked boards are composed together
after this turn of the loop, at most every `BOARD_COMPOSE_EVERY_S` (`_flush_boards`). A chat
that switches back to cards sees its board retired; one that loses its last route sees it
say so, once (`_unfollow_board`). Clustered, each instance shares the lines of the agents it
serves, and only the holder of the chat's board lease composes and sends the board from
everyone's lines (`_project_shared_board`, `bridge.cluster.boards`); `take_board`,
`drop_board` and `board_changed` are the cluster's calls.

Where a chat's view and board key live: `bridge.run.boards` (read by `taskcard status` too).

A mixin of `Service`, not a collaborator: a board is composed from the service's routes by
chat, its agents' monitors and faults, the chat's preferences and orchestrator mark, and
sent through its scheduler, so a separate object would need a reference to most of the
service. Its state (`_board_timer`, `_board_flush`, `_boards_composed_at`, `_boards`,
`_boards_held`, `_shared_boards`) is made in `Service.__init__` with the rest; what it uses
of the service is declared below, for the type checker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Final

from taskcard.bridge.compose.board import (
    BoardEntry,
    board_facts,
    compose_board,
    compose_facts,
    facts_from_record,
    facts_record,
    fit_board,
    unobserved,
)
from taskcard.bridge.compose.redact import Redactor
from taskcard.bridge.deliver.registry import RouteSpec
from taskcard.bridge.run.boards import ChatViews, board_key
from taskcard.bridge.run.fleet import Route
from taskcard.bridge.run.orchestrators import ChatMarks
from taskcard.bridge.schedule.routes import chat_scope
from taskcard.bridge.schedule.scheduler import RouteKey, RouteScheduler
from taskcard.bridge.store.sqlite import ChatPrefs
from taskcard.bridge.track.monitor import AgentMonitor
from taskcard.channels.base import BoardView, Channel

if TYPE_CHECKING:
    from taskcard.bridge.cluster.boards import SharedBoards

log = logging.getLogger(__name__)

# In a board line shared in a cluster: the route of the instance sharing it marks its agent
# as the chat's orchestrator (`orchestrator = ...`).
ROUTE_MARK: Final = "route_orchestrator"
# The last word of a board retired for cards.
RETIRED_BOARD_SUMMARY = "replaced by one card per agent (/taskcard board brings it back)"
# The last word of a board whose chat lost its last route (`Service._unfollow_board`).
UNFOLLOWED_BOARD_SUMMARY = "no longer followed: this chat follows no agent now"
# A board is composed at most this often. Each change of any agent on it would otherwise
# compose and render all of its lines again (in a storm of 500 changes a second, a whole
# core), while the chat shows at most one edit every few seconds and only the latest
# composition is ever sent; this adds at most this much to a board's staleness.
BOARD_COMPOSE_EVERY_S = 0.5


class ChatBoards:
    """The boards of `Service` (see the module docstring)."""

    # Made by `Service.__init__`.
    _channels: dict[str, Channel]
    _clock: Callable[[], datetime]
    _redact: Redactor
    _specs: list[RouteSpec]
    _scheduler: RouteScheduler
    _views: ChatViews
    _monitors: dict[str, AgentMonitor]
    _routes_by_scope: dict[str, list[Route]]
    _closing: dict[RouteKey, float]
    _unfollowing: set[RouteKey]
    _ready_channels: set[str]
    _running: bool
    _stopped: bool
    _board_timer: asyncio.TimerHandle | None
    _board_flush: asyncio.Task[None] | None
    _boards_composed_at: float
    _boards: set[RouteKey]
    _boards_held: set[str]
    _shared_boards: SharedBoards | None

    if TYPE_CHECKING:  # the service's, used here

        def _serves(self, agent_id: str) -> bool: ...
        def _chat_prefs(self, scope: str) -> ChatPrefs: ...
        def _has_problems(self, agent_id: str) -> bool: ...
        def _followed(self, scope: str) -> set[str]: ...
        def _route_marks_for(self, scope: str, routes: Iterable[Route]) -> list[str]: ...
        def _orchestrator_of(self, scope: str, marks: ChatMarks | None = None) -> str | None: ...

    def _schedule_boards(self) -> None:
        """Every routed chat may switch to a board: its resident is known to the scheduler
        (clustered: of the chats whose board is sent here)."""
        for scope, routes in self._routes_by_scope.items():
            if self._shared_boards is not None and scope not in self._boards_held:
                continue
            key = board_key(routes[0].key)
            # Routed again while its last edit saying the chat follows no agent is on its
            # way: it stays, and the board's next composition brings it back to life.
            self._closing.pop(key, None)
            self._unfollowing.discard(key)
            if key not in self._boards:
                # Paced: a board changes with every agent, so bursts would starve it.
                self._scheduler.add_route(key, pin=routes[0].pin, paced=True)
                self._boards.add(key)
            else:
                self._scheduler.set_pin(key, routes[0].pin)

    def board_scopes(self) -> list[str]:
        """Clustered: the chats this instance routes agents to (it competes for their
        boards' leases)."""
        return list(self._routes_by_scope)

    def take_board(self, scope: str) -> None:
        """Clustered: send the chat's board from here on (its lease was gained); the board
        starts from the shared store, so the message another instance posted is edited."""
        self._boards_held.add(scope)
        if self._running:
            self._schedule_boards()
            self._mark_board(scope)

    def drop_board(self, scope: str) -> None:
        """Clustered: another instance sends the chat's board now."""
        self._boards_held.discard(scope)
        for key in [key for key in self._boards if key.chat_scope == scope]:
            self._scheduler.remove_route(key)
            self._boards.discard(key)

    def board_changed(self, scope: str) -> None:
        """Clustered: a line of the chat's board changed (`*`: any chat's may have)."""
        if not self._running:
            return
        if scope == "*":
            for held in sorted(self._boards_held):
                self._mark_board(held)
        elif scope in self._boards_held or (
            self._shared_boards is not None and self._shared_boards.failed(scope)
        ):
            self._mark_board(scope)  # failed here: its lines are shared again

    def _mark_board(self, scope: str) -> None:
        """Compose the chat's board after this turn of the loop, and no sooner than
        `BOARD_COMPOSE_EVERY_S` after the last composition: a burst of changes (a rescan, a
        restart, a storm) makes one board, not one per change."""
        self._views.mark(scope)
        if self._board_timer is None:
            loop = asyncio.get_running_loop()
            at = max(loop.time(), self._boards_composed_at + BOARD_COMPOSE_EVERY_S)
            self._board_timer = loop.call_at(at, self._flush_boards)

    def _flush_boards(self) -> None:
        self._board_timer = None
        loop = asyncio.get_running_loop()
        if self._shared_boards is not None:
            if self._stopped:
                return  # no task is started that the stop would not wait for
            if self._board_flush is not None and not self._board_flush.done():
                # The last composition still waits for Redis: this one comes after it, so
                # two never share one chat's lines at once or send its boards out of order.
                self._board_timer = loop.call_later(BOARD_COMPOSE_EVERY_S, self._flush_boards)
                return
            self._boards_composed_at = loop.time()
            scopes = self._views.take_dirty()
            if scopes:
                self._board_flush = loop.create_task(
                    self._flush_shared_boards(scopes), name="boards"
                )
            return
        self._boards_composed_at = loop.time()
        for scope in self._views.take_dirty():
            try:
                self._project_board(scope)
            except Exception:
                # The board is every agent's: a bug here must not reach the loop.
                log.exception("chat %s: the board could not be composed", scope)

    async def _flush_shared_boards(self, scopes: Iterable[str]) -> None:
        """Clustered: compose the boards of `scopes`, off the timer's callback, since each
        waits for Redis (the lines shared, then read), which must not hold the loop."""
        for scope in scopes:
            try:
                await self._project_shared_board(scope)
            except Exception:
                log.exception("chat %s: the board could not be composed", scope)

    def _board_target(self, scope: str, routes: list[Route]) -> tuple[RouteKey, tzinfo] | None:
        """The chat's board resident and time zone when a board is to be composed for it
        now; None when not (no board resident, its channel not ready, or the chat shows
        cards: then a board it still shows is retired here)."""
        # With no route left (the chat's last agent left), a board it showed lists none.
        found = (
            board_key(routes[0].key)
            if routes
            else next((k for k in self._boards if k.chat_scope == scope), None)
        )
        if found is None:
            return None
        key, zone = found, routes[0].zone if routes else UTC
        if key.channel not in self._ready_channels or key not in self._boards:
            return None  # not scheduled yet (the service is starting)
        if not routes and self._board_unrouted(key):
            self._unfollow_board(key)
            return None
        if self._views.view(scope) == "cards":
            if self._scheduler.has_message(key):
                retired = BoardView(summary=RETIRED_BOARD_SUMMARY)
                channel = self._channels[key.channel]
                self._scheduler.submit(key, channel.render_board(retired), release=True)
            return None
        return key, zone

    def _board_unrouted(self, key: RouteKey) -> bool:
        """Whether the chat of board `key` lost its last route: no agent is routed there and
        the configuration names the chat no more (one it still names, say with `["*"]`,
        lists no agent until one appears). Not clustered only: another instance's
        configuration may still route the chat, which this one cannot tell."""
        scope = key.chat_scope
        return (
            self._shared_boards is None
            and not self._routes_by_scope.get(scope)
            and all(chat_scope(spec.channel, spec.chat) != scope for spec in self._specs)
        )

    def _unfollow_board(self, key: RouteKey) -> None:
        """The chat of board `key` lost its last route (a reload, or the start found the
        board with none: `_unfollow_resident`): the board is edited a last time to say the
        chat follows no agent now, as a card is (`_unfollow`), then closes; once that edit
        is shown it is marked (`UNFOLLOWED_REASON`), so no later start says it again. Routed
        again, the chat's board comes back to life in the same message (`_schedule_boards`).
        A board people hid is left as it is, as their cards are."""
        if key in self._closing:
            return
        if self._scheduler.has_message(key) and not self._chat_prefs(key.chat_scope).hidden:
            final = self._channels[key.channel].render_board(
                BoardView(summary=UNFOLLOWED_BOARD_SUMMARY)
            )
            self._scheduler.submit(key, final, last=True)
            self._unfollowing.add(key)
        self._closing[key] = asyncio.get_running_loop().time()

    def _project_board(self, scope: str) -> None:
        routes = self._routes_by_scope.get(scope, [])
        target = self._board_target(scope, routes)
        if target is None:
            return
        key, zone = target
        channel = self._channels[key.channel]
        has_message = self._scheduler.has_message(key)
        prefs = self._chat_prefs(scope)
        entries = self._board_entries(routes)
        started = any(e.card.status != "none" or e.activity.state != "unknown" for e in entries)
        if not has_message and (prefs.hidden or not started):
            return  # the board appears with the first sign of life, not before
        board = compose_board(
            entries,
            hidden=prefs.hidden,
            now=self._clock(),
            zone=zone,
            scrub=self._redact,
            orchestrator=self._orchestrator_of(scope),
        )
        self._scheduler.submit(key, channel.render_board(fit_board(board, channel.board_fits)))

    async def _project_shared_board(self, scope: str) -> None:
        """Clustered: share the lines of the chat's agents served here; then, when this
        instance sends the chat's board, compose it from every instance's lines."""
        assert self._shared_boards is not None
        await self._share_board_lines(scope, self._routes_by_scope.get(scope, []))
        if self._board_target(scope, self._routes_by_scope.get(scope, [])) is None:
            return
        records = await self._shared_boards.lines(scope)
        if records is None:
            return  # Redis did not answer (logged): composed again at the next renewal
        # Read again: the chat's routes, its view or its board lease may have changed while
        # Redis answered.
        target = self._board_target(scope, self._routes_by_scope.get(scope, []))
        if target is None:
            return
        key, zone = target
        channel = self._channels[key.channel]
        has_message = self._scheduler.has_message(key)
        prefs = self._chat_prefs(scope)
        lines = [
            facts if observed else unobserved(facts)
            for agent, (record, observed) in records.items()
            if (facts := facts_from_record(record)) is not None and facts.agent_id == agent
        ]
        started = any(line.started for line in lines)
        if not has_message and (prefs.hidden or not started):
            return
        # Scrubbed by their writers; again here, for this instance's own secrets.
        scrub = self._redact
        lines = [
            replace(
                line,
                headline=None if line.headline is None else scrub(line.headline),
                movement=None if line.movement is None else scrub(line.movement),
            )
            for line in lines
        ]
        # The chat's choice of an agent another instance serves marks its line too: every
        # agent a live instance shares a line of is followed in the chat (it was marked nowhere);
        # so does another instance's route setting, which its line says (`ROUTE_MARK`), and,
        # last, one its routed record says of an agent it does not serve (learned at the
        # renewals, `others_route_marks`; the board showed no mark of such a setting).
        routes = self._routes_by_scope.get(scope, [])
        configured = next((r.orchestrator for r in routes if r.orchestrator is not None), None)
        live = {agent: record for agent, (record, observed) in records.items() if observed}
        marked = sorted(agent for agent, record in live.items() if record.get(ROUTE_MARK) is True)
        elsewhere = self._route_marks_for(scope, routes)
        marks = ChatMarks(
            frozenset(self._followed(scope) | live.keys()),
            configured or next(iter(marked), None) or next(iter(elsewhere), None),
        )
        board = compose_facts(
            lines,
            hidden=prefs.hidden,
            now=self._clock(),
            zone=zone,
            orchestrator=self._orchestrator_of(scope, marks),
        )
        self._scheduler.submit(key, channel.render_board(fit_board(board, channel.board_fits)))

    def _board_entries(self, routes: list[Route]) -> list[BoardEntry]:
        """The board entries of the agents of `routes` served here."""
        return [
            BoardEntry(
                route.key.agent_id,
                monitor.card,
                monitor.activity,
                problems=self._has_problems(route.key.agent_id),
            )
            for route in routes
            if self._serves(route.key.agent_id)
            and (monitor := self._monitors.get(route.key.agent_id)) is not None
        ]

    async def _share_board_lines(self, scope: str, routes: list[Route]) -> None:
        """Clustered: the lines of the chat's agents served here, for the board's sender
        (none while the chat shows cards: a switch to the board shares them again)."""
        assert self._shared_boards is not None
        entries = self._board_entries(routes) if self._views.view(scope) == "board" else []
        configured = next((r.orchestrator for r in routes if r.orchestrator is not None), None)
        await self._shared_boards.share(
            scope,
            {
                e.agent_id: {
                    **facts_record(board_facts(e, self._redact)),
                    # The route here marks it: the board's sender, routing other agents,
                    # knows no such setting (a version that does not read it marks nobody).
                    **({ROUTE_MARK: True} if e.agent_id == configured else {}),
                }
                for e in entries
            },
        )
