"""`taskcard status` lists the board of a chat that lost all its routes, end to end: `taskcard
serve` with a config file the operator rewrites while the service is stopped, against the fake
Telegram Bot API and the fake Feishu Open API, and `status` run as a user runs it. The state
keeps such a board (its last edit says the chat follows no agent now, and a route there again
brings the same message back), but `status` built its list from the routes alone and left it
out, text and `--json`: an operator could not see the message the service still owns there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import ServeProcess, eventually, publish, run_cli
from tests.e2e.test_board_routes_gone import board_config, board_of, first_says_unfollowed
from tests.e2e.test_reload_routes import WAIT_S
from tests.e2e.test_routes_gone_while_stopped import platform_of
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

UNROUTED = "the board of a chat no route follows now"
WAYS = (
    "a route to the chat again (configured, then a reload) brings the same board back, and"
    " deleting the message in the chat clears it there"
)


def status(config: Path) -> tuple[str, dict[str, dict[str, Any]]]:
    """The text `status` prints, and its `--json` routes by name."""
    text = run_cli("status", "--config", str(config))
    assert (text.returncode, text.stderr) == (0, "")
    data = run_cli("status", "--json", "--config", str(config))
    assert (data.returncode, data.stderr) == (0, "")
    return text.stdout, {route["route"]: route for route in json.loads(data.stdout)["routes"]}


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_status_lists_the_board_of_a_chat_that_lost_its_routes(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    fake, first, second = platform_of(platform, telegram, feishu)
    both: list[tuple[object, list[str]]] = [(first, ["alpha"]), (second, ["alpha"])]
    config, env = board_config(tmp_path, fake, both)
    with ServeProcess(config, env=env) as serve:
        publish(tmp_path / "agents" / "alpha", "alpha step 1")
        await eventually(
            lambda: (
                "alpha step 1" in board_of(fake, first)[1]
                and "alpha step 1" in board_of(fake, second)[1]
            ),
            timeout_s=WAIT_S,
            what="both chats' boards",
        )
        assert await serve.aterminate() == 0
    board = board_of(fake, first)[0]
    route = f"{platform}:{first}::#board"
    assert status(config)[1][route]["message_id"] == board

    # The operator takes the first chat's route away while the service is stopped.
    board_config(tmp_path, fake, [(second, ["alpha"])])
    text, routes = status(config)
    owed = (
        f"{route}\n  resident message: {board}, {UNROUTED}; the service edits it to say the chat"
        f" follows no agent now (unless the chat hid its cards); {WAYS}\n"
    )
    assert owed in text, text
    listed = routes[route]
    assert (listed["routed"], listed["opened_by"], listed["message_id"]) == (False, None, board)
    assert (listed["agent"], listed["disabled"]) == ("#board", None)
    assert routes[f"{platform}:{second}::#board"]["routed"] is True

    with ServeProcess(config, env=env) as serve:
        await first_says_unfollowed(fake, first, second, board, tmp_path)
        await eventually(
            lambda: status(config)[1][route]["disabled"] is not None,
            what="the board's last edit recorded",
        )
        assert await serve.aterminate() == 0
    text, routes = status(config)
    said = "it says the chat follows no agent now"
    told = f"{route}\n  resident message: {board}, {UNROUTED}; {said}; {WAYS}\n"
    assert told in text, text
    assert "DISABLED" not in text, "the last edit is said on the resident line"
    assert routes[route]["routed"] is False and routes[route]["message_id"] == board

    # Routed there again: the board is one of the chat's routes once more.
    board_config(tmp_path, fake, both)
    text, routes = status(config)
    assert UNROUTED not in text and routes[route]["routed"] is True


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_status_does_not_promise_an_edit_to_a_disabled_unrouted_board(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """The board of a chat that removed the bot, whose route the operator then takes away:
    its route is disabled, and the service leaves such a board as it is (it edits only a
    board with no disabled reason). `status` said "the service edits it to say the chat
    follows no agent now" beside the DISABLED line, an edit that never comes."""
    fake, first, second = platform_of(platform, telegram, feishu)
    both: list[tuple[object, list[str]]] = [(first, ["alpha"]), (second, ["alpha"])]
    config, env = board_config(tmp_path, fake, both)
    route = f"{platform}:{first}::#board"
    with ServeProcess(config, env=env) as serve:
        publish(tmp_path / "agents" / "alpha", "alpha step 1")
        await eventually(
            lambda: "alpha step 1" in board_of(fake, first)[1],
            timeout_s=WAIT_S,
            what="the first chat's board",
        )
        if isinstance(fake, FakeTelegram):
            fake.kick(first)
        else:
            fake.remove_bot(str(first))
        publish(tmp_path / "agents" / "alpha", "alpha step 2")
        await eventually(
            lambda: status(config)[1][route]["disabled"] is not None,
            timeout_s=WAIT_S,
            what="the first chat's board disabled",
        )
        assert await serve.aterminate() == 0
    board_config(tmp_path, fake, [(second, ["alpha"])])
    text, routes = status(config)
    assert routes[route]["routed"] is False and routes[route]["disabled"] is not None
    assert f"{route}\n  resident message: " in text, text
    assert "the service edits it" not in text, text
    assert "DISABLED: " in text, "the reason the service leaves it as it is"
