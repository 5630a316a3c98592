"""Running one service: the serve lock, the run itself, and the options every runner shares.

`taskcard serve` (`serve_cli`) and `taskcard demo` (`demo`) both run the service through
`serve`; it lives here so that neither command module imports the other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Final

from taskcard.bridge.config import ConfigError, ServiceConfig, bot_root_doubt, load_config
from taskcard.bridge.deliver.registry import (
    SecretMissing,
    build_channels,
    missing_secrets,
    route_specs,
)
from taskcard.bridge.observe.metrics import MeteredChannel, ServiceMetrics
from taskcard.bridge.observe.sdnotify import READY, STOPPING, sd_notify
from taskcard.bridge.run import early_stop, heap
from taskcard.bridge.run.chat_names import ChatNames, route_usernames
from taskcard.bridge.run.logs import (
    EVERY_TIME,
    LOG_FORMATS,
    LOG_LEVELS,
    setup_logging,
    start_error,
)
from taskcard.bridge.run.service import Service, ServiceFailed
from taskcard.bridge.store.sqlite import (
    HEALTH_FILE,
    STATE_FILE,
    SqliteStore,
    StateFileError,
    StateFileLocked,
    StateStore,
)
from taskcard.channels.aio import TICK_S, sleep_to_tick
from taskcard.channels.base import BIND_RETRY_S, bind_problem, bind_retrying
from taskcard.channels.feishu.config import unusual_chat_id

if TYPE_CHECKING:
    from taskcard.bridge.observe.listener import MetricsListener

EXIT_CONFIG = 2
EXIT_RUNTIME = 1
EXIT_ALREADY_RUNNING = 3
# A metrics port in use is tried again for `BIND_RETRY_S` (`channels.base.bind_retrying`,
# shared with the Feishu webhook) before the start gives up with exit 2: a holder that lets
# go within it is waited out, one that keeps it is a clash a restart would not mend.

# A state file another process holds locked is tried again for this long (every try also
# waits SQLite's 5 s busy timeout) before the start gives up with exit 2.
STATE_LOCK_WAIT_S = 30.0
STATE_LOCK_RETRY_EVERY_S = 0.5

# The serve lock held by another service is waited for this long before the start gives up
# with exit 3: the instance a restart replaces may still be stopping (up to ~35 s when a
# send is in flight), one that keeps serving is refused after it.
SERVE_LOCK_WAIT_S = 45.0
SERVE_LOCK_RETRY_EVERY_S = 0.5

log = logging.getLogger(__name__)


def nothing_served(config: ServiceConfig) -> list[str]:
    """Warnings for a configuration that runs but shows nothing (or leaves agents out, or
    shows one agent's files under two names, or has a listener or API root set up wrong)."""
    return (
        _shown_nowhere(config)
        + _webhook_not_served(config)
        + _webhook_port_any(config)
        + _bot_root_doubted(config)
        + _nobody_allowed(config)
        + _unusual_feishu_chats(config)
        + _repeated_route_agents(config)
        + _repeated_ids(config)
    )


def _repeated_ids(config: ServiceConfig) -> list[str]:
    """A chat listed twice in a channel's `origin_chats`, or a person twice in a route's
    `allowed_user_ids`: both are sets (the repeat is taken once, so nothing changes), but a
    repeat is likely a slip for the id meant, said once per repeat with both positions.
    The id is not quoted: a value pasted under the wrong key may be a secret."""
    lists: list[tuple[str, Sequence[object]]] = []
    for section in ("telegram", "feishu"):
        channel = getattr(config, section)
        if channel is None:
            continue
        lists.append((f"{section}.origin_chats", channel.origin_chats))
        for index, route in enumerate(channel.routes):
            if route.allowed_user_ids is not None:
                lists.append(
                    (f"{section}.routes[{index}].allowed_user_ids", route.allowed_user_ids)
                )
    warnings: list[str] = []
    for key, values in lists:
        first: dict[object, int] = {}
        for position, value in enumerate(values):
            if value in first:
                warnings.append(
                    f"{key}[{position}]: the same id as {key}[{first[value]}]; it is taken"
                    " once, so remove the repeat (or write the id you meant there)"
                )
            else:
                first[value] = position
    return warnings


def _repeated_route_agents(config: ServiceConfig) -> list[str]:
    """An agent named twice in one route's `agents`: served once (its card is posted once),
    but likely a slip for another agent's name, so said once per repeat, naming the route,
    the agent and where it was first listed."""
    warnings: list[str] = []
    for section in ("telegram", "feishu"):
        channel = getattr(config, section)
        for index, route in enumerate(channel.routes if channel is not None else ()):
            first: dict[str, int] = {}
            for position, name in enumerate(route.agents):
                if name in first:
                    warnings.append(
                        f"{section}.routes[{index}].agents[{position}]: {name!r} is already"
                        f" listed at agents[{first[name]}] of this route (chat"
                        f" {route.chat_id!r}); it is served once, list it once (or name the"
                        " agent you meant)"
                    )
                else:
                    first[name] = position
    return warnings


def _unusual_feishu_chats(config: ServiceConfig) -> list[str]:
    """A Feishu route or origin chat whose id lacks the `oc_` prefix: taken (the platform's
    ids are what `taskcard chats` lists), but likely a slip whose sends will fail. The id is
    not quoted: a value pasted under the wrong key may be a secret."""
    feishu = config.feishu
    if feishu is None:
        return []
    keys = [
        f"feishu.routes[{index}].chat_id"
        for index, route in enumerate(feishu.routes)
        if unusual_chat_id(route.chat_id)
    ] + [
        f"feishu.origin_chats[{index}]"
        for index, chat in enumerate(feishu.origin_chats)
        if unusual_chat_id(chat)
    ]
    return [
        f"{key}: does not start with oc_ as Feishu chat ids do; if sends to it fail, use the"
        " chat's id as `taskcard chats` lists it"
        for key in keys
    ]


def _nobody_allowed(config: ServiceConfig) -> list[str]:
    """A route whose `allowed_user_ids` is an empty list: no one in that chat may run
    /taskcard, /tell or reply to a card (likely a slip for leaving the key out)."""
    shut: list[tuple[str, int, object]] = []
    if config.telegram is not None:
        shut += [
            ("telegram", index, route.chat_id)
            for index, route in enumerate(config.telegram.routes)
            if route.allowed_user_ids == []
        ]
    if config.feishu is not None:
        shut += [
            ("feishu", index, route.chat_id)
            for index, route in enumerate(config.feishu.routes)
            if route.allowed_user_ids == []
        ]
    return [
        f"{platform}.routes[{index}].allowed_user_ids: empty, so no one in chat {chat!r}"
        + (" (but its anonymous administrators)" if platform == "telegram" else "")
        + " may run /taskcard, /tell or reply to a card; list the people's ids, or remove"
        " the key to let everyone in the chat"
        for platform, index, chat in shut
    ]


def _shown_nowhere(config: ServiceConfig) -> list[str]:
    """Agents or cards that reach no chat, and one agent's files under two names."""
    if not config.agents and not config.discover.roots:
        return ["no [[agents]] are configured: nothing is served; add an agent and its workdir"]
    specs = route_specs(config)
    # A channel's `origin_chats` is a way in too: a turn from one of them opens a route
    # there, so an agent without a configured route is not shown nowhere.
    by_origin = any(
        channel is not None and channel.origin_chats for channel in (config.telegram, config.feishu)
    )
    if not specs and not by_origin:
        return [
            "no routes are configured: no card reaches any chat; add [[telegram.routes]] or"
            " [[feishu.routes]] (or origin_chats), or set console.enabled = true"
        ]
    routed = {agent for spec in specs for agent in spec.agents}
    return (
        [
            f"agent {agent!r} is in no route: its card is shown nowhere"
            for agent in config.agent_ids()
            if agent not in routed and not by_origin
        ]
        + _shared_workdirs(config)
        + _repeated_roots(config)
    )


def _bot_root_doubted(config: ServiceConfig) -> list[str]:
    """`telegram.api_base_url` ending in `/bot` (python-telegram-bot's `base_url`): likely a
    slip whose 404s would otherwise read as a refused token."""
    telegram = config.telegram
    doubt = None if telegram is None else bot_root_doubt(telegram.api_base_url)
    return [] if doubt is None else [f"telegram.api_base_url: {doubt}"]


def _webhook_not_served(config: ServiceConfig) -> list[str]:
    """A `[feishu.webhook]` table while `feishu.events` is not "webhook" (it defaults to
    "websocket"): nothing listens there, so Feishu's URL check and every callback fail."""
    feishu = config.feishu
    if feishu is None or feishu.events == "webhook" or "webhook" not in feishu.model_fields_set:
        return []
    return [
        f"feishu.webhook: set, but feishu.events is {feishu.events!r}, so no webhook is"
        ' served and Feishu\'s callbacks find nothing listening; set events = "webhook" to'
        " receive commands there, or remove the [feishu.webhook] table"
    ]


def _webhook_port_any(config: ServiceConfig) -> list[str]:
    """`feishu.webhook.port = 0` while the webhook is served: the system picks a free port at
    each start, which the proxy in front and the callback URL set in Feishu cannot follow. A
    warning, not a refusal: 0 is a valid port to bind (tests and a port found by hand)."""
    feishu = config.feishu
    if feishu is None or feishu.events != "webhook" or feishu.webhook.port != 0:
        return []
    return [
        "feishu.webhook.port: 0 binds whatever port is free at each start, so the proxy in"
        " front and the callback URL set in Feishu cannot know it; give the port they forward"
        " to (e.g. 8088)"
    ]


def _repeated_roots(config: ServiceConfig) -> list[str]:
    """A discovery root listed twice (or through a link to it) is read once; said, since the
    entry is likely a slip."""
    warnings: list[str] = []
    first: dict[str, int] = {}
    for index, root in enumerate(config.discover.roots):
        real = os.path.realpath(root)
        if real in first:
            warnings.append(
                f"discover.roots[{index}]: {root} is the same folder as"
                f" discover.roots[{first[real]}]; it is read once, list it once"
            )
        else:
            first[real] = index
    return warnings


def _shared_workdirs(config: ServiceConfig) -> list[str]:
    """Two agents on one workdir are one agent's files shown twice: the same card under two
    names, and a `/tell` to either queued in the same inbox. Compared once links are
    followed, as the roots are: a workdir reached through a symlink to another agent's
    folder was taken without a word."""
    warnings: list[str] = []
    first: dict[str, int] = {}
    for index, agent in enumerate(config.agents):
        folder = os.path.realpath(agent.workdir)
        if folder in first:
            other = config.agents[first[folder]]
            warnings.append(
                f"agents[{index}].workdir: the same folder as agents[{first[folder]}]"
                f" ({other.id!r}), so {agent.id!r} shows that agent's card again; give each"
                " agent its own workdir"
            )
        else:
            first[folder] = index
    return warnings


def reload_config(service: Service, path: Path, names: ChatNames | None = None) -> bool:
    """SIGHUP: read `path` again and apply it; an invalid file is refused with the same
    messages as at start (logged), and the running configuration stays.

    A Telegram route named by `@username` takes the id `names` learnt for it; a username new
    to it is asked of Telegram first, in the background, and the file applied then."""
    try:
        config = load_config(_reloadable(path), reload=True)
    except ConfigError as error:
        # One record, its problems below the first line: a problem logged on its own would
        # lose what it is about (a JSON log line each). Never held back as a repeat: each
        # SIGHUP is answered, also when the file is as broken as at the one before.
        log.error(
            "config reload refused: %s is invalid; the running configuration stays%s",
            path,
            "".join(f"\n  - {message}" for message in error.messages),
            extra=EVERY_TIME,
        )
        return False
    if names is not None:
        generation = names.written(config)
        unknown = names.unknown(config)
        if unknown:
            log.info(
                "config reload: asking Telegram for the chat ids of %s first", ", ".join(unknown)
            )
            task = asyncio.get_running_loop().create_task(
                _reload_resolved(service, config, names, generation), name="config_reload"
            )
            _RELOADS.add(task)
            task.add_done_callback(_RELOADS.discard)
            return True
        applied = _apply_reload(service, names.apply(config))
        if applied:
            names.accepted(generation)
        elif (running := names.refused(generation)) is not None:
            _apply_reload(service, running)
        names.keep_asking(lambda resolved: _apply_reload(service, resolved))
        return applied
    return _apply_reload(service, config)


# Reloads waiting for Telegram to resolve a username (kept: a task nobody holds may vanish).
_RELOADS: set[asyncio.Task[bool]] = set()


async def _reload_resolved(
    service: Service, config: ServiceConfig, names: ChatNames, generation: int
) -> bool:
    applied = await names.reload(config, generation, lambda c: _apply_reload(service, c))
    names.keep_asking(lambda resolved: _apply_reload(service, resolved))
    return applied


def _apply_reload(service: Service, config: ServiceConfig) -> bool:
    if not service.reload(config):
        return False  # refused, and logged why: the running configuration stays
    for warning in nothing_served(config):
        log.warning("%s", warning)
    return True


def _reloadable(path: Path) -> Path:
    """`path`, unless it is a pipe: a start may read `--config <(...)` or a named pipe once,
    but a reload would wait, with the whole service, for a writer that may never come."""
    try:
        is_pipe = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return path  # load_config says what is wrong with it
    if is_pipe:
        raise ConfigError(
            [f"{path}: is a pipe, which a reload cannot read again; give --config a file"]
        )
    return path


def skip_cli_only_imports() -> None:
    """Keep httpx's command-line tool out of the service process.

    python-telegram-bot imports httpx, and httpx's `__init__` imports its `httpx` command
    (click, rich, pygments: about 6 MB of RSS) whenever those happen to be installed. A `None`
    entry in `sys.modules` makes that one import fail, which httpx expects (it then defines a
    stub `main`); nothing in the service runs that command.
    """
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


def start_blockers(config: ServiceConfig, env: Mapping[str, str]) -> list[str]:
    """Each required secret variable `config` names that is unset, empty or malformed in
    `env`, one line each naming the setting and the fix (never a value): the channels' and,
    in cluster mode, the Redis URL's. `serve` stops on them before it locks or makes anything;
    `serve --check` says them."""
    problems = missing_secrets(config, env)
    if config.cluster.enabled:
        from taskcard.bridge.cluster.config import ClusterUrlMissing, resolve_redis_url

        try:
            resolve_redis_url(config.cluster, env)
        except ClusterUrlMissing as error:
            problems.append(str(error))
    return problems


async def serve(
    config: ServiceConfig,
    env: Mapping[str, str],
    *,
    stop: asyncio.Event | None = None,
    config_path: Path | None = None,
) -> int:
    """Run the service until SIGTERM/SIGINT (or `stop`); returns the exit code.

    With `config_path`, SIGHUP reloads that file while serving (see `reload_config`).
    """
    skip_cli_only_imports()
    heap.starting()
    own_signals = stop is None
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()

    def stopping() -> str | None:
        # A SIGTERM or SIGINT during a step of the start-up (`early_stop`): stop before the
        # next one, cleanly, instead of serving first.
        return early_stop.requested() if own_signals else None

    def failed(code: int) -> int:
        # A step that failed after a stop was asked for: the stop's exit, not the step's
        # (its failure is logged); systemd must not read a configuration error into a stop.
        why = stopping()
        return _stopped_before_serving(why) if why else code

    # A secret's variable unset or empty is told before anything is made or locked: a
    # mistyped variable must not leave a state folder (or a database) behind.
    if problems := start_blockers(config, env):
        for message in problems:
            start_error(message)
        return failed(EXIT_CONFIG)
    lock = ServeLock(config.state_dir)
    try:
        holder = lock.acquire()
    except OSError as error:
        # The lock file itself may be what is wrong (a folder in its place): name it.
        where = f": {error.filename}" if error.filename else ""
        start_error(
            f"cannot use the state directory {config.state_dir}{where}"
            f" ({error.strerror}); fix its permissions or mount, remove what is in the lock"
            " file's place, or choose another state_dir"
        )
        return failed(EXIT_CONFIG)
    if holder is not None:
        holder = await _wait_for_serve_lock(lock, holder, config.state_dir, stopping)
    if holder is not None and not stopping():  # a stop while waiting is said as a stop
        start_error(
            f"another `taskcard serve` (pid {holder}) already uses the state "
            f"directory {config.state_dir}; two services on one state would post duplicate "
            "cards. Stop it first, or give this configuration its own state_dir."
        )
        return failed(EXIT_ALREADY_RUNNING)
    if why := stopping():
        lock.release()
        return _stopped_before_serving(why)
    wiring = None
    serving = False
    refused = False  # a refusal before serving: the state folder it made goes again
    signals_taken = False
    store: StateStore
    if config.cluster.enabled:
        from taskcard.bridge.run.cluster_serve import ClusterWiring, open_cluster

        cluster = open_cluster(config, env)
        if cluster is None:
            _unmake(lock)
            return failed(EXIT_CONFIG)
        wiring, store = ClusterWiring(cluster), cluster.store
    else:
        opened = await _open_state(config.state_dir, stopping)
        if opened is None:
            _unmake(lock)
            return failed(EXIT_CONFIG)
        store = opened
    try:
        if why := stopping():
            return _stopped_before_serving(why)
        names = ChatNames(env, store)
        hup_during_start: list[int] = []
        if own_signals and config_path is not None and route_usernames(config):
            # The lookup below may hold the start for up to `request_timeout_s`: a SIGHUP
            # then is noted and read once serving, not dropped as one at the start is.
            signal.signal(signal.SIGHUP, lambda signum, _frame: hup_during_start.append(signum))
        names.written(config)  # the start's file: the one a refused reload puts back
        if route_usernames(config):
            # The token is in the lookup's request lines: scrubbed from the log from here.
            token = env.get(config.telegram.token_env, "").strip() if config.telegram else ""
            setup_logging(config.log_level, [token] if token else [])
            config = await names.resolve(config)
        try:
            cursors = wiring.cursor_store(config) if wiring else store
            built = build_channels(config, cursors, env)
        except SecretMissing as error:
            for message in error.messages:
                start_error(message)
            refused = True
            return failed(EXIT_CONFIG)
        if wiring is not None:
            built = wiring.attach(built)
        setup_logging(config.log_level, [s for b in built.values() for s in b.secrets])
        if own_signals:
            for signum in early_stop.SIGNALS:
                loop.add_signal_handler(signum, _stop_signal, signum, stop)
            signals_taken = True
        if why := stopping():  # it came before the loop took the signals
            return _stopped_before_serving(why)
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
            cluster_names=wiring.cluster.routed_names if wiring else None,
            cluster_chat=wiring.cluster.routed_chat if wiring else None,
            shared_boards=wiring.cluster.boards if wiring else None,
            shared_replies=wiring.cluster.replies if wiring else None,
            wake_relay=wiring.cluster.wakes if wiring else None,
        )
        if wiring is not None:
            wiring.follow(service.routes_chat)
        if own_signals and config_path is not None:
            loop.add_signal_handler(signal.SIGHUP, reload_config, service, config_path, names)
            if hup_during_start:
                log.info("a SIGHUP came while the service started: reading the file again")
                reload_config(service, config_path, names)
        # A username Telegram could not be asked about at the start: asked again meanwhile.
        names.keep_asking(lambda resolved: _apply_reload(service, resolved), stop)
        metrics.bind(service.snapshot)
        listener = None
        if config.metrics.address is not None:
            # Imported here: aiohttp and its helpers cost ~5 MB of RSS that a service without
            # a metrics listener (the default) never needs.
            from taskcard.bridge.observe.listener import MetricsListener

            listener = MetricsListener(metrics, *config.metrics.address)
            bound = await _bind(listener, config.metrics.listen, stop)
            if bound is None:
                return _stopped_before_serving(stopping() or "a stop")
            if not bound:
                refused = True
                return failed(EXIT_CONFIG)
        systemd = asyncio.create_task(_tell_systemd(service, stop, env), name="sd_notify")
        keeper = asyncio.create_task(_keep_lock(lock), name="serve_lock")
        leases = None
        if wiring is not None:
            leases = asyncio.create_task(
                wiring.cluster.run(
                    service.agent_ids,
                    service.take_agents,
                    service.drop_agent,
                    service.routed_agents,
                    boards=service,
                    replies=service,
                    wakes=service,
                    marks=service.routed_marks,
                ),
                name="leases",
            )
        serving = True
        try:
            await service.run(stop)
        finally:
            systemd.cancel()
            keeper.cancel()
            await asyncio.gather(systemd, keeper, return_exceptions=True)
            if leases is not None and wiring is not None:
                leases.cancel()
                await asyncio.gather(leases, return_exceptions=True)
                await wiring.cluster.close()
            if listener is not None:
                await listener.stop()
            if signals_taken:
                _give_signals_back(loop)
                signals_taken = False
        return 0
    except ServiceFailed as error:
        log.error("%s", error)
        return EXIT_RUNTIME
    finally:
        if signals_taken:
            _give_signals_back(loop)
        if wiring is not None and not serving:
            wiring.cluster.forget_bots()  # it never served: its bot claim must not linger
        store.close()
        if refused:
            _unmake(lock)
        else:
            lock.release()


def _unmake(lock: ServeLock) -> None:
    """Release `lock` for a start that was refused, taking away the state folder it made
    (`ServeLock.made`): its state file with nothing served into it and the lock file,
    unlinked while the lock is still held (a start waiting for it then finds no file of this
    one), then the folders. A folder that holds anything else is kept, and so is all of a
    state folder that was there, or that another serve held when this one came."""
    made = lock.made
    if made:
        for name in (
            HEALTH_FILE,
            STATE_FILE,
            *(STATE_FILE + end for end in ("-wal", "-shm", "-journal")),
            ServeLock.FILE,
        ):
            with contextlib.suppress(OSError):
                (made[0] / name).unlink(missing_ok=True)
    lock.release()
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            return


async def _wait_for_serve_lock(
    lock: ServeLock, holder: str, state_dir: Path, stopping: Callable[[], str | None]
) -> str | None:
    """None once `lock` is taken; else the holder's pid, after `SERVE_LOCK_WAIT_S` or a stop.

    The holder is often the instance this start replaces, still stopping (its sends in
    flight finish, then its store closes): waited for, with one warning, instead of exit 3
    at once, which the shipped unit does not restart. A service that keeps running is still
    refused once the wait is over."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SERVE_LOCK_WAIT_S
    log.warning(
        "another `taskcard serve` (pid %s) uses the state directory %s; waiting up to %g s for"
        " it to stop (an instance still stopping lets go of it by then)",
        holder,
        state_dir,
        SERVE_LOCK_WAIT_S,
    )
    while loop.time() < deadline and not stopping():
        await asyncio.sleep(SERVE_LOCK_RETRY_EVERY_S)
        found = lock.acquire()
        if found is None:
            log.info("the state directory %s is free now; starting", state_dir)
            return None
        holder = found
    return holder


async def _open_state(state_dir: Path, stopping: Callable[[], str | None]) -> SqliteStore | None:
    """The state file opened for writing, or None after the line saying why not.

    A file another process holds locked (an instance still exiting, a sqlite3 shell in a
    transaction) is tried again, with one warning, for `STATE_LOCK_WAIT_S` (each try waits
    SQLite's busy timeout too), unless a stop comes: a lock that passes by itself no longer
    ends the start with exit 2, which the shipped unit does not restart."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STATE_LOCK_WAIT_S
    told = False
    while True:
        try:
            return SqliteStore.in_dir(state_dir)
        except StateFileLocked as error:
            if stopping():
                return None  # the caller says it as a stop, not as an error
            if loop.time() >= deadline:
                start_error(str(error))
                return None
            if not told:
                told = True
                log.warning(
                    "%s: another process holds the state file locked (a taskcard still"
                    " stopping, or a sqlite3 shell or tool in a transaction); waiting up to"
                    " %g s for it: end that transaction or stop that process",
                    state_dir / STATE_FILE,
                    STATE_LOCK_WAIT_S,
                )
        except StateFileError as error:
            start_error(str(error))
            return None
        await asyncio.sleep(STATE_LOCK_RETRY_EVERY_S)


def _stop_signal(signum: int, stop: asyncio.Event) -> None:
    """The loop's SIGTERM/SIGINT handler: the stop, and its name for a start that ends."""
    early_stop.note(signum)
    stop.set()


async def _bind(listener: MetricsListener, listen: str | None, stop: asyncio.Event) -> bool | None:
    """Start the metrics listener: True once bound, False after the one line saying why not,
    None when a stop came while a port in use was waited for (`BIND_RETRY_S`)."""
    try:
        bound = await bind_retrying(
            listener.start,
            lambda: log.warning(
                '[metrics] listen = "%s": the port is in use; trying again for up to %g s',
                listen,
                BIND_RETRY_S,
            ),
            stop=stop,
        )
    except OSError as error:
        start_error(_listen_problem(listen, error))
        return False
    return True if bound else None


def _listen_problem(listen: str | None, error: OSError) -> str:
    """One line for a metrics listener that cannot bind: the key, the address and the fix
    (the exception's own text is a paragraph with the errno and a tuple)."""
    return f'[metrics] listen = "{listen}": {bind_problem(error)} (or remove the key)'


def _stopped_before_serving(why: str) -> int:
    log.info("stopped (%s during the start, before serving)", why)
    return 0


def _give_signals_back(loop: asyncio.AbstractEventLoop) -> None:
    """The loop's signal handlers removed, while the service winds down to its exit.

    Removing a handler restores the signal's default action, which ends the process: SIGHUP's
    (and systemd does not restart what SIGHUP ended) is ignored from now on. SIGTERM and
    SIGINT, sent again by an operator whose stop seems stuck, end the process at once
    (`early_stop.force`): all that is left is closing the store, which SQLite's journal
    makes safe to cut short, and the loop's teardown."""
    for signum in (*early_stop.SIGNALS, signal.SIGHUP):
        loop.remove_signal_handler(signum)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    early_stop.force()


async def _tell_systemd(service: Service, stop: asyncio.Event, env: Mapping[str, str]) -> None:
    """`Type=notify`: READY=1 once the service loop runs, STOPPING=1 when asked to stop."""
    await service.started.wait()
    sd_notify(READY, env)
    await stop.wait()
    sd_notify(STOPPING, env)


async def _keep_lock(lock: ServeLock) -> None:
    """Once a second, take the serve lock again if its file was deleted while serving; at
    the service timer's ticks (`next_tick`), in the same turn of the loop."""
    while True:
        await sleep_to_tick(TICK_S)
        lock.keep()


def running_pid(state_dir: Path) -> tuple[bool, int | None]:
    """Whether a `taskcard serve` holds `state_dir`'s lock, and its pid as the lock file names
    it (None when none does, or the file holds no pid yet: its holder writes it just after
    taking the lock)."""
    try:
        fd = os.open(state_dir / "serve.lock", os.O_RDONLY)
    except FileNotFoundError:
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return True, int(text) if text.isascii() and text.isdigit() else None
    else:
        return False, None  # we got the lock, so nobody holds it; closing drops ours
    finally:
        os.close(fd)


class ServeLock:
    """One service per state directory: an exclusive `flock` held for the whole run."""

    FILE: Final = "serve.lock"

    def __init__(self, state_dir: Path) -> None:
        self._path = Path(os.path.abspath(state_dir)) / self.FILE
        self._fd: int | None = None
        self._lost_logged = False
        self._first = True
        # The folders of the state directory this lock's own `mkdir` made, innermost first,
        # when its first attempt found the lock free: what a refused start may take away.
        self.made: list[Path] = []

    def acquire(self) -> str | None:
        """None when acquired; otherwise the pid recorded by the holder (or "unknown")."""
        made = _make_folders(self._path.parent)
        first, self._first = self._first, False
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            return holder
        if first:
            # A folder made while waiting for another serve is one that serve may have
            # taken away and made again: not this start's to remove.
            self.made = made
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return None

    def keep(self) -> None:
        """Take the lock again on a new file when its file was deleted (or its folder).

        A lock held on a deleted file guards nothing: a second `taskcard serve` would create
        the file anew, lock it and serve the same state, posting every resident message a
        second time. One `stat` when nothing happened.
        """
        if self._fd is None:
            return
        try:
            info = os.stat(self._path)
        except FileNotFoundError:
            pass
        except OSError:
            return
        else:
            held = os.fstat(self._fd)
            if (info.st_dev, info.st_ino) == (held.st_dev, held.st_ino):
                return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            if not self._lost_logged:
                self._lost_logged = True
                log.error(
                    "the lock file %s was deleted while the service ran and cannot be made"
                    " again (%s); another `taskcard serve` could start on this state"
                    " directory: fix the state directory",
                    self._path,
                    error.strerror,
                )
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if not self._lost_logged:
                self._lost_logged = True
                log.error(
                    "another `taskcard serve` (pid %s) uses the state directory %s: it"
                    " started after this service's lock file was deleted; two services on"
                    " one state post duplicate cards: stop one of them",
                    holder,
                    self._path.parent,
                )
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        os.close(self._fd)
        self._fd = fd
        self._lost_logged = False
        log.warning(
            "the lock file %s was deleted while the service ran; it is made and locked again",
            self._path,
        )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None


def _make_folders(folder: Path) -> list[Path]:
    """Make `folder` and its missing parents; the ones this call's own `mkdir` made,
    innermost first. A level made meanwhile by someone else (another serve starting on the
    same state) is not counted: its `mkdir` fails with `FileExistsError` here."""
    missing = []
    for level in (folder, *folder.parents):
        if level.exists():
            break
        missing.append(level)
    made: list[Path] = []
    for level in reversed(missing):
        try:
            level.mkdir()
        except FileExistsError:
            continue
        made.insert(0, level)
    return made


def _one_of(
    choices: tuple[str, ...], variable: str, normal: Callable[[str], str]
) -> Callable[[str], str]:
    """An argparse type: `normal(text)` when it is one of `choices`, else a usage error naming
    them. argparse also passes a string default through it, so a value from `variable` that
    is not a choice stops the command (exit 2) instead of being ignored without a word."""

    def parse(text: str) -> str:
        # White space around a word is no mistake (a variable's value from an env file, with
        # its line break); the word itself is checked.
        value = normal(text.strip())
        if value not in choices:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not one of {', '.join(choices)} (the option, or {variable}"
                " when the option is not given)"
            )
        return value

    return parse


def add_log_options(
    parser: argparse.ArgumentParser, level_default: str = "the config's log_level"
) -> None:
    """`--log-level` and `--log-format`, defaulting to their TASKCARD_* variables; without
    either, the level is `level_default` (said in the help)."""
    parser.add_argument(
        "--log-level",
        type=_one_of(LOG_LEVELS, "TASKCARD_LOG_LEVEL", str.upper),
        choices=LOG_LEVELS,
        default=os.environ.get("TASKCARD_LOG_LEVEL") or None,
        help=f"log verbosity (env TASKCARD_LOG_LEVEL; default: {level_default})",
    )
    parser.add_argument(
        "--log-format",
        type=_one_of(LOG_FORMATS, "TASKCARD_LOG_FORMAT", str.lower),
        choices=LOG_FORMATS,
        default=os.environ.get("TASKCARD_LOG_FORMAT") or "text",
        # "(default: text)" whatever the variable holds: the value itself was printed raw.
        help="text for people, json for one object per line; TASKCARD_LOG_FORMAT when set"
        " (default: text)",
    )
