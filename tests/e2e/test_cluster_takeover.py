"""A cluster instance taking over many agents at once from one that stopped, end to end.

Two `taskcard serve` instances configured with the same agents share the fake Bot API and a
`redis-server` of this test's own (its command counts are this test's alone). The first
serves every agent; when it stops, the standby takes them all over in one lease renewal.
What an operator sees must not change: each agent's card goes on in the same message, and
no notice is sent twice. What must change is the cost: the standby reads the agents' state
in batches, as a start does, not agent by agent (one Redis round trip per read).
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from pathlib import Path

import redis

from tests.e2e.harness import ServeProcess, agents_lines, eventually, notify, publish
from tests.e2e.test_cluster import cluster_lines
from tests.fakes.telegram_api import FakeTelegram
from tests.redis_server import private_redis

AGENTS = [f"a{i:02}" for i in range(40)]
FIRST_CHAT = 8100  # each agent's own private chat: its sends are paced by that chat alone


def chat_of(agent: str) -> int:
    return FIRST_CHAT + AGENTS.index(agent)


def member(tmp_path: Path, name: str, fake: FakeTelegram, redis_url: str) -> ServeProcess:
    """Instance `name`: its own folder and state, every agent of `AGENTS` (their workdirs
    shared under `tmp_path/agents`), each routed to its own chat."""
    folder = tmp_path / name
    folder.mkdir()
    lines = agents_lines(tmp_path, AGENTS)
    lines[0] = f'state_dir = "{folder / "state"}"'
    lines = [line.replace('"agents/', f'"{tmp_path}/agents/') for line in lines]
    lines += [
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
    ]
    for agent in AGENTS:
        lines += ["[[telegram.routes]]", f"chat_id = {chat_of(agent)}", f'agents = ["{agent}"]']
    lines += cluster_lines(name, "takeover")
    config = folder / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return ServeProcess(config, env={"TC_TEST_TOKEN": fake.token, "TC_REDIS_URL": redis_url})


class Monitor:
    """Every command the server runs from now on, as `MONITOR` shows them to a client."""

    def __init__(self, url: str) -> None:
        self.commands: list[str] = []
        self._client = redis.Redis.from_url(url, decode_responses=True)
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        try:
            with self._client.monitor() as monitor:
                for seen in monitor.listen():
                    self.commands.append(seen["command"])
        except (redis.ConnectionError, ValueError):
            return  # the server stopped at the test's end

    def count(self, command: str, key: str) -> int:
        """How many times `command` was run on `key`."""
        head = f"{command} {key}".lower()
        return sum(1 for seen in self.commands if seen.lower().split(" ", 2)[:2] == head.split())


async def test_a_standby_takes_many_agents_over_with_batched_reads(
    tmp_path: Path, fleet: ExitStack
) -> None:
    server = private_redis(tmp_path / "redis", fleet)
    client = fleet.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
    async with FakeTelegram() as fake:
        first = fleet.enter_context(member(tmp_path, "i0", fake, server.url))
        for agent in AGENTS:
            publish(tmp_path / "agents" / agent, f"{agent} before")

        def sent_each(count: int) -> bool:
            return all(len(fake.bot_messages(chat_of(agent))) == count for agent in AGENTS)

        await eventually(lambda: sent_each(1), timeout_s=120, what="each agent's card")
        for agent in AGENTS:  # after the first look, which skips what was written before
            notify(tmp_path / "agents" / agent, f"{agent}-n1", "error", code="crash")
        await eventually(lambda: sent_each(2), timeout_s=120, what="each agent's notice")

        def all_recorded() -> bool:
            """Every card's message id kept in Redis, no notice pending: stopped now, i0
            leaves nothing in flight (a send cut short may be sent again, by design)."""
            ids = [client.hget(k, "message_id") for k in client.scan_iter("takeover:res:*")]
            return sum(1 for i in ids if i) == len(AGENTS) and not client.zcard(
                "takeover:n:pending"
            )

        await eventually(all_recorded, timeout_s=120, what="every resident recorded")
        standby = fleet.enter_context(member(tmp_path, "i1", fake, server.url))
        # Its first renewal is past once it shares what it routes: it found the agents'
        # leases held, so it is a standby that will take over.
        await eventually(
            lambda: any(client.scan_iter("takeover:routed:i1#*")),
            timeout_s=60,
            what="the standby's first renewal",
        )
        monitor = Monitor(server.url)
        await eventually(
            lambda: client.ping() and monitor.commands, timeout_s=60, what="the monitor on"
        )
        assert await first.aterminate() == 0  # its leases are released: taken at once

        def taken_over() -> bool:
            holders = client.mget([f"takeover:lease:agent:{agent}" for agent in AGENTS])
            return all(holder and holder.startswith("i1#") for holder in holders)

        await eventually(taken_over, timeout_s=120, what="every agent's lease held by i1")
        # The renewal that gains the leases takes the agents over, then the chats' boards,
        # whose lines say that renewal is done.
        await eventually(
            lambda: all(
                f"chat telegram:{chat_of(agent)}:: this instance sends its board now"
                in standby.logs
                for agent in AGENTS
            ),
            timeout_s=120,
            what="the renewal that took the agents over done",
        )
        # Taken agent by agent, each agent cost three HGETs of its files' offsets and one of
        # its route's kept refusal, and each route a ZRANGE of the pending notices: 120, 40
        # and 40 round trips here. In batches: one HMGET or ZRANGE per batch of agents.
        said = "\n".join(monitor.commands)
        assert monitor.count("hget", "takeover:offsets") == 0, said
        refusals = [c for c in monitor.commands if c.startswith("HGET") and "card-refused" in c]
        assert not [c for c in refusals for a in AGENTS if c.endswith(f"::{a}")], said
        assert monitor.count("zrange", "takeover:n:pending") < len(AGENTS) / 4, said
        for agent in AGENTS:
            publish(tmp_path / "agents" / agent, f"{agent} after")
            notify(tmp_path / "agents" / agent, f"{agent}-n2", "error", code="crash")

        def edited_and_told_once() -> bool:
            for agent in AGENTS:
                texts = [m.text for m in fake.bot_messages(chat_of(agent))]
                if not any(f"{agent} after" in text for text in texts) or len(texts) != 3:
                    return False
            return True

        await eventually(edited_and_told_once, timeout_s=120, what="every card edited by i1")
        for agent in AGENTS:
            chat = chat_of(agent)
            # The card posted by i0, edited; its first notice, and the new one: no second
            # resident, no notice sent again (i1 read the files on from i0's offsets).
            assert len(fake.bot_messages(chat)) == 3, fake.bot_messages(chat)
            assert f"{agent} after" in fake.bot_messages(chat)[0].text
        assert await standby.aterminate() == 0
