"""`taskcard serve`, `taskcard status` and `taskcard demo`: the operator's commands."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bridge.config import ConfigError, ServiceConfig, load_config
from bridge.deliver.registry import SecretMissing, build_channels, route_specs
from bridge.observe.listener import MetricsListener
from bridge.observe.metrics import MeteredChannel, ServiceMetrics
from bridge.observe.sdnotify import READY, STOPPING, sd_notify
from bridge.run.logs import LOG_FORMATS, LOG_LEVELS, choose, setup_logging
from bridge.run.service import Service, ServiceFailed, agent_health_key, parse_agent_health
from bridge.store.sqlite import (
    STATE_FILE,
    ResidentRecord,
    SqliteStore,
    StateFileError,
    StateStore,
    check_state_file,
    read_health,
)

EXIT_CONFIG = 2
EXIT_RUNTIME = 1
EXIT_ALREADY_RUNNING = 3

log = logging.getLogger(__name__)

__all__ = ["serve", "setup_logging"]


def _load(path: Path) -> ServiceConfig | None:
    try:
        return load_config(path)
    except ConfigError as error:
        print(f"taskcard: invalid configuration {path}:", file=sys.stderr)
        for message in error.messages:
            print(f"  - {message}", file=sys.stderr)
        return None


async def serve(
    config: ServiceConfig, env: Mapping[str, str], *, stop: asyncio.Event | None = None
) -> int:
    """Run the service until SIGTERM/SIGINT (or `stop`); returns the exit code."""
    lock = _ServeLock(config.state_dir)
    try:
        holder = lock.acquire()
    except OSError as error:
        print(
            f"taskcard: cannot use the state directory {config.state_dir} ({error.strerror});"
            " fix its permissions or mount, or choose another state_dir",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if holder is not None:
        print(
            f"taskcard: another `taskcard serve` (pid {holder}) already uses the state "
            f"directory {config.state_dir}; two services on one state would post duplicate "
            "cards. Stop it first, or give this configuration its own state_dir.",
            file=sys.stderr,
        )
        return EXIT_ALREADY_RUNNING
    wiring = None
    store: StateStore
    if config.cluster.enabled:
        from bridge.run.cluster_serve import ClusterWiring, open_cluster

        cluster = open_cluster(config, env)
        if cluster is None:
            lock.release()
            return EXIT_CONFIG
        wiring, store = ClusterWiring(cluster), cluster.store
    else:
        try:
            store = SqliteStore.in_dir(config.state_dir)
        except StateFileError as error:
            print(f"taskcard: {error}", file=sys.stderr)
            lock.release()
            return EXIT_CONFIG
    try:
        try:
            cursors = wiring.cursor_store(config) if wiring else store
            built = build_channels(config, cursors, env)
        except SecretMissing as error:
            print(f"taskcard: {error}", file=sys.stderr)
            return EXIT_CONFIG
        if wiring is not None:
            built = wiring.attach(built)
        setup_logging(config.log_level, [s for b in built.values() for s in b.secrets])
        own_signals = stop is None
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        if own_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
        metrics = ServiceMetrics()
        built = {
            n: replace(b, channel=MeteredChannel(b.channel, metrics)) for n, b in built.items()
        }
        service = Service(
            config,
            built,
            store,
            limiter=wiring.cluster.limiter(config.limits.max_pause_s) if wiring else None,
            clustered=wiring is not None,
        )
        metrics.bind(service.snapshot)
        listener = None
        if config.metrics.address is not None:
            listener = MetricsListener(metrics, *config.metrics.address)
            try:
                await listener.start()
            except OSError as error:
                print(
                    f"taskcard: cannot listen on {config.metrics.listen}: {error}", file=sys.stderr
                )
                return EXIT_RUNTIME
        systemd = asyncio.create_task(_tell_systemd(service, stop, env), name="sd_notify")
        leases = None
        if wiring is not None:
            agents = [agent.id for agent in config.agents]
            leases = asyncio.create_task(
                wiring.cluster.run(agents, service.take_agent, service.drop_agent), name="leases"
            )
        try:
            await service.run(stop)
        finally:
            systemd.cancel()
            await asyncio.gather(systemd, return_exceptions=True)
            if leases is not None and wiring is not None:
                leases.cancel()
                await asyncio.gather(leases, return_exceptions=True)
                await wiring.cluster.close()
            if listener is not None:
                await listener.stop()
            if own_signals:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
        return 0
    except ServiceFailed as error:
        log.error("%s", error)
        return EXIT_RUNTIME
    finally:
        store.close()
        lock.release()


async def _tell_systemd(service: Service, stop: asyncio.Event, env: Mapping[str, str]) -> None:
    """`Type=notify`: READY=1 once the service loop runs, STOPPING=1 when asked to stop."""
    await service.started.wait()
    sd_notify(READY, env)
    await stop.wait()
    sd_notify(STOPPING, env)


def running_pid(state_dir: Path) -> str | None:
    """The pid of the `taskcard serve` holding `state_dir`'s lock, or None when none does."""
    try:
        fd = os.open(state_dir / "serve.lock", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    else:
        return None  # we got the lock, so nobody holds it; closing drops ours
    finally:
        os.close(fd)


class _ServeLock:
    """One service per state directory: an exclusive `flock` held for the whole run."""

    def __init__(self, state_dir: Path) -> None:
        self._path = state_dir / "serve.lock"
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """None when acquired; otherwise the pid recorded by the holder (or "unknown")."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            return holder
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None


def nothing_served(config: ServiceConfig) -> list[str]:
    """Warnings for a configuration that runs but shows nothing (or leaves agents out)."""
    if not config.agents:
        return ["no [[agents]] are configured: nothing is served; add an agent and its workdir"]
    specs = route_specs(config)
    if not specs:
        return [
            "no routes are configured: no card reaches any chat; add [[telegram.routes]] or"
            " [[feishu.routes]], or set console.enabled = true"
        ]
    routed = {agent for spec in specs for agent in spec.agents}
    return [
        f"agent {agent!r} is in no route: its card is shown nowhere"
        for agent in config.agent_ids()
        if agent not in routed
    ]


def _apply_log_options(args: argparse.Namespace) -> None:
    choose(getattr(args, "log_level", None), getattr(args, "log_format", None))


def _serve(args: argparse.Namespace) -> int:
    _apply_log_options(args)
    if args.config is None:
        if args.check:
            print("taskcard: --check needs --config FILE", file=sys.stderr)
            return EXIT_CONFIG
        from bridge.run.demo import run_demo

        return run_demo(None, None)
    config = _load(Path(args.config))
    if config is None:
        return EXIT_CONFIG
    if args.check:
        try:
            check_state_file(config.state_dir / STATE_FILE)
        except StateFileError as error:
            print(f"taskcard: {error}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"{args.config}: valid")
        return 0
    setup_logging(config.log_level)
    for warning in nothing_served(config):
        log.warning("%s", warning)
    try:
        return asyncio.run(serve(config, os.environ))
    except Exception as error:
        log.exception("the service stopped on an error: %s", error)
        return EXIT_RUNTIME


def _config_check(args: argparse.Namespace) -> int:
    if args.file is None:
        print("taskcard: no configuration file given (FILE or TASKCARD_CONFIG)", file=sys.stderr)
        return EXIT_CONFIG
    config = _load(Path(args.file))
    if config is None:
        return EXIT_CONFIG
    specs = route_specs(config)
    channels = sorted({spec.channel for spec in specs})
    print(
        f"{args.file}: valid; {len(config.agents)} agents, {len(specs)} routes"
        + (f" ({', '.join(channels)})" if channels else "")
    )
    for warning in nothing_served(config):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _when(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def status_report(config: ServiceConfig) -> dict[str, Any]:
    """Every configured route with what the store knows about it (read-only)."""
    from bridge.schedule.scheduler import RouteKey

    path = config.state_dir / STATE_FILE
    store: StateStore | None = None
    if config.cluster.enabled:
        from bridge.run.cluster_serve import status_store

        store = status_store(config, os.environ)  # the state is in the shared Redis
    elif path.exists():
        store = SqliteStore(path, readonly=True)
    try:
        routes: list[dict[str, Any]] = []
        pauses = store.pauses() if store else {}
        now = datetime.now(UTC).timestamp()
        # The service caps a stored pause when it starts; show what it will honour.
        ceiling = now + config.limits.max_pause_s
        active_pauses = {
            scope: min(until, ceiling) for scope, until in pauses.items() if until > now
        }
        health = read_health(config.state_dir)
        pending = store.pending_notices() if store else []
        for spec in route_specs(config):
            channel, chat = spec.channel, spec.chat
            for agent_id in spec.agents:
                key = str(RouteKey(channel, chat, agent_id))
                record = store.resident(key) if store else None
                route_pauses = {
                    scope: _when(until)
                    for scope, until in active_pauses.items()
                    if scope.startswith(f"{channel}:")
                    and (
                        scope.endswith(f":{chat.chat_id}")
                        or scope.count(":") == 1
                        or (record is not None and scope.endswith(f":{record.message_id}"))
                    )
                }
                routes.append(
                    {
                        "route": key,
                        "channel": channel,
                        "chat": str(chat),
                        "agent": agent_id,
                        "message_id": record.message_id if record else None,
                        "last_committed": _when(record.committed_at) if record else None,
                        "disabled": record.disabled_reason if record else None,
                        "unanswered_sends": record.unsure_sends if record else 0,
                        "sends_held_until": _send_hold(config, channel, record, now),
                        "paused_until": route_pauses,
                        "pending_notices": [p.notice_id for p in pending if p.route == key],
                    }
                )
        pid = running_pid(config.state_dir)
        agents = [
            {
                "agent": agent.id,
                "problems": parse_agent_health(
                    store.get_cursor(agent_health_key(agent.id)) if store else None
                ),
            }
            for agent in config.agents
        ]
        return {
            "state_file": str(path),
            "service": {"running": pid is not None, "pid": pid},
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
                {"scope": scope, "until": _when(until)}
                for scope, until in sorted(active_pauses.items())
            ],
            "routes": routes,
            "agents": agents,
        }
    finally:
        if store:
            store.close()


def _send_hold(
    config: ServiceConfig, channel: str, record: ResidentRecord | None, now: float
) -> str | None:
    """When a route whose sends got no answer may send again, if it is holding now."""
    from bridge.schedule.scheduler import unsure_send_wait_s

    telegram = config.telegram if channel == "telegram" else None
    hold_s = telegram.ambiguous_send_hold_s if telegram else None
    if record is None or record.unsure_at is None:
        return None
    wait_s = unsure_send_wait_s(record.unsure_sends, record.unsure_at, now, hold_s)
    return _when(now + wait_s) if wait_s > 0 else None


def _status(args: argparse.Namespace) -> int:
    config = _load(Path(args.config))
    if config is None:
        return EXIT_CONFIG
    try:
        check_state_file(config.state_dir / STATE_FILE)
        report = status_report(config)
    except (StateFileError, sqlite3.Error) as error:
        print(f"taskcard: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"state: {report['state_file']}")
    pid = report["service"]["pid"]
    print(f"service: running (pid {pid})" if pid else "service: not running")
    writes = report["state_writes"]
    if writes:
        print(
            f"STATE WRITES FAILING since {writes['failing_since']}: {writes['reason']}"
            f" ({writes['waiting_writes']} writes waiting; the service retries)"
        )
    for pause in report["pauses"]:
        print(f"rate-limit pause: {pause['scope']} until {pause['until']}")
    for route in report["routes"]:
        print(f"{route['route']}")
        print(f"  resident message: {route['message_id'] or '(none yet)'}")
        print(f"  last committed edit: {route['last_committed'] or '(never)'}")
        if route["disabled"]:
            print(f"  DISABLED: {route['disabled']}")
        if route["unanswered_sends"]:
            print(
                f"  sends without an answer: {route['unanswered_sends']}"
                " (each may have left a copy in the chat)"
            )
        if route["sends_held_until"]:
            print(f"  sends held until {route['sends_held_until']}")
        for scope, until in route["paused_until"].items():
            print(f"  paused: {scope} until {until}")
        notices = route["pending_notices"]
        print(
            f"  pending notices: {len(notices)}" + (f" ({', '.join(notices)})" if notices else "")
        )
    for agent in report["agents"]:
        if agent["problems"]:
            print(f"agent {agent['agent']}: PROBLEMS")
            for problem in agent["problems"]:
                print(f"  - {problem}")
    return 0


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """`--log-level` and `--log-format`, defaulting to their TASKCARD_* variables."""
    level = os.environ.get("TASKCARD_LOG_LEVEL", "").upper() or None
    fmt = os.environ.get("TASKCARD_LOG_FORMAT", "").lower() or None
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=level if level in LOG_LEVELS else None,
        help="log verbosity (env TASKCARD_LOG_LEVEL; default: the config's log_level)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=fmt if fmt in LOG_FORMATS else "text",
        help="text for people, json for one object per line (env TASKCARD_LOG_FORMAT)",
    )


def _config_option(parser: argparse.ArgumentParser, *, required: bool) -> None:
    default = os.environ.get("TASKCARD_CONFIG") or None
    parser.add_argument(
        "--config",
        "-c",
        default=default,
        required=required and default is None,
        help="the TOML configuration (env TASKCARD_CONFIG)",
    )


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
    _config_option(serve_parser, required=False)
    serve_parser.add_argument(
        "--check",
        action="store_true",
        help="validate the configuration and the state file, then exit (2: invalid)",
    )
    add_log_options(serve_parser)
    serve_parser.set_defaults(handler=_serve)

    status_parser = subparsers.add_parser(
        "status",
        help="print each route's resident message, last edit, pauses and pending notices",
    )
    _config_option(status_parser, required=True)
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
        default=os.environ.get("TASKCARD_CONFIG") or None,
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
