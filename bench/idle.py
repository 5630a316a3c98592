"""Idle: a large fleet that does not change, to show that size alone costs nothing measurable.

10,000 agents (quick: 500) routed to groups of 100 on the fake Telegram without limits; all
publish a card first, and the measurement starts once every resident exists and the service
has settled. Then nothing changes for `duration_s` (a full rescan round of the service's
default 300 s in the full run, so the safety-net rescan is paid for in the figure, not
skipped), and the `serve` process's own CPU time is measured.

The polling baseline runs beside it on the same files: it re-reads every agent on each poll,
which is what an idle fleet costs when the cost grows with size.

Figure: CPU seconds per minute of `serve` while idle (target: under 0.5 at 10,000 agents).
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.harness import (
    UNLIMITED_CONFIG,
    CardWriter,
    ProcessMeter,
    Progress,
    agent_ids,
    chat_routes,
    make_fleet,
    side_by_side,
    sleep_until,
    wait_all_shown,
)
from bench.results import Figure, ScenarioResult
from tests.fakes.telegram_api import FakeLimits

PER_GROUP = 100
FIRST_GROUP = -1007000000000
SETTLE_S = 10.0  # after the last resident appears: commits, first rescan slices, GC
TARGET_CPU_S_PER_MIN = 0.5


async def run(
    workspace: Path, *, quick: bool, agents: int | None = None, duration_s: float | None = None
) -> ScenarioResult:
    """`agents` and `duration_s` override the mode's sizes (for a smoke run)."""
    count = agents or (500 if quick else 10_000)
    duration_s = duration_s or (30.0 if quick else 300.0)
    ids = agent_ids(count)
    routes = chat_routes(ids, PER_GROUP, FIRST_GROUP, -1)
    fleet = make_fleet(workspace / "idle", ids, routes)
    writer = CardWriter(fleet)
    writer.activate_all()
    started = time.monotonic()
    progress = Progress("idle")
    async with side_by_side(
        fleet, FakeLimits.unlimited(), UNLIMITED_CONFIG, progress=progress
    ) as run:
        assert run.baseline is not None  # side_by_side starts it unless told not to
        await wait_all_shown(run.shown_ours, run.keys, writer.versions, 900)
        progress(f"taskcard shows all {len(run.keys)} residents; settling")
        await sleep_until(time.monotonic() + SETTLE_S)
        ours = ProcessMeter(run.serve.proc.pid if run.serve.proc else 0)
        theirs = ProcessMeter(run.baseline.pid)
        ours.begin()
        theirs.begin()
        requests_before = len(run.ours.requests)
        progress(f"idle phase: {duration_s:.0f} s without a change")
        await sleep_until(time.monotonic() + duration_s)
        ours.end()
        theirs.end()
        requests_while_idle = len(run.ours.requests) - requests_before
        progress("idle phase over; stopping")
    cpu = ours.cpu_s_per_min
    result = ScenarioResult(
        "idle",
        f"{count} agents in {len(routes)} groups of {PER_GROUP}, every card shown, then"
        f" {duration_s:.0f} s without a change; unlimited fake Telegram.",
        wall_s=time.monotonic() - started,
    )
    result.figures.append(
        Figure(
            "idle serve CPU",
            cpu,
            "s/min",
            f"< {TARGET_CPU_S_PER_MIN:g}",
            cpu < TARGET_CPU_S_PER_MIN,
            theirs.cpu_s_per_min,
            note="own utime+stime of the process; the rescan round is inside the window",
        )
    )
    result.notes.append(
        f"requests to the fake while idle: {requests_while_idle} (command long polls included)"
    )
    return result
