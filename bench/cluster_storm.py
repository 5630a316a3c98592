"""Cluster storm: the storm scenario served by three `taskcard serve` instances on one Redis.

The agents and routes are those of `storm` (100 agents, each body replaced every 200 ms for
120 s; one group with every resident, private chats of 5), but the workdirs are split across
three instances as if on three machines: the private chats are dealt out round-robin, each
instance gets the agents of its chats, and each routes the group for its own share. So the
group receives cards from all three, and the group's, the private chats' and the bot's
limits hold only if the instances share them through Redis (a real `redis-server` on
loopback, started here). One fake Telegram enforces the limits for all three with real 429s.

The group window is shortened to 20 per 20 s by default exactly as in `storm` (see there why);
`--real-limits` runs 20 per 60 s.

Figures: 429 answers; the most requests the fake accepted in any window of each limit (the
group's, one private chat's, the bot's), from the fake's own log; staleness per chat kind and
the drain after the storm, computed as in `storm`; residents duplicated (a second message of
one agent in one chat: must be 0); and the serve CPU of each instance.

The baseline beside it is the polling baseline of `storm` (one process reading every agent,
against its own fake with the same limits): what the same fleet costs without taskcard. It
is one process, so its CPU compares with the three instances' sum, not with one of them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench.harness import (
    CARD_METHODS,
    TOKEN_ENV,
    VERSION_TAG,
    BaselineProcess,
    CardWriter,
    Fleet,
    Limits,
    ProcessMeter,
    Progress,
    Route,
    Shown,
    agent_ids,
    chat_routes,
    make_fleet,
    serve_config,
)
from bench.measure import percentile
from bench.results import Figure, ScenarioResult
from bench.storm import (
    CHANGE_PERIOD_S,
    FIRST_PRIVATE,
    GROUP,
    PER_PRIVATE_CHAT,
    SLACK_S,
    Analysis,
    drain_figure,
    max_in_window,
    watch_drain,
    write_storm,
)
from tests.e2e.harness import ServeProcess, eventually
from tests.fakes.telegram_api import BOT_LIMITED_METHODS, FakeTelegram, Window
from tests.redis_server import RedisServer, have_redis

INSTANCES = 3


@dataclass(frozen=True)
class Share:
    """What one instance serves: its agents and its routes (the group's part among them)."""

    name: str
    agents: tuple[str, ...]
    routes: tuple[Route, ...]


def _window_text(window: Window | None) -> str:
    return "none" if window is None else f"{window.max_calls} per {window.period_s:g} s"


def split(routes: Sequence[Route], instances: int) -> list[Share]:
    """Deal the private chats round-robin; each instance routes the group for its agents."""
    private = [route for route in routes if route.chat_id > 0]
    shares = []
    for index in range(instances):
        mine = private[index::instances]
        agents = tuple(agent for route in mine for agent in route.agents)
        shares.append(Share(f"i{index}", agents, (Route(GROUP, agents), *mine)))
    return shares


def instance_config(
    fleet: Fleet, share: Share, base_url: str, limits: Limits, redis: str, prefix: str
) -> str:
    """The config of one instance, written in `fleet.root` beside the others (its own state)."""
    mine = replace(fleet, agents=share.agents, routes=share.routes)
    cluster = ["[cluster]", f'redis_url = "{redis}"', f'instance = "{share.name}"']
    cluster.append(f'key_prefix = "{prefix}"')
    return serve_config(mine, base_url, limits, state_dir=f"{share.name}/state", extra=cluster)


class ClusterAnalysis(Analysis):
    """`storm`'s figures of one subject (the three instances, or the baseline), plus the most
    requests its fake accepted in any window of each limit and the residents duplicated."""

    def __init__(
        self,
        fleet: Fleet,
        limits: Limits,
        fake: FakeTelegram,
        shown: Shown,
        writer: CardWriter,
        storm: tuple[float, float],
        end_s: float,
    ) -> None:
        super().__init__(fleet, limits, fake, shown, writer, storm, end_s)
        accepted = [r for r in fake.requests if r.status != 429]
        per_chat: dict[int, list[float]] = {}
        for request in accepted:
            if request.method in CARD_METHODS and request.chat_id is not None:
                per_chat.setdefault(request.chat_id, []).append(request.at_s)
        assert limits.group_chat and limits.private_chat and limits.bot
        self.group_max = max_in_window(per_chat.get(GROUP, []), limits.group_chat.period_s)
        self.private_max = max(
            (max_in_window(t, limits.private_chat.period_s) for c, t in per_chat.items() if c > 0),
            default=0,
        )
        self.bot_max = max_in_window(
            (r.at_s for r in accepted if r.method in BOT_LIMITED_METHODS), limits.bot.period_s
        )
        self.duplicated = 0
        for route in fleet.routes:
            seen: dict[str, int] = {}
            for message in fake.bot_messages(route.chat_id):
                match = VERSION_TAG.search(message.text)
                if match is not None:
                    seen[match.group(1)] = seen.get(match.group(1), 0) + 1
            self.duplicated += sum(count - 1 for count in seen.values() if count > 1)


async def run(
    workspace: Path,
    *,
    quick: bool,
    real_limits: bool = False,
    agents: int | None = None,
    duration_s: float | None = None,
    with_baseline: bool = True,
) -> ScenarioResult:
    """`agents` and `duration_s` override the mode's sizes; `with_baseline=False` runs the
    three instances alone."""
    if not have_redis():
        raise RuntimeError("redis-server is not installed (`make redis-server` installs it)")
    count = agents or (30 if quick else 100)
    duration_s = duration_s or (20.0 if quick else 120.0)
    group_period_s = 60.0 if real_limits else 20.0
    limits = Limits(group_chat=Window(20, group_period_s))
    ids = agent_ids(count)
    routes = [Route(GROUP, ids), *chat_routes(ids, PER_PRIVATE_CHAT, FIRST_PRIVATE, 1)]
    root = workspace / "cluster_storm"
    fleet = make_fleet(root, ids, routes)
    shares = split(routes, INSTANCES)
    writer = CardWriter(fleet)
    writer.activate_all()
    group_rate = 20 / group_period_s
    group_bound_s = count / group_rate + SLACK_S
    private_bound_s = PER_PRIVATE_CHAT / 1.0 + SLACK_S
    keys = fleet.route_keys()
    started = time.monotonic()
    progress = Progress("cluster_storm")
    redis = RedisServer(root / "redis").start()
    serves: list[ServeProcess] = []
    baseline: BaselineProcess | None = None
    try:
        async with (
            FakeTelegram(limits=limits.fake()) as ours,
            FakeTelegram(limits=limits.fake()) as theirs,
        ):
            prefix = f"bench-{uuid.uuid4().hex[:8]}"
            for share in shares:
                config = root / f"{share.name}.toml"
                config.write_text(
                    instance_config(fleet, share, ours.base_url, limits, redis.url, prefix)
                )
                serves.append(ServeProcess(config, env={TOKEN_ENV: ours.token}).start())
            baseline = BaselineProcess(fleet, theirs).start() if with_baseline else None
            shown_ours, shown_theirs = Shown(ours), Shown(theirs)
            await eventually(
                lambda: (
                    ours.count("getMe") >= INSTANCES and (baseline is None or theirs.count("getMe"))
                ),
                timeout_s=60,
                what="the instances and the baseline to reach their fakes",
            )
            meters = [ProcessMeter(serve.proc.pid if serve.proc else 0) for serve in serves]
            for meter in meters:
                meter.begin()
            progress(f"storm of {duration_s:.0f} s begins on {INSTANCES} instances")
            storm_start, storm_stop = await write_storm(writer, ids, duration_s)
            for meter in meters:
                meter.end()
            progress(f"storm over; observing the drain for up to {group_bound_s + 5:.0f} s")
            end_s = await watch_drain(
                writer,
                keys,
                shown_ours,
                shown_theirs if baseline is not None else None,
                storm_stop + group_bound_s + 5.0,
            )
            progress("drain observed; stopping")
            if baseline is not None:
                await baseline.stop()
            for serve in serves:
                await serve.aterminate()
            window = (storm_start, storm_stop)
            mine = ClusterAnalysis(fleet, limits, ours, shown_ours, writer, window, end_s)
            base = ClusterAnalysis(fleet, limits, theirs, shown_theirs, writer, window, end_s)
    finally:
        for serve in serves:
            if serve.proc is not None and serve.proc.poll() is None:
                serve.kill()
        if baseline is not None:
            await baseline.stop()
        redis.stop()
    observed_s = end_s - storm_stop
    result = ScenarioResult(
        "cluster_storm",
        f"storm at {INSTANCES} instances on one Redis: {count} agents, each body replaced "
        f"every {CHANGE_PERIOD_S * 1000:.0f} ms for {duration_s:.0f} s; one group with all "
        f"{count} residents (fed by all {INSTANCES}), {len(routes) - 1} private chats of "
        f"{PER_PRIVATE_CHAT} dealt out round-robin (agents per instance: "
        f"{', '.join(str(len(s.agents)) for s in shares)}); cold start; limits "
        f"{_window_text(limits.private_chat)} per private chat, "
        f"{_window_text(limits.group_chat)} per group, {_window_text(limits.bot)} per bot, "
        "one fake.",
        wall_s=time.monotonic() - started,
    )
    assert limits.bot is not None and limits.private_chat is not None
    assert limits.group_chat is not None
    windows = [
        ("group", mine.group_max, base.group_max, limits.group_chat),
        ("private chat", mine.private_max, base.private_max, limits.private_chat),
        ("bot", mine.bot_max, base.bot_max, limits.bot),
    ]
    figures = [
        Figure("429 answers", float(mine.rate_limited), "", "0", mine.rate_limited == 0,
               float(base.rate_limited)),
    ]  # fmt: skip
    for label, value, theirs_value, limit in windows:
        figures.append(
            Figure(
                f"{label}: requests in any {limit.period_s:g} s (max)",
                float(value),
                "",
                f"<= {limit.max_calls}",
                value <= limit.max_calls,
                float(theirs_value),
                note="accepted by the fake (429s excluded), all instances together",
            )
        )
    for kind in ("group", "private"):
        for label, fraction in (("p50", 0.5), ("p99", 0.99)):
            figures.append(
                Figure(
                    f"{kind}: staleness {label}",
                    percentile(mine.staleness[kind], fraction),
                    "s",
                    baseline=percentile(base.staleness[kind], fraction),
                )
            )
    for kind, bound_s in (("group", group_bound_s), ("private", private_bound_s)):
        figures.append(drain_figure(kind, bound_s, mine, base, observed_s, with_baseline))
    figures.append(
        Figure("residents duplicated", float(mine.duplicated), "", "0", mine.duplicated == 0,
               float(base.duplicated))
    )  # fmt: skip
    per_instance = [meter.cpu_s_per_min for meter in meters]
    figures.append(
        Figure(
            "serve CPU per instance (max)",
            max(per_instance),
            "s/min",
            note="each instance: " + ", ".join(f"{cpu:.1f}" for cpu in per_instance),
        )
    )
    figures.append(
        Figure(
            "serve CPU, three instances together",
            sum(per_instance),
            "s/min",
            baseline=None,
            note="compare with the single-process storm row and the baseline's process",
        )
    )
    if baseline is None:
        figures = [replace(figure, baseline=None) for figure in figures]
        result.notes.append("run without the polling baseline beside it")
    result.figures += figures
    return result
