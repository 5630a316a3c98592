"""Telegram routes that name their chat by a public `@username`, resolved to numeric ids.

`config check` takes such a route once the username has the right shape; `serve` asks
Telegram for each chat's numeric id (getChat) before the channels are built, and runs with
a configuration that names every chat by its id, so the residents, a chat's settings and
the commands arriving from it are all keyed by that id. A username Telegram cannot resolve
(no such public chat, the bot not in it, Telegram out of reach) costs that route alone: one
error line names the route and the username, and every other route is served. A reload
(SIGHUP) reuses what the start learnt and asks only for usernames new to it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from taskcard.bridge.config import ServiceConfig
from taskcard.channels.base import CursorStore
from taskcard.channels.errors import ChannelError

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

    def __init__(self, env: Mapping[str, str], cursor: CursorStore | None = None) -> None:
        self._env = env
        self._cursor = cursor
        self._ids: dict[str, int] = {}

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
        telegram = config.telegram
        if telegram is None:
            return config
        missing = self.unknown(config)
        failures: dict[str, ChannelError] = {}
        token = self._env.get(telegram.token_env, "").strip()
        if missing and token:
            from taskcard.channels.telegram.usernames import look_up_usernames

            found = await look_up_usernames(telegram, token, missing)
            for name, answer in found.items():
                if isinstance(answer, ChannelError):
                    failures[name] = answer
                else:
                    self._remember(name, answer)
        return self.apply(config, failures)

    def apply(
        self, config: ServiceConfig, failures: Mapping[str, ChannelError] | None = None
    ) -> ServiceConfig:
        """`config` with the usernames resolved so far replaced by their ids; a route whose
        username is not known, or whose chat another route already names, is left out."""
        telegram = config.telegram
        if telegram is None or not route_usernames(config):
            return config
        failures = failures or {}
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
                log.error(
                    "%s: %s is chat %d, which another route already names; this route is not"
                    " served. Merge the two routes' agents into one route",
                    where,
                    username,
                    chat_id,
                )
                continue
            taken.add((chat_id, route.thread_id))
            log.info("%s: %s is chat %d", where, username, chat_id)
            routes.append(route.model_copy(update={"chat_id": chat_id}))
        return config.model_copy(
            update={"telegram": telegram.model_copy(update={"routes": routes})}
        )
