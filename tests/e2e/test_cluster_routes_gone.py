"""A route that goes while a cluster is stopped, end to end: two `taskcard serve` instances
configured with the same agent (one serves it, the other stands by) share the fake Bot API
and a real `redis-server`. The operator stops both, takes a chat's routes out of both files,
and starts them again: the card there says once that the chat no longer follows the agent,
edited by the instance that holds the agent's lease alone, and not again by the standby
when it takes the agent over."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

from tests.e2e.harness import ServeProcess, eventually, publish
from tests.e2e.test_cluster import cluster_lines
from tests.e2e.test_reload_routes import UNROUTED, WAIT_S
from tests.fakes.telegram_api import FakeTelegram

KEPT, DROPPED = -1005555555555, -1006666666666
NAMES = ("m0", "m1")
# Served by both instances; each instance also has an agent of its own, `solo<n>`, which
# sorts after it: an instance's owed cards in a chat are taken in that order.
SHARED = "alpha"
SERVES = f"agent {SHARED}: this instance serves it now"
OWED = "of routes the configuration no longer has"
TOLD = "its card says already that it is no longer followed"


def solo(name: str) -> str:
    return f"solo{name[-1]}"


def write_member(
    tmp_path: Path, name: str, fake: FakeTelegram, prefix: str, chats: list[int]
) -> Path:
    """Instance `name`'s config (its own folder and state): agents `alpha` and its own
    (their workdirs under `tmp_path/agents`), both routed to each of `chats`."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    lines = [f'state_dir = "{folder / "state"}"']
    agents = [SHARED, solo(name)]
    for agent in agents:
        workdir = tmp_path / "agents" / agent
        workdir.mkdir(parents=True, exist_ok=True)
        lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "{workdir}"']
    lines += [
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
    ]
    for chat in chats:
        lines += ["[[telegram.routes]]", f"chat_id = {chat}", f"agents = {json.dumps(agents)}"]
    lines += cluster_lines(name, prefix)
    config = folder / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def card_of(fake: FakeTelegram, chat: int, agent: str) -> tuple[int, str] | None:
    found = [
        (m.message_id, m.text)
        for m in fake.bot_messages(chat)
        if agent in m.text.split("\n")[0].split()
    ]
    return found[0] if len(found) == 1 else None


def edits_of(fake: FakeTelegram, chat: int, message_id: int) -> int:
    """The edit requests the fake received for the message (answered or not)."""
    return sum(
        1
        for r in fake.requests
        if r.method == "editMessageText"
        and r.chat_id == chat
        and str(r.params.get("message_id")) == str(message_id)
    )


async def test_a_route_gone_while_a_cluster_was_stopped_is_told_once_by_the_agents_owner(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str
) -> None:
    fake = telegram
    env = {"TC_TEST_TOKEN": fake.token, "TC_REDIS_URL": redis_url}
    configs = {n: write_member(tmp_path, n, fake, prefix, [KEPT, DROPPED]) for n in NAMES}
    agents = [SHARED, *(solo(n) for n in NAMES)]
    with ExitStack() as fleet:
        for name in NAMES:
            fleet.enter_context(ServeProcess(configs[name], env=env))
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} step 1")
        await eventually(
            lambda: all(
                f"{agent} step 1" in (card_of(fake, chat, agent) or (0, ""))[1]
                for chat in (KEPT, DROPPED)
                for agent in agents
            ),
            timeout_s=WAIT_S,
            what="every agent's card in both chats",
        )
    cards = {agent: card_of(fake, DROPPED, agent) for agent in agents}
    shared_card = cards[SHARED]
    assert shared_card is not None

    for name in NAMES:
        write_member(tmp_path, name, fake, prefix, [KEPT])
    fake.reset_counters()
    with ExitStack() as fleet:
        serves = {n: fleet.enter_context(ServeProcess(configs[n], env=env)) for n in NAMES}
        # Each instance tells its own agent's card after the shared one's, had it taken that.
        await eventually(
            lambda: all(
                UNROUTED in (card_of(fake, DROPPED, agent) or (0, ""))[1] for agent in agents
            ),
            timeout_s=WAIT_S,
            what="every card in the dropped chat saying it no longer follows its agent",
        )
        [owner] = [n for n, serve in serves.items() if SERVES in serve.logs]
        [standby] = [n for n in NAMES if n != owner]
        assert OWED in serves[owner].logs
        assert edits_of(fake, DROPPED, shared_card[0]) == 1, "edited by its owner alone"

        # The owner stops: the standby takes the agent over. When its start found the card
        # untold too (most often: both start at once), it looks again before the edit.
        assert await serves[owner].aterminate() == 0
        await eventually(lambda: SERVES in serves[standby].logs, what="the take-over")
        if OWED in serves[standby].logs:
            await eventually(
                lambda: TOLD in serves[standby].logs,
                timeout_s=WAIT_S,
                what="the standby finding the card told already",
            )
        publish(tmp_path / "agents" / SHARED, f"{SHARED} step 2")
        await eventually(
            lambda: f"{SHARED} step 2" in (card_of(fake, KEPT, SHARED) or (0, ""))[1],
            timeout_s=WAIT_S,
            what="the standby serving the agent",
        )
        assert edits_of(fake, DROPPED, shared_card[0]) == 1, "not told a second time"
        assert len(fake.bot_messages(DROPPED)) == len(agents), "no new message"
