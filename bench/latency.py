"""Latency: from the rename of a card body to the fake receiving the edit that shows it.

One agent per private chat, its body replaced every 2 s by the harness (no renderer, to
isolate the service). To collect 200 samples in 50 s instead of 400 s, eight such agents run
side by side with their renames staggered by 250 ms: the service never has two changes in
hand at once (one takes a few milliseconds), and each chat sees one edit per 2 s, far inside
its limit of 1 per second. The polling baseline reads the same files at the same time and
edits its own fake, so both see identical writes; it does a few `stat`s per second, which
costs the service nothing measurable.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from bench.harness import (
    CardWriter,
    Limits,
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

PERIOD_S = 2.0
AGENTS = 8
FIRST_CHAT = 5001


async def run(workspace: Path, *, quick: bool) -> ScenarioResult:
    samples = 40 if quick else 200
    agents = agent_ids(AGENTS)
    fleet = make_fleet(workspace / "latency", agents, chat_routes(agents, 1, FIRST_CHAT, 1))
    limits = Limits()
    writer = CardWriter(fleet)
    writer.activate_all()
    started = time.monotonic()
    progress = Progress("latency")
    async with side_by_side(fleet, limits.fake(), limits) as run:
        serve = run.serve
        shown_ours = run.shown_ours
        shown_theirs = run.shown_theirs
        keys = run.keys
        await wait_all_shown(shown_ours, keys, writer.versions, 60)
        await wait_all_shown(shown_theirs, keys, writer.versions, 60)
        progress(f"both show their {len(keys)} residents; {samples} renames follow")
        meter = ProcessMeter(serve.proc.pid if serve.proc else 0)
        meter.begin()
        first = time.monotonic() + 1.0
        stagger_s = PERIOD_S / AGENTS
        for index in range(samples):
            await sleep_until(first + index * stagger_s)
            writer.publish(agents[index % AGENTS])
        await sleep_until(time.monotonic() + 3.0)
        meter.end()
        progress("done; stopping")
    end_s = time.monotonic()

    def delays_ms(shown: Shown) -> tuple[list[float], int]:
        values: list[float] = []
        missed = 0
        for chat, agent in keys:
            writes = writer.log[agent][1:]  # v0 only created the resident
            for delay_s, seen in visible_delays(
                writes, shown.timeline.get((chat, agent), []), end_s
            ):
                values.append(delay_s * 1000)
                missed += not seen
        return values, missed

    ours_ms, ours_missed = delays_ms(shown_ours)
    theirs_ms, theirs_missed = delays_ms(shown_theirs)

    def stat(values: list[float], fraction: float) -> float:
        return percentile(values, fraction)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    p50, p99 = stat(ours_ms, 0.50), stat(ours_ms, 0.99)
    result = ScenarioResult(
        "latency",
        f"{len(ours_ms)} samples: {AGENTS} agents, one private chat each, each body replaced "
        f"every {PERIOD_S:g} s, renames staggered by {PERIOD_S / AGENTS * 1000:.0f} ms; "
        "limits 1/s per private chat, 30/s per bot.",
        wall_s=time.monotonic() - started,
    )
    result.figures += [
        Figure("p50", p50, "ms", "<= 8", p50 <= 8, stat(theirs_ms, 0.50)),
        Figure("p95", stat(ours_ms, 0.95), "ms", "", None, stat(theirs_ms, 0.95)),
        Figure("p99", p99, "ms", "<= 20", p99 <= 20, stat(theirs_ms, 0.99)),
        Figure("mean", mean(ours_ms), "ms", "", None, mean(theirs_ms)),
        Figure(
            "max", max(ours_ms, default=math.nan), "ms", "", None, max(theirs_ms, default=math.nan)
        ),
        Figure(
            "changes never shown",
            float(ours_missed),
            "",
            "0",
            ours_missed == 0,
            float(theirs_missed),
        ),
        Figure("serve CPU", meter.cpu_s_per_min, "s/min", "", None),
    ]
    return result
