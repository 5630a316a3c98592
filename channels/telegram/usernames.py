"""Public chats named by `@username` in a route: their numeric ids, asked of the Bot API.

The Bot API takes a public channel's or public supergroup's `@username` wherever it takes a
`chat_id`, but the service keeps everything by the numeric id (the residents, a chat's
settings, the commands arriving from it): the id stays when the username changes, and
updates name the chat by it. So a username is resolved once, with getChat, when the service
starts (and when a reload names a new one), and the numeric id is used from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from telegram import Bot
from telegram import error as tg
from telegram.request import HTTPXRequest

from taskcard.channels.errors import ChannelError, Permanent, Transient
from taskcard.channels.telegram.config import TelegramConfig
from taskcard.channels.telegram.errors import translate
from taskcard.channels.telegram.scopes import BOT_SCOPE_KEY

# The kinds of chat a route's username may name (a public group is always a supergroup).
_SHARED_KINDS = frozenset({"channel", "supergroup", "group"})

# Usernames asked for at once (the bot's own limit is about 30 requests a second).
_MAX_PARALLEL = 8


async def look_up_usernames(
    config: TelegramConfig, token: str, usernames: Sequence[str]
) -> dict[str, int | ChannelError]:
    """Each `@username`'s numeric chat id, or the error Telegram answered for it (a chat
    not found, a bot not in the chat, a token refused, Telegram out of reach).

    Its own short-lived client: the channel's is made when the channel starts, after the
    routes (and so the chats they name) are settled. PTB's httpx transport reads the proxy
    variables of the environment, as the channel's does when a proxy is set.
    """
    timeout_s = config.request_timeout_s
    request = HTTPXRequest(
        connection_pool_size=max(1, min(len(usernames), _MAX_PARALLEL)),
        read_timeout=timeout_s,
        write_timeout=timeout_s,
        connect_timeout=timeout_s,
        pool_timeout=timeout_s,
    )
    bot = Bot(token, base_url=f"{config.api_base_url.rstrip('/')}/bot", request=request)
    # The whole lookup takes at most about one request's timeout, however many usernames:
    # the start (every channel's) waits for it. One not answered by then is Transient.
    deadline = asyncio.get_running_loop().time() + timeout_s
    late = Transient(f"Telegram did not answer within {timeout_s:g} s")
    try:
        await asyncio.wait_for(bot.initialize(), timeout_s)
    except TimeoutError:
        await _close(bot)
        return dict.fromkeys(usernames, late)
    except tg.TelegramError as exc:
        await _close(bot)
        return dict.fromkeys(usernames, translate(exc, BOT_SCOPE_KEY))
    tasks = {name: asyncio.create_task(_look_up(bot, name)) for name in usernames}
    try:
        left_s = max(0.1, deadline - asyncio.get_running_loop().time())
        await asyncio.wait(tasks.values(), timeout=left_s)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await _close(bot)
    return {
        name: task.result() if task.done() and not task.cancelled() else late
        for name, task in tasks.items()
    }


async def _look_up(bot: Bot, username: str) -> int | ChannelError:
    try:
        chat = await bot.get_chat(username)
    except tg.TelegramError as exc:
        return translate(exc, BOT_SCOPE_KEY)
    except (TypeError, ValueError, KeyError) as exc:
        # An answer PTB cannot read (a field it requires missing): that username alone is
        # not resolved; the start goes on.
        return Permanent(f"Telegram's answer could not be read ({type(exc).__name__})")
    if chat.type not in _SHARED_KINDS:
        # A person's or a bot's username: the cards of a fleet are not sent to one person's
        # private chat because a route's username happened to name them.
        return Permanent(
            f"it names a {chat.type} chat, not a public channel or supergroup"
            " (a route names a person's chat by its numeric id)"
        )
    return chat.id


async def _close(bot: Bot) -> None:
    with contextlib.suppress(tg.TelegramError):
        await bot.shutdown()
