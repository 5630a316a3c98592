"""Producer: one host process with 50 watches at `interval_s = 1` for 60 s.

The host (`bench.producer_host`) is a subprocess holding 50 `TaskCard`s, each with a small
Python renderer. Figures:

- host CPU beyond the renderers: the host's own utime+stime from /proc (not cutime/cstime,
  where the renderer children land once reaped), as a share of one core over the 60 s.
  Spawning and reading the renderers is host work and is included.
- tick drift: each tick's start (stamped by the host around the product's `run_renderer`)
  against the grid point the product gave it (`RunRequest.due`, `origin + k * interval_s`):
  how late the host launched the renderer. The per-tick period error (the gap between
  consecutive ticks minus the gap between their due times) is shown beside it, and ticks a
  render overran are counted as skipped.
- the floor: `bench.producer_floor` does only the system calls a tick cannot do without
  (spawn, one pipe, exit wait, read, atomic replace) for the same watches, run after the
  host, and again without the body's replace; its CPU is what no producer keeping the
  contract can go below on this machine, and the difference is the file system's share.
- one renderer run's cost: `run_renderer` against `subprocess.run([sys.executable, r.py])`
  with the same interpreter and environment, interleaved, on a quiet machine after the host
  has exited; wall time and CPU (this process plus its children, from `getrusage`).

The polling baseline has no producer side (the reference also runs the renderer on an
interval), so the ratio given here is against running the renderer directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from bench.harness import Progress
from bench.measure import CpuSample, cpu_of, percentile
from bench.producer_host import RENDERER
from bench.results import Figure, ScenarioResult
from taskcard.producers.task_card.renderer import RunRequest, renderer_environment, run_renderer
from tests.e2e.harness import ROOT

INTERVAL_S = 1.0


def _cpu_now_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def compare_renderer_runs(workdir: Path, runs: int) -> dict[str, list[float]]:
    """Wall and CPU milliseconds of `run_renderer` and of a direct run, interleaved."""
    workdir.mkdir(parents=True, exist_ok=True)
    renderer = workdir / "r.py"
    renderer.write_text(RENDERER)
    env = renderer_environment(os.environ)
    request = RunRequest(renderer, workdir, 10.0, 1_000_000, env)
    samples: dict[str, list[float]] = {
        "product_wall": [],
        "product_cpu": [],
        "direct_wall": [],
        "direct_cpu": [],
    }
    for _ in range(runs):
        cpu, wall = _cpu_now_s(), time.monotonic()
        outcome = run_renderer(request, threading.Event())
        samples["product_wall"].append((time.monotonic() - wall) * 1000)
        samples["product_cpu"].append((_cpu_now_s() - cpu) * 1000)
        assert outcome.exit_code == 0, outcome
        cpu, wall = _cpu_now_s(), time.monotonic()
        subprocess.run(
            [sys.executable, str(renderer)], cwd=workdir, env=env, capture_output=True, check=True
        )
        samples["direct_wall"].append((time.monotonic() - wall) * 1000)
        samples["direct_cpu"].append((_cpu_now_s() - cpu) * 1000)
    return samples


def _spawn(module: str, args: list[str], log: IO[bytes]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )


async def _measured(
    module: str, args: list[str], log_path: Path, duration_s: float
) -> tuple[float, float, CpuSample, CpuSample, int]:
    """Start `module`, wait for its `ready`, sample its CPU over `duration_s`, wait for its
    exit: (window start, window length, CPU before, CPU after, exit code)."""
    with log_path.open("wb") as log:
        process = _spawn(module, [*args, "--hold-s", str(duration_s + 1.5)], log)
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        if line.strip() != "ready":
            process.kill()
            raise RuntimeError(f"{module} did not start; see {log_path}")
        window_start = time.monotonic()
        before = cpu_of(process.pid)
        await asyncio.sleep(duration_s)
        after = cpu_of(process.pid)
        window_s = time.monotonic() - window_start
        code = await asyncio.to_thread(process.wait, 120)
        process.stdout.close()
    return window_start, window_s, before, after, code


async def run(workspace: Path, *, quick: bool) -> ScenarioResult:
    watches = 10 if quick else 50
    duration_s = 15.0 if quick else 60.0
    root = workspace / "producer"
    root.mkdir(parents=True, exist_ok=True)
    record_path = root / "record.json"
    started = time.monotonic()
    progress = Progress("producer")
    common = ["--watches", str(watches), "--interval-s", str(INTERVAL_S)]
    progress(f"starting {watches} watches; measuring {duration_s:.0f} s once they run")
    window_start, window_s, before, after, code = await _measured(
        "bench.producer_host",
        ["--root", str(root / "fleet"), "--out", str(record_path), *common],
        root / "host.log",
        duration_s,
    )
    if code != 0:
        raise RuntimeError(f"the producer host exited with {code}; see {root / 'host.log'}")
    record = json.loads(record_path.read_text())

    lateness_ms: list[float] = []
    period_error_ms: list[float] = []
    render_ms: list[float] = []
    ticks_in_window = 0
    skipped = 0
    for runs in record["runs"]:
        previous: tuple[float, float] | None = None
        for due, tick_start, tick_end in runs:
            if window_start <= tick_start <= window_start + window_s:
                ticks_in_window += 1
                lateness_ms.append((tick_start - due) * 1000)
                render_ms.append((tick_end - tick_start) * 1000)
                if previous is not None:
                    period_error_ms.append(
                        ((tick_start - previous[1]) - (due - previous[0])) * 1000
                    )
                    skipped += max(0, round((due - previous[0]) / INTERVAL_S) - 1)
            previous = (due, tick_start)

    progress("comparing single renderer runs")
    samples = await asyncio.to_thread(compare_renderer_runs, root / "compare", 10 if quick else 20)
    floor_pct: dict[bool, float] = {}
    for publish in (True, False):
        what = "the bare system calls of the same ticks" + ("" if publish else ", no replace")
        progress(f"{what}, {duration_s:.0f} s")
        _, floor_s, floor_before, floor_after, floor_code = await _measured(
            "bench.producer_floor",
            ["--root", str(root / "floor"), *common, *([] if publish else ["--no-publish"])],
            root / "floor.log",
            duration_s,
        )
        if floor_code != 0:
            raise RuntimeError(f"the floor program exited with {floor_code}; see {root}/floor.log")
        floor_pct[publish] = (floor_after.own_s - floor_before.own_s) / floor_s * 100

    host_cpu_pct = (after.own_s - before.own_s) / window_s * 100
    renderers_cpu_pct = (after.children_s - before.children_s) / window_s * 100
    drift_p99 = percentile(lateness_ms, 0.99)
    expected_ticks = watches * window_s / INTERVAL_S
    result = ScenarioResult(
        "producer",
        f"one host process, {watches} watches (one TaskCard per workdir) at interval_s = "
        f"{INTERVAL_S:g} for {duration_s:.0f} s; renderer: a 3-line Python script.",
        wall_s=time.monotonic() - started,
    )

    def median(key: str) -> float:
        return percentile(samples[key], 0.5)

    result.figures += [
        Figure("host CPU beyond renderers", host_cpu_pct, "% core", "<= 2", host_cpu_pct <= 2),
        Figure(
            "bare system calls of the same ticks",
            floor_pct[True],
            "% core",
            note="bench.producer_floor: spawn, one pipe, exit wait, read, rename; nothing else",
        ),
        Figure(
            "the same without the body's atomic replace",
            floor_pct[False],
            "% core",
            note="spawn, pipe, exit wait and read alone",
        ),
        Figure(
            "tick drift p99",
            drift_p99,
            "ms",
            "<= 10",
            drift_p99 <= 10,
            note="renderer launch against its due time, origin + k * interval_s",
        ),
        Figure("tick drift max", max(lateness_ms, default=float("nan")), "ms"),
        Figure(
            "tick period error p99",
            percentile(period_error_ms, 0.99),
            "ms",
            note="gap between consecutive ticks minus the gap between their due times",
        ),
        Figure("ticks done / scheduled", ticks_in_window / expected_ticks * 100, "%"),
        Figure("ticks skipped (a render overran)", skipped, ""),
        Figure("renderer run under load (p50)", percentile(render_ms, 0.5), "ms"),
        Figure("renderers' CPU (reaped children)", renderers_cpu_pct, "% core"),
        Figure(
            "one renderer run, wall (p50)",
            median("product_wall"),
            "ms",
            "",
            None,
            median("direct_wall"),
            note="baseline column: the renderer run directly",
        ),
        Figure(
            "one renderer run, CPU (p50)",
            median("product_cpu"),
            "ms",
            "",
            None,
            median("direct_cpu"),
            note="host plus child CPU; baseline: run directly",
        ),
    ]
    result.notes.append(
        f"{ticks_in_window} ticks in the {window_s:.0f} s window, {expected_ticks:.0f} scheduled."
    )
    return result
