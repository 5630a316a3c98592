"""A cluster's chat commands when Redis fails while one is being answered, end to end.

The command was read from the shared stream, then a call to the shared state on its way to
the answer failed (a key of another type, a Redis that refuses or does not answer): the
failure was a traceback and the command was never answered. Now the command waits for Redis
like the stream's own calls (one line naming what is wrong and what to do), is answered once
Redis takes the call again, and only once across the instances.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import redis

from tests.e2e.harness import eventually, publish
from tests.e2e.test_cluster import (
    HIDDEN_REPLY,
    feishu_instance,
    instances_with_cards,
    past_a_later_command,
    replies,
)
from tests.e2e.test_docs import operators_redis_user
from tests.e2e.test_serve_telegram import GROUP
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

HELD = "waits until this is fixed (the other commands go on)"
WAITS = "waits for Redis"


async def test_a_command_whose_state_key_redis_refuses_waits_alone_and_is_answered_once(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """A key the answer needs holding another type mid-run (here the chats every command is
    recorded in): a traceback and no answer. Now one error says so and what to do, the
    command waits on its own instead of holding the stream in line, and deleting the key
    gets it answered, once across the instances."""
    by_name = await instances_with_cards(
        tmp_path, telegram, fleet, redis_url=redis_url, prefix=prefix
    )
    serves = list(by_name.values())
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    chats = f"{prefix}:chats"
    client.delete(chats)
    client.set(chats, "left by another program")
    telegram.inject_command(GROUP, "/taskcard off")
    await eventually(
        lambda: all(HELD in s.logs and "(WRONGTYPE)" in s.logs for s in serves),
        timeout_s=60,
        what="each instance saying the command waits",
    )
    assert not replies(telegram, HIDDEN_REPLY)
    client.delete(chats)
    await eventually(lambda: replies(telegram, HIDDEN_REPLY) == 1, timeout_s=60, what="the reply")
    await past_a_later_command(telegram, serves)
    assert replies(telegram, HIDDEN_REPLY) == 1, "answered once"
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs
        assert serve.logs.count(HELD) == 1, "said once, not at each retry"
        assert "key_prefix" in serve.logs  # what to do
        assert "Redis takes the command waiting for a key of another type again" in serve.logs
    client.close()


async def test_a_cancel_claim_key_of_another_type_holds_only_that_command(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """`/taskcard cancel` records its choice in `P:claim:cancel:...`; that key holding a hash
    was a traceback on every instance and the cancel was never answered nor done."""
    by_name = await instances_with_cards(
        tmp_path, telegram, fleet, redis_url=redis_url, prefix=prefix
    )
    serves = list(by_name.values())
    inbox = tmp_path / "agents" / "i1agent" / "inbox"
    telegram.inject_command(GROUP, "/tell i1agent withdraw me")
    await eventually(lambda: list((inbox / "queued").glob("*.json")), timeout_s=60, what="text")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    following = max(m.message_id for m in telegram.messages(GROUP)) + 1
    # The cancel's message id is one of these (a status message may be posted meanwhile).
    keys = [f"{prefix}:claim:cancel:telegram:{GROUP}:{following + n}" for n in range(4)]
    for key in keys:
        client.hset(key, "left by", "another program")
    telegram.inject_command(GROUP, "/taskcard cancel")
    telegram.inject_command(GROUP, "/taskcard 5")
    await eventually(lambda: replies(telegram, "5 activity rows"), timeout_s=60, what="the next")
    await eventually(
        lambda: all("is a hash, not the string" in s.logs for s in serves),
        timeout_s=60,
        what="the key named on each instance",
    )
    assert not replies(telegram, "was cancelled")
    assert list((inbox / "queued").glob("*.json")), "not withdrawn while its choice waits"
    client.delete(*keys)
    await eventually(lambda: replies(telegram, "was cancelled") == 1, timeout_s=60, what="cancel")
    await past_a_later_command(telegram, serves)
    assert replies(telegram, "Your latest message to i1agent was cancelled") == 1
    assert not list((inbox / "queued").glob("*.json"))
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs
        named = [key for key in keys if f"DEL {key}" in serve.logs]
        assert len(named) == 1 and serve.logs.count(f"DEL {named[0]}") == 1, "named once"
    client.close()


async def test_feishu_a_cancel_claim_key_of_another_type_waits_then_is_answered_once(
    tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY, card_texts

    async with FakeFeishu() as fake:
        setups, serves = [], []
        for name in ("i0", "i1"):
            setup = feishu_instance(tmp_path, name, fake, redis_url=redis_url, prefix=prefix)
            serves.append(fleet.enter_context(setup.serve()))
            publish(tmp_path / name / "agents" / f"{name}agent", f"card of {name}")
            setups.append(setup)
        await eventually(lambda: len(card_texts(fake)) == 2, timeout_s=60, what="two cards")
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        key = f"{prefix}:claim:cancel:feishu:{CHAT}:om_cancel_1"
        client.hset(key, "left by", "another program")
        event = fake.command_event(
            CHAT, "/taskcard cancel", verification_token=VERIFY, message_id="om_cancel_1"
        )
        assert (await fake.deliver_event(setups[0].url, event, encrypt_key=ENCRYPT)).status == 200
        later = fake.command_event(CHAT, "/taskcard 5", verification_token=VERIFY)
        assert (await fake.deliver_event(setups[1].url, later, encrypt_key=ENCRYPT)).status == 200
        await eventually(
            lambda: any("5 activity rows" in t for t in fake.texts(CHAT)),
            timeout_s=60,
            what="the next command answered",
        )
        await eventually(
            lambda: all(f"DEL {key}" in s.logs for s in serves), timeout_s=60, what="the key named"
        )
        assert not any("no queued message" in t for t in fake.texts(CHAT))
        client.delete(key)
        await eventually(
            lambda: sum("no queued message" in t for t in fake.texts(CHAT)) == 1,
            timeout_s=60,
            what="the cancel answered",
        )
        unrouted = fake.command_event("oc_unrouted", "/taskcard", verification_token=VERIFY)
        assert (
            await fake.deliver_event(setups[1].url, unrouted, encrypt_key=ENCRYPT)
        ).status == 200
        await eventually(
            lambda: all("from an unrouted chat feishu:oc_unrouted" in s.logs for s in serves),
            timeout_s=60,
            what="both instances past a later command",
        )
        assert sum("no queued message" in t for t in fake.texts(CHAT)) == 1, "answered once"
        for serve in serves:
            assert await serve.aterminate() == 0
            assert "Traceback" not in serve.logs
            assert serve.logs.count(f"DEL {key}") == 1
        client.close()


async def test_a_tell_redis_refused_to_record_costs_its_author_one_message(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """A person may send one message in ten minutes; Redis refused the record of their
    `/tell` (its key of another type). The command waited for the key to be fixed, but its
    first try had counted the message: the next try was refused as too many, and the text
    was lost. A try that recorded nothing counts nothing."""
    by_name = await instances_with_cards(
        tmp_path,
        telegram,
        fleet,
        redis_url=redis_url,
        prefix=prefix,
        limits="[inbox]\nmax_messages = 1\nperiod_s = 600",
    )
    serves = list(by_name.values())
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    records = f"{prefix}:inbox"
    client.delete(records)
    client.set(records, "left by another program")
    telegram.inject_command(GROUP, "/tell i1agent hello there")
    await eventually(
        lambda: any(WAITS in s.logs for s in serves), timeout_s=60, what="the command waiting"
    )
    client.delete(records)
    queued = tmp_path / "agents" / "i1agent" / "inbox" / "queued"
    await eventually(lambda: list(queued.glob("*.json")), timeout_s=60, what="the text queued")
    await past_a_later_command(telegram, serves)
    assert replies(telegram, "Too many messages") == 0
    for serve in serves:
        assert await serve.aterminate() == 0
    client.close()


async def test_instances_of_a_redis_user_granted_the_operators_list_list_themselves_live(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """Two instances whose Redis user is granted exactly docs/operators.md's list of
    commands. Each rewrite of an instance's routed record counts a change for the others;
    that count was sent as INCRBY (redis-py's `incr`), which the list and the start's check
    did not have: NOPERM, swallowed, and the instance never listed itself as live, so the
    others answered `/tell` to its agents as naming none, and `/taskcard` left them out."""
    with operators_redis_user(redis_url, prefix) as user_url:
        by_name = await instances_with_cards(
            tmp_path, telegram, fleet, redis_url=user_url, prefix=prefix
        )
        admin = redis.Redis.from_url(redis_url, decode_responses=True)
        try:
            await eventually(
                lambda: (
                    {one.split("#")[0] for one in admin.zrange(f"{prefix}:instances", 0, -1)}
                    >= {"i0", "i1"}
                    and int(admin.get(f"{prefix}:routes-changed") or 0) >= 2
                ),
                timeout_s=60,
                what="both instances listed live, their routes' changes counted",
            )
        finally:
            admin.close()
        for agent in ("i0agent", "i1agent"):
            telegram.inject_command(GROUP, f"/tell {agent} hello from the chat")
            inbox = tmp_path / "agents" / agent / "inbox" / "queued"
            await eventually(
                lambda inbox=inbox: any(inbox.glob("*.json")),
                timeout_s=60,
                what=f"the /tell queued for {agent}",
            )
        for serve in by_name.values():
            assert await serve.aterminate() == 0
