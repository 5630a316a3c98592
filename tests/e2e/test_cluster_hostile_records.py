"""What one instance reads of the others' records in Redis is untrusted, through two
`taskcard serve` processes on a real Redis against the fake Bot API and Feishu.

A routed record (`P:routed:<owner>`) is any writer's: one this version cannot read (nested
past what the parser takes, not UTF-8, huge, of another shape) is left out and logged by its
key; the command is answered from the others.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from taskcard.bridge.cluster.runtime import MAX_ROUTED_BYTES
from tests.e2e.harness import ServeProcess, eventually, publish
from tests.e2e.test_cluster import instance
from tests.e2e.test_talk_and_signals import GROUP
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram


@pytest.fixture(params=["telegram", "feishu"])
def platform(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_hostile_routed_record_is_left_out_and_the_command_answered(
    platform: str, telegram: FakeTelegram, feishu: FakeFeishu, tmp_path: Path, redis_url: str,
    prefix: str, fleet: ExitStack,
) -> None:  # fmt: skip
    """i0 routes i0agent, i1 i1agent; four more "instances" are listed live, their routed
    records deeply nested JSON, bytes not UTF-8, over `MAX_ROUTED_BYTES`, and a JSON list.
    The nested one raised a RecursionError out of the read: `/taskcard` went unanswered.
    Now it lists both agents, and each record left out is logged once by its key."""
    from redis import Redis

    serves: list[ServeProcess] = []
    if platform == "telegram":
        for name in ("i0", "i1"):
            serves.append(
                fleet.enter_context(
                    instance(tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url,
                             prefix=prefix)
                )
            )  # fmt: skip
        folders = {name: tmp_path / "agents" / f"{name}agent" for name in ("i0", "i1")}

        def texts() -> list[str]:
            return [m.text for m in telegram.bot_messages(GROUP)]

        async def say(text: str) -> None:
            telegram.inject_message(GROUP, text, user_id=7)

    else:
        from tests.e2e.test_cluster import feishu_instance
        from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY

        setups = [
            feishu_instance(tmp_path, name, feishu, redis_url=redis_url, prefix=prefix)
            for name in ("i0", "i1")
        ]
        for setup in setups:
            serves.append(fleet.enter_context(setup.serve()))
        folders = {name: tmp_path / name / "agents" / f"{name}agent" for name in ("i0", "i1")}

        def texts() -> list[str]:
            return [m.text for m in feishu.chat(CHAT)]

        async def say(text: str) -> None:
            event = feishu.command_event(CHAT, text, verification_token=VERIFY)
            delivered = await feishu.deliver_event(setups[0].url, event, encrypt_key=ENCRYPT)
            assert delivered.status == 200

    for name, folder in folders.items():
        publish(folder, f"card of {name}")

    def said(words: str) -> list[str]:
        return [text for text in texts() if words in text]

    await eventually(lambda: said("card of i0") and said("card of i1"), timeout_s=60, what="cards")
    hostile: dict[str, bytes] = {
        "deep#1": b"[" * 200_000,
        "bytes#2": b'{"' + platform.encode() + b'": {"\xff\xfe": 1}}',
        "huge#3": b'"' + b"x" * MAX_ROUTED_BYTES + b'"',
        "list#4": b'["i9agent"]',
    }
    with Redis.from_url(redis_url) as client:
        await eventually(
            lambda: len(client.keys(f"{prefix}:routed:*")) == 2, timeout_s=60, what="routes"
        )
        far = 10**13  # listed as live until long after the test (epoch ms)
        for owner, raw in hostile.items():
            client.set(f"{prefix}:routed:{owner}", raw)
            client.zadd(f"{prefix}:instances", {owner: far})
    await say("/taskcard")
    [state] = await eventually(
        lambda: said("served by another instance"), timeout_s=60, what="/taskcard answered"
    )
    assert "i0agent" in state and "i1agent" in state, state
    await say("/tell nobody hello")
    await eventually(
        lambda: said("AGENT is one of i0agent, i1agent"), timeout_s=60, what="/tell refused"
    )
    for owner, why in (
        ("deep#1", "nested deeper than can be read"),
        ("bytes#2", "not UTF-8"),
        ("huge#3", f"over the {MAX_ROUTED_BYTES} read"),
        ("list#4", "a JSON list, not an object"),
    ):
        key = f"{prefix}:routed:{owner}"
        # Once by each instance that read it, however many commands read it.
        logged = [[line for line in s.logs.splitlines() if key in line] for s in serves]
        assert [len(lines) for lines in logged] in ([1, 0], [0, 1], [1, 1]), logged
        assert all(why in line for lines in logged for line in lines), logged
    assert not any("Traceback" in s.logs for s in serves)


async def test_cluster_keys_not_utf8_are_left_out_and_both_instances_serve(
    telegram: FakeTelegram, tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """A writer with the Redis user's rights left bytes that are not UTF-8 in the keys every
    instance reads as the cluster's: a running instance's name, the count of routes
    rewritten, a bot's record, and the lease of an agent with a board line. Read strictly,
    each raised where it is read: at the start (the bot's record), at every lease renewal
    (the instances, the count), at each `/tell` (the instances) and at each composition of
    the board (the lease). Each such entry is left out, logged once by its key, and both
    instances serve the board and the chat."""
    from redis import Redis

    scope = f"telegram:{GROUP}:"
    bad = b"\xff\xfe"
    line = json.dumps({"writer": "nobody#0", "line": {"agent_id": "ghost"}})
    with Redis.from_url(redis_url) as client:
        client.zadd(f"{prefix}:instances", {bad: int(time.time() * 1000) + 3_600_000})
        client.set(f"{prefix}:routes-changed", bad)
        client.hset(f"{prefix}:bots:telegram", bad, str(int(time.time() * 1000) + 3_600_000))
        client.hset(f"{prefix}:board:{scope}", "ghost", line)
        client.set(f"{prefix}:lease:agent:ghost", bad)
    serves = [
        fleet.enter_context(
            instance(
                tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url, prefix=prefix,
                view="board",
            )
        )
        for name in ("i0", "i1")
    ]  # fmt: skip
    for name in ("i0", "i1"):
        publish(tmp_path / "agents" / f"{name}agent", f"card of {name}")
    await eventually(
        lambda: any(
            "card of i0" in m.text and "card of i1" in m.text for m in telegram.bot_messages(GROUP)
        ),
        timeout_s=60,
        what="the board with both lines",
    )
    telegram.inject_message(GROUP, "/tell i1agent look at the logs", user_id=7)
    inbox = tmp_path / "agents" / "i1agent" / "inbox" / "queued"
    await eventually(lambda: list(inbox.glob("*.json")), timeout_s=60, what="the text queued")
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs, serve.logs
        assert "renewing the cluster leases failed" not in serve.logs, serve.logs
        assert f"Redis {prefix}:instances \\xff\\xfe: the stored value is not UTF-8" in serve.logs


async def test_a_relayed_command_not_utf8_is_skipped_and_the_next_handled(
    telegram: FakeTelegram, tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """The chats' command stream is any writer's: an entry whose command is not UTF-8
    failed the reading of the stream on every instance, so no command after it was handled
    anywhere. It is skipped, logged once, and the next
    command (a `/tell` for the other instance's agent) reaches its agent."""
    from redis import Redis

    serves = [
        fleet.enter_context(
            instance(tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url, prefix=prefix)
        )
        for name in ("i0", "i1")
    ]
    await eventually(
        lambda: all("channel telegram ready" in s.logs for s in serves),
        timeout_s=60,
        what="every instance reading the chats' commands",
    )
    with Redis.from_url(redis_url) as client:
        client.xadd(f"{prefix}:cmd:telegram", {"command": b"\xff\xfe"})
    telegram.inject_message(GROUP, "/tell i1agent look at the logs", user_id=7)
    inbox = tmp_path / "agents" / "i1agent" / "inbox" / "queued"
    await eventually(lambda: list(inbox.glob("*.json")), timeout_s=60, what="the text queued")
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs, serve.logs
        assert "skipping an unreadable command in the stream" in serve.logs, serve.logs


async def test_an_unsent_reply_not_utf8_is_dropped_and_the_renewals_go_on(
    telegram: FakeTelegram, tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """The replies a stopped instance left unsent (`P:replies`) are any writer's: one whose
    entry is not UTF-8 was taken over by an instance and then failed its decoding, at that
    lease renewal and at every one after (the reply was the instance's from then on), before
    the renewal took the orchestrators' wakes. It is dropped as unreadable, and the
    renewals go on."""
    from redis import Redis

    entry = b"* %d telegram \xff\xfe" % int(time.time() * 1000)
    with Redis.from_url(redis_url) as client:
        client.hset(f"{prefix}:replies", "hostile", entry)
        serves = [
            fleet.enter_context(
                instance(
                    tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url,
                    prefix=prefix,
                )
            )
            for name in ("i0", "i1")
        ]  # fmt: skip
        await eventually(
            lambda: not client.hexists(f"{prefix}:replies", "hostile"),
            timeout_s=60,
            what="the unreadable reply dropped",
        )
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "renewing the cluster leases failed" not in serve.logs, serve.logs
