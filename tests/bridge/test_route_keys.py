"""Route keys read back from the state store's keys (a start finds the residents of agents
that left while the service was stopped by them)."""

from __future__ import annotations

import pytest

from taskcard.bridge.schedule.routes import RouteKey, route_of_store_key
from taskcard.channels.base import ChatRef


@pytest.mark.parametrize(
    "key",
    [
        RouteKey("telegram", ChatRef("-1001234567890"), "builder"),
        RouteKey("telegram", ChatRef("-1001234567890", "42"), "a.b-c_1"),
        RouteKey("feishu", ChatRef("oc_abc"), "x"),
        RouteKey("feishu", ChatRef("oc:with:colons"), "agent"),
        RouteKey("telegram", ChatRef("5", "7"), "#board"),
    ],
)
def test_a_store_key_reads_back_as_its_route(key: RouteKey) -> None:
    assert route_of_store_key(key.store_key) == key


@pytest.mark.parametrize("text", ["", "telegram", "telegram:1", "telegram:1:", ":1::a", "t:::a"])
def test_what_is_not_a_store_key_reads_as_none(text: str) -> None:
    assert route_of_store_key(text) is None
