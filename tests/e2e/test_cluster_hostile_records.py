"""What one instance reads of the others' records in Redis is untrusted, through two
`taskcard serve` processes on a real Redis against the fake Bot API and Feishu.

A routed record (`P:routed:<owner>`) is any writer's: one this version cannot read (nested
past what the parser takes, not UTF-8, huge, of another shape) is left out and logged by its
key; the command is answered from the others.
"""

from __future__ import annotations

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
