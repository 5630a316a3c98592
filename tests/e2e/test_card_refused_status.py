"""A card the platform refuses for good shows in `taskcard status`, until a later one goes
through.

Telegram's "message is too long" on every try, or an entity error that the plain-text retry
meets again, and Feishu's content-too-long code were only a line in serve's log: the chat kept
showing the previous card, and nothing an operator looks at said so. Driven through `taskcard
serve` against the fake Bot API and the fake Feishu, then `taskcard status` (text and JSON).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import ServeProcess, eventually, publish, run_cli
from tests.e2e.test_serve_feishu import CHAT, Setup, card_texts
from tests.e2e.test_serve_telegram import GROUP, PRIVATE, agent_dir, setup, shown
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

REFUSED = "CARD REFUSED"


def status_text(config: Path) -> str:
    result = run_cli("status", "--config", str(config))
    assert result.returncode == 0, result.stderr
    return result.stdout


def status_routes(config: Path) -> dict[str, dict[str, Any]]:
    result = run_cli("status", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    return {route["route"]: route for route in json.loads(result.stdout)["routes"]}


def route_block(status: str, route: str) -> str:
    """The lines `taskcard status` prints under one route."""
    lines = status.splitlines()
    start = lines.index(route)
    block = [route]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return "\n".join(block)


@pytest.mark.parametrize(
    ("description", "reason"),
    [
        ("Bad Request: message is too long", "message is too long"),
        # Refused with entities and again as plain text: the retry meets the same answer.
        ("Bad Request: can't parse entities: unsupported start tag", "can't parse entities"),
    ],
)
async def test_a_telegram_card_refused_for_good_shows_in_status_until_one_goes_through(
    tmp_path: Path, telegram: FakeTelegram, description: str, reason: str
) -> None:
    serve = setup(tmp_path, telegram, ["builder"], [(GROUP, ["builder"]), (PRIVATE, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    refused_route, other_route = f"telegram:{GROUP}::builder", f"telegram:{PRIVATE}::builder"
    with serve:
        publish(workdir, "v1")
        await eventually(lambda: shown(telegram, GROUP) and shown(telegram, PRIVATE), what="v1")
        telegram.fail_chat(GROUP, 400, description)
        publish(workdir, "v2")
        await eventually(lambda: any("v2" in t for t in shown(telegram, PRIVATE)), what="v2")
        status = await eventually(
            lambda: (lambda text: text if REFUSED in text else "")(status_text(serve.config)),
            timeout_s=60,
            what="the refusal in taskcard status",
        )
        assert await serve.aterminate() == 0
    block = route_block(status, refused_route)
    assert f"{REFUSED} (agent builder)" in block, status
    assert reason in block.lower(), block
    assert "the chat shows the last card that went through" in block
    assert REFUSED not in route_block(status, other_route)
    assert telegram.token.split(":", 1)[1] not in status
    # Kept while the service is stopped: it is the state's, not the running process's.
    routes = status_routes(serve.config)
    refusal = routes[refused_route]["card_refused"]
    assert refusal is not None and reason in refusal["reason"].lower(), refusal
    assert refusal["since"].endswith("Z")
    assert routes[refused_route]["agent"] == "builder"
    assert routes[other_route]["card_refused"] is None

    # The platform takes cards again: the next one goes through and the refusal is gone.
    telegram.clear_failures()
    again = ServeProcess(serve.config, env={"TC_TEST_TOKEN": telegram.token})
    with again:
        publish(workdir, "v3")
        await eventually(lambda: any("v3" in t for t in shown(telegram, GROUP)), what="v3")
        await eventually(
            lambda: REFUSED not in status_text(again.config), what="the refusal cleared"
        )
        assert await again.aterminate() == 0
    assert status_routes(serve.config)[refused_route]["card_refused"] is None


async def test_a_feishu_card_refused_for_good_shows_in_status_until_one_goes_through(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup_ = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    route = f"feishu:{CHAT}::builder"
    with setup_.serve() as serve:
        publish(workdir, "v1")
        await eventually(lambda: any("v1" in t for t in card_texts(feishu)), what="v1")
        feishu.fail_chat(CHAT, 230025, msg="The message content exceeds the length limit.")
        publish(workdir, "v2")
        status = await eventually(
            lambda: (lambda text: text if REFUSED in text else "")(status_text(setup_.config)),
            timeout_s=60,
            what="the refusal in taskcard status",
        )
        block = route_block(status, route)
        assert f"{REFUSED} (agent builder)" in block, status
        assert "exceeds the length limit" in block, block
        assert feishu.app_secret not in status
        refusal = status_routes(setup_.config)[route]["card_refused"]
        assert refusal is not None and "230025" in refusal["reason"], refusal
        feishu.clear_scripts()
        publish(workdir, "v3")
        await eventually(lambda: any("v3" in t for t in card_texts(feishu)), what="v3")
        await eventually(
            lambda: REFUSED not in status_text(setup_.config), what="the refusal cleared"
        )
        assert status_routes(setup_.config)[route]["card_refused"] is None
        assert await serve.aterminate() == 0


async def test_a_refusal_keeps_when_it_began_and_says_when_no_card_was_shown(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """The route's first card refused: no card went through, and status says so rather than
    that the chat shows the last one. Telegram words an entity error with the byte offset,
    which moves with each card: the refusal's reason follows it, its `since` does not."""
    serve = setup(tmp_path, telegram, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    route = f"telegram:{GROUP}::builder"
    offset = "Bad Request: can't find end of the entity starting at byte offset {}"
    with serve:
        telegram.fail_chat(GROUP, 400, offset.format(12))
        publish(workdir, "v1")
        first = await eventually(
            lambda: status_routes(serve.config)[route]["card_refused"],
            timeout_s=60,
            what="the first card refused",
        )
        assert "offset 12" in first["reason"], first
        block = route_block(status_text(serve.config), route)
        assert "no card of the route was shown yet" in block, block
        assert "the last card that went through" not in block
        since = datetime.fromisoformat(first["since"])
        # The next refusal comes in a later second than the first (status shows seconds).
        await eventually(lambda: datetime.now(UTC) >= since + timedelta(seconds=2), what="time")
        telegram.fail_chat(GROUP, 400, offset.format(34))
        publish(workdir, "v2")
        later = await eventually(
            lambda: (lambda r: r if r and "offset 34" in r["reason"] else None)(
                status_routes(serve.config)[route]["card_refused"]
            ),
            timeout_s=60,
            what="the second refusal",
        )
        assert later["since"] == first["since"], (first, later)
        assert shown(telegram, GROUP) == []
        assert await serve.aterminate() == 0
