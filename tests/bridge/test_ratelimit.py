"""The rate limiter alone, on a fake clock: sliding windows, completion-time counting, pauses
and seeding. The e2e pause tests show the same promises through a platform; these show each
rule by itself, to the millisecond, without waiting."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from taskcard.bridge.schedule.ratelimit import RateLimiter, bounded_pause_s
from taskcard.channels.base import RateScope

CHAT = RateScope("chat:1", max_calls=3, period_s=60.0)
BOT = RateScope("bot", max_calls=30, period_s=1.0)


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def limiter(clock: FakeClock) -> RateLimiter:
    return RateLimiter(clock, max_pause_s=3600.0)


def spend(limiter: RateLimiter, *scopes: RateScope) -> None:
    """One request that starts now and completes at once."""
    assert limiter.wait_s(scopes) == 0.0
    limiter.reserve(scopes).complete()


def test_a_window_admits_max_calls_then_waits_for_the_oldest_to_leave(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    spend(limiter, CHAT)
    clock.advance(10)
    spend(limiter, CHAT)
    clock.advance(10)
    spend(limiter, CHAT)
    # Three in the last 60 s: the fourth may go when the first (at 1000) leaves, at 1060.
    assert limiter.wait_s([CHAT]) == pytest.approx(40.0)
    clock.advance(39.999)
    assert limiter.wait_s([CHAT]) == pytest.approx(0.001)
    clock.advance(0.001)
    assert limiter.wait_s([CHAT]) == 0.0


def test_the_window_slides_rather_than_resets(limiter: RateLimiter, clock: FakeClock) -> None:
    """No burst at a window edge: in any 60 s there are never more than three."""
    starts: list[float] = []
    for _ in range(9):
        wait = limiter.wait_s([CHAT])
        clock.advance(wait)
        starts.append(clock.now)
        limiter.reserve([CHAT]).complete()
    for index in range(len(starts) - 3):
        assert starts[index + 3] - starts[index] >= 60.0


def test_a_request_counts_from_its_completion(limiter: RateLimiter, clock: FakeClock) -> None:
    """A request slow in flight is stamped when it ends: the platform saw it then."""
    slow = limiter.reserve([CHAT])
    spend(limiter, CHAT)
    spend(limiter, CHAT)
    clock.advance(30)
    slow.complete()  # finished at 1030, not 1000
    clock.advance(30)  # 1060: the two quick ones left the window, the slow one did not
    assert limiter.wait_s([CHAT]) == 0.0
    spend(limiter, CHAT)
    spend(limiter, CHAT)
    assert limiter.wait_s([CHAT]) == pytest.approx(30.0)  # until the slow one leaves at 1090


def test_every_scope_of_a_request_must_have_room(limiter: RateLimiter, clock: FakeClock) -> None:
    narrow = RateScope("chat:2", max_calls=1, period_s=5.0)
    spend(limiter, narrow, BOT)
    assert limiter.wait_s([narrow, BOT]) == pytest.approx(5.0)
    assert limiter.wait_s([BOT]) == 0.0  # the wide scope alone still has room


def test_a_changed_limit_keeps_the_requests_already_made(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    spend(limiter, CHAT)
    spend(limiter, CHAT)
    tighter = RateScope(CHAT.key, max_calls=2, period_s=60.0)
    assert limiter.wait_s([tighter]) == pytest.approx(60.0)


@pytest.mark.parametrize(
    ("asked", "applied"),
    [(5.0, 5.0), (0.0, 0.0), (-3.0, 0.0), (math.nan, 0.0), (1e12, 3600.0), (math.inf, 3600.0)],
)
def test_a_pause_is_bounded(asked: float, applied: float) -> None:
    assert bounded_pause_s(asked, 3600.0) == applied


def test_a_pause_holds_its_scope_only(limiter: RateLimiter, clock: FakeClock) -> None:
    assert limiter.pause(CHAT.key, 12.0) == 12.0
    assert limiter.wait_s([CHAT]) == pytest.approx(12.0)
    assert limiter.wait_s([CHAT, BOT]) == pytest.approx(12.0)
    assert limiter.wait_s([BOT]) == 0.0
    clock.advance(12)
    assert limiter.paused_for(CHAT.key) == 0.0
    assert limiter.wait_s([CHAT]) == 0.0


def test_a_shorter_pause_never_cuts_a_longer_one(limiter: RateLimiter, clock: FakeClock) -> None:
    limiter.pause(CHAT.key, 100.0)
    limiter.pause(CHAT.key, 5.0)
    assert limiter.paused_for(CHAT.key) == pytest.approx(100.0)


async def test_paused_s_is_the_longest_pause_left_over_the_scopes_asked(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    assert await limiter.paused_s([CHAT.key, BOT.key]) == 0.0
    limiter.pause(CHAT.key, 10.0)
    limiter.pause(BOT.key, 4.0)
    assert await limiter.paused_s([BOT.key]) == pytest.approx(4.0)
    assert await limiter.paused_s([BOT.key, CHAT.key]) == pytest.approx(10.0)
    assert await limiter.paused_s([]) == 0.0
    clock.advance(10)
    assert await limiter.paused_s([BOT.key, CHAT.key]) == 0.0


def test_a_huge_pause_is_capped_and_reports_what_was_applied(clock: FakeClock) -> None:
    limiter = RateLimiter(clock, max_pause_s=60.0)
    assert limiter.pause("bot", 86_400.0 * 365) == 60.0
    assert limiter.paused_for("bot") == pytest.approx(60.0)


def test_seeding_counts_a_request_from_before_a_restart(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    one = RateScope("chat:3", max_calls=1, period_s=60.0)
    limiter.seed([one], clock.now - 45)  # the last accepted edit, 45 s ago
    assert limiter.wait_s([one]) == pytest.approx(15.0)
    clock.advance(15)
    assert limiter.wait_s([one]) == 0.0


def test_the_windows_kept_for_a_restart_are_read_from_the_busy_scopes_only(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    """`recent` runs each second while requests go out (the windows are stored for a restart):
    it reads the scopes that took a request within their window, not every chat ever served
    (their number grows with the fleet; the work must grow with the traffic)."""
    for index in range(2000):
        limiter.reserve((RateScope(f"chat:{index}", 20, 60.0),)).complete()
    clock.now += 61.0
    busy = RateScope("chat:busy", 20, 60.0)
    limiter.reserve((busy,)).complete()
    assert limiter.recent() == {busy: [clock.now]}
    # The quiet chats' windows are no longer read; one that takes a request again is.
    assert limiter._active == {"chat:busy"}  # what `recent` reads
    limiter.reserve((RateScope("chat:7", 20, 60.0),)).complete()
    assert set(limiter.recent()) == {busy, RateScope("chat:7", 20, 60.0)}
