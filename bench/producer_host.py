"""A producer host holding many watches, for the producer benchmark (run as a subprocess).

The product's host serves one workdir; here one process holds one `TaskCard` per workdir and
starts one watch in each, which is what "one host with 50 watches" means with today's API. Like
`taskcard host`, the process makes itself the child subreaper of renderer descendants. The
renderer runner is the product's `run_renderer`, wrapped only to stamp when each tick was due,
started and ended (the host's own record of its ticks).

Protocol: prints `ready` once every watch has started, keeps them running for `--hold-s`
seconds, closes every card (the updater threads end, the watches are left for a later host)
and writes the record as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.renderer import (
    RunOutcome,
    RunRequest,
    become_subreaper,
    run_renderer,
)

RENDERER = """\
import time

print(f"**tick** {time.time():.3f}: all good")
"""


class RecordingRunner:
    """`run_renderer`, plus (due, start, end) monotonic stamps of every tick of one watch.

    `due` is the grid point the product gave the tick (`RunRequest.due`); renders that are
    not ticks (the first one, at start) are not recorded.
    """

    def __init__(self) -> None:
        self.runs: list[tuple[float, float, float]] = []

    def __call__(self, request: RunRequest, cancel: threading.Event) -> RunOutcome:
        started = time.monotonic()
        outcome = run_renderer(request, cancel)
        if request.due is not None:
            self.runs.append((request.due, started, time.monotonic()))
        return outcome


def prepare(root: Path, watches: int) -> list[Path]:
    workdirs = []
    for index in range(watches):
        workdir = root / f"w{index:02d}"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "r.py").write_text(RENDERER)
        workdirs.append(workdir)
    return workdirs


def watch_arguments(description: str | None) -> argparse.ArgumentParser:
    """The arguments every producer benchmark process takes (where, how many, how often,
    how long)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--watches", type=int, required=True)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--hold-s", type=float, required=True)
    return parser


def main(argv: list[str]) -> int:
    parser = watch_arguments(__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    become_subreaper()  # as `taskcard host` does
    runtime = args.root / "runtime"
    workdirs = prepare(args.root, args.watches)
    runners = [RecordingRunner() for _ in workdirs]
    cards = [
        TaskCard(workdir, runtime_dir=runtime, runner=runner)
        for workdir, runner in zip(workdirs, runners, strict=True)
    ]
    started_at: list[float] = []
    for card in cards:
        result = card.call(
            {
                "action": "start",
                "input": {"renderer_path": "r.py", "interval_s": args.interval_s},
                "reasoning": "benchmark",
            }
        )
        if result.get("status") != "watching":
            print(f"start failed: {result}", file=sys.stderr)
            return 1
        started_at.append(time.monotonic())
    print("ready", flush=True)
    time.sleep(args.hold_s)
    for card in cards:
        card.close()
    args.out.write_text(
        json.dumps({"started_at": started_at, "runs": [runner.runs for runner in runners]})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
