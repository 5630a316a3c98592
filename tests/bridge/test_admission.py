"""Fair admission between chats that share a scope, and the pacing of a busy resident (a
board).

The turn order and the pace are pure rules, shown as tables; the queue is then driven by
lanes that ask the in-memory limiter the way the scheduler's lanes do, checking the order in
which chats got through (never times: the suite runs on a loaded machine).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

import pytest

from taskcard.bridge.schedule.admission import (
    HORIZON_S,
    AdmissionQueue,
    catch_up,
    turn_order,
)
from taskcard.bridge.schedule.ratelimit import RateLimiter
from taskcard.bridge.schedule.scheduler import RouteKey, RouteScheduler, pace_s
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.channels.base import ChatRef, Outgoing, RateLimit, RateScope
from taskcard.channels.feishu.channel import FeishuChannel
from taskcard.channels.feishu.config import FeishuConfig
from taskcard.channels.telegram.channel import TelegramChannel
from taskcard.channels.telegram.config import TelegramConfig, TelegramLimits
from tests.bridge.test_scheduler import ScriptedChannel, settle
from tests.channels.conftest import MemoryCursorStore
from tests.e2e.harness import eventually


@pytest.mark.parametrize(
    ("waiting", "credit", "order"),
    [
        # Nobody served yet: first come, first served.
        (["a", "b", "c"], {}, [0, 1, 2]),
        # The chat with the least credit goes first, whatever its arrival.
        (["a", "b", "c"], {"a": 5, "b": 5}, [2, 0, 1]),
        (["a", "b", "c"], {"a": 2, "b": 0, "c": 1}, [1, 2, 0]),
        # Equals keep their arrival order.
        (["c", "a", "b"], {"a": 1, "b": 1, "c": 1}, [0, 1, 2]),
        # One chat waiting twice (a card and a notice are never both in flight, but the rule
        # does not care): both turns by arrival.
        (["a", "b", "a"], {"a": 1}, [1, 0, 2]),
        ([], {"a": 3}, []),
    ],
)
def test_turn_order(
    waiting: Sequence[Hashable], credit: Mapping[Hashable, int], order: list[int]
) -> None:
    assert turn_order(waiting, credit) == order


@pytest.mark.parametrize(
    ("scopes", "expected_s"),
    [
        ([], 0.0),
        # A Telegram group: 20 per minute is one request every 3 s.
        ([RateScope("chat", 20, 60.0), RateScope("bot", 30, 1.0)], 3.0),
        # A private chat: the chat's 1 a second, not the bot's 30.
        ([RateScope("chat", 1, 1.0), RateScope("bot", 30, 1.0)], 1.0),
        # Only the bot's budget (a pin or a delete).
        ([RateScope("bot", 30, 1.0)], 1 / 30),
    ],
)
def test_pace_is_the_slowest_scopes_sustained_rate(
    scopes: list[RateScope], expected_s: float
) -> None:
    assert pace_s(scopes) == pytest.approx(expected_s)


BOT = RateScope("bot", max_calls=1, period_s=0.05)
# A Telegram group's catch-up: a minute of its 20 a minute.
GROUP = catch_up((RateScope("chat", max_calls=20, period_s=60.0),))


async def lane(
    queue: AdmissionQueue,
    who: str,
    requests: int,
    order: list[str],
    closing: asyncio.Event,
    bot: RateScope = BOT,
) -> None:
    """A chat's lane: one request at a time, asking again as soon as one is done."""
    for _ in range(requests):
        admission = await queue.admit(
            who, (bot, RateScope(f"chat:{who}", 100, 1.0)), closing, GROUP
        )
        assert admission is not None
        order.append(who)
        admission.complete()


def leads(order: Sequence[str], chats: Sequence[str]) -> list[int]:
    """After each admission: the most requests any chat got minus the fewest."""
    counts = dict.fromkeys(chats, 0)
    out = []
    for who in order:
        counts[who] += 1
        out.append(max(counts.values()) - min(counts.values()))
    return out


async def test_chats_sharing_the_bot_take_turns() -> None:
    queue = AdmissionQueue(RateLimiter(time.monotonic), time.monotonic)
    closing = asyncio.Event()
    order: list[str] = []
    chats = ["a", "b", "c", "d"]
    await asyncio.gather(*(lane(queue, who, 6, order, closing) for who in chats))
    await queue.close()
    assert sorted(order) == sorted(chats * 6)
    # Round-robin: no chat is ever two requests ahead of another.
    assert max(leads(order, chats)) <= 1, order


async def test_a_chat_that_joins_late_catches_up_before_the_others_go_on() -> None:
    queue = AdmissionQueue(RateLimiter(time.monotonic), time.monotonic)
    closing = asyncio.Event()
    order: list[str] = []
    early = [asyncio.create_task(lane(queue, who, 12, order, closing)) for who in "ab"]
    await eventually(lambda: len(order) >= 8, what="the first chats to get ahead")
    joined_at = len(order)
    late = asyncio.create_task(lane(queue, "c", 12, order, closing))
    await asyncio.gather(*early, late)
    await queue.close()
    ahead = min(order[:joined_at].count("a"), order[:joined_at].count("b"))
    assert ahead >= 3, order
    # Once it waits, the late chat gets every turn until it has as many as the others
    # (the first of its requests may race one turn of a chat already waiting).
    after = order[joined_at:]
    first_c = after.index("c")
    assert first_c <= 2, order
    assert after[first_c : first_c + ahead - 1] == ["c"] * (ahead - 1), order


async def test_a_chat_whose_own_window_is_full_does_not_hold_up_the_others() -> None:
    limiter = RateLimiter(time.monotonic)
    queue = AdmissionQueue(limiter, time.monotonic)
    closing = asyncio.Event()
    full = RateScope("chat:full", max_calls=1, period_s=3600.0)
    shared = RateScope("bot", max_calls=100, period_s=1.0)
    first = await queue.admit("full", (full, shared), closing, GROUP)
    assert first is not None
    first.complete()
    blocked = asyncio.create_task(queue.admit("full", (full, shared), closing, GROUP))
    await asyncio.sleep(0.05)
    assert queue.waiting == 1 and not blocked.done()
    other = await asyncio.wait_for(
        queue.admit("other", (RateScope("chat:other", 1, 1.0), shared), closing, GROUP), 30
    )
    assert other is not None, "the waiter ahead of it has no room: it must not block"
    other.complete()
    closing.set()
    assert await asyncio.wait_for(blocked, 30) is None, "closing ends the wait empty-handed"
    await queue.close()


async def test_a_chat_quiet_for_a_while_starts_afresh_where_the_turns_are() -> None:
    now = [1000.0]
    queue = AdmissionQueue(RateLimiter(lambda: now[0]), lambda: now[0])
    closing = asyncio.Event()

    async def let_through(who: str, times: int) -> None:
        for _ in range(times):
            admission = await queue.admit(
                who, (RateScope(f"chat:{who}", 10**6, 1.0),), closing, GROUP
            )
            assert admission is not None
            admission.complete()
            now[0] += 0.1

    await let_through("quiet", 4)
    assert queue.credit("quiet", GROUP) == 4
    assert queue.credit("never seen", GROUP) == 0, "nobody served far yet: a newcomer starts at 0"
    await let_through("busy", GROUP + 50)
    assert queue.credit("never seen", GROUP) == 49, "a newcomer starts a minute of a group behind"
    assert queue.credit("quiet", GROUP) == 4, "a pause shorter than the horizon keeps the count"
    now[0] += HORIZON_S + 1
    assert queue.credit("quiet", GROUP) == 49, "quiet past the horizon: no old low count to hold"
    assert queue.credit("busy", GROUP) == 49, "the busy one too, once nothing went through"
    await queue.close()


async def _share_the_bot(
    queue: AdmissionQueue, now: list[float], chats: list[str], early: int
) -> tuple[bool, int]:
    """What the dispatcher does, one request through every 1/12 s for 330 s: offer it to the
    chats in turn order, skipping a chat whose own window (20 per 60 s) is full. The first
    `early` chats have the bot alone for 2 s (the start-up skew). Returns whether the others
    caught up (no chat more than one ahead) and the largest lead after that."""
    sent: dict[str, list[float]] = {who: [] for who in chats}
    closing = asyncio.Event()
    roomy = (RateScope("roomy", 10**9, 1.0),)  # room is judged here, as the limiter would
    caught_up, worst = False, 0
    while now[0] < 330.0:
        busy = chats if now[0] >= 2.0 else chats[:early]
        credit: dict[Hashable, int] = {who: queue.credit(who, GROUP) for who in busy}
        for index in turn_order(busy, credit):
            who = busy[index]
            if sum(1 for at in sent[who] if at > now[0] - 60.0) < 20:
                admission = await queue.admit(
                    who, roomy, closing, GROUP
                )  # none queued: counted now
                assert admission is not None
                admission.complete()
                sent[who].append(now[0])
                break
        now[0] += 1 / 12
        counts = [len(times) for times in sent.values()]
        lead = max(counts) - min(counts)
        caught_up = caught_up or (now[0] > 2.0 and lead <= 1)
        if caught_up:
            worst = max(worst, lead)
    return caught_up, worst


async def test_a_late_chat_catches_up_for_good() -> None:
    """Three of 40 groups have the bot to themselves for 2 s and take 8 requests each; then
    all 40 wait, for five and a half minutes, the bot letting through 12 a second (3 a
    minute less than the groups' own limits together, as 30 a second over 100 groups).
    The others catch up, and from then on no chat is more than one request ahead of another.

    The two rules this queue had before fail here: ordering by the count of the last minute
    let the early lead come back every minute (8 ahead again at 62 s), and ordering by a
    credit halving every minute stopped the catching up two requests short, for good.
    """
    now = [0.0]
    queue = AdmissionQueue(RateLimiter(lambda: now[0]), lambda: now[0])
    chats = [f"g{index:02d}" for index in range(40)]
    caught_up, worst = await _share_the_bot(queue, now, chats, early=3)
    assert caught_up, "the late chats never drew level"
    assert worst <= 1
    await queue.close()


class _BusyClock:
    """A clock that moves 1 ms each time it is read: the dispatcher's round through the
    waiters takes time, as on a busy machine, and the bot's window frees room meanwhile."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


@pytest.mark.parametrize(
    ("chats", "requests", "bot"),
    [(10, 30, RateScope("bot", 3, 0.05)), (20, 20, RateScope("bot", 5, 0.1))],
)
async def test_room_that_frees_during_a_round_goes_to_the_first_in_turn(
    chats: int, requests: int, bot: RateScope
) -> None:
    """Room that frees while the dispatcher goes through the waiters waits for its next
    round. Given to the next waiter asked, it went past the waiters refused a moment before:
    some chats got turn after turn while others waited (16 to 20 requests apart here), and
    in the 3,000-resident creation a chat got a second turn within a round now and then."""
    clock = _BusyClock()
    queue = AdmissionQueue(RateLimiter(clock), clock)
    closing = asyncio.Event()
    order: list[str] = []
    names = [f"c{index:02d}" for index in range(chats)]

    await asyncio.gather(*(lane(queue, who, requests, order, closing, bot) for who in names))
    await queue.close()
    assert sorted(order) == sorted(names * requests)
    # The first chats have the bot alone for a moment (they start first); once everyone
    # waits, no chat is ever two requests ahead of another.
    after_start = leads(order, names)[len(order) // 5 :]
    assert max(after_start) <= 1, order


class StartStamped(ScriptedChannel):
    """Records when each request starts (the pace is about starts), not when it ends."""

    def __init__(self, per_chat: RateScope) -> None:
        super().__init__(per_chat=per_chat)
        self.starts: list[float] = []

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        self.starts.append(time.monotonic())
        await super().edit(chat, message_id, message)


async def test_a_paced_route_spreads_a_stream_of_changes_at_the_chats_rate(
    tmp_path: Path,
) -> None:
    store = SqliteStore.in_dir(tmp_path)
    window = RateScope("unused", max_calls=5, period_s=0.5)  # a pace of one per 0.1 s
    channel = StartStamped(per_chat=window)
    scheduler = RouteScheduler({"fake": channel}, store)
    key = RouteKey("fake", ChatRef("-100"), "#board")
    scheduler.add_route(key, paced=True)
    await scheduler.start()
    for version in range(60):  # a change every 10 ms: the window alone would burst 5 at once
        scheduler.submit(key, Outgoing.build(f"board v{version}", {}))
        await asyncio.sleep(0.01)
    await settle(scheduler)
    await scheduler.stop()
    store.close()
    assert channel.messages == {"1": "board v59"}, "the latest change lands"
    assert len(channel.starts) >= 2
    gaps = [b - a for a, b in zip(channel.starts, channel.starts[1:], strict=False)]
    assert min(gaps) >= pace_s([window]) * 0.99, gaps


def test_the_catch_up_is_a_minute_of_the_chats_own_limit_as_its_channel_declares_it() -> None:
    """The catch-up was a constant 20, Telegram's group figure, in a module every channel
    uses: a Feishu chat (5 a second) that started afresh began only 20 behind, and a
    configured Telegram group limit changed nothing."""
    cursors = MemoryCursorStore()
    telegram = TelegramChannel(
        TelegramConfig(api_base_url="http://127.0.0.1:9", commands=False), "1:x", cursors
    )
    assert catch_up(telegram.rate_scopes(ChatRef("-100555"), "send", None)) == 20
    assert catch_up(telegram.rate_scopes(ChatRef("777"), "edit", "5")) == 60  # 1 a second
    slower = TelegramLimits(group_chat=RateLimit(max_calls=10, period_s=60.0))
    tuned = TelegramChannel(
        TelegramConfig(api_base_url="http://127.0.0.1:9", commands=False, limits=slower),
        "1:x",
        cursors,
    )
    assert catch_up(tuned.rate_scopes(ChatRef("-100555"), "send", None)) == 10
    feishu = FeishuChannel(
        FeishuConfig(domain="http://127.0.0.1:9", events="none"), "cli_x", "secret", cursors
    )
    assert catch_up(feishu.rate_scopes(ChatRef("oc_1"), "send", None)) == 300
    assert catch_up(()) == 0, "a chat without limits of its own"


async def test_a_chat_starts_afresh_its_own_catch_up_behind_the_turns() -> None:
    now = [1000.0]
    queue = AdmissionQueue(RateLimiter(lambda: now[0]), lambda: now[0])
    closing = asyncio.Event()
    roomy = (RateScope("roomy", 10**9, 1.0),)
    for _ in range(400):
        admission = await queue.admit("busy", roomy, closing, GROUP)
        assert admission is not None
        admission.complete()
    assert queue.credit("telegram group", GROUP) == 379  # where the turns are, less 20
    assert queue.credit("feishu chat", 300) == 99
    await queue.close()
