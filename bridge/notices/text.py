"""People-facing notices built from the typed fields of a producer notification.

A notification's `header` and `body` are written for the agent and may quote renderer output,
paths or provider errors; none of that may reach a chat. So the text here is assembled only
from fields with a closed vocabulary: the source, `extra.state`, the stable `extra.code`,
`extra.max_refreshes` and the watch id (`ref_id`, a short producer-assigned name).
Reminders and unknown sources stay agent-side (`None`).

`NoticeGate` caps how many notices one route shows per minute and folds the rest into one
summary, so a flood of errors cannot bury a chat.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from taskcard.channels.base import counted
from taskcard.producers.ledger.contract import (
    FAILURE_KIND_NAMES,
    OUTCOMES,
    SOURCE_BLOCKED,
    SOURCE_COMPLETED,
    safe_id,
)
from taskcard.producers.task_card.contract import (
    SOURCE_ERROR,
    SOURCE_LIMIT,
    Notification,
    count_field,
)

# The producer's ceiling for the `max_refreshes` setting; a notice naming a budget outside
# 1..this came from a hand-written line, and says "refresh budget used up" without a number.
MAX_REFRESHES: Final = 1_000_000

# Plain descriptions of the producer's stable error codes.
ERROR_DESCRIPTIONS: Final[dict[str, str]] = {
    "renderer_timeout": "the renderer took longer than its time limit",
    "renderer_nonzero_exit": "the renderer exited with an error",
    "renderer_failed": "the renderer could not be run or printed no usable card",
    "body_too_large": "the renderer's card was too large to publish",
    "write_failed": "the card could not be written to disk",
    "watch_crash": "the card's refresh loop crashed",
    "renderer_blank_output": "the renderer printed an empty card",
    "renderer_invalid_utf8": "the renderer printed text that is not valid UTF-8",
}
_GENERIC_ERROR: Final = "the card could not be refreshed"

# Watch ids are producer-assigned (`tc_1`); anything else is left out rather than echoed.
_SAFE_WATCH_ID: Final = re.compile(r"[A-Za-z0-9_.-]{1,32}")


def safe_error_code(code: object) -> str:
    """A producer error code fit for a chat: one of the known codes, else `unknown`.

    Any program may write the notification file, so a free-form code could carry a path or
    a secret into a chat; only the closed vocabulary passes.
    """
    return code if isinstance(code, str) and code in ERROR_DESCRIPTIONS else "unknown"


def _watch_id(notification: Notification) -> str | None:
    """The watch a task card notification is about, when it is fit to show."""
    extra_id = notification.extra.get("watch_id")
    watch_id = notification.ref_id or (extra_id if isinstance(extra_id, str) else "")
    return watch_id if _SAFE_WATCH_ID.fullmatch(watch_id) else None


def _watch_suffix(notification: Notification) -> str:
    watch_id = _watch_id(notification)
    return f" (watch {watch_id})" if watch_id else ""


def notice_text(agent_id: str, notification: Notification) -> str | None:
    """The short message for people about `notification`, or None when it stays agent-side."""
    if notification.source in (SOURCE_BLOCKED, SOURCE_COMPLETED):
        return _ledger_notice(agent_id, notification)
    state = notification.extra.get("state")
    suffix = _watch_suffix(notification)
    if notification.source == SOURCE_ERROR and state == "error":
        code = notification.extra.get("code")
        description = (
            ERROR_DESCRIPTIONS.get(code, _GENERIC_ERROR)
            if isinstance(code, str)
            else (_GENERIC_ERROR)
        )
        shown_code = f" [{code}]" if isinstance(code, str) and code in ERROR_DESCRIPTIONS else ""
        return (
            f"⚠️ {agent_id}: task card error{suffix}: {description}{shown_code}."
            " The last good card stays shown."
        )
    if notification.source == SOURCE_ERROR and state == "recovered":
        replaced_by = notification.extra.get("replaced_by")
        failed = _watch_id(notification)
        if isinstance(replaced_by, str) and _SAFE_WATCH_ID.fullmatch(replaced_by) and failed:
            # The failed watch ended and a new one publishes: the card is back, not that watch.
            return (
                f"✅ {agent_id}: task card publishes again: watch {replaced_by} replaced"
                f" watch {failed}, which had failed."
            )
        # Not "refreshing again": a retry of a stopped watch publishes once and stays stopped.
        return f"✅ {agent_id}: task card recovered{suffix}: its renderer works again."
    if notification.source == SOURCE_LIMIT or (
        notification.source == SOURCE_ERROR and state == "limit"
    ):
        limit = count_field(notification.extra.get("max_refreshes"))
        budget = (
            f" after {counted(limit, 'refresh', 'refreshes')}"
            if limit is not None and 1 <= limit <= MAX_REFRESHES
            else ""
        )
        return f"⏹ {agent_id}: task card stopped{suffix}: refresh budget used up{budget}."
    return None


# The block notice's last line: the decision it asks for is given by replying to it, which
# queues the reply in the agent's inbox (as a reply to its card does; README, "Talking to an
# agent"), on every platform.
REPLY_REACHES_AGENT: Final = "Reply to this message to answer: your reply reaches the agent."


def _ledger_notice(agent_id: str, notification: Notification) -> str:
    """A ledger block or completion, from the task id, failure kind and outcome only."""
    extra = notification.extra
    task_id = safe_id(extra.get("task_id"))
    task = f" task {task_id}" if task_id else " a task"
    if notification.source == SOURCE_BLOCKED:
        kind = extra.get("kind")
        shown = kind if isinstance(kind, str) and kind in FAILURE_KIND_NAMES else "unknown"
        step = safe_id(extra.get("step"))
        where = f" at step {step}" if step else ""
        return (
            f"⛔ {agent_id}:{task} is blocked{where} ({shown}); it needs a person to decide.\n"
            f"{REPLY_REACHES_AGENT}"
        )
    outcome = extra.get("outcome")
    shown = outcome if isinstance(outcome, str) and outcome in OUTCOMES else "unknown"
    # Retired only when the producer says so: another task of the ledger may still be open,
    # and supervision run from cron has no card to stop.
    retired = "; its card is retired" if extra.get("card_retired") is True else ""
    return f"🏁 {agent_id}:{task} completed (outcome {shown}){retired}."


NoticeKind = Literal["error", "recovery", "stop", "signal"]
_KIND_WORDS: Final[dict[NoticeKind, tuple[str, str]]] = {
    "error": ("error", "errors"),
    "recovery": ("recovery", "recoveries"),
    "stop": ("stop", "stops"),
    "signal": ("signal", "signals"),
}


def notice_kind(notification: Notification) -> NoticeKind | None:
    """What a people-facing notice is about, for the folded summary; None when agent-side."""
    state = notification.extra.get("state")
    if notification.source == SOURCE_ERROR and state == "error":
        return "error"
    if notification.source == SOURCE_ERROR and state == "recovered":
        return "recovery"
    if notification.source == SOURCE_LIMIT or (
        notification.source == SOURCE_ERROR and state == "limit"
    ):
        return "stop"
    return None


def summary_text(agent_id: str, counts: Mapping[str, int]) -> str:
    """The one notice that stands for folded ones: "12 more from builder: 9 errors, 3 ..."."""
    parts = []
    for kind, (one, many) in _KIND_WORDS.items():
        count = counts.get(kind, 0)
        if count > 0:
            parts.append(counted(count, one, many))
    total = sum(count for count in counts.values() if count > 0)
    return (
        f"📦 {total} more from {agent_id}: {', '.join(parts)}"
        " (folded into one message to keep this chat readable)."
    )


@dataclass
class FoldedNotices:
    """Notices of one route held back by the cap, waiting for their summary."""

    counts: dict[str, int] = field(default_factory=dict)
    first_s: float = 0.0
    last_s: float = 0.0

    @property
    def summary_id(self) -> str:
        """Stable for one fold episode, so a summary recorded before a crash is not doubled."""
        return f"fold:{self.first_s:.6f}"

    def to_json(self) -> str:
        return json.dumps({"counts": self.counts, "first_s": self.first_s, "last_s": self.last_s})

    @staticmethod
    def from_json(saved: str | None) -> FoldedNotices | None:
        """The saved episode, or None when there is none or it cannot be read."""
        try:
            data = json.loads(saved) if saved else None
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("counts"), dict):
            return None
        counts = {
            str(kind): count
            for kind, count in data["counts"].items()
            if (count_field(count) or 0) > 0
        }
        first_s, last_s = data.get("first_s"), data.get("last_s")
        numbers = isinstance(first_s, int | float) and isinstance(last_s, int | float)
        if not counts or not numbers:
            return None
        return FoldedNotices(counts, float(first_s), float(last_s))  # type: ignore[arg-type]


@dataclass
class _RouteWindow:
    sent_s: deque[float] = field(default_factory=deque)
    folded: FoldedNotices | None = None
    last_summary_s: float | None = None


class NoticeGate:
    """At most `max_per_minute` notices per route in any minute; the excess is folded.

    A broken renderer can produce hundreds of distinct errors in a minute, and a chat that
    receives them one by one is unreadable (and spends the group's send budget that the cards
    need). So each route admits `max_per_minute` notices in any sliding minute; the rest are
    counted per kind into one episode, and one summary stands for them. The summary goes out
    once the episode has been quiet for `settle_s` (so a burst gets one summary, not several)
    or has lasted a minute, and at most one summary per route per minute: a route shows at
    most `max_per_minute` notices plus one summary in any minute. While an episode is open,
    new notices join it, so the summary precedes anything admitted after it. Pure: time comes
    in as arguments; the caller records what was folded.
    """

    WINDOW_S: Final = 60.0

    def __init__(self, max_per_minute: int, settle_s: float = 5.0) -> None:
        self._max = max_per_minute
        self._settle_s = settle_s
        self._routes: dict[str, _RouteWindow] = {}
        self._open: set[str] = set()  # routes with a folded episode: all `due` looks at

    def _route(self, route: str) -> _RouteWindow:
        return self._routes.setdefault(route, _RouteWindow())

    def allows(self, route: str, now_s: float) -> bool:
        """Whether a notice may be sent now; False means it is to be folded."""
        window = self._route(route)
        while window.sent_s and now_s - window.sent_s[0] >= self.WINDOW_S:
            window.sent_s.popleft()
        return window.folded is None and len(window.sent_s) < self._max

    def record(self, route: str, now_s: float) -> None:
        """Count a notice that is being sent (after `allows` said yes)."""
        self._route(route).sent_s.append(now_s)

    def fold(self, route: str, kind: str, now_s: float) -> FoldedNotices:
        """Count one folded notice of `kind`; returns the open episode (to persist it)."""
        window = self._route(route)
        if window.folded is None:
            window.folded = FoldedNotices(first_s=now_s, last_s=now_s)
        folded = window.folded
        folded.counts[kind] = folded.counts.get(kind, 0) + 1
        folded.last_s = now_s
        self._open.add(route)
        return folded

    def restore(self, route: str, folded: FoldedNotices) -> None:
        """Reopen an episode saved before a restart; its summary is still owed."""
        self._route(route).folded = folded
        self._open.add(route)

    def forget(self, route: str) -> None:
        """Forget a route that is gone for good (its agent left the fleet long ago)."""
        self._routes.pop(route, None)
        self._open.discard(route)

    def due(self, now_s: float) -> list[tuple[str, FoldedNotices]]:
        """The episodes whose summary is to be sent now; they are closed."""
        ready: list[tuple[str, FoldedNotices]] = []
        for route in sorted(self._open):  # called every second: never a walk over all routes
            window = self._routes[route]
            folded = window.folded
            if folded is None:
                self._open.discard(route)
                continue
            settled = now_s - folded.last_s >= self._settle_s
            if not settled and now_s - folded.first_s < self.WINDOW_S:
                continue
            if window.last_summary_s is not None and (
                now_s - window.last_summary_s < self.WINDOW_S
            ):
                continue
            window.folded = None
            self._open.discard(route)
            window.last_summary_s = now_s
            ready.append((route, folded))
        return ready
