"""`FeishuChannel`: resident cards in Feishu / Lark chats through lark-oapi.

Requests are lark-oapi's request models (`CreateMessageRequest`, `PatchMessageRequest`, ...)
sent through our pooled `LarkTransport` with a tenant token from `TenantTokenSource`:
lark-oapi's own async calls open a new HTTP client per request and fetch tokens with
blocking `requests`, both on the event loop (see `transport` and `token`). A card is
sent as `msg_type = interactive` and updated with `PATCH im/v1/messages/:id`, never with
the text-edit PUT (limited to 20 edits per message). Every answer passes through
`errors.translate` once; nothing here sleeps or retries (the route scheduler paces).

Commands arrive over the long connection (`longconn`), the HTTP callback (`webhook`) or
not at all, per `config.events`. Both paths end in `_accept_document` / `_dispatch` on our
loop, where duplicates are dropped and each command runs as an owned task. A group command
must mention the bot, so `start` asks Feishu for the bot's open_id (`GET bot/v3/info`).

A send carries the caller's idempotency key as the create body's `uuid`: Feishu posts at
most one message per uuid within an hour, so a send retried after a timeout returns the
first message instead of posting a second card.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import urllib.parse
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, TypeVar

from lark_oapi.api.im.v1 import (
    CreateMessageRequest,
    CreateMessageRequestBody,
    CreateMessageResponse,
    CreatePinRequest,
    CreatePinRequestBody,
    CreatePinResponse,
    DeleteMessageRequest,
    DeleteMessageResponse,
    PatchMessageRequest,
    PatchMessageRequestBody,
    PatchMessageResponse,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
    ReplyMessageResponse,
)
from lark_oapi.core.enum import AccessTokenType, HttpMethod
from lark_oapi.core.model import BaseRequest, BaseResponse

from taskcard.channels.base import (
    BoardView,
    CardView,
    Channel,
    ChatRef,
    CommandSink,
    CursorStore,
    IncomingCommand,
    Operation,
    Outgoing,
    RateScope,
    ReplyTo,
)
from taskcard.channels.errors import (
    AppUnavailable,
    ChannelError,
    MessageGone,
    NotModified,
    Permanent,
    RateLimited,
    Transient,
    without_secrets,
)
from taskcard.channels.feishu import card, scopes
from taskcard.channels.feishu.config import FeishuConfig
from taskcard.channels.feishu.errors import (
    TOKEN_INVALID,
    FeishuOperation,
    answer_code,
    translate,
)
from taskcard.channels.feishu.events import (
    MESSAGE_EVENT,
    DecodedEvent,
    EventNotRecorded,
    SeenEvents,
    command_from_event,
    duplicate_key,
)
from taskcard.channels.feishu.longconn import LongConnection
from taskcard.channels.feishu.scopes import (
    APP_MINUTE_SCOPE,
    APP_SCOPE,
    chat_scope,
    message_scope,
)
from taskcard.channels.feishu.token import TenantTokenSource
from taskcard.channels.feishu.transport import LarkTransport
from taskcard.channels.feishu.webhook import WebhookServer

log = logging.getLogger(__name__)

BOT_INFO_URI = "/open-apis/bot/v3/info"
# Feishu's bound on the create body's `uuid` (characters).
UUID_MAX_CHARS = 50
SHOWN_CAPACITY = 4096
# How long the long connection's thread waits for our loop to take an event: past Feishu's
# 3 s for an answer, it delivers the event again anyway.
ACCEPT_TIMEOUT_S = 5.0
Response = TypeVar("Response", bound=BaseResponse)
# How long an answer refusing the whole app (`errors.APP_UNAVAILABLE`) holds it: the first
# time, then twice as long on each such answer in a row, up to the last (a few requests an
# hour while the cause lasts, none in a loop; `limits.max_pause_s` bounds it too).
APP_HOLD_FIRST_S = 15.0
APP_HOLD_MAX_S = 600.0


def check_domain(domain: str) -> str:
    """The Open API origin, refusing plain HTTP to anything but loopback (the app secret
    travels in the token request)."""
    parts = urllib.parse.urlsplit(domain)
    loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
        raise ValueError(f"feishu.domain must be https (or http on loopback), got {domain!r}")
    if not parts.netloc or parts.path.strip("/") or parts.query:
        raise ValueError(f"feishu.domain must be an origin like https://open.feishu.cn: {domain!r}")
    return f"{parts.scheme}://{parts.netloc}"


def send_uuid(idempotency_key: str) -> str:
    """The create body's `uuid` for an idempotency key: the key itself when it fits Feishu's
    50 characters of plain ASCII, else a digest of it (the same key, the same uuid)."""
    if len(idempotency_key) <= UUID_MAX_CHARS and idempotency_key.isascii():
        return idempotency_key
    # "h-" and 48 hex digits: 50 characters.
    return "h-" + hashlib.blake2b(idempotency_key.encode("utf-8"), digest_size=24).hexdigest()


def bot_identity_from(answer: bytes | None) -> tuple[str | None, str | None]:
    """The bot's open_id and name in a `GET bot/v3/info` answer body:
    `{"code": 0, "msg": "ok", "bot": {"open_id": "ou_...", "app_name": ...}}` (beside `code`,
    not under `data`, so lark-oapi's generic response model does not carry it)."""
    try:
        document = json.loads(answer or b"")
    except (ValueError, RecursionError):
        return None, None
    bot = document.get("bot") if isinstance(document, dict) else None
    found = [bot.get(field) if isinstance(bot, dict) else None for field in ("open_id", "app_name")]
    open_id, name = (value if isinstance(value, str) and value else None for value in found)
    return open_id, name


class FeishuChannel(Channel):
    """The `Channel` for Feishu / Lark; see the module docstring."""

    name = "feishu"
    replies_name_author = False  # an event carries the parent's id alone

    def __init__(
        self,
        config: FeishuConfig,
        app_id: str,
        app_secret: str,
        cursor: CursorStore,
        verification_token: str | None = None,
        encrypt_key: str | None = None,
    ) -> None:
        self._config = config
        self._app_id = app_id
        self._app_secret = app_secret
        self._verification_token = verification_token or None
        self._encrypt_key = encrypt_key or None
        self._domain = check_domain(config.domain)
        self._transport: LarkTransport | None = None
        self._tokens: TenantTokenSource | None = None
        self._seen = SeenEvents(config.replay_window_s(), cursor=cursor)
        self._on_command: CommandSink | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._webhook: WebhookServer | None = None
        self._long_connection: LongConnection | None = None
        self._started = False
        # Learned at `start`; None when Feishu would not tell (then any mention counts).
        self._bot_open_id: str | None = None
        # The app's name, for a command written as `/taskcard@Name`; None: such a suffix is
        # never taken for ours.
        self._bot_name: str | None = None
        # What each recent message shows (content digest), so an identical edit is reported
        # as `NotModified` like on Telegram: Feishu accepts an identical PATCH silently.
        self._shown: OrderedDict[str, str] = OrderedDict()
        # The bot info a 429 put off at the start (`start_put_off`, `finish_start`).
        self._put_off: RateLimited | None = None
        self._identity_owed = False
        # Answers refusing the whole app in a row (0: the last request was not refused so).
        self._app_refusals = 0

    # Lifecycle ----------------------------------------------------------------------------

    @property
    def webhook_port(self) -> int:
        """The port the HTTP callback listens on (useful with `port = 0`)."""
        if self._webhook is None:
            raise RuntimeError("the Feishu channel serves no webhook (events != 'webhook')")
        return self._webhook.port

    async def start(self, on_command: CommandSink) -> None:
        """Verify the app credentials (a tenant token), learn the bot's open_id when commands
        are on, then receive commands per `config.events`. On failure everything opened so
        far is closed again."""
        if self._started:
            return
        self._put_off, self._identity_owed = None, False  # of a start that failed later
        try:
            await self._token(self._token_source())
            if self._config.events != "none":
                self._bot_open_id, self._bot_name = await self._learn_bot_identity()
            self._on_command = on_command
            self._loop = asyncio.get_running_loop()
            if self._config.events == "webhook":
                server = WebhookServer(
                    self._config.webhook,
                    self._dispatch,
                    self._seen,
                    self._verification_token,
                    self._encrypt_key,
                    self._command_from,
                )
                await server.start()
                self._webhook = server
                log.info(
                    "feishu events over HTTP callback at %s:%d%s",
                    self._config.webhook.host,
                    server.port,
                    self._config.webhook.path,
                )
            elif self._config.events == "websocket":
                connection = LongConnection(
                    self._app_id, self._app_secret, self._domain, self._deliver_from_thread
                )
                connection.start()
                self._long_connection = connection
                log.info("feishu events over the long connection")
        except BaseException:
            await self.stop()
            raise
        self._started = True

    async def stop(self) -> None:
        webhook, self._webhook = self._webhook, None
        if webhook is not None:
            await webhook.stop()
        connection, self._long_connection = self._long_connection, None
        if connection is not None:
            await connection.stop()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        transport, self._transport, self._tokens = self._transport, None, None
        if transport is not None:
            await transport.aclose()
        self._started = False

    def _open_transport(self) -> LarkTransport:
        if self._transport is None:
            self._transport = LarkTransport(self._domain, self._config.request_timeout_s)
            self._tokens = TenantTokenSource(self._transport, self._app_id, self._app_secret)
        return self._transport

    def _token_source(self) -> TenantTokenSource:
        self._open_transport()
        assert self._tokens is not None
        return self._tokens

    async def _learn_bot_identity(self) -> tuple[str | None, str | None]:
        """The bot's open_id and name from `GET bot/v3/info`, or None (logged) when the call
        fails: commands then still work, with any mention taken as the bot's."""
        request = (
            BaseRequest.builder()
            .http_method(HttpMethod.GET)
            .uri(BOT_INFO_URI)
            .token_types({AccessTokenType.TENANT})
            .build()
        )
        try:
            # About no message: any failure is only logged, so "send" (no message-gone
            # reading) is as good as any operation here.
            response = await self._call(
                request, BaseResponse, narrow_scope=APP_SCOPE, operation="send"
            )
        except RateLimited as error:
            # The app's limit: the service pauses the app (the cards wait for it as for any
            # other 99991400) and asks again once it has passed (`finish_start`); meanwhile
            # any mention counts, as when the info is unavailable.
            log.info("feishu bot info put off (%s); any mention counts in groups meanwhile", error)
            self._put_off, self._identity_owed = error, True
            return None, None
        except ChannelError as error:
            log.info("feishu bot info unavailable (%s); any mention counts in groups", error)
            return None, None
        identity = bot_identity_from(response.raw.content if response.raw is not None else None)
        if identity[0] is None:
            log.info("feishu bot info has no open_id; any mention counts in groups")
        return identity

    def start_put_off(self) -> RateLimited | None:
        error, self._put_off = self._put_off, None
        return error

    async def finish_start(self) -> RateLimited | None:
        """Learn the bot's identity a 429 put off at the start."""
        if not self._identity_owed or not self._started:
            return None
        self._identity_owed = False
        open_id, name = await self._learn_bot_identity()
        error = self.start_put_off()  # set again (and owed again) by a new 429
        if error is None:
            self._bot_open_id, self._bot_name = open_id, name
        return error

    # Incoming commands --------------------------------------------------------------------

    def _deliver_from_thread(self, document: dict[str, Any]) -> None:
        """Called in the long connection's thread: hand `document` to our loop and return
        once it is taken there. `EventNotRecorded` when it was not (the store failed, the
        service is stopping, the loop did not answer in time): the long connection then
        answers 500, and Feishu delivers the event again. It used to be acknowledged before
        our loop even saw it, so an event the store could not record was lost."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise EventNotRecorded("feishu event arrived while the service is stopping")
        try:
            taken = asyncio.run_coroutine_threadsafe(self._accept_soon(document), loop)
        except RuntimeError:
            raise EventNotRecorded("feishu event arrived while the service stops") from None
        try:
            taken.result(timeout=ACCEPT_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            taken.cancel()
            raise EventNotRecorded(
                f"feishu event not taken within {ACCEPT_TIMEOUT_S:g} s; Feishu delivers it again"
            ) from None
        except concurrent.futures.CancelledError:
            raise EventNotRecorded("feishu event arrived while the service stops") from None

    async def _accept_soon(self, document: Mapping[str, Any]) -> None:
        try:
            self._accept_document(document)
        except EventNotRecorded as error:
            log.warning("%s", error)
            raise

    def _accept_document(self, document: Mapping[str, Any]) -> None:
        header = document.get("header")
        event_id = header.get("event_id") if isinstance(header, dict) else None
        event = DecodedEvent(None, event_id if isinstance(event_id, str) else None, None, document)
        if not self._seen.first_time(duplicate_key(event)):
            return
        command = self._command_from(document)
        if command is not None:
            self._dispatch(command)

    def _command_from(self, document: Mapping[str, Any]) -> IncomingCommand | None:
        header = document.get("header")
        event_type = header.get("event_type") if isinstance(header, dict) else None
        if event_type != MESSAGE_EVENT:
            # An event the app receives (subscribed for another use, or sent to every app)
            # that nothing here handles: acknowledged like any other, and ignored.
            log.debug("feishu event of type %.80r: nothing here handles it; ignored", event_type)
            return None
        return command_from_event(document, self._bot_open_id, self._bot_name)

    def _dispatch(self, command: IncomingCommand) -> None:
        sink = self._on_command
        if sink is None:
            return
        task = asyncio.get_running_loop().create_task(self._run_command(sink, command))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _run_command(sink: CommandSink, command: IncomingCommand) -> None:
        try:
            await sink(command)
        except ChannelError as error:
            log.warning("feishu command in chat %s failed: %s", command.chat, error)
        except Exception:
            log.exception("feishu command handler failed in chat %s", command.chat)

    # Rendering and pacing -----------------------------------------------------------------

    def render_card(self, view: CardView) -> Outgoing:
        return card.render_card(view)

    def render_text(self, text: str) -> Outgoing:
        return card.render_text(text)

    @classmethod
    def scope_covers(cls, scope: str, chat: ChatRef, message_id: str | None) -> bool:
        return scopes.covers(scope, chat, message_id)

    @classmethod
    def describe_scope(cls, scope: str) -> str | None:
        return scopes.describe(scope)

    def render_board(self, view: BoardView) -> Outgoing:
        return card.render_board(view)

    def board_fits(self, view: BoardView) -> bool:
        return card.board_fits(view)

    def start_scopes(self) -> tuple[str, ...]:
        """The tenant token (and the optional bot info) count against the app's limits, like
        every other call of the app (Feishu answers the token request with 99991400 too)."""
        return (APP_SCOPE, APP_MINUTE_SCOPE)

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        limits = self._config.limits
        app = (limits.app.scope(APP_SCOPE), limits.app_minute.scope(APP_MINUTE_SCOPE))
        if operation == "edit" and message_id is not None:
            return (limits.message_update.scope(message_scope(message_id)), *app)
        if operation == "send":
            return (limits.chat_send.scope(chat_scope(chat.chat_id)), *app)
        return app

    # Requests -----------------------------------------------------------------------------

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        msg_type, content = _payload(message)
        if reply_to is not None:
            try:
                return await self._reply(chat, reply_to, msg_type, content, idempotency_key)
            except (MessageGone, Permanent) as error:
                # The command was recalled or deleted (or cannot take a reply): answer in the
                # chat instead. Nothing was posted, so the same uuid is free for the send.
                log.info("feishu: replying in chat %s failed (%s); posting instead", chat, error)
        builder = (
            CreateMessageRequestBody.builder()
            .receive_id(chat.chat_id)
            .msg_type(msg_type)
            .content(content)
        )
        if idempotency_key is not None:
            builder = builder.uuid(send_uuid(idempotency_key))
        request = (
            CreateMessageRequest.builder()
            .receive_id_type("chat_id")
            .request_body(builder.build())
            .build()
        )
        response = await self._call(
            request, CreateMessageResponse, narrow_scope=chat_scope(chat.chat_id), operation="send"
        )
        return self._sent_id(response.data, content, idempotency_key)

    async def _reply(
        self,
        chat: ChatRef,
        reply_to: ReplyTo,
        msg_type: str,
        content: str,
        idempotency_key: str | None,
    ) -> str:
        """Post as a reply to the command message (`POST messages/:id/reply`), in its thread
        when it was written in one, deduplicated by the same `uuid` as a send."""
        builder = (
            ReplyMessageRequestBody.builder()
            .msg_type(msg_type)
            .content(content)
            .reply_in_thread(reply_to.thread_id is not None)
        )
        if idempotency_key is not None:
            builder = builder.uuid(send_uuid(idempotency_key))
        request = (
            ReplyMessageRequest.builder()
            .message_id(reply_to.message_id)
            .request_body(builder.build())
            .build()
        )
        # The same limits as a send: Feishu counts a reply against the chat's 5 per second.
        response = await self._call(
            request, ReplyMessageResponse, narrow_scope=chat_scope(chat.chat_id), operation="reply"
        )
        return self._sent_id(response.data, content, idempotency_key)

    def _sent_id(self, data: object, content: str, idempotency_key: str | None) -> str:
        """The id of a posted message from the answer's `data`; remembered as showing
        `content` unless a key may have answered with an earlier post."""
        message_id = getattr(data, "message_id", None)
        if not isinstance(message_id, str) or not message_id:
            raise Transient("feishu: message created without an id in the answer")
        if idempotency_key is None:
            # With a key, Feishu may answer with the message first posted under it, whose
            # content can be older than this request's: do not claim to know what it shows.
            self._remember(message_id, content)
        return message_id

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        msg_type, content = _payload(message)
        if msg_type != "interactive":
            raise Permanent("feishu: only interactive cards can be updated in place")
        request = (
            PatchMessageRequest.builder()
            .message_id(message_id)
            .request_body(PatchMessageRequestBody.builder().content(content).build())
            .build()
        )
        if self._shown.get(message_id) == _digest(content):
            raise NotModified("feishu: the card already shows this content")
        await self._call(
            request, PatchMessageResponse, narrow_scope=message_scope(message_id), operation="edit"
        )
        self._remember(message_id, content)

    async def delete(self, chat: ChatRef, message_id: str) -> None:
        request = DeleteMessageRequest.builder().message_id(message_id).build()
        # A message already gone is what `delete` wants: not an error.
        with contextlib.suppress(MessageGone):
            await self._call(
                request,
                DeleteMessageResponse,
                narrow_scope=message_scope(message_id),
                operation="delete",
            )
        self._shown.pop(message_id, None)

    async def pin(self, chat: ChatRef, message_id: str) -> None:
        request = (
            CreatePinRequest.builder()
            .request_body(CreatePinRequestBody.builder().message_id(message_id).build())
            .build()
        )
        await self._call(
            request, CreatePinResponse, narrow_scope=chat_scope(chat.chat_id), operation="pin"
        )

    def _app_hold_s(self) -> float:
        """How long an answer refusing the whole app holds it now: growing with each such
        answer in a row."""
        return min(APP_HOLD_FIRST_S * 2.0 ** min(self._app_refusals, 16), APP_HOLD_MAX_S)

    async def _token(self, tokens: TenantTokenSource) -> str:
        """The tenant token; a token request refused for the whole app holds it as any
        other call of it would (`AppUnavailable`, the wait grown here)."""
        hold_s = self._app_hold_s()
        try:
            return await tokens.get()
        except AppUnavailable as refused:
            self._app_refusals += 1
            raise AppUnavailable(hold_s, refused.scope, refused.reason) from None

    def _remember(self, message_id: str, content: str) -> None:
        self._shown[message_id] = _digest(content)
        self._shown.move_to_end(message_id)
        while len(self._shown) > SHOWN_CAPACITY:
            self._shown.popitem(last=False)

    async def _call(
        self,
        request: BaseRequest,
        response_type: type[Response],
        *,
        narrow_scope: str,
        operation: FeishuOperation,
    ) -> Response:
        """One request, its answer translated once; a refused token is dropped."""
        tokens = self._token_source()
        transport = self._open_transport()
        hold_s = self._app_hold_s()
        token = await self._token(tokens)
        response = await transport.execute(request, response_type, token)
        raw = response.raw
        status = raw.status_code if raw is not None and raw.status_code is not None else 0
        headers: Mapping[str, str] = raw.headers if raw is not None else {}
        code = answer_code(response.code)
        if code in TOKEN_INVALID:
            tokens.invalidate()
        failure = translate(
            status=status,
            code=code,
            # Feishu's `msg` is text; a gateway's number or object is shown, never matched.
            # An answer quoting the request (its bearer token, the app secret) is stored as
            # a route's reason and shown by `taskcard status`: neither is kept.
            msg=(
                None
                if response.msg is None
                else without_secrets(str(response.msg), (token, self._app_secret))
            ),
            headers=headers,
            app_scope=APP_SCOPE,
            narrow_scope=narrow_scope,
            operation=operation,
            app_hold_s=hold_s,
        )
        if isinstance(failure, AppUnavailable):
            self._app_refusals += 1
        elif failure is None:
            self._app_refusals = 0
        if failure is not None:
            raise failure
        return response


def _digest(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def _payload(message: Outgoing) -> tuple[str, str]:
    """`msg_type` and `content` of a rendered message (or of plain text as a fallback)."""
    msg_type = message.payload.get("msg_type")
    content = message.payload.get("content")
    if isinstance(msg_type, str) and isinstance(content, str):
        return msg_type, content
    return "text", json.dumps({"text": message.text}, ensure_ascii=False)
