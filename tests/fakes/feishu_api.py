"""A stateful fake of the Feishu Open API on 127.0.0.1, for tests and benches.

What it serves (real paths, real answer shapes `{"code": 0, "msg": "success", "data": ...}`):

- `POST /open-apis/auth/v3/tenant_access_token/internal`: tokens for the one configured app
  (a wrong secret is refused with code 10014); every other call needs `Bearer <token>`
  (missing: 99991661, unknown or expired: 99991663, or the code `refused_token_answer`
  names). As on Feishu, a request while the
  newest token has half an hour or more left answers that token again, its `expire` the
  seconds it has left; with less, a new one (the old stays valid until it expires). Tokens
  expire on the rate clock, so `advance_time` (for the 14-day window) does not expire
  them; `revoke_tokens` does.
- `GET /open-apis/bot/v3/info`: the bot's `open_id` (`bot_open_id`, also the id the
  command events mention), in Feishu's shape with `bot` beside `code`; switched off with
  `bot_info_available = False` (then 404, like a server without the route).
- `POST /open-apis/im/v1/messages?receive_id_type=chat_id`: text and interactive messages.
  Cards are validated (JSON object, card 2.0 needs `body.elements`) and bounded to 30 KB,
  text messages to 150 KB (230025). A body `uuid` (at most 50 characters, else 230001)
  deduplicates: the same uuid within an hour of the fake's wall clock answers the first
  message again, posting nothing. `delay_answers`, `hold_answers` and `drop_after_accept`
  post the message at once and answer late, not until released, or never (the connection
  closed): a client that gave up and sends again with the same uuid gets the first message.
- `POST /open-apis/im/v1/messages/:id/reply`: a reply to a message of the chat (the bot's
  own or a person's command from `command_event`), with the create body's `msg_type`,
  `content` and `uuid` (the same uuid table as a create) plus `reply_in_thread`: true posts
  it in the replied message's thread (a new one when it had none); a message already in a
  thread is always answered there, as Feishu documents. An unknown id -> 230001 naming
  `message_id`, recalled -> 230011, deleted -> 230110; counted as a send to its chat.
- `PATCH /open-apis/im/v1/messages/:id`: card update; needs `config.update_multi = true`;
  an id the fake never issued -> 230001 "invalid message_id" (as Feishu documents),
  recalled -> 230011, deleted -> 230110, older than 14 days (injectable clock) -> 230031,
  more than 5 per second per message -> 230020.
- `DELETE /open-apis/im/v1/messages/:id` (recall): only within the tenant's recall window
  of the message's sending (`recall_window_s`, 24 hours by default, as Feishu documents),
  else 230009; the bot removed from the chat -> 230002. `POST /open-apis/im/v1/pins`.
- A chat dissolved (`dissolve_chat`): every send, reply, update, delete and pin there ->
  232009; a one-to-one chat whose person turned the bot off (`stop_bot`): sends -> 230053
  (the calls Feishu documents these codes for, with its words).
- The whole app refused (`refuse_app`): every call but the token's answers the code given
  (230006 the bot ability off, 99991401 outside the IP allow-list, 99991662 / 99991673 the
  app disabled or unavailable, 230018 a group's settings) until `refuse_app(None)`. A pin in
  a group in `pins_restricted` (only its owner and administrators may pin) -> 230046.
- Limits: requests per app (per second and per minute) -> HTTP 429, code 99991400 and the
  `x-ogw-ratelimit-reset` header (the gateway's limit); sends and replies per chat -> HTTP
  400, code 230020, no header (the message service's throttle, as the send and reply pages
  document it). Only accepted requests count toward a window.
- The long connection: `POST /callback/ws/endpoint` and a websocket at `/ws` that speaks
  lark-oapi's protobuf frames, so `lark_oapi.ws.Client` connects and receives events
  pushed with `push_ws_event`; the client's answer codes are kept by event id (`ws_answers`).
  With several connections of the app open (a cluster), each event goes to one of them,
  chosen at random, as Feishu documents; never to all.

Controls (see `FakeFeishu`): scripted errors, recall / delete / age a message, remove the
bot from a chat, revoke tokens, advance the wall clock. Inspection: the request log with
times, each chat's visible messages with their latest card, and helpers that deliver a
command event to a webhook URL the way Feishu does (optionally encrypted and signed).

Run standalone with `python -m tests.fakes.feishu_api --port 8099`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import io
import itertools
import json
import os
import random
import re
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from Crypto.Cipher import AES
from lark_oapi.ws.pb.pbbp2_pb2 import Frame

CARD_LIMIT_BYTES = 30 * 1024
# A text message's request body may be at most 150 KB (cards: 30 KB); beyond, code 230025.
TEXT_LIMIT_BYTES = 150 * 1024
UPDATE_WINDOW_S = 14 * 24 * 3600.0
# Feishu's default for a bot recalling its own message (a tenant's administrator may change it).
RECALL_WINDOW_S = 24 * 3600.0
TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
UUID_WINDOW_S = 3600.0
# While the newest token has at least this long left, a token request answers it again with
# the seconds it has left as `expire`; with less, a new token (Feishu: 30 minutes).
TOKEN_REISSUE_S = 1800.0
UUID_MAX_CHARS = 50
INVALID_MESSAGE_ID = "Your request contains an invalid request parameter, ext=invalid message_id."
# The documented answers (code and msg) for a dissolved chat and for a person who turned the
# bot's messages off in their one-to-one chat.
CHAT_DISSOLVED = (232009, "Your request specifies a chat which has already been dissolved.")
BOT_STOPPED = (230053, "The user has stopped the bot from sending messages.")
# A pin in a group whose settings let only its owner and administrators pin, and a message
# pinned or unpinned too often (the pins page's error table; script it with `script_error`).
PINS_RESTRICTED = (230046, "Only group owner and group admin can pin messages.")
PIN_TOO_OFTEN = (230047, "Pin or unpin operations are too frequent, please try again later.")
# Answers refusing the whole app, whatever the request (`refuse_app`), as the send message
# page (230006, 230018) and the server error codes page (the 9999xxxx) word them.
APP_REFUSALS: dict[int, str] = {
    230006: "Bot ability is not activated.",
    230018: "These operations are not allowed in current group settings.",
    99991401: "request ip is not in the app's ip allowlist",
    99991662: "app is disabled",
    99991673: "app status is unavailable",
}


@dataclass(frozen=True)
class FakeLimits:
    """Per-window limits the fake enforces (Feishu's documented numbers by default)."""

    message_update: int = 5
    chat_send: int = 5
    app: int = 50
    window_s: float = 1.0
    reset_s: int = 1
    app_per_minute: int = 1000
    minute_window_s: float = 60.0


@dataclass
class FakeMessage:
    """One message as the chat shows it; `contents` keeps every version, latest last."""

    message_id: str
    chat_id: str
    msg_type: str
    contents: list[str]
    created_at_s: float
    recalled: bool = False
    deleted: bool = False
    pinned: bool = False
    # Where it sits: a thread (topic or reply thread) or the main flow (None), and the
    # message it replies to.
    thread_id: str | None = None
    parent_id: str = ""
    root_id: str = ""

    @property
    def content(self) -> str:
        return self.contents[-1]

    @property
    def update_count(self) -> int:
        return len(self.contents) - 1

    @property
    def visible(self) -> bool:
        return not (self.recalled or self.deleted)

    @property
    def card(self) -> dict[str, Any]:
        """The latest card document (interactive messages only)."""
        document = json.loads(self.content)
        assert isinstance(document, dict)
        return document

    @property
    def text(self) -> str:
        """Every human-visible string of the latest version, one per line."""
        return "\n".join(_strings(json.loads(self.content)))

    @property
    def mentions_everyone(self) -> bool:
        """Whether any version pinged everyone in the chat, read as Feishu reads a message it
        is sent: an `<at>` tag naming `all` in a text message, in a post's text or as its
        `at` element, or in a card's Markdown (`markdown`, `lark_md`); a card's plain text
        shows a tag as typed, and so does an escaped one (`&lt;at id=all&gt;`)."""
        return any(_pings_everyone(self.msg_type, json.loads(c)) for c in self.contents)


# An `<at>` tag naming everyone: `<at user_id="all">` (text, post), `<at id=all>` (cards).
_AT_EVERYONE = re.compile(
    r"<\s*at\b[^>]*?\b(?:user_id|id|ids|open_id)\s*=\s*[\"']?(?:[^\"'\s>]*,)?\s*all\b",
    re.IGNORECASE,
)


def _pings_everyone(msg_type: str, document: Any) -> bool:
    if msg_type == "text":
        text = document.get("text") if isinstance(document, dict) else None
        return isinstance(text, str) and bool(_AT_EVERYONE.search(text))
    return any(_AT_EVERYONE.search(text) for text in _interpreted(document))


def _interpreted(node: Any) -> list[str]:
    """The strings of a card or post that Feishu interprets as markup, and `<at>` tags built
    from a post's `at` elements."""
    if isinstance(node, list):
        return [text for item in node for text in _interpreted(item)]
    if not isinstance(node, dict):
        return []
    tag = node.get("tag")
    if tag == "at" and node.get("user_id") in ("all", "@_all"):
        return ['<at user_id="all">']
    found: list[str] = []
    if tag in ("markdown", "lark_md", "md", "text") and isinstance(node.get("content"), str):
        found.append(node["content"])
    if tag in ("md", "text") and isinstance(node.get("text"), str):
        found.append(node["text"])
    for value in node.values():
        found.extend(_interpreted(value))
    return found


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        out: list[str] = []
        for key, value in node.items():
            if key in ("content", "text") and isinstance(value, str):
                out.append(value)
            else:
                out.extend(_strings(value))
        return out
    if isinstance(node, list):
        return [text for item in node for text in _strings(item)]
    return []


@dataclass(frozen=True)
class LoggedRequest:
    """One API request as the fake answered it. `at_s` is on the fake's rate clock."""

    at_s: float
    method: str
    path: str
    operation: str
    chat_id: str | None
    message_id: str | None
    http_status: int
    code: int


@dataclass(frozen=True)
class ScriptedError:
    http_status: int
    code: int
    msg: str
    headers: tuple[tuple[str, str], ...] = ()
    raw: bytes | None = None  # the exact body instead of Feishu's JSON (an HTML page)


@dataclass(frozen=True)
class Delivery:
    """How a webhook answered an event the fake delivered."""

    status: int
    body: Any
    elapsed_s: float


class _Refusal(Exception):
    def __init__(
        self,
        http_status: int,
        code: int,
        msg: str,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ):
        super().__init__(msg)
        self.http_status = http_status
        self.code = code
        self.msg = msg
        self.headers = headers or {}
        self.raw = raw


class _Windows:
    """Sliding-window counters keyed by scope."""

    def __init__(self) -> None:
        self._hits: dict[str, deque[float]] = {}

    def full(self, key: str, limit: int, window_s: float, now_s: float) -> bool:
        hits = self._hits.setdefault(key, deque())
        while hits and hits[0] <= now_s - window_s:
            hits.popleft()
        return len(hits) >= limit

    def record(self, key: str, now_s: float) -> None:
        self._hits.setdefault(key, deque()).append(now_s)


def _post_paragraph(line: str) -> list[dict[str, Any]]:
    """A line as the rich editor sends it: text elements, a mention of everyone as its own
    `at` element."""
    elements: list[dict[str, Any]] = []
    for index, piece in enumerate(line.split("@_all")):
        if index:
            elements.append({"tag": "at", "user_id": "@_all", "user_name": "所有人", "style": []})
        if piece or not elements:
            elements.append({"tag": "text", "text": piece, "style": []})
    return elements


def encrypt_event(document: dict[str, Any], encrypt_key: str) -> str:
    """Seal an event as Feishu does: AES-256-CBC, key SHA-256(encrypt key), IV first, base64."""
    return seal(json.dumps(document, ensure_ascii=False).encode(), encrypt_key)


def seal(plain: bytes, encrypt_key: str) -> str:
    """Seal any bytes as `encrypt_event` seals an event's JSON (for bodies Feishu never sends)."""
    pad = AES.block_size - len(plain) % AES.block_size
    plain += bytes([pad]) * pad
    iv = os.urandom(AES.block_size)
    cipher = AES.new(hashlib.sha256(encrypt_key.encode()).digest(), AES.MODE_CBC, iv)
    return base64.b64encode(iv + cipher.encrypt(plain)).decode()


class FakeFeishu:
    """The fake server. `async with FakeFeishu() as fake:` then point lark-oapi at
    `fake.base_url`. All controls are plain methods; state is readable at any time."""

    def __init__(
        self,
        app_id: str = "cli_fake_app",
        app_secret: str = "fake-secret",
        *,
        limits: FakeLimits | None = None,
        wall_clock: Callable[[], float] = time.time,
        rate_clock: Callable[[], float] = time.monotonic,
        token_lifetime_s: int = 7200,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.app_id = app_id
        self.app_secret = app_secret
        self.limits = limits or FakeLimits()
        self._wall_clock = wall_clock
        self._rate_clock = rate_clock
        self.time_offset_s = 0.0
        self.token_lifetime_s = token_lifetime_s
        self._host = host
        self._port = port
        self._tokens: dict[str, float] = {}
        self.messages: dict[str, FakeMessage] = {}
        # People's messages (commands from `command_event`): not the bot's, never in `chat`.
        self.user_messages: dict[str, FakeMessage] = {}
        # Each thread's root: the message it was opened on (see `command_event`).
        self.thread_roots: dict[str, str] = {}
        self.requests: list[LoggedRequest] = []
        self.removed_from: set[str] = set()
        self.dissolved: set[str] = set()
        self.stopped_bot: set[str] = set()
        self._chat_failures: dict[str, ScriptedError] = {}
        self._chat_delays_s: dict[str, float] = {}
        # Per operation ("send", "reply"): answers given late, held, or dropped after posting.
        self._answer_delay_s: dict[str, float] = {}
        self._answer_gates: dict[str, asyncio.Event] = {}
        self._drops: dict[str, int] = {}
        self._scripts: dict[str, deque[ScriptedError]] = {}
        self._windows = _Windows()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        # Open long connections, in the order they opened (`push_ws_event(connection=n)`).
        self._ws_clients: list[web.WebSocketResponse] = []
        self.ws_opened = 0  # long connections accepted so far (a reconnect counts again)
        self.ws_acks: list[dict[str, Any]] = []
        # The answer codes each pushed event got, by its `header.event_id` (in order).
        self.ws_answers: dict[str, list[int]] = {}
        self._ws_pushed: dict[str, str] = {}  # frame message id -> event id
        self.ws_endpoint_available = True
        self.bot_open_id = "ou_fake_bot"
        self.app_name = "taskcard"  # the bot's name, as its info and its mentions give it
        self.bot_info_available = True
        # How an unknown or expired tenant token is refused. The server error codes page
        # lists 99991663 ("tenant token invalid") and also 99991665 ("Illegal tenant access
        # token") and 99991677 ("token expire"); a test may choose another.
        self.refused_token_answer: tuple[int, str] = (
            99991663,
            "Invalid access token for authorization.",
        )
        # How long after posting the bot may recall its message: the tenant's setting, 24
        # hours unless its administrator changed it (230009 past it).
        self.recall_window_s = RECALL_WINDOW_S
        # While set (`refuse_app`), every call but the token's is answered with this error.
        self.app_refusal: ScriptedError | None = None
        self.app_refusal_token_too = False
        # Groups whose settings let only the owner and administrators pin (230046).
        self.pins_restricted: set[str] = set()
        # uuid -> (message id, wall-clock time of the first send)
        self._sent_uuids: dict[str, tuple[str, float]] = {}
        self.base_url = ""

    # Lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> FakeFeishu:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_post(TOKEN_PATH, self._token)
        app.router.add_get("/open-apis/bot/v3/info", self._bot_info)
        app.router.add_post("/open-apis/im/v1/messages", self._create)
        app.router.add_post("/open-apis/im/v1/messages/{message_id}/reply", self._reply)
        app.router.add_patch("/open-apis/im/v1/messages/{message_id}", self._patch)
        app.router.add_delete("/open-apis/im/v1/messages/{message_id}", self._delete)
        app.router.add_post("/open-apis/im/v1/pins", self._pin)
        app.router.add_post("/callback/ws/endpoint", self._ws_endpoint)
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/_fake/messages", self._dump)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._runner = runner
        port = int(runner.addresses[0][1])
        self.base_url = f"http://{self._host}:{port}"

    async def stop(self) -> None:
        for socket in list(self._ws_clients):
            await socket.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # Controls -----------------------------------------------------------------------------

    def now_s(self) -> float:
        """The fake's wall clock (epoch seconds), including `advance_time`."""
        return self._wall_clock() + self.time_offset_s

    def advance_time(self, seconds: float) -> None:
        self.time_offset_s += seconds

    def script_error(
        self,
        operation: str,
        code: int,
        *,
        http_status: int = 400,
        msg: str = "scripted error",
        headers: dict[str, str] | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next `times` requests of `operation` (`send`, `reply`, `patch`,
        `delete`, `pin`, `token` or `any`) with this error instead of serving them."""
        queue = self._scripts.setdefault(operation, deque())
        for _ in range(times):
            queue.append(ScriptedError(http_status, code, msg, tuple((headers or {}).items())))

    def script_raw(
        self,
        operation: str,
        http_status: int,
        body: bytes,
        *,
        content_type: str = "text/html",
        times: int = 1,
    ) -> None:
        """Answer the next `times` requests of `operation` with these exact bytes: what a
        gateway in front of the Open API sends (an HTML 502 page, an empty body)."""
        queue = self._scripts.setdefault(operation, deque())
        headers = (("Content-Type", content_type),)
        for _ in range(times):
            queue.append(ScriptedError(http_status, -1, "raw", headers, body))

    def clear_scripts(self) -> None:
        """Forget the scripted errors not yet answered, and those of `fail_chat` and
        `hang_chat`: every operation is served again."""
        self._scripts.clear()
        self._chat_failures.clear()
        self._chat_delays_s.clear()

    def refuse_app(
        self, code: int | None, *, http_status: int = 400, token_too: bool = False
    ) -> None:
        """From now on answer every call but the token's (with `token_too`, that one too)
        with `code` (one of `APP_REFUSALS`, in the `{code, msg}` envelope), as Feishu does
        while the app's bot ability is off, this host is outside the IP allow-list or the app
        is disabled; None: serve again."""
        self.app_refusal = (
            None if code is None else ScriptedError(http_status, code, APP_REFUSALS[code], ())
        )
        self.app_refusal_token_too = token_too

    def script_rate_limit(
        self, operation: str = "any", *, reset_s: int = 2, times: int = 1
    ) -> None:
        """The app-level answer: HTTP 429, code 99991400, `x-ogw-ratelimit-reset`."""
        self.script_error(
            operation,
            99991400,
            http_status=429,
            msg="request trigger frequency limit",
            headers={"x-ogw-ratelimit-reset": str(reset_s)},
            times=times,
        )

    def _any_message(self, message_id: str) -> FakeMessage:
        return self.messages.get(message_id) or self.user_messages[message_id]

    def recall(self, message_id: str) -> None:
        """The bot's message or a person's command recalled: later calls answer 230011."""
        self._any_message(message_id).recalled = True

    def delete_message(self, message_id: str) -> None:
        """A message deleted (not recalled): later calls answer 230110."""
        self._any_message(message_id).deleted = True

    def age_message(self, message_id: str, days: float) -> None:
        self.messages[message_id].created_at_s -= days * 24 * 3600

    def remove_bot(self, chat_id: str) -> None:
        self.removed_from.add(chat_id)

    def add_bot(self, chat_id: str) -> None:
        self.removed_from.discard(chat_id)

    def dissolve_chat(self, chat_id: str) -> None:
        """The group is disbanded: every later call about it answers 232009."""
        self.dissolved.add(chat_id)

    def stop_bot(self, chat_id: str) -> None:
        """The person of this one-to-one chat stops the bot's messages: sends answer 230053."""
        self.stopped_bot.add(chat_id)

    def fail_chat(
        self,
        chat_id: str,
        code: int,
        *,
        http_status: int = 400,
        msg: str = "scripted error",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer every call about `chat_id` (sends, replies, updates, deletes, pins) with
        this error until `clear_scripts`: one chat refused while the others are served."""
        self._chat_failures[chat_id] = ScriptedError(
            http_status, code, msg, tuple((headers or {}).items())
        )

    def hang_chat(self, chat_id: str, seconds: float) -> None:
        """Answer every send to `chat_id` only after `seconds` (past the client's timeout),
        until `clear_scripts`."""
        self._chat_delays_s[chat_id] = seconds

    def delay_answers(self, operation: str, seconds: float) -> None:
        """Post every `operation` ("send", "reply") at once but answer it `seconds` later (0:
        at once)."""
        self._answer_delay_s[operation] = seconds

    def hold_answers(self, operation: str) -> None:
        """Post every `operation` at once but answer none until `release_answers`."""
        self._answer_gates.setdefault(operation, asyncio.Event())

    def release_answers(self, operation: str) -> None:
        """Answer the held calls of `operation`, and the next ones at once."""
        gate = self._answer_gates.pop(operation, None)
        if gate is not None:
            gate.set()

    def drop_after_accept(self, operation: str, times: int = 1) -> None:
        """Post the next `times` calls of `operation`, then close each connection unanswered."""
        self._drops[operation] = self._drops.get(operation, 0) + times

    async def _accepted(self, request: web.Request, operation: str) -> None:
        """The call was performed: answer it now, late, later, or never (see `delay_answers`)."""
        if self._drops.get(operation, 0) > 0:
            self._drops[operation] -= 1
            transport = request.transport
            if transport is not None:
                transport.close()
            raise web.HTTPServiceUnavailable()  # never reaches the client: it is gone
        delay_s = self._answer_delay_s.get(operation, 0.0)
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        gate = self._answer_gates.get(operation)
        if gate is not None:
            await gate.wait()

    def _check_chat(self, chat_id: str) -> None:
        """Refuse any call about a message of a dissolved chat, as Feishu does (and of a chat
        given an error with `fail_chat`)."""
        if chat_id in self.dissolved:
            raise _Refusal(400, *CHAT_DISSOLVED)
        failure = self._chat_failures.get(chat_id)
        if failure is not None:
            raise _Refusal(failure.http_status, failure.code, failure.msg, dict(failure.headers))

    def revoke_tokens(self) -> None:
        self._tokens.clear()

    # Inspection ---------------------------------------------------------------------------

    def chat(self, chat_id: str) -> list[FakeMessage]:
        """What the chat shows: its visible messages, oldest first."""
        return [m for m in self.messages.values() if m.chat_id == chat_id and m.visible]

    def cards(self, chat_id: str) -> list[dict[str, Any]]:
        """The latest card of each visible interactive message of the chat."""
        return [m.card for m in self.chat(chat_id) if m.msg_type == "interactive"]

    def texts(self, chat_id: str) -> list[str]:
        """The visible text messages of the chat (notices, replies)."""
        return [
            str(json.loads(m.content).get("text", ""))
            for m in self.chat(chat_id)
            if m.msg_type == "text"
        ]

    def replies_to(self, message_id: str) -> list[FakeMessage]:
        """The visible messages of the bot that reply to `message_id`."""
        return [m for m in self.messages.values() if m.parent_id == message_id and m.visible]

    def requests_of(self, operation: str) -> list[LoggedRequest]:
        return [r for r in self.requests if r.operation == operation]

    def errors(self) -> list[LoggedRequest]:
        return [r for r in self.requests if r.code != 0]

    # Event delivery (the fake plays Feishu's event push) ----------------------------------

    def command_event(
        self,
        chat_id: str,
        text: str,
        *,
        open_id: str = "ou_fake_user",
        event_id: str | None = None,
        message_id: str | None = None,
        chat_type: str = "group",
        mention_bot: bool = True,
        mention_users: tuple[str, ...] = (),
        verification_token: str | None = None,
        parent_id: str = "",
        root_id: str | None = None,
        message_type: str = "text",
        thread_id: str | None = None,
        title: str = "",
        locale: str | None = None,
        everyone_listed: bool = True,
    ) -> dict[str, Any]:
        """An `im.message.receive_v1` document for a text message `text` in `chat_id`.

        The message is kept (`user_messages`), so the bot can reply to it; `thread_id` puts
        it in a thread (a topic of a topic group, or a reply thread), as the event then says;
        with no `parent_id` it then replies to the thread's root, as every message of a
        thread does on Feishu, and with one it opens that thread on the replied message.
        `parent_id` makes it a reply to that message; `root_id` then defaults to what Feishu
        writes there, the root of the reply chain (the replied message's own root, else the
        replied message itself), so a reply to a reply names the first message as its root.

        Mentions come first in the text as Feishu writes them (`@_user_1 ...`): the users
        with the open_ids in `mention_users`, then the bot when `mention_bot`. With
        `message_type="post"` the same words arrive as a rich message from the editor: a
        paragraph per line, the mentions as `at` elements naming their keys, `title` as the
        post's title, and the whole under a locale key (`zh_cn`, `en_us`) when `locale` is
        given, the shape some events carry.

        A mention of everyone is written in `text` as Feishu writes it, `@_all` (in a post: an
        `at` element); with `everyone_listed` it is also listed in `mentions`, named "所有人"
        (Feishu does not always list it).
        """
        created_ms = str(int(self.now_s() * 1000))
        mentioned = [(user, user) for user in mention_users]
        if mention_bot:
            mentioned.append((self.bot_open_id, self.app_name))
        mentions: list[dict[str, Any]] = []
        for number, (mentioned_id, name) in enumerate(mentioned, start=1):
            mentions.append(
                {
                    "key": f"@_user_{number}",
                    "id": {
                        "open_id": mentioned_id,
                        "union_id": "on_" + mentioned_id,
                        "user_id": "",
                    },
                    "name": name,
                    "tenant_key": "fake_tenant",
                }
            )
        if message_type == "post":
            lines = text.split("\n")
            paragraphs: list[list[dict[str, Any]]] = [_post_paragraph(line) for line in lines]
            paragraphs[0][:0] = [
                {"tag": "at", "user_id": m["key"], "user_name": m["name"], "style": []}
                for m in mentions
            ]
            post: dict[str, Any] = {"title": title, "content": paragraphs}
            content = json.dumps(post if locale is None else {locale: post}, ensure_ascii=False)
        else:
            text = " ".join([*(m["key"] for m in mentions), text])
            content = json.dumps({"text": text}, ensure_ascii=False)
        if everyone_listed and "@_all" in text:
            mentions.append(
                {
                    "key": "@_all",
                    "id": {"open_id": "", "union_id": "", "user_id": ""},
                    "name": "所有人",
                    "tenant_key": "fake_tenant",
                }
            )
        message_id = message_id or f"om_user_{next(self._ids):06d}"
        if thread_id is not None:
            # A thread's root is the message it was opened on (a topic's first message).
            # Every message written in it replies to that root, as Feishu says it: the root
            # is its `root_id`, and its `parent_id` too unless it quotes another message.
            if thread_id not in self.thread_roots:
                self.thread_roots[thread_id] = parent_id or message_id
                opened = self.messages.get(parent_id) or self.user_messages.get(parent_id)
                if opened is not None and opened.thread_id is None:
                    opened.thread_id = thread_id
            thread_root = self.thread_roots[thread_id]
            if thread_root != message_id:
                parent_id = parent_id or thread_root
                root_id = thread_root if root_id is None else root_id
        if root_id is None:
            replied = self.messages.get(parent_id) or self.user_messages.get(parent_id)
            root_id = (replied.root_id or replied.message_id) if replied else parent_id
        self.user_messages[message_id] = FakeMessage(
            message_id,
            chat_id,
            message_type,
            [content],
            self.now_s(),
            thread_id=thread_id,
            parent_id=parent_id,
            root_id=root_id,
        )
        message: dict[str, Any] = {
            "message_id": message_id,
            "root_id": root_id,
            "parent_id": parent_id,
            "create_time": created_ms,
            "update_time": created_ms,
            "chat_id": chat_id,
            "chat_type": chat_type,
            "message_type": message_type,
            "content": content,
            "mentions": mentions,
        }
        if thread_id is not None:
            message["thread_id"] = thread_id
        return {
            "schema": "2.0",
            "header": {
                "event_id": event_id or secrets.token_hex(16),
                "event_type": "im.message.receive_v1",
                "create_time": created_ms,
                "token": verification_token or "",
                "app_id": self.app_id,
                "tenant_key": "fake_tenant",
            },
            "event": {
                "sender": {
                    "sender_id": {"open_id": open_id, "union_id": "on_" + open_id, "user_id": ""},
                    "sender_type": "user",
                    "tenant_key": "fake_tenant",
                },
                "message": message,
            },
        }

    async def deliver_event(
        self,
        url: str,
        document: dict[str, Any],
        *,
        encrypt_key: str | None = None,
        bad_signature: bool = False,
        stamp_ms: bool = False,
    ) -> Delivery:
        """POST one callback to `url` as Feishu does (sealed and signed with `encrypt_key`)."""
        return await self.deliver_body(
            url,
            json.dumps(document, ensure_ascii=False).encode(),
            encrypt_key=encrypt_key,
            bad_signature=bad_signature,
            stamp_ms=stamp_ms,
        )

    async def deliver_body(
        self,
        url: str,
        plain: bytes,
        *,
        encrypt_key: str | None = None,
        bad_signature: bool = False,
        outer: bytes | None = None,
        stamp_ms: bool = False,
    ) -> Delivery:
        """POST the bytes `plain` as a callback body, sealed in `{"encrypt": ...}` and signed
        with `encrypt_key` when given, as Feishu would send them were they an event's JSON;
        `outer` replaces the whole body (still signed), for a broken envelope. `stamp_ms`
        writes `X-Lark-Request-Timestamp` in milliseconds (the pages do not name its unit;
        Feishu writes seconds)."""
        headers = {"Content-Type": "application/json"}
        if encrypt_key:
            raw = outer or json.dumps({"encrypt": seal(plain, encrypt_key)}).encode()
            now_s = self.now_s()
            stamp = str(int(now_s * 1000) if stamp_ms else int(now_s))
            nonce = secrets.token_hex(8)
            digest = hashlib.sha256((stamp + nonce + encrypt_key).encode() + raw).hexdigest()
            headers["X-Lark-Request-Timestamp"] = stamp
            headers["X-Lark-Request-Nonce"] = nonce
            headers["X-Lark-Signature"] = "0" * 64 if bad_signature else digest
        else:
            raw = plain if outer is None else outer
        started = time.monotonic()
        # aiohttp warns of raw bytes over 1 MiB (they are sent in one go), not of a stream.
        data: bytes | io.BytesIO = raw if len(raw) < 1024 * 1024 else io.BytesIO(raw)
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=data, headers=headers) as response,
        ):
            text = await response.text()
            elapsed_s = time.monotonic() - started
            try:
                body: Any = json.loads(text)
            except ValueError:
                body = text
            return Delivery(response.status, body, elapsed_s)

    async def deliver_command(
        self,
        url: str,
        chat_id: str,
        text: str,
        *,
        encrypt_key: str | None = None,
        verification_token: str | None = None,
        **event: Any,
    ) -> Delivery:
        """Deliver a command message event (see `command_event` for the options)."""
        document = self.command_event(chat_id, text, verification_token=verification_token, **event)
        return await self.deliver_event(url, document, encrypt_key=encrypt_key)

    async def url_verification(
        self,
        url: str,
        challenge: str,
        *,
        verification_token: str | None = None,
        encrypt_key: str | None = None,
    ) -> Delivery:
        document = {"type": "url_verification", "challenge": challenge}
        if verification_token is not None:
            document["token"] = verification_token
        return await self.deliver_event(url, document, encrypt_key=encrypt_key)

    async def push_ws_event(
        self,
        document: dict[str, Any],
        *,
        payload: bytes | None = None,
        connection: int | None = None,
    ) -> int:
        """Send an event over one open long connection; returns how many got it (0 or 1).

        Feishu hands each event to one connection of the app, chosen at random when there
        are several (cluster mode): so does the fake, unless `connection` names the n-th
        open one (in the order they opened). `payload` replaces the frame's payload (the
        document as JSON) with those bytes, as a broken sender might write them."""
        frame = Frame()
        frame.SeqID = next(self._ids)
        frame.LogID = frame.SeqID
        frame.service = 1
        frame.method = 1  # DATA
        headers = {
            "type": "event",
            "message_id": f"ws_{frame.SeqID}",
            "trace_id": secrets.token_hex(8),
            "sum": "1",
            "seq": "0",
        }
        for key, value in headers.items():
            header = frame.headers.add()
            header.key = key
            header.value = value
        frame.payload = (
            json.dumps(document, ensure_ascii=False).encode() if payload is None else payload
        )
        header = document.get("header")
        if isinstance(header, dict) and isinstance(header.get("event_id"), str):
            self._ws_pushed[headers["message_id"]] = header["event_id"]
        if not self._ws_clients:
            return 0
        if connection is None:
            socket = random.choice(self._ws_clients)
        else:
            socket = self._ws_clients[connection]
        await socket.send_bytes(frame.SerializeToString())
        return 1

    @property
    def ws_connections(self) -> int:
        return len(self._ws_clients)

    async def close_ws(self, code: int = 1000) -> int:
        """Close every long connection with `code`: the normal way (1000) as Feishu does
        when it moves a connection elsewhere, or another code for a failure; the client is
        expected to reconnect either way."""
        sockets = list(self._ws_clients)
        for socket in sockets:
            await socket.close(code=code)
        return len(sockets)

    # Handlers -----------------------------------------------------------------------------

    def _answer(
        self,
        request: web.Request,
        operation: str,
        *,
        status: int = 200,
        code: int = 0,
        msg: str = "success",
        data: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        chat_id: str | None = None,
        message_id: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> web.Response:
        self._log(request, operation, chat_id, message_id, status, code)
        body: dict[str, Any] = {"code": code, "msg": msg}
        if data is not None:
            body["data"] = data
        if code != 0:
            body["error"] = {"log_id": secrets.token_hex(8)}
        body.update(extra or {})
        return web.json_response(body, status=status, headers=headers)

    def _log(
        self,
        request: web.Request,
        operation: str,
        chat_id: str | None,
        message_id: str | None,
        status: int,
        code: int,
    ) -> None:
        self.requests.append(
            LoggedRequest(
                self._rate_clock(),
                request.method,
                request.path,
                operation,
                chat_id,
                message_id,
                status,
                code,
            )
        )

    def _refusal(
        self,
        request: web.Request,
        operation: str,
        refusal: _Refusal,
        chat_id: str | None,
        message_id: str | None,
    ) -> web.Response:
        if refusal.raw is not None:
            self._log(request, operation, chat_id, message_id, refusal.http_status, refusal.code)
            return web.Response(
                body=refusal.raw, status=refusal.http_status, headers=refusal.headers
            )
        return self._answer(
            request,
            operation,
            status=refusal.http_status,
            code=refusal.code,
            msg=refusal.msg,
            headers=refusal.headers,
            chat_id=chat_id,
            message_id=message_id,
        )

    def _scripted(self, operation: str) -> None:
        if self.app_refusal is not None and (operation != "token" or self.app_refusal_token_too):
            error = self.app_refusal
            raise _Refusal(error.http_status, error.code, error.msg)
        for key in (operation, "any"):
            queue = self._scripts.get(key)
            if queue:
                error = queue.popleft()
                raise _Refusal(
                    error.http_status, error.code, error.msg, dict(error.headers), error.raw
                )

    def _authorize(self, request: web.Request) -> None:
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            raise _Refusal(400, 99991661, "Missing access token for authorization.")
        expires_at = self._tokens.get(auth[7:].strip())
        if expires_at is None or expires_at <= self._rate_clock():
            raise _Refusal(400, *self.refused_token_answer)

    def _check_app_limit(self, now_s: float) -> None:
        limits = self.limits
        if self._windows.full("app", limits.app, limits.window_s, now_s):
            raise self._rate_limited()
        if self._windows.full("app_minute", limits.app_per_minute, limits.minute_window_s, now_s):
            raise self._rate_limited()

    def _record_app(self, now_s: float) -> None:
        self._windows.record("app", now_s)
        self._windows.record("app_minute", now_s)

    def _rate_limited(self) -> _Refusal:
        return _Refusal(
            429,
            99991400,
            "request trigger frequency limit",
            {"x-ogw-ratelimit-reset": str(self.limits.reset_s)},
        )

    def _check_card(self, content: str) -> dict[str, Any]:
        if len(json.dumps(content, ensure_ascii=False).encode()) > CARD_LIMIT_BYTES:
            raise _Refusal(400, 230025, "The message content exceeds the length limit.")
        try:
            card = json.loads(content)
        except ValueError:
            raise _Refusal(400, 230099, "Failed to create card content: not JSON") from None
        if not isinstance(card, dict):
            raise _Refusal(400, 230099, "Failed to create card content: not an object")
        if card.get("schema") == "2.0":
            body = card.get("body")
            if not isinstance(body, dict) or not isinstance(body.get("elements"), list):
                raise _Refusal(400, 230099, "Failed to create card content: body.elements")
        return card

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            document = await request.json()
        except ValueError:
            raise _Refusal(400, 9499, "Bad Request: body is not JSON") from None
        if not isinstance(document, dict):
            raise _Refusal(400, 9499, "Bad Request: body is not an object")
        return document

    async def _token(self, request: web.Request) -> web.Response:
        try:
            self._scripted("token")
            document = await self._json(request)
            if document.get("app_id") != self.app_id:
                raise _Refusal(400, 10003, "invalid param: app_id")
            if document.get("app_secret") != self.app_secret:
                raise _Refusal(400, 10014, "app secret invalid")
        except _Refusal as refusal:
            return self._refusal(request, "token", refusal, None, None)
        now = self._rate_clock()
        token, expires_at = max(self._tokens.items(), key=lambda item: item[1], default=("", 0.0))
        if expires_at - now < TOKEN_REISSUE_S:
            # Less than half an hour left (or none): a new token; the old one stays valid
            # until its own expiry, as Feishu documents (two valid tokens for a while).
            token = "t-" + secrets.token_hex(16)
            expires_at = now + self.token_lifetime_s
            self._tokens[token] = expires_at
        return self._answer(
            request,
            "token",
            msg="ok",
            extra={"tenant_access_token": token, "expire": int(expires_at - now)},
        )

    async def _bot_info(self, request: web.Request) -> web.Response:
        if not self.bot_info_available:
            return web.Response(status=404, text="404: Not Found")
        try:
            self._authorize(request)
            self._scripted("bot_info")
        except _Refusal as refusal:
            return self._refusal(request, "bot_info", refusal, None, None)
        bot = {
            "activate_status": 2,
            "app_name": self.app_name,
            "avatar_url": "https://example.invalid/avatar.png",
            "ip_white_list": [],
            "open_id": self.bot_open_id,
        }
        return self._answer(request, "bot_info", msg="ok", extra={"bot": bot})

    def _check_uuid(self, document: dict[str, Any]) -> str | None:
        uuid = document.get("uuid")
        if uuid is not None and (
            not isinstance(uuid, str) or not uuid or len(uuid) > UUID_MAX_CHARS
        ):
            raise _Refusal(
                400, 230001, "Your request contains an invalid request parameter, ext=uuid."
            )
        return uuid

    def _first_with(self, uuid: str | None) -> FakeMessage | None:
        """The message first posted with `uuid` within the hour, if any."""
        earlier = self._sent_uuids.get(uuid) if uuid is not None else None
        if earlier is not None and self.now_s() - earlier[1] < UUID_WINDOW_S:
            return self.messages[earlier[0]]
        return None

    def _check_content(self, msg_type: object, content: object) -> str:
        if not isinstance(content, str):
            raise _Refusal(400, 230001, "content is required")
        if msg_type == "interactive":
            self._check_card(content)
        elif msg_type == "text":
            if len(json.dumps(content, ensure_ascii=False).encode()) > TEXT_LIMIT_BYTES:
                raise _Refusal(400, 230025, "The message content exceeds the length limit.")
            try:
                parsed = json.loads(content)
            except ValueError:
                raise _Refusal(400, 230001, "text content is not JSON") from None
            if not isinstance(parsed, dict) or not isinstance(parsed.get("text"), str):
                raise _Refusal(400, 230001, "text content needs a text field")
        else:
            raise _Refusal(400, 230001, f"msg_type {msg_type!r} is not supported here")
        return content

    def _check_chat_send(self, chat_id: str, now: float) -> None:
        if chat_id in self.removed_from:
            raise _Refusal(400, 230002, "The bot is not in the chat.")
        limits = self.limits
        if self._windows.full(f"chat:{chat_id}", limits.chat_send, limits.window_s, now):
            # The chat's own limit (5 per second, shared by the bots in it) is the message
            # service's throttle, documented for sends and replies as 230020, not the
            # gateway's per-app 99991400.
            raise _Refusal(400, 230020, "This operation triggers the frequency limit.")

    def _post(
        self,
        chat_id: str,
        msg_type: str,
        content: str,
        uuid: str | None,
        now: float,
        **placement: Any,
    ) -> FakeMessage:
        """Post an accepted message: count it and keep its uuid."""
        self._record_app(now)
        self._windows.record(f"chat:{chat_id}", now)
        message_id = f"om_{next(self._ids):08x}{secrets.token_hex(4)}"
        message = FakeMessage(message_id, chat_id, msg_type, [content], self.now_s(), **placement)
        self.messages[message_id] = message
        if uuid is not None:
            self._sent_uuids[uuid] = (message_id, message.created_at_s)
        return message

    async def _create(self, request: web.Request) -> web.Response:
        chat_id: str | None = None
        try:
            self._authorize(request)
            self._scripted("send")
            document = await self._json(request)
            chat_id = str(document.get("receive_id") or "")
            if request.query.get("receive_id_type") != "chat_id":
                raise _Refusal(400, 230001, "invalid receive_id_type for this fake")
            if not chat_id:
                raise _Refusal(400, 230001, "receive_id is required")
            if chat_id in self._chat_delays_s:
                await asyncio.sleep(self._chat_delays_s[chat_id])
            self._check_chat(chat_id)
            if chat_id in self.stopped_bot:
                raise _Refusal(400, *BOT_STOPPED)
            uuid = self._check_uuid(document)
            first = self._first_with(uuid)
            if first is not None:
                # A repeated send: the first message again, nothing posted, nothing counted.
                await self._accepted(request, "send")
                return self._answer(
                    request,
                    "send",
                    data=self._message_data(first),
                    chat_id=first.chat_id,
                    message_id=first.message_id,
                )
            now = self._rate_clock()
            self._check_app_limit(now)
            self._check_chat_send(chat_id, now)
            msg_type = document.get("msg_type")
            content = self._check_content(msg_type, document.get("content"))
        except _Refusal as refusal:
            return self._refusal(request, "send", refusal, chat_id, None)
        message = self._post(chat_id, str(msg_type), content, uuid, now)
        data = self._message_data(message)
        await self._accepted(request, "send")
        return self._answer(
            request, "send", data=data, chat_id=chat_id, message_id=message.message_id
        )

    async def _reply(self, request: web.Request) -> web.Response:
        target_id = request.match_info["message_id"]
        chat_id: str | None = None
        try:
            self._authorize(request)
            self._scripted("reply")
            document = await self._json(request)
            uuid = self._check_uuid(document)
            first = self._first_with(uuid)
            if first is not None:
                await self._accepted(request, "reply")
                return self._answer(
                    request,
                    "reply",
                    data=self._message_data(first),
                    chat_id=first.chat_id,
                    message_id=first.message_id,
                )
            in_thread = document.get("reply_in_thread", False)
            if not isinstance(in_thread, bool):
                raise _Refusal(400, 230001, "reply_in_thread must be a boolean")
            now = self._rate_clock()
            self._check_app_limit(now)
            target = self.messages.get(target_id) or self.user_messages.get(target_id)
            if target is None:
                raise _Refusal(400, 230001, INVALID_MESSAGE_ID)
            if target.deleted:
                raise _Refusal(400, 230110, "Action unavailable as the message has been deleted.")
            if target.recalled:
                raise _Refusal(400, 230011, "The message was withdrawn.")
            chat_id = target.chat_id
            self._check_chat(chat_id)
            self._check_chat_send(chat_id, now)
            msg_type = document.get("msg_type")
            content = self._check_content(msg_type, document.get("content"))
        except _Refusal as refusal:
            return self._refusal(request, "reply", refusal, chat_id, target_id)
        thread_id = target.thread_id
        if thread_id is None and in_thread:
            thread_id = f"omt_{next(self._ids):08x}{secrets.token_hex(4)}"
            target.thread_id = thread_id  # the replied message now opens that thread
            self.thread_roots[thread_id] = target.message_id
        message = self._post(
            chat_id,
            str(msg_type),
            content,
            uuid,
            now,
            thread_id=thread_id,
            parent_id=target.message_id,
            root_id=target.root_id or target.message_id,
        )
        data = self._message_data(message)
        await self._accepted(request, "reply")
        return self._answer(
            request, "reply", data=data, chat_id=chat_id, message_id=message.message_id
        )

    def _message_data(self, message: FakeMessage) -> dict[str, Any]:
        """The `data` of a create answer for `message`."""
        created_ms = str(int(message.created_at_s * 1000))
        return {
            "message_id": message.message_id,
            "root_id": message.root_id,
            "parent_id": message.parent_id,
            **({"thread_id": message.thread_id} if message.thread_id else {}),
            "msg_type": message.msg_type,
            "create_time": created_ms,
            "update_time": created_ms,
            "deleted": False,
            "updated": False,
            "chat_id": message.chat_id,
            "sender": {
                "id": self.app_id,
                "id_type": "app_id",
                "sender_type": "app",
                "tenant_key": "fake_tenant",
            },
            "body": {"content": message.contents[0]},
            "mentions": [],
        }

    def _existing(self, message_id: str) -> FakeMessage:
        message = self.messages.get(message_id)
        if message is None:
            raise _Refusal(400, 230001, INVALID_MESSAGE_ID)
        if message.deleted:
            raise _Refusal(400, 230110, "Action unavailable as the message has been deleted.")
        if message.recalled:
            raise _Refusal(400, 230011, "The message was withdrawn.")
        return message

    async def _patch(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]
        chat_id: str | None = None
        try:
            self._authorize(request)
            self._scripted("patch")
            document = await self._json(request)
            now = self._rate_clock()
            self._check_app_limit(now)
            message = self._existing(message_id)
            chat_id = message.chat_id
            self._check_chat(chat_id)
            if chat_id in self.removed_from:
                raise _Refusal(400, 230002, "The bot is not in the chat.")
            if self.now_s() - message.created_at_s > UPDATE_WINDOW_S:
                raise _Refusal(400, 230031, "The message cannot be updated after 14 days.")
            limits = self.limits
            key = f"message:{message_id}"
            if self._windows.full(key, limits.message_update, limits.window_s, now):
                raise _Refusal(400, 230020, "This operation triggers the frequency limit.")
            if message.msg_type != "interactive":
                raise _Refusal(400, 230001, "Only card messages can be patched.")
            content = document.get("content")
            if not isinstance(content, str):
                raise _Refusal(400, 230001, "content is required")
            card = self._check_card(content)
            config = card.get("config")
            if not isinstance(config, dict) or config.get("update_multi") is not True:
                raise _Refusal(400, 230099, "A card must set config.update_multi to be updated.")
        except _Refusal as refusal:
            return self._refusal(request, "patch", refusal, chat_id, message_id)
        self._record_app(now)
        self._windows.record(key, now)
        message.contents.append(content)
        return self._answer(request, "patch", data={}, chat_id=chat_id, message_id=message_id)

    async def _delete(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]
        chat_id: str | None = None
        try:
            self._authorize(request)
            self._scripted("delete")
            now = self._rate_clock()
            self._check_app_limit(now)
            message = self._existing(message_id)
            chat_id = message.chat_id
            self._check_chat(chat_id)
            if chat_id in self.removed_from:
                raise _Refusal(400, 230002, "The bot can not be outside the group.")
            if self.now_s() - message.created_at_s > self.recall_window_s:
                raise _Refusal(400, 230009, "Message can only be recalled within one days.")
        except _Refusal as refusal:
            return self._refusal(request, "delete", refusal, chat_id, message_id)
        self._record_app(now)
        message.recalled = True
        return self._answer(request, "delete", data={}, chat_id=chat_id, message_id=message_id)

    async def _pin(self, request: web.Request) -> web.Response:
        message_id: str | None = None
        chat_id: str | None = None
        try:
            self._authorize(request)
            self._scripted("pin")
            document = await self._json(request)
            message_id = str(document.get("message_id") or "")
            now = self._rate_clock()
            self._check_app_limit(now)
            message = self._existing(message_id)
            chat_id = message.chat_id
            self._check_chat(chat_id)
            if chat_id in self.removed_from:
                raise _Refusal(400, 230002, "The bot is not in the chat.")
            if chat_id in self.pins_restricted:
                raise _Refusal(400, *PINS_RESTRICTED)
        except _Refusal as refusal:
            return self._refusal(request, "pin", refusal, chat_id, message_id)
        self._record_app(now)
        message.pinned = True
        pin = {
            "message_id": message_id,
            "chat_id": chat_id,
            "operator_id": self.app_id,
            "operator_id_type": "app_id",
            "create_time": str(int(self.now_s() * 1000)),
        }
        return self._answer(
            request, "pin", data={"pin": pin}, chat_id=chat_id, message_id=message_id
        )

    async def _ws_endpoint(self, request: web.Request) -> web.Response:
        if not self.ws_endpoint_available:
            return self._answer(request, "ws_endpoint", status=503, code=1, msg="system busy")
        document = await request.json()
        if document.get("AppID") != self.app_id or document.get("AppSecret") != self.app_secret:
            return self._answer(request, "ws_endpoint", code=1000040343, msg="auth failed")
        host = request.host
        data = {
            "URL": f"ws://{host}/ws?device_id=fake_device&service_id=1",
            "ClientConfig": {
                "ReconnectCount": -1,
                "ReconnectInterval": 1,
                "ReconnectNonce": 0,
                "PingInterval": 120,
            },
        }
        return self._answer(request, "ws_endpoint", data=data)

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        self._ws_clients.append(socket)
        self.ws_opened += 1
        try:
            async for message in socket:
                if message.type == aiohttp.WSMsgType.BINARY:
                    frame = Frame()
                    frame.ParseFromString(message.data)
                    if frame.method == 1:
                        ack = json.loads(frame.payload or b"{}")
                        self.ws_acks.append(ack)
                        sent = {h.key: h.value for h in frame.headers}.get("message_id", "")
                        if sent in self._ws_pushed:
                            answers = self.ws_answers.setdefault(self._ws_pushed[sent], [])
                            answers.append(int(ack.get("code", 0)))
        finally:
            self._ws_clients.remove(socket)
        return socket

    async def _dump(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                message_id: {
                    "chat_id": m.chat_id,
                    "msg_type": m.msg_type,
                    "content": m.content,
                    "updates": m.update_count,
                    "visible": m.visible,
                }
                for message_id, m in self.messages.items()
            }
        )


async def _serve(port: int, app_id: str, app_secret: str) -> None:
    async with FakeFeishu(app_id, app_secret, port=port) as fake:
        print(f"fake Feishu Open API at {fake.base_url} (app {app_id})", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake Feishu Open API on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--app-id", default="cli_fake_app")
    parser.add_argument("--app-secret", default="fake-secret")
    args = parser.parse_args()
    asyncio.run(_serve(args.port, args.app_id, args.app_secret))


if __name__ == "__main__":
    main()
