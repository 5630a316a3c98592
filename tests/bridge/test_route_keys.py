"""Route keys read back from the state store's keys (a start finds the residents of agents
that left while the service was stopped by them)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taskcard.bridge.schedule.routes import RouteKey, chat_scope, route_of_store_key
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


@pytest.mark.parametrize(
    ("key", "store_key", "scope", "lane"),
    [
        (
            RouteKey("telegram", ChatRef("-100"), "builder"),
            "telegram:-100::builder",
            "telegram:-100:",
            ("telegram", "-100"),
        ),
        (
            RouteKey("telegram", ChatRef("-100", "42"), "a"),
            "telegram:-100:42:a",
            "telegram:-100:42",
            ("telegram", "-100"),
        ),
        (
            RouteKey("feishu", ChatRef("oc:x"), "b"),
            "feishu:oc:x::b",
            "feishu:oc:x:",
            ("feishu", "oc:x"),
        ),
    ],
)
def test_a_keys_derived_names_are_worked_out_once_and_stay_out_of_its_identity(
    key: RouteKey, store_key: str, scope: str, lane: tuple[str, str]
) -> None:
    assert (key.store_key, key.chat_scope, key.lane, str(key)) == (
        store_key,
        scope,
        lane,
        store_key,
    )
    assert key.chat_scope == chat_scope(key.channel, key.chat)
    assert (
        repr(key)
        == f"RouteKey(channel={key.channel!r}, chat={key.chat!r}, agent_id='{key.agent_id}')"
    )
    same = RouteKey(key.channel, key.chat, key.agent_id)
    assert same == key and hash(same) == hash(key) == hash((key.channel, key.chat, key.agent_id))
    moved = replace(key, agent_id="other")
    assert moved.store_key == f"{scope}:other" and moved.lane == key.lane
