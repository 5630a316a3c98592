"""The benchmark figures that can fail, on hand-made logs: fairness of creation (lead and
completion spread), what a board shows per agent, and the rounds the storm bounds are built
from. The scenarios themselves run against the fakes in `python -m bench`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from bench.cluster_storm import instance_config, split
from bench.creation import completion_spread, max_lead
from bench.harness import (
    Limits,
    Route,
    Shown,
    agent_ids,
    card_body,
    chat_routes,
    make_fleet,
    visible_delays,
)
from bench.storm import Analysis, drain_figure, round_s
from taskcard.bridge.config import load_config
from tests.fakes.telegram_api import RecordedRequest, Window

A, B, C = -1, -2, -3


@pytest.mark.parametrize(
    ("created", "residents", "lead"),
    [
        # Round-robin across three chats of two: never more than one ahead.
        ([(1, A), (2, B), (3, C), (4, A), (5, B), (6, C)], {A: 2, B: 2, C: 2}, 1),
        # One chat served to the end first: it leads by all its residents.
        ([(1, A), (2, A), (3, A), (4, B), (5, B), (6, B)], {A: 3, B: 3}, 3),
        # A chat that is complete no longer holds the minimum down: the last ones finishing
        # a round apart is no lead.
        ([(1, A), (2, B), (3, A), (4, B)], {A: 2, B: 2}, 1),
        # A chat that never got anything counts as zero.
        ([(1, A), (2, A)], {A: 3, B: 3}, 2),
        # Order of the input does not matter, only the times.
        ([(6, C), (1, A), (2, A), (3, B), (4, B), (5, C)], {A: 2, B: 2, C: 2}, 2),
        ([], {A: 1}, 0),
    ],
)
def test_max_lead(created: list[tuple[float, int]], residents: dict[int, int], lead: int) -> None:
    assert max_lead(created, residents)[0] == lead


def test_max_lead_says_when() -> None:
    assert max_lead([(1.0, A), (2.0, A), (3.0, B)], {A: 3, B: 3}) == (2, 2.0)


@pytest.mark.parametrize(
    ("created", "residents", "spread"),
    [
        ([(1, A), (2, B), (3, A), (4, B)], {A: 2, B: 2}, 1.0),
        ([(1, A), (2, A), (3, B), (9, B)], {A: 2, B: 2}, 7.0),
        ([(1, A), (2, B)], {A: 1, B: 2}, 0.0),  # only one chat complete
    ],
)
def test_completion_spread(
    created: list[tuple[float, int]], residents: dict[int, int], spread: float
) -> None:
    assert completion_spread(created, residents) == spread


def test_completion_spread_without_a_complete_chat_is_unknown() -> None:
    assert math.isnan(completion_spread([(1, A)], {A: 2}))


class LogOnly:
    """Just the request log of a fake, which is all `Shown` reads."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []

    def answer(self, at_s: float, method: str, chat: int, text: str, status: int = 200) -> None:
        params: dict[str, Any] = {"text": text}
        self.requests.append(RecordedRequest(at_s, method, chat, status, params))


def board_text(*versions: tuple[str, int]) -> str:
    """A board as the Telegram channel draws it: a title, then a line per agent whose text
    starts with the first line of the agent's card."""
    lines = ["📋 Task board · 3 agents · 3 running"]
    for agent, version in versions:
        headline = card_body(agent, version).splitlines()[0]
        lines.append(f"🟢 {agent} · running · {headline}")
    return "\n".join(lines)


def test_a_board_edit_shows_every_agent_on_it() -> None:
    fake = LogOnly()
    fake.answer(1.0, "sendMessage", A, board_text(("a0000", 0), ("a0001", 0)))
    fake.answer(2.0, "editMessageText", A, board_text(("a0000", 3), ("a0001", 1)))
    # Rejected: shows nothing; and a card in another chat counts for that chat only.
    fake.answer(3.0, "editMessageText", A, board_text(("a0000", 9), ("a0001", 9)), 429)
    fake.answer(4.0, "sendMessage", 7001, card_body("a0000", 5))
    shown = Shown(fake)  # type: ignore[arg-type]
    shown.update()
    assert shown.timeline[(A, "a0000")] == [(1.0, 0), (2.0, 3)]
    assert shown.timeline[(A, "a0001")] == [(1.0, 0), (2.0, 1)]
    assert shown.latest == {(A, "a0000"): 3, (A, "a0001"): 1, (7001, "a0000"): 5}
    # Staleness of a board line: from the change to the first edit showing it (or later).
    writes = [(0.5, 1), (1.5, 2), (2.5, 4)]
    delays = visible_delays(writes, shown.timeline[(A, "a0000")], end_s=10.0)
    assert delays == [(1.5, True), (0.5, True), (7.5, False)]


@pytest.mark.parametrize(
    ("route", "board", "expected_s"),
    [
        # 100 cards in a group at 20 per 20 s: one round is 100 s.
        (Route(A, tuple(f"a{i}" for i in range(100))), False, 100.0),
        # The board in that group: two edits (one in flight, then the change), 2 s.
        (Route(A, tuple(f"a{i}" for i in range(100)), "board"), True, 2.0),
        # Private chats keep their cards in the board run: 5 at 1/s.
        (Route(7001, tuple(f"a{i}" for i in range(5))), True, 5.0),
    ],
)
def test_round_of_a_chat(route: Route, board: bool, expected_s: float) -> None:
    limits = Limits(group_chat=Window(20, 20.0))
    assert round_s(limits, route, board) == pytest.approx(expected_s)


@pytest.mark.parametrize(
    ("count", "per_chat", "first", "step", "expected"),
    [
        (
            5,
            2,
            -100,
            -1,
            [(-100, ("a0000", "a0001")), (-101, ("a0002", "a0003")), (-102, ("a0004",))],
        ),
        (3, 1, 7, 1, [(7, ("a0000",)), (8, ("a0001",)), (9, ("a0002",))]),
        (0, 5, 1, 1, []),
    ],
)
def test_chat_routes_deal_agents_in_order(
    count: int, per_chat: int, first: int, step: int, expected: list[tuple[int, tuple[str, ...]]]
) -> None:
    routes = chat_routes(agent_ids(count), per_chat, first, step)
    assert [(route.chat_id, route.agents) for route in routes] == expected


def test_each_cluster_instance_config_loads_with_only_its_share(tmp_path: Path) -> None:
    """The instances' configs are the harness's, plus the shared Redis and their own state."""
    ids = agent_ids(6)
    routes = [Route(-1, ids), *chat_routes(ids, 2, 10, 1)]
    fleet = make_fleet(tmp_path, ids, routes)
    shares = split(routes, 3)
    for share in shares:
        path = tmp_path / f"{share.name}.toml"
        path.write_text(
            instance_config(fleet, share, "http://127.0.0.1:1", Limits(), "redis://x:1/0", "p")
        )
        config = load_config(path)
        assert [agent.id for agent in config.agents] == list(share.agents)
        assert config.state_dir == tmp_path / share.name / "state"
        assert config.cluster.instance == share.name and config.cluster.key_prefix == "p"
        assert config.telegram is not None
        assert [route.chat_id for route in config.telegram.routes] == [
            route.chat_id for route in share.routes
        ]
    assert sorted(a for share in shares for a in share.agents) == list(ids)


def _drained(drain_s: float, final: int, routes: int) -> Analysis:
    """An analysis holding only what `drain_figure` reads (the rest needs a whole run)."""
    who = Analysis.__new__(Analysis)
    who.drain, who.final, who.routes = {"group": drain_s}, {"group": final}, {"group": routes}
    return who


@pytest.mark.parametrize(
    ("mine", "base", "compared", "value", "met", "baseline", "note"),
    [
        (_drained(3.0, 5, 5), _drained(9.0, 5, 5), True, 3.0, True, 9.0, ""),
        (
            _drained(30.0, 5, 5),
            _drained(math.inf, 2, 5),
            True,
            30.0,
            False,
            40.0,
            "baseline: only 2/5 final after 40 s of observation (figure is that lower bound)",
        ),
        (_drained(math.inf, 4, 5), _drained(math.inf, 0, 5), False, 40.0, False, 40.0,
         "taskcard: only 4/5 final after 40 s of observation (figure is that lower bound)"),
    ],
)  # fmt: skip
def test_drain_figure_reports_a_drain_never_seen_as_its_lower_bound(
    mine: Analysis,
    base: Analysis,
    compared: bool,
    value: float,
    met: bool,
    baseline: float,
    note: str,
) -> None:
    figure = drain_figure("group", 20.0, mine, base, 40.0, compared)
    assert (figure.value, figure.passed, figure.baseline, figure.note) == (
        value,
        met,
        baseline,
        note,
    )
