"""The last edits a start owes go out in a chat that is never idle, end to end: `taskcard
serve` with a config file against the fake Telegram Bot API and the fake Feishu Open API,
each with a small limit that the service is configured with too, the chats read as people
see them. They wait for the chat's lane to have nothing else to do, so the live cards go
first; in a chat whose cards change faster than its limit lets them out that never comes,
and they waited for good. Past a bound tied to the chat's pace one goes ahead of the live
cards, without a 429."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, agents_lines, eventually, publish
from tests.e2e.test_reload_routes import UNROUTED, WAIT_S, card_of, cards, write_config
from tests.fakes import feishu_api, telegram_api
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram, Window

TELEGRAM_CHAT = -1005555555555
FEISHU_CHAT = "oc_busy_chat"
BUSY = ["alpha", "gamma", "delta"]
# The last edit of the card of an agent that left the configuration.
RETIRED = "Agent retired"  # their route stays, their cards change all the time
# One message a second at most in the chat (Telegram: the group's; Feishu: the app's, as
# each card's own limit lets three cards catch up together), so three cards that change
# four times a second keep its lane busy for good.
TELEGRAM_LIMITS = "[telegram.limits]\ngroup_chat = { max_calls = 2, period_s = 2.0 }"
FEISHU_LIMITS = "[feishu.limits]\napp = { max_calls = 2, period_s = 2.0 }"


@contextlib.asynccontextmanager
async def fake_with_small_limit(platform: str) -> AsyncIterator[FakeTelegram | FakeFeishu]:
    if platform == "telegram":
        limits = telegram_api.FakeLimits(
            private_chat=Window(1, 1.0), group_chat=Window(2, 2.0), bot=Window(30, 1.0)
        )
        async with FakeTelegram(limits=limits) as telegram:
            yield telegram
    else:
        async with FakeFeishu(limits=feishu_api.FakeLimits(app=2, window_s=2.0)) as feishu:
            yield feishu


def refused_429(fake: FakeTelegram | FakeFeishu) -> int:
    if isinstance(fake, FakeTelegram):
        return len(fake.rate_limited)
    return sum(r.http_status == 429 or r.code == 230020 for r in fake.requests)


def step_shown(fake: FakeTelegram | FakeFeishu, chat: object, agent: str) -> int:
    """The step `agent`'s card in `chat` shows (-1 while it shows none)."""
    found = card_of(fake, chat, agent)
    steps = re.findall(rf"{agent} step (\d+)", "" if found is None else found[1])
    return int(steps[-1]) if steps else -1


async def keep_changing(tmp_path: Path, agents: Sequence[str]) -> None:
    """Each of `agents` publishes a new card four times a second, until cancelled."""
    step = 0
    while True:
        step += 1
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} step {step}")
        await asyncio.sleep(0.25)  # the pace of the producers, not a synchronisation


@pytest.mark.parametrize("left", ["route", "configuration"])
@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_card_a_start_owes_its_last_edit_gets_it_in_a_chat_that_stays_busy(
    tmp_path: Path, platform: str, left: str
) -> None:
    """beta leaves a chat's route, or the configuration, while the service is stopped;
    alpha, gamma and delta stay there and change faster than the chat's limit lets their
    cards out, before and after the restart. beta's card still says the chat no longer
    follows beta, or that beta retired, while they go on changing, and the chat's limit
    draws no 429."""
    chat: object = TELEGRAM_CHAT if platform == "telegram" else FEISHU_CHAT
    limits = TELEGRAM_LIMITS if platform == "telegram" else FEISHU_LIMITS
    everyone = [*BUSY, "beta"]
    async with fake_with_small_limit(platform) as fake:
        config, env = write_config(tmp_path, fake, [(chat, everyone)], (limits,))
        # `write_config` names alpha and beta: gamma and delta are configured too.
        more = agents_lines(tmp_path, ["gamma", "delta"])[1:]
        config.write_text(config.read_text() + "\n".join(more) + "\n")
        busy: asyncio.Task[None] | None = None
        try:
            with ServeProcess(config, env=env) as serve:
                for agent in everyone:
                    publish(tmp_path / "agents" / agent, f"{agent} step 0")
                await eventually(
                    lambda: all(card_of(fake, chat, agent) for agent in everyone),
                    timeout_s=WAIT_S,
                    what="every agent's card",
                )
                # Busy from before the stop on: the chat's windows are full when it starts.
                busy = asyncio.create_task(keep_changing(tmp_path, BUSY))
                await eventually(
                    lambda: all(step_shown(fake, chat, agent) >= 2 for agent in BUSY),
                    timeout_s=WAIT_S,
                    what="the busy cards changing",
                )
                assert await serve.aterminate() == 0
            beta_card = card_of(fake, chat, "beta")
            assert beta_card is not None

            config.write_text(config.read_text().replace(json.dumps(everyone), json.dumps(BUSY)))
            if left == "configuration":
                beta = '[[agents]]\nid = "beta"\nworkdir = "agents/beta"\n'
                assert beta in config.read_text()
                config.write_text(config.read_text().replace(beta, ""))
            said = UNROUTED if left == "route" else RETIRED
            with ServeProcess(config, env=env) as serve:
                await eventually(
                    lambda: said in cards(fake, chat).get(beta_card[0], ""),
                    timeout_s=WAIT_S,
                    what=f"beta's card saying {said!r}",
                )
                shown = {agent: step_shown(fake, chat, agent) for agent in BUSY}
                await eventually(
                    lambda: any(step_shown(fake, chat, agent) > shown[agent] for agent in BUSY),
                    timeout_s=WAIT_S,
                    what="the live cards going on after it",
                )
                assert not busy.done(), "the chat stayed busy"
                assert await serve.aterminate() == 0
        finally:
            if busy is not None:
                busy.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await busy
        assert said not in "".join(
            text for ident, text in cards(fake, chat).items() if ident != beta_card[0]
        )
        assert refused_429(fake) == 0
