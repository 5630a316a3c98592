"""Sliding-window rate limits and 429 pauses, keyed by the channel's rate scopes.

Why not a leaky bucket (aiolimiter)? A bucket of 20 per minute lets 20 requests through at once
and then one every 3 s, which is up to 39 requests in some 60-second window: exactly what a
platform that counts "20 per minute" per window punishes. Here a scope admits a request only
while fewer than `max_calls` requests happened in the last `period_s`, and a finished request is
recorded at its *completion* time, so even a request delayed in flight cannot make the platform
observe more than `max_calls` in any window it measures.

A 429 pause is bounded by `max_pause_s` (one hour unless configured): the platform's hint is
untrusted input, and a chat paused until 2058 is a chat lost, while an hour's wait that turns
out short costs one more 429.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from taskcard.channels.base import RateScope

DEFAULT_MAX_PAUSE_S = 3600.0


def bounded_pause_s(seconds: float, max_pause_s: float) -> float:
    """The pause actually applied for a requested one: within [0, max_pause_s]; NaN is 0."""
    if math.isnan(seconds) or seconds <= 0:
        return 0.0
    return min(seconds, max_pause_s)


@dataclass
class _Slot:
    at: float


@dataclass
class _Window:
    max_calls: int
    period_s: float
    slots: deque[_Slot] = field(default_factory=deque)

    def wait_s(self, now: float) -> float:
        # Slots are appended in time order, and completion only moves a slot later: expired
        # ones leave from the left, in O(1) each, instead of a scan of the whole window on
        # every check. A slot re-stamped past its successors holds them back until it expires
        # itself, so the count may include a few that already expired: it only ever
        # over-counts, and a full-looking window is then judged exactly below.
        slots, horizon = self.slots, now - self.period_s
        while slots and slots[0].at <= horizon:
            slots.popleft()
        if len(slots) < self.max_calls:
            return 0.0
        ordered = sorted(slot.at for slot in slots)
        # The request may start once enough slots have left the window.
        release_at = ordered[len(ordered) - self.max_calls] + self.period_s
        return max(0.0, release_at - now)


class Admission(ABC):
    """What a request holds while in flight; `complete()` once it has ended, whatever the
    outcome, so the request counts at its completion time."""

    @abstractmethod
    def complete(self) -> None: ...


class Limiter(ABC):
    """The seam the scheduler admits requests through: in memory for one instance
    (`RateLimiter`), or shared by several instances (the cluster's Redis limiter)."""

    max_pause_s: float

    @abstractmethod
    async def acquire(
        self, scopes: tuple[RateScope, ...], *, as_of: float | None = None
    ) -> Admission | float:
        """Check every scope and, when all have room, take a slot in each in one step (an
        `Admission`); otherwise the seconds to wait before asking again.

        `as_of`: judge room as it was at that earlier time of the limiter's clock (slots are
        still stamped now). A dispatcher offering room to many waiters in turn passes the
        time its round began, so room that frees while it goes through them is not taken
        by whoever happens to be asked next, ahead of those refused a moment earlier. Both
        limiters, in memory and shared, honour it."""

    @abstractmethod
    def pause(self, scope: str, seconds: float) -> float:
        """Pause `scope` (bounded by `max_pause_s`); returns the seconds applied."""

    @abstractmethod
    async def paused_s(self, scopes: Iterable[str]) -> float:
        """Seconds left of the longest pause running over any of `scopes` (0: none), whoever
        drew it (shared: any instance). The scheduler asks before a request that does not
        spend these scopes but must wait for their pause (a pin in a paused chat)."""

    @abstractmethod
    def seed(self, scopes: Iterable[RateScope], at: float) -> None:
        """Record a request finished at `at` (monotonic clock), e.g. from before a restart."""

    def recent(self) -> dict[RateScope, list[float]] | None:
        """Each window's requests still inside it (their times on the limiter's clock), for
        the next run to `seed`; None when the windows outlive this process anyway (shared)."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional: only shared limiters have work
        """Finish background work (nothing by default)."""


@dataclass
class Reservation(Admission):
    """The slots one request holds in its scopes; `complete()` re-stamps them at its end."""

    slots: tuple[_Slot, ...]
    clock: Callable[[], float]

    def complete(self) -> None:
        now = self.clock()
        for slot in self.slots:
            slot.at = max(slot.at, now)


class RateLimiter(Limiter):
    """All scopes of one scheduler: windows plus pauses ordered by 429 answers."""

    def __init__(
        self, clock: Callable[[], float], *, max_pause_s: float = DEFAULT_MAX_PAUSE_S
    ) -> None:
        self._clock = clock
        self.max_pause_s = max_pause_s
        self._windows: dict[str, _Window] = {}
        self._paused_until: dict[str, float] = {}
        # The scopes that took a request since `recent` last found them empty: `recent` reads
        # these, not every window ever used (a fleet's thousands of quiet chats).
        self._active: set[str] = set()

    def pause(self, scope: str, seconds: float) -> float:
        """Pause `scope` for `seconds`, bounded by `max_pause_s`; returns the seconds applied."""
        applied = bounded_pause_s(seconds, self.max_pause_s)
        until = self._clock() + applied
        # A longer pause already running is kept, but never beyond the cap from now.
        current = min(self._paused_until.get(scope, 0.0), self._clock() + self.max_pause_s)
        self._paused_until[scope] = max(current, until)
        return applied

    def paused_for(self, scope: str) -> float:
        return max(0.0, self._paused_until.get(scope, 0.0) - self._clock())

    async def paused_s(self, scopes: Iterable[str]) -> float:
        return max((self.paused_for(scope) for scope in scopes), default=0.0)

    def wait_s(self, scopes: Iterable[RateScope], now: float | None = None) -> float:
        """How long after `now` (default: the clock) a request in all of `scopes` may start
        (0: at once)."""
        if now is None:
            now = self._clock()
        wait = 0.0
        for scope in scopes:
            wait = max(wait, self._paused_until.get(scope.key, 0.0) - now)
            window = self._window(scope)
            wait = max(wait, window.wait_s(now))
        return wait

    def seed(self, scopes: Iterable[RateScope], at: float) -> None:
        """Record a request finished at `at` (on this clock), e.g. one from before a restart."""
        for scope in scopes:
            window = self._window(scope)
            self._active.add(scope.key)
            # In time order, as `_Window.wait_s` expects of its slots.
            position = len(window.slots)
            while position and window.slots[position - 1].at > at:
                position -= 1
            window.slots.insert(position, _Slot(at))

    def recent(self) -> dict[RateScope, list[float]]:
        now = self._clock()
        kept: dict[RateScope, list[float]] = {}
        for key in list(self._active):
            window = self._windows[key]
            inside = [slot.at for slot in window.slots if slot.at > now - window.period_s]
            if inside:
                kept[RateScope(key, window.max_calls, window.period_s)] = sorted(inside)
            else:
                self._active.discard(key)
        return kept

    async def acquire(
        self, scopes: tuple[RateScope, ...], *, as_of: float | None = None
    ) -> Admission | float:
        # `wait_s`, then `reserve`, with each scope's window found once for both (every
        # request comes here, and finding a window twice cost a fifth of the limiter's work).
        judged = self._clock() if as_of is None else as_of
        paused = self._paused_until
        windows = []
        wait_s = 0.0
        for scope in scopes:
            window = self._window(scope)
            wait_s = max(wait_s, paused.get(scope.key, 0.0) - judged, window.wait_s(judged))
            windows.append(window)
        if wait_s <= 0:
            return self._reserve_in(scopes, windows)
        if as_of is None:
            return wait_s
        # Refused as of then; the wait counts from now (0: ask again in the next round).
        return max(0.0, wait_s - (self._clock() - as_of))

    def reserve(self, scopes: Iterable[RateScope]) -> Reservation:
        """Take a slot in every scope; call only when `wait_s` returned 0."""
        scopes = tuple(scopes)
        return self._reserve_in(scopes, [self._window(scope) for scope in scopes])

    def _reserve_in(self, scopes: tuple[RateScope, ...], windows: list[_Window]) -> Reservation:
        """`reserve`, with the scopes' windows (in the same order) already found."""
        now = self._clock()
        active = self._active
        slots = []
        for scope, window in zip(scopes, windows, strict=True):
            slot = _Slot(now)
            window.slots.append(slot)
            active.add(scope.key)
            slots.append(slot)
        return Reservation(tuple(slots), self._clock)

    def _window(self, scope: RateScope) -> _Window:
        window = self._windows.get(scope.key)
        if window is not None and (
            window.max_calls == scope.max_calls and window.period_s == scope.period_s
        ):
            return window
        # New, or the scope's limits changed: a window of the new size keeps the requests
        # already counted.
        window = _Window(scope.max_calls, scope.period_s, window.slots if window else deque())
        self._windows[scope.key] = window
        return window
