"""`taskcard serve`: files in, one resident message per route out.

The pieces, in the order data flows through them:

    FleetWatcher ─► AgentMonitor (per agent) ─► compose_view ─► channel.render_card
                                   │                                   │
                                   └─► notices (typed, content-safe)   └─► RouteScheduler
    channel commands (/taskcard ...) ─► chat preferences (store) ──────────────┘

The service never executes code from a workdir and never writes into one. Every background
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
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, tzinfo

from bridge.compose.redact import Redactor
from bridge.compose.view import compose_view, route_zone
from bridge.config import ServiceConfig
from bridge.deliver.registry import BuiltChannel
from bridge.notices.text import (
    FoldedNotices,
    NoticeGate,
    notice_kind,
    notice_text,
    safe_error_code,
    summary_text,
)
from bridge.observe.metrics import ServiceSnapshot
from bridge.schedule.scheduler import RouteKey, RouteScheduler
from bridge.store.sqlite import ChatPrefs, NoticeState, SeenChat, StateStore
from bridge.track.ledger import LedgerView, ledger_row
from bridge.track.monitor import AgentMonitor, AgentRefresh
from bridge.watch.watcher import FleetWatcher
from channels.base import CardView, Channel, ChatRef, IncomingCommand, Outgoing
from channels.errors import ChannelError, RateLimited, Transient
from producers.task_card.contract import Notification

log = logging.getLogger(__name__)

_ROWS_ARG = re.compile(r"^\d{1,2}$")
# Shown instead of a card body that still spelled a configured secret after rendering (for
# example split by Markdown emphasis, `12345**6789:AA...**`, and joined again by the renderer).
WITHHELD_BODY = "(card body withheld: it contained one of this service's own secrets)"
WITHHELD_ROWS = "(activity withheld: it contained one of this service's own secrets)"
HELP_TEXT = (
    "/taskcard: show the state here · /taskcard off: hide the cards · "
    "/taskcard on: show them · /taskcard N: show N activity rows (1-10)"
)


AGENT_HEALTH_PREFIX = "agent-health:"


def agent_health_key(agent_id: str) -> str:
    """The store key under which an agent's current problems are kept for `taskcard status`."""
    return AGENT_HEALTH_PREFIX + agent_id


def parse_agent_health(raw: str | None) -> list[str]:
    """The problems recorded for one agent (the store value), [] when none or unreadable."""
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return []
    if not isinstance(data, list):
        return []
    return [item for item in data if isinstance(item, str)]


def _folded_cursor(key: RouteKey) -> str:
    """Where a route's open fold episode is saved, so its summary survives a restart."""
    return f"notices:folded:{key}"


class ServiceFailed(Exception):
    """The service cannot do anything useful (every channel failed for good)."""


@dataclass(frozen=True)
class Route:
    key: RouteKey
    pin: bool
    allowed_user_ids: frozenset[str] | None
    zone: tzinfo = UTC


class Service:
    """Owns monitors, channels, the scheduler and the store for one `serve` run."""

    def __init__(
        self,
        config: ServiceConfig,
        channels: Mapping[str, BuiltChannel],
        store: StateStore,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._config = config
        self._channels: dict[str, Channel] = {n: b.channel for n, b in channels.items()}
        self._store = store
        self._clock = clock
        self._scheduler = RouteScheduler(
            self._channels, store, max_pause_s=config.limits.max_pause_s
        )
        # Every outgoing text loses the exact values of the configured secrets, not only logs.
        self._redact = Redactor(secret for b in channels.values() for secret in b.secrets)
        self._routes: list[Route] = []
        self._routes_by_agent: dict[str, list[Route]] = {a.id: [] for a in config.agents}
        for name, built in channels.items():
            for spec in built.routes:
                for agent_id in spec.agents:
                    route = Route(
                        RouteKey(name, spec.chat, agent_id),
                        spec.pin,
                        spec.allowed_user_ids,
                        route_zone(spec.timezone),
                    )
                    self._routes.append(route)
                    self._routes_by_agent.setdefault(agent_id, []).append(route)
        self._monitors = {
            agent.id: AgentMonitor(
                agent.id,
                agent.workdir,
                store,
                clock=clock,
                no_output_after_s=config.display.no_output_after_s,
            )
            for agent in config.agents
        }
        self._ledgers = LedgerView()
        self._notice_gate = NoticeGate(config.notices.max_per_minute)
        for route in self._routes:
            saved = FoldedNotices.from_json(store.get_cursor(_folded_cursor(route.key)))
            if saved is not None:
                self._notice_gate.restore(str(route.key), saved)  # a summary still owed
        self._prefs: dict[str, ChatPrefs] = {}
        self._due: dict[str, datetime] = {}
        self._ready_channels: set[str] = set()
        self._failed_channels: set[str] = set()
        # Per agent: the stage that failed ("reading its files", ...) -> what failed.
        self._faults: dict[str, dict[str, str]] = {}
        # What the store holds, so that only changes are written (a restart starts from it).
        self._saved_health = {
            agent_id: store.get_cursor(agent_health_key(agent_id)) or "[]"
            for agent_id in self._monitors
        }
        self._running = False
        self.started = asyncio.Event()  # set once the loop runs (systemd readiness)

    # Lifecycle ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then shut down cleanly.

        Channels start concurrently and independently: one that is unreachable is retried in
        the background while the others (and the watching) carry on. Raises `ServiceFailed`
        when every channel failed for good (a wrong token, say).
        """
        await self._scheduler.start()
        for route in self._routes:
            self._scheduler.add_route(route.key, pin=route.pin)
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
        log.info(
            "serving %d agents on %d routes (%s)",
            len(self._monitors),
            len(self._routes),
            ", ".join(self._channels) or "no channel",
        )
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
            stopper.cancel()
            for task in (*tasks, *starters):
                task.cancel()
            await asyncio.gather(stopper, *tasks, *starters, return_exceptions=True)
            await self._scheduler.stop()
            for channel in reversed(list(self._channels.values())):
                try:
                    await channel.stop()
                except ChannelError as error:
                    log.warning("channel %s did not stop cleanly: %s", channel.name, error)
            log.info("stopped")

    async def _start_channel(self, name: str, channel: Channel) -> None:
        """Start one channel, retrying while it is unreachable; then show what is pending."""
        delay_s = 1.0
        while True:
            try:
                await channel.start(functools.partial(self._on_command, name))
            except (Transient, RateLimited) as error:
                wait_s = delay_s
                if isinstance(error, RateLimited):
                    wait_s = min(error.retry_after_s, self._config.limits.max_pause_s)
                log.warning("channel %s not ready (%s); retrying in %.0fs", name, error, wait_s)
                await asyncio.sleep(wait_s)
                delay_s = min(60.0, delay_s * 2)
                continue
            except ChannelError as error:
                log.error("channel %s disabled: %s", name, error)
                self._failed_channels.add(name)
                return
            except Exception:
                # A busy webhook port, a library bug: this channel is out, the others go on.
                log.exception("channel %s could not start and is disabled", name)
                self._failed_channels.add(name)
                return
            break
        self._ready_channels.add(name)
        log.info("channel %s ready", name)
        self._resend_pending_notices(name)
        for route in self._routes:
            if route.key.channel == name:
                self._project_route(route)

    # Watching ----------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        watcher = FleetWatcher(
            {agent.id: agent.workdir for agent in self._config.agents},
            debounce_ms=self._config.watch.debounce_ms,
            rescan_interval_s=self._config.watch.rescan_interval_s,
        )
        async for agent_ids in watcher.changes():
            for agent_id in agent_ids:
                self._refresh(agent_id)

    async def _timer_loop(self) -> None:
        """Recompose agents whose state changes with the passage of time alone."""
        while True:
            await asyncio.sleep(1.0)
            self._store.retry_pending()  # state writes a failing disk held back, when due
            now = self._clock()
            for agent_id in [a for a, due in self._due.items() if due <= now]:
                del self._due[agent_id]
                self._refresh(agent_id)
            self._send_due_summaries()

    def _refresh(self, agent_id: str) -> None:
        monitor = self._monitors.get(agent_id)
        if monitor is None:
            return
        result: AgentRefresh | None = None
        with self._guard(agent_id, "reading its files"):
            try:
                result = monitor.refresh()
            except BaseException:
                monitor.forget_signatures()  # the next change or rescan reads everything again
                raise
            for notification in result.notifications:
                with self._guard(agent_id, "notifying"):
                    self._notify(agent_id, notification)
            if result.notifications:
                monitor.commit()  # recorded in the store: the offset may move past them
            until = monitor.activity.state_valid_until
            if until is not None:
                self._due[agent_id] = until
            if result.failure is not None:
                raise result.failure
        if result is not None and (result.card_changed or result.activity_changed):
            self._project(agent_id)
        self._save_health(agent_id)

    @contextmanager
    def _guard(self, agent_id: str, stage: str) -> Iterator[None]:
        """The per-agent fault barrier: an exception here stays with this agent.

        Logged with its traceback once per episode (the first failure after a success of the
        same stage), recorded for `taskcard status` by its type only (a message may quote the
        agent's files), and cleared by the next success.
        """
        faults = self._faults.setdefault(agent_id, {})
        try:
            yield
        except Exception as error:
            fault = f"{stage} failed ({type(error).__name__}); retried on the next change"
            if stage not in faults:
                log.exception("agent %s: %s", agent_id, fault)
            faults[stage] = fault
            self._save_health(agent_id)
        else:
            if faults.pop(stage, None) is not None:
                log.info("agent %s: %s works again", agent_id, stage)

    def agent_problems(self, agent_id: str) -> list[str]:
        """What is wrong with one agent now: refused files first, then failed stages."""
        monitor = self._monitors.get(agent_id)
        problems = [
            f"{name}: {reason}"
            for name, reason in sorted(monitor.files.problems.items() if monitor else ())
        ]
        return problems + sorted(self._faults.get(agent_id, {}).values())

    def _save_health(self, agent_id: str) -> None:
        """Persist the agent's problems when they changed, for `taskcard status`."""
        value = json.dumps(self.agent_problems(agent_id))
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
        for route in self._routes_by_agent.get(agent_id, ()):
            self._project_route(route)

    def _project_route(self, route: Route) -> None:
        monitor = self._monitors.get(route.key.agent_id)
        if monitor is None or route.key.channel not in self._ready_channels:
            return
        channel = self._channels[route.key.channel]
        prefs = self._chat_prefs(route.key.chat_scope)
        has_message = self._scheduler.has_message(route.key)
        if monitor.card.status == "none" and not has_message:
            return  # the resident appears with the first card, not before
        if prefs.hidden and not has_message:
            return
        with self._guard(route.key.agent_id, "composing its card"):
            view = compose_view(
                route.key.agent_id,
                monitor.card,
                monitor.activity,
                hidden=prefs.hidden,
                activity_rows=prefs.activity_rows or self._config.display.activity_rows,
                now=self._clock(),
                zone=route.zone,
                ledger_line=ledger_row(self._ledgers.summary(monitor.files)),
            )
            self._scheduler.submit(route.key, self._render_card(channel, view))

    def _render_card(self, channel: Channel, view: CardView) -> Outgoing:
        """`view` rendered for `channel` with every configured secret removed.

        The view's texts are scrubbed before rendering; what the renderer produced is checked
        again, and a body that still spells a secret there is withheld whole.
        """
        scrub = self._redact
        view = replace(
            view,
            auto_rows=tuple(scrub(row) for row in view.auto_rows),
            body=None if view.body is None else scrub(view.body),
            body_note=None if view.body_note is None else scrub(view.body_note),
        )
        outgoing = channel.render_card(view)
        if self._leaks(outgoing) and view.body is not None:
            log.warning("agent %s: card body spelled a configured secret; withheld", view.agent_id)
            view = replace(view, body=WITHHELD_BODY, body_cut=False)
            outgoing = channel.render_card(view)
        if self._leaks(outgoing) and view.auto_rows:
            log.warning("agent %s: activity spelled a configured secret; withheld", view.agent_id)
            outgoing = channel.render_card(replace(view, auto_rows=(WITHHELD_ROWS,)))
        return outgoing

    def _render_text(self, channel: Channel, text: str) -> Outgoing:
        return channel.render_text(self._redact(text))

    def _leaks(self, outgoing: Outgoing) -> bool:
        payload = json.dumps(outgoing.payload, ensure_ascii=False)
        return self._redact.leaks(outgoing.text) or self._redact.leaks(payload)

    # Notices -----------------------------------------------------------------------------

    def _notify(self, agent_id: str, notification: Notification) -> None:
        text = notice_text(agent_id, notification)
        if text is None:
            return
        text = self._redact(text)  # stored scrubbed: the scheduler re-renders stored texts
        now_s = self._clock().timestamp()
        for route in self._routes_by_agent.get(agent_id, ()):
            hidden = self._chat_prefs(route.key.chat_scope).hidden
            disabled = self._scheduler.disabled_reason(route.key) is not None
            state: NoticeState = "suppressed" if hidden or disabled else "pending"
            route_id = str(route.key)
            if state == "pending" and not self._notice_gate.allows(route_id, now_s):
                state = "folded"  # over the route's cap: counted into the owed summary
            if not self._store.add_notice(route_id, notification.id, text, state):
                continue  # already recorded (idempotent): neither sent nor counted again
            if state == "folded":
                folded = self._notice_gate.fold(route_id, notice_kind(notification) or "", now_s)
                self._store.set_cursor(_folded_cursor(route.key), folded.to_json())
            elif state == "pending":
                self._notice_gate.record(route_id, now_s)
                if route.key.channel in self._ready_channels:
                    self._queue_notice(route.key, notification.id, text)

    def _send_due_summaries(self) -> None:
        """One summary notice for each route whose folded notices are due (see NoticeGate)."""
        routes = {str(route.key): route for route in self._routes}
        for route_id, folded in self._notice_gate.due(self._clock().timestamp()):
            route = routes.get(route_id)
            if route is None:
                continue
            text = self._redact(summary_text(route.key.agent_id, folded.counts))
            hidden = self._chat_prefs(route.key.chat_scope).hidden
            disabled = self._scheduler.disabled_reason(route.key) is not None
            state: NoticeState = "suppressed" if hidden or disabled else "pending"
            # Recorded before the episode is cleared: a crash in between finds the same id.
            if (
                self._store.add_notice(route_id, folded.summary_id, text, state)
                and state == "pending"
                and route.key.channel in self._ready_channels
            ):
                self._queue_notice(route.key, folded.summary_id, text)
            self._store.set_cursor(_folded_cursor(route.key), "")

    def _queue_notice(self, key: RouteKey, notice_id: str, text: str) -> None:
        channel = self._channels[key.channel]
        self._scheduler.send_text(
            key.channel, key.chat, self._render_text(channel, text), notice=(str(key), notice_id)
        )

    def _resend_pending_notices(self, channel: str) -> None:
        routes = {str(r.key): r.key for r in self._routes if r.key.channel == channel}
        for pending in self._store.pending_notices():
            key = routes.get(pending.route)
            if key is not None:
                self._queue_notice(key, pending.notice_id, pending.text)

    # Commands ----------------------------------------------------------------------------

    def _routes_in(self, channel: str, chat: ChatRef) -> list[Route]:
        same_chat = [
            r
            for r in self._routes
            if r.key.channel == channel and r.key.chat.chat_id == chat.chat_id
        ]
        exact = [r for r in same_chat if r.key.chat.thread_id == chat.thread_id]
        return exact or [r for r in same_chat if r.key.chat.thread_id is None]

    async def _on_command(self, channel_name: str, command: IncomingCommand) -> None:
        chat = command.chat
        self._store.record_chat(  # routed or not: `taskcard chats` lists it for the operator
            SeenChat(
                channel_name,
                chat.chat_id,
                chat.thread_id,
                command.chat_title,
                self._clock().timestamp(),
            )
        )
        routes = self._routes_in(channel_name, command.chat)
        if not routes:
            log.info("ignoring /taskcard from an unrouted chat %s:%s", channel_name, command.chat)
            return
        allowed = [
            r
            for r in routes
            if r.allowed_user_ids is None or (command.user_id in r.allowed_user_ids)
        ]
        if not allowed:
            log.info("ignoring /taskcard from a user not allowed in %s", routes[0].key.chat_scope)
            return
        for route in allowed:
            self._scheduler.enable(route.key)  # the bot can read this chat: it is back
        scope = allowed[0].key.chat_scope
        reply_chat = allowed[0].key.chat
        args = command.args.strip().lower()
        prefs = self._chat_prefs(scope)
        if args in ("", "status", "state"):
            reply = self._state_text(allowed, prefs)
        elif args == "off":
            prefs = ChatPrefs(hidden=True, activity_rows=prefs.activity_rows)
            self._scheduler.suppress_notices(route.key for route in allowed)
            reply = "Task cards hidden here. /taskcard on shows them again."
        elif args == "on":
            prefs = ChatPrefs(hidden=False, activity_rows=prefs.activity_rows)
            reply = "Task cards shown here."
        elif _ROWS_ARG.match(args) and 1 <= int(args) <= 10:
            prefs = ChatPrefs(hidden=prefs.hidden, activity_rows=int(args))
            reply = f"Task cards here now show {int(args)} activity rows."
        else:
            # Never echoed: the arguments are a chat member's text, and a reply quoting them
            # could carry a platform mention (Feishu `<at user_id="all">`) or markup.
            reply = f"Unknown option. {HELP_TEXT}"
        if prefs != self._chat_prefs(scope):
            self._store.set_prefs(scope, prefs)
            self._prefs[scope] = prefs
            for route in allowed:
                self._project_route(route)
        channel = self._channels[channel_name]
        self._scheduler.send_text(channel_name, reply_chat, self._render_text(channel, reply))

    def _state_text(self, routes: list[Route], prefs: ChatPrefs) -> str:
        rows = prefs.activity_rows or self._config.display.activity_rows
        shown = "hidden" if prefs.hidden else f"shown, {rows} activity rows"
        lines = [f"Task cards here: {shown}."]
        for route in routes:
            monitor = self._monitors.get(route.key.agent_id)
            if monitor is None:
                continue
            card = monitor.card
            card_text = {
                "active": "card active",
                "inactive": "card stopped",
                "none": "no card published",
            }[card.status]
            if card.exhausted:
                card_text += ", refreshes exhausted"
            if card.error_code:
                card_text += f", renderer error ({safe_error_code(card.error_code)})"
            disabled = self._scheduler.disabled_reason(route.key)
            extra = f" — delivery disabled: {disabled}" if disabled else ""
            lines.append(f"• {route.key.agent_id}: {monitor.activity.state}; {card_text}{extra}")
        return "\n".join(lines)

    # Observing ---------------------------------------------------------------------------

    def snapshot(self) -> ServiceSnapshot:
        """The levels metrics and `/healthz` report, read now (on the loop)."""
        now = self._clock().timestamp()
        return ServiceSnapshot(
            running=self._running,
            channels=tuple(self._channels),
            ready_channels=tuple(n for n in self._channels if n in self._ready_channels),
            agents_watched=len(self._monitors),
            agents_faulted=sum(1 for m in self._monitors.values() if m.card.error_code),
            active_pauses=sum(1 for until in self._store.pauses().values() if until > now),
            lane_depths=self._scheduler.lane_depths(),
            notices=self._store.notice_counts(),
        )
