"""Client CPU per Telegram request: `python -m bench.tgclient [--edits N] [--lanes C]`.

Issue 13 gives the whole serve path about 0.8 ms of CPU per card change; this measures the
Telegram channel's share of it: from `TelegramChannel.send`/`edit`/`delete` to the answer
back, through python-telegram-bot and our HTTP layer, against the fake Bot API.

The fake runs in a subprocess, so `time.process_time()` of this process is the client side
alone (the fake's work never lands on it). The first send of each lane opens its connection
("connect"); the other phases run on warm connections. Cards are rendered before the clock
starts, so the figure is the request itself; rendering is reported on its own line. Process CPU,
not wall time, is the figure: it barely moves when other processes load the machine.

`--profile FILE` writes cProfile stats of the edit phase and prints the top entries.
Nothing here is recorded in RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import pstats
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from taskcard.channels.base import CardView, ChatRef, IncomingCommand, Outgoing
from taskcard.channels.telegram.channel import TelegramChannel
from taskcard.channels.telegram.config import TelegramConfig, TelegramLimits
from taskcard.channels.telegram.render import markdown_to_rich
from tests.e2e.harness import ROOT

TOKEN = "123456:BENCH-client-token"
# A card of the usual shape: a header row, a few automatic rows, a Markdown body.
_BODY = (
    "**Build** of `service-{lane}` step {step}/40\n\n"
    "- tests: {passed} passed, 0 failed\n"
    "- coverage: 91%\n"
    "- next: [logs](https://example.com/run/{lane}/{step})\n"
)


class _Cursors:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get_cursor(self, key: str) -> str | None:
        return self.values.get(key)

    def set_cursor(self, key: str, value: str) -> None:
        self.values[key] = value

    def delete_cursors(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.values.pop(key, None)


async def _ignore(command: IncomingCommand) -> None:
    del command


def _view(lane: int, step: int) -> CardView:
    body = _BODY.format(lane=lane, step=step, passed=step * 7)
    rows = (f"running · step {step}", "last movement 2 s ago", "3 files changed")
    return CardView(agent_id=f"agent-{lane}", state="running", auto_rows=rows, body=body)


@dataclass
class Phase:
    name: str
    count: int
    cpu_s: float
    wall_s: float

    def line(self) -> str:
        per_us = self.cpu_s / self.count * 1e6
        return (
            f"{self.name:<10} {self.count:>6} requests  {per_us:8.0f} µs CPU each"
            f"  ({self.cpu_s:.2f} s CPU, {self.wall_s:.2f} s wall)"
        )


async def _timed(
    name: str, count: int, lanes: int, work: Callable[[int, int], Awaitable[object]]
) -> Phase:
    """Run `work(lane, i)` `count` times spread over `lanes` concurrent lanes."""
    counter = itertools.count()

    async def lane(index: int) -> None:
        while (i := next(counter)) < count:
            await work(index, i)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(lane(index) for index in range(lanes)))
    return Phase(name, count, time.process_time() - cpu0, time.perf_counter() - wall0)


def _start_fake() -> tuple[subprocess.Popen[str], str]:
    fake = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.telegram_api",
            "--port",
            "0",
            "--token",
            TOKEN,
            *("--private-limit", "off", "--group-limit", "off", "--bot-limit", "off"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert fake.stdout is not None
    line = fake.stdout.readline()
    if "listening on " not in line:
        fake.kill()
        raise RuntimeError(f"the fake did not start: {line!r}")
    return fake, line.rsplit("listening on ", 1)[1].strip()


async def run(edits: int, lanes: int, profile: str | None) -> list[Phase]:
    fake, base_url = _start_fake()
    try:
        config = TelegramConfig(api_base_url=base_url, commands=False, limits=TelegramLimits())
        channel = TelegramChannel(config, TOKEN, _Cursors())
        await channel.start(_ignore)
        chats = [ChatRef(str(-1001000 - lane)) for lane in range(lanes)]
        per_lane = max(1, edits // lanes)
        outgoing: list[list[Outgoing]] = [
            [channel.render_card(_view(lane, step)) for step in range(per_lane + 1)]
            for lane in range(lanes)
        ]
        # Converted bodies are cached: start cold, so the figure is conversion, not cache hits
        # on the bodies rendered above (which a small --edits/--lanes would otherwise give).
        markdown_to_rich.cache_clear()
        render_cpu0 = time.process_time()
        for step in range(200):
            channel.render_card(_view(0, step))
        render = Phase("render", 200, time.process_time() - render_cpu0, 0.0)
        ids: list[str] = ["" for _ in range(lanes)]
        steps = [0] * lanes

        async def send(lane: int, _: int) -> None:
            ids[lane] = await channel.send(chats[lane], outgoing[lane][0])

        async def edit(lane: int, _: int) -> None:
            steps[lane] += 1
            step = 1 + (steps[lane] - 1) % per_lane
            await channel.edit(chats[lane], ids[lane], outgoing[lane][step])

        extra: list[list[str]] = [[] for _ in range(lanes)]

        async def send_more(lane: int, _: int) -> None:
            extra[lane].append(await channel.send(chats[lane], outgoing[lane][0]))

        async def delete(lane: int, _: int) -> None:
            await channel.delete(chats[lane], extra[lane].pop() if extra[lane] else ids[lane])

        phases = [await _timed("connect", lanes, lanes, send)]
        await _timed("warm-up", min(edits, 50 * lanes), lanes, edit)
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        phases.append(await _timed("edit", per_lane * lanes, lanes, edit))
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(str(profile))
        sends = max(lanes, per_lane * lanes // 10)
        phases.append(await _timed("send", sends, lanes, send_more))
        phases.append(await _timed("delete", sends, lanes, delete))
        bot = channel._require_bot()

        async def poll(lane: int, _: int) -> None:
            await bot.get_updates(timeout=0, allowed_updates=["message"])

        # Empty answers on the poll connection: what each long poll costs when it returns.
        phases.append(await _timed("getUpdates", sends, 1, poll))
        phases.append(render)
        await channel.stop()
        return phases
    finally:
        fake.terminate()
        fake.wait(timeout=30)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tgclient", description=__doc__)
    parser.add_argument("--edits", type=int, default=3000, help="edits measured (default 3000)")
    parser.add_argument("--lanes", type=int, default=8, help="concurrent chats (default 8)")
    parser.add_argument("--profile", help="write cProfile stats of the edit phase here")
    args = parser.parse_args(argv)
    phases = asyncio.run(run(args.edits, args.lanes, args.profile))
    for phase in phases:
        print(phase.line())
    if args.profile:
        stats = pstats.Stats(args.profile)
        stats.sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
