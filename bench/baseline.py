"""The polling baseline: the reference system's way of keeping a card in a chat.

Each agent's `status` and `taskcard.md` are polled once a second (a loop per agent, as the
reference runs a thread per account); when the body differs from what a chat last accepted,
the resident message is edited (or first sent) right away: no per-chat throttle, no
coalescing beyond what the one-second poll does by itself, and a 429's `retry_after` is
ignored (the edit is simply tried again at the next poll). It sends the body as plain text,
without the automatic slot. Like the service it uses python-telegram-bot over HTTP.

Run: `python -m bench.baseline SPEC.json`; SIGTERM ends it. SPEC: `{"token", "base_url",
"agents": {id: workdir}, "routes": [{"chat_id", "agents": [...]}]}`.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

from telegram import Bot
from telegram import error as tg
from telegram.request import HTTPXRequest

from taskcard.producers.task_card.contract import STATUS_ACTIVE, CardPaths, read_bytes

POLL_INTERVAL_S = 1.0
_POOL_SIZE = 64


class AgentPoller:
    """One agent's loop: read its files, push a changed body to each of its chats."""

    def __init__(
        self,
        bot: Bot,
        workdir: Path,
        chats: list[int],
        phase_s: float,
        in_flight: asyncio.Semaphore,
    ) -> None:
        self._bot = bot
        self._in_flight = in_flight
        self._paths = CardPaths(workdir)
        self._chats = chats
        self._phase_s = phase_s
        self._accepted: dict[int, str] = {}
        self._message_ids: dict[int, int] = {}
        self.rate_limited = 0
        self.failed = 0

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.sleep(self._phase_s)  # the agents' loops started at different moments
        while not stop.is_set():
            await self.poll_once()
            await asyncio.sleep(POLL_INTERVAL_S)

    async def _push(self, chat: int, text: str) -> None:
        message_id = self._message_ids.get(chat)
        if message_id is None:
            sent = await self._bot.send_message(chat, text)
            self._message_ids[chat] = sent.message_id
        else:
            await self._bot.edit_message_text(text, chat_id=chat, message_id=message_id)

    async def poll_once(self) -> None:
        if read_bytes(self._paths.status) != STATUS_ACTIVE:
            return
        raw = read_bytes(self._paths.body)
        if not raw or not raw.strip():
            return
        text = raw.decode("utf-8", errors="replace")
        for chat in self._chats:
            if self._accepted.get(chat) == text:
                continue
            try:
                async with self._in_flight:
                    await self._push(chat, text)
                self._accepted[chat] = text
            except tg.RetryAfter:
                self.rate_limited += 1  # ignored: the next poll simply tries again
            except tg.BadRequest as error:
                if "not modified" in str(error).lower():
                    self._accepted[chat] = text
                else:
                    self.failed += 1
            except tg.TelegramError:
                self.failed += 1


async def run(spec: dict[str, Any]) -> None:
    request = HTTPXRequest(
        connection_pool_size=_POOL_SIZE, read_timeout=15.0, write_timeout=15.0, pool_timeout=30.0
    )
    bot = Bot(spec["token"], base_url=f"{spec['base_url']}/bot", request=request)
    chats_of: dict[str, list[int]] = {agent: [] for agent in spec["agents"]}
    for route in spec["routes"]:
        for agent in route["agents"]:
            chats_of[agent].append(int(route["chat_id"]))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    phases = random.Random(5)
    # Without a bound, 2,000 loops queue 2,000 requests on httpcore's pool, whose bookkeeping
    # is quadratic in the queue; the reference's threads each hold their own connection.
    in_flight = asyncio.Semaphore(_POOL_SIZE)
    pollers = [
        AgentPoller(
            bot, Path(workdir), chats_of[agent], phases.random() * POLL_INTERVAL_S, in_flight
        )
        for agent, workdir in spec["agents"].items()
    ]
    await bot.initialize()
    try:
        tasks = [asyncio.create_task(poller.run(stop)) for poller in pollers]
        await stop.wait()
        await asyncio.gather(*tasks)
    finally:
        await bot.shutdown()
    print(
        json.dumps(
            {
                "rate_limited": sum(p.rate_limited for p in pollers),
                "failed": sum(p.failed for p in pollers),
            }
        )
    )


def main(argv: list[str]) -> None:
    # PTB warns about the type of `retry_after` on every 429; the baseline ignores 429s anyway.
    warnings.simplefilter("ignore")
    asyncio.run(run(json.loads(Path(argv[0]).read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
