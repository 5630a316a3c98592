"""A chat's board in a cluster, end to end: instances sharing one real Redis, each serving
some of the chat's agents, against the fake Bot API and the fake Feishu Open API. One board
per chat, listing every agent whichever instance serves it, sent by one instance."""

from __future__ import annotations

import html
import json
import signal
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from taskcard.channels.base import UNOBSERVED_NOTE
from tests.e2e.harness import eventually, notify, publish
from tests.e2e.test_cluster import feishu_instance, instance
from tests.e2e.test_cluster_inbound import AnswerLosingProxy
from tests.e2e.test_serve_board import (
    BOARD_TITLE,
    RETIRED_NOTE,
    feishu_board,
    feishu_card_of,
    feishu_cards,
)
from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY
from tests.e2e.test_serve_telegram import GROUP
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram, StoredMessage
from tests.redis_server import RedisServer, have_redis, private_redis


def boards(fake: FakeTelegram) -> list[StoredMessage]:
    """The board messages of the group, as Telegram formats them (a title mark, then the
    title)."""
    return [m for m in fake.bot_messages(GROUP) if m.text[2:].startswith(BOARD_TITLE)]


def board_text(fake: FakeTelegram) -> str:
    found = boards(fake)
    return found[0].text if len(found) == 1 else ""


def line_of(fake: FakeTelegram, agent: str) -> str:
    """The board's line of `agent` ('' when the board has none)."""
    return next((line for line in board_text(fake).splitlines() if f" {agent} · " in line), "")


def unobserved(fake: FakeTelegram, agent: str) -> bool:
    """Whether the board shows `agent` as no instance's any more (its instance died)."""
    return f"{agent} · unknown · {UNOBSERVED_NOTE}" in line_of(fake, agent)


async def test_a_clustered_board_keeps_the_platforms_formatting(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    # The relay that wraps each channel in a cluster used to fall back to the plain-text
    # board of the base class: no title mark, no bold, on Telegram.
    fleet.enter_context(
        instance(tmp_path, "i0", telegram, ["alpha"], redis_url=redis_url, prefix=prefix,
                 view="board")
    )  # fmt: skip
    publish(tmp_path / "agents" / "alpha", "**alpha** step 1")
    await eventually(lambda: "alpha step 1" in board_text(telegram), what="the board")
    (board,) = boards(telegram)
    assert any(e["type"] == "bold" for e in board.entities)


async def test_one_board_lists_the_agents_of_every_instance(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    # Each instance composed the board of its own agents into the one shared message: the
    # board showed one instance's half, then the other's.
    split = {"i0": ["alpha", "bravo"], "i1": ["charlie", "delta"]}
    # Left in Redis by an instance dead for longer than a line of it is kept (found
    # unobserved over a day ago), and by something else: neither shows.
    ghost = {
        "agent_id": "ghost", "state": "running", "marks": ["waiting"], "headline": "boo",
        "movement": None, "movement_at": None, "started": True,
    }  # fmt: skip
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.hset(
            f"{prefix}:board:telegram:{GROUP}:",
            mapping={
                "ghost": json.dumps({"writer": "gone#1", "line": ghost, "lost_at": 1e9}),
                "junk": "{",
            },
        )
    finally:
        client.close()
    serves = [
        fleet.enter_context(
            instance(
                tmp_path, name, telegram, agents, redis_url=redis_url, prefix=prefix, view="board"
            )
        )
        for name, agents in split.items()
    ]
    every = [agent for agents in split.values() for agent in agents]
    for agent in every:
        publish(tmp_path / "agents" / agent, f"**{agent}** step 1")
    await eventually(
        lambda: all(f"{a} step 1" in board_text(telegram) for a in every),
        timeout_s=60,
        what="every agent of both instances on the one board",
    )
    assert "4 agents" in board_text(telegram)
    assert "ghost" not in board_text(telegram)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:  # the dead instance's line kept past its time is removed
        assert client.hget(f"{prefix}:board:telegram:{GROUP}:", "ghost") is None
    finally:
        client.close()
    for agent in ("alpha", "delta"):  # one agent of each instance moves on
        publish(tmp_path / "agents" / agent, f"**{agent}** step 2")
        await eventually(
            lambda agent=agent: f"{agent} step 2" in board_text(telegram),
            timeout_s=60,
            what=f"the board edited for {agent}",
        )
        assert "4 agents" in board_text(telegram)
    assert len(telegram.bot_messages(GROUP)) == 1, "one board, no card per agent"
    assert telegram.count("sendMessage") == 1
    for serve in serves:
        assert await serve.aterminate() == 0
        assert " WARNING " not in serve.logs and " ERROR " not in serve.logs, serve.logs


SENDS_BOARD = "this instance sends its board now"


@pytest.mark.parametrize(
    ("which", "how"),
    [("sender", "kill"), ("sender", "stop"), ("other", "kill")],
)
async def test_an_instance_gone_its_agents_stay_on_the_one_board_unless_it_stopped(
    tmp_path: Path,
    telegram: FakeTelegram,
    redis_url: str,
    prefix: str,
    fleet: ExitStack,
    which: str,
    how: str,
) -> None:
    # The board's sender (or the other instance) is killed or stopped: the board goes on in
    # the same message, sent by whoever is left. A stopped instance's agent leaves it (the
    # operator chose so); a dead one's stays, marked as observed by no instance now (its line
    # silently left the board).
    split = {"i0": ["alpha"], "i1": ["bravo"]}
    serves = {
        name: fleet.enter_context(
            instance(
                tmp_path, name, telegram, agents, redis_url=redis_url, prefix=prefix, view="board"
            )
        )
        for name, agents in split.items()
    }
    for agents in split.values():
        publish(tmp_path / "agents" / agents[0], f"**{agents[0]}** step 1")
    await eventually(
        lambda: "alpha step 1" in board_text(telegram) and "bravo step 1" in board_text(telegram),
        timeout_s=60,
        what="both agents on the board",
    )
    sender = next(name for name, serve in serves.items() if SENDS_BOARD in serve.logs)
    gone = sender if which == "sender" else next(name for name in serves if name != sender)
    (survivor,) = (name for name in serves if name != gone)
    if how == "kill":
        serves[gone].kill()
    else:
        assert await serves[gone].aterminate() == 0
    await eventually(lambda: SENDS_BOARD in serves[survivor].logs, timeout_s=60, what="takeover")
    agent, gone_agent = split[survivor][0], split[gone][0]
    publish(tmp_path / "agents" / agent, f"**{agent}** after {which} {how}")
    if how == "kill":
        await eventually(
            lambda: (
                f"{agent} after {which} {how}" in board_text(telegram)
                and unobserved(telegram, gone_agent)
            ),
            timeout_s=60,
            what="the board edited by the survivor, the dead instance's agent not observed",
        )
        assert f"{gone_agent} step 1" in line_of(telegram, gone_agent), "what it last showed"
        assert "2 agents" in board_text(telegram)
        assert UNOBSERVED_NOTE not in line_of(telegram, agent)
    else:
        await eventually(
            lambda: (
                f"{agent} after {which} {how}" in board_text(telegram)
                and gone_agent not in board_text(telegram)
            ),
            timeout_s=60,
            what="the board edited by the survivor, without the stopped instance's agent",
        )
        assert "1 agent" in board_text(telegram)
    assert len(telegram.bot_messages(GROUP)) == 1, "the same board message, edited"
    assert telegram.count("sendMessage") == 1


async def test_feishu_one_board_of_both_instances_and_cards_switched_once(
    tmp_path: Path, feishu: FakeFeishu, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    setups = []
    for name in ("i0", "i1"):
        setup = feishu_instance(tmp_path, name, feishu, redis_url=redis_url, prefix=prefix)
        text = setup.config.read_text().replace('agents = ["*"]', 'agents = ["*"]\nview = "board"')
        setup.config.write_text(text)
        fleet.enter_context(setup.serve())
        publish(tmp_path / name / "agents" / f"{name}agent", f"# {name}agent phase 1")
        setups.append(setup)
    await eventually(
        lambda: all(f"{n}agent phase 1" in feishu_board(feishu) for n in ("i0", "i1")),
        timeout_s=60,
        what="both instances' agents on the one board",
    )
    publish(tmp_path / "i1" / "agents" / "i1agent", "# i1agent phase 2")
    await eventually(
        lambda: "i1agent phase 2" in feishu_board(feishu) and "i0agent" in feishu_board(feishu),
        timeout_s=60,
        what="the board edited for the change of one instance's agent",
    )
    assert len(feishu_cards(feishu)) == 1, "one board, no card per agent"

    answer = await feishu.deliver_command(
        setups[0].url, CHAT, "/taskcard cards", verification_token=VERIFY, encrypt_key=ENCRYPT
    )
    assert answer.status == 200
    await eventually(
        lambda: "replaced by one card per agent" in feishu_board(feishu),
        timeout_s=60,
        what="the board retired",
    )
    await eventually(
        lambda: all(feishu_card_of(feishu, f"{n}agent") for n in ("i0", "i1")),
        timeout_s=60,
        what="one card per agent, from each instance",
    )
    assert len(feishu_cards(feishu)) == 3
    assert sum("one task card per agent" in t for t in feishu.texts(CHAT)) == 1, "answered once"


async def test_a_board_key_of_another_type_is_named_once_and_deleting_it_is_enough(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    key = f"{prefix}:board:telegram:{GROUP}:"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.set(key, "left by another program")
    serve = fleet.enter_context(
        instance(tmp_path, "i0", telegram, ["alpha"], redis_url=redis_url, prefix=prefix,
                 view="board")
    )  # fmt: skip
    publish(tmp_path / "agents" / "alpha", "**alpha** step 1")
    await eventually(
        lambda: f"the Redis key {key} is a string, not the hash" in serve.logs,
        timeout_s=60,
        what="the key named",
    )
    assert boards(telegram) == []
    publish(tmp_path / "agents" / "alpha", "**alpha** step 2")
    client.delete(key)
    client.close()
    await eventually(
        lambda: "alpha step 2" in board_text(telegram), timeout_s=60, what="the board, once deleted"
    )
    # Tried at every change and lease renewal meanwhile, named once.
    assert serve.logs.count(f"DEL {key}") == 1
    assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs


async def test_a_standby_keeps_its_agents_line_and_commands_act_once_on_the_board(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    split = {"i0": ["alpha", "shared"], "i1": ["bravo", "shared"]}
    serves = {
        name: fleet.enter_context(
            instance(
                tmp_path, name, telegram, agents, redis_url=redis_url, prefix=prefix, view="board"
            )
        )
        for name, agents in split.items()
    }
    for agent in ("alpha", "bravo", "shared"):
        publish(tmp_path / "agents" / agent, f"**{agent}** step 1")
    await eventually(
        lambda: all(f"{a} step 1" in board_text(telegram) for a in ("alpha", "bravo", "shared")),
        timeout_s=60,
        what="three agents",
    )
    assert "3 agents" in board_text(telegram)
    # A standby (`shared` is configured on both) and commands received by one instance.
    telegram.inject_command(GROUP, "/taskcard off")
    await eventually(
        lambda: any("board hidden" in m.text for m in telegram.bot_messages(GROUP)),
        timeout_s=60,
        what="hidden",
    )
    telegram.inject_command(GROUP, "/taskcard on")
    await eventually(lambda: "3 agents" in board_text(telegram), timeout_s=60, what="shown")
    notify(tmp_path / "agents" / "bravo", "e1", "error", code="crash")
    await eventually(
        lambda: "error" in board_text(telegram) and len(telegram.bot_messages(GROUP)) >= 2,
        timeout_s=60,
        what="bravo marked and its own card",
    )
    serving = "agent shared: this instance serves it now"
    owner = next(name for name, serve in serves.items() if serving in serve.logs)
    serves[owner].kill()
    publish(tmp_path / "agents" / "shared", "**shared** after the kill")
    await eventually(
        lambda: "shared after the kill" in board_text(telegram), timeout_s=60, what="standby line"
    )
    # The other agent of the instance gone is served by nobody now: its line stays, marked;
    # the standby's line of the agent it took over is live.
    (gone,) = (agent for agent in split[owner] if agent != "shared")
    await eventually(lambda: unobserved(telegram, gone), timeout_s=60, what="gone marked")
    assert "3 agents" in board_text(telegram)
    await eventually(
        lambda: UNOBSERVED_NOTE not in line_of(telegram, "shared"), what="the standby's line"
    )
    texts = [m.text for m in telegram.bot_messages(GROUP)]
    assert sum("Task cards hidden here." in t for t in texts) == 1, "answered once"
    assert sum("Task cards shown here." in t for t in texts) == 1, "answered once"
    assert len(boards(telegram)) == 1


@pytest.mark.parametrize("view", ["board", "cards"])
async def test_feishu_a_command_replying_to_another_instances_message_is_the_bots(
    tmp_path: Path, feishu: FakeFeishu, redis_url: str, prefix: str, fleet: ExitStack, view: str
) -> None:
    # A command written as a reply to one of the bot's messages, without mentioning the bot,
    # is the bot's. An instance that had not sent that message (the board sent by another
    # instance, another instance's agent's card) did not know its id and ignored the
    # command: its own cards kept the old settings, and the answer was lost whenever it
    # claimed it.
    setups = []
    for name in ("i0", "i1"):
        setup = feishu_instance(tmp_path, name, feishu, redis_url=redis_url, prefix=prefix)
        routed = f'agents = ["*"]\nview = "{view}"'
        text = setup.config.read_text().replace('agents = ["*"]', routed)
        setup.config.write_text(text)
        fleet.enter_context(setup.serve())
        publish(tmp_path / name / "agents" / f"{name}agent", f"# {name}agent phase 1")
        setups.append(setup)
    await eventually(
        lambda: sum(
            f"{n}agent phase 1" in html.unescape(m.text)
            for n in ("i0", "i1")
            for m in feishu.chat(CHAT)
        ) == 2,
        timeout_s=60,
        what="both instances' agents shown",
    )  # fmt: skip
    # Replies to a message of i0's: the board (i0agent is on it) or i0agent's card.
    replied = next(
        m.message_id for m in feishu.chat(CHAT) if "i0agent phase 1" in html.unescape(m.text)
    )
    # Each command's answer is claimed by whichever instance reads it first: several, so
    # that each instance claims some; each is delivered to the instance that did not post it
    # (or to either, for the board: one of them did not send it).
    for rows in range(2, 8):
        answer = await feishu.deliver_command(
            setups[rows % 2].url, CHAT, f"/taskcard {rows}", verification_token=VERIFY,
            encrypt_key=ENCRYPT, mention_bot=False, parent_id=replied,
        )  # fmt: skip
        assert answer.status == 200
        await eventually(
            lambda rows=rows: sum(f"{rows} activity rows" in t for t in feishu.texts(CHAT)) == 1,
            timeout_s=60,
            what=f"the answer to /taskcard {rows}",
        )


async def test_a_redis_restart_keeps_the_one_board_going(
    tmp_path: Path, telegram: FakeTelegram, prefix: str, fleet: ExitStack
) -> None:
    server = private_redis(tmp_path / "redis", fleet)
    split = {"i0": ["alpha"], "i1": ["bravo"]}
    serves = [
        fleet.enter_context(
            instance(
                tmp_path, name, telegram, agents, redis_url=server.url, prefix=prefix, view="board"
            )
        )
        for name, agents in split.items()
    ]
    for agents in split.values():
        publish(tmp_path / "agents" / agents[0], f"**{agents[0]}** before")
    await eventually(
        lambda: "alpha before" in board_text(telegram) and "bravo before" in board_text(telegram),
        timeout_s=60,
        what="both on the board",
    )
    server.restart()
    for agents in split.values():
        publish(tmp_path / "agents" / agents[0], f"**{agents[0]}** after the restart")
    await eventually(
        lambda: (
            "alpha after the restart" in board_text(telegram)
            and "bravo after the restart" in board_text(telegram)
        ),
        timeout_s=60,
        what="both lines edited after the restart",
    )
    assert len(telegram.bot_messages(GROUP)) == 1, "the same board"
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs


async def test_taskcard_board_in_a_cluster_retires_every_instances_cards_for_one_board(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    split = {"i0": ["alpha"], "i1": ["bravo"]}
    for name, agents in split.items():
        fleet.enter_context(
            instance(tmp_path, name, telegram, agents, redis_url=redis_url, prefix=prefix)
        )
    for agents in split.values():
        publish(tmp_path / "agents" / agents[0], f"**{agents[0]}** step 1")
    await eventually(lambda: len(telegram.bot_messages(GROUP)) == 2, timeout_s=60, what="two cards")
    telegram.inject_command(GROUP, "/taskcard board")
    await eventually(
        lambda: "alpha step 1" in board_text(telegram) and "bravo step 1" in board_text(telegram),
        timeout_s=60,
        what="one board of both instances' agents",
    )
    await eventually(
        lambda: sum(RETIRED_NOTE in m.text for m in telegram.bot_messages(GROUP)) == 2,
        timeout_s=60,
        what="both cards retired",
    )
    texts = [m.text for m in telegram.bot_messages(GROUP)]
    assert sum("now shows one task board" in t for t in texts) == 1, "answered once"
    assert len(boards(telegram)) == 1


async def test_an_agent_a_reload_removes_leaves_the_clusters_board(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    split = {"i0": ["alpha", "extra"], "i1": ["bravo"]}
    serves = {
        name: fleet.enter_context(
            instance(
                tmp_path, name, telegram, agents, redis_url=redis_url, prefix=prefix, view="board"
            )
        )
        for name, agents in split.items()
    }
    for agent in ("alpha", "extra", "bravo"):
        publish(tmp_path / "agents" / agent, f"**{agent}** step 1")
    await eventually(
        lambda: all(f"{a} step 1" in board_text(telegram) for a in ("alpha", "extra", "bravo")),
        timeout_s=60,
        what="three agents",
    )
    config = serves["i0"].config
    workdir = tmp_path / "agents" / "extra"
    config.write_text(
        config.read_text()
        .replace('agents = ["alpha", "extra"]', 'agents = ["alpha"]')
        .replace(f'[[agents]]\nid = "extra"\nworkdir = "{workdir}"\n', "")
    )
    process = serves["i0"].proc
    assert process is not None
    process.send_signal(signal.SIGHUP)
    await eventually(
        lambda: "extra" not in board_text(telegram) and "2 agents" in board_text(telegram),
        timeout_s=60,
        what="its line gone from the one board, whichever instance sends it",
    )
    assert len(boards(telegram)) == 1


async def test_a_board_catches_up_after_its_senders_subscription_is_dropped(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str
) -> None:
    """A change announced while the board's sender was not subscribed is lost: once the
    subscription is made again (here its connection is dropped), the sender composes its
    boards again instead of waiting for the chat's next change."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    split = {"i0": ["alpha"], "i1": ["bravo"]}
    async with AnswerLosingProxy(port, (b"never sent",), hold_s=0) as proxy:
        with ExitStack() as fleet:
            serves = {
                name: fleet.enter_context(
                    instance(
                        tmp_path,
                        name,
                        telegram,
                        agents,
                        redis_url=proxy.url,
                        prefix=prefix,
                        view="board",
                    )
                )
                for name, agents in split.items()
            }
            for agents in split.values():
                publish(tmp_path / "agents" / agents[0], f"**{agents[0]}** step 1")
            await eventually(
                lambda: all(f"{a[0]} step 1" in board_text(telegram) for a in split.values()),
                timeout_s=60,
                what="both agents on the board",
            )
            await eventually(
                lambda: any(SENDS_BOARD in s.logs for s in serves.values()), what="the sender"
            )
            other = next(name for name, serve in serves.items() if SENDS_BOARD not in serve.logs)
            agent = split[other][0]
            proxy.mute_subscribers = True
            publish(tmp_path / "agents" / agent, f"**{agent}** step 2")
            # Both instances' copies of the announcement are lost.
            await eventually(lambda: proxy.muted >= 2, timeout_s=60, what="the change lost")
            assert f"{agent} step 2" not in board_text(telegram)
            proxy.mute_subscribers = False
            proxy.cut_subscribers()
            await eventually(
                lambda: f"{agent} step 2" in board_text(telegram),
                timeout_s=60,
                what="the board caught up after the subscription was made again",
            )
            assert len(telegram.bot_messages(GROUP)) == 1, "the same board, edited"
            for serve in serves.values():
                assert await serve.aterminate() == 0
                assert "Traceback" not in serve.logs


async def test_after_redis_restarts_empty_an_agent_that_did_not_change_stays_on_the_board(
    tmp_path: Path, telegram: FakeTelegram, prefix: str, fleet: ExitStack
) -> None:
    """A line is written only when it changes: after Redis restarted without its data, the
    line of an agent that had not changed was never written again, and the agent left the
    board at the next change of another. Now each instance writes its lines again once its
    connection to Redis is back."""
    if not have_redis():
        pytest.fail("redis-server is not installed: run `make test`, which installs it")
    server = RedisServer(tmp_path / "redis").start()  # no appendonly: a restart loses all
    fleet.callback(server.stop)
    split = {"i0": ["alpha"], "i1": ["bravo"]}
    serves = [
        fleet.enter_context(
            instance(
                tmp_path, name, telegram, agents, redis_url=server.url, prefix=prefix, view="board"
            )
        )
        for name, agents in split.items()
    ]
    for agents in split.values():
        publish(tmp_path / "agents" / agents[0], f"**{agents[0]}** step 1")
    await eventually(
        lambda: "alpha step 1" in board_text(telegram) and "bravo step 1" in board_text(telegram),
        timeout_s=60,
        what="both on the board",
    )
    server.restart()
    publish(tmp_path / "agents" / "alpha", "**alpha** step 2")
    key = f"{prefix}:board:telegram:{GROUP}:"

    def shared() -> set[str]:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            return set(client.hkeys(key))
        finally:
            client.close()

    await eventually(lambda: shared() == {"alpha", "bravo"}, timeout_s=60, what="both written")
    # The board's message id went with Redis's data: the instance that takes the board's
    # lease first may not be the one that sent it, and then it posts the board anew (once).

    def latest() -> str:
        found = boards(telegram)
        return found[-1].text if found else ""

    # Each instance takes its lease again as it was: each line is live again, not marked.
    await eventually(
        lambda: (
            "alpha step 2" in latest()
            and "bravo step 1" in latest()
            and UNOBSERVED_NOTE not in latest()
        ),
        timeout_s=60,
        what="alpha's change, bravo still there, both live",
    )
    assert "2 agents" in latest()
    assert len(boards(telegram)) <= 2, "at most one board posted anew"
    for serve in serves:
        assert await serve.aterminate() == 0
        assert "Traceback" not in serve.logs


@pytest.mark.parametrize("refusal", ["oom", "readonly"])
async def test_a_line_redis_refused_while_connected_reaches_the_board_without_a_change(
    tmp_path: Path, telegram: FakeTelegram, prefix: str, fleet: ExitStack, refusal: str
) -> None:
    """Redis refusing writes but staying connected (out of memory, or a replica) announces
    no reconnection: a line it refused is shared again (at the latest at the next lease
    renewal), and the board catches up without another change of the agent."""
    if not have_redis():
        pytest.fail("redis-server is not installed: run `make test`, which installs it")
    server = RedisServer(tmp_path / "redis").start()
    fleet.callback(server.stop)
    serve = instance(
        tmp_path, "i0", telegram, ["alpha"], redis_url=server.url, prefix=prefix, view="board"
    )
    # Leases long enough that the refusal does not lapse them (a lease taken again would
    # share the line again, hiding what is tested).
    serve.config.write_text(serve.config.read_text().replace("lease_ttl_s = 2", "lease_ttl_s = 9"))
    fleet.enter_context(serve)
    publish(tmp_path / "agents" / "alpha", "**alpha** step 1")
    await eventually(lambda: "alpha step 1" in board_text(telegram), timeout_s=60, what="board")
    client = redis.Redis.from_url(server.url)
    fleet.callback(client.close)

    def refuse(on: bool) -> None:
        if refusal == "oom":
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", 1 if on else 0)
        else:
            client.config_set("replica-read-only", "yes")
            client.execute_command(
                *(("REPLICAOF", "127.0.0.1", "1") if on else ("REPLICAOF", "NO", "ONE"))
            )

    refuse(True)
    try:
        publish(tmp_path / "agents" / "alpha", "**alpha** step 2")
        await eventually(
            lambda: "sharing the chats' board lines through Redis failed" in serve.logs,
            timeout_s=60,
            what="the line refused",
        )
    finally:
        refuse(False)
    await eventually(
        lambda: "alpha step 2" in board_text(telegram), timeout_s=60, what="the board caught up"
    )
    assert len(telegram.bot_messages(GROUP)) == 1, "the same board"
    assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs


async def test_the_board_lines_are_said_to_work_again_only_once_redis_takes_a_write(
    tmp_path: Path, telegram: FakeTelegram, prefix: str, fleet: ExitStack
) -> None:
    """Redis out of memory refuses writes but answers reads: the board composed meanwhile
    (a read) used to log that sharing the lines works again, while the next write was still
    refused, and so on at every lease renewal. The outage is one warning, and one line once
    a write is taken."""
    if not have_redis():
        pytest.fail("redis-server is not installed: run `make test`, which installs it")
    server = RedisServer(tmp_path / "redis").start()
    fleet.callback(server.stop)
    serve = instance(
        tmp_path, "i0", telegram, ["alpha"], redis_url=server.url, prefix=prefix, view="board"
    )
    serve.config.write_text(serve.config.read_text().replace("lease_ttl_s = 2", "lease_ttl_s = 9"))
    fleet.enter_context(serve)
    publish(tmp_path / "agents" / "alpha", "**alpha** step 1")
    await eventually(lambda: "alpha step 1" in board_text(telegram), timeout_s=60, what="board")
    client = redis.Redis.from_url(server.url, decode_responses=True)
    fleet.callback(client.close)

    def reads() -> int:
        stats = client.info("commandstats").get("cmdstat_hgetall", {})
        return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0

    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        publish(tmp_path / "agents" / "alpha", "**alpha** step 2")
        await eventually(
            lambda: "sharing the chats' board lines through Redis failed" in serve.logs,
            timeout_s=60,
            what="the line refused",
        )
        before = reads()
        # The board is composed again (its lines read) while the writes are still refused.
        await eventually(lambda: reads() >= before + 2, timeout_s=60, what="the board read")
    finally:
        client.config_set("maxmemory", 0)
    await eventually(
        lambda: "alpha step 2" in board_text(telegram), timeout_s=60, what="the board caught up"
    )
    await eventually(
        lambda: "sharing the chats' board lines works again" in serve.logs,
        what="the end of the outage",
    )
    assert await serve.aterminate() == 0
    assert serve.logs.count("sharing the chats' board lines works again") == 1, serve.logs
    assert serve.logs.count("sharing the chats' board lines through Redis failed") == 1
    assert "Traceback" not in serve.logs


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_taskcard_gives_the_state_of_another_instances_agent_from_its_board_line(
    platform: str, tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu, redis_url: str,
    prefix: str, fleet: ExitStack,
) -> None:  # fmt: skip
    """A chat showing the board, i0 and i1 each serving one agent there: `/taskcard` named
    the other instance's agent alone ("served by another instance"), while its line on the
    board said its state. Now the answer gives that state, as for the agents served here,
    read from the shared line when the command asks."""
    import re

    if platform == "telegram":
        for name in ("i0", "i1"):
            fleet.enter_context(
                instance(tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url,
                         prefix=prefix, view="board")
            )  # fmt: skip
            publish(tmp_path / "agents" / f"{name}agent", f"# {name}agent phase 1")

        def board() -> str:
            return board_text(telegram)

        def texts() -> list[str]:
            return [m.text for m in telegram.bot_messages(GROUP)]

        async def ask() -> None:
            telegram.inject_message(GROUP, "/taskcard", user_id=7)

    else:
        setups = []
        for name in ("i0", "i1"):
            setup = feishu_instance(tmp_path, name, feishu, redis_url=redis_url, prefix=prefix)
            text = setup.config.read_text()
            setup.config.write_text(
                text.replace('agents = ["*"]', 'agents = ["*"]\nview = "board"')
            )
            fleet.enter_context(setup.serve())
            publish(tmp_path / name / "agents" / f"{name}agent", f"# {name}agent phase 1")
            setups.append(setup)

        def board() -> str:
            return feishu_board(feishu)

        def texts() -> list[str]:
            return [html.unescape(t) for t in feishu.texts(CHAT)]

        async def ask() -> None:
            answer = await feishu.deliver_command(
                setups[0].url, CHAT, "/taskcard", verification_token=VERIFY, encrypt_key=ENCRYPT
            )
            assert answer.status == 200

    await eventually(
        lambda: all(f"{n}agent phase 1" in board() for n in ("i0", "i1")),
        timeout_s=60,
        what="both instances' agents on the one board",
    )
    await ask()
    [answer] = await eventually(
        lambda: [t for t in texts() if "served by another instance" in t],
        timeout_s=60,
        what="/taskcard answered",
    )
    local = re.search(r"• i\dagent: ([a-z ]+); card", answer)
    elsewhere = re.search(r"• i\dagent: ([a-z ]+); served by another instance", answer)
    assert local is not None and elsewhere is not None, answer
    assert elsewhere.group(1) == local.group(1), answer  # both as yet unknown
