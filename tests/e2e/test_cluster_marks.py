"""A chat's orchestrator mark that only another instance's routed record says, on the board,
through two `taskcard serve` processes on a real Redis against the fake Bot API and Feishu.

i0 sends the chat's board (started first, it holds the board's lease) and serves i0agent;
i1 routes every agent it finds to the chat and, after a reload, marks i0agent as the chat's
orchestrator: a mark i0 learns only from i1's routed record, at a lease renewal, with no
other change in the chat. The board, composed before the mark arrived, shows it then.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, eventually, publish
from tests.e2e.test_cluster import instance
from tests.e2e.test_talk_and_signals import GROUP
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

ROUTED = 'agents = ["*"]'
MARK = 'orchestrator = "i0agent"'
TOPIC = 42


@pytest.fixture(params=["telegram", "feishu"])
def platform(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def finding(config: Path, tmp_path: Path) -> None:
    """`config`'s route takes every agent, discovered under an empty folder: it may mark an
    agent another instance serves."""
    found = tmp_path / "found"
    found.mkdir()
    text = config.read_text()
    config.write_text(f"{text.rstrip()}\n[discover]\nroots = [{json.dumps(str(found))}]\n")


def marked_lines(boards: list[str]) -> list[str]:
    return [line for board in boards for line in board.splitlines() if "🎯 orchestrator" in line]


async def mark_arrives(
    i1: ServeProcess, boards: Callable[[], list[str]], *, routed: str = ROUTED
) -> None:
    """With both lines on the board and none marked, i1's reload marks i0agent (on the route
    `routed` names): i0agent's line on the board shows the mark."""
    await eventually(
        lambda: any("card of i1" in board for board in boards()), timeout_s=60, what="i1's line"
    )
    assert marked_lines(boards()) == [], boards()
    i1.config.write_text(i1.config.read_text().replace(routed, f"{routed}\n{MARK}", 1))
    i1.proc.send_signal(signal.SIGHUP)
    found = await eventually(
        lambda: marked_lines(boards()), timeout_s=60, what="i0agent's line marked"
    )
    assert all("i0agent" in line for line in found), found


async def test_a_mark_only_another_instances_record_says_shows_on_the_board(
    platform: str, telegram: FakeTelegram, feishu: FakeFeishu, tmp_path: Path, redis_url: str,
    prefix: str, fleet: ExitStack,
) -> None:  # fmt: skip
    """The board's sender took its marks from its own routes and the lines (each line says
    whether its writer's route marks its agent); i1 does not serve i0agent, so i0agent's
    line never said so, and the board marked nobody. Now the other instances' routed records
    count too, and the board is composed again when they change."""
    if platform == "telegram":

        def start(name: str) -> ServeProcess:
            serve = instance(
                tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url,
                prefix=prefix, view="board",
            )  # fmt: skip
            if name == "i1":
                text = serve.config.read_text()
                serve.config.write_text(text.replace('agents = ["i1agent"]', ROUTED))
                finding(serve.config, tmp_path)
            fleet.enter_context(serve)
            publish(tmp_path / "agents" / f"{name}agent", f"card of {name}")
            return serve

        def boards() -> list[str]:
            return [m.text for m in telegram.bot_messages(GROUP) if "card of i0" in m.text]

    else:
        from tests.e2e.test_cluster import feishu_instance
        from tests.e2e.test_serve_feishu import card_texts

        def start(name: str) -> ServeProcess:
            setup = feishu_instance(tmp_path, name, feishu, redis_url=redis_url, prefix=prefix)
            setup.config.write_text(
                setup.config.read_text().replace(ROUTED, f'{ROUTED}\nview = "board"')
            )
            if name == "i1":
                finding(setup.config, tmp_path)
            serve = fleet.enter_context(setup.serve())
            publish(tmp_path / name / "agents" / f"{name}agent", f"card of {name}")
            return serve

        def boards() -> list[str]:
            return [text for text in card_texts(feishu) if "card of i0" in text]

    start("i0")
    await eventually(boards, timeout_s=60, what="i0's board")
    await mark_arrives(start("i1"), boards)


async def test_in_a_forum_topic_the_whole_chats_mark_applies(
    telegram: FakeTelegram, tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """i0's route is the forum topic's, i1's the whole chat's (and the topic's, marking
    nobody there). A chat's answers fall back from a topic to the whole chat; the marks
    learned from the other instances' routes did not, and the topic's board marked nobody.
    (Feishu routes name a chat, not a thread: there is no such fallback to test there.)"""
    serves: dict[str, ServeProcess] = {}
    for name in ("i0", "i1"):
        serve = instance(
            tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url, prefix=prefix,
            view="board",
        )  # fmt: skip
        text = serve.config.read_text()
        chat = f"chat_id = {GROUP}\n"
        if name == "i0":
            text = text.replace(chat, f"{chat}thread_id = {TOPIC}\n")
        else:
            # Its agent's line in the topic, and the whole chat's route, with no agent of
            # its own there, marking i0agent after the reload.
            whole = f"[[telegram.routes]]\n{chat}{ROUTED}\n"
            text = text.replace(chat, f"{chat}thread_id = {TOPIC}\n").replace(
                "[cluster]", f"{whole}[cluster]"
            )
        serve.config.write_text(text)
        if name == "i1":
            finding(serve.config, tmp_path)
        serves[name] = fleet.enter_context(serve)
        publish(tmp_path / "agents" / f"{name}agent", f"card of {name}")
        if name == "i0":
            await eventually(
                lambda: telegram.bot_messages(GROUP, thread_id=TOPIC), timeout_s=60,
                what="i0's board in the topic",
            )  # fmt: skip

    def boards() -> list[str]:
        return [
            m.text for m in telegram.bot_messages(GROUP, thread_id=TOPIC) if "card of i0" in m.text
        ]

    await mark_arrives(serves["i1"], boards, routed=f"chat_id = {GROUP}\n{ROUTED}")
