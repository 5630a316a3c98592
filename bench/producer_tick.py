"""Host CPU of one producer tick, measured in one thread (an investigation tool, not a scenario).

One `TaskCard` with one watch whose own updater never ticks (interval one day); the calling
thread then runs N ticks through the same path the updater takes (`_refresh` with
`from_tick=True`) with the real renderer of `bench.producer_host`. The figure is this
thread's CPU (`time.thread_time`, user + system of the thread only: renderers are separate
processes and other load on the machine does not count), per tick, split into the renderer
run (`run_renderer` alone, same request) and the rest (publishing and bookkeeping).

    python -m bench.producer_tick [--ticks 300] [--phase all|run|tick]

Robust to a loaded machine, but not to CPU frequency changes; compare runs of one session.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.producer_host import RENDERER
from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.renderer import (
    RunRequest,
    become_subreaper,
    renderer_environment,
    run_renderer,
    stdout_limit_for,
)
from taskcard.producers.task_card.settings import DEFAULT_MAX_BODY_CHARS


def measure(ticks: int, phase: str) -> dict[str, float]:
    become_subreaper()  # as `taskcard host` does
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        workdir = root / "w"
        workdir.mkdir()
        (workdir / "r.py").write_text(RENDERER)
        with TaskCard(workdir, runtime_dir=root / "runtime") as card:
            result = card.call(
                {
                    "action": "start",
                    "input": {"renderer_path": "r.py", "interval_s": 86_400},
                    "reasoning": "benchmark",
                }
            )
            assert result["status"] == "watching", result
            watch = card._current
            assert watch is not None
            figures: dict[str, float] = {}
            if phase in ("all", "tick"):
                for _ in range(5):  # warm-up
                    card._refresh(watch, counted=True, from_tick=True, due=time.monotonic())
                before = time.thread_time()
                for _ in range(ticks):
                    card._refresh(watch, counted=True, from_tick=True, due=time.monotonic())
                figures["tick_ms"] = (time.thread_time() - before) / ticks * 1000
            if phase in ("all", "run"):
                request = RunRequest(
                    card.workdir / watch.renderer_rel,
                    card.workdir,
                    watch.timeout_s,
                    stdout_limit_for(DEFAULT_MAX_BODY_CHARS),
                    renderer_environment(os.environ),
                )
                cancel = threading.Event()
                before = time.thread_time()
                for _ in range(ticks):
                    run_renderer(request, cancel)
                figures["run_ms"] = (time.thread_time() - before) / ticks * 1000
            if "tick_ms" in figures and "run_ms" in figures:
                figures["rest_ms"] = figures["tick_ms"] - figures["run_ms"]
            return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=300)
    parser.add_argument("--phase", choices=("all", "run", "tick"), default="all")
    args = parser.parse_args(argv)
    figures = measure(args.ticks, args.phase)
    print(" ".join(f"{key}={value:.3f}" for key, value in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
