"""Commands across instances: whoever receives a command publishes it, every instance reads.

The instance that receives a bot's updates (the poll lease holder on Telegram; whichever
instance Feishu delivers an event to) does not handle it directly: it appends the command to
the channel's stream in Redis, once (a command's chat and message id are claimed with `SET NX`
in the same script, so a poller that took over and fetched the batch again adds nothing twice).
Every instance reads the stream from where it was and hands each command to its service: each
applies it to the routes it serves (preferences are shared, so any may write them), and exactly
one of the instances that route the chat answers (the first to claim the reply).

`ClusteredChannel` wraps a channel for this and delegates everything else unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any, TypeVar, cast, get_args

from redis.asyncio import Redis
from redis.exceptions import RedisError

from taskcard.bridge.cluster.limiter import WRONG_TYPE_WAIT_S
from taskcard.bridge.store.redis import (
    WrongKeyType,
    answered,
    permission_fix,
    raise_if_cancel_swallowed,
    raw_answer,
    readable,
    redis_trouble,
    refused_permission,
    wrong_type,
)
from taskcard.channels.base import (
    BoardView,
    CardView,
    Channel,
    ChatRef,
    CommandName,
    CommandSink,
    IncomingCommand,
    Operation,
    Outgoing,
    RateLimited,
    RateScope,
    ReplyTo,
    SentAs,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

STREAM_MAXLEN = 10_000
SEEN_TTL_S = 86_400
READ_BLOCK_MS = 2_000
# How often a Redis call that failed is asked again: quickly at first (a dropped connection
# answers again at once), then each second while Redis is away.
RETRY_FIRST_S = 0.2
RETRY_EVERY_S = 1.0


class _Stopped(Exception):
    """The instance stops while a call waits for Redis: the caller drops what it carried."""

    def __init__(self, error: RedisError) -> None:
        super().__init__(type(error).__name__)
        self.error = error


# KEYS: seen key ('' : no dedupe), stream; ARGV: payload, maxlen, ttl. Returns the entry's
# id, false when seen, or {seen key, its type} when that key is not a string: `SET NX` on it
# failed as on a key already set, so the command was taken for seen and silently dropped.
_PUBLISH = """
if KEYS[1] ~= '' then
  local found = redis.call('TYPE', KEYS[1])['ok']
  if found ~= 'string' and found ~= 'none' then return {KEYS[1], found} end
  if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[3]) then return false end
end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'command', ARGV[1])
"""

# KEYS: reply key; ARGV: instance, ttl. 1 when claimed here (now, or by an earlier call whose
# answer was lost: the claim is asked again then), 0 when another instance has it, or the
# key's type when it is not a string (no instance could claim it: nobody answered).
_CLAIM = """
local found = redis.call('TYPE', KEYS[1])['ok']
if found ~= 'string' and found ~= 'none' then return {found} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0
"""


# An entry holds every field of `IncomingCommand` (`encode` writes them from the dataclass)
# but these: `chat` is written as `chat_id` and `thread_id`, and `reply` is each instance's
# own (whether it answers). `RELAYED` says how each is read back: whether a value is one
# the field takes, and the field's value in an entry written before it was relayed; the
# relay's test fails while a field of the dataclass is missing here.
_NOT_RELAYED = ("chat", "reply")
_REQUIRED = object()  # a field an entry without is not read


def _text(value: object) -> bool:
    return isinstance(value, str)


def _text_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


def _flag(value: object) -> bool:
    return isinstance(value, bool)


def _texts(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


RELAYED: dict[str, tuple[Callable[[object], bool], object]] = {
    "args": (_text, _REQUIRED),
    "user_id": (_text_or_none, None),
    "message_id": (_text_or_none, None),
    "chat_title": (_text_or_none, None),
    # Which command, and what it answers: without them a /tell or a reply to a card was
    # read back as `/taskcard <its text>`; an entry from before is a /taskcard.
    "command": (lambda v: v in get_args(CommandName), "taskcard"),
    "reply_to": (_texts, []),
    "message_thread": (_text_or_none, None),
    # Without it a remark merely written in a Feishu thread opened on the board was answered
    # with how to reach an agent by whichever instance read it from the stream.
    "in_thread": (_flag, False),
    # Without it an anonymous admin's command was read back as GroupAnonymousBot's.
    "sent_as": (lambda v: v is None or v in get_args(SentAs), None),
    # Without it the answer to "/taskcard" + an override + "ffo" said nothing of the order
    # the option shows in.
    "reordered": (_flag, False),
    # Without it a reply in a Telegram channel to a post that is not the service's was
    # taken for one to the service's message (every post there names no author).
    "replied_author_unknown": (_flag, False),
    # Without it a channel post's signature was lost, and the agent read "someone".
    "author_name": (_text_or_none, None),
    # Without it every signer of a channel shared one /tell rate and one /taskcard cancel.
    "author_signature": (_text_or_none, None),
    # Without it every channel a member sent as in a group was one writer, the group's.
    "sent_as_chat": (_text_or_none, None),
    # Without it a Feishu `/tell@任务卡片Pro hi` (another app's) was answered as one naming
    # no agent by whichever instance read it from the stream.
    "agent_glued": (_flag, False),
}


def encode(command: IncomingCommand) -> str:
    data: dict[str, object] = {
        "chat_id": command.chat.chat_id,
        "thread_id": command.chat.thread_id,
    }
    for field in dataclasses.fields(IncomingCommand):
        if field.name not in _NOT_RELAYED:
            value = getattr(command, field.name)
            data[field.name] = list(value) if isinstance(value, tuple) else value
    return json.dumps(data)


def decode(raw: str) -> IncomingCommand | None:
    """The command in a stream entry; None for an entry this version cannot read."""
    try:
        data = json.loads(raw)
        chat_id, thread_id = data["chat_id"], data.get("thread_id")
        if not _text(chat_id) or not _text_or_none(thread_id):
            return None
        found: dict[str, Any] = {}
        for name, (takes, before) in RELAYED.items():
            value = data[name] if before is _REQUIRED else data.get(name, before)
            if not takes(value):
                return None
            found[name] = tuple(value) if isinstance(value, list) else value
        if "author_signature" not in data:  # written by an older version
            _anonymous_admin_before(found)
            found["author_signature"] = _signature_before(found)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return IncomingCommand(chat=ChatRef(chat_id, thread_id), **found)


# Telegram's placeholder user GroupAnonymousBot, the `from` of every message a group's
# administrator posts anonymously, in every group.
GROUP_ANONYMOUS_BOT_ID = "1087968824"


def _anonymous_admin_before(found: dict[str, Any]) -> None:
    """An anonymous administrator's command in an entry an older version wrote (one without
    `author_signature`), which gave it GroupAnonymousBot's id as its user id and no
    author's name (a rolling upgrade): read back so, every anonymous administrator of every
    group was one person, the agent read the placeholder's id, and a `/taskcard cancel` an
    upgraded instance read found nothing of theirs. It is read as this version reads an
    untitled one (`channels.telegram.commands.person_id` and `post_author`): no user id,
    and the group's title as the name, so the writer is the group's, `chat:<group>`
    (`IncomingCommand.writer`). The older entry does not carry the administrator's title,
    so a titled one counts as the group's too."""
    if found.get("sent_as") != "admin" or found.get("user_id") != GROUP_ANONYMOUS_BOT_ID:
        return
    found["user_id"] = None
    if found.get("author_name") is None:
        found["author_name"] = found.get("chat_title")


def _signature_before(found: Mapping[str, Any]) -> str | None:
    """The signature of a channel's post in an entry an older version wrote, which relayed
    `author_name` but not `author_signature` (a rolling upgrade): that name is the post's
    signature, else the chat's title (`channels.telegram.commands.post_author`), so a name
    that is not the title is the signature, and each signer keeps their own `/tell` rate
    and `/taskcard cancel` (`IncomingCommand.writer`). A signature spelling the title
    itself cannot be told from none: it counts as the channel's, as an unsigned post."""
    name, title = found.get("author_name"), found.get("chat_title")
    if found.get("user_id") is None and name is not None and title is not None and name != title:
        return str(name)
    return None


# The key said to hold another type when Redis's answer does not name it.
_SOME_KEY = "(a key of the fleet)"
# What a command waits for when Redis refused it a permission: this, then what is refused.
_PERMISSION = "permission:"


def _wrong_key(error: RedisError) -> tuple[str, str] | None:
    """For a key of another type that a command needs (`WrongKeyType`, or Redis's own
    WRONGTYPE answer): the key (`_SOME_KEY` when the answer does not name it) and what to
    do about it; for a permission the Redis user lacks (NOPERM: its ACL changed since the
    start, which checks them), `_PERMISSION` and what is refused, and the fix. Such a
    command waits on its own: retried in line, it would hold every command after it until
    someone fixes the key or the ACL."""
    if isinstance(error, WrongKeyType):
        return error.key or str(error), str(error)
    if answered(error, "WRONGTYPE"):
        return _SOME_KEY, redis_trouble(error)
    if (refused := refused_permission(error)) is not None:
        return _PERMISSION + refused[0], permission_fix([refused])
    return None


class ClusteredChannel(Channel):
    """`inner` with its commands relayed through a Redis stream shared by every instance."""

    def __init__(
        self,
        inner: Channel,
        client: Redis,
        prefix: str,
        instance: str,
        routed_chats: frozenset[str],
        *,
        read_block_ms: int = READ_BLOCK_MS,
    ) -> None:
        self._inner = inner
        self.name = inner.name
        self.ambiguous_send_hold_s = inner.ambiguous_send_hold_s
        self.messages_outlive_process = inner.messages_outlive_process
        self.replies_name_author = inner.replies_name_author
        self._client = client
        self._prefix = prefix
        self._instance = instance
        # Whether a route here is in the chat: the chats routed at start until the service
        # says (`ClusterWiring.follow`), so a chat a reload or a turn routed is answered too.
        self.routes_chat: Callable[[str], bool] = routed_chats.__contains__
        self._stream = f"{prefix}:cmd:{inner.name}"
        self._publish = client.register_script(_PUBLISH)
        self._claim = client.register_script(_CLAIM)
        self._reader: asyncio.Task[None] | None = None
        # Commands whose seen or reply key holds another type: each waits on its own until
        # the key is deleted, while the others go on.
        self._held: dict[asyncio.Task[None], tuple[ChatRef, str]] = {}
        self._wrong: set[str] = set()  # such keys, logged once each
        # Set by `stop`: a publish Redis does not answer gives up instead of holding the stop
        # (the Feishu channel waits for its commands) for as long as Redis is away.
        self._stopping = asyncio.Event()
        self._read_block_ms = read_block_ms

    @property
    def inner(self) -> Channel:
        return self._inner

    async def start(self, on_command: CommandSink) -> None:
        # Read from the stream's current end: commands older than this start were answered.
        # A real id, never "$", which would skip what is added between two reads.
        self._stopping.clear()
        last_id = await self._stream_end()
        await self._inner.start(self._published)
        self._reader = asyncio.create_task(
            self._read(on_command, last_id), name=f"{self.name}-cluster-commands"
        )

    async def stop(self) -> None:
        """Cancel the reader, which interrupts its blocking XREAD at once (redis-py closes a
        connection whose command was cancelled): a stop never waits out the read's block.
        A command whose publishing fails from then on is dropped (logged), not retried."""
        self._stopping.set()
        task, self._reader = self._reader, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        held, self._held = self._held, {}
        for waiting, (chat, key) in held.items():
            waiting.cancel()
            log.warning(
                "a command from chat %s still waited for the Redis key %s at stop; it is dropped",
                chat,
                key,
            )
        await asyncio.gather(*held, return_exceptions=True)
        await self._inner.stop()

    async def _stream_end(self) -> str:
        newest = await self._until_redis_answers(
            "reading where the command stream ends",
            lambda: self._client.xrevrange(self._stream, count=1),
            alone=False,
        )
        return str(newest[0][0]) if newest else "0-0"

    async def _until_redis_answers(
        self,
        doing: str,
        call: Callable[[], Awaitable[T]],
        *,
        until_stop: bool = False,
        alone: bool = True,
    ) -> T:
        """`call()`, asked again until Redis answers: every Redis call of the command path
        waits here, so an outage is one warning (what waits, what is wrong with Redis and
        what to do) and one line when it ends, whichever call met it. With `until_stop`, a
        stop ends the waiting (`_Stopped`). A key of another type (`WrongKeyType`) is raised
        at once: only its command waits for it (`_hold`); so is a permission refused, when
        the call is `alone` (one command's: reading the stream is every command's)."""
        failures = 0
        while True:
            try:
                answer = await call()
            except RedisError as error:
                raise_if_cancel_swallowed()  # a stop's cancel that redis-py turned into this
                found = _wrong_key(error)
                if found is not None and (alone or not found[0].startswith(_PERMISSION)):
                    raise
                failures += 1
                if failures == 1 and not self._stopping.is_set():  # not at each retry
                    log.warning(
                        "%s waits for Redis: %s. It is tried again each second until Redis"
                        " answers; nothing is lost",
                        doing,
                        redis_trouble(error),
                    )
                delay_s = min(RETRY_EVERY_S, RETRY_FIRST_S * 2 ** (failures - 1))
                if until_stop:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), delay_s)
                    if self._stopping.is_set():
                        raise _Stopped(error) from None
                else:
                    await asyncio.sleep(delay_s)
                raise_if_cancel_swallowed()
                continue
            # A stop's cancel that redis-py swallowed in a call that then answered: the caller
            # (the Telegram poller, relaying a command) would go on polling, and the stop
            # would wait for it for ever.
            raise_if_cancel_swallowed()
            if failures:
                log.info("%s: Redis answers again", doing)
            return answer

    def _hold(self, work: Coroutine[Any, Any, None], chat: ChatRef, key: str) -> None:
        """Run `work`, a command waiting for `key` to be fixed, on its own: the commands after
        it (the poller's next updates, the stream's next entries) do not wait for it. It is
        kept in memory only: a stop before the fix drops it, and says so."""
        task = asyncio.get_running_loop().create_task(work, name=f"{self.name}-held-command")
        self._held[task] = (chat, key)
        task.add_done_callback(lambda done: self._held.pop(done, None))

    def _misplaced(self, key: str, problem: str, chat: ChatRef) -> None:
        """Say once per key that a command waits for it (another program's key on it);
        `problem` names the key and the fix (`wrong_type`)."""
        if key not in self._wrong:
            self._wrong.add(key)
            log.error(
                "a command from chat %s waits until this is fixed (the other commands go on): %s",
                chat,
                problem,
            )

    def _fixed(self, key: str) -> None:
        if key in self._wrong:
            self._wrong.discard(key)
            if key.startswith(_PERMISSION):
                log.warning(
                    "Redis lets this instance use %s again: the command waiting for it goes on",
                    key.removeprefix(_PERMISSION),
                )
            elif key == _SOME_KEY:
                log.warning("Redis takes the command waiting for a key of another type again")
            else:
                log.warning(
                    "the Redis key %s is usable again: the command waiting for it goes on", key
                )

    async def _published(self, command: IncomingCommand) -> None:
        """The inner channel's sink: append the command to the stream once. A command whose
        seen key holds another type waits on its own (`_hold`) until the key is deleted."""
        seen = ""
        if command.command == "moved":
            # Every instance learns a group's upgrade on its own (from the first request
            # Telegram refuses it): one entry tells them all, and each copy more cost every
            # card of the chat one more edit ("not modified").
            seen = f"{self._prefix}:seen:{self.name}:moved:{command.chat.chat_id}"
        elif command.message_id is not None:
            chat = f"{command.chat.chat_id}:{command.message_id}"
            seen = f"{self._prefix}:seen:{self.name}:{chat}"
        try:
            misplaced = await self._publish_once(command, seen)
        except RedisError as error:
            if (found := _wrong_key(error)) is None:
                raise
            self._misplaced(found[0], found[1], command.chat)
            self._hold(self._publish_when_fixed(command, seen, found[0]), command.chat, found[0])
            return
        if misplaced is not None:
            self._misplaced(seen, wrong_type(seen, misplaced, "string"), command.chat)
            self._hold(self._publish_when_fixed(command, seen, seen), command.chat, seen)

    async def _publish_when_fixed(self, command: IncomingCommand, seen: str, key: str) -> None:
        while True:
            await asyncio.sleep(WRONG_TYPE_WAIT_S)
            try:
                if await self._publish_once(command, seen) is None:
                    self._fixed(key)
                    return
            except RedisError as error:
                if _wrong_key(error) is None:
                    raise

    async def _publish_once(self, command: IncomingCommand, seen: str) -> str | None:
        """Append the command unless its seen key says it was; through a Redis outage (the
        offset is committed only after this returns: the command is kept). The type found
        when the seen key is not a string."""
        try:
            answer = await self._until_redis_answers(
                f"publishing a command from chat {command.chat}",
                lambda: self._publish(
                    keys=[seen, self._stream], args=[encode(command), STREAM_MAXLEN, SEEN_TTL_S]
                ),
                until_stop=True,
            )
        except _Stopped as stopped:
            log.warning(
                "a command from chat %s could not be published to Redis before the"
                " stop (%s); it is dropped",
                command.chat,
                stopped,
            )
            return None
        return str(answer[1]) if isinstance(answer, list) else None

    def _xread(self, last_id: str) -> tuple[object, ...]:
        """The XREAD of the next entries after `last_id` (blocking a while for them)."""
        block = ("BLOCK", self._read_block_ms)
        return ("XREAD", "COUNT", 100, *block, "STREAMS", self._stream, last_id)

    async def _read(self, on_command: CommandSink, last_id: str) -> None:
        while True:
            # As bytes: an entry not UTF-8 (not written by an instance) is skipped, logged
            # once; decoded by the client, it failed the reading of every entry after it.
            answer = cast(
                list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]],
                await self._until_redis_answers(
                    "reading the chats' commands",
                    functools.partial(raw_answer, self._client, *self._xread(last_id)),
                    alone=False,
                ),
            )
            raise_if_cancel_swallowed()  # else `stop` waits for this loop forever
            for _stream, entries in answer or ():
                for raw_id, fields in entries:
                    last_id = raw_id.decode()  # Redis's own: digits and a dash
                    await self._handle(on_command, last_id, readable(self._stream, fields))

    async def _handle(self, on_command: CommandSink, entry_id: str, fields: dict[str, str]) -> None:
        command = decode(fields.get("command", ""))
        if command is None:
            log.warning("skipping an unreadable command in the stream")
            return
        key = waited = f"{self._prefix}:reply:{self.name}:{entry_id}"
        try:
            claimed = (
                await self._claim_reply(key, command)
                if self.routes_chat(command.chat.chat_id)
                else False
            )
        except RedisError as error:
            if (found := _wrong_key(error)) is None:
                raise
            waited = found[0]
            self._misplaced(waited, found[1], command.chat)
            claimed = None
        if claimed is None:
            work = self._apply_when_fixed(on_command, command, key, waited)
            self._hold(work, command.chat, waited)
            return
        await self._apply(on_command, replace(command, reply=claimed))

    async def _claim_reply(self, key: str, command: IncomingCommand) -> bool | None:
        """Whether this instance answers the command; None (said once) while its reply key
        holds another type, which no instance can claim: nobody answered. Asked again each
        second until Redis answers: a claim that failed counted as lost, so when Redis took
        it but its answer did not come back (a slow Redis), no instance answered."""
        answer = await self._until_redis_answers(
            f"claiming the answer to a command from chat {command.chat}",
            lambda: self._claim(keys=[key], args=[self._instance, SEEN_TTL_S]),
        )
        if isinstance(answer, list):
            self._misplaced(key, wrong_type(key, str(answer[0]), "string"), command.chat)
            return None
        return bool(answer)

    async def _apply_when_fixed(
        self, on_command: CommandSink, command: IncomingCommand, key: str, waited: str
    ) -> None:
        """Claim the reply (`key`) of `command` again each few seconds until what it waits
        for (`waited`: the key holding another type, or a permission refused) is fixed."""
        while True:
            await asyncio.sleep(WRONG_TYPE_WAIT_S)
            try:
                claimed = await self._claim_reply(key, command)
            except RedisError as error:
                if _wrong_key(error) is None:
                    raise
                continue
            if claimed is not None:
                self._fixed(waited)
                await self._apply(on_command, replace(command, reply=claimed))
                return

    async def _apply(self, on_command: CommandSink, command: IncomingCommand) -> None:
        """Hand the command to the service. The service's Redis calls (the shared state it
        reads and writes while answering) wait for Redis like the relay's own: the command
        is handled again from the start once Redis answers, and answered then (its answer
        is queued only at the end, so it is never given twice). A key of another type that
        the command needs holds that command alone until the key is deleted."""
        try:
            await self._until_redis_answers(
                f"a command from chat {command.chat}", lambda: on_command(command)
            )
        except asyncio.CancelledError:
            raise
        except RedisError as error:
            if (found := _wrong_key(error)) is None:  # never: the others are waited through
                log.exception("handling a /taskcard command from chat %s failed", command.chat)
                return
            key, problem = found
            self._misplaced(key, problem, command.chat)
            self._hold(self._retry_when_fixed(on_command, command, key), command.chat, key)
        except Exception:
            log.exception("handling a /taskcard command from chat %s failed", command.chat)

    async def _retry_when_fixed(
        self, on_command: CommandSink, command: IncomingCommand, key: str
    ) -> None:
        """Handle `command` again each few seconds until `key` (a key of another type it
        needs) is deleted; another such key found then is said once too."""
        while True:
            await asyncio.sleep(WRONG_TYPE_WAIT_S)
            try:
                await self._until_redis_answers(
                    f"a command from chat {command.chat}", lambda: on_command(command)
                )
            except RedisError as error:
                if (found := _wrong_key(error)) is None:  # never, as in `_apply`
                    log.exception("handling a /taskcard command from chat %s failed", command.chat)
                    return
                if found[0] != key:
                    self._fixed(key)
                    key = found[0]
                    self._misplaced(key, found[1], command.chat)
                continue
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("handling a /taskcard command from chat %s failed", command.chat)
            self._fixed(key)
            return

    # Everything else is the inner channel's --------------------------------------------

    def render_card(self, view: CardView) -> Outgoing:
        return self._inner.render_card(view)

    def render_board(self, view: BoardView) -> Outgoing:
        return self._inner.render_board(view)

    def board_fits(self, view: BoardView) -> bool:
        return self._inner.board_fits(view)

    def topic_name(self, chat: ChatRef) -> str | None:
        return self._inner.topic_name(chat)

    def render_text(self, text: str) -> Outgoing:
        return self._inner.render_text(text)

    def render_own_text(self, text: str) -> Outgoing:
        return self._inner.render_own_text(text)

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        return self._inner.rate_scopes(chat, operation, message_id)

    def start_scopes(self) -> tuple[str, ...]:
        return self._inner.start_scopes()

    def start_put_off(self) -> RateLimited | None:
        return self._inner.start_put_off()

    async def finish_start(self) -> RateLimited | None:
        return await self._inner.finish_start()

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        return await self._inner.send(
            chat, message, idempotency_key=idempotency_key, reply_to=reply_to
        )

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        await self._inner.edit(chat, message_id, message)

    async def delete(self, chat: ChatRef, message_id: str) -> None:
        await self._inner.delete(chat, message_id)

    async def pin(self, chat: ChatRef, message_id: str) -> None:
        await self._inner.pin(chat, message_id)

    def posted_after_move(self, chat: ChatRef, message_id: str) -> bool:
        return self._inner.posted_after_move(chat, message_id)
