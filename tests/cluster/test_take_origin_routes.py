"""Clustered, an instance taking an agent over serves the origin routes another instance
opened for it, even when a save of its own has since merged them into its copy of the shared
route book. It compared the book before and after reading it again, found nothing new (the
save had brought the route in without applying it) and served the agent without the route:
the card in that chat stayed as the other instance left it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from taskcard.bridge.config import parse_config
from taskcard.bridge.deliver.registry import BuiltChannel
from taskcard.bridge.run.origins import OriginBook
from taskcard.bridge.run.service import Service
from taskcard.bridge.schedule.scheduler import RouteKey
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.channels.base import ChatRef
from tests.bridge.test_scheduler import ScriptedChannel
from tests.e2e.harness import eventually

CHAT = ChatRef("-200")
OURS, THEIRS = RouteKey("telegram", CHAT, "x"), RouteKey("telegram", CHAT, "y")


def routed(service: Service, agent_id: str) -> list[RouteKey]:
    return [route.key for route in service._routes_by_agent.get(agent_id, [])]


async def test_a_take_over_serves_an_origin_route_a_save_of_its_own_brought_in(
    tmp_path: Path,
) -> None:
    for name in ("x", "y"):
        (tmp_path / "w" / name).mkdir(parents=True)
    config = parse_config(
        {
            "agents": [{"id": "x", "workdir": "w/x"}, {"id": "y", "workdir": "w/y"}],
            "telegram": {"origin_chats": [-200]},
            "state_dir": "state",
        },
        base_dir=tmp_path,
    )
    store = SqliteStore.in_dir(config.state_dir)
    built = {"telegram": BuiltChannel(ScriptedChannel(), routes=(), secrets=())}
    try:
        service = Service(config, built, store, clustered=True)
        stop = asyncio.Event()
        serving = asyncio.create_task(service.run(stop))
        await eventually(lambda: service._first_read, what="the first reading")
        assert service.take_agents(["x"]) == {}
        # The other instance, serving y, opens y's route from one of its turns.
        OriginBook(store, shared=True).open(THEIRS, 100.0)
        # This one closes a route of its own (as `/taskcard off` there does): its save
        # merges the other's route into its copy of the book, and applies nothing.
        assert service._origins.open(OURS, 90.0)
        service._origins.close(OURS, 110.0)
        assert routed(service, "y") == []
        # The other instance stops; this one takes y over, with its route.
        assert service.take_agents(["y"]) == {}
        assert routed(service, "y") == [THEIRS]
        assert service._serves("y")
        stop.set()
        await serving
    finally:
        store.close()
