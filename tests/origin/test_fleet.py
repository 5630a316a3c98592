"""The pure decisions behind a changing fleet: desired agents and routes, reload limits,
discovery, origin routes and their memory, and the watch plan of discovery roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskcard.bridge.config import ServiceConfig, parse_config
from taskcard.bridge.deliver.registry import route_specs
from taskcard.bridge.run.fleet import (
    desired_fleet,
    discover_agents,
    keyed_origin_chats,
    origin_chats,
    origin_listed,
    origin_route,
    restart_needed,
)
from taskcard.bridge.run.origins import OriginBook
from taskcard.bridge.schedule.scheduler import RouteKey
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.bridge.watch.watcher import ROOTS, plan_watch
from taskcard.channels.base import ChatRef
from taskcard.producers.task_card.contract import Origin


def config(tmp_path: Path, **sections: object) -> ServiceConfig:
    data: dict[str, object] = {
        "agents": [{"id": "builder", "workdir": "b"}],
        "discover": {"roots": ["fleet"]},
        "telegram": {
            "routes": [
                {"chat_id": -100, "agents": ["*"]},
                {"chat_id": 7, "agents": ["builder", "scout"]},
            ],
            "origin_chats": [-200],
        },
    }
    data.update(sections)
    return parse_config(data, base_dir=tmp_path)


def test_star_routes_cover_discovered_agents_and_named_ones_once_found(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    specs = route_specs(cfg)
    before = desired_fleet(cfg, specs, {}, [])
    assert [str(r.key) for r in before.routes] == ["telegram:-100::builder", "telegram:7::builder"]
    after = desired_fleet(cfg, specs, {"scout": tmp_path / "fleet/scout"}, [])
    assert sorted(str(r.key) for r in after.routes) == [
        "telegram:-100::builder",
        "telegram:-100::scout",
        "telegram:7::builder",
        "telegram:7::scout",
    ]
    assert list(after.agents) == ["builder", "scout"]


def test_origin_routes_need_their_agent_and_yield_to_configured_ones(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    opened = RouteKey("telegram", ChatRef("-200", "3"), "builder")
    same_as_config = RouteKey("telegram", ChatRef("-100"), "builder")
    gone = RouteKey("telegram", ChatRef("-200"), "nobody")
    fleet = desired_fleet(cfg, route_specs(cfg), {}, [opened, same_as_config, gone])
    origin = [r for r in fleet.routes if r.origin]
    assert [r.key for r in origin] == [opened]
    assert not next(r for r in fleet.routes if r.key == same_as_config).origin


@pytest.mark.parametrize(
    ("origin", "expected"),
    [
        (Origin("telegram", "-200", "3"), RouteKey("telegram", ChatRef("-200", "3"), "a")),
        (Origin("telegram", "-100"), None),  # routed by config, but not an origin chat
        (Origin("feishu", "-200"), None),  # no feishu section
    ],
)
def test_origin_route_only_for_allowed_chats(
    tmp_path: Path, origin: Origin, expected: RouteKey | None
) -> None:
    allowed = origin_chats(config(tmp_path))
    assert origin_route(origin, "a", allowed) == expected


@pytest.mark.parametrize(
    ("key", "listed"),
    [
        (RouteKey("telegram", ChatRef("-200", "3"), "builder"), True),
        (RouteKey("telegram", ChatRef("-200"), "scout"), True),
        (RouteKey("telegram", ChatRef("-100"), "builder"), False),  # routed, not listed
        (RouteKey("feishu", ChatRef("-200"), "builder"), False),  # no feishu section
    ],
)
def test_an_open_origin_route_stays_only_while_origin_chats_lists_its_chat(
    tmp_path: Path, key: RouteKey, listed: bool
) -> None:
    assert origin_listed(key, keyed_origin_chats(config(tmp_path), None)) is listed


def test_origin_chats_are_keyed_as_the_group_a_supergroup_was(tmp_path: Path) -> None:
    """A chat listed by the id Telegram gave the supergroup a routed group became is keyed
    by the group's id, as its routes are, so its open origin routes stay listed."""
    store = SqliteStore.in_dir(tmp_path)
    try:
        store.set_cursor("telegram:chat_moved_from:-300", "-200")
        store.set_cursor("telegram:chat_moved_to:-200", "-300")
        cfg = config(tmp_path, telegram={"routes": [], "origin_chats": [-300]})
        allowed = keyed_origin_chats(cfg, store)
    finally:
        store.close()
    assert origin_listed(RouteKey("telegram", ChatRef("-200"), "builder"), allowed)


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({"agents": []}, []),
        ({"discover": {"roots": ["other"]}}, []),
        ({"display": {"activity_rows": 5}}, []),
        ({"telegram": {"routes": [], "origin_chats": [-1]}}, []),
        (
            {"telegram": {"api_base_url": "https://example.org", "routes": []}},
            ["telegram.api_base_url"],
        ),
        ({"feishu": {}}, ["feishu"]),
        ({"state_dir": "elsewhere"}, ["state_dir"]),
        ({"notices": {"max_per_minute": 9}}, ["notices.max_per_minute"]),
        # docs/operators.md lists these as needing a restart too.
        ({"log_level": "DEBUG"}, ["log_level"]),
        ({"console": {"enabled": True}}, ["console.enabled"]),
        ({"signals": {"idle_floor_s": 60}}, ["signals.idle_floor_s"]),
        ({"inbox": {"max_messages": 9}}, ["inbox.max_messages"]),
        ({"cluster": {"redis_url": "redis://127.0.0.1:6379/0"}}, ["cluster.redis_url"]),
        # Each key a reload cannot apply is named by its path, not by its table alone.
        (
            {"telegram": {"routes": [], "poll_timeout_s": 2}, "limits": {"max_pause_s": 9}},
            ["limits.max_pause_s", "telegram.poll_timeout_s"],
        ),
    ],
)
def test_reload_applies_fleet_keys_and_refuses_the_rest(
    tmp_path: Path, change: dict[str, object], refused: list[str]
) -> None:
    running = config(tmp_path)
    assert restart_needed(running, config(tmp_path, **change)) == refused


def test_discovery_skips_bad_names_clashes_and_files(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    for folder in (first / "scout", first / "builder", first / "bad name", first / ".git"):
        folder.mkdir(parents=True)
    (first / "_scratch").mkdir()  # only allowed characters, but not a letter or digit first
    (first / "notes.txt").write_text("x")
    (second / "scout").mkdir(parents=True)
    found = discover_agents([first, second, tmp_path / "missing"], ["builder"])
    assert found.agents == {"scout": first / "scout"}
    assert len(found.problems) == 4
    bad = [p for p in found.problems if "not a valid agent id" in p]
    assert len(bad) == 2 and all("starting with a letter or digit" in p for p in bad)
    assert any("configured in [[agents]], which wins" in p for p in found.problems)
    assert any("already found" in p for p in found.problems)


def test_origin_book_persists_and_never_reopens_on_an_older_origin(tmp_path: Path) -> None:
    store = SqliteStore.in_dir(tmp_path)
    key = RouteKey("feishu", ChatRef("oc_1"), "coder")
    book = OriginBook(store)
    assert book.open(key, 100.0) is True
    assert book.open(key, 150.0) is False  # already open
    assert OriginBook(store).open_routes() == [key]  # survives a restart
    book.close(key, 200.0)
    assert book.open_routes() == [] and book.opened_at(key) is None
    again = OriginBook(store)
    assert again.open(key, 180.0) is False  # written before it was closed: a replay
    assert again.open(key, 250.0) is True
    assert again.opened_at(key) == 250.0
    store.close()


def test_origin_routes_of_a_forgotten_agent_go_open_or_closed_and_the_others_stay(
    tmp_path: Path,
) -> None:
    """An agent forgotten after leaving kept its open origin routes in the saved document for
    good (only closed ones were ever dropped, past 5,000)."""
    store = SqliteStore.in_dir(tmp_path)
    gone_open = RouteKey("feishu", ChatRef("oc_1"), "gone")
    gone_closed = RouteKey("telegram", ChatRef("-100", "7"), "gone")
    stays = RouteKey("feishu", ChatRef("oc_1"), "stays")
    book = OriginBook(store)
    for key in (gone_open, gone_closed, stays):
        book.open(key, 100.0)
    book.close(gone_closed, 200.0)
    assert book.forget_agent("gone") is True
    assert book.forget_agent("gone") is False  # nothing left of it
    again = OriginBook(store)
    assert again.open_routes() == [stays]
    assert again.open(gone_closed, 150.0) is True, "its closing time went with it"
    store.close()


def test_shared_origin_books_write_only_the_routes_they_change(tmp_path: Path) -> None:
    """Clustered, every instance's book is one document in the shared store. Each used to
    write back the whole document it read at its start: the routes others had opened since
    went, and those they had closed opened again."""
    store = SqliteStore.in_dir(tmp_path)
    theirs, ours = (RouteKey("telegram", ChatRef(c), a) for c, a in (("-1", "b"), ("-2", "a")))
    mine, other = OriginBook(store, shared=True), OriginBook(store, shared=True)
    assert other.open(theirs, 100.0) is True
    assert mine.open(ours, 110.0) is True  # read before `theirs` opened
    assert OriginBook(store).open_routes() == [theirs, ours]
    other.close(theirs, 120.0)
    mine.close(ours, 130.0)  # holds `theirs` open since the write above
    assert OriginBook(store).open_routes() == []
    assert mine.open(theirs, 115.0) is False, "written before the other closed it"
    other.reread()
    assert other.open_routes() == []  # `ours` closed since
    other.open(theirs, 140.0)
    assert mine.open_routes() == [], "a copy, until read again"
    mine.reread()
    assert mine.open_routes() == [theirs]
    # Alone on its state (not shared) the book's own copy is the document, as before.
    alone = OriginBook(store)
    other.open(ours, 150.0)
    alone.close(theirs, 160.0)
    alone.reread()
    assert OriginBook(store).open_routes() == [] and alone.open_routes() == []
    store.close()


def test_unreadable_saved_origin_routes_start_empty(tmp_path: Path) -> None:
    store = SqliteStore.in_dir(tmp_path)
    store.set_cursor("origin-routes", '[{"channel": 1}, "x", {"channel": "telegram"}]')
    assert OriginBook(store).open_routes() == []
    store.set_cursor("origin-routes", "{not json")
    assert OriginBook(store).open_routes() == []
    store.close()


def test_a_discovery_root_is_watched_and_its_entries_report_roots(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    root.mkdir()
    plan = plan_watch({}, [root])
    assert plan.paths == (str(root),)
    assert plan.agents_for(str(root / "new-agent")) == ({ROOTS}, False)
    missing = plan_watch({}, [tmp_path / "later" / "fleet"])
    assert missing.paths == (str(tmp_path),)
    assert missing.agents_for(str(tmp_path / "later")) == ({ROOTS}, True)
