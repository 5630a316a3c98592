"""How `/tell` and replies find the agent and the text a person meant, through `taskcard serve`.

Both platforms run through the chat adapters of `test_talk_and_signals` (the fake Telegram
Bot API and the fake Feishu Open API); the text reaches the agent's `inbox/queued/`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import eventually
from tests.e2e.test_talk_and_signals import (
    chat_for,
    platform,
    queued,
    running_agent,
    running_card_shown,
    wait_said,
    wait_status,
)

__all__ = ["platform"]  # the fixture, parametrized over both platforms


def texts_queued(tmp_path: Path, agent: str) -> list[str]:
    return [json.loads(p.read_text())["text"] for p in queued(tmp_path, agent)]


async def test_a_tell_finds_the_agent_whatever_the_case_and_asks_when_two_differ_only_so(
    platform: str, tmp_path: Path
) -> None:
    # `/tell Builder hi` was refused as naming no agent of the chat, and `builder` listed as
    # the one to use. A name is matched exactly first, else regardless of case; when several
    # agents differ only in case, the answer names them and nothing is queued.
    async with chat_for(platform, tmp_path, ["builder", "Keeper", "keeper"]) as chat:
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await chat.say("/tell Builder look at the logs")
            await wait_status(chat, "queued")
            assert texts_queued(tmp_path, "builder") == ["look at the logs"]
            await chat.say("/tell KEEPER roll back")
            answer = await wait_said(chat, "differ only in case", "the question")
            assert "Keeper, keeper" in answer and "KEEPER" not in answer
            await chat.say("/tell keeper roll back")
            await eventually(lambda: texts_queued(tmp_path, "keeper"), what="keeper's text")
            # A look-alike is no name: a Kelvin sign folds to "k" but names no agent.
            await chat.say("/tell \u212aeeper nothing")
            await wait_said(chat, "AGENT is one of Keeper, builder, keeper.", "the refusal")
            assert texts_queued(tmp_path, "Keeper") == []
            assert texts_queued(tmp_path, "keeper") == ["roll back"]
            assert texts_queued(tmp_path, "builder") == ["look at the logs"]
            assert await chat.serve.aterminate() == 0
