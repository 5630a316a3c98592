"""`python -m bench SCENARIO [--quick] [--real-limits] [--no-record]`.

SCENARIO: all, latency, storm, board, cluster_storm, scale, scale2k, idle, creation or producer;
or `changecost` (not part of `all`): Python calls and bytecodes per card change, counted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from bench import changecost, cluster_storm, creation, idle, latency, producer, scale, storm
from bench.measure import git_revision, machine
from bench.results import RESULTS_PATH, ScenarioResult, append_results, markdown, table
from tests.e2e.harness import ROOT

Scenario = Callable[[Path, argparse.Namespace], Awaitable[ScenarioResult]]

SCENARIOS: dict[str, Scenario] = {
    "latency": lambda w, a: latency.run(w, quick=a.quick),
    "storm": lambda w, a: storm.run(w, quick=a.quick, real_limits=a.real_limits),
    "board": lambda w, a: storm.run(w, quick=a.quick, real_limits=a.real_limits, board=True),
    "cluster_storm": lambda w, a: cluster_storm.run(w, quick=a.quick, real_limits=a.real_limits),
    "scale": lambda w, a: scale.run(w, quick=a.quick),
    "scale2k": lambda w, a: scale.run(w, quick=a.quick, size=scale.FLEET_2K),
    "idle": lambda w, a: idle.run(w, quick=a.quick),
    "creation": lambda w, a: creation.run(w, quick=a.quick),
    "producer": lambda w, a: producer.run(w, quick=a.quick),
}
# Counted, not timed: a tool for working on the change path, run on its own.
TOOLS: dict[str, Scenario] = {
    "changecost": lambda w, a: changecost.run(w, quick=a.quick),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark taskcard against the fake Telegram Bot API and a polling baseline.",
    )
    parser.add_argument("scenario", choices=["all", *SCENARIOS, *TOOLS])
    parser.add_argument(
        "--quick", action="store_true", help="short runs with fewer agents (for development)"
    )
    parser.add_argument(
        "--real-limits",
        action="store_true",
        help="storm, board and cluster_storm: Telegram's 20 per 60 s group window instead of "
        "20 per 20 s (each of them then takes about four minutes longer)",
    )
    parser.add_argument(
        "--no-record", action="store_true", help=f"do not append to {RESULTS_PATH.name}"
    )
    return parser.parse_args(argv)


async def run_all(args: argparse.Namespace, names: list[str]) -> list[ScenarioResult]:
    results: list[ScenarioResult] = []
    with tempfile.TemporaryDirectory(prefix="taskcard-bench-") as folder:
        for name in names:
            print(f"running {name}{' (quick)' if args.quick else ''} ...", flush=True)
            started = time.monotonic()
            try:
                result = await {**SCENARIOS, **TOOLS}[name](Path(folder), args)
            except Exception as error:  # one broken scenario must not hide the others
                traceback.print_exc()
                result = ScenarioResult(name, "did not complete")
                result.notes.append(f"failed: {type(error).__name__}: {error}")
                result.wall_s = time.monotonic() - started
            results.append(result)
            print(table([result]), flush=True)
            print(f"({result.wall_s:.0f} s)\n", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    host = machine()
    when = datetime.now(UTC)
    started = time.monotonic()
    results = asyncio.run(run_all(args, names))
    total_s = time.monotonic() - started
    print(table(results))
    print(f"\ntotal {total_s:.0f} s on {host.describe()}")
    if not args.no_record:
        command = " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)])
        mode = "quick" if args.quick else "full"
        if args.real_limits:
            mode += ", real group limit"
        text = markdown(
            results,
            when=when,
            host=host,
            revision=git_revision(ROOT),
            mode=f"{mode}, {total_s:.0f} s in total",
            command=command,
        )
        append_results(text)
        print(f"appended to {RESULTS_PATH}")
    failed = any(not r.figures for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
