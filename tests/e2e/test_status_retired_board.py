"""`taskcard status` on a chat that switched between its board and one card per agent, end to
end (`taskcard serve` with a config file against the fake Telegram Bot API, `/taskcard cards`
sent in the chat, `status` run as a user runs it): a retired board read "resident message:
(none yet)", the words of a card whose first message is on its way, and a refusal of it
spoke of cards; the card of an agent followed on the board read the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.harness import eventually, publish, run_cli
from tests.e2e.test_serve_board import GROUP, board_text, boards, telegram_serve
from tests.fakes.telegram_api import FakeTelegram

BOARD = f"telegram:{GROUP}::#board"
ALPHA = f"telegram:{GROUP}::alpha"
RETIRED_BOARD = (
    "  resident message: none, the board is retired: the chat shows one card per agent"
    " (/taskcard board there brings it back)"
)
FOLLOWED = (
    "  resident message: none, followed on the chat's board (the agent gets a card when it"
    " needs people)"
)


def status(config: Path) -> tuple[str, dict[str, dict[str, Any]]]:
    """The text `status` prints, and its `--json` routes by name."""
    text = run_cli("status", "--config", str(config))
    assert (text.returncode, text.stderr) == (0, "")
    data = run_cli("status", "--json", "--config", str(config))
    assert (data.returncode, data.stderr) == (0, "")
    return text.stdout, {route["route"]: route for route in json.loads(data.stdout)["routes"]}


async def test_status_says_board_for_a_retired_board(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    serve = telegram_serve(tmp_path, telegram, ["alpha"], "board")
    with serve:
        publish(tmp_path / "agents" / "alpha", "alpha v1")
        await eventually(lambda: "alpha v1" in board_text(telegram), what="the board")
        board = boards(telegram)[0].message_id
        text, routes = status(serve.config)
        assert f"{BOARD}\n  resident message: {board}\n" in text
        assert f"{ALPHA}\n{FOLLOWED}\n" in text
        assert (routes[BOARD]["chat_view"], routes[BOARD]["retired"]) == ("board", False)
        assert (routes[ALPHA]["message_id"], routes[ALPHA]["retired"]) == (None, True)

        telegram.inject_command(GROUP, "/taskcard cards")
        await eventually(
            lambda: "replaced by one card per agent" in boards(telegram)[0].text,
            what="the board's last word",
        )
        card = await eventually(
            lambda: [m for m in telegram.bot_messages(GROUP) if m.text.startswith("❔ alpha")],
            what="alpha's own card",
        )
        await eventually(
            lambda: status(serve.config)[1][BOARD]["message_id"] is None,
            what="the board let go",
        )
        text, routes = status(serve.config)
        assert f"{BOARD}\n{RETIRED_BOARD}\n" in text
        assert f"{ALPHA}\n  resident message: {card[0].message_id}\n" in text
        assert "(none yet)" not in text
        assert (routes[BOARD]["chat_view"], routes[BOARD]["retired"]) == ("cards", True)
        assert (routes[ALPHA]["chat_view"], routes[ALPHA]["retired"]) == ("cards", False)
        assert await serve.aterminate() == 0
    stopped, routes = status(serve.config)
    assert f"{BOARD}\n{RETIRED_BOARD}\n" in stopped and routes[BOARD]["retired"] is True
