"""`taskcard serve`, `taskcard status` and `taskcard config check`: the operator's commands."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

from taskcard.bridge.config import (
    AGENT_ID_PATTERN,
    ConfigError,
    ServiceConfig,
    load_config,
    root_not_yet,
    roots_not_yet,
    workdir_not_yet,
    workdir_problems,
    workdirs_not_yet,
)
from taskcard.bridge.deliver.registry import (
    chat_moved_to,
    describe_scope,
    optional_secrets_unset,
    route_specs,
    scope_rules,
)
from taskcard.bridge.run import early_stop, stackdump
from taskcard.bridge.run.chat_names import as_last_resolved, username_notes
from taskcard.bridge.run.departures import UNFOLLOWED_REASON
from taskcard.bridge.run.health import agent_health_key, parse_agent_health
from taskcard.bridge.run.logs import choose, chosen_format, setup_logging, start_error
from taskcard.bridge.run.runner import (
    EXIT_CONFIG,
    EXIT_RUNTIME,
    add_log_options,
    nothing_served,
    running_pid,
    serve,
    start_blockers,
)
from taskcard.bridge.run.terminal import printable
from taskcard.bridge.schedule.scheduler import (
    APP_UNAVAILABLE_CURSOR,
    card_refusal_marked,
    card_refused_key,
    parse_app_unavailable,
    parse_card_refused,
)
from taskcard.bridge.store.sqlite import (
    STATE_FILE,
    UNFIT_STATE_ERRORS,
    ResidentRecord,
    SqliteStore,
    StateFileError,
    StateStore,
    check_state_file,
    read_health,
    unfit_state,
)
from taskcard.channels.base import counted, state_id

if TYPE_CHECKING:
    from taskcard.bridge.schedule.scheduler import RouteKey
    from taskcard.channels.base import RouteView

log = logging.getLogger(__name__)

__all__ = ["EXIT_CONFIG", "add_log_options", "running_pid", "serve", "setup_logging"]


# The longest path the system opens (Linux's PATH_MAX): a config path past it is cut.
_PATH_MAX: Final = 4096


def shown_config(path: object) -> str:
    """The configuration's path as the operator's terminal shows it: controls escaped (a
    path with a line break split the error in two, an escape acted on the terminal) and,
    past any length the system opens, cut with its length said (a 5,000-character path
    came back whole, twice)."""
    text = str(path)
    if len(text) > _PATH_MAX:
        text = f"{text[:120]}... ({len(text)} characters)"
    return printable(text)


def _load(path: Path, *, preflight: bool = False) -> ServiceConfig | None:
    """The configuration at `path`, or None when it is refused (said on stderr or logged).
    `preflight` (`config check`, `serve --check`) refuses an agent's workdir that cannot be
    one, which `serve`, a reload and `status` take as that agent's problem alone."""
    try:
        return load_config(path, preflight=preflight)
    except ConfigError as error:
        shown = shown_config(path)
        messages = [printable(m.replace(str(path), shown)) for m in error.messages]
        if chosen_format() == "json":  # one record per problem, as every other log line
            for message in messages:
                start_error(f"invalid configuration {shown}: {message}")
            return None
        print(f"taskcard: invalid configuration {shown}:", file=sys.stderr)
        for message in messages:
            print(f"  - {message}", file=sys.stderr)
        return None


def _apply_log_options(args: argparse.Namespace) -> None:
    choose(getattr(args, "log_level", None), getattr(args, "log_format", None))


def _serve(args: argparse.Namespace) -> int:
    _apply_log_options(args)
    if args.config is None:
        if args.check:
            no_config_given(args, "--check", "--config FILE")
        from taskcard.bridge.run.demo import run_demo

        return run_demo(None, None)
    config = _load(Path(args.config), preflight=args.check)
    if config is None:
        return EXIT_CONFIG
    if args.check:
        try:
            if not config.cluster.enabled:  # clustered, the state is in Redis
                check_state_file(config.state_dir / STATE_FILE)
        except StateFileError as error:
            print(f"taskcard: {error}", file=sys.stderr)
            return EXIT_CONFIG
        return _check_secrets(args.config, config)
    setup_logging(config.log_level)
    for warning in nothing_served(config):
        log.warning("%s", warning)
    # SIGUSR1: where is it? (a stop that takes too long); JSON logs get JSON lines
    stackdump.install(as_records=chosen_format() == "json")
    early_stop.hold()  # the lock and the store are taken next: a stop waits for its step
    try:
        return asyncio.run(serve(config, os.environ, config_path=Path(args.config)))
    except Exception as error:
        log.exception("the service stopped on an error: %s", error)
        return EXIT_RUNTIME
    finally:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the loop's close restored the default


def _check_secrets(path: str, config: ServiceConfig) -> int:
    """`serve --check`'s last step: the secret variables the configuration names, read from
    this environment as `serve` reads them (the same checks, the same lines, never a value).
    A required one unset or empty (a channel that could not start, a cluster without its
    Redis URL) is exit 2; an optional one unset is a warning."""
    problems = start_blockers(config, os.environ)
    # As `config check` says it; the summary's "valid" only when `serve` would start here.
    _say_checked(path, config, summary=not problems)
    for note in optional_secrets_unset(config, os.environ):
        print(f"warning: {note}", file=sys.stderr)
    if problems:
        print(
            f"taskcard: {shown_config(path)} is valid, but `taskcard serve` would not start in"
            " this environment:",
            file=sys.stderr,
        )
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _config_check(args: argparse.Namespace) -> int:
    if args.file is None:
        no_config_given(args, "FILE", "FILE")
    config = _load(Path(args.file), preflight=True)
    if config is None:
        return EXIT_CONFIG
    _say_checked(args.file, config)
    return 0


def _say_checked(path: str, config: ServiceConfig, *, summary: bool = True) -> None:
    """What `config check` and `serve --check` both print of a valid file, in one shape: the
    summary and the notes on stdout, the warnings on stderr. `serve --check` printed a bare
    "valid", its notes on stderr, and the path unescaped; `config check` the counts. Without
    `summary` (`serve --check` in an environment `serve` would not start in) no "valid"."""
    specs = route_specs(config)
    channels = sorted({spec.channel for spec in specs})
    if summary:
        print(
            f"{shown_config(path)}: valid; {counted(len(config.agents), 'agent', 'agents')},"
            f" {counted(len(specs), 'route', 'routes')}"
            + (f" ({', '.join(channels)})" if channels else "")
        )
    for note in _check_notes(config):
        print(f"note: {note}")
    for warning in nothing_served(config):
        print(f"warning: {warning}", file=sys.stderr)


def _check_notes(config: ServiceConfig) -> list[str]:
    """What `config check` and `serve --check` both say as information (`note: ...`): routes
    named by @username (resolved at the start), and configured agents whose workdir (and
    discovery roots that) do not exist yet (served all the same, picked up once made; a slip
    in the path shows here)."""
    return (
        username_notes(config)
        + [workdir_not_yet(agent.id, agent.workdir) for agent in workdirs_not_yet(config)]
        + [root_not_yet(index, root) for index, root in roots_not_yet(config)]
    )


# How `status` and `chats` show a time the state holds but no date can show (text, `1e308`):
# the store's warning on stderr names the row and the value.
UNREADABLE: Final = "(unreadable; see the warning above)"


def _when(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def status_report(config: ServiceConfig) -> dict[str, Any]:
    """Every route `serve` would run (configured ones, those opened by turn origins) with what
    the store knows about it, and every agent (configured or discovered); read-only."""
    from taskcard.bridge.run.boards import BOARD_AGENT

    path = config.state_dir / STATE_FILE
    store: StateStore | None = None
    if config.cluster.enabled:
        from taskcard.bridge.run.cluster_serve import status_store

        store = status_store(config, os.environ)  # the state is in the shared Redis
    elif path.exists():
        store = SqliteStore(path, readonly=True)
    try:
        # A route named by @username is shown under the id the service last resolved it to.
        config = as_last_resolved(config, store)
        routes: list[dict[str, Any]] = []
        pauses = store.pauses() if store else {}
        now = datetime.now(UTC).timestamp()
        # The service caps a stored pause when it starts; show what it will honour.
        ceiling = now + config.limits.max_pause_s
        active_pauses = {
            scope: min(until, ceiling) for scope, until in pauses.items() if until > now
        }
        # The apps the platform refuses as a whole (the cause and the fix), by their scope.
        unavailable = parse_app_unavailable(
            store.get_cursor(APP_UNAVAILABLE_CURSOR) if store else None
        )
        health = read_health(config.state_dir)
        pending = store.pending_notices() if store else []
        unsure = store.unsure_notices() if store else []
        fleet = _fleet(config, store)
        cluster_routed = _cluster_routed(config, store)
        # Whether the config already names the chat's new id (then nothing is left to edit).
        configured_chats = {str(spec.chat.chat_id) for spec in route_specs(config)}
        for route_key, opened_by in [*fleet.routes, *_unrouted_boards(config, store, fleet)]:
            channel, chat, agent_id = route_key.channel, route_key.chat, route_key.agent_id
            key = str(route_key)
            record = store.resident(key) if store else None
            rules = scope_rules(channel)
            message_id = record.message_id if record else None
            route_pauses = {
                scope: _when(until)
                for scope, until in active_pauses.items()
                if rules is not None and rules.covers(scope, chat, message_id)
            }
            moved = chat_moved_to(channel, store, chat.chat_id) if store else None
            view = _chat_view(fleet, store, route_key)
            orchestrator, choice_set_aside = _chat_orchestrator(
                fleet, store, route_key, cluster_routed
            )
            # A board is retired when its chat shows cards; a card, followed on the board
            # (let go until its agent needs people), when its chat shows the board.
            if agent_id == BOARD_AGENT:
                retired = view == "cards"
            else:
                retired = view == "board" and message_id is None
            kept = store.get_cursor(card_refused_key(key)) if store else None
            refused = parse_card_refused(kept, key)
            routes.append(
                {
                    "route": key,
                    "channel": channel,
                    "chat": str(chat),
                    "agent": agent_id,
                    "opened_by": opened_by,
                    # False for the board of a chat no route follows now, kept in the state
                    # (`_unrouted_boards`): routed there again, the same board comes back.
                    "routed": opened_by is not None,
                    "message_id": record.message_id if record else None,
                    "chat_view": view,
                    # The agent the chat's other agents' signals wake (null: none), and
                    # whether it is this route's agent.
                    "chat_orchestrator": orchestrator,
                    "orchestrator": orchestrator is not None and orchestrator == agent_id,
                    # The agent the chat chose as its orchestrator that it no longer follows,
                    # a choice set aside meanwhile (null: none).
                    "orchestrator_choice_set_aside": choice_set_aside,
                    "retired": retired,
                    "last_committed": _when(record.committed_at) if record else None,
                    # The fields above that are null because the state's value could not be
                    # read (a warning names it), not because there is none.
                    "unreadable": (
                        ["last_committed"] if record and "committed_at" in record.unreadable else []
                    ),
                    "disabled": record.disabled_reason if record else None,
                    # The platform refused the route's latest card for good: the chat shows
                    # the one before, until a later card goes through.
                    # `chat_told`: the chat shows the short card saying so (once per run of
                    # refusals) rather than the last card that went through.
                    "card_refused": (
                        {
                            "reason": refused[0],
                            "since": _when(refused[1]),
                            "chat_told": card_refusal_marked(kept),
                        }
                        if refused
                        else None
                    ),
                    "unanswered_sends": record.unsure_sends if record else 0,
                    "sends_held_until": _send_hold(config, channel, record, now),
                    "paused_until": route_pauses,
                    # Held with every route of its app: the platform refuses the app itself
                    # (the cause and the fix; null: not so).
                    "app_unavailable": next(
                        (
                            reason
                            for scope, (reason, _) in sorted(unavailable.items())
                            if rules is not None and rules.covers(scope, chat, message_id)
                        ),
                        None,
                    ),
                    "pending_notices": [p.notice_id for p in pending if p.route == key],
                    # Sent without an answer (or cut short by a stop) on a platform that
                    # cannot deduplicate sends: maybe in the chat, never sent again.
                    "unsure_notices": [
                        {"id": u.notice_id, "since": _when(u.since), "text": u.text}
                        for u in unsure
                        if u.route == key
                    ],
                    "moved_to": moved,
                    "config_names_new_chat": moved is not None and moved in configured_chats,
                }
            )
        running, pid = running_pid(config.state_dir)
        not_yet = {agent.id for agent in workdirs_not_yet(config)}
        unusable = workdir_problems(config)
        agents = [
            {
                "agent": agent_id,
                "workdir": str(workdir),
                # A configured workdir not made yet (served, picked up once it is).
                "workdir_exists": agent_id not in not_yet,
                # A configured workdir that cannot be one now (a file, a loop of links):
                # the line saying so, or null. Served, its files read once it is a folder.
                "workdir_problem": unusable.get(agent_id) if found_by == "config" else None,
                "found_by": found_by,
                **_agent_now(
                    config,
                    agent_id,
                    workdir,
                    agent_id not in not_yet and (found_by != "config" or agent_id not in unusable),
                ),
                "problems": parse_agent_health(
                    store.get_cursor(agent_health_key(agent_id)) if store else None
                ),
            }
            for agent_id, (workdir, found_by) in fleet.agents.items()
        ]
        return {
            # Clustered, the state is in Redis and no SQLite file is read: `state_file` is
            # null then, and `state` names the store either way.
            "state_file": None if config.cluster.enabled else str(path),
            "state": (
                {"store": "redis", "key_prefix": config.cluster.key_prefix}
                if config.cluster.enabled
                else {"store": "sqlite", "file": str(path)}
            ),
            "service": {"running": running, "pid": pid},
            "state_writes": (
                {
                    "failing_since": _when(health.failing_since),
                    "reason": health.reason,
                    "waiting_writes": health.waiting_writes,
                }
                if health is not None
                else None
            ),
            "pauses": [
                {"scope": scope, "what": describe_scope(scope), "until": _when(until)}
                for scope, until in sorted(active_pauses.items())
            ],
            # Apps the platform refuses as a whole for now, until a request goes through.
            "apps_unavailable": [
                {
                    "scope": scope,
                    "what": describe_scope(scope),
                    "reason": reason,
                    "since": _when(since),
                }
                for scope, (reason, since) in sorted(unavailable.items())
            ],
            "routes": routes,
            "agents": agents,
        }
    finally:
        if store:
            store.close()


def _agent_now(config: ServiceConfig, agent_id: str, workdir: Path, exists: bool) -> dict[str, Any]:
    """The agent's state and latest report, read from its files as the service reads them
    when it starts (the reports-and-signals spec: query the state, then read the report),
    so a script gets them without a chat and whether the service runs or not."""
    from taskcard.bridge.track.monitor import AgentMonitor, MemoryOffsetStore
    from taskcard.bridge.track.reports import AgentSide

    if not exists:
        return {"state": None, "latest_report": None}
    now = datetime.now(UTC)
    offsets = MemoryOffsetStore()  # read-only: nothing of the service's is moved
    monitor = AgentMonitor(
        agent_id,
        workdir,
        offsets,
        clock=lambda: now,
        no_output_after_s=config.display.no_output_after_s,
        start_silence_s=config.signals.no_output_after_start_s,
    )
    monitor.refresh()
    side = AgentSide(agent_id, workdir, monitor.files, offsets, clock=lambda: now)
    side.refresh()
    report = side.latest_report
    return {
        "state": state_id(monitor.activity.state),  # an identifier, as the spec's table
        "latest_report": None
        if report is None
        else {
            "seq": report.seq,
            "at": _when(report.at.timestamp()),
            "ok": report.ok,
            "verdict": report.verdict,
            "role": report.role,
        },
    }


@dataclass(frozen=True)
class _StatusFleet:
    """What `serve` would serve now: each route with what opened it ("config" or "origin"),
    each agent with its workdir and how it was found ("config" or "discovered")."""

    routes: list[tuple[RouteKey, str]]
    agents: dict[str, tuple[Path, str]]
    # Each chat's view as its routes set it (a `/taskcard board|cards` stored overrides it).
    views: dict[str, RouteView]
    # Each chat's orchestrator as its route sets it (a `/taskcard orchestrator` stored
    # overrides it), and the agents it follows (only one of them is its orchestrator).
    orchestrators: dict[str, str | None]
    followed: dict[str, set[str]]


def _fleet(config: ServiceConfig, store: StateStore | None) -> _StatusFleet:
    """The configured routes (also of agents named but not found yet), the routes origins
    opened (from the store) and the agents under `[discover] roots`, as `serve` builds them."""
    from taskcard.bridge.run.boards import board_key
    from taskcard.bridge.run.fleet import (
        desired_fleet,
        discover_agents,
        keyed_origin_chats,
        origin_listed,
    )
    from taskcard.bridge.run.origins import OriginBook
    from taskcard.bridge.schedule.routes import chat_scope
    from taskcard.bridge.schedule.scheduler import RouteKey

    specs = route_specs(config, store)
    discovered = discover_agents(config.discover.roots, config.agent_ids()).agents
    # An open origin route of a chat `origin_chats` no longer lists closes at the next start.
    listed = keyed_origin_chats(config, store)
    origins = OriginBook(store).open_routes() if store is not None else []
    origins = [key for key in origins if origin_listed(key, listed)]
    fleet = desired_fleet(config, specs, discovered, origins)
    routes: dict[RouteKey, str] = {}
    views: dict[str, RouteView] = {}
    orchestrators: dict[str, str | None] = {}
    followed: dict[str, set[str]] = {}
    for route in fleet.routes:  # the service takes the view of a chat's first route
        views.setdefault(route.key.chat_scope, route.view)
        followed.setdefault(route.key.chat_scope, set()).add(route.key.agent_id)
        if route.orchestrator is not None:
            orchestrators.setdefault(route.key.chat_scope, route.orchestrator)
    for spec in specs:  # configured first, in the file's order, found or not
        views.setdefault(chat_scope(spec.channel, spec.chat), spec.view)
        names = list(fleet.agents) if spec.all_agents else list(spec.agents)
        for agent_id in names:
            routes.setdefault(RouteKey(spec.channel, spec.chat, agent_id), "config")
    for route in fleet.routes:
        routes.setdefault(route.key, "origin" if route.origin else "config")
    # A chat's board is a resident message too (see `bridge.run.boards`): shown once it has one.
    for key, opened_by in list(routes.items()):
        board = board_key(key)
        if board not in routes and store is not None and store.resident(str(board)) is not None:
            routes[board] = opened_by
    configured = set(config.agent_ids())
    agents = {
        agent_id: (workdir, "config" if agent_id in configured else "discovered")
        for agent_id, workdir in fleet.agents.items()
    }
    return _StatusFleet(list(routes.items()), agents, views, orchestrators, followed)


def _unrouted_boards(
    config: ServiceConfig, store: StateStore | None, fleet: _StatusFleet
) -> list[tuple[RouteKey, None]]:
    """The boards in the state of chats that lost their last route (the configuration names
    the chat no more, and no turn origin routes it): the service edits such a board a last
    time to say the chat follows no agent now and keeps its message, which a route there
    again brings back to life. Not clustered: another instance's configuration may still
    route the chat, as the service itself holds."""
    from taskcard.bridge.run.boards import BOARD_AGENT
    from taskcard.bridge.schedule.routes import chat_scope, route_of_store_key

    if store is None or config.cluster.enabled:
        return []
    routed = {key.chat_scope for key, _ in fleet.routes}
    routed |= {chat_scope(spec.channel, spec.chat) for spec in route_specs(config, store)}
    boards: list[tuple[RouteKey, None]] = []
    for record in store.residents():
        key = route_of_store_key(record.route)
        if key is None or key.agent_id != BOARD_AGENT or record.message_id is None:
            continue
        if key.chat_scope not in routed:
            boards.append((key, None))
    return sorted(boards, key=lambda board: board[0].store_key)


def _chat_view(fleet: _StatusFleet, store: StateStore | None, key: RouteKey) -> RouteView:
    """What the chat of `key` shows, as the service decides it (`boards.ChatViews`)."""
    from taskcard.bridge.run.boards import parse_view, view_cursor

    scope = key.chat_scope
    stored = parse_view(store.get_cursor(view_cursor(scope))) if store is not None else None
    return stored or fleet.views.get(scope, "cards")


def _cluster_routed(config: ServiceConfig, store: StateStore | None) -> list[Mapping[str, Any]]:
    """Clustered: the live instances' routed records (what each routes, and its routes'
    `orchestrator` settings), so the chat's orchestrator is the cluster's, as its answers
    give it; empty otherwise, or when Redis does not answer (this config's routes alone)."""
    if not config.cluster.enabled or store is None:
        return []
    from redis.exceptions import RedisError

    from taskcard.bridge.cluster.runtime import live_routed_records
    from taskcard.bridge.store.redis import RedisStore

    if not isinstance(store, RedisStore):
        return []
    try:
        return live_routed_records(store)
    except RedisError:
        return []


def _chat_orchestrator(
    fleet: _StatusFleet,
    store: StateStore | None,
    key: RouteKey,
    cluster_routed: list[Mapping[str, Any]],
) -> tuple[str | None, str | None]:
    """The orchestrator of the chat of `key`, as the service decides it
    (`orchestrators.chat_orchestrator`; clustered, as the service answering in the chat
    does: every live instance's routes count), and the agent the chat chose that it no
    longer follows (`orchestrators.unfollowed_choice`), if any."""
    from taskcard.bridge.run.orchestrators import (
        chat_orchestrator,
        orchestrator_cursor,
        parse_choice,
        unfollowed_choice,
    )

    scope = key.chat_scope
    choice = parse_choice(store.get_cursor(orchestrator_cursor(scope))) if store else None
    configured = fleet.orchestrators.get(scope)
    followed = fleet.followed.get(scope, set())
    if cluster_routed:
        from taskcard.bridge.cluster.runtime import routed_in_chat

        names, marks = routed_in_chat(cluster_routed, key.channel, key.chat)
        # Ids as the config takes them only, this config's setting first (as `_chat_marks`).
        followed = followed | set(filter(AGENT_ID_PATTERN.fullmatch, names))
        configured = configured or next(filter(AGENT_ID_PATTERN.fullmatch, marks), None)
    gone = unfollowed_choice(choice, followed)
    shown = gone if gone is not None and AGENT_ID_PATTERN.fullmatch(gone) else None
    return chat_orchestrator(choice, configured, followed), shown


def _send_hold(
    config: ServiceConfig, channel: str, record: ResidentRecord | None, now: float
) -> str | None:
    """When a route whose sends got no answer may send again, if it is holding now."""
    from taskcard.bridge.schedule.scheduler import unsure_send_wait_s

    telegram = config.telegram if channel == "telegram" else None
    hold_s = telegram.ambiguous_send_hold_s if telegram else None
    if record is None or record.unsure_at is None:
        return None
    wait_s = unsure_send_wait_s(record.unsure_sends, record.unsure_at, now, hold_s)
    return _when(now + wait_s) if wait_s > 0 else None


def _report_said(agent: dict[str, Any]) -> str:
    """`; latest report #2 (at): ok, verdict approved, as reviewer.`, or no report."""
    report = agent["latest_report"]
    if report is None:
        return "; no report"
    said = ["ok" if report["ok"] else "failed"]
    if report["verdict"] is not None:
        said.append(f"verdict {report['verdict']}")
    if report["role"] is not None:
        said.append(f"as {report['role']}")
    return f"; latest report #{report['seq']} ({report['at']}): {', '.join(said)}."


def _status(args: argparse.Namespace) -> int:
    from taskcard.bridge.run.boards import BOARD_AGENT

    if args.config is None:
        no_config_given(args, "--config", "--config FILE")
    config = _load(Path(args.config))
    if config is None:
        return EXIT_CONFIG
    try:
        if not config.cluster.enabled:  # clustered, the SQLite file is not used
            check_state_file(config.state_dir / STATE_FILE)
        report = status_report(config)
    except StateFileError as error:
        print(f"taskcard: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as error:
        if not config.cluster.enabled:
            if not isinstance(error, UNFIT_STATE_ERRORS):
                raise
            print(f"taskcard: {unfit_state(config.state_dir / STATE_FILE, error)}", file=sys.stderr)
            return EXIT_CONFIG
        from taskcard.bridge.run.cluster_serve import say_read_failure

        say_read_failure(error)  # raises what it cannot say in one line
        return EXIT_CONFIG
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if config.cluster.enabled:
        print(f"state: the cluster's Redis (key prefix {config.cluster.key_prefix})")
    else:
        print(f"state: {report['state_file']}")
    service = report["service"]
    pid = "unknown" if service["pid"] is None else service["pid"]
    print(f"service: running (pid {pid})" if service["running"] else "service: not running")
    writes = report["state_writes"]
    if writes:
        print(
            f"STATE WRITES FAILING since {writes['failing_since']}: {writes['reason']}"
            f" ({counted(writes['waiting_writes'], 'write', 'writes')} waiting;"
            " the service retries)"
        )
    for pause in report["pauses"]:
        print(f"rate-limit pause: {pause['scope']} ({pause['what']}) until {pause['until']}")
    for app in report["apps_unavailable"]:
        print(
            printable(
                f"APP UNAVAILABLE since {app['since'] or 'an unknown time'}: {app['reason']};"
                f" {app['what']} held, tried again until it works"
            )
        )
    aside_said: set[tuple[str, str]] = set()
    for route in report["routes"]:
        opened = " (opened by a turn origin)" if route["opened_by"] == "origin" else ""
        board = route["agent"] == BOARD_AGENT
        print(f"{route['route']}{opened}")
        print(f"  resident message: {_resident_shown(route, board)}")
        if route["orchestrator"]:
            print("  the chat's orchestrator: the other agents' reports and signals wake it")
        elif board and route["chat_orchestrator"]:
            print(f"  the chat's orchestrator: {route['chat_orchestrator']}")
        aside = route["orchestrator_choice_set_aside"]
        # Said once per chat: under its orchestrator's route, else under its first route.
        where = (route["channel"], route["chat"])
        if (
            aside
            and (route["orchestrator"] or not route["chat_orchestrator"])
            and where not in aside_said
        ):
            aside_said.add(where)
            print(
                f"  the chat chose {aside} as its orchestrator, which it no longer follows:"
                " that choice is set aside until it does"
                + (
                    ", the route's orchestrator setting applying"
                    if route["chat_orchestrator"]
                    else " (no orchestrator meanwhile)"
                )
            )
        never = UNREADABLE if "last_committed" in route["unreadable"] else "(never)"
        print(f"  last committed edit: {route['last_committed'] or never}")
        if route["moved_to"]:
            new = route["moved_to"]
            print(
                f"  group upgraded to supergroup {printable(new)}: cards and commands go there"
                + ("" if route["config_names_new_chat"] else f"; set chat_id = {printable(new)}")
            )
        # An unrouted board's last edit is said on its resident line.
        said = not route["routed"] and route["disabled"] == UNFOLLOWED_REASON
        if route["disabled"] and not said:
            print(f"  DISABLED: {printable(route['disabled'])}")
        if route["card_refused"]:
            refused = route["card_refused"]
            whose = "board" if board else f"agent {route['agent']}"
            what = "board" if board else "card"
            if not route["message_id"]:
                shows = f"no {what} of the route was shown yet"
            elif refused.get("chat_told"):
                shows = (
                    f"the chat shows a short {what} saying that the latest could not be shown,"
                    f" until a later {what} goes through"
                )
            else:
                shows = f"the chat shows the last {what} that went through"
            print(
                printable(
                    f"  CARD REFUSED ({whose}) since {refused['since'] or 'an unknown time'}:"
                    f" {refused['reason']};"
                    f" {shows}"
                )
            )
        if route["unanswered_sends"]:
            print(
                f"  sends without an answer: {route['unanswered_sends']}"
                " (each may have left a copy in the chat)"
            )
        if route["sends_held_until"]:
            print(f"  sends held until {route['sends_held_until']}")
        for scope, until in route["paused_until"].items():
            print(f"  paused: {scope} until {until}")
        if route["app_unavailable"]:
            print("  held: the platform refuses the app itself (see APP UNAVAILABLE above)")
        notices = route["pending_notices"]
        print(
            f"  pending notices: {len(notices)}"
            # A notice's id is the agent's own idempotency key: any string.
            + (f" ({printable(', '.join(notices))})" if notices else "")
        )
        _print_unsure(route["unsure_notices"])
    for agent in report["agents"]:
        if agent["state"] is not None:
            state = agent["state"].replace("-", " ")  # as people read it, as on cards
            print(printable(f"agent {agent['agent']}: {state}{_report_said(agent)}"))
        if agent["found_by"] == "discovered":
            print(printable(f"agent {agent['agent']}: discovered at {agent['workdir']}"))
        if not agent["workdir_exists"]:
            print(printable(workdir_not_yet(agent["agent"], agent["workdir"])))
        if agent["workdir_problem"]:
            print(printable(agent["workdir_problem"]))
        if agent["problems"]:
            print(printable(f"agent {agent['agent']}: PROBLEMS"))
            for problem in agent["problems"]:
                print(f"  - {printable(problem)}")
    return 0


# The unsure notices `status` prints of a route, the latest (JSON lists them all).
UNSURE_SHOWN = 10
UNSURE_TEXT_CHARS = 80


def _print_unsure(unsure: list[dict[str, Any]]) -> None:
    """A route's unsure notices: each may be in the chat or missing from it."""
    if not unsure:
        return
    print(
        f"  unsure notices: {len(unsure)} (each was being sent when no answer came or the"
        " service stopped: it may be in the chat or missing from it, and is never sent"
        " again, so that the chat never shows it twice)"
    )
    if len(unsure) > UNSURE_SHOWN:
        print(f"    ({len(unsure) - UNSURE_SHOWN} older ones not listed; --json lists them all)")
    for notice in unsure[-UNSURE_SHOWN:]:
        text = " ".join(notice["text"].split())
        if len(text) > UNSURE_TEXT_CHARS:
            text = text[: UNSURE_TEXT_CHARS - 1] + "…"
        since = notice["since"] or "an unknown time"
        print(printable(f"    - {notice['id']} since {since}: {text}"))


def _resident_shown(route: dict[str, Any], board: bool) -> str:
    """The route's message as `status` shows it: a retired board read "(none yet)", as if
    its first message were on its way (and a card followed on the board the same)."""
    if board and not route["routed"]:
        told = route["disabled"] == UNFOLLOWED_REASON
        if told:
            said = "it says the chat follows no agent now"
        elif route["disabled"]:
            # The service edits no board whose route is disabled (the chat removed the bot,
            # say): it stays as it is, for the reason on the DISABLED line.
            said = "the service leaves it as it is, for its route is disabled (below)"
        else:
            said = (
                "the service edits it to say the chat follows no agent now (unless the chat"
                " hid its cards)"
            )
        return (
            f"{route['message_id']}, the board of a chat no route follows now; {said}; a route"
            " to the chat again (configured, then a reload) brings the same board back, and"
            " deleting the message in the chat clears it there"
        )
    if board and route["retired"]:
        left = f"message {route['message_id']} is its last word" if route["message_id"] else ""
        return (
            "none, the board is retired: the chat shows one card per agent (/taskcard board"
            f" there brings it back){'; ' + left if left else ''}"
        )
    if route["retired"]:
        return "none, followed on the chat's board (the agent gets a card when it needs people)"
    return str(route["message_id"] or "(none yet)")


def _config_option(parser: argparse.ArgumentParser) -> None:
    """`--config FILE`, by default `TASKCARD_CONFIG`; a command that needs one and got
    neither says so with `no_config_given` (argparse's "required" would name the option
    alone)."""
    parser.add_argument(
        "--config",
        "-c",
        type=config_path,
        default=config_from_environment(),
        # Said, not shown: argparse's "(default: %(default)s)" printed the variable's value
        # raw, spaces, line breaks and escape sequences and all, into every help page.
        help="the TOML configuration (default: the file TASKCARD_CONFIG names, when set)",
    )


def config_from_environment() -> str | None:
    """`TASKCARD_CONFIG` without the line breaks it may end in (an env file's value, or one
    written with `echo`): no file name is meant to end in one, and the file was refused as
    "no such file" under a name with a line break in it. Spaces are kept: a path may hold
    them."""
    value = os.environ.get("TASKCARD_CONFIG", "").rstrip("\r\n")
    return ConfigFromEnvironment(value) if value else None


class ConfigFromEnvironment(str):
    """A configuration file's name taken from `TASKCARD_CONFIG` (the default argparse hands
    to `config_path`), so a refusal of it names the variable rather than the argument."""


def config_path(text: str) -> str:
    """An argparse `type=` for a configuration file's name: an empty one is a usage error
    naming the argument. It was read as `.`, the current folder, and refused as "is a
    folder; give the path of the TOML file in it", about a folder nobody named. A
    `TASKCARD_CONFIG` of white space only is named as the variable: "is empty" about an
    argument the user never typed sent them looking at the command line."""
    if not text.strip():
        if isinstance(text, ConfigFromEnvironment):
            raise argparse.ArgumentTypeError(
                "its default, TASKCARD_CONFIG, is blank; set TASKCARD_CONFIG to the path of"
                " the TOML configuration file, or unset it"
            )
        raise argparse.ArgumentTypeError("is empty; give the path of the TOML configuration file")
    return text


def no_config_given(args: argparse.Namespace, argument: str, way: str) -> NoReturn:
    """The one usage error of every command that needs a configuration file and was given
    none (`serve --check`, `status`, `chats`, `config check`): it names both ways to give
    one, `way` (the command's own argument) and the variable."""
    parser: argparse.ArgumentParser = args._parser  # the command's own (see bridge.cli)
    parser.error(f"{argument}: no configuration file given; pass {way} or set TASKCARD_CONFIG")


def register(subparsers: Any) -> None:
    serve_parser = subparsers.add_parser(
        "serve",
        help="run the projection service",
        description=(
            "Run the projection service. Without --config (or TASKCARD_CONFIG) it runs on the "
            "embedded defaults: a small demo fleet projected to this terminal (the same as "
            "`taskcard demo`)."
        ),
    )
    _config_option(serve_parser)
    serve_parser.add_argument(
        "--check",
        action="store_true",
        help=(
            "validate the configuration, the state file and the secret variables it names"
            " in this environment, then exit (2: invalid, or a required variable unset)"
        ),
    )
    add_log_options(
        serve_parser, level_default="the config's log_level; the demo's without --config"
    )
    serve_parser.set_defaults(handler=_serve)

    status_parser = subparsers.add_parser(
        "status",
        help="print each route's resident message, last edit, pauses and pending notices",
    )
    _config_option(status_parser)
    status_parser.add_argument("--json", action="store_true", help="machine-readable output")
    status_parser.set_defaults(handler=_status)

    config_parser = subparsers.add_parser("config", help="work with configuration files")
    config_actions = config_parser.add_subparsers(dest="config_action", metavar="ACTION")
    check = config_actions.add_parser(
        "check",
        help="validate a configuration file without starting anything",
        description=(
            "Validate FILE: exit 0 when it can be served (with warnings for a configuration "
            "that shows nothing), 2 with one line per problem otherwise."
        ),
    )
    check.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        type=config_path,
        default=config_from_environment(),
        help="the TOML configuration (default: $TASKCARD_CONFIG)",
    )
    check.set_defaults(handler=_config_check)
    config_parser.set_defaults(handler=_group_help(config_parser))


def _group_help(parser: argparse.ArgumentParser) -> Any:
    def show(args: argparse.Namespace) -> int:
        del args
        parser.print_help()
        return EXIT_CONFIG

    return show
