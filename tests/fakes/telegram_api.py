"""A stateful fake of the Telegram Bot API on 127.0.0.1, for tests and benchmarks.

It keeps chats and their messages (text + entities, ids increasing per chat, edit history),
answers the methods taskcard uses with the real success and error shapes, validates what the
real API validates (entity bounds, also inside an emoji, the fields an entity type needs,
the 4096 UTF-16 limit, empty text, the entities' own size), applies only the first 100
entities, marks the commands in what a person sends as Telegram does (every `/command`
standing alone, wherever it is, offsets and lengths in UTF-16 code units like every entity
the API sends), and enforces configurable sliding-window limits per private chat, per group
and per bot, answering the real 429 body. Every request is recorded with its time; every
429 is recorded too.

Unlucky networks on demand: `delay_answers` performs a method at once but answers late, and
`drop_after_accept` performs the next calls of a method and then closes the connection
without answering. Either way the message exists in the chat, as it would on Telegram.

In-process::

    async with FakeTelegram() as fake:
        bot = Bot(fake.token, base_url=f"{fake.base_url}/bot")
        fake.inject_command(-100, "/taskcard off", user_id=7)
        fake.messages(-100)

Standalone (benchmarks)::

    python -m tests.fakes.telegram_api --port 8081 --token 1:T --group-limit 20/60

aiohttp sets TCP_NODELAY on every connection and sends a small response in one write, so
no delayed-ACK stall distorts latency figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import re
import signal
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Json = dict[str, Any]

NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a current content and reply markup of the message"
)
EDIT_NOT_FOUND = "Bad Request: message to edit not found"
DELETE_NOT_FOUND = "Bad Request: message to delete not found"
PIN_NOT_FOUND = "Bad Request: message to pin not found"
TOO_LONG = "Bad Request: message is too long"
TEXT_EMPTY = "Bad Request: message text is empty"
THREAD_NOT_FOUND = "Bad Request: message thread not found"
KICKED = "Forbidden: bot was kicked from the group chat"
CHAT_NOT_FOUND = "Bad Request: chat not found"
NOT_MEMBER = "Forbidden: bot is not a member of the channel chat"
BLOCKED = "Forbidden: bot was blocked by the user"
CONFLICT = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance "
    "is running"
)
WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first"
)
MAX_TEXT_UTF16 = 4096
MAX_ENTITIES = 100
ENTITIES_TOO_LONG = "Bad Request: ENTITIES_TOO_LONG"
# Telegram's answer to a link (`text_link`) whose address has no host.
URL_HOST_EMPTY = "Bad Request: entity URL '{url}' is invalid: URL host is empty"
# Telegram also bounds the entities' own size (MTProto's ENTITIES_TOO_LONG, "too many styled
# message entities", which the Bot API passes on): links' addresses count, not only the
# text. The bound is undocumented; a maintainer puts a message's Markdown source at about
# 9500 characters, about 5400 past its 4096 of text. Modelled as the bytes of the entities'
# addresses and code languages together.
MAX_ENTITY_EXTRA_BYTES = 5000
# How long `migrate_after_next` holds an answer at most (below the channel's 15 s timeout).
MIGRATE_HOLD_S = 10.0
_COMMAND_NAME = re.compile(r"[a-z0-9_]{1,32}")
ENTITY_TYPES = frozenset(
    {
        "mention",
        "hashtag",
        "cashtag",
        "bot_command",
        "url",
        "email",
        "phone_number",
        "bold",
        "italic",
        "underline",
        "strikethrough",
        "spoiler",
        "blockquote",
        "expandable_blockquote",
        "code",
        "pre",
        "text_link",
        "text_mention",
        "custom_emoji",
    }
)
# Parameters of the methods served whose type is an array or an object: sent as a form or a
# query, they come JSON-serialized.
JSON_PARAMETERS = frozenset(
    {
        "entities",
        "link_preview_options",
        "reply_markup",
        "reply_parameters",
        "allowed_updates",
        "commands",
        "scope",
    }
)
# Methods that put a message into a chat and so count against that chat's limit.
CHAT_LIMITED_METHODS = frozenset({"sendMessage", "editMessageText"})
# Methods that count against the bot-wide limit (polling and identity do not).
BOT_LIMITED_METHODS = frozenset(
    {"sendMessage", "editMessageText", "deleteMessage", "pinChatMessage"}
)


def _url_host(url: str) -> str | None:
    """The host of a link's address as Telegram checks it (None: none, or unreadable)."""
    try:
        return urllib.parse.urlsplit(url.strip()).hostname
    except ValueError:
        return None


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _inside_surrogate_pair(units: bytes, offset: int) -> bool:
    """Whether UTF-16 offset `offset` of a text (`units`: the text in UTF-16) falls between
    the two halves of a character outside the Basic Multilingual Plane (an emoji): no entity
    may start or end there."""
    if not 0 < offset < len(units) // 2:
        return False
    unit = int.from_bytes(units[2 * offset : 2 * offset + 2], "little")
    return 0xDC00 <= unit <= 0xDFFF


def _command_char(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char == "_")


def _ends_command(char: str) -> bool:
    """Whether `char` may stand right before a command's `/` or right after the command:
    not a letter or digit of any script, not `_`, `/`, `<` or `>` (tdlib's rule)."""
    return not (char.isalnum() or char in "_/<>")


def bot_command_entities(text: str) -> list[Json]:
    """The `bot_command` entities Telegram marks in a person's `text`: every `/command`
    (1 to 64 ASCII letters, digits or `_`, then optionally `@` and a bot's name of 3 to 32;
    with a name of another length after the `@`, none) standing alone, wherever it is in the
    text, as tdlib's `find_bot_commands` finds them.
    Offsets and lengths count UTF-16 code units, as in every entity the Bot API sends: a
    command after an emoji starts two units after where it starts in characters."""
    entities: list[Json] = []
    at = 0
    while (slash := text.find("/", at)) >= 0:
        at = slash + 1
        if slash > 0 and not _ends_command(text[slash - 1]):
            continue
        end = at
        while end < len(text) and _command_char(text[end]):
            end += 1
        if not 1 <= end - at <= 64:
            at = end
            continue
        if end < len(text) and text[end] == "@":
            name_end = end + 1
            while name_end < len(text) and _command_char(text[name_end]):
                name_end += 1
            at = name_end
            if not 3 <= name_end - end - 1 <= 32:
                continue  # "/taskcard@ off", "/taskcard@ab": no command at all
            end = name_end
        at = end
        if end < len(text) and not _ends_command(text[end]):
            continue
        entities.append(
            {
                "type": "bot_command",
                "offset": utf16_len(text[:slash]),
                "length": utf16_len(text[slash:end]),
            }
        )
    return entities


@dataclass(frozen=True)
class Window:
    """At most `max_calls` requests in any `period_s` window."""

    max_calls: int
    period_s: float

    @staticmethod
    def parse(spec: str) -> Window:
        """`"20/60"` means 20 calls per 60 seconds."""
        calls, _, period = spec.partition("/")
        return Window(int(calls), float(period or "1"))


@dataclass(frozen=True)
class FakeLimits:
    """Limits the fake enforces; None disables one. Defaults follow the Bots FAQ."""

    private_chat: Window | None = Window(1, 1.0)
    group_chat: Window | None = Window(20, 60.0)
    bot: Window | None = Window(30, 1.0)

    @staticmethod
    def unlimited() -> FakeLimits:
        return FakeLimits(None, None, None)


@dataclass
class StoredMessage:
    """One message as the chat shows it, with every earlier version of its text."""

    chat_id: int
    message_id: int
    text: str
    entities: list[Json]
    thread_id: int | None
    from_bot: bool
    date: int
    history: list[tuple[str, list[Json]]] = field(default_factory=list)
    pinned: bool = False
    deleted: bool = False
    edit_count: int = 0
    signature: str | None = None  # a channel post's `author_signature`


@dataclass(frozen=True)
class RecordedRequest:
    at_s: float
    method: str
    chat_id: int | None
    status: int
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Recorded429:
    at_s: float
    method: str
    chat_id: int | None
    scope: str
    retry_after_s: int


class ApiError(Exception):
    def __init__(self, status: int, description: str, parameters: Json | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters


class _SlidingWindow:
    def __init__(self, window: Window) -> None:
        self.window = window
        self.times: deque[float] = deque()

    def retry_after_s(self, now_s: float) -> int | None:
        """Whole seconds to wait, or None when one more call fits now."""
        while self.times and self.times[0] <= now_s - self.window.period_s:
            self.times.popleft()
        if len(self.times) < self.window.max_calls:
            return None
        wait_s = self.times[0] + self.window.period_s - now_s
        return max(1, math.ceil(wait_s))


# The placeholder users Telegram puts in `from` of a message sent on behalf of a chat.
GROUP_ANONYMOUS_BOT_ID = 1087968824
CHANNEL_BOT_ID = 136817688


def _chat_json(chat_id: int) -> Json:
    if chat_id > 0:
        return {"id": chat_id, "type": "private", "first_name": f"User{chat_id}"}
    return {"id": chat_id, "type": "supergroup", "title": f"Group {chat_id}", "is_forum": True}


class FakeTelegram:
    """The fake server plus its test controls. Use `async with` or `start()`/`stop()`."""

    def __init__(
        self,
        token: str = "123456:FAKE-test-token",
        username: str = "TaskcardTestBot",
        limits: FakeLimits | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.token = token
        self.username = username
        self.bot_id = int(token.split(":", 1)[0]) if token.split(":", 1)[0].isdigit() else 1
        self.limits = limits if limits is not None else FakeLimits()
        self._host = host
        self._port = port
        self._clock = clock
        self._runner: web.AppRunner | None = None
        self._chats: dict[int, dict[int, StoredMessage]] = {}
        self._next_id: dict[int, int] = {}
        self._kicked: set[int] = set()
        self._blocked: set[int] = set()
        self._migrated: dict[int, int] = {}
        # Public chats by lower-case username: (id, type, username as set, bot is a member).
        self._public: dict[str, tuple[int, str, str, bool]] = {}
        self._deleted_topics: set[tuple[int, int]] = set()
        # Forum topics opened with `create_topic`, by (chat, thread id): the service message
        # that opened each (`forum_topic_created`), which Telegram gives every message in the
        # topic that replies to nothing else as its `reply_to_message`.
        self._topics: dict[tuple[int, int], Json] = {}
        # Channels by id: their title. Every message there is the channel's post.
        self._channels: dict[int, str] = {}
        self._windows: dict[str, _SlidingWindow] = {}
        self._updates: list[Json] = []
        self._next_update_id = 1
        self._update_waiters: set[asyncio.Future[None]] = set()
        self._poll_generation = 0
        self._failures: dict[str, deque[tuple[int, str, Json | None]]] = {}
        self._chat_failures: dict[int, tuple[int, str, Json | None]] = {}
        self._chat_delays_s: dict[int, float] = {}
        self._answer_delay_s: dict[str, float] = {}
        self._answer_gates: dict[str, asyncio.Event] = {}
        self._drops: dict[str, int] = {}
        self._raw: dict[str, deque[tuple[int, bytes, str]]] = {}
        self._migrate_before: dict[str, tuple[int, int]] = {}
        self._migrate_after: dict[str, tuple[int, int]] = {}
        self._confirmed_offset = 0  # the highest getUpdates offset received
        self._offset_advanced = asyncio.Event()
        self.requests: list[RecordedRequest] = []
        self.webhook_url: str | None = None  # set: getUpdates answers 409 as Telegram does
        # The bot's command menu per (scope type, language code), as setMyCommands left it.
        self.my_commands: dict[tuple[str, str], list[Json]] = {}
        self.rate_limited: list[Recorded429] = []

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        # Any other path: the Bot API's own 404, a JSON error (PTB reads it as InvalidToken).
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        self._port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        self._poll_generation += 1
        self._wake_pollers()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeTelegram:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        """The API root, without `/bot<token>`: what `api_base_url` in the config takes."""
        return f"http://{self._host}:{self._port}"

    # ---------------------------------------------------------------- test controls

    def messages(self, chat_id: int | str, thread_id: int | None = None) -> list[StoredMessage]:
        """Messages the chat shows now (not deleted), oldest first; one topic if given."""
        chat = self._chats.get(int(chat_id), {})
        return [
            m
            for m in chat.values()
            if not m.deleted and (thread_id is None or m.thread_id == thread_id)
        ]

    def bot_messages(self, chat_id: int | str, thread_id: int | None = None) -> list[StoredMessage]:
        return [m for m in self.messages(chat_id, thread_id) if m.from_bot]

    def message(self, chat_id: int | str, message_id: int | str) -> StoredMessage | None:
        return self._chats.get(int(chat_id), {}).get(int(message_id))

    def edit_history(self, chat_id: int | str, message_id: int | str) -> list[str]:
        """Every text the message has shown, the first send first and the current last."""
        stored = self.message(chat_id, message_id)
        if stored is None:
            return []
        return [text for text, _ in stored.history] + [stored.text]

    def every_text(self, chat_id: int | str) -> list[str]:
        """Every text the bot's messages in the chat have shown, each message's in order."""
        return [
            text
            for message in self.bot_messages(chat_id)
            for text in [*(old for old, _ in message.history), message.text]
        ]

    def user_delete(self, chat_id: int | str, message_id: int | str) -> None:
        """Delete a message as a person in the chat would."""
        stored = self.message(chat_id, message_id)
        if stored is not None:
            stored.deleted = True

    def kick(self, chat_id: int | str) -> None:
        """Remove the bot from a group, or have the user block it in a private chat."""
        chat = int(chat_id)
        (self._blocked if chat > 0 else self._kicked).add(chat)

    def block(self, chat_id: int | str) -> None:
        self.kick(chat_id)

    def add_public_chat(
        self, username: str, chat_id: int, *, kind: str = "supergroup", member: bool = True
    ) -> None:
        """A public channel or supergroup reachable by `@username` (getChat, and `chat_id`
        of other methods), as Telegram reads it: regardless of case. `member=False`: the bot
        is not in it, and getChat is refused as Telegram refuses it for such a channel.
        `kind="private"`: a person's username (getChat answers their private chat)."""
        self._public[username.removeprefix("@").lower()] = (chat_id, kind, username, member)

    def migrate(
        self, chat_id: int | str, new_chat_id: int, *, announce: bool = True, user_id: int = 1000
    ) -> None:
        """Upgrade a basic group to a supergroup with `new_chat_id`, as Telegram does when an
        administrator enables topics or makes the group public: every later request naming
        the old id, whatever the method, is refused (HTTP 400, the new id in
        `parameters.migrate_to_chat_id`), and two service messages arrive as updates:
        `migrate_to_chat_id` in the old group, then `migrate_from_chat_id` in the new
        supergroup (`announce=False` leaves them out, as if they were missed)."""
        old = int(chat_id)
        self._migrated[old] = new_chat_id
        if not announce:
            return
        person: Json = {"id": user_id, "is_bot": False, "first_name": f"User{user_id}"}
        title = f"Group {old}"
        self._push_update(
            {
                "message": {
                    "message_id": self._allocate_id(old),
                    "date": self._date(),
                    "chat": {"id": old, "type": "group", "title": title},
                    "from": person,
                    "migrate_to_chat_id": new_chat_id,
                }
            }
        )
        self._push_update(
            {
                "message": {
                    "message_id": self._allocate_id(new_chat_id),
                    "date": self._date(),
                    "chat": {**_chat_json(new_chat_id), "title": title},
                    "from": person,
                    "migrate_from_chat_id": old,
                }
            }
        )

    def migrate_before_next(self, method: str, chat_id: int | str, new_chat_id: int) -> None:
        """`migrate(chat_id, new_chat_id, announce=False)` at the moment the next call of
        `method` naming `chat_id` arrives, before it is served: the upgrade lands between two
        requests of one delivery (a card posted, then its pin refused)."""
        self._migrate_before[method] = (int(chat_id), new_chat_id)

    def migrate_after_next(self, method: str, chat_id: int | str, new_chat_id: int) -> None:
        """Serve the next call of `method` naming `chat_id` in the group, then `migrate` it
        (announced) and hold that call's answer until a getUpdates has confirmed both service
        messages, so the client handled the move (at most `MIGRATE_HOLD_S`, less than the
        channel's request timeout): the upgrade lands while the answer to a request the old
        group accepted is still on its way."""
        self._migrate_after[method] = (int(chat_id), new_chat_id)

    def readmit(self, chat_id: int | str) -> None:
        self._kicked.discard(int(chat_id))
        self._blocked.discard(int(chat_id))

    def create_topic(
        self, chat_id: int | str, name: str, user_id: int = 1000, announced: bool = True
    ) -> int:
        """A person opens a forum topic named `name`: its thread id is the id of the service
        message that opened it (`forum_topic_created`, delivered as an update as Telegram
        delivers it, privacy mode or not; not `announced`: opened before the bot was in the
        chat, so no update comes). Returns the thread id."""
        chat = int(chat_id)
        thread = self._allocate_id(chat)
        stored = StoredMessage(chat, thread, "", [], thread, from_bot=False, date=self._date())
        opened = self._message_json(stored, user_id=user_id)
        del opened["text"]
        opened["forum_topic_created"] = {"name": name, "icon_color": 7322096}
        self._topics[(chat, thread)] = opened
        if announced:
            self._push_update({"message": opened})
        return thread

    def edit_topic(self, chat_id: int | str, thread_id: int, name: str) -> int:
        """A person renames forum topic `thread_id`: the service message `forum_topic_edited`
        (`name`, the new one) comes in the topic as an update. Returns the update id."""
        chat = int(chat_id)
        stored = StoredMessage(
            chat, self._allocate_id(chat), "", [], thread_id, from_bot=False, date=self._date()
        )
        edited = self._message_json(stored, user_id=1000)
        del edited["text"]
        edited["forum_topic_edited"] = {"name": name}
        # The message that opened the topic stays as it was: the messages in the topic go on
        # replying to it, with the name the topic was opened with.
        return self._push_update({"message": edited})

    def delete_topic(self, chat_id: int | str, thread_id: int) -> None:
        """An administrator deletes forum topic `thread_id`: Telegram deletes its messages
        with it (the bot's too), so editing, deleting or pinning one is refused as for any
        deleted message ("message to edit not found"), and posting in the topic is refused
        ("message thread not found")."""
        chat = int(chat_id)
        self._deleted_topics.add((chat, thread_id))
        self._topics.pop((chat, thread_id), None)
        for stored in self._chats.get(chat, {}).values():
            if stored.thread_id == thread_id:
                stored.deleted = True

    def fail_next(
        self,
        method: str,
        status: int = 500,
        description: str = "Internal",
        parameters: Json | None = None,
    ) -> None:
        """Answer the next call of `method` with this error (for 5xx and odd cases).

        `parameters` is the Bot API's `ResponseParameters` object of the error body, e.g.
        `{"retry_after": 5}` for a scripted 429.
        """
        self._failures.setdefault(method, deque()).append((status, description, parameters))

    def answer_raw_next(
        self, method: str, status: int, body: bytes, content_type: str = "text/html"
    ) -> None:
        """Answer the next call of `method` with these exact bytes, without performing it:
        what a proxy or Telegram's front end sends instead of a Bot API answer (an HTML 502
        page, an empty body, a 200 carrying `ok: false`)."""
        self._raw.setdefault(method, deque()).append((status, body, content_type))

    def fail_chat(
        self,
        chat_id: int | str,
        status: int,
        description: str,
        parameters: Json | None = None,
    ) -> None:
        """Answer every call naming `chat_id` (sends, edits, deletes, pins) with this error,
        until `clear_failures`: one chat the platform refuses while the others are served
        (a chat id that does not exist, a flood that lasts)."""
        self._chat_failures[int(chat_id)] = (status, description, parameters)

    def hang_chat(self, chat_id: int | str, seconds: float) -> None:
        """Answer every call naming `chat_id` only after `seconds` (beyond the client's
        timeout: a chat whose requests time out), until `clear_failures`."""
        self._chat_delays_s[int(chat_id)] = seconds

    def clear_failures(self) -> None:
        """Forget the failures of `fail_next` not yet answered, and those of `fail_chat` and
        `hang_chat`: every call is served again."""
        self._failures.clear()
        self._chat_failures.clear()
        self._chat_delays_s.clear()

    def delay_answers(self, method: str, seconds: float) -> None:
        """Perform every call of `method` at once but answer it `seconds` later (0: at once)."""
        self._answer_delay_s[method] = seconds

    def hold_answers(self, method: str) -> None:
        """Perform every call of `method` at once but answer none until `release_answers`."""
        self._answer_gates.setdefault(method, asyncio.Event())

    def release_answers(self, method: str) -> None:
        """Answer the calls of `method` that `hold_answers` holds, and the next ones at once."""
        gate = self._answer_gates.pop(method, None)
        if gate is not None:
            gate.set()

    def drop_after_accept(self, method: str, times: int = 1) -> None:
        """Perform the next `times` calls of `method`, then close each connection unanswered."""
        self._drops[method] = self._drops.get(method, 0) + times

    def inject_message(
        self,
        chat_id: int | str,
        text: str,
        user_id: int = 1000,
        thread_id: int | None = None,
        edit_of: int | None = None,
        reply_to: int | None = None,
        photo: bool = False,
        sender: Json | None = None,
        text_mentions: Mapping[str, int] | None = None,
        entities: Sequence[Json] = (),
    ) -> int:
        """A person writes `text` (or edits their message `edit_of`), as a reply to message
        `reply_to` when given; with `photo`, `text` is the caption of a picture they send;
        `sender` replaces the fields naming who sent it (see `inject_on_behalf`);
        `text_mentions` maps a part of `text` to the id of the person it mentions, as a
        client marks a mention of someone without a username (a `text_mention` entity, whose
        text is the person's name); `entities` are more entities as a client marked them,
        passed on unchecked (formatting nested in a mention, or a hostile client's overlaps
        and offsets out of range). Returns the update id."""
        chat = int(chat_id)
        entities = [*self._people_entities(text, text_mentions or {}), *entities]
        if edit_of is None:
            message_id = self._allocate_id(chat)
            stored = StoredMessage(
                chat, message_id, text, entities, thread_id, from_bot=False, date=self._date()
            )
            self._chats.setdefault(chat, {})[message_id] = stored
            kind = "message"
        else:
            existing = self.message(chat, edit_of)
            if existing is None:
                raise KeyError(f"no message {edit_of} in chat {chat}")
            existing.history.append((existing.text, existing.entities))
            existing.text, existing.entities = text, entities
            stored = existing
            kind = "edited_message"
        message = self._message_json(stored, user_id=user_id)
        message.update(sender or {})
        if reply_to is not None:
            message["reply_to_message"] = self._message_json(
                self._existing(chat, reply_to, "Bad Request: message to be replied not found")
            )
        elif thread_id is not None and (opened := self._topics.get((chat, thread_id))):
            message["reply_to_message"] = opened  # in a topic, replying to nothing else
        if photo:
            message["caption"] = message.pop("text")
            if "entities" in message:
                message["caption_entities"] = message.pop("entities")
            message["photo"] = [
                {"file_id": "photo-1", "file_unique_id": "p1", "width": 90, "height": 90}
            ]
        if kind == "edited_message":
            message["edit_date"] = self._date()
        return self._push_update({kind: message})

    def make_channel(self, chat_id: int | str, title: str | None = None) -> None:
        """Make `chat_id` a channel titled `title`: from now on every message there, the
        bot's too, is shaped as Telegram shapes a channel's post (`_message_json`)."""
        chat = int(chat_id)
        self._channels[chat] = title if title is not None else f"Channel {chat}"

    def inject_channel_post(
        self,
        chat_id: int | str,
        text: str,
        reply_to: int | None = None,
        signature: str | None = None,
    ) -> int:
        """An administrator posts `text` in channel `chat_id` (a `channel_post` update: it is
        signed by the channel, without a user, and carries `author_signature` when the
        channel signs its posts), as a reply to post `reply_to` when given; the chat becomes
        a channel (`make_channel`) if it was none. Returns the update id."""
        chat = int(chat_id)
        if chat not in self._channels:
            self.make_channel(chat)
        message_id = self._allocate_id(chat)
        entities = self._people_entities(text)
        stored = StoredMessage(
            chat, message_id, text, entities, None, from_bot=False, date=self._date()
        )
        stored.signature = signature
        self._chats.setdefault(chat, {})[message_id] = stored
        post = self._message_json(stored)
        if reply_to is not None:
            post["reply_to_message"] = self._message_json(
                self._existing(chat, reply_to, "Bad Request: message to be replied not found")
            )
        return self._push_update({"channel_post": post})

    @staticmethod
    def _people_entities(text: str, text_mentions: Mapping[str, int] | None = None) -> list[Json]:
        """The entities Telegram gives `text` a person sent, held to the bounds the API
        holds a bot's entities to (in UTF-16 units, never inside a character)."""
        entities = bot_command_entities(text)
        for named, user_id in (text_mentions or {}).items():
            start = text.index(named)
            entities.append(
                {
                    "type": "text_mention",
                    "offset": utf16_len(text[:start]),
                    "length": utf16_len(named),
                    "user": {"id": user_id, "is_bot": False, "first_name": named},
                }
            )
        entities.sort(key=lambda entity: int(entity["offset"]))
        units = text.encode("utf-16-le", "surrogatepass")
        for entity in entities:
            start, end = entity["offset"], entity["offset"] + entity["length"]
            assert 0 <= start < end <= len(units) // 2, (text, entity)
            assert not any(_inside_surrogate_pair(units, at) for at in (start, end)), entity
        return entities

    def inject_on_behalf(
        self,
        chat_id: int | str,
        text: str,
        channel_id: int | None = None,
        signature: str | None = None,
        **options: Any,
    ) -> int:
        """A message posted in group `chat_id` on behalf of a chat, as Telegram shapes it: by
        an administrator who remains anonymous (`sender_chat` is the group itself, `from` the
        GroupAnonymousBot placeholder) or, with `channel_id`, as that channel (a linked channel,
        or one a member picked under "Send as": `from` is the Channel_Bot placeholder).
        `signature`: the anonymous administrator's custom title, which Telegram sends as the
        message's `author_signature`. `options` as for `inject_message`. Returns the update
        id."""
        chat = int(chat_id)
        if channel_id is None:
            sender_chat = _chat_json(chat)
            author = {"id": GROUP_ANONYMOUS_BOT_ID, "is_bot": True, "first_name": "Group",
                      "username": "GroupAnonymousBot"}  # fmt: skip
        else:
            sender_chat = {"id": channel_id, "type": "channel", "title": f"Channel {channel_id}"}
            author = {"id": CHANNEL_BOT_ID, "is_bot": True, "first_name": "Channel",
                      "username": "Channel_Bot"}  # fmt: skip
        sender: Json = {"from": author, "sender_chat": sender_chat}
        if signature is not None:
            sender["author_signature"] = signature
        return self.inject_message(chat, text, sender=sender, **options)

    def inject_command(
        self,
        chat_id: int | str,
        text: str,
        user_id: int = 1000,
        thread_id: int | None = None,
        edited: bool = False,
    ) -> int:
        """A command message; `edited=True` posts it and then delivers an edit of it."""
        if not edited:
            return self.inject_message(chat_id, text, user_id, thread_id)
        self.inject_message(chat_id, "hello", user_id, thread_id)
        original = self.messages(chat_id)[-1].message_id
        return self.inject_message(chat_id, text, user_id, thread_id, edit_of=original)

    def inject_update(self, update: Json) -> int:
        """Serve `update` (without its `update_id`) exactly as given, however it is shaped;
        returns the update id."""
        return self._push_update(update)

    @property
    def waiting_pollers(self) -> int:
        """getUpdates requests currently held open by a long poll."""
        return sum(1 for waiter in self._update_waiters if not waiter.done())

    @property
    def pending_updates(self) -> list[Json]:
        """Updates not yet confirmed by a getUpdates offset."""
        return list(self._updates)

    def count(self, method: str | None = None, chat_id: int | str | None = None) -> int:
        """Requests received (including rejected ones) matching the filters."""
        chat = None if chat_id is None else int(chat_id)
        return sum(
            1
            for r in self.requests
            if (method is None or r.method == method) and (chat is None or r.chat_id == chat)
        )

    def reset_counters(self) -> None:
        """Forget recorded requests, recorded 429s and rate windows (not messages)."""
        self.requests.clear()
        self.rate_limited.clear()
        self._windows.clear()

    # ---------------------------------------------------------------- HTTP

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await self._params(request)
        chat_id = self._optional_int(params.get("chat_id"))
        planned = self._migrate_before.get(method)
        if planned is not None and planned[0] == chat_id:
            del self._migrate_before[method]
            self.migrate(*planned, announce=False)
        raw = self._raw.get(method)
        if raw:
            status, payload, content_type = raw.popleft()
            self.requests.append(RecordedRequest(self._clock(), method, chat_id, status, params))
            return web.Response(body=payload, status=status, content_type=content_type)
        if request.match_info["token"] != self.token:
            status, body = 401, {"ok": False, "error_code": 401, "description": "Unauthorized"}
        else:
            try:
                result = await self._dispatch(method, params, chat_id)
                status, body = 200, {"ok": True, "result": result}
            except ApiError as exc:
                status = exc.status
                body = {"ok": False, "error_code": exc.status, "description": exc.description}
                if exc.parameters:
                    body["parameters"] = exc.parameters
        self.requests.append(RecordedRequest(self._clock(), method, chat_id, status, params))
        after = self._migrate_after.get(method)
        if after is not None and after[0] == chat_id and status == 200:
            del self._migrate_after[method]
            self.migrate(*after)
            await self._until_confirmed(self._next_update_id - 1)
        if self._drops.get(method, 0) > 0:
            self._drops[method] -= 1
            transport = request.transport
            if transport is not None:
                transport.close()
            raise web.HTTPServiceUnavailable()  # never reaches the client: it is gone
        delay_s = self._answer_delay_s.get(method, 0.0)
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        gate = self._answer_gates.get(method)
        if gate is not None:
            await gate.wait()
        return web.Response(
            body=json.dumps(body).encode(), status=status, content_type="application/json"
        )

    @staticmethod
    async def _not_found(request: web.Request) -> web.Response:
        body = {"ok": False, "error_code": 404, "description": "Not Found"}
        return web.json_response(body, status=404)

    async def _until_confirmed(self, update_id: int) -> None:
        """Wait until a getUpdates offset has passed `update_id` (bounded)."""
        deadline_s = time.monotonic() + MIGRATE_HOLD_S
        while self._confirmed_offset <= update_id:
            self._offset_advanced.clear()
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._offset_advanced.wait(), remaining_s)

    @staticmethod
    async def _params(request: web.Request) -> Json:
        """Query, form and JSON parameters merged; the values of the parameters the API
        types as arrays or objects decoded when they come JSON-serialized. Any other value
        is taken as sent: a text that looks like JSON (`[WIP] ...`) is still a text."""
        params: Json = dict(request.query)
        if request.can_read_body:
            if request.content_type == "application/json":
                data = await request.json()
                if isinstance(data, dict):
                    params.update(data)
            else:
                form = await request.post()
                params.update({k: v for k, v in form.items() if isinstance(v, str)})
        for key, value in list(params.items()):
            if key in JSON_PARAMETERS and isinstance(value, str) and value[:1] in ("[", "{"):
                with contextlib.suppress(ValueError):
                    params[key] = json.loads(value)
        return params

    @staticmethod
    def _optional_int(value: Any) -> int | None:
        if value is None or value == "":
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            return None

    async def _dispatch(self, method: str, params: Json, chat_id: int | None) -> Any:
        failures = self._failures.get(method)
        if failures:
            status, description, parameters = failures.popleft()
            raise ApiError(status, description, parameters)
        handlers: dict[str, Callable[[Json, int | None], Any]] = {
            "getMe": self._get_me,
            "getChat": self._get_chat,
            "sendMessage": self._send_message,
            "editMessageText": self._edit_message_text,
            "deleteMessage": self._delete_message,
            "pinChatMessage": self._pin_chat_message,
            "setMyCommands": self._set_my_commands,
            "getMyCommands": self._get_my_commands,
            "deleteWebhook": self._delete_webhook,
            "setWebhook": self._set_webhook,
            "close": lambda p, c: True,
            "logOut": lambda p, c: True,
        }
        if method == "getUpdates":
            return await self._get_updates(params)
        handler = handlers.get(method)
        if handler is None:
            raise ApiError(404, "Not Found")
        if chat_id is not None and chat_id in self._chat_delays_s:
            await asyncio.sleep(self._chat_delays_s[chat_id])
        if chat_id is not None and chat_id in self._chat_failures:
            raise ApiError(*self._chat_failures[chat_id])
        self._refuse_migrated(chat_id)
        if method in BOT_LIMITED_METHODS:
            self._check_chat(chat_id)
            self._check_limits(method, chat_id)
        return handler(params, chat_id)

    # ---------------------------------------------------------------- checks

    def _check_chat(self, chat_id: int | None) -> None:
        if chat_id is None:
            raise ApiError(400, "Bad Request: chat_id is empty")
        if chat_id in self._kicked:
            raise ApiError(403, KICKED)
        if chat_id in self._blocked:
            raise ApiError(403, BLOCKED)

    def _refuse_migrated(self, chat_id: int | None) -> None:
        """Telegram's answer to any method naming a group that became a supergroup."""
        if chat_id is not None and chat_id in self._migrated:
            raise ApiError(
                400,
                "Bad Request: group chat was upgraded to a supergroup chat",
                {"migrate_to_chat_id": self._migrated[chat_id]},
            )

    def _window(self, key: str, window: Window) -> _SlidingWindow:
        current = self._windows.get(key)
        if current is None or current.window != window:
            current = self._windows[key] = _SlidingWindow(window)
        return current

    def _check_limits(self, method: str, chat_id: int | None) -> None:
        now_s = self._clock()
        windows: list[tuple[str, _SlidingWindow]] = []
        if method in CHAT_LIMITED_METHODS and chat_id is not None:
            limit = self.limits.private_chat if chat_id > 0 else self.limits.group_chat
            if limit is not None:
                key = f"chat:{chat_id}"
                windows.append((key, self._window(key, limit)))
        if self.limits.bot is not None:
            windows.append(("bot", self._window("bot", self.limits.bot)))
        for scope, window in windows:
            wait_s = window.retry_after_s(now_s)
            if wait_s is not None:
                self.rate_limited.append(Recorded429(now_s, method, chat_id, scope, wait_s))
                raise ApiError(
                    429,
                    f"Too Many Requests: retry after {wait_s}",
                    {"retry_after": wait_s},
                )
        for _, window in windows:
            window.times.append(now_s)

    @staticmethod
    def _validate_text(text: Any, entities: Any) -> tuple[str, list[Json]]:
        if not isinstance(text, str) or not text.strip():
            raise ApiError(400, TEXT_EMPTY)
        length = utf16_len(text)
        if length > MAX_TEXT_UTF16:
            raise ApiError(400, TOO_LONG)
        if entities is None:
            return text, []
        if not isinstance(entities, list):
            raise ApiError(400, "Bad Request: can't parse entities JSON object")
        checked: list[Json] = []
        units = text.encode("utf-16-le", "surrogatepass")
        for index, entity in enumerate(entities):
            if not isinstance(entity, dict) or entity.get("type") not in ENTITY_TYPES:
                raise ApiError(400, f"Bad Request: can't parse entities: bad entity {index}")
            offset, size = entity.get("offset"), entity.get("length")
            if not isinstance(offset, int) or not isinstance(size, int):
                raise ApiError(400, f"Bad Request: can't parse entities: entity {index}")
            if offset < 0 or size <= 0 or offset + size > length:
                raise ApiError(
                    400, f"Bad Request: can't parse entities: entity {index} is out of the text"
                )
            if entity["type"] == "text_link" and not entity.get("url"):
                raise ApiError(400, f"Bad Request: can't parse entities: entity {index} url")
            if entity["type"] == "text_link" and not _url_host(str(entity["url"])):
                raise ApiError(400, URL_HOST_EMPTY.format(url=entity["url"]))
            if entity["type"] == "custom_emoji" and not entity.get("custom_emoji_id"):
                raise ApiError(400, f"Bad Request: can't parse entities: entity {index} emoji")
            if entity["type"] == "text_mention" and not isinstance(entity.get("user"), dict):
                raise ApiError(400, f"Bad Request: can't parse entities: entity {index} user")
            if any(_inside_surrogate_pair(units, at) for at in (offset, offset + size)):
                raise ApiError(
                    400, f"Bad Request: can't parse entities: entity {index} splits a character"
                )
            checked.append(dict(entity))
        # Telegram applies the first `MAX_ENTITIES` entities of a message (in the order of
        # their offsets) and ignores the rest without an error: the text shows unformatted
        # there, and a mention or command the sender meant as code is live again.
        quotes = sorted(
            (entity["offset"], entity["offset"] + entity["length"])
            for entity in checked
            if entity["type"] in ("blockquote", "expandable_blockquote")
        )
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(quotes)):
            raise ApiError(400, "Bad Request: can't parse entities: a quote inside a quote")
        extra_bytes = sum(
            len(str(entity.get(key) or "").encode())
            for entity in checked
            for key in ("url", "language")
        )
        if extra_bytes > MAX_ENTITY_EXTRA_BYTES:
            raise ApiError(400, ENTITIES_TOO_LONG)
        if len(checked) > MAX_ENTITIES:
            checked = sorted(checked, key=lambda entity: entity["offset"])[:MAX_ENTITIES]
        return text, checked

    # ---------------------------------------------------------------- methods

    def _get_chat(self, params: Json, chat_id: int | None) -> Json:
        """getChat by numeric id or by a public chat's `@username`. An unknown username is
        Telegram's 400 "chat not found" (a private user's username too: only public channels
        and supergroups are found by name); a chat the bot was removed from is its 403."""
        raw = params.get("chat_id")
        public = None
        if isinstance(raw, str) and raw.startswith("@"):
            public = self._public.get(raw[1:].lower())
            if public is None:
                raise ApiError(400, CHAT_NOT_FOUND)
            chat_id = public[0]
            if not public[3]:
                raise ApiError(403, NOT_MEMBER)
        if chat_id is None:
            raise ApiError(400, "Bad Request: chat_id is empty")
        self._check_chat(chat_id)
        if public is None:
            public = next((p for p in self._public.values() if p[0] == chat_id), None)
        chat = self._chat_of(chat_id)
        if public is not None and public[1] == "private":  # a person's (or a bot's) username
            chat = {"id": chat_id, "type": "private", "first_name": public[2]}
            chat["username"] = public[2].removeprefix("@")
        elif public is not None:
            chat = {"id": chat_id, "type": public[1], "title": f"Public {public[2]}"}
            chat["username"] = public[2].removeprefix("@")
        # The fields every ChatFullInfo carries.
        return {
            **chat,
            "accent_color_id": 0,
            "max_reaction_count": 11,
            "accepted_gift_types": {
                "unlimited_gifts": False,
                "limited_gifts": False,
                "unique_gifts": False,
                "premium_subscription": False,
                "gifts_from_channels": False,
            },
        }

    def _get_me(self, params: Json, chat_id: int | None) -> Json:
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": "Taskcard Test",
            "username": self.username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    def _send_message(self, params: Json, chat_id: int | None) -> Json:
        assert chat_id is not None
        text, entities = self._validate_text(params.get("text"), params.get("entities"))
        thread_id = self._optional_int(params.get("message_thread_id"))
        if thread_id is not None and (chat_id > 0 or (chat_id, thread_id) in self._deleted_topics):
            raise ApiError(400, THREAD_NOT_FOUND)
        message_id = self._allocate_id(chat_id)
        stored = StoredMessage(
            chat_id, message_id, text, entities, thread_id, from_bot=True, date=self._date()
        )
        self._chats.setdefault(chat_id, {})[message_id] = stored
        return self._message_json(stored)

    def _edit_message_text(self, params: Json, chat_id: int | None) -> Json:
        assert chat_id is not None
        stored = self._existing(chat_id, params.get("message_id"), EDIT_NOT_FOUND)
        if not stored.from_bot:
            raise ApiError(400, "Bad Request: message can't be edited")
        text, entities = self._validate_text(params.get("text"), params.get("entities"))
        if text == stored.text and entities == stored.entities:
            raise ApiError(400, NOT_MODIFIED)
        stored.history.append((stored.text, stored.entities))
        stored.text, stored.entities = text, entities
        stored.edit_count += 1
        message = self._message_json(stored)
        message["edit_date"] = self._date()
        return message

    def _delete_message(self, params: Json, chat_id: int | None) -> bool:
        assert chat_id is not None
        self._existing(chat_id, params.get("message_id"), DELETE_NOT_FOUND).deleted = True
        return True

    def _pin_chat_message(self, params: Json, chat_id: int | None) -> bool:
        assert chat_id is not None
        self._existing(chat_id, params.get("message_id"), PIN_NOT_FOUND).pinned = True
        return True

    @staticmethod
    def _menu_key(params: Json) -> tuple[str, str]:
        scope = params.get("scope")
        if isinstance(scope, str):  # form-encoded requests carry JSON-serialized objects
            scope = json.loads(scope)
        kind = scope.get("type", "default") if isinstance(scope, dict) else "default"
        return str(kind), str(params.get("language_code") or "")

    def _set_my_commands(self, params: Json, chat_id: int | None) -> bool:
        """Validates what the real API does: 1-100 commands, names 1-32 of [a-z0-9_]."""
        commands = params.get("commands")
        if isinstance(commands, str):
            commands = json.loads(commands)
        if not isinstance(commands, list) or len(commands) > 100:
            raise ApiError(400, "Bad Request: can't parse commands JSON object")
        for item in commands:
            name = item.get("command") if isinstance(item, dict) else None
            text = item.get("description") if isinstance(item, dict) else None
            if not isinstance(name, str) or not _COMMAND_NAME.fullmatch(name):
                raise ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not isinstance(text, str) or not 1 <= len(text) <= 256:
                raise ApiError(400, "Bad Request: command description is empty")
        self.my_commands[self._menu_key(params)] = [
            {"command": c["command"], "description": c["description"]} for c in commands
        ]
        return True

    def _get_my_commands(self, params: Json, chat_id: int | None) -> list[Json]:
        return list(self.my_commands.get(self._menu_key(params), []))

    def _set_webhook(self, params: Json, chat_id: int | None) -> bool:
        self.webhook_url = str(params.get("url") or "") or None
        return True

    def _delete_webhook(self, params: Json, chat_id: int | None) -> bool:
        self.webhook_url = None
        return True

    async def _get_updates(self, params: Json) -> list[Json]:
        if self.webhook_url:
            raise ApiError(409, WEBHOOK_CONFLICT)
        offset = self._optional_int(params.get("offset"))
        timeout_s = float(params.get("timeout") or 0)
        allowed = params.get("allowed_updates")
        if offset is not None:
            self._confirmed_offset = max(self._confirmed_offset, offset)
            self._offset_advanced.set()
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
        # A newer poller ends the one still waiting, as the real API does.
        self._poll_generation += 1
        generation = self._poll_generation
        self._wake_pollers()
        deadline_s = time.monotonic() + timeout_s
        while True:
            ready = self._deliverable(allowed)
            if ready or time.monotonic() >= deadline_s:
                return ready
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._update_waiters.add(waiter)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.shield(waiter), max(0.0, deadline_s - time.monotonic())
                    )
            finally:
                self._update_waiters.discard(waiter)
            if generation != self._poll_generation:
                raise ApiError(409, CONFLICT)

    def _deliverable(self, allowed: Any) -> list[Json]:
        if isinstance(allowed, list) and allowed:
            # Updates of kinds the poller did not ask for are dropped, as Telegram does.
            self._updates = [u for u in self._updates if any(k in u for k in allowed)]
        return list(self._updates)

    # ---------------------------------------------------------------- helpers

    def _push_update(self, update: Json) -> int:
        update_id = self._next_update_id
        self._next_update_id += 1
        self._updates.append({"update_id": update_id, **update})
        self._wake_pollers()
        return update_id

    def _wake_pollers(self) -> None:
        for waiter in self._update_waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _allocate_id(self, chat_id: int) -> int:
        next_id = self._next_id.get(chat_id, 1)
        self._next_id[chat_id] = next_id + 1
        return next_id

    def _existing(self, chat_id: int, message_id: Any, missing: str) -> StoredMessage:
        stored = self.message(chat_id, self._optional_int(message_id) or 0)
        if stored is None or stored.deleted:
            raise ApiError(400, missing)
        return stored

    @staticmethod
    def _date() -> int:
        return int(time.time())

    def _chat_of(self, chat_id: int) -> Json:
        """The `Chat` object of `chat_id`: a channel made so (`make_channel`), else by id."""
        title = self._channels.get(chat_id)
        if title is None:
            return _chat_json(chat_id)
        return {"id": chat_id, "type": "channel", "title": title}

    def _message_json(self, stored: StoredMessage, user_id: int | None = None) -> Json:
        if stored.chat_id in self._channels:
            # A channel's post, the bot's too, names no user: it has no `from`, and is sent
            # by the channel itself (`sender_chat`), signed when the channel signs its posts.
            channel = self._chat_of(stored.chat_id)
            post: Json = {
                "message_id": stored.message_id,
                "date": stored.date,
                "chat": channel,
                "sender_chat": channel,
                "text": stored.text,
            }
            if stored.signature is not None:
                post["author_signature"] = stored.signature
            if stored.entities:
                post["entities"] = stored.entities
            return post
        sender: Json = (
            {"id": self.bot_id, "is_bot": True, "first_name": "Taskcard Test"}
            if stored.from_bot
            else {"id": user_id, "is_bot": False, "first_name": f"User{user_id}"}
        )
        message: Json = {
            "message_id": stored.message_id,
            "date": stored.date,
            "chat": _chat_json(stored.chat_id),
            "from": sender,
            "text": stored.text,
        }
        if sender["is_bot"]:
            message["from"]["username"] = self.username
        if stored.entities:
            message["entities"] = stored.entities
        if stored.thread_id is not None:
            message["message_thread_id"] = stored.thread_id
            message["is_topic_message"] = True
        return message


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run the fake Telegram Bot API server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--token", default="123456:FAKE-test-token")
    parser.add_argument("--username", default="TaskcardTestBot")
    parser.add_argument("--private-limit", default="1/1", help="calls/seconds, or 'off'")
    parser.add_argument("--group-limit", default="20/60", help="calls/seconds, or 'off'")
    parser.add_argument("--bot-limit", default="30/1", help="calls/seconds, or 'off'")
    return parser.parse_args(argv)


def _window_arg(spec: str) -> Window | None:
    return None if spec == "off" else Window.parse(spec)


async def _serve(args: argparse.Namespace) -> None:
    limits = FakeLimits(
        _window_arg(args.private_limit), _window_arg(args.group_limit), _window_arg(args.bot_limit)
    )
    fake = FakeTelegram(args.token, args.username, limits, args.host, args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with fake:
        print(f"fake Telegram Bot API listening on {fake.base_url}", flush=True)
        await stop.wait()
        print(f"requests={len(fake.requests)} rate_limited={len(fake.rate_limited)}", flush=True)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_serve(_parse_args(argv)))


if __name__ == "__main__":
    main()
