"""The service's Prometheus metrics, in a registry of its own.

Two kinds of numbers, kept apart on purpose:

- events (requests by channel, operation and outcome; 429 answers; the time of the last
  successful delivery) are counted by `MeteredChannel`, a wrapper put around each channel once
  at the edge, so the scheduler's hot path carries no metrics code;
- levels (active pauses, queue depth per lane, notices by state, agents watched and faulted,
  channels ready) are read from a `ServiceSnapshot` callback when Prometheus scrapes, so they
  are exact at that moment and cost nothing in between.

Each `ServiceMetrics` owns a `CollectorRegistry` (never the process-global one), so tests and
several services in one process do not collide. Chat ids appear as labels; message content,
tokens and agent text never do.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from taskcard.channels.base import (
    BoardView,
    CardView,
    Channel,
    ChatRef,
    CommandSink,
    Operation,
    Outgoing,
    RateScope,
    ReplyTo,
)
from taskcard.channels.errors import (
    Forbidden,
    MessageGone,
    NotModified,
    OutcomeUnknown,
    Permanent,
    RateLimited,
    Transient,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class ServiceSnapshot:
    """The service's current levels, taken on the loop when someone asks."""

    running: bool
    channels: tuple[str, ...]
    ready_channels: tuple[str, ...]
    agents_watched: int
    agents_faulted: int
    active_pauses: int
    lane_depths: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (channel, chat)
    notices: Mapping[str, int] = field(default_factory=dict)  # state -> count
    # Why the state store could not be read now (pauses and notices then unknown), or None.
    store_error: str | None = None


SnapshotSource = Callable[[], ServiceSnapshot]


def outcome_of(error: BaseException | None) -> str:
    """The `outcome` label of one request: how the platform answered, in a few words."""
    if error is None:
        return "ok"
    for kind, label in (
        (NotModified, "not_modified"),
        (RateLimited, "rate_limited"),
        (MessageGone, "gone"),
        (Forbidden, "forbidden"),
        (OutcomeUnknown, "unknown"),
        (Transient, "transient"),
        (Permanent, "permanent"),
    ):
        if isinstance(error, kind):
            return label
    return "error"


class ServiceMetrics:
    """Counters fed by `MeteredChannel`, levels read from a bound `SnapshotSource`."""

    def __init__(self, *, wall: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._wall = wall
        self._source: SnapshotSource | None = None
        self.requests = Counter(
            "taskcard_requests",
            "Chat platform requests by channel, operation and outcome.",
            ("channel", "operation", "outcome"),
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "taskcard_rate_limited",
            "Requests the platform answered with a rate limit (HTTP 429 or its equivalent).",
            ("channel", "operation"),
            registry=self.registry,
        )
        self.last_delivery = Gauge(
            "taskcard_last_delivery_timestamp_seconds",
            "Unix time of the last message the platform accepted (sent, edited or unchanged).",
            ("channel",),
            registry=self.registry,
        )
        self.registry.register(_LevelCollector(self))
        self._counted: dict[tuple[str, str, str], Counter] = {}
        self._delivered: dict[str, Gauge] = {}

    def bind(self, source: SnapshotSource) -> None:
        """Read levels (and health) from `source` from now on."""
        self._source = source

    def snapshot(self) -> ServiceSnapshot | None:
        return None if self._source is None else self._source()

    def record(self, channel: str, operation: Operation, error: BaseException | None) -> None:
        outcome = outcome_of(error)
        # `labels()` checks and locks on every call; a request is counted on a kept child.
        counted = self._counted.get((channel, operation, outcome))
        if counted is None:
            counted = self._counted[(channel, operation, outcome)] = self.requests.labels(
                channel, operation, outcome
            )
        counted.inc()
        if outcome == "rate_limited":
            self.rate_limited.labels(channel, operation).inc()
        if operation in ("send", "edit") and outcome in ("ok", "not_modified"):
            delivered = self._delivered.get(channel)
            if delivered is None:
                delivered = self._delivered[channel] = self.last_delivery.labels(channel)
            delivered.set(self._wall())

    def exposition(self) -> bytes:
        """The text Prometheus scrapes."""
        return generate_latest(self.registry)

    def health(self) -> tuple[bool, dict[str, object]]:
        """Healthy when the service loop runs and at least one channel is ready; and why not."""
        snapshot = self.snapshot()
        if snapshot is None or not snapshot.running:
            return False, {"status": "unavailable", "reason": "the service loop is not running"}
        if snapshot.store_error is not None:
            reason = f"the state store cannot be read ({snapshot.store_error})"
            return False, {"status": "unavailable", "reason": reason}
        if not snapshot.ready_channels:
            waiting = ", ".join(snapshot.channels) or "none configured"
            return False, {"status": "unavailable", "reason": f"no channel ready ({waiting})"}
        return True, {"status": "ok", "ready_channels": list(snapshot.ready_channels)}


class _LevelCollector(Collector):
    def __init__(self, metrics: ServiceMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())  # levels are known only at scrape time

    def collect(self) -> Iterator[Metric]:
        snapshot = self._metrics.snapshot()
        if snapshot is None:
            return
        up = GaugeMetricFamily(
            "taskcard_channel_ready", "1 when the channel started and serves.", labels=["channel"]
        )
        for name in snapshot.channels:
            up.add_metric([name], 1.0 if name in snapshot.ready_channels else 0.0)
        yield up
        yield GaugeMetricFamily(
            "taskcard_agents_watched",
            "Agents watched: configured, discovered and added by a reload.",
            snapshot.agents_watched,
        )
        yield GaugeMetricFamily(
            "taskcard_agents_faulted",
            "Agents whose renderer is failing now (the card shows an error).",
            snapshot.agents_faulted,
        )
        depth = GaugeMetricFamily(
            "taskcard_queue_depth",
            "Work waiting in each chat lane: routes with an undelivered card plus queued texts.",
            labels=["channel", "chat"],
        )
        for (channel, chat), count in sorted(snapshot.lane_depths.items()):
            depth.add_metric([channel, chat], float(count))
        yield depth
        yield GaugeMetricFamily(
            "taskcard_state_store_readable",
            "1 when the state store answered this scrape; 0 leaves out the levels it holds.",
            0.0 if snapshot.store_error else 1.0,
        )
        if snapshot.store_error is not None:
            return  # pauses and notices unknown: no number rather than a wrong one
        yield GaugeMetricFamily(
            "taskcard_active_pauses",
            "Rate-limit pauses in force now (a scope the platform asked us to leave alone).",
            snapshot.active_pauses,
        )
        notices = GaugeMetricFamily(
            "taskcard_notices", "Notices in the state store by state.", labels=["state"]
        )
        for state, count in sorted(snapshot.notices.items()):
            notices.add_metric([state], float(count))
        yield notices


class MeteredChannel(Channel):
    """A channel that counts its requests and their outcomes; otherwise the channel itself."""

    def __init__(self, inner: Channel, metrics: ServiceMetrics) -> None:
        self.inner = inner
        self.name = inner.name
        self.ambiguous_send_hold_s = inner.ambiguous_send_hold_s
        self.messages_outlive_process = inner.messages_outlive_process
        self.replies_name_author = inner.replies_name_author
        self._metrics = metrics

    async def start(self, on_command: CommandSink) -> None:
        await self.inner.start(on_command)

    async def stop(self) -> None:
        await self.inner.stop()

    def render_card(self, view: CardView) -> Outgoing:
        return self.inner.render_card(view)

    def render_text(self, text: str) -> Outgoing:
        return self.inner.render_text(text)

    def render_own_text(self, text: str) -> Outgoing:
        return self.inner.render_own_text(text)

    def render_board(self, view: BoardView) -> Outgoing:
        return self.inner.render_board(view)

    def board_fits(self, view: BoardView) -> bool:
        return self.inner.board_fits(view)

    def topic_name(self, chat: ChatRef) -> str | None:
        return self.inner.topic_name(chat)

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        return self.inner.rate_scopes(chat, operation, message_id)

    def start_scopes(self) -> tuple[str, ...]:
        return self.inner.start_scopes()

    def start_put_off(self) -> RateLimited | None:
        return self.inner.start_put_off()

    async def finish_start(self) -> RateLimited | None:
        return await self.inner.finish_start()

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        try:
            message_id = await self.inner.send(
                chat, message, idempotency_key=idempotency_key, reply_to=reply_to
            )
        except Exception as error:
            self._metrics.record(self.name, "send", error)
            raise
        self._metrics.record(self.name, "send", None)
        return message_id

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        # `_counted` spelled out: an edit (every card change) resumes through one frame less.
        try:
            await self.inner.edit(chat, message_id, message)
        except Exception as error:
            self._metrics.record(self.name, "edit", error)
            raise
        self._metrics.record(self.name, "edit", None)

    async def delete(self, chat: ChatRef, message_id: str) -> None:
        await self._counted("delete", self.inner.delete(chat, message_id))

    async def pin(self, chat: ChatRef, message_id: str) -> None:
        await self._counted("pin", self.inner.pin(chat, message_id))

    def posted_after_move(self, chat: ChatRef, message_id: str) -> bool:
        return self.inner.posted_after_move(chat, message_id)

    async def _counted(self, operation: Operation, request: Awaitable[None]) -> None:
        try:
            await request
        except Exception as error:
            self._metrics.record(self.name, operation, error)
            raise
        self._metrics.record(self.name, operation, None)
