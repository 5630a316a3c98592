"""Clustered, the card of a route that went while the service was stopped is told that its
chat no longer follows the agent by the instance holding the agent's lease alone: before the
lease is held, a start owes the edit and makes none; once held, it makes it once, and a
later start finds it told. Lost before the edit went, the lease takes the edit with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from taskcard.bridge.config import parse_config
from taskcard.bridge.deliver.registry import BuiltChannel
from taskcard.bridge.run.departures import UNFOLLOWED_REASON
from taskcard.bridge.run.fleet import UNROUTED_NOTE
from taskcard.bridge.run.service import Service
from taskcard.bridge.schedule.scheduler import RouteKey
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.channels.base import CardView, ChatRef, Outgoing
from tests.bridge.test_scheduler import ScriptedChannel
from tests.e2e.harness import eventually

STALE = RouteKey("fake", ChatRef("9"), "a")


class NotedChannel(ScriptedChannel):
    """Renders a card's body and its note, so a last edit reads as one."""

    def render_card(self, view: CardView) -> Outgoing:
        return Outgoing.build(f"{view.body or ''}|{view.body_note or ''}", {})


def fleet(tmp_path: Path, store: SqliteStore, channel: NotedChannel) -> Service:
    """Agent `a` served, no route to chat 9, where the state keeps its card from before."""
    (tmp_path / "w" / "a").mkdir(parents=True, exist_ok=True)
    config = parse_config(
        {"agents": [{"id": "a", "workdir": "w/a"}], "state_dir": "state"}, base_dir=tmp_path
    )
    built = {"fake": BuiltChannel(channel, routes=(), secrets=())}
    return Service(config, built, store, clustered=True)


def told(store: SqliteStore) -> bool:
    record = store.resident(STALE.store_key)
    return record is not None and record.disabled_reason == UNFOLLOWED_REASON


async def test_the_last_edit_a_start_owes_waits_for_the_agents_lease(tmp_path: Path) -> None:
    store = SqliteStore.in_dir(tmp_path / "state")
    channel = NotedChannel()
    channel.messages["1"] = "a running|"
    store.set_message_id(STALE.store_key, "1")
    try:
        service = fleet(tmp_path, store, channel)
        stop = asyncio.Event()
        serving = asyncio.create_task(service.run(stop))
        await eventually(
            lambda: service._first_read and "fake" in service._ready_channels,
            what="the first reading",
        )
        service._unfollow_stale()  # as the timer does: the lease is another instance's
        assert service._unfollow_owed, "owed, for when the lease is held"
        assert channel.calls == [], "no edit without the lease"

        assert service.take_agents(["a"]) == {}
        await eventually(lambda: UNROUTED_NOTE in channel.messages["1"], what="the last edit")
        await eventually(lambda: told(store), what="the edit recorded")
        assert [call[1] for call in channel.calls] == ["edit"]
        stop.set()
        await serving

        again = fleet(tmp_path, store, channel)
        stop = asyncio.Event()
        serving = asyncio.create_task(again.run(stop))
        await eventually(lambda: again._running, what="the second start")
        assert again._unfollow_owed == {}, "told already: nothing owed"
        stop.set()
        await serving
    finally:
        store.close()
    assert [call[1] for call in channel.calls] == ["edit"]


async def test_a_lease_lost_before_the_last_edit_went_takes_the_edit_with_it(
    tmp_path: Path,
) -> None:
    store = SqliteStore.in_dir(tmp_path / "state")
    channel = NotedChannel()
    channel.messages["1"] = "a running|"
    store.set_message_id(STALE.store_key, "1")
    gate = asyncio.Event()
    edit = channel.edit

    async def held(chat: ChatRef, message_id: str, message: Outgoing) -> None:
        await gate.wait()
        await edit(chat, message_id, message)

    try:
        service = fleet(tmp_path, store, channel)
        stop = asyncio.Event()
        serving = asyncio.create_task(service.run(stop))
        await eventually(
            lambda: service._first_read and "fake" in service._ready_channels,
            what="the first reading",
        )
        channel.edit = held  # type: ignore[method-assign]
        assert service.take_agents(["a"]) == {}
        await eventually(lambda: STALE in service._unfollowing, what="the edit on its way")
        service.drop_agent("a")
        assert STALE not in service._unfollowing and service._unfollow_owed, "owed again"
        gate.set()
        stop.set()
        await serving
    finally:
        store.close()
    reopened = SqliteStore.in_dir(tmp_path / "state")
    try:
        record = reopened.resident(STALE.store_key)
    finally:
        reopened.close()
    assert record is not None and record.disabled_reason is None, "not recorded as told"
