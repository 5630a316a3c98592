"""A chat that shows a board and loses its routes, end to end: `taskcard serve` with a
config file that a reload (SIGHUP) or an operator while the service is stopped rewrites,
against the fake Telegram Bot API and the fake Feishu Open API, the chats read as people
see them. A board whose chat follows no agent any more says so in a last edit, as a card
whose route went does; one that loses some of its agents drops their lines; routed again,
the same board comes back to life."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, activity, eventually, publish, set_status
from tests.e2e.test_reload_routes import WAIT_S, cards, write_config
from tests.e2e.test_routes_gone_while_stopped import OWED, edits, platform_of
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

# The last word of a board whose chat no longer follows any agent.
UNFOLLOWED = "no longer followed: this chat follows no agent now"


def board_config(
    tmp_path: Path,
    fake: FakeTelegram | FakeFeishu,
    routes: list[tuple[object, list[str]]],
    *,
    origin_chats: tuple[object, ...] = (),
) -> tuple[Path, dict[str, str]]:
    """`write_config`, each route showing its chat one board."""
    config, env = write_config(tmp_path, fake, routes, origin_chats=origin_chats)
    config.write_text(config.read_text().replace("\nagents = ", '\nview = "board"\nagents = '))
    return config, env


def board_of(fake: FakeTelegram | FakeFeishu, chat: object) -> tuple[str, str]:
    """(message id, text) of the one board in `chat`; ("", "") while there is none."""
    found = [(i, t) for i, t in cards(fake, chat).items() if "Task board" in t.split("\n")[0]]
    assert len(found) <= 1, found
    return found[0] if found else ("", "")


async def first_says_unfollowed(
    fake: FakeTelegram | FakeFeishu, first: object, second: object, board: str, tmp_path: Path
) -> None:
    """The first chat's `board` says the chat follows no agent now, in the same message,
    while alpha's next step still reaches the second chat's board."""
    await eventually(
        lambda: UNFOLLOWED in board_of(fake, first)[1],
        timeout_s=WAIT_S,
        what="the first chat's board saying the chat follows no agent now",
    )
    assert board_of(fake, first)[0] == board
    publish(tmp_path / "agents" / "alpha", "alpha step 2")
    await eventually(
        lambda: "alpha step 2" in board_of(fake, second)[1],
        timeout_s=WAIT_S,
        what="the second chat's board going on",
    )


async def board_comes_back(
    fake: FakeTelegram | FakeFeishu, chat: object, board: str, step: str, serve: ServeProcess
) -> None:
    """The chat, routed again, shows `board` listing alpha at `step` and beta again, with no
    last word and no second message; then the service stops cleanly."""
    await eventually(
        lambda: (
            f"alpha {step}" in board_of(fake, chat)[1] and "beta step 1" in board_of(fake, chat)[1]
        ),
        timeout_s=WAIT_S,
        what="the same board listing alpha and beta again",
    )
    assert board_of(fake, chat)[0] == board and UNFOLLOWED not in board_of(fake, chat)[1]
    assert list(cards(fake, chat)) == [board], "one board, no new message"
    assert await serve.aterminate() == 0


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_board_drops_the_lines_a_reload_unroutes_and_says_when_it_follows_none(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A reload takes beta out of the first chat's route: its board drops beta's line. A
    second takes the chat's route away: the board is edited a last time to say the chat
    follows no agent now (it went on listing alpha as it was, as if live) and changes no
    more. A third routes the chat again: the same board lists alpha and beta again."""
    fake, first, second = platform_of(platform, telegram, feishu)
    both: list[tuple[object, list[str]]] = [(first, ["alpha", "beta"]), (second, ["alpha"])]
    config, env = board_config(tmp_path, fake, both)
    with ServeProcess(config, env=env) as serve:
        assert serve.proc is not None
        for agent in ("alpha", "beta"):
            publish(tmp_path / "agents" / agent, f"{agent} step 1")
        await eventually(
            lambda: (
                "alpha step 1" in board_of(fake, first)[1]
                and "beta step 1" in board_of(fake, first)[1]
                and "alpha step 1" in board_of(fake, second)[1]
            ),
            timeout_s=WAIT_S,
            what="the first chat's board listing alpha and beta, the second's alpha",
        )
        board = board_of(fake, first)[0]

        board_config(tmp_path, fake, [(first, ["alpha"]), (second, ["alpha"])])
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: "beta" not in board_of(fake, first)[1],
            timeout_s=WAIT_S,
            what="the first chat's board without beta's line",
        )
        assert "1 agent" in board_of(fake, first)[1] and "alpha step 1" in board_of(fake, first)[1]

        board_config(tmp_path, fake, [(second, ["alpha"])])
        serve.proc.send_signal(signal.SIGHUP)
        await first_says_unfollowed(fake, first, second, board, tmp_path)
        assert "alpha" not in board_of(fake, first)[1], "the first chat's board changed no more"

        board_config(tmp_path, fake, both)
        serve.proc.send_signal(signal.SIGHUP)
        await board_comes_back(fake, first, board, "step 2", serve)


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_board_whose_chat_lost_its_routes_while_stopped_says_so_once_at_the_next_start(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """The operator takes the first chat's route away while the service is stopped: the
    next start edits its board a last time to say the chat follows no agent now (it went on
    listing the agents as they were at the stop, for good). A further restart leaves it as
    it is; routed there again, the same board lists the agents again."""
    fake, first, second = platform_of(platform, telegram, feishu)
    both: list[tuple[object, list[str]]] = [(first, ["alpha", "beta"]), (second, ["alpha"])]
    config, env = board_config(tmp_path, fake, both)
    with ServeProcess(config, env=env) as serve:
        for agent in ("alpha", "beta"):
            publish(tmp_path / "agents" / agent, f"{agent} step 1")
        await eventually(
            lambda: (
                "beta step 1" in board_of(fake, first)[1]
                and "alpha step 1" in board_of(fake, first)[1]
                and "alpha step 1" in board_of(fake, second)[1]
            ),
            timeout_s=WAIT_S,
            what="both chats' boards",
        )
        assert await serve.aterminate() == 0
    board = board_of(fake, first)[0]

    board_config(tmp_path, fake, [(second, ["alpha"])])
    with ServeProcess(config, env=env) as serve:
        await first_says_unfollowed(fake, first, second, board, tmp_path)
        assert await serve.aterminate() == 0
    told = (board_of(fake, first)[1], edits(fake, first, board))
    assert "alpha" not in told[0]

    # Restarted on the same file: told once is enough.
    with ServeProcess(config, env=env) as serve:
        publish(tmp_path / "agents" / "alpha", "alpha step 3")
        await eventually(
            lambda: "alpha step 3" in board_of(fake, second)[1],
            timeout_s=WAIT_S,
            what="the second chat's board going on",
        )
        await eventually(lambda: f"channel {platform} ready" in serve.logs, what="the log")
        assert OWED not in serve.logs, "a board already told was owed its last edit again"
        assert await serve.aterminate() == 0
    assert (board_of(fake, first)[1], edits(fake, first, board)) == told

    # Routed there again while stopped: the same board comes back.
    board_config(tmp_path, fake, both)
    with ServeProcess(config, env=env) as serve:
        publish(tmp_path / "agents" / "alpha", "alpha step 4")
        await board_comes_back(fake, first, board, "step 4", serve)


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_board_drops_the_line_of_an_origin_route_that_closes(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """The chat shows beta's route as a board, and a turn from it opened alpha's route
    there: the board lists both. Alpha's card is removed, which closes its route: the board
    drops alpha's line at its next edit (it kept listing alpha, stopped, until the next
    reload or route opened)."""
    fake, chat, _ = platform_of(platform, telegram, feishu)
    config, env = board_config(tmp_path, fake, [(chat, ["beta"])], origin_chats=(chat,))
    alpha = tmp_path / "agents" / "alpha"
    with ServeProcess(config, env=env) as serve:
        publish(tmp_path / "agents" / "beta", "beta step 1")
        publish(alpha, "alpha step 1")
        activity(alpha, "turn.start", origin=f"{platform}:{chat}")
        await eventually(
            lambda: "alpha step 1" in board_of(fake, chat)[1] and "beta" in board_of(fake, chat)[1],
            timeout_s=WAIT_S,
            what="the board listing alpha, its route opened by a turn, and beta",
        )
        set_status(alpha, "inactive")
        await eventually(lambda: "its card was removed" in serve.logs, what="the route closed")
        publish(tmp_path / "agents" / "beta", "beta step 2")
        await eventually(
            lambda: "beta step 2" in board_of(fake, chat)[1],
            timeout_s=WAIT_S,
            what="the board's next edit",
        )
        assert "alpha" not in board_of(fake, chat)[1]
        assert "1 agent" in board_of(fake, chat)[1]
        assert await serve.aterminate() == 0
