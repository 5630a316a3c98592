"""What every instance of a cluster reads again and again is bounded in size, through two
`taskcard serve` processes on a real Redis against the fake Bot API.

At each lease renewal, each board composition and each command, an instance reads values any
writer with the Redis user's rights can make huge: a chat's board lines and the leases of
their agents, the replies stopped instances left unsent (`P:replies`), the count of routes
rewritten, the listing of the running instances. Each was read whole, every few seconds, by
every instance. Now a value past its cap is left out, and named once in the log with its key
and what to do, and the instances serve on.

While a running instance's routed record does not say that it moves the count of routes
rewritten (an older release's, during a rolling update: for hours), every instance reads
every record at each renewal; each record was carried and parsed whole each time. Now an
unchanged one costs its digest.

A running instance listed in `P:instances` with no routed record kept every instance reading
every record at each renewal for as long as it stayed listed (anyone can add such a member):
now it stops counting after a few lease periods, said once.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path

from taskcard.bridge.cluster.boards import MAX_LEASE_BYTES, MAX_LINE_BYTES
from taskcard.bridge.cluster.replies import MAX_REPLY_BYTES
from taskcard.bridge.store.redis import MAX_OWNER_BYTES
from tests.e2e.harness import eventually, publish
from tests.e2e.test_cluster import instance
from tests.e2e.test_talk_and_signals import GROUP
from tests.fakes.telegram_api import FakeTelegram
from tests.redis_server import private_redis

LEFT_OUT = "it is left out of what is read"


async def test_oversize_shared_values_are_left_out_named_once_and_the_cluster_serves(
    telegram: FakeTelegram, tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """Two instances show their agents on the chat's board; a third writer plants, past
    each cap: a board line, a board line's agent lease, an unsent reply let go for the
    instances' channel, the count of routes rewritten and a running instance's name. The
    board still follows both agents, a `/tell` still reaches the other instance's agent,
    and each planted value is named once in the log of each instance that met it, by its
    key, with the fix."""
    from redis import Redis

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

    def board_shows(*words: str) -> bool:
        return any(all(w in m.text for w in words) for m in telegram.bot_messages(GROUP))

    await eventually(
        lambda: board_shows("card of i0", "card of i1"), timeout_s=60, what="the board"
    )
    board = f"{prefix}:board:telegram:{GROUP}:"
    replies = f"{prefix}:replies"
    counter = f"{prefix}:routes-changed"
    instances = f"{prefix}:instances"
    lease = f"{prefix}:lease:agent:ghost2"
    now_ms = int(time.time() * 1000)
    line = {"agent_id": "ghost", "state": "working", "marks": [], "movement": None}
    line |= {"movement_at": None, "started": True}
    with Redis.from_url(redis_url) as client:
        huge_line = {"writer": "nobody#0", "line": line | {"headline": "x" * MAX_LINE_BYTES}}
        client.hset(board, "ghost", json.dumps(huge_line))
        plain = {"writer": "nobody#0", "line": line | {"agent_id": "ghost2", "headline": "hi"}}
        client.hset(board, "ghost2", json.dumps(plain))
        client.set(lease, "nobody#0|" + "1" * MAX_LEASE_BYTES)
        entry = {"channel": "telegram", "chat_id": str(GROUP), "text": "x" * MAX_REPLY_BYTES}
        client.hset(replies, "reply:huge", f"* {now_ms} telegram {json.dumps(entry)}")
        client.set(counter, "9" * 1_000)
        client.zadd(instances, {"n" * (MAX_OWNER_BYTES + 1): now_ms + 3_600_000})
    # A change of each agent's card: the board is composed again, reading its lines.
    for name in ("i0", "i1"):
        publish(tmp_path / "agents" / f"{name}agent", f"card again of {name}")
    await eventually(
        lambda: board_shows("card again of i0", "card again of i1"),
        timeout_s=60,
        what="the board composed again",
    )
    telegram.inject_message(GROUP, "/tell i1agent look at the logs", user_id=7)
    inbox = tmp_path / "agents" / "i1agent" / "inbox" / "queued"
    await eventually(lambda: list(inbox.glob("*.json")), timeout_s=60, what="the text queued")
    everyone = (replies, counter, instances)  # read by every instance at each renewal
    await eventually(
        lambda: (
            all(f"Redis key {key}:" in s.logs for s in serves for key in everyone)
            and any(f"Redis key {board}: field ghost " in s.logs for s in serves)
            and any(f"Redis key {lease}:" in s.logs for s in serves)
        ),
        timeout_s=60,
        what="each planted value named",
    )
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs, serve.logs
        assert "renewing the cluster leases failed" not in serve.logs, serve.logs
        named = [line for line in serve.logs.splitlines() if LEFT_OUT in line]
        keys = [key for key in (board, lease, *everyone) if any(key in n for n in named)]
        assert len(named) == len(keys), named  # once each, however many renewals read it
        by_key = {key: next(n for n in named if f"Redis key {key}:" in n) for key in keys}
        assert f"HDEL {replies} reply:huge" in by_key[replies]
        assert f"DEL {counter}" in by_key[counter]
        assert f"ZREM {instances}" in by_key[instances]
        if board in by_key:
            assert f"HDEL {board} ghost" in by_key[board]
        if lease in by_key:
            assert f"DEL {lease}" in by_key[lease]
    with Redis.from_url(redis_url) as client:
        assert client.hexists(replies, "reply:huge"), "left where it was, not taken"


async def test_a_listed_instance_that_writes_no_record_stops_counting_said_once(
    telegram: FakeTelegram, tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """A member of `P:instances` listed as running for an hour, with no routed record: as
    an older release that lists itself first, every instance read every record at each
    renewal while it stayed. Now, after three lease periods without a record, each instance
    says once that it no longer waits for it (and how to remove it), and goes on serving."""
    from redis import Redis

    instances = f"{prefix}:instances"
    with Redis.from_url(redis_url) as client:
        client.zadd(instances, {"ghost#00000000": int(time.time() * 1000) + 3_600_000})
    serves = [
        fleet.enter_context(
            instance(tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url, prefix=prefix)
        )
        for name in ("i0", "i1")
    ]
    for name in ("i0", "i1"):
        publish(tmp_path / "agents" / f"{name}agent", f"card of {name}")
    said = f"Redis key {instances} lists ghost#00000000 as a running instance"
    await eventually(
        lambda: all(said in s.logs for s in serves), timeout_s=60, what="the member named"
    )
    # Renewals go on (a lease period is 2 s): it is said once all the same.
    telegram.inject_message(GROUP, "/tell i1agent look at the logs", user_id=7)
    inbox = tmp_path / "agents" / "i1agent" / "inbox" / "queued"
    await eventually(lambda: list(inbox.glob("*.json")), timeout_s=60, what="the text queued")
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs, serve.logs
        [line] = [line for line in serve.logs.splitlines() if said in line]
        assert f"ZREM {instances} ghost#00000000" in line, line
        assert f"({prefix}:routed:ghost#00000000)" in line, line


async def test_an_unchanged_routed_record_is_not_read_again_at_each_renewal(
    telegram: FakeTelegram, tmp_path: Path, prefix: str, fleet: ExitStack
) -> None:
    """An older release's record (no `@counted`) of 3 MiB, its instance listed as running:
    every renewal of each instance carried it whole (about 2 MB a second per instance at
    the tests' leases). Now, over four renewals of each instance after the start, Redis
    sends them less than that record's size in all. On a Redis of the test's own, so that
    what it sends is theirs alone."""
    from redis import Redis

    server = private_redis(tmp_path / "redis", fleet)
    agents = [f"older{n:07d}" for n in range(3 * 1024 * 1024 // 16)]
    record = json.dumps({"telegram": {str(GROUP): {"": agents}}})
    assert 3 * 1024 * 1024 <= len(record) < 4 * 1024 * 1024
    instances = f"{prefix}:instances"
    client = fleet.enter_context(Redis.from_url(server.url, decode_responses=True))
    client.set(f"{prefix}:routed:older#00000000", record)
    client.zadd(instances, {"older#00000000": int(time.time() * 1000) + 3_600_000})
    serves = [
        fleet.enter_context(
            instance(
                tmp_path, name, telegram, [f"{name}agent"], redis_url=server.url, prefix=prefix
            )
        )
        for name in ("i0", "i1")
    ]
    for name in ("i0", "i1"):
        publish(tmp_path / "agents" / f"{name}agent", f"card of {name}")
    await eventually(
        lambda: all(any(f"card of {n}" in m.text for m in telegram.bot_messages(GROUP))
                    for n in ("i0", "i1")),
        timeout_s=60,
        what="both cards",
    )  # fmt: skip

    def renewals() -> dict[str, float]:
        """Each instance's listing, moved on at each of its renewals."""
        return {
            owner.split("#")[0]: score
            for owner, score in client.zrange(instances, 0, -1, withscores=True)
            if owner.split("#")[0] in ("i0", "i1")
        }

    async def renewed(times: int) -> None:
        """Until each instance's listing has moved on `times` times from now."""
        seen = renewals()
        moved = dict.fromkeys(seen, 0)

        def enough() -> bool:
            for name, score in renewals().items():
                if score != seen.get(name):
                    seen[name] = score
                    moved[name] = moved.get(name, 0) + 1
            return len(moved) == 2 and min(moved.values()) >= times

        await eventually(enough, timeout_s=120, what=f"{times} renewals of each instance")

    # The record's first read comes at the end of a renewal's round (after the lease, the
    # boards and the replies), maybe after both cards show on a loaded machine: once each
    # listing has moved twice more, every round that began before now has ended.
    await renewed(2)
    sent_before = int(client.info("stats")["total_net_output_bytes"])
    await renewed(4)
    sent = int(client.info("stats")["total_net_output_bytes"]) - sent_before
    assert sent < len(record), f"{sent} bytes sent over four renewals of each instance"
    for serve in serves:
        assert "Traceback" not in serve.logs, serve.logs


async def test_an_oversize_inbox_record_is_left_out_and_cancel_answered(
    telegram: FakeTelegram, tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """The shared inbox `P:inbox` is read whole at each clustered `/taskcard cancel` (and
    each takeover): a record someone made huge was carried and parsed each time. Now it is
    left out, named once by the instance reading it, and the author's latest text is
    cancelled as before."""
    from redis import Redis

    from taskcard.bridge.store.redis import MAX_STATE_VALUE_BYTES
    from tests.e2e.test_cluster import instances_with_cards, replies

    serves = list(
        (
            await instances_with_cards(
                tmp_path, telegram, fleet, redis_url=redis_url, prefix=prefix
            )
        ).values()
    )
    inbox = f"{prefix}:inbox"
    with Redis.from_url(redis_url) as client:
        client.hset(inbox, "huge", json.dumps({"agent_id": "x" * MAX_STATE_VALUE_BYTES}))
    queued = tmp_path / "agents" / "i1agent" / "inbox" / "queued"
    telegram.inject_command(GROUP, "/tell i1agent look at the logs")
    await eventually(lambda: list(queued.glob("*.json")), timeout_s=60, what="the text queued")
    telegram.inject_command(GROUP, "/taskcard cancel")
    await eventually(
        lambda: replies(telegram, "Your latest message to i1agent was cancelled") == 1,
        timeout_s=60,
        what="the text cancelled",
    )
    await eventually(
        lambda: any(f"Redis key {inbox}: field huge " in s.logs for s in serves),
        timeout_s=60,
        what="the record named",
    )
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs, serve.logs
        named = [line for line in serve.logs.splitlines() if f"Redis key {inbox}:" in line]
        assert len(named) <= 1, named
        assert all(f"HDEL {inbox} huge" in line for line in named), named
