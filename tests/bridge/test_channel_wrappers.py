"""The channel wrappers (metrics, cluster) stand in for the channel they wrap: every member of
the `Channel` interface is passed on to it. A member a wrapper leaves to `Channel`'s default
is lost without a sound: the service always wraps its channels, so the start's own scopes
(`start_scopes`) were once read as "none" and every stored pause was skipped at the start.
A member added to `Channel` later fails here until each wrapper passes it on (or the list
below says why it need not)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from taskcard.bridge.cluster.commands import ClusteredChannel
from taskcard.bridge.observe.metrics import MeteredChannel, ServiceMetrics
from taskcard.channels.base import (
    CardView,
    Channel,
    ChatRef,
    CommandSink,
    Operation,
    Outgoing,
    RateScope,
    ReplyTo,
)
from taskcard.channels.errors import RateLimited

WRAPPERS: tuple[type[Channel], ...] = (MeteredChannel, ClusteredChannel)
# Members of the interface a wrapper need not pass on, and why.
NOT_PASSED_ON = {
    # Set on the channel itself before it is wrapped (`ClusterWiring.attach`).
    "poll_gate": "set on the wrapped channel",
    # Class methods: the scope rules are read from the channel's own module
    # (`registry.scope_rules`), never from a running instance.
    "scope_covers": "read from the channel's module",
    "describe_scope": "read from the channel's module",
}


def interface() -> list[str]:
    return [
        name
        for name in vars(Channel)
        if not name.startswith("_") and name not in NOT_PASSED_ON and name != "name"
    ]


class Inner(Channel):
    """A channel whose every answer differs from `Channel`'s defaults."""

    name = "inner"
    ambiguous_send_hold_s = 12.5
    messages_outlive_process = False
    replies_name_author = False

    def __init__(self) -> None:
        self.put_off: RateLimited | None = RateLimited(30.0, "inner:menu", "told to wait")
        self.finished: list[str] = []

    async def start(self, on_command: CommandSink) -> None: ...
    async def stop(self) -> None: ...
    def render_card(self, view: CardView) -> Outgoing:
        return Outgoing.build("card", {})

    def render_text(self, text: str) -> Outgoing:
        return Outgoing.build(text, {})

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        return ()

    def start_scopes(self) -> tuple[str, ...]:
        return ("inner:bot",)

    def start_put_off(self) -> RateLimited | None:
        error, self.put_off = self.put_off, None
        return error

    async def finish_start(self) -> RateLimited | None:
        self.finished.append("asked")
        return RateLimited(60.0, "inner:menu", "told to wait again")

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        return "1"

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None: ...
    async def delete(self, chat: ChatRef, message_id: str) -> None: ...
    async def pin(self, chat: ChatRef, message_id: str) -> None: ...


def wrap(kind: type[Channel], inner: Channel) -> Channel:
    if kind is MeteredChannel:
        return MeteredChannel(inner, ServiceMetrics())
    # Never connected: nothing here reaches Redis.
    return ClusteredChannel(inner, Redis(host="127.0.0.1", port=1), "p", "i0", frozenset())


@pytest.mark.parametrize("kind", WRAPPERS, ids=lambda kind: kind.__name__)
def test_every_method_of_the_channel_interface_is_passed_on(kind: type[Channel]) -> None:
    methods = [name for name in interface() if callable(getattr(Channel, name))]
    assert "start_scopes" in methods and "finish_start" in methods
    assert [name for name in methods if name not in vars(kind)] == []


@pytest.mark.parametrize("kind", WRAPPERS, ids=lambda kind: kind.__name__)
def test_every_setting_of_the_channel_is_the_wrapped_one(kind: type[Channel]) -> None:
    inner = Inner()
    wrapped = wrap(kind, inner)
    settings = [name for name in interface() if not callable(getattr(Channel, name))]
    assert "ambiguous_send_hold_s" in settings
    assert {name: getattr(wrapped, name) for name in settings} == {
        name: getattr(inner, name) for name in settings
    }
    assert wrapped.name == inner.name


async def test_the_start_members_reach_the_channel_through_both_wrappers() -> None:
    inner = Inner()
    wrapped = wrap(ClusteredChannel, wrap(MeteredChannel, inner))
    assert wrapped.start_scopes() == ("inner:bot",)
    put_off = wrapped.start_put_off()
    assert put_off is not None and put_off.scope == "inner:menu"
    assert wrapped.start_put_off() is None
    again = await wrapped.finish_start()
    assert again is not None and again.retry_after_s == 60.0
    assert inner.finished == ["asked"]
