"""Telegram sends whose outcome is unknown, end to end: `taskcard serve` against a fake Bot API
that answers late or drops the connection after posting the message.

The Bot API cannot deduplicate a send, so what is asserted is what people see: how many
messages each chat ends up showing for its agent (one chat per agent, so a chat's messages
are that agent's copies), never how many requests were made.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import ServeProcess, agents_lines, eventually, publish, run_cli
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

BASE_CHAT = -1009000000000


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(limits=FakeLimits.unlimited()) as server:
        yield server


def chat_of(index: int) -> int:
    return BASE_CHAT - index


def write_config(tmp_path: Path, fake: FakeTelegram, agents: list[str], extra: str = "") -> Path:
    """One group chat per agent; `extra` goes into the [telegram] section."""
    lines = [
        *agents_lines(tmp_path, agents),
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
        extra,
        "[telegram.limits]",
        "group_chat = { max_calls = 1000, period_s = 60.0 }",
    ]
    for index, agent in enumerate(agents):
        lines += ["[[telegram.routes]]", f"chat_id = {chat_of(index)}", f'agents = ["{agent}"]']
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def serve(config: Path, fake: FakeTelegram) -> ServeProcess:
    return ServeProcess(config, env={"TC_TEST_TOKEN": fake.token})


def copies(fake: FakeTelegram, index: int) -> list[str]:
    """The texts of the bot's messages the agent's chat shows."""
    return [m.text for m in fake.bot_messages(chat_of(index))]


def status(config: Path) -> dict[str, dict[str, Any]]:
    result = run_cli("status", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    return {route["agent"]: route for route in json.loads(result.stdout)["routes"]}


async def test_a_slow_send_answer_is_awaited_not_repeated(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # Edits give up after 1 s; the send answer takes 3 s and must still be awaited.
    config = write_config(tmp_path, fake, ["builder"], "request_timeout_s = 1")
    workdir = tmp_path / "agents" / "builder"
    fake.delay_answers("sendMessage", 3.0)
    with serve(config, fake) as service:
        publish(workdir, "first card")
        await eventually(
            lambda: (
                len(copies(fake, 0)) > 1
                or (copies(fake, 0) and status(config)["builder"]["message_id"])
            ),
            timeout_s=60,
            what="the send answered (or repeated)",
        )
        publish(workdir, "second card")
        await eventually(lambda: any("second card" in t for t in copies(fake, 0)), what="the edit")
        assert len(copies(fake, 0)) == 1, copies(fake, 0)
        assert await service.aterminate() == 0


async def test_lost_answers_leave_at_most_one_extra_copy(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    agents = ["builder", "other"]
    config = write_config(tmp_path, fake, agents)
    builder, other = (tmp_path / "agents" / agent for agent in agents)
    # Telegram posts each of these sends, but the answers never arrive.
    fake.drop_after_accept("sendMessage", 2)
    with serve(config, fake) as service:
        publish(builder, "builder v1")

        def held_or_over() -> bool:
            shown = len(copies(fake, 0))
            # The count is stored before each send goes out, so wait for the copy as well.
            return shown > 2 or (shown == 2 and bool(status(config)["builder"]["sends_held_until"]))

        await eventually(held_or_over, timeout_s=60, what="the builder's sends held (or more)")
        assert len(copies(fake, 0)) == 2, copies(fake, 0)
        assert status(config)["builder"]["unanswered_sends"] == 2
        # The other agent is served; a new builder card sends nothing more meanwhile.
        publish(builder, "builder v2")
        publish(other, "other v1")
        await eventually(lambda: any("other v1" in t for t in copies(fake, 1)), what="other")
        assert len(copies(fake, 0)) == 2, copies(fake, 0)
        service.kill()
    # The count survives a crash: the restart holds too.
    with serve(config, fake) as again:
        publish(builder, "builder v3")
        publish(other, "other v2")
        await eventually(lambda: any("other v2" in t for t in copies(fake, 1)), what="other")
        assert len(copies(fake, 0)) == 2, copies(fake, 0)
        assert len(copies(fake, 1)) == 1
        text = run_cli("status", "--config", str(config)).stdout
        assert "sends without an answer: 2" in text and "sends held until" in text
        assert await again.aterminate() == 0


async def test_sigkill_loop_with_slow_answers_bounds_copies(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    early = [f"early{i}" for i in range(3)]
    late = [f"late{i}" for i in range(3)]
    agents = early + late
    config = write_config(tmp_path, fake, agents)
    index = {agent: i for i, agent in enumerate(agents)}

    def workdir(agent: str) -> Path:
        return tmp_path / "agents" / agent

    def have(agent_list: list[str], count: int) -> bool:
        return all(len(copies(fake, index[a])) >= count for a in agent_list)

    # Answers so slow that every send is cut short by the next SIGKILL.
    fake.delay_answers("sendMessage", 60.0)
    with serve(config, fake) as first:
        for agent in early:
            publish(workdir(agent), f"{agent} v1")
        await eventually(lambda: have(early, 1), what="the early agents' first sends")
        first.kill()
    with serve(config, fake) as second:
        for agent in late:
            publish(workdir(agent), f"{agent} v1")
        # The early agents retry once (their send before the crash counts); the late start.
        await eventually(
            lambda: have(early, 2) and have(late, 1), what="one retry and the late sends"
        )
        second.kill()
    # A slow but answered send from now on.
    fake.delay_answers("sendMessage", 1.0)
    with serve(config, fake) as third:
        for agent in agents:
            publish(workdir(agent), f"{agent} FINAL")

        def settled() -> bool:
            if any(len(copies(fake, i)) > 2 for i in index.values()):
                return True  # already over the bound: fail below with the counts
            landed = all(any("FINAL" in t for t in copies(fake, index[a])) for a in late)
            routes = status(config)
            return landed and all(routes[a]["sends_held_until"] for a in early)

        await eventually(settled, timeout_s=90, what="late cards landed, early sends held")
        counts = {agent: len(copies(fake, i)) for agent, i in index.items()}
        assert all(count == 2 for count in counts.values()), counts
        for agent in late:
            assert sum("FINAL" in t for t in copies(fake, index[agent])) == 1
        assert await third.aterminate() == 0
