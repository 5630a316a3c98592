"""Scale: a large fleet with a few agents changing, through a channel with no limits.

10,000 agents configured and routed to 100 groups of 100 (`scale`; `scale2k`: 2,000 in 20
groups); all publish a card first, and the measurement starts once every resident exists.
Then 5% of them (every 20th agent) change every 5 s for 120 s, evenly spread (100 renames a
second at 10,000). Quick mode: 500 agents (`scale2k`: 200) for 20 s.

"A channel with no limits": the fake Telegram with `FakeLimits.unlimited()`, and the service
configured with limits far above the load. Why not the console channel writing to /dev/null:
the Telegram path (rendering entities, python-telegram-bot, HTTP, the fake's answers) is what a
fleet runs in production, and its client cost is a real part of CPU and memory; the console
channel would measure a process that does less than any deployment does.

Figures: CPU seconds per minute of the `serve` process during the changing phase (its own
utime+stime from /proc), its peak RSS (VmHWM, which includes start-up and the creation of
every resident), the rename-to-edit latency of every change, and the time from the start of
`serve` until every route showed its first card (serve starts alone: the baseline is started
once serve shows every card). The polling baseline runs beside it on the same files, against
its own unlimited fake, for the changing phase; its process is measured the same way.

Targets (issue 13) by size: 10,000 agents at most 5 CPU-s per minute, peak RSS at most
150 MB, latency p50 at most 20 ms and p99 at most 100 ms, first card on every route within
15 s; 2,000 agents at most 2 CPU-s per minute (its other figures have no target of their own).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import (
    UNLIMITED_CONFIG,
    CardWriter,
    ProcessMeter,
    Progress,
    Shown,
    agent_ids,
    chat_routes,
    make_fleet,
    side_by_side,
    sleep_until,
    visible_delays,
    wait_all_shown,
)
from bench.measure import percentile
from bench.results import Figure, ScenarioResult
from tests.fakes.telegram_api import FakeLimits

PER_GROUP = 100
FIRST_GROUP = -1008000000000
CHANGE_PERIOD_S = 5.0
CHANGING_EVERY_NTH = 20  # 5%


@dataclass(frozen=True)
class Size:
    """One size of the scenario and its targets (None: no target of its own)."""

    name: str
    agents: int
    quick_agents: int
    cpu_s_per_min: float
    peak_rss_mb: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    first_card_s: float | None = None


FLEET_10K = Size("scale", 10_000, 500, 5.0, 150.0, 20.0, 100.0, 15.0)
FLEET_2K = Size("scale2k", 2_000, 200, 2.0)


def _at_most(value: float, target: float | None) -> tuple[str, bool | None]:
    if target is None:
        return "", None
    return f"<= {target:g}", value <= target


async def run(
    workspace: Path,
    *,
    quick: bool,
    agents: int | None = None,
    duration_s: float | None = None,
    size: Size = FLEET_10K,
) -> ScenarioResult:
    """`agents` and `duration_s` override the mode's sizes (for trying one dimension)."""
    count = agents or (size.quick_agents if quick else size.agents)
    duration_s = duration_s or (20.0 if quick else 120.0)
    ids = agent_ids(count)
    routes = chat_routes(ids, PER_GROUP, FIRST_GROUP, -1)
    fleet = make_fleet(workspace / size.name, ids, routes)
    writer = CardWriter(fleet)
    writer.activate_all()
    changing = ids[::CHANGING_EVERY_NTH]
    started = time.monotonic()
    progress = Progress(size.name)
    async with side_by_side(
        fleet, FakeLimits.unlimited(), UNLIMITED_CONFIG, defer_baseline=True, progress=progress
    ) as run:
        serve = run.serve
        shown_ours = run.shown_ours
        shown_theirs = run.shown_theirs
        keys = run.keys
        # The wait begins as `serve` is started, so its start-up is part of the figure. The
        # baseline starts once it is over: its own start-up on the same two cores is not
        # part of what a deployment's first cards wait for (RESULTS.md, 2026-12-04).
        warmup_ours_s = await wait_all_shown(shown_ours, keys, writer.versions, 900)
        progress(f"taskcard shows all {len(keys)} residents")
        baseline = run.start_baseline()
        await wait_all_shown(shown_theirs, keys, writer.versions, 900)
        progress(f"the baseline shows all {len(keys)} residents; changing phase begins")
        await sleep_until(time.monotonic() + 2.0)  # let both settle after the creation
        meter_ours = ProcessMeter(serve.proc.pid if serve.proc else 0)
        meter_theirs = ProcessMeter(baseline.pid)
        meter_ours.begin()
        meter_theirs.begin()
        first = time.monotonic()
        step_s = CHANGE_PERIOD_S / len(changing)
        window_start = first
        index = 0
        while True:
            due = first + index * step_s
            if due > first + duration_s:
                break
            await sleep_until(due)
            writer.publish(changing[index % len(changing)])
            index += 1
        await sleep_until(time.monotonic() + 2.0)
        meter_ours.end()
        meter_theirs.end()
        progress("changing phase over; stopping")
        end_s = time.monotonic()

    def latencies_ms(shown: Shown) -> list[float]:
        values: list[float] = []
        for chat, agent in keys:
            writes = [w for w in writer.log[agent] if w[0] >= window_start]
            if not writes:
                continue
            timeline = shown.timeline.get((chat, agent), [])
            values += [d * 1000 for d, _ in visible_delays(writes, timeline, end_s)]
        return values

    ours_ms, theirs_ms = latencies_ms(shown_ours), latencies_ms(shown_theirs)
    cpu = meter_ours.cpu_s_per_min
    rss = meter_ours.peak_rss_mb
    p50 = percentile(ours_ms, 0.5)
    p99 = percentile(ours_ms, 0.99)
    result = ScenarioResult(
        size.name,
        f"{count} agents in {len(routes)} groups of {PER_GROUP}; {len(changing)} of them "
        f"({100 / CHANGING_EVERY_NTH:.0f}%) change every {CHANGE_PERIOD_S:g} s for "
        f"{duration_s:.0f} s ({len(ours_ms)} changes); unlimited fake Telegram.",
        wall_s=time.monotonic() - started,
    )
    result.figures += [
        Figure(
            "serve CPU",
            cpu,
            "s/min",
            *_at_most(cpu, size.cpu_s_per_min),
            meter_theirs.cpu_s_per_min,
        ),
        Figure(
            "peak RSS",
            rss,
            "MB",
            *_at_most(rss, size.peak_rss_mb),
            meter_theirs.peak_rss_mb,
            note="VmHWM of the process, start-up and resident creation included",
        ),
        Figure("latency p50", p50, "ms", *_at_most(p50, size.p50_ms), percentile(theirs_ms, 0.5)),
        Figure("latency p99", p99, "ms", *_at_most(p99, size.p99_ms), percentile(theirs_ms, 0.99)),
        Figure(
            "first card on every route",
            warmup_ours_s,
            "s",
            *_at_most(warmup_ours_s, size.first_card_s),
            note="from the start of the serve process",
        ),
    ]
    return result
