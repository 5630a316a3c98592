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
`serve` until every route showed its first card. The polling baseline runs on the same files
with the same schedule of changes, against its own unlimited fake, after `serve` has stopped;
its process is measured the same way. One at a time, because the baseline keeps most of a
core busy: measured beside it, serve's CPU figure moved with the contention as much as with
its own work.

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
    BaselineProcess,
    CardWriter,
    Fleet,
    ProcessMeter,
    Progress,
    Shown,
    agent_ids,
    chat_routes,
    make_fleet,
    sleep_until,
    start_serve,
    visible_delays,
    wait_all_shown,
)
from bench.measure import percentile
from bench.results import Figure, ScenarioResult
from tests.e2e.harness import ServeProcess
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

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


@dataclass
class _Phase:
    """What one process (taskcard or the baseline) did in its own phase of the run."""

    meter: ProcessMeter
    latencies_ms: list[float]
    first_card_s: float


async def _phase(
    who: str,
    fleet: Fleet,
    writer: CardWriter,
    changing: list[str],
    duration_s: float,
    progress: Progress,
) -> _Phase:
    """Start `who` ("taskcard" or "baseline") against a fake of its own, wait until every
    route shows its agent's latest card, then change `changing` in turns for `duration_s`
    while metering the process; stop it and read what each chat showed."""
    keys = fleet.route_keys()
    async with FakeTelegram(limits=FakeLimits.unlimited()) as fake:
        shown = Shown(fake)
        serve: ServeProcess | None = None
        baseline: BaselineProcess | None = None
        if who == "taskcard":
            serve = start_serve(fleet, fake, UNLIMITED_CONFIG)
            assert serve.proc is not None
            pid = serve.proc.pid
        else:
            baseline = BaselineProcess(fleet, fake).start()
            pid = baseline.pid
        try:
            # The wait begins as the process is started, so its start-up is part of the figure.
            first_card_s = await wait_all_shown(shown, keys, writer.versions, 900)
            progress(f"{who} shows all {len(keys)} residents; changing phase begins")
            await sleep_until(time.monotonic() + 2.0)  # let it settle after the creation
            meter = ProcessMeter(pid)
            meter.begin()
            first = time.monotonic()
            step_s = CHANGE_PERIOD_S / len(changing)
            index = 0
            while True:
                due = first + index * step_s
                if due > first + duration_s:
                    break
                await sleep_until(due)
                writer.publish(changing[index % len(changing)])
                index += 1
            await sleep_until(time.monotonic() + 2.0)
            meter.end()
            end_s = time.monotonic()
            progress(f"{who}: changing phase over; stopping")
        finally:
            if baseline is not None:
                await baseline.stop()
            if serve is not None:
                await serve.aterminate()
            shown.update()
    latencies: list[float] = []
    for chat, agent in keys:
        writes = [w for w in writer.log[agent] if first <= w[0] <= end_s]
        if writes:
            timeline = shown.timeline.get((chat, agent), [])
            latencies += [d * 1000 for d, _ in visible_delays(writes, timeline, end_s)]
    return _Phase(meter, latencies, first_card_s)


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
    changing = list(ids[::CHANGING_EVERY_NTH])
    started = time.monotonic()
    progress = Progress(size.name)
    # One process at a time: the polling baseline keeps most of a core busy, and measured
    # beside it the service's CPU figure counted the contention (caches, the scheduler) as
    # much as its own work (RESULTS.md, 2026-12-03 13:00). Same files, same schedule of
    # changes, each against its own fake, one after the other.
    ours = await _phase("taskcard", fleet, writer, changing, duration_s, progress)
    theirs = await _phase("baseline", fleet, writer, changing, duration_s, progress)
    meter_ours, meter_theirs = ours.meter, theirs.meter
    warmup_ours_s = ours.first_card_s
    ours_ms, theirs_ms = ours.latencies_ms, theirs.latencies_ms
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
