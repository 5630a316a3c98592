"""Inbound commands of a cluster when Redis misbehaves, end to end.

Each instance is a `taskcard serve` subprocess against the fakes and a private
`redis-server` (a test here changes the server's settings, so no other test shares it).
Feishu delivers an event again until it is acknowledged, so an event the service could not
take must not be acknowledged; Telegram keeps an update until a later offset confirms it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from taskcard.bridge.cluster.commands import _CLAIM
from taskcard.bridge.store.redis import _ADD_NOTICE
from tests.e2e.harness import eventually, publish, run_cli
from tests.e2e.test_cluster import (
    HIDDEN_REPLY,
    feishu_instance,
    instance,
    instances_with_cards,
    past_a_later_command,
    relayed,
    replies,
    replies_in,
)
from tests.e2e.test_serve_operations import get, sample, until
from tests.e2e.test_serve_telegram import GROUP
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram
from tests.redis_server import RedisServer, free_port, have_redis

# A Redis that answers but refuses every write (it waits for a replica it does not have).
NO_WRITES = "min-replicas-to-write"
UNHANDLED_TYPE = "im.chat.member.bot.added_v1"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    if not have_redis():
        pytest.fail("redis-server is not installed: run `make test`, which installs it")
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def refuse_writes(server: RedisServer, refuse: bool) -> None:
    client = redis.Redis.from_url(server.url)
    try:
        client.config_set(NO_WRITES, 1 if refuse else 0)
    finally:
        client.close()


def unhandled_event(fake: FakeFeishu, verification_token: str) -> dict[str, Any]:
    """An event of a type the app may receive but nothing in taskcard handles."""
    event = fake.command_event("oc_other", "x", verification_token=verification_token)
    event["header"]["event_type"] = UNHANDLED_TYPE
    event["event"] = {"chat_id": "oc_other", "operator_id": {"open_id": "ou_fake_user"}}
    return event


async def test_feishu_webhook_an_event_redis_cannot_record_is_refused_then_handled(
    tmp_path: Path, server: RedisServer, prefix: str
) -> None:
    """Redis refusing writes while the event was recorded as seen: the callback answered 500
    with aiohttp's traceback in the log, but the event stayed marked as seen, so Feishu's
    redelivery was answered "duplicate" and the command was lost. Now the answer asks
    Feishu to deliver again and the redelivery is handled."""
    from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY, card_texts

    async with FakeFeishu() as fake:
        setup = feishu_instance(tmp_path, "i0", fake, redis_url=server.url, prefix=prefix)
        with ExitStack() as fleet:
            serve = fleet.enter_context(setup.serve())
            publish(tmp_path / "i0" / "agents" / "i0agent", "card of i0")
            await eventually(lambda: len(card_texts(fake)) == 1, timeout_s=60, what="the card")
            unhandled = unhandled_event(fake, VERIFY)
            answer = await fake.deliver_event(setup.url, unhandled, encrypt_key=ENCRYPT)
            assert answer.status == 200, "an event type nothing handles is acknowledged"
            event = fake.command_event(CHAT, "/taskcard off", verification_token=VERIFY)
            refuse_writes(server, True)
            try:
                refused = await fake.deliver_event(setup.url, event, encrypt_key=ENCRYPT)
            finally:
                refuse_writes(server, False)
            assert refused.status >= 500, refused
            # Feishu delivers it again: now it is a command, not a duplicate.
            again = await fake.deliver_event(setup.url, event, encrypt_key=ENCRYPT)
            assert again.status == 200 and again.body == {"msg": "success"}, again
            await eventually(lambda: replies_in(fake.texts(CHAT)) == 1, what="the reply")
            assert relayed(server.url, prefix, "feishu", "off") == 1
            assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs
        event_id = event["header"]["event_id"]
        assert f"feishu event {event_id} could not be recorded as seen" in serve.logs


async def test_feishu_long_connection_acknowledges_only_what_it_took(
    tmp_path: Path, server: RedisServer, prefix: str
) -> None:
    """Over the long connection an event was acknowledged before the service's loop saw it,
    so one Redis could not record was lost (and its failure was a traceback); and an event
    type without a handler was answered 500, so Feishu kept delivering it. Now the first is
    answered 500 and handled when delivered again, the second acknowledged and ignored, as
    the HTTP callback does."""
    from tests.e2e.test_serve_feishu import CHAT, VERIFY, card_texts

    async with FakeFeishu() as fake:
        setup = feishu_instance(tmp_path, "i0", fake, redis_url=server.url, prefix=prefix)
        setup.config.write_text(
            setup.config.read_text().replace('events = "webhook"', 'events = "websocket"')
        )
        with ExitStack() as fleet:
            serve = fleet.enter_context(setup.serve())
            publish(tmp_path / "i0" / "agents" / "i0agent", "card of i0")
            await eventually(lambda: len(card_texts(fake)) == 1, timeout_s=60, what="the card")
            await eventually(lambda: fake.ws_connections == 1, what="the long connection")
            unhandled = unhandled_event(fake, VERIFY)
            await fake.push_ws_event(unhandled)
            unhandled_id = unhandled["header"]["event_id"]
            assert await eventually(lambda: fake.ws_answers.get(unhandled_id)) == [200]
            event = fake.command_event(CHAT, "/taskcard off", verification_token=VERIFY)
            event_id = event["header"]["event_id"]
            refuse_writes(server, True)
            try:
                await fake.push_ws_event(event)
                await eventually(lambda: fake.ws_answers.get(event_id), what="the answer")
            finally:
                refuse_writes(server, False)
            assert fake.ws_answers[event_id] == [500]
            await fake.push_ws_event(event)  # Feishu's redelivery
            await eventually(lambda: fake.ws_answers[event_id] == [500, 200], what="the ack")
            await eventually(lambda: replies_in(fake.texts(CHAT)) == 1, what="the reply")
            assert relayed(server.url, prefix, "feishu", "off") == 1
            assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs
        assert f"feishu event {event_id} could not be recorded as seen" in serve.logs


async def test_seen_and_reply_keys_of_another_type_hold_only_their_command(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str
) -> None:
    """A command's seen key (chat and message id) or its reply claim (stream entry id) left
    as another type on the prefix: `SET NX` failed on it as on a key already set, so the
    command was taken for a duplicate and dropped, or claimed by no instance and never
    answered, and nothing said why. Now each is one error naming the key and the fix, only
    that command waits (the next one is answered), and deleting the key lets it go on."""
    stream = f"{prefix}:cmd:telegram"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    # An entry from before the start (never read) fixes the ids of the next ones.
    client.xadd(stream, {"command": "{}"}, id="9000000000000-0")
    reply_key = f"{prefix}:reply:telegram:9000000000000-1"
    client.hset(reply_key, "left by", "another program")
    with instance(
        tmp_path, "i0", telegram, ["i0agent"], redis_url=redis_url, prefix=prefix
    ) as serve:
        publish(tmp_path / "agents" / "i0agent", "card of i0")
        await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")
        following = max(m.message_id for m in telegram.messages(GROUP)) + 1
        seen_key = f"{prefix}:seen:telegram:{GROUP}:{following}"
        client.hset(seen_key, "left by", "another program")
        assert telegram.inject_command(GROUP, "/taskcard off")  # waits on its seen key
        telegram.inject_command(GROUP, "/taskcard 3")  # the entry whose reply key is taken
        telegram.inject_command(GROUP, "/taskcard 5")
        await eventually(lambda: replies(telegram, "5 activity rows"), what="the next command")
        for key in (seen_key, reply_key):
            await eventually(
                lambda key=key: f"the Redis key {key} is a hash, not the string" in serve.logs,
                what=f"{key} named",
            )
            assert f"DEL {key}" in serve.logs
        assert not replies(telegram, HIDDEN_REPLY) and not replies(telegram, "3 activity rows")
        # One at a time: unsent replies in a chat collapse into the latest (by design).
        client.delete(seen_key)
        await eventually(lambda: replies(telegram, HIDDEN_REPLY), what="the first command")
        client.delete(reply_key)
        await eventually(lambda: replies(telegram, "3 activity rows"), what="the second")
        assert await serve.aterminate() == 0
    client.close()
    for key in (seen_key, reply_key):
        assert serve.logs.count(f"DEL {key}") == 1, "logged once, not at each retry"
    assert replies(telegram, HIDDEN_REPLY) == 1 and replies(telegram, "3 activity rows") == 1
    assert "Traceback" not in serve.logs


def test_a_redis_url_whose_database_is_not_a_number_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`redis://host:6379/1x`: redis-py ignores a database it cannot read as a number, so
    the fleet silently used database 0 (where another fleet may keep its keys)."""
    (tmp_path / "a").mkdir()
    config = tmp_path / "taskcard.toml"
    config.write_text(
        '[[agents]]\nid = "a"\nworkdir = "a"\n[console]\nenabled = true\n'
        '[cluster]\nredis_url_env = "TC_REDIS_URL"\n'
    )
    monkeypatch.setenv("TC_REDIS_URL", f"redis://:Pa55w0rd-x@127.0.0.1:{free_port()}/1x")
    for command in ("serve", "status"):
        result = run_cli(command, "--config", str(config))
        assert result.returncode == 2, (result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "TC_REDIS_URL has a database that is not a number" in lines[0]
        assert "Pa55w0rd" not in result.stderr


class AnswerLosingProxy:
    """A TCP proxy to Redis that, the first time a request holds every part of `marker` (or
    each time, with `every`), passes it on but holds Redis's answer for `hold_s` (longer
    than the client's socket timeout): Redis took the request, and the client never learned
    it did.

    It can also lose what Redis pushes to subscribers: while `mute_subscribers` is set, what
    Redis sends on a connection that subscribed is dropped (`muted` counts the published
    messages lost), and `cut_subscribers` closes those connections, as a dropped connection
    does; the client reconnects through the proxy."""

    def __init__(
        self,
        upstream_port: int,
        marker: tuple[bytes, ...],
        hold_s: float,
        *,
        every: bool = False,
        window: bool = False,
        drop: bool = False,
    ) -> None:
        self.port = 0
        self._upstream_port = upstream_port
        self._marker = marker
        self._hold_s = hold_s
        self._every = every  # hold the answer of every such request, not only the first
        # Hold too the answers of such requests sent while the first one's is held (the
        # client's retries of it), until the first one's is let go.
        self._window = window
        # Lose such requests instead of passing them on (a network cut: Redis never took it).
        self._drop = drop
        self._release_at = 0.0
        self.held = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.mute_subscribers = False
        self.muted = 0
        self._subscribers: set[asyncio.StreamWriter] = set()

    def cut_subscribers(self) -> None:
        for writer in list(self._subscribers):
            writer.close()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> AnswerLosingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        hold = asyncio.Event()
        hold.set()  # set: answers flow

        async def requests() -> None:
            while chunk := await reader.read(65536):
                if b"SUBSCRIBE" in chunk.upper():
                    self._subscribers.add(writer)
                now = asyncio.get_running_loop().time()
                again = self._window and now < self._release_at
                if (self._every or not self.held or again) and all(
                    m in chunk for m in self._marker
                ):
                    if not again:
                        self._release_at = now + self._hold_s
                    self.held = True
                    hold.clear()
                    asyncio.get_running_loop().call_later(self._release_at - now, hold.set)
                    if self._drop:
                        continue
                up_writer.write(chunk)
                await up_writer.drain()

        async def answers() -> None:
            while chunk := await up_reader.read(65536):
                await hold.wait()
                if self.mute_subscribers and writer in self._subscribers:
                    self.muted += chunk.count(b"message")
                    continue
                writer.write(chunk)
                await writer.drain()

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(answers())]
        self._tasks.update(tasks)
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
            self._tasks.discard(task)
        self._subscribers.discard(writer)
        for stream in (writer, up_writer):
            stream.close()


async def test_a_reply_claim_redis_took_but_did_not_answer_in_time_is_still_answered(
    tmp_path: Path, telegram: FakeTelegram, server: RedisServer, prefix: str
) -> None:
    """A slow Redis: the claim of a command's reply (SET NX) was applied but its answer came
    after the client's timeout. The failure counted as "not mine", and the key named this
    instance, so no instance answered the command. Now the claim is asked again and
    recognises its own."""
    client = redis.Redis.from_url(server.url)
    client.script_load(_CLAIM)  # so that the held request is the claim itself
    client.close()
    async with AnswerLosingProxy(server.port, (b":reply:telegram:",), hold_s=7.0) as proxy:
        serve = instance(tmp_path, "i0", telegram, ["i0agent"], redis_url=proxy.url, prefix=prefix)
        with serve:
            publish(tmp_path / "agents" / "i0agent", "card of i0")
            await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")
            telegram.inject_command(GROUP, "/taskcard off")
            await eventually(lambda: proxy.held, what="the claim's answer held")
            await eventually(
                lambda: replies(telegram, HIDDEN_REPLY), timeout_s=60, what="the reply"
            )
            assert await serve.aterminate() == 0
    assert (
        f"claiming the answer to a command from chat {GROUP} waits for Redis: Redis is out of"
        " reach (TimeoutError)"
    ) in serve.logs
    assert "Traceback" not in serve.logs


async def test_after_redis_restarts_empty_a_tell_reaches_its_agent_without_a_refusal(
    tmp_path: Path, telegram: FakeTelegram, server: RedisServer, prefix: str
) -> None:
    """What each instance routes is kept in Redis for the others; after a Redis that
    restarted empty (no persistence, or the keys evicted) it was only kept from expiring,
    never written again, so the instance that claimed the reply to `/tell i1agent ...`
    refused it as naming no agent while i1 queued it."""
    with ExitStack() as fleet:
        by_name = await instances_with_cards(
            tmp_path, telegram, fleet, redis_url=server.url, prefix=prefix
        )
        serves = list(by_name.values())
        server.restart()  # without appendonly: every key is gone
        client = redis.Redis.from_url(server.url, decode_responses=True)
        await eventually(
            lambda: len(client.keys(f"{prefix}:routed:*")) == 2,
            timeout_s=60,
            what="each instance's routes shared again",
        )
        client.close()
        for name in ("i0", "i1"):
            telegram.inject_command(GROUP, f"/tell {name}agent hello")
        await eventually(
            lambda: (
                replies(telegram, "Message to i0agent") and replies(telegram, "Message to i1agent")
            ),
            timeout_s=60,
            what="both texts queued",
        )
        await past_a_later_command(telegram, serves)
        assert not replies(telegram, "AGENT is one of")
        for serve in serves:
            assert await serve.aterminate() == 0


async def test_a_stop_while_redis_does_not_take_a_feishu_command_is_not_held(
    tmp_path: Path, server: RedisServer, prefix: str
) -> None:
    """A Feishu command whose publishing Redis did not answer was retried each second for as
    long as Redis was away, and the Feishu channel's stop waits for its commands: SIGTERM
    did not end the service. Now a stop drops it, with a line saying so."""
    from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY, card_texts

    publishing = (b"EVALSHA", b":cmd:feishu")  # not the reads of the stream
    async with (
        FakeFeishu() as fake,
        AnswerLosingProxy(server.port, publishing, hold_s=3600, every=True) as proxy,
    ):
        setup = feishu_instance(tmp_path, "i0", fake, redis_url=proxy.url, prefix=prefix)
        with setup.serve() as serve:
            publish(tmp_path / "i0" / "agents" / "i0agent", "card of i0")
            await eventually(lambda: len(card_texts(fake)) == 1, timeout_s=60, what="the card")
            event = fake.command_event(CHAT, "/taskcard off", verification_token=VERIFY)
            assert (await fake.deliver_event(setup.url, event, encrypt_key=ENCRYPT)).status == 200
            await eventually(
                lambda: f"publishing a command from chat {CHAT} waits for Redis" in serve.logs,
                timeout_s=60,
                what="the publish failing",
            )
            assert await serve.aterminate() == 0
    assert f"a command from chat {CHAT} could not be published to Redis before the stop" in (
        serve.logs
    )
    assert "Traceback" not in serve.logs


async def test_a_tell_whose_record_redis_took_but_answered_late_is_queued_once(
    tmp_path: Path, telegram: FakeTelegram, server: RedisServer, prefix: str
) -> None:
    """Redis took the record of a `/tell` but answered after the call's timeout (and its
    retries): the command was handled again with a new message id, so Redis held two open
    records of one text, the second one without a file in the inbox, for a later cancel or
    a standby to pick. The record's id comes from the command's message now: one record."""
    inbox_write = (b"HSET", f"{prefix}:inbox".encode())
    async with AnswerLosingProxy(server.port, inbox_write, hold_s=6.0, window=True) as proxy:
        serve = instance(tmp_path, "i0", telegram, ["i0agent"], redis_url=proxy.url, prefix=prefix)
        with serve:
            publish(tmp_path / "agents" / "i0agent", "card of i0")
            await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")
            telegram.inject_command(GROUP, "/tell i0agent hello once")
            await eventually(lambda: proxy.held, timeout_s=60, what="the record's answer held")
            await eventually(
                lambda: replies(telegram, "Message to i0agent"), timeout_s=60, what="the status"
            )
            await past_a_later_command(telegram, [serve])
            assert await serve.aterminate() == 0
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        records = client.hgetall(f"{prefix}:inbox")
        queued = client.zrange(f"{prefix}:inbox:queued", 0, -1)
    finally:
        client.close()
    assert len(records) == 1, records
    assert queued == list(records)
    files = list((tmp_path / "agents" / "i0agent" / "inbox" / "queued").glob("*.json"))
    assert len(files) == 1, files
    assert replies(telegram, "Message to i0agent") == 1
    assert "waits for Redis" in serve.logs, "the late answer was met"
    assert "Traceback" not in serve.logs


def acl_user(server: RedisServer, rules: list[str]) -> str:
    """A Redis user `tc` with `rules` (besides its password); its URL."""
    client = redis.Redis.from_url(server.url)
    try:
        client.acl_setuser("tc", enabled=True, reset=True, passwords=["+Pa55-acl"])
        client.execute_command("ACL", "SETUSER", "tc", *rules)
    finally:
        client.close()
    return f"redis://tc:Pa55-acl@127.0.0.1:{server.port}/0"


@pytest.mark.parametrize(
    ("rules", "named"),
    [
        (["+@all", "-hset", "~*", "&*"], ["the command HSET", "+hset"]),
        (["+@all", "-xadd", "-evalsha", "~*", "&*"], ["XADD", "EVALSHA", "+xadd +evalsha"]),
        (["+@all", "-multi", "~*", "&*"], ["the command MULTI", "+multi"]),
        (["+@all", "-hvals", "-exists", "~*", "&*"], ["HVALS", "EXISTS", "+exists +hvals"]),
        (["+@all", "-incr", "~*", "&*"], ["the command INCR", "+incr"]),
        (["+@all", "-unwatch", "~*", "&*"], ["the command UNWATCH", "+unwatch"]),
        (["+@all", "~*", "resetchannels"], ["the fleet's channels", "&<key_prefix>:*"]),
        (["+@all", "~someone-else:*", "&*"], ["the fleet's keys", "~<key_prefix>:*"]),
    ],
    ids=["hset", "xadd-evalsha", "multi", "hvals-exists", "incr", "unwatch", "channels", "keys"],
)
def test_a_redis_user_lacking_a_permission_is_refused_at_start_naming_it(
    tmp_path: Path,
    server: RedisServer,
    prefix: str,
    rules: list[str],
    named: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Redis ACL user without a command the service needs started, then met NOPERM at
    run time only, where a command retried it in line for ever with one warning. The start
    tries every command the fleet uses and refuses in one line naming what is missing."""
    (tmp_path / "a").mkdir()
    config = tmp_path / "taskcard.toml"
    config.write_text(
        '[[agents]]\nid = "a"\nworkdir = "a"\n[console]\nenabled = true\n'
        f'[cluster]\nredis_url_env = "TC_REDIS_URL"\nkey_prefix = "{prefix}"\n'
    )
    monkeypatch.setenv("TC_REDIS_URL", acl_user(server, rules))
    result = run_cli("serve", "--config", str(config), timeout_s=60)  # it served on, before
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "NOPERM" in lines[0], lines
    assert all(part in lines[0] for part in named), lines
    assert "Pa55" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    client = redis.Redis.from_url(server.url)
    try:  # the check leaves nothing behind when it may delete
        assert client.keys(f"{prefix}:acl-check:*") == [] or "~someone-else:*" in rules
    finally:
        client.close()


async def test_a_permission_redis_withdraws_at_run_time_holds_only_the_commands_needing_it(
    tmp_path: Path, telegram: FakeTelegram, server: RedisServer, prefix: str
) -> None:
    """The ACL changed while the fleet runs: the `/tell` whose inbox write Redis refuses
    (NOPERM) was retried in line for ever, holding every command after it. It waits on its
    own now, said once with the fix, and goes on once the permission is back."""
    url = acl_user(server, ["+@all", "~*", "&*"])
    serve = instance(tmp_path, "i0", telegram, ["i0agent"], redis_url=url, prefix=prefix)
    with serve:
        publish(tmp_path / "agents" / "i0agent", "card of i0")
        await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")
        await eventually(lambda: "channel telegram ready" in serve.logs, what="commands read")
        acl_user(server, ["+@all", "-multi", "~*", "&*"])  # the inbox's writes use MULTI
        telegram.inject_command(GROUP, "/tell i0agent held back")
        telegram.inject_command(GROUP, "/taskcard")
        await eventually(
            lambda: replies(telegram, "Task cards here: shown") == 1,
            timeout_s=60,
            what="the command after the refused one answered",
        )
        assert "may not use the command MULTI (NOPERM)" in serve.logs
        assert "+multi" in serve.logs
        acl_user(server, ["+@all", "~*", "&*"])
        queued = tmp_path / "agents" / "i0agent" / "inbox" / "queued"
        await eventually(
            lambda: len(list(queued.glob("*.json"))) == 1, timeout_s=60, what="the text queued"
        )
        await eventually(
            lambda: "Redis lets this instance use the command MULTI again" in serve.logs,
            what="the end of the wait said",
        )
        assert await serve.aterminate() == 0
    assert serve.logs.count("may not use the command MULTI (NOPERM)") == 1, serve.logs
    assert "Pa55" not in serve.logs
    assert "Traceback" not in serve.logs


async def test_metrics_and_healthz_say_the_state_store_cannot_be_read(
    tmp_path: Path, telegram: FakeTelegram, server: RedisServer, prefix: str
) -> None:
    """A scrape while Redis refuses a read the levels need (here `HVALS`, taken away while
    the fleet runs) failed with a traceback in the log and no page. The page now comes with
    the levels kept in memory and `taskcard_state_store_readable 0`; `/healthz` is 503 naming
    the store; both recover when the permission is back."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    url = acl_user(server, ["+@all", "~*", "&*"])
    metrics = f'[metrics]\nlisten = "127.0.0.1:{port}"'
    serve = instance(
        tmp_path, "i0", telegram, ["i0agent"], redis_url=url, prefix=prefix, limits=metrics
    )
    with serve:
        publish(tmp_path / "agents" / "i0agent", "card of i0")
        await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")
        healthy = await until(lambda: _status_is(base + "/healthz", 200), what="a healthy start")
        assert healthy.json()["status"] == "ok"
        acl_user(server, ["+@all", "-hvals", "~*", "&*"])
        page = await until(lambda: get(base + "/metrics"), what="/metrics")
        assert page.status_code == 200
        assert sample(page.text, "taskcard_state_store_readable") == 0.0
        assert sample(page.text, "taskcard_agents_watched") == 1.0
        assert sample(page.text, "taskcard_notices", state="sent") is None
        health = await until(lambda: _status_is(base + "/healthz", 503), what="/healthz 503")
        assert "the state store cannot be read" in health.json()["reason"]
        assert "hvals" in health.json()["reason"].lower()
        acl_user(server, ["+@all", "~*", "&*"])
        await until(lambda: _status_is(base + "/healthz", 200), what="healthy again")
        page = await until(lambda: get(base + "/metrics"), what="/metrics")
        assert sample(page.text, "taskcard_state_store_readable") == 1.0
        assert await serve.aterminate() == 0
    assert "the state store could not be read for /metrics" in serve.logs
    assert "Pa55" not in serve.logs
    assert "Traceback" not in serve.logs


async def _status_is(url: str, status: int) -> httpx.Response | None:
    answer = await get(url)
    return answer if answer is not None and answer.status_code == status else None


async def test_a_notice_whose_record_redis_took_but_answered_late_is_sent(
    tmp_path: Path, telegram: FakeTelegram, server: RedisServer, prefix: str
) -> None:
    """Redis recorded a notice but its answer came after the client's socket timeout: the
    client sent the script again, which found the notice recorded and answered "already
    there", so the notice was taken for a replay, neither sent nor counted, until a restart.
    A retry of the same call now recognises its own record."""
    from tests.e2e.harness import notify

    client = redis.Redis.from_url(server.url)
    client.script_load(_ADD_NOTICE)  # so that the held request is the script's call itself
    client.close()
    recording = (b"EVALSHA", f"{prefix}:n:text".encode())
    async with AnswerLosingProxy(server.port, recording, hold_s=2.5) as proxy:
        serve = instance(tmp_path, "i0", telegram, ["i0agent"], redis_url=proxy.url, prefix=prefix)
        with serve:
            workdir = tmp_path / "agents" / "i0agent"
            publish(workdir, "card of i0")
            await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")
            notify(workdir, "task_card.error:tc_1:1:renderer_timeout", "error", code="boom")
            await eventually(lambda: proxy.held, timeout_s=60, what="the record's answer held")
            await eventually(
                lambda: len(telegram.bot_messages(GROUP)) == 2, timeout_s=60, what="the notice"
            )
            assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs


async def test_a_reply_taken_over_by_a_call_whose_answer_was_lost_is_still_sent(
    tmp_path: Path, telegram: FakeTelegram, server: RedisServer, prefix: str
) -> None:
    """The instance taking over a reply a stopped instance left unsent: Redis made it its
    own, but the answer saying so came too late. The next try found nothing left to take
    (the reply was already this instance's), so the reply was never sent. A take now
    returns too the replies the taker owns without knowing of them."""
    first = instance(tmp_path, "i0", telegram, ["i0agent"], redis_url=server.url, prefix=prefix)
    with first:
        publish(tmp_path / "agents" / "i0agent", "card of i0")
        await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")
        await eventually(lambda: "channel telegram ready" in first.logs, what="commands read")
        telegram.fail_next(
            "sendMessage", 429, "Too Many Requests: retry after 3", {"retry_after": 3}
        )
        telegram.inject_command(GROUP, "/taskcard off")
        await eventually(lambda: "rate limited in" in first.logs, timeout_s=60, what="the 429")
        assert await first.aterminate() == 0
    taking = (b"EVALSHA", f"{prefix}:replies".encode())
    async with AnswerLosingProxy(server.port, taking, hold_s=7.0) as proxy:
        second = instance(tmp_path, "i1", telegram, ["i1agent"], redis_url=proxy.url, prefix=prefix)
        with second:
            await eventually(lambda: proxy.held, timeout_s=60, what="the take's answer held")
            await eventually(
                lambda: replies(telegram, HIDDEN_REPLY) == 1, timeout_s=60, what="the reply"
            )
            assert await second.aterminate() == 0
    assert replies(telegram, HIDDEN_REPLY) == 1
    assert "Traceback" not in second.logs


async def test_a_cards_message_id_write_redis_lost_is_recorded_and_no_second_card_posted(
    tmp_path: Path, telegram: FakeTelegram, server: RedisServer, prefix: str
) -> None:
    """The platform posted the card, and the write of its message id never reached Redis
    (lost with the client's retries, as in a network cut): a traceback ("unexpected
    failure"), and the id was kept in memory only (the edits after it wrote the fingerprint
    alone), so the next start posted a second card. The id is written again at the route's
    next turn now, with one warning, and a restart edits the one card."""
    id_write = (b"MULTI", b"message_id", b"unsure_sends")
    lost = AnswerLosingProxy(server.port, id_write, hold_s=6.0, window=True, drop=True)
    async with lost as proxy:
        serve = instance(tmp_path, "i0", telegram, ["i0agent"], redis_url=proxy.url, prefix=prefix)
        workdir = tmp_path / "agents" / "i0agent"
        with serve:
            publish(workdir, "card step 1")
            await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")
            assert proxy.held
            client = redis.Redis.from_url(server.url, decode_responses=True)
            try:
                key = f"{prefix}:res:telegram:{GROUP}::i0agent"
                await eventually(
                    lambda: client.hget(key, "message_id") is not None,
                    timeout_s=60,
                    what="the message id recorded",
                )
            finally:
                client.close()
            assert await serve.aterminate() == 0
        again = instance_again(serve)
        with again:
            publish(workdir, "card step 2")
            await eventually(
                lambda: any("step 2" in m.text for m in telegram.bot_messages(GROUP)),
                timeout_s=60,
                what="the card edited after the restart",
            )
            assert await again.aterminate() == 0
    assert len(telegram.bot_messages(GROUP)) == 1, "one card, edited"
    assert "the state store did not take its record" in serve.logs
    assert "Traceback" not in serve.logs + again.logs


def instance_again(serve: Any) -> Any:
    """The same instance (its config and environment) started again."""
    from tests.e2e.harness import ServeProcess

    return ServeProcess(serve.config, env=serve.env)


@pytest.mark.parametrize("command", ["status", "chats"])
def test_status_and_chats_with_a_redis_user_lacking_a_read_are_one_line(
    tmp_path: Path, server: RedisServer, prefix: str, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`taskcard status` and `chats` read the shared state with the cluster's Redis user;
    one that may not run a read they use ended in a NoPermissionError traceback."""
    (tmp_path / "a").mkdir()
    config = tmp_path / "taskcard.toml"
    config.write_text(
        '[[agents]]\nid = "a"\nworkdir = "a"\n[console]\nenabled = true\n'
        f'[cluster]\nredis_url_env = "TC_REDIS_URL"\nkey_prefix = "{prefix}"\n'
    )
    rules = ["+@all", "-hgetall", "-hscan", "-smembers", "-zrange", "-hmget", "~*", "&*"]
    monkeypatch.setenv("TC_REDIS_URL", acl_user(server, rules))
    result = run_cli(command, "--config", str(config), timeout_s=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "(NOPERM)" in lines[0] and "ACL SETUSER" in lines[0], lines
    assert "Traceback" not in result.stderr
    assert "Pa55" not in result.stderr + result.stdout
