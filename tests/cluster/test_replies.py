"""The cluster's kept command replies against a real Redis: a reply this instance sent is
never sent again, even when Redis did not take its removal."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from taskcard.bridge.cluster import replies as replies_module
from taskcard.bridge.cluster.replies import STALE_AFTER_S, ClusterReplies
from taskcard.bridge.schedule.scheduler import RouteScheduler
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.channels.base import ChatRef, Outgoing, ReplyTo
from tests.bridge.test_scheduler import AnswerLosingChannel, text, wait_for


@pytest.fixture
async def aio(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


class _DeafToDeletes(Redis):
    """A client whose HDEL does not reach Redis while `deaf`, as during a network cut."""

    deaf = True

    async def hdel(self, name: str, *keys: str) -> int:  # type: ignore[override]
        if self.deaf:
            raise RedisConnectionError("cut")
        return cast(int, await super().hdel(name, *keys))


class _NotOnTheLoop(redis.Redis):
    """The blocking client, which must not be used on the event loop: during a Redis outage
    each call held the loop (every chat and agent) for its socket timeout."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        raise AssertionError(f"a blocking Redis call on the event loop: {args[0]}")


async def test_a_sent_reply_whose_removal_redis_missed_is_not_sent_again(
    aio: Redis, redis_url: str
) -> None:
    prefix = f"t-{uuid.uuid4().hex}"
    deaf = _DeafToDeletes.from_url(redis_url, decode_responses=True)
    sync = _NotOnTheLoop.from_url(redis_url, decode_responses=True)
    replies = ClusterReplies(sync, deaf, prefix, "i0#1", lease_ttl_s=1.0)
    entry = {"channel": "telegram", "chat_id": "5", "thread_id": None, "text": "done"}
    replies.keep("reply:1", entry)
    replies.forget("reply:1")  # sent; its removal is lost
    await replies.flush()
    assert await aio.hexists(f"{prefix}:replies", "reply:1"), "still kept in Redis"
    deaf.deaf = False
    assert await replies.take(["telegram"]) == {}, "taken back, it would be sent twice"
    assert not await aio.hexists(f"{prefix}:replies", "reply:1"), "removed at the next take"
    # A stop hands over only what is unsent: a sent reply kept by a missed removal is not.
    deaf.deaf = True
    replies.keep("reply:2", entry)
    replies.forget("reply:2")
    await replies.flush()
    deaf.deaf = False
    await replies.release()
    assert not await aio.hexists(f"{prefix}:replies", "reply:2")
    await deaf.aclose()
    sync.close()


async def test_keeping_and_forgetting_never_block_the_loop_and_keep_their_order(
    aio: Redis, redis_url: str
) -> None:
    prefix = f"t-{uuid.uuid4().hex}"
    sync = _NotOnTheLoop.from_url(redis_url, decode_responses=True)
    replies = ClusterReplies(sync, aio, prefix, "i0#1", lease_ttl_s=1.0)
    entry = {"channel": "telegram", "chat_id": "5", "thread_id": None, "text": "done"}
    for n in range(20):
        replies.keep(f"reply:{n}", entry)
        if n % 2:
            replies.forget(f"reply:{n}")  # sent at once: removed after its keep, never before
    # A take meanwhile never hands back a reply whose removal is still queued.
    assert await replies.take(["telegram"]) == {}
    await replies.release()
    kept = await aio.hkeys(f"{prefix}:replies")
    assert sorted(kept) == sorted(f"reply:{n}" for n in range(0, 20, 2))
    sync.close()


async def test_a_reply_no_instance_took_for_a_day_is_dropped(aio: Redis, redis_url: str) -> None:
    """Kept replies of a channel no live instance sends on stayed in `P:replies` for good."""
    prefix = f"t-{uuid.uuid4().hex}"
    sync = redis.Redis.from_url(redis_url, decode_responses=True)
    replies = ClusterReplies(sync, aio, prefix, "i0#1", lease_ttl_s=1.0)
    entry = {"channel": "feishu", "chat_id": "oc_1", "thread_id": None, "text": "done"}
    now_ms = int(time.time() * 1000)
    stale_ms = now_ms - int(STALE_AFTER_S * 1000) - 1000
    key = f"{prefix}:replies"
    await aio.hset(key, "reply:old", f"* {stale_ms} feishu {json.dumps(entry)}")
    await aio.hset(key, "reply:new", f"* {now_ms} feishu {json.dumps(entry)}")
    assert await replies.take(["telegram"]) == {}
    assert not await aio.hexists(key, "reply:old"), "a day old, on a channel nobody sends on"
    assert await aio.hexists(key, "reply:new"), "still waits for an instance with its channel"
    assert await replies.take(["feishu"]) == {"reply:new": entry}
    sync.close()


class _Unanswering(Redis):
    """A client whose HSET never gets an answer, as from a Redis that stopped answering."""

    async def hset(self, *args: Any, **kwargs: Any) -> int:  # type: ignore[override]
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_stop_does_not_wait_on_a_redis_that_does_not_answer(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`release` waited for every queued write, each as long as the socket timeout: a
    stop during an outage took that times the queue. It lets go after `RELEASE_FLUSH_S`."""
    monkeypatch.setattr(replies_module, "RELEASE_FLUSH_S", 0.2)
    hung = _Unanswering.from_url(redis_url, decode_responses=True)
    sync = _NotOnTheLoop.from_url(redis_url, decode_responses=True)
    replies = ClusterReplies(sync, hung, f"t-{uuid.uuid4().hex}", "i0#1", lease_ttl_s=1.0)
    entry = {"channel": "telegram", "chat_id": "5", "thread_id": None, "text": "done"}
    for n in range(5):
        replies.keep(f"reply:{n}", entry)
    await asyncio.wait_for(replies.release(), timeout=60)
    await hung.aclose()


async def test_a_take_hands_over_a_share_of_many_replies_and_the_rest_next(
    aio: Redis, redis_url: str
) -> None:
    """Every reply let go was handed over at each take, however many (a hash someone
    filled): now at most `TAKE_PER_RENEWAL` a take, those let go first, the rest at the
    next takes, none lost; and none over `MAX_REPLY_BYTES`, which stays where it is."""
    from taskcard.bridge.cluster.replies import MAX_REPLY_BYTES, TAKE_PER_RENEWAL

    prefix = f"t-{uuid.uuid4().hex}"
    sync = redis.Redis.from_url(redis_url, decode_responses=True)
    replies = ClusterReplies(sync, aio, prefix, "i0#1", lease_ttl_s=1.0)
    entry = {"channel": "telegram", "chat_id": "5", "thread_id": None, "text": "done"}
    now_ms = int(time.time() * 1000)
    key = f"{prefix}:replies"
    value = f"* {now_ms} telegram {json.dumps(entry)}"
    await aio.hset(key, mapping={f"reply:{n}": value for n in range(TAKE_PER_RENEWAL + 5)})
    huge = json.dumps(entry | {"text": "x" * MAX_REPLY_BYTES})
    await aio.hset(key, "reply:huge", f"* {now_ms} telegram {huge}")
    first = await replies.take(["telegram"])
    assert len(first) == TAKE_PER_RENEWAL
    second = await replies.take(["telegram"])
    assert len(second) == 5 and not first.keys() & second.keys()
    assert await replies.take(["telegram"]) == {}
    assert (await aio.hget(key, "reply:huge") or "").startswith("* "), "left, not taken"
    sync.close()


async def test_a_removal_landing_while_a_take_awaits_its_answer_keeps_that_reply_sent(
    aio: Redis, redis_url: str
) -> None:
    """The take's script can find a sent reply whose removal was still queued; if that removal
    is written before the answer is read, the reply was no longer marked unremoved and was
    handed back to be sent a second time (seen under load with 20 keeps and forgets queued)."""
    prefix = f"t-{uuid.uuid4().hex}"
    key = f"{prefix}:replies"
    keep_go, kept, removal_go = asyncio.Event(), asyncio.Event(), asyncio.Event()
    replies: ClusterReplies

    class _Interleaved(Redis):
        """The writer's keep waits for the take's script, its removal for the script's answer."""

        async def hset(self, *args: Any, **kwargs: Any) -> int:  # type: ignore[override]
            await keep_go.wait()
            written = cast(int, await super().hset(*args, **kwargs))
            kept.set()
            return written

        async def hdel(self, name: str, *keys: str) -> int:  # type: ignore[override]
            task = asyncio.current_task()
            if task is not None and task.get_name() == "cluster_replies":
                await removal_go.wait()
            return cast(int, await super().hdel(name, *keys))

        async def execute_command(self, *args: Any, **options: Any) -> Any:
            if args[0] not in ("EVAL", "EVALSHA"):
                return await super().execute_command(*args, **options)
            keep_go.set()
            await kept.wait()  # the keep is in Redis
            answer = await super().execute_command(*args, **options)
            removal_go.set()
            await replies.flush()  # the removal is written before the answer is read
            return answer

    interleaved = _Interleaved.from_url(redis_url, decode_responses=True)
    sync = _NotOnTheLoop.from_url(redis_url, decode_responses=True)
    # A tiny lease: the instance is not listed, so its replies count as left after 30 ms.
    replies = ClusterReplies(sync, interleaved, prefix, "i0#1", lease_ttl_s=0.01)
    entry = {"channel": "telegram", "chat_id": "5", "thread_id": None, "text": "done"}
    replies.keep("reply:1", entry)
    replies.forget("reply:1")  # sent at once; both writes wait in the queue
    await asyncio.sleep(0.1)
    assert await replies.take(["telegram"]) == {}, "taken back, it would be sent twice"
    assert not await aio.hexists(key, "reply:1")
    await interleaved.aclose()
    sync.close()


def _unsure(stored: str | None) -> bool:
    """Whether a value of `P:replies` holds its reply marked `unsure`."""
    return stored is not None and json.loads(stored.split(" ", 3)[3]).get("unsure") is True


async def test_a_mark_is_in_redis_when_it_returns_after_the_older_writes_of_its_reply(
    aio: Redis, redis_url: str
) -> None:
    """A reply about to go out on Telegram is marked `unsure` first. The mark was only queued:
    the send could go out before Redis had it (or without it, when Redis refused it), and a
    kill then let the instance taking over send it again. `mark` returns once Redis has it,
    after the writes of its reply queued before it, and raises when Redis refused it."""
    prefix = f"t-{uuid.uuid4().hex}"
    go = asyncio.Event()
    refusing = False

    class _Slow(Redis):
        """HSET waits for `go`, and is refused while `refusing`."""

        async def hset(self, *args: Any, **kwargs: Any) -> int:  # type: ignore[override]
            await go.wait()
            if refusing:
                raise RedisConnectionError("refused")
            return cast(int, await super().hset(*args, **kwargs))

    slow = _Slow.from_url(redis_url, decode_responses=True)
    sync = _NotOnTheLoop.from_url(redis_url, decode_responses=True)
    replies = ClusterReplies(sync, slow, prefix, "i0#1", lease_ttl_s=1.0)
    entry = {"channel": "telegram", "chat_id": "5", "thread_id": None, "text": "done"}
    replies.keep("reply:1", entry)  # queued: Redis has not answered it yet
    marking = asyncio.create_task(replies.mark("reply:1", entry | {"unsure": True}))
    await asyncio.sleep(0.2)
    assert not marking.done(), "returned before Redis took it"
    go.set()
    await asyncio.wait_for(marking, timeout=60)
    assert _unsure(await aio.hget(f"{prefix}:replies", "reply:1")), "overtaken by the keep"
    refusing = True
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(replies.mark("reply:2", entry | {"unsure": True}), timeout=60)
    await slow.aclose()
    sync.close()


async def test_a_reply_is_not_sent_on_telegram_until_redis_took_its_mark(
    aio: Redis, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The scheduler with the cluster's replies on a real Redis: while Redis refuses the
    reply's `unsure` mark it is not sent (it went out anyway, and a kill -9 then let the
    instance taking over post it a second time); once Redis takes it, it is sent, and every
    send found its mark in Redis first."""
    prefix = f"t-{uuid.uuid4().hex}"
    refusing = True

    class _Refusing(Redis):
        async def hset(self, *args: Any, **kwargs: Any) -> int:  # type: ignore[override]
            if refusing:
                raise RedisConnectionError("refused")
            return cast(int, await super().hset(*args, **kwargs))

    found: list[str | None] = []  # what Redis held for each reply as its request went out

    class _Telegram(AnswerLosingChannel):
        async def send(
            self,
            chat: ChatRef,
            message: Outgoing,
            *,
            idempotency_key: str | None = None,
            reply_to: ReplyTo | None = None,
        ) -> str:
            found.append(await aio.hget(f"{prefix}:replies", idempotency_key or ""))
            return await super().send(chat, message)

    refused = _Refusing.from_url(redis_url, decode_responses=True)
    sync = _NotOnTheLoop.from_url(redis_url, decode_responses=True)
    replies = ClusterReplies(sync, refused, prefix, "i0#1", lease_ttl_s=1.0)
    channel = _Telegram()
    store = SqliteStore.in_dir(tmp_path / "state")
    mono = [1000.0]
    scheduler = RouteScheduler(
        {"fake": channel}, store, clock=lambda: mono[0], shared_replies=replies
    )
    try:
        await scheduler.start()
        scheduler.channel_ready("fake")
        scheduler.send_reply("fake", ChatRef("5"), text("first"), collapse_key="a")
        refusal = "the state store did not take the reply's send"
        await wait_for(lambda: bool(channel.calls) or refusal in caplog.text, "a send or not")
        assert not channel.calls, "sent while Redis refused its mark"
        refusing = False
        mono[0] += 5  # past the backoff
        scheduler.send_reply("fake", ChatRef("5"), text("second"), collapse_key="b")
        await wait_for(lambda: len(channel.calls) == 2, "both sent")
        assert sorted(call[3] for call in channel.calls) == ["first", "second"]
        assert all(_unsure(stored) for stored in found), found
        await scheduler.stop()
    finally:
        store.close()
        await refused.aclose()
        sync.close()
