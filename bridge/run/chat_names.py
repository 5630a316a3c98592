"""Telegram routes that name their chat by a public `@username`, resolved to numeric ids.

`config check` takes such a route once the username has the right shape; `serve` asks
Telegram for each chat's numeric id (getChat) before the channels are built, and runs with
a configuration that names every chat by its id, so the residents, a chat's settings and
the commands arriving from it are all keyed by that id. A username Telegram cannot resolve
(no such public chat, the bot not in it) costs that route alone: one error line names the
route and the username, and every other route is served. One Telegram could not be asked
about (out of reach, a 5xx, a 429) is asked again in the background, and its route served
once it resolves. A reload (SIGHUP) reuses what the start learnt and asks only for
usernames new to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from taskcard.bridge.config import ServiceConfig
from taskcard.bridge.store.base import StateStore
from taskcard.channels.aio import Backoff
from taskcard.channels.base import CursorStore
from taskcard.channels.errors import ChannelError, RateLimited, Transient
from taskcard.channels.telegram.scopes import BOT_SCOPE_KEY

log = logging.getLogger(__name__)


def route_usernames(config: ServiceConfig) -> list[tuple[int, str]]:
    """Each Telegram route naming its chat by `@username`: its index and the username."""
    if config.telegram is None:
        return []
    return [
        (index, route.chat_username)
        for index, route in enumerate(config.telegram.routes)
        if route.chat_username is not None
    ]


def username_notes(config: ServiceConfig) -> list[str]:
    """What `config check` says of each such route: taken, and resolved at the start."""
    return [
        f"telegram.routes[{index}].chat_id: {username} is resolved to the chat's numeric id"
        " when `taskcard serve` starts (the bot must be a member of that public channel or"
        " supergroup)"
        for index, username in route_usernames(config)
    ]


# How soon a username Telegram could not be asked about is asked again, doubling each time.
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0

# Where the state keeps the id a username was last resolved to (for `taskcard status` and
# `taskcard chats`, which run without asking Telegram).
_CURSOR_PREFIX = "telegram:chat_username:"


def as_last_resolved(config: ServiceConfig, cursor: CursorStore | None) -> ServiceConfig:
    """`config` with each username the service last resolved replaced by that id, the others
    left as written: what `taskcard status` and `taskcard chats` read the routes as."""
    telegram = config.telegram
    if telegram is None or cursor is None or not route_usernames(config):
        return config
    routes = []
    for route in telegram.routes:
        username = route.chat_username
        known = None
        if username is not None:
            try:
                known = cursor.get_cursor(_CURSOR_PREFIX + username.lower())
            except Exception as error:  # the state unreadable: shown as written
                log.debug("the id of %s could not be read: %s", username, error)
        if known is not None and known.lstrip("-").isdigit():
            route = route.model_copy(update={"chat_id": int(known)})
        routes.append(route)
    return config.model_copy(update={"telegram": telegram.model_copy(update={"routes": routes})})


class ChatNames:
    """The usernames resolved so far (lower case: Telegram reads them regardless of case)."""

    def __init__(self, env: Mapping[str, str], store: StateStore | None = None) -> None:
        self._env = env
        self._store = store
        self._cursor: CursorStore | None = store
        self._ids: dict[str, int] = {}
        # The configuration as last written (the start, the last SIGHUP), and the one the
        # service runs (the start or the last reload it accepted), put back when a reload
        # is refused: never a reload that was superseded before it was applied.
        self._written: ServiceConfig | None = None
        self._running: ServiceConfig | None = None
        # Usernames whose last lookup Telegram could not answer (out of reach, a limit) and
        # no earlier run resolved: `retry` asks for those the running file names.
        self._waiting: set[str] = set()
        self._waiting_before: set[str] = set()
        self._stop: asyncio.Event | None = None
        self._retrying: asyncio.Task[None] | None = None
        # One lookup at a time (the start's, a reload's, the retry's): a name one of them
        # resolved is not asked again by the next, and a burst of reloads asks once.
        self._lookup = asyncio.Lock()
        # Reloads whose lookup has not ended yet: the retry applies nothing meanwhile (the
        # reload applies its own file, or puts the running one back).
        self._reloading = 0
        # Counts the configurations written (`written`): a lookup finishing after a later
        # reload must not apply the older file over the newer one.
        self.generation = 0
        # Usernames Telegram could not be asked about, served meanwhile by the id the state
        # kept from an earlier run (lower case: that id and why it is used).
        self._fallback: dict[str, tuple[int, str]] = {}
        # The longest wait a 429 asked for, honoured before asking again.
        self._asked_to_wait_s = 0.0

    def written(self, config: ServiceConfig) -> int:
        """`config` is what the file says now (the start, a reload): the one `retry` applies
        from here on. Returns its generation."""
        if self._running is None:
            self._running = config  # the start
        self._waiting_before = self.waiting(self._running)
        self._written = config
        self.generation += 1
        return self.generation

    def accepted(self, generation: int) -> None:
        """The reload of `generation` was applied: its file is the one running."""
        if generation == self.generation:
            self._running = self._written

    def waiting(self, config: ServiceConfig | None) -> set[str]:
        """The usernames of `config` that wait for Telegram to answer (lower case)."""
        if config is None:
            return set()
        names = {name.lower() for _, name in route_usernames(config)}
        return (names & self._waiting) - self._ids.keys()

    def refused(self, generation: int) -> ServiceConfig | None:
        """The reload of `generation` was refused: the configuration running before it is
        again the one `retry` applies (the refused file would be refused again each time).
        Returns it, with the usernames known now, when that serves a route it did not."""
        if generation != self.generation or self._running is None:
            return None
        self._written = running = self._running
        newly = self._waiting_before & self._ids.keys()
        self._waiting_before = set()
        if not newly:
            return None
        quiet = {name for _, name in route_usernames(running) if name.lower() not in newly}
        return self.apply(running, quiet=quiet)

    def _last_known(self, username: str) -> int | None:
        if self._cursor is None:
            return None
        try:
            known = self._cursor.get_cursor(_CURSOR_PREFIX + username)
        except Exception as error:
            log.debug("the id of %s could not be read: %s", username, error)
            return None
        return int(known) if known is not None and known.lstrip("-").isdigit() else None

    def _bot_paused_s(self) -> float:
        """How long a pause of the bot the state holds still runs (0: none)."""
        if self._store is None:
            return 0.0
        try:
            until = self._store.pauses().get(BOT_SCOPE_KEY, 0.0)
        except Exception as error:
            log.debug("the stored pauses could not be read: %s", error)
            return 0.0
        return max(0.0, until - time.time())

    def _record_pause(self, wait_s: float) -> None:
        """A 429 answered to a lookup pauses the bot, in the state, so that the channel's
        start after it (and a restart) waits for its end too."""
        if self._store is None:
            return
        try:
            self._store.set_pause(BOT_SCOPE_KEY, time.time() + wait_s)
        except Exception as error:
            log.warning("could not keep the bot's pause in the state: %s", error)

    def _remember(self, username: str, chat_id: int) -> None:
        self._ids[username] = chat_id
        if self._cursor is None:
            return
        try:
            self._cursor.set_cursor(_CURSOR_PREFIX + username, str(chat_id))
        except Exception as error:
            # Only `taskcard status` reads it; serving goes on by the id in hand.
            log.warning("could not keep the chat id of %s in the state: %s", username, error)

    def unknown(self, config: ServiceConfig) -> list[str]:
        """The usernames of `config` not resolved yet."""
        return sorted({name.lower() for _, name in route_usernames(config)} - self._ids.keys())

    async def resolve(self, config: ServiceConfig) -> ServiceConfig:
        """`config` with each route's `@username` replaced by the chat's numeric id; a route
        whose username cannot be resolved is left out, with one error line naming it."""
        failures = await self._look_up(config, None, None)
        assert failures is not None  # no generation: never superseded
        return self.apply(config, failures)

    async def reload(
        self, config: ServiceConfig, generation: int, apply: Callable[[ServiceConfig], bool]
    ) -> bool:
        """The reload of `generation` (`config`, naming a username not resolved yet): ask
        Telegram, then `apply` the file, unless a later reload came first (its file wins:
        this one asks nothing, or applies nothing). A refused file leaves the running
        configuration, which now serves a username it waited for that this lookup resolved.
        """
        self._reloading += 1
        try:
            failures = await self._look_up(config, None, generation)
            if failures is None or generation != self.generation:
                log.info(
                    "a config reload that waited for Telegram (usernames) was superseded by a"
                    " later reload; the later file is the one applied"
                )
                return False
            if apply(self.apply(config, failures)):
                self.accepted(generation)
                return True
            running = self.refused(generation)
            if running is not None:
                apply(running)
            return False
        finally:
            self._reloading -= 1

    async def _look_up(
        self, config: ServiceConfig, only: set[str] | None, generation: int | None
    ) -> dict[str, ChannelError] | None:
        """Ask Telegram for the usernames of `config` not resolved yet (those in `only`):
        the answers that resolve none, by username. None: the reload of `generation` was
        superseded while it waited for an earlier lookup, and nothing was asked."""
        if self._lookup.locked():
            log.info("another lookup of Telegram usernames is under way; this one waits for it")
        async with self._lookup:
            if generation is not None and generation != self.generation:
                return None
            return await self._ask(config, only)

    async def _ask(self, config: ServiceConfig, only: set[str] | None) -> dict[str, ChannelError]:
        telegram = config.telegram
        if telegram is None:
            return {}
        missing = [name for name in self.unknown(config) if only is None or name in only]
        failures: dict[str, ChannelError] = {}
        token = self._env.get(telegram.token_env, "").strip()
        paused_s = self._bot_paused_s()
        if missing and token and paused_s > 0:
            # A pause of the bot (stored by an earlier run, or answered to a lookup): ask
            # nothing before its end, as the channel's own start does not.
            pause = RateLimited(paused_s, BOT_SCOPE_KEY, "a pause of the bot is running")
            failures = dict.fromkeys(missing, pause)
        elif missing and token:
            from taskcard.channels.telegram import import_client_library

            import_client_library()
            from taskcard.channels.telegram.usernames import look_up_usernames

            found = await look_up_usernames(telegram, token, missing)
            for name, answer in found.items():
                if isinstance(answer, ChannelError):
                    failures[name] = answer
                    if isinstance(answer, RateLimited):
                        self._record_pause(answer.retry_after_s)
                else:
                    self._remember(name, answer)
        self._waiting -= set(missing)
        self._asked_to_wait_s = 0.0
        for name, error in list(failures.items()):
            if not isinstance(error, Transient | RateLimited):
                continue
            if isinstance(error, RateLimited):
                self._asked_to_wait_s = max(self._asked_to_wait_s, error.retry_after_s)
            known = self._last_known(name)
            if known is None:
                self._waiting.add(name)
            else:
                # Telegram out of reach for now: the chat it named last time, rather than
                # no card there until it answers (a username rarely moves to another chat).
                self._ids[name] = known
                self._fallback[name] = (known, str(error))
                del failures[name]
        return failures

    async def retry(self, apply: Callable[[ServiceConfig], object], stop: asyncio.Event) -> None:
        """While a username of the running file could not be asked about (Telegram out of
        reach at the start or a reload), ask again, less often each time, and `apply` that
        file once it resolves: a network blip at the start does not cost the route until a
        reload."""
        backoff = Backoff(initial_s=RETRY_FIRST_S, max_s=RETRY_MAX_S)
        while self.waiting(self._written):
            delay_s = max(backoff.next_delay_s(), self._asked_to_wait_s)
            try:
                await asyncio.wait_for(stop.wait(), delay_s)
                return
            except TimeoutError:
                pass
            if self._reloading:
                continue  # that reload asks for them, and applies its own file
            written = self._written
            asked = self.waiting(written)
            if written is None or not asked:
                return  # a reload resolved them meanwhile, or no longer names them
            generation = self.generation
            failures = await self._look_up(written, asked, generation)
            if stop.is_set():
                return
            if failures is None or generation != self.generation or self._reloading:
                continue  # a reload came meanwhile: its file is the one to apply
            written = self._written
            if written is None or asked & self.waiting(written):
                continue  # not all answered yet: said once they are
            quiet = {n for _, n in route_usernames(written) if n.lower() not in asked}
            apply(self.apply(written, failures, quiet=quiet))

    def keep_asking(
        self, apply: Callable[[ServiceConfig], object], stop: asyncio.Event | None = None
    ) -> None:
        """Start `retry` in the background when a username waits and it does not run yet
        (`stop`, given once by the start, ends it)."""
        if stop is not None:
            self._stop = stop
        if not self.waiting(self._written) or self._stop is None:
            return
        if self._retrying is not None and not self._retrying.done():
            return
        self._retrying = asyncio.get_running_loop().create_task(
            self.retry(apply, self._stop), name="chat_usernames"
        )

    def apply(
        self,
        config: ServiceConfig,
        failures: Mapping[str, ChannelError] | None = None,
        *,
        quiet: set[str] | None = None,
    ) -> ServiceConfig:
        """`config` with the usernames resolved so far replaced by their ids; a route whose
        username is not known, or whose chat another route already names, is left out.
        Each is said in one line, except the usernames in `quiet` (said before, unchanged)."""
        telegram = config.telegram
        if telegram is None or not route_usernames(config):
            return config
        failures = failures or {}
        said = quiet or set()
        taken = {
            (route.chat_id, route.thread_id)
            for route in telegram.routes
            if route.chat_username is None
        }
        routes = []
        for index, route in enumerate(telegram.routes):
            username = route.chat_username
            if username is None:
                routes.append(route)
                continue
            where = f"telegram.routes[{index}].chat_id"
            chat_id = self._ids.get(username.lower())
            if chat_id is None:
                failure = failures.get(username.lower())
                why = str(failure) if failure is not None else "no bot token to ask Telegram"
                if username in said:
                    continue
                if username.lower() in self._waiting:
                    log.error(
                        "%s: %s could not be resolved for now (%s); this route is not served"
                        " until it is, the others are: Telegram is asked again shortly",
                        where,
                        username,
                        why,
                    )
                    continue
                log.error(
                    "%s: %s could not be resolved to a chat (%s); this route is not served,"
                    " the others are. Check the username, add the bot to that public channel"
                    " or supergroup, or write the chat's numeric id as `taskcard chats` lists"
                    " it, then reload (SIGHUP) or restart",
                    where,
                    username,
                    why,
                )
                continue
            if (chat_id, route.thread_id) in taken:
                if username in said:
                    continue
                log.error(
                    "%s: %s is chat %d, which another route already names; this route is not"
                    " served. Merge the two routes' agents into one route",
                    where,
                    username,
                    chat_id,
                )
                continue
            taken.add((chat_id, route.thread_id))
            fallback = self._fallback.pop(username.lower(), None)
            if fallback is not None:
                log.warning(
                    "%s: Telegram could not be asked about %s (%s); the chat it named last"
                    " time, %d, is used",
                    where,
                    username,
                    fallback[1],
                    chat_id,
                )
            elif username not in said:
                log.info("%s: %s is chat %d", where, username, chat_id)
            routes.append(route.model_copy(update={"chat_id": chat_id}))
        return config.model_copy(
            update={"telegram": telegram.model_copy(update={"routes": routes})}
        )
