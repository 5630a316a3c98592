"""What an agent's side says, and whom it wakes: reports, signals, wakes, orchestrator marks.

Each refresh of an agent reads its side (`bridge.track.reports`): a new report, and the
time-driven signals decided from its card and activity (`due_signals`), are announced on
its routes and wake someone through their inbox (`_signal`): its parent when known here,
else the orchestrator of each chat that follows it (`_orchestrator_of`, the chat's choice or
its routes' `orchestrator` setting, see `bridge.run.orchestrators`). Clustered, a wake for an
orchestrator another instance serves is kept in Redis for that instance (`_relay_wake`,
`wake_relayed`, `bridge.cluster.wakes`), and the other instances' route marks are learned
at each renewal (`others_route_marks`).

A mixin of `Service`, not a collaborator: a signal goes out through the service's notices
and inbox desk, to the routes of its agent, and a changed inbox problem shows on the agent's
card and health, so a separate object would need a reference to most of the service. Its
state (`_route_marks_elsewhere`, `_wake_relay`, `_cluster_chat`) is made in
`Service.__init__` with the rest; what it uses of the service is declared below, for the
type checker.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from taskcard.bridge.cluster.wakes import RelayedWake, decode_wake
from taskcard.bridge.compose.redact import Redactor
from taskcard.bridge.config import AGENT_ID_PATTERN, ServiceConfig
from taskcard.bridge.notices.signals import Signal, SignalFacts, due_signals, report_signal
from taskcard.bridge.run.commands import ORCHESTRATOR_OFF
from taskcard.bridge.run.fleet import Route
from taskcard.bridge.run.inbox_desk import InboxDesk
from taskcard.bridge.run.orchestrators import (
    ChatMarks,
    ChatOrchestrators,
    chat_orchestrator,
    orchestrator_pointer,
    unfollowed_choice,
)
from taskcard.bridge.schedule.routes import chat_scope
from taskcard.bridge.track.due import DueAgents
from taskcard.bridge.track.monitor import ActivitySummary, AgentMonitor, CardState
from taskcard.bridge.track.reports import AgentSide, SideRefresh
from taskcard.channels.base import ChatRef, IncomingCommand

if TYPE_CHECKING:
    from taskcard.bridge.cluster.wakes import WakeRelay

log = logging.getLogger(__name__)
# What a write into an inbox returns, passed through `Service._showing_inbox`.
_T = TypeVar("_T")
# Clustered: the agents the whole cluster routes to a chat, and those routes' `orchestrator`
# settings (see `routed_marks`).
ClusterChat = Callable[[str, ChatRef], Awaitable[tuple[list[str], list[str]]]]


class AgentSignals:
    """The signals and wakes of `Service` (see the module docstring)."""

    # Made by `Service.__init__`.
    _config: ServiceConfig
    _clock: Callable[[], datetime]
    _redact: Redactor
    _owned: set[str] | None
    _cluster_chat: ClusterChat | None
    _wake_relay: WakeRelay | None
    _route_marks_elsewhere: dict[str, list[str]]
    _desk: InboxDesk
    _orchestrators: ChatOrchestrators
    _monitors: dict[str, AgentMonitor]
    _sides: dict[str, AgentSide]
    _due: DueAgents
    _routes_by_agent: dict[str, list[Route]]
    _routes_by_scope: dict[str, list[Route]]

    if TYPE_CHECKING:  # the service's, used here

        def _serves(self, agent_id: str) -> bool: ...
        def _announce(self, agent_id: str, notice_id: str, text: str, kind: str) -> None: ...
        def _project_paced(self, agent_id: str) -> None: ...
        def _save_health(self, agent_id: str, value: str | None = None) -> None: ...
        def _mark_board(self, scope: str) -> None: ...

    def _follow_agent_side(self, agent_id: str, monitor: AgentMonitor, news: SideRefresh) -> None:
        """Reports, signals, inbox acks: what `news` (this refresh's reading) asks for."""
        side = self._sides[agent_id]
        for report in news.reports:
            self._signal(agent_id, report_signal(agent_id, report, self._redact))
        activity, card = monitor.activity, monitor.card
        # Most changes move nothing the time-driven signals are decided from (a new card
        # body: only the card's status and its time count). With the same facts, the same
        # floor and no signal due last time, `due_signals` says the same until the moment it
        # named (the idle floor), which stays set as the agent's due time: not asked again.
        # The activity summary and the report are immutable, so the same objects are the
        # same facts.
        floor_s = self._config.signals.idle_floor_s
        quiet = side.quiet_signals
        if (
            quiet is not None
            and quiet[0] is activity
            and quiet[1] is side.latest_report
            and quiet[2] == card.status
            and quiet[3] == card.status_changed_at
            and quiet[4] == floor_s
            and (quiet[5] is None or self._clock() < quiet[5])
        ):
            if quiet[5] is not None:  # a refresh may have moved the agent's due time
                self._due.set_earliest(agent_id, quiet[5].timestamp())
        else:
            self._follow_signals(agent_id, side, activity, card, floor_s)
        if news.acks:
            self._desk.on_acks(agent_id, news.acks)
        self._desk.refresh(agent_id)
        side.commit()  # recorded in the store: the offsets may move past them

    def _follow_signals(
        self,
        agent_id: str,
        side: AgentSide,
        activity: ActivitySummary,
        card: CardState,
        floor_s: float,
    ) -> None:
        """Announce the time-driven signals due now, and make the agent due when the next
        one may become due; remembered when none was due (see `_follow_agent_side`)."""
        facts = SignalFacts(
            agent_id=agent_id,
            state=activity.state,
            card_live=card.status == "active",
            card_since=card.status_changed_at,
            started_at=activity.agent_started_at,
            exited_at=activity.exited_at,
            turn_started_at=activity.turn_started_at,
            turn_ended_at=activity.turn_ended_at,
            last_event_at=activity.last_event_at,
            latest_report=side.latest_report,
            turn_error=activity.turn_error,
        )
        signals, next_due = due_signals(facts, self._clock(), floor_s)
        for signal in signals:
            self._signal(agent_id, signal)
        if next_due is not None:
            self._due.set_earliest(agent_id, next_due.timestamp())
        side.quiet_signals = (
            None
            if signals
            else (
                activity,
                side.latest_report,
                card.status,
                card.status_changed_at,
                floor_s,
                next_due,
            )
        )

    def _signal(self, agent_id: str, signal: Signal) -> None:
        """A signal to the agent's routes and, as a wake, to its parent when known here,
        else to the orchestrator of each chat that follows it (the spec's order: the
        spawner first, then the board's orchestrator mark)."""
        text = self._redact(signal.text)
        self._announce(agent_id, signal.episode, text, "signal")
        lineage = self._sides[agent_id].lineage
        report = signal.kind == "report"
        # An agent named as its own parent (a mistaken spawn) is woken by nobody.
        if lineage is not None and lineage.parent != agent_id and lineage.parent in self._monitors:
            self._wake(lineage.parent, agent_id, signal.episode, text, report=report)
            return
        woken: set[str] = set()
        relayed: set[str] = set()
        workdir = self._monitors[agent_id].paths.workdir
        for route in self._routes_by_agent.get(agent_id, ()):
            scope = route.key.chat_scope
            orchestrator = self._orchestrator_of(scope)
            if orchestrator is None or orchestrator not in self._monitors:
                if scope not in relayed and self._marked_elsewhere(scope, agent_id):
                    relayed.add(scope)
                    self._relay_wake(scope, agent_id, workdir, signal, text)
                continue
            if orchestrator == agent_id or orchestrator in woken:
                continue
            woken.add(orchestrator)
            # The service's line first: the notice ends with the agent's own summary, which
            # could otherwise end with a look-alike pointer to another folder.
            pointer = orchestrator_pointer(agent_id, workdir, signal.report_seq)
            self._wake(orchestrator, agent_id, signal.episode, f"{pointer}\n{text}", report=report)

    def _wake(self, woken: str, agent_id: str, episode: str, text: str, *, report: bool) -> None:
        """`InboxDesk.wake`, and the woken agent's card shown again when that changed its
        problems (its inbox cannot be written, or can again): the card is where the chat
        learns that the agent is no longer woken, and its own files may not change soon."""
        self._showing_inbox(
            woken, lambda: self._desk.wake(woken, agent_id, episode, text, report=report)
        )

    def _showing_inbox(self, agent_id: str, write: Callable[[], _T]) -> _T:
        """`write` (a write into `agent_id`'s inbox: a wake, a person's message, a withdrawal),
        and the agent's card shown again and its record saved when that changed the inbox's
        problem (it cannot be written, or can again)."""
        before = self._desk.problems.get(agent_id)
        result = write()
        # Clustered, only the agent's server shows and records its problems: another
        # instance's view (its own failed or good write) would overwrite the server's record.
        if self._desk.problems.get(agent_id) != before and self._serves(agent_id):
            self._project_paced(agent_id)
            self._save_health(agent_id)
        return result

    def _marked_elsewhere(self, scope: str, agent_id: str) -> bool:
        """Clustered: whether the chat may have an orchestrator another instance serves, its
        mark unknown here (another instance's route setting, or the chat's choice of an agent
        no route here follows). Not when the chat chose none, nor `agent_id` itself."""
        if self._wake_relay is None:
            return False
        choice = self._orchestrators.choice(scope)
        return choice is None or choice.agent not in (None, agent_id)

    def _relay_wake(
        self, scope: str, agent_id: str, workdir: Path, signal: Signal, text: str
    ) -> None:
        """Keep the wake in the shared store for the instance serving the chat's orchestrator
        (`wake_relayed` there): typed fields, the pointer built by that instance."""
        assert self._wake_relay is not None
        wake = RelayedWake(
            agent_id=agent_id,
            workdir=str(workdir),
            episode=signal.episode,
            report_seq=signal.report_seq,
            report=signal.kind == "report",
            text=text,
        )
        self._wake_relay.keep(scope, wake)

    def others_route_marks(self, marks: list[tuple[str, str, str, str]]) -> None:
        """Clustered: the `orchestrator` settings of the other live instances' routes, as
        (channel, chat, topic or "", agent); see `_orchestrator_of`."""
        found: dict[str, list[str]] = {}
        for channel, chat, topic, agent in marks:
            scope = chat_scope(channel, ChatRef(chat, topic or None))
            found.setdefault(scope, []).append(agent)
        learned = {scope: sorted(set(a)) for scope, a in found.items()}
        if learned == self._route_marks_elsewhere:
            return
        # Read again only when a record changed: the chats whose mark moved show it on
        # their boards (the 🎯 stayed on the agent marked before until the chat's next change),
        # also a mark of an agent another instance serves (`_project_shared_board`).
        before = {scope: self._marks_here(scope) for scope in self._routes_by_scope}
        self._route_marks_elsewhere = learned
        for scope, marked in before.items():
            if self._marks_here(scope) != marked:
                self._mark_board(scope)

    def _marks_here(self, scope: str) -> tuple[str | None, list[str]]:
        """What of the chat `scope`'s board the other instances' route marks decide: its
        orchestrator by the routes here, and those marks (`_route_marks_for`)."""
        routes = self._routes_by_scope.get(scope, ())
        return self._orchestrator_of(scope), self._route_marks_for(scope, routes)

    def _route_marks_for(self, scope: str, routes: Iterable[Route]) -> list[str]:
        """The other instances' route marks of the chat `scope` (`others_route_marks`); in a
        forum topic, those of the whole chat when none is the topic's own, as the chat's
        answers fall back from a topic to the whole chat."""
        if not self._route_marks_elsewhere:
            return []
        found = self._route_marks_elsewhere.get(scope)
        first = next(iter(routes), None)
        if found is None and first is not None and first.key.chat.thread_id is not None:
            whole = chat_scope(first.key.channel, ChatRef(first.key.chat.chat_id))
            found = self._route_marks_elsewhere.get(whole)
        return found or []

    def orchestrated_scopes(self) -> list[str]:
        """Clustered: the chats whose orchestrator this instance serves (holds its lease)."""
        owned = self._owned or set()
        return [
            scope
            for scope in self._routes_by_scope
            if (orchestrator := self._orchestrator_of(scope)) is not None and orchestrator in owned
        ]

    def wake_relayed(self, scope: str, members: list[str]) -> list[str]:
        """Clustered: wake the chat's orchestrator, served here, with the wakes another
        instance kept for it (`_relay_wake`); returns those done with. A wake is the desk's,
        so it is queued once per signal in the cluster (the shared notices), and reports the
        orchestrator has not taken yet travel in one wake. Left for later: the wakes of a
        chat whose orchestrator this instance no longer serves (another takes them)."""
        orchestrator = self._orchestrator_of(scope)
        if orchestrator is None or orchestrator not in (self._owned or set()):
            return []
        done: list[str] = []
        for member in members:
            done.append(member)
            wake = decode_wake(member, AGENT_ID_PATTERN.fullmatch)
            if wake is None:
                log.warning("chat %s: a kept wake this version does not read was dropped", scope)
                continue
            if wake.agent_id == orchestrator:
                continue  # the orchestrator's own signals wake nobody
            pointer = orchestrator_pointer(wake.agent_id, Path(wake.workdir), wake.report_seq)
            self._wake(
                orchestrator,
                wake.agent_id,
                wake.episode,
                f"{pointer}\n{self._redact(wake.text)}",
                report=wake.report,
            )
        return done

    async def _chat_marks(
        self, channel_name: str, command: IncomingCommand, scope: str, named: str | None = None
    ) -> ChatMarks:
        """The agents the chat follows and its routes' `orchestrator` setting, for the answer
        to `command`: this instance's routes; clustered, every live instance's too (read
        from Redis only for an instance that answers, or for a mark named that no route here
        follows: every instance keeps the chat's choice), this instance's setting first."""
        routes = self._routes_by_scope.get(scope, ())
        followed = {r.key.agent_id for r in routes}
        configured = next((r.orchestrator for r in routes if r.orchestrator is not None), None)
        elsewhere = named is not None and named != ORCHESTRATOR_OFF and named not in followed
        if self._cluster_chat is not None and (command.reply or elsewhere):
            names, marks = await self._cluster_chat(channel_name, command.chat)
            # Ids as the config takes them only: the answer is the service's own text.
            followed.update(filter(AGENT_ID_PATTERN.fullmatch, names))
            configured = configured or next(filter(AGENT_ID_PATTERN.fullmatch, marks), None)
        return ChatMarks(frozenset(followed), configured)

    def _orchestrator_of(self, scope: str, marks: ChatMarks | None = None) -> str | None:
        """The chat's orchestrator now (see `bridge.run.orchestrators`), or None; by `marks`
        (the cluster's, for an answer) when given, else by the routes here."""
        if marks is not None:
            return chat_orchestrator(
                self._orchestrators.choice(scope), marks.configured, marks.followed
            )
        routes = self._routes_by_scope.get(scope, ())
        configured = next((r.orchestrator for r in routes if r.orchestrator is not None), None)
        elsewhere = self._route_marks_for(scope, routes) if configured is None else ()
        choice = self._orchestrators.choice(scope)
        if choice is None and configured is None and not elsewhere:
            return None  # the common case: no set of the chat's agents built
        followed = {r.key.agent_id for r in routes}
        # Clustered, another instance's route setting applies here when no route here has
        # one and it names an agent a route here follows (one discovered only here): this
        # instance serves it, so it takes the wakes kept for the chat.
        configured = configured or next((a for a in elsewhere if a in followed), None)
        if self._wake_relay is not None and unfollowed_choice(choice, followed) is not None:
            # Clustered, the chosen agent may be another instance's: the chat's choice holds
            # (its wakes relayed, `_marked_elsewhere`), not set aside for this one's setting.
            return None
        return chat_orchestrator(choice, configured, followed)
