"""`TelegramChannel`: the `Channel` interface over python-telegram-bot's `Bot`.

Deliberately thin: no rate limiter, no retries, no sleeps. The service's route scheduler
owns pacing, so this class only declares which scopes a request consumes, performs exactly
one request (plus one plain-text retry when Telegram rejects our entities) and translates
every PTB exception once (`channels.telegram.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from telegram import Bot, BotCommand
from telegram import error as tg
from telegram.request import BaseRequest

from taskcard.channels.base import (
    BoardView,
    CardView,
    Channel,
    ChatRef,
    CommandSink,
    CursorStore,
    Operation,
    Outgoing,
    RateScope,
    ReplyTo,
)
from taskcard.channels.errors import (
    ChannelError,
    MessageGone,
    Permanent,
    RateLimited,
    Transient,
    without_secrets,
)
from taskcard.channels.telegram import moves, render, scopes
from taskcard.channels.telegram.commands import (
    CommandPoller,
    FloodAwarePollRequest,
    LeanPollRequest,
    moved_command,
)
from taskcard.channels.telegram.config import TelegramConfig
from taskcard.channels.telegram.errors import (
    ChatGone,
    ChatUpgraded,
    ParseEntitiesFailed,
    ThreadNotFound,
    translate,
)
from taskcard.channels.telegram.http11 import LeanRequest, proxy_configured
from taskcard.channels.telegram.request import FloodAwareRequest, FloodWait
from taskcard.channels.telegram.scopes import BOT_SCOPE_KEY, MENU_SCOPE_KEY, chat_scope_key
from taskcard.channels.telegram.topics import TopicNames

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Requests to different chats run concurrently, one at a time per chat lane; the scheduler
# bounds how many. 64 keep-alive connections carry far more than Telegram's 30 requests a
# second at any plausible round trip, and bound the sockets a large fleet can hold open;
# a request that finds all of them busy waits (its pool timeout) rather than open more.
_POOL_SIZE = 64
# Chats whose message scopes are kept (`TelegramChannel.rate_scopes`); past that many (a bot
# answering commands in many chats) the kept ones are dropped and built again when asked.
_KEPT_SCOPES = 4096
_NO_PREVIEW = {"is_disabled": True}
# The bot's command menu (the "/" button): people find `/taskcard` without reading docs.
MENU_COMMANDS = (
    BotCommand("taskcard", "show the task cards' state; on, off, board, cards, help, or 1-10 rows"),
    BotCommand("tell", "send text to an agent: /tell AGENT TEXT"),
)


def _api_chat_id(chat: ChatRef) -> int | str:
    """Numeric ids go as ints; `@channelname` style ids are passed through."""
    return _api_id(chat.chat_id)


def _api_id(chat_id: str) -> int | str:
    try:
        return int(chat_id)
    except ValueError:
        return chat_id


def _is_private(chat: ChatRef) -> bool:
    """Private chats have positive ids; groups, supergroups and channels negative ones."""
    chat_id = _api_chat_id(chat)
    return isinstance(chat_id, int) and chat_id > 0


def _numeric(value: str, error: type[ChannelError], what: str) -> int:
    """Telegram ids are integers; a stored id that is not one can never be used."""
    try:
        return int(value)
    except ValueError:
        raise error(f"{what} {value!r} is not a Telegram id") from None


def _raw_params(payload: Mapping[str, Any], with_entities: bool) -> dict[str, Any]:
    """Entities and link preview options as the JSON the Bot API takes, passed to PTB as
    `api_kwargs`: building `MessageEntity` objects only for PTB to turn them back into
    dicts cost more CPU per edit than the HTTP exchange itself. The entities are already
    in that shape (`render.Entity.to_api`), so they go as they are."""
    params: dict[str, Any] = {"link_preview_options": _NO_PREVIEW}
    raw = payload.get("entities") if with_entities else None
    if raw:
        params["entities"] = raw
    return params


class _TokenRedactor(logging.Filter):
    """Rewrites records that contain the bot token.

    httpx logs every request URL at INFO, and a Bot API URL contains the token
    (`/bot<token>/method`): without this, an operator running at INFO would write the
    credential into the service log.
    """

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._token:
            return True
        message = record.getMessage()
        if self._token in message:
            record.msg = message.replace(self._token, "<token>")
            record.args = None
        return True


# Loggers that may print a Bot API URL. A logger's filters do not apply to records of its
# children, so each logger that emits such records is named.
_URL_LOGGERS = (
    "httpx",
    "httpcore",
    "telegram",
    "telegram.Bot",
    "telegram.request.BaseRequest",
    "telegram.request.HTTPXRequest",
)


class TelegramChannel(Channel):
    """One Telegram bot as a chat transport."""

    name = "telegram"

    def __init__(self, config: TelegramConfig, token: str, cursor: CursorStore) -> None:
        self._config = config
        self._token = token
        self._cursor = cursor
        self._bot: Bot | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self._username = ""
        self._redactor = _TokenRedactor(token)
        self.ambiguous_send_hold_s = config.ambiguous_send_hold_s
        self._moves = moves.ChatMoves(cursor)
        self._topics = TopicNames(cursor)
        self._on_command: CommandSink | None = None
        self._bot_scope = config.limits.bot.scope(BOT_SCOPE_KEY)
        self._message_scopes: dict[tuple[str, str | None], tuple[RateScope, ...]] = {}
        # The menu request a 429 put off at the start (`start_put_off`, `finish_start`).
        self._put_off: RateLimited | None = None
        self._menu_owed = False

    @property
    def bot_username(self) -> str:
        """This bot's username (from getMe), empty before `start`."""
        return self._username

    def _make_bot(self) -> Bot:
        timeout_s = self._config.request_timeout_s
        request: BaseRequest
        poll_request: BaseRequest
        if proxy_configured(self._config.api_base_url):
            # Our lean transport has no proxy support; PTB's httpx transport reads the
            # proxy variables of the environment, as it always did.
            request = FloodAwareRequest(
                connection_pool_size=_POOL_SIZE,
                read_timeout=timeout_s,
                write_timeout=timeout_s,
                connect_timeout=timeout_s,
                pool_timeout=timeout_s,
            )
            poll_request = FloodAwarePollRequest(
                connection_pool_size=1,
                read_timeout=timeout_s,
                write_timeout=timeout_s,
                connect_timeout=timeout_s,
                pool_timeout=timeout_s,
            )
        else:
            # The channel reads only a sent message's id: both transports cut answers down
            # to it (`request.checked_success`).
            request = LeanRequest(pool_size=_POOL_SIZE, timeout_s=timeout_s)
            # Long polls get their own connection so they never hold one a request needs;
            # PTB adds the poll timeout to this read timeout.
            poll_request = LeanPollRequest(pool_size=1, timeout_s=timeout_s)
        return Bot(
            self._token,
            base_url=f"{self._config.api_base_url.rstrip('/')}/bot",
            request=request,
            get_updates_request=poll_request,
        )

    async def start(self, on_command: CommandSink) -> None:
        if self._bot is not None:
            raise RuntimeError("TelegramChannel.start called twice")
        for name in _URL_LOGGERS:
            logging.getLogger(name).addFilter(self._redactor)
        if not self._token.strip():
            self._remove_redactor()
            raise Permanent("no Telegram bot token: set the variable named by telegram.token_env")
        bot = self._make_bot()
        try:
            await bot.initialize()
        except tg.TelegramError as exc:
            with contextlib.suppress(tg.TelegramError):
                await bot.shutdown()
            self._remove_redactor()
            raise self._scrub(translate(exc, BOT_SCOPE_KEY)) from None
        self._bot = bot
        self._username = bot.username
        self._on_command = on_command
        _log.info("Telegram bot @%s connected", self._username)
        for chat_id in {str(r.chat_id) for r in self._config.routes} | {
            str(c) for c in self._config.origin_chats
        }:
            self._moves.load(chat_id)
        if self._config.commands:
            # Optional: told to wait, the start goes on without the menu (`finish_start`).
            self._put_off = await self._register_menu(bot)
            self._menu_owed = self._put_off is not None
            poller = CommandPoller(
                bot,
                self._username,
                self._cursor,
                on_command,
                self._config.poll_timeout_s,
                gate=self.poll_gate,
                moves=self._moves,
                topics=self._topics,
            )
            self._poll_task = asyncio.create_task(poller.run(), name="telegram-command-poll")

    async def _register_menu(self, bot: Bot) -> RateLimited | None:
        """Put `/taskcard` in the command menu; a failure costs only the menu, not the start.
        A 429 is returned, over the menu's own scope: Telegram does not say which limit it
        hit, and a pause of the bot would hold every card for the sake of a menu (if it was
        the bot's limit, the cards' own requests are answered 429 and paused in turn)."""
        try:
            await bot.set_my_commands(MENU_COMMANDS)
        except (tg.RetryAfter, FloodWait) as exc:
            error = self._scrub(translate(exc, MENU_SCOPE_KEY))
            assert isinstance(error, RateLimited)
            _log.info("the /taskcard menu command is put off: %s", error)
            return error
        except tg.TelegramError as exc:
            _log.warning("registering the /taskcard menu command failed: %s", type(exc).__name__)
        return None

    def start_put_off(self) -> RateLimited | None:
        error, self._put_off = self._put_off, None
        return error

    async def finish_start(self) -> RateLimited | None:
        """Set the command menu a 429 put off at the start."""
        if not self._menu_owed or self._bot is None:
            return None
        error = await self._register_menu(self._bot)
        self._menu_owed = error is not None
        return error

    async def stop(self) -> None:
        task, self._poll_task = self._poll_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                # A poller that died must not turn a clean stop into a failed one.
                _log.exception("the Telegram command poller had failed")
        bot, self._bot = self._bot, None
        if bot is not None:
            try:
                await bot.shutdown()
            except tg.TelegramError as exc:
                _log.warning("closing the Telegram connection failed: %s", type(exc).__name__)
        self._remove_redactor()

    def _remove_redactor(self) -> None:
        for name in _URL_LOGGERS:
            logging.getLogger(name).removeFilter(self._redactor)

    def topic_name(self, chat: ChatRef) -> str | None:
        """The forum topic's name as the poll learnt it (`TopicNames`: kept in the cursor
        store, so known after a restart and to every instance of a cluster), cleaned, with any
        `@` or `/` in it defused: a name is a member's text, never a mention or a tappable
        command in the service's words."""
        if chat.thread_id is None:
            return None
        name = self._topics.get(chat.chat_id, chat.thread_id)
        return None if name is None else render.defuse_mentions(render.RichText(name)).text

    def render_card(self, view: CardView) -> Outgoing:
        return render.render_card(view)

    def render_text(self, text: str) -> Outgoing:
        return render.render_text(text)

    def render_own_text(self, text: str) -> Outgoing:
        return render.render_text(text, commands=True)

    @classmethod
    def scope_covers(cls, scope: str, chat: ChatRef, message_id: str | None) -> bool:
        return scopes.covers(scope, chat, message_id)

    @classmethod
    def describe_scope(cls, scope: str) -> str | None:
        return scopes.describe(scope)

    def render_board(self, view: BoardView) -> Outgoing:
        return render.render_board(view)

    def board_fits(self, view: BoardView) -> bool:
        return render.board_fits(view)

    def start_scopes(self) -> tuple[str, ...]:
        """`getMe` (and the optional `setMyCommands`) name no chat: only a pause of the bot
        holds them up."""
        return (BOT_SCOPE_KEY,)

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        """The chat's and the bot's buckets. Asked twice per request, so each chat's are
        built once: they depend only on the chat and on the limits, which stay as configured
        for the channel's life (a reload cannot change them: that takes a restart)."""
        if operation in ("delete", "pin"):
            # Service actions, not messages: only the bot-wide request budget applies.
            return (self._bot_scope,)
        # Kept by the chat's fields: a `ChatRef` key would hash through its dataclass
        # `__hash__`, a Python call on each of the two asks.
        key = (chat.chat_id, chat.thread_id)
        scopes = self._message_scopes.get(key)
        if scopes is None:
            limits = self._config.limits
            chat_limit = limits.private_chat if _is_private(chat) else limits.group_chat
            scopes = (chat_limit.scope(chat_scope_key(chat)), self._bot_scope)
            if len(self._message_scopes) >= _KEPT_SCOPES:
                self._message_scopes.clear()
            self._message_scopes[key] = scopes
        return scopes

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        del idempotency_key  # the Bot API cannot deduplicate sends; see ambiguous_send_hold_s
        del reply_to  # a forum topic is in `chat`; answers are not quoted
        bot = self._require_bot()
        thread_id = (
            None if chat.thread_id is None else _numeric(chat.thread_id, Permanent, "topic id")
        )

        where = self._moves.target(chat.chat_id)

        async def attempt(with_entities: bool) -> str:
            sent = await bot.send_message(
                chat_id=_api_chat_id(chat) if where is None else _api_id(where),
                text=self._text(message, with_entities),
                message_thread_id=thread_id,
                api_kwargs=_raw_params(message.payload, with_entities),
                # A slow answer is awaited rather than given up on: giving up cannot take
                # the message back, and a retry would post a second copy.
                read_timeout=self._config.send_timeout_s,
                write_timeout=self._config.send_timeout_s,
            )
            number = str(sent.message_id)
            return number if where is None else moves.qualified(number, where)

        try:
            return await self._with_plain_fallback(chat, attempt)
        except ChatUpgraded:
            if where is not None:
                raise
            # Refused before anything was posted: once more, to the supergroup it became.
            where = self._moves.target(chat.chat_id)
            return await self._with_plain_fallback(chat, attempt)

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        bot = self._require_bot()
        where, numeric_id = self._message_in(chat, message_id, MessageGone)

        # Every card change is an edit: the attempt hands PTB's request on to be awaited,
        # a coroutine fewer on the way there and back.
        def attempt(with_entities: bool) -> Awaitable[Any]:
            # editMessageText has no thread parameter: a message id is unique in its chat.
            return bot.edit_message_text(
                text=self._text(message, with_entities),
                chat_id=where,
                message_id=numeric_id,
                api_kwargs=_raw_params(message.payload, with_entities),
            )

        await self._with_plain_fallback(chat, attempt)

    async def delete(self, chat: ChatRef, message_id: str) -> None:
        bot = self._require_bot()
        try:
            where, numeric_id = self._message_in(chat, message_id, MessageGone)
            await self._call(chat, bot.delete_message(where, numeric_id))
        except MessageGone:
            return

    async def pin(self, chat: ChatRef, message_id: str) -> None:
        bot = self._require_bot()
        where, numeric_id = self._message_in(chat, message_id, Permanent)
        await self._call(chat, bot.pin_chat_message(where, numeric_id, disable_notification=True))

    def posted_after_move(self, chat: ChatRef, message_id: str) -> bool:
        """A qualified id (`MESSAGE@CHAT`) names a message of the supergroup the group became;
        a plain one, of the chat as first known (see `_message_in`)."""
        del chat
        return moves.split_message_id(message_id)[1] is not None

    def _message_in(
        self, chat: ChatRef, message_id: str, error: type[ChannelError]
    ) -> tuple[int | str, int]:
        """The chat a message lives in and its number. A plain id in a group that became a
        supergroup names a message of the old group, which Telegram keeps read-only: gone
        for us, and never to be confused with the supergroup's message of the same number."""
        number, where = moves.split_message_id(message_id)
        if where is None and self._moves.target(chat.chat_id) is not None:
            raise MessageGone(f"message {number} stays in the group upgraded to a supergroup")
        chat_id = _api_chat_id(chat) if where is None else _api_id(where)
        return chat_id, _numeric(number, error, "message id")

    def _require_bot(self) -> Bot:
        if self._bot is None:
            raise Permanent("the Telegram channel is not started")
        return self._bot

    @staticmethod
    def _text(message: Outgoing, with_entities: bool = True) -> str:
        text = str(message.payload.get("text", message.text))
        if not with_entities and message.payload.get("entities"):
            text = render.plain_fallback(text)
        return text if text.strip() else "…"

    async def _with_plain_fallback(
        self, chat: ChatRef, attempt: Callable[[bool], Awaitable[_T]]
    ) -> _T:
        """One request; if Telegram cannot parse our entities, once more as plain text."""
        try:
            return await self._call(chat, attempt(True))
        except ParseEntitiesFailed:
            _log.warning("Telegram rejected message entities in chat %s; sending plain", chat)
            return await self._call(chat, attempt(False))

    async def _call(self, chat: ChatRef, request: Awaitable[_T]) -> _T:
        try:
            return await request
        except tg.TelegramError as exc:
            error = self._scrub(translate(exc, chat_scope_key(chat)))
        except (TimeoutError, OSError) as exc:
            raise Transient(f"Telegram request failed: {type(exc).__name__}") from None
        if isinstance(error, ChatUpgraded):
            await self._chat_moved(chat.chat_id, error.new_chat_id)
        elif isinstance(error, ChatGone):
            self._topics.forget(chat.chat_id)
        elif isinstance(error, ThreadNotFound) and chat.thread_id is not None:
            self._topics.forget(chat.chat_id, chat.thread_id)
        raise error

    async def _chat_moved(self, old: str, new: str) -> None:
        """Remember the move and tell the service once, so every route of the chat shows
        its card in the supergroup now, not only at its agent's next change."""
        if not self._moves.learn(old, new) or self._on_command is None:
            return
        try:
            await self._on_command(moved_command(old, new))
        except Exception:
            _log.exception("handling the upgrade of Telegram group %s failed", old)

    def _scrub(self, error: ChannelError) -> ChannelError:
        """Belt and braces: no error leaves this class carrying the token, in its message or
        in a text it keeps for later (a `Forbidden.reason` shown by `taskcard status`). An
        answer may echo the request URL, and PTB capitalizes a bad request's description
        (lowercasing the rest), so the token is looked for in any case and URL-encoded."""
        if not self._token:
            return error
        secrets = (self._token,)
        error.args = tuple(
            without_secrets(arg, secrets, "<token>") if isinstance(arg, str) else arg
            for arg in error.args
        )
        for name, value in vars(error).items():
            if isinstance(value, str):
                setattr(error, name, without_secrets(value, secrets, "<token>"))
        return error
