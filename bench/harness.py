"""What every projection scenario shares: a fleet of workdirs, the card writer and its write
log, `taskcard serve` and the polling baseline as subprocesses, and what each chat showed.

Clocks: the writer stamps each rename with `time.monotonic()` right after `os.replace`
returns, and the fakes (in this process, on this loop) stamp each request with the same
clock when they answer it. No await separates a rename from its stamp, so a request can
never be stamped before the write it shows.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench.measure import CpuSample, cpu_of, memory_of
from taskcard.producers.task_card.contract import BODY_FILE, STATUS_FILE, TASKCARD_DIR
from tests.e2e.harness import ROOT, ServeProcess, eventually
from tests.fakes.telegram_api import FakeLimits, FakeTelegram, Window

TOKEN = "123456:BENCH-fake-token"
TOKEN_ENV = "TASKCARD_BENCH_TOKEN"
# Every body carries this tag, so any request log says which version of which card it shows.
VERSION_TAG = re.compile(r"card (\S+) v(\d+)\b")
CARD_METHODS = frozenset({"sendMessage", "editMessageText"})


# Telegram's limits as the Bots FAQ states them (and the fake's defaults).
PRIVATE_CHAT_LIMIT = Window(1, 1.0)
GROUP_CHAT_LIMIT = Window(20, 60.0)
BOT_LIMIT = Window(30, 1.0)


@dataclass(frozen=True)
class Limits:
    """One set of Telegram limits, given identically to the fake and to the service."""

    private_chat: Window | None = PRIVATE_CHAT_LIMIT
    group_chat: Window | None = GROUP_CHAT_LIMIT
    bot: Window | None = BOT_LIMIT

    def fake(self) -> FakeLimits:
        return FakeLimits(self.private_chat, self.group_chat, self.bot)


# "A channel with no limits": the fake enforces none, the service is told limits far above
# anything the scenario produces (it always enforces some).
UNLIMITED_CONFIG = Limits(Window(10_000, 1.0), Window(10_000, 1.0), Window(100_000, 1.0))


@dataclass(frozen=True)
class Route:
    chat_id: int
    agents: tuple[str, ...]
    view: str = "cards"  # "board": one resident board for the chat (bridge/run/boards.py)


@dataclass(frozen=True)
class Fleet:
    root: Path
    agents: tuple[str, ...]
    routes: tuple[Route, ...]

    def workdir(self, agent: str) -> Path:
        return self.root / "agents" / agent

    def route_keys(self) -> list[tuple[int, str]]:
        return [(route.chat_id, agent) for route in self.routes for agent in route.agents]


def agent_ids(count: int) -> tuple[str, ...]:
    return tuple(f"a{index:04d}" for index in range(count))


def chat_routes(ids: Sequence[str], per_chat: int, first_chat: int, step: int) -> list[Route]:
    """Deal the agents in order into chats of `per_chat`, numbered from `first_chat` by `step`
    (-1 for groups, whose ids are negative; 1 for private chats)."""
    return [
        Route(first_chat + step * index, tuple(ids[offset : offset + per_chat]))
        for index, offset in enumerate(range(0, len(ids), per_chat))
    ]


def make_fleet(root: Path, agents: Sequence[str], routes: Sequence[Route]) -> Fleet:
    fleet = Fleet(root, tuple(agents), tuple(routes))
    for agent in agents:
        card = fleet.workdir(agent) / TASKCARD_DIR
        card.mkdir(parents=True, exist_ok=True)
    return fleet


def card_body(agent: str, version: int) -> str:
    return f"card {agent} v{version}\n\n**step** {version}: still working"


class CardWriter:
    """Publishes cards through the file contract and logs (rename time, version) per agent.

    Bodies are replaced atomically (temp file, rename) as the contract says, without the
    producer's fsync: the storm writes 500 files a second and measures the service, not disks.
    """

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self.versions: dict[str, int] = {}
        self.log: dict[str, list[tuple[float, int]]] = {agent: [] for agent in fleet.agents}

    def activate_all(self) -> None:
        for agent in self._fleet.agents:
            self.publish(agent)
            (self._fleet.workdir(agent) / TASKCARD_DIR / STATUS_FILE).write_bytes(b"active")

    def publish(self, agent: str) -> float:
        version = self.versions.get(agent, -1) + 1
        self.versions[agent] = version
        folder = self._fleet.workdir(agent) / TASKCARD_DIR
        temp = folder / f".{BODY_FILE}.bench.tmp"
        temp.write_bytes(card_body(agent, version).encode())
        os.replace(temp, folder / BODY_FILE)
        at = time.monotonic()
        self.log[agent].append((at, version))
        return at


@dataclass
class Shown:
    """Which version each route (chat, agent) showed and since when, from a fake's log.

    Only accepted sends and edits count: a request answered 429 or 400 showed nothing.
    Every version tag in a message counts, so a board (one message, a line per agent, each
    line starting with the first line of the agent's card) shows each agent on it.
    `update()` reads only the requests recorded since its last call.
    """

    fake: FakeTelegram
    timeline: dict[tuple[int, str], list[tuple[float, int]]] = field(default_factory=dict)
    latest: dict[tuple[int, str], int] = field(default_factory=dict)
    _next: int = 0

    def update(self) -> None:
        requests = self.fake.requests
        for request in requests[self._next :]:
            if request.status != 200 or request.method not in CARD_METHODS:
                continue
            if request.chat_id is None:
                continue
            for match in VERSION_TAG.finditer(str(request.params.get("text", ""))):
                key = (request.chat_id, match.group(1))
                version = int(match.group(2))
                self.timeline.setdefault(key, []).append((request.at_s, version))
                self.latest[key] = max(version, self.latest.get(key, -1))
        self._next = len(requests)

    def showing(self, keys: Iterable[tuple[int, str]], versions: dict[str, int]) -> int:
        """How many of `keys` show at least the agent's version in `versions`."""
        self.update()
        return sum(
            1 for chat, agent in keys if self.latest.get((chat, agent), -1) >= versions[agent]
        )


def visible_delays(
    writes: Sequence[tuple[float, int]], shown: Sequence[tuple[float, int]], end_s: float
) -> list[tuple[float, bool]]:
    """For each write, the time until a version at least as new was shown on the route.

    Returns (delay, seen); a write never followed by such a version within the observation
    gets `end_s - write time` and seen=False (a lower bound, reported as such).
    """
    delays: list[tuple[float, bool]] = []
    index = 0
    for written_at, version in writes:
        while index < len(shown) and (shown[index][1] < version or shown[index][0] < written_at):
            index += 1
        if index < len(shown):
            delays.append((shown[index][0] - written_at, True))
        else:
            delays.append((end_s - written_at, False))
    return delays


# The bench's agents have cards but no agent host reading their activity, so after three
# quiet minutes the service would rightly post one "no host reads its activity" notice per
# agent: 10,000 notices in the idle and creation runs, sent through the same chats and
# budgets the scenarios measure. Scenarios measure cards, so that signal waits a day.
NO_HOST_SIGNALS = ("[signals]", "idle_floor_s = 86400")


def serve_config(
    fleet: Fleet,
    base_url: str,
    limits: Limits,
    *,
    debounce_ms: int | None = None,
    state_dir: str = "state",
    extra: Sequence[str] = (),
) -> str:
    """The config of one `serve` for the fleet, written beside `fleet.root` (relative paths);
    `extra` lines go at the end (a cluster instance's `[cluster]` table)."""
    lines = [f'state_dir = "{state_dir}"', 'log_level = "INFO"']
    for agent in fleet.agents:
        lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "agents/{agent}"']
    lines += [
        "[telegram]",
        f'token_env = "{TOKEN_ENV}"',
        f'api_base_url = "{base_url}"',
    ]
    for name in ("private_chat", "group_chat", "bot"):
        window: Window | None = getattr(limits, name)
        assert window is not None, "the service always enforces a limit"
        lines.append(
            f"limits.{name} = {{ max_calls = {window.max_calls}, period_s = {window.period_s} }}"
        )
    for route in fleet.routes:
        lines += [
            "[[telegram.routes]]",
            f"chat_id = {route.chat_id}",
            f"agents = {json.dumps(list(route.agents))}",
        ]
        if route.view != "cards":
            lines.append(f'view = "{route.view}"')
    lines += ["[console]", "enabled = false", *NO_HOST_SIGNALS]
    if debounce_ms is not None:
        lines += ["[watch]", f"debounce_ms = {debounce_ms}"]
    lines += extra
    return "\n".join(lines) + "\n"


def start_serve(fleet: Fleet, fake: FakeTelegram, limits: Limits) -> ServeProcess:
    config = fleet.root / "taskcard.toml"
    config.write_text(serve_config(fleet, fake.base_url, limits))
    return ServeProcess(config, env={TOKEN_ENV: fake.token}).start()


@dataclass
class SideBySide:
    """taskcard and the polling baseline, each against its own fake with the same limits."""

    serve: ServeProcess
    baseline: BaselineProcess | None
    ours: FakeTelegram
    theirs: FakeTelegram
    shown_ours: Shown
    shown_theirs: Shown
    keys: list[tuple[int, str]]
    fleet: Fleet | None = None

    def start_baseline(self) -> BaselineProcess:
        """Start the baseline told to wait (`side_by_side(defer_baseline=True)`)."""
        assert self.baseline is None and self.fleet is not None, "the baseline runs already"
        self.baseline = BaselineProcess(self.fleet, self.theirs).start()
        return self.baseline


@asynccontextmanager
async def side_by_side(
    fleet: Fleet,
    fake_limits: FakeLimits,
    serve_limits: Limits,
    *,
    with_baseline: bool = True,
    defer_baseline: bool = False,
    progress: Progress | None = None,
) -> AsyncIterator[SideBySide]:
    """Start both fakes, `serve` and (optionally) the baseline; stop both processes on exit
    and bring what each chat showed up to date. `defer_baseline`: the caller starts the
    baseline (`SideBySide.start_baseline`), so that `serve`'s start-up is measured without
    the baseline's own start-up on the same two cores."""
    async with (
        FakeTelegram(limits=fake_limits) as ours,
        FakeTelegram(limits=fake_limits) as theirs,
    ):
        serve = start_serve(fleet, ours, serve_limits)
        now = with_baseline and not defer_baseline
        baseline = BaselineProcess(fleet, theirs).start() if now else None
        run = SideBySide(
            serve, baseline, ours, theirs, Shown(ours), Shown(theirs), fleet.route_keys(), fleet
        )
        try:
            yield run
        finally:
            if run.baseline is not None:
                await run.baseline.stop()
                if progress is not None:
                    progress("baseline stopped")
            await serve.aterminate()
            if progress is not None:
                progress("serve stopped")
            run.shown_ours.update()
            run.shown_theirs.update()


class BaselineProcess:
    """`python -m bench.baseline SPEC` in a subprocess, its output in a file."""

    def __init__(self, fleet: Fleet, fake: FakeTelegram) -> None:
        spec = {
            "token": fake.token,
            "base_url": fake.base_url,
            "agents": {agent: str(fleet.workdir(agent)) for agent in fleet.agents},
            "routes": [{"chat_id": r.chat_id, "agents": list(r.agents)} for r in fleet.routes],
        }
        self.spec_path = fleet.root / "baseline.json"
        self.spec_path.write_text(json.dumps(spec))
        self.log_path = fleet.root / "baseline.log"
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BaselineProcess:
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.baseline", str(self.spec_path)],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def stop(self, timeout_s: float = 20.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self._close()
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await eventually(lambda: proc.poll() is not None, timeout_s=timeout_s)
        except AssertionError:
            proc.kill()
            proc.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class ProcessMeter:
    """CPU between `begin()` and `end()`, and peak RSS, of one process."""

    pid: int
    _start: CpuSample | None = None
    _start_wall: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    peak_rss_mb: float = 0.0

    def begin(self) -> None:
        self._start = cpu_of(self.pid)
        self._start_wall = time.monotonic()

    def end(self) -> None:
        assert self._start is not None, "begin() first"
        self.cpu_s = cpu_of(self.pid).own_s - self._start.own_s
        self.wall_s = time.monotonic() - self._start_wall
        self.peak_rss_mb = memory_of(self.pid)[1]

    @property
    def cpu_s_per_min(self) -> float:
        return self.cpu_s / self.wall_s * 60 if self.wall_s else float("nan")


async def wait_all_shown(
    shown: Shown, keys: Sequence[tuple[int, str]], versions: dict[str, int], timeout_s: float
) -> float:
    """Wait until every route shows its agent's version; returns the seconds it took."""
    started = time.monotonic()
    await eventually(
        lambda: shown.showing(keys, versions) == len(keys),
        timeout_s=timeout_s,
        what=f"{len(keys)} routes to show their cards",
    )
    return time.monotonic() - started


async def sleep_until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


class Progress:
    """Prints a scenario's phases with the seconds since it began (stderr, for the operator)."""

    def __init__(self, scenario: str) -> None:
        self._scenario = scenario
        self._started = time.monotonic()

    def __call__(self, message: str) -> None:
        elapsed = time.monotonic() - self._started
        print(f"  [{self._scenario} {elapsed:6.1f} s] {message}", file=sys.stderr, flush=True)
