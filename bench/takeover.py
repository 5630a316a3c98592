"""Cluster take-over: what it costs a standby to take over every agent of a stopped instance.

Two `taskcard serve` instances configured with the same agents (each routed to a private
chat of its own, so that the first cards go out at the bot's rate) share a fake Telegram and
a `redis-server` on loopback, both started here. The first serves every agent and posts each
card; once every resident is recorded in Redis, the second starts and finds every lease
held (a standby), then the first is stopped with SIGTERM, which releases its leases. The
window measured runs from that signal until the standby's log says it sends every chat's
board, which its lease renewal does right after taking the agents over.

Figures: wall time of the window, the standby's CPU in it (user + system, /proc), and the
commands Redis ran in it (`total_commands_processed`, every command of a pipeline counted;
and the read commands of the take-over by name from INFO commandstats). The stopping
instance's own commands (releasing its leases) are in the counts too, the same both ways.

    python -m bench.takeover --agents 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import redis

from tests.e2e.harness import ServeProcess, eventually, publish
from tests.fakes.telegram_api import FakeLimits, FakeTelegram
from tests.redis_server import RedisServer

FIRST_CHAT = 100_000
PREFIX = "bench"
READS = ("hget", "hmget", "hgetall", "zrange", "get", "mget")


def config(root: Path, name: str, agents: list[str], fake: FakeTelegram) -> Path:
    folder = root / name
    folder.mkdir()
    lines = [f'state_dir = "{folder / "state"}"']
    for agent in agents:
        lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "{root / "agents" / agent}"']
    lines += [
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
    ]
    for number, agent in enumerate(agents):
        lines += [
            "[[telegram.routes]]",
            f"chat_id = {FIRST_CHAT + number}",
            f'agents = ["{agent}"]',
        ]
    lines += [
        "[cluster]",
        'redis_url_env = "TC_REDIS_URL"',
        f'instance = "{name}"',
        f'key_prefix = "{PREFIX}"',
        "lease_ttl_s = 6",
    ]
    path = folder / "taskcard.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def counts(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    found = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    found["total"] = int(client.info("stats")["total_commands_processed"])
    return found


async def run(agents_n: int, root: Path) -> dict[str, object]:
    agents = [f"agent{n:05}" for n in range(agents_n)]
    for agent in agents:
        (root / "agents" / agent).mkdir(parents=True)
        publish(root / "agents" / agent, f"card of {agent}")
    server = RedisServer(root / "redis").start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        async with FakeTelegram(limits=FakeLimits.unlimited()) as fake:
            env = {"TC_TEST_TOKEN": fake.token, "TC_REDIS_URL": server.url}
            first = ServeProcess(config(root, "i0", agents, fake), env=env).start()
            standby = ServeProcess(config(root, "i1", agents, fake), env=env)
            try:

                def recorded() -> bool:
                    keys = list(client.scan_iter(f"{PREFIX}:res:*", count=1000))
                    pipe = client.pipeline()
                    for key in keys:
                        pipe.hget(key, "message_id")
                    return sum(1 for found in pipe.execute() if found) == agents_n

                await eventually(recorded, timeout_s=900, what="every resident recorded")
                standby.start()
                await eventually(
                    lambda: any(client.scan_iter(f"{PREFIX}:routed:i1#*")),
                    timeout_s=300,
                    what="the standby's first renewal",
                )
                assert standby.proc is not None and first.proc is not None
                cpu_before, before = cpu_s(standby.proc.pid), counts(client)
                started = time.monotonic()
                first.proc.send_signal(15)
                boards = "this instance sends its board now"
                leases = [f"{PREFIX}:lease:agent:{agent}" for agent in agents]

                def taken() -> bool:
                    if standby.logs.count(boards) < agents_n:
                        return False
                    return all(str(h).startswith("i1#") for h in client.mget(leases))

                await eventually(taken, timeout_s=900, what="every agent and board taken over")
                wall = time.monotonic() - started
                cpu, after = cpu_s(standby.proc.pid) - cpu_before, counts(client)
                assert "cannot serve it" not in standby.logs, standby.logs[-3000:]
                ran = {name: after.get(name, 0) - before.get(name, 0) for name in after}
                return {
                    "agents": agents_n,
                    "wall_s": round(wall, 2),
                    "standby_cpu_s": round(cpu, 2),
                    "redis_commands": ran["total"],
                    **{name: ran.get(name, 0) for name in READS},
                }
            finally:
                for serve in (standby, first):
                    if serve.proc is not None and serve.proc.poll() is None:
                        await serve.aterminate()
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tc-takeover-") as folder:
        print(json.dumps(asyncio.run(run(args.agents, Path(folder)))))


if __name__ == "__main__":
    main()
