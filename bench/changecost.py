"""Change cost: the interpreter's work in `taskcard serve` for one card change, counted.

Wall-clock and CPU timings move with whatever else the machine runs; the number of Python
calls and bytecodes a change costs does not (much). This runs a real `taskcard serve` (a
subprocess, under `bench.changecost_probe`) against the fake Bot API with N agents in groups
of 100 (unlimited limits, as in `scale`), waits until every resident exists, lets every 20th
agent (5%, as in `scale`) change once, not counted (what the service learns of a path or a
route the first time it changes is no steady cost), then publishes M changes of those agents
in turns, at a steady rate (20 a second by default: slow enough that the traced service
handles each change on its own, as the untraced one does at 100 a second; a change waits
for its agent's previous one to show, so none coalesce on a loaded machine), and counts
from the first change to the moment every change is shown. Every change must show as one
edit.

- `trace` (the default): Python calls (frames entered, coroutine resumptions included),
  bytecodes and C calls per change, on serve's main thread, where all of the change path
  runs;
- `profile`: cProfile over the same window; prints the functions with the most own time and
  the most calls, and keeps the stats file (`--stats PATH`) for `pstats`.

`python -m bench changecost [--quick]` runs the trace mode with the defaults; `python -m
bench.changecost --help` has the knobs. The counts include the work a second of the
service costs whatever changes (the one-second timer, the getUpdates long poll) for the
window's length; at 20 changes a second that is a small, steady share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import (
    TOKEN_ENV,
    UNLIMITED_CONFIG,
    CardWriter,
    Shown,
    agent_ids,
    chat_routes,
    make_fleet,
    serve_config,
    sleep_until,
)
from bench.results import Figure, ScenarioResult
from tests.e2e.harness import ServeProcess, eventually
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

PER_GROUP = 100
FIRST_GROUP = -1008000000000
CHANGING_EVERY_NTH = 20  # 5% of the agents change, as in `scale`


async def measure(
    workspace: Path,
    *,
    agents: int,
    changes: int,
    rate: float,
    mode: str = "trace",
    stats_path: Path | None = None,
    functions_path: Path | None = None,
) -> dict[str, float]:
    """Counts per change (`trace`), or the path of the stats (`profile`) under "stats"."""
    ids = agent_ids(agents)
    fleet = make_fleet(workspace / "changecost", ids, chat_routes(ids, PER_GROUP, FIRST_GROUP, -1))
    writer = CardWriter(fleet)
    writer.activate_all()
    out = stats_path or (fleet.root / f"changecost.{mode}")
    out.unlink(missing_ok=True)
    async with FakeTelegram(limits=FakeLimits.unlimited()) as fake:
        config = fleet.root / "taskcard.toml"
        config.write_text(serve_config(fleet, fake.base_url, UNLIMITED_CONFIG))
        probe = [sys.executable, "-m", "bench.changecost_probe", mode, str(out), "--"]
        serve = ServeProcess(config, env={TOKEN_ENV: fake.token}, prefix=probe)
        serve.start()
        assert serve.proc is not None
        shown = Shown(fake)
        keys = fleet.route_keys()
        try:
            await _shown_or_logs(serve, shown, keys, writer.versions)
            await asyncio.sleep(2.0)  # let the creation's tail settle
            changing = _dealt(ids, PER_GROUP)[::CHANGING_EVERY_NTH]
            chat_of = {agent: chat for chat, agent in keys}
            # A first round, not counted: what the service learns of a path or a route the
            # first time it changes (and keeps) is not the cost of a change.
            await _publish(writer, changing, rate, shown, chat_of)
            await _shown_or_logs(serve, shown, keys, writer.versions)
            edits_before = fake.count("editMessageText")
            serve.proc.send_signal(signal.SIGUSR2)
            await asyncio.sleep(0.5)  # the probe starts before the first change
            await _publish(
                writer, [changing[i % len(changing)] for i in range(changes)], rate, shown, chat_of
            )
            await _shown_or_logs(serve, shown, keys, writer.versions)
            serve.proc.send_signal(signal.SIGUSR2)
            await eventually(out.exists, timeout_s=60, what="the probe's counts")
            edits = fake.count("editMessageText") - edits_before
            if edits != changes:
                raise RuntimeError(f"{changes} changes showed as {edits} edits")
        finally:
            await serve.aterminate()
    result: dict[str, float] = {"changes": changes, "edits": edits}
    if mode == "trace":
        await eventually(lambda: out.stat().st_size > 0, timeout_s=30, what="the counts")
        result.update(_per_change(out, changes, functions_path))
    return result


def _per_change(out: Path, changes: int, functions_path: Path | None) -> dict[str, float]:
    """The probe's counts divided by the changes; its per-function counts kept in
    `functions_path` (JSON: "file:line(name)" -> [calls, bytecodes], for all changes)."""
    counts = json.loads(out.read_text())
    functions = counts.pop("functions")
    if functions_path is not None:
        functions_path.write_text(json.dumps(functions))
    return {name: value / changes for name, value in counts.items()}


async def _publish(
    writer: CardWriter, agents: list[str], rate: float, shown: Shown, chat_of: dict[str, int]
) -> None:
    """A change of each of `agents` in turn, `rate` a second at most; an agent whose last
    change is not shown yet (a service slowed by the tracer, a loaded machine) is waited
    for first, so that no two changes of one agent coalesce into one edit (latest wins)."""
    last = -math.inf
    for agent in agents:
        await sleep_until(last + 1 / rate)
        version, key = writer.versions.get(agent, -1), (chat_of[agent], agent)

        def shown_already(key: tuple[int, str] = key, version: int = version) -> bool:
            shown.update()
            return shown.latest.get(key, -1) >= version

        if not shown_already():
            await eventually(shown_already, timeout_s=600, what=f"{agent} v{version} shown")
        writer.publish(agent)
        last = time.monotonic()


def _dealt(ids: tuple[str, ...], per_group: int) -> list[str]:
    """The agents in turns across the groups (the first of each group, then the second...),
    so consecutive changes go to different chats, as in `scale`."""
    groups = [ids[start : start + per_group] for start in range(0, len(ids), per_group)]
    return [group[i] for i in range(per_group) for group in groups if i < len(group)]


async def _shown_or_logs(
    serve: ServeProcess, shown: Shown, keys: list[tuple[int, str]], versions: dict[str, int]
) -> None:
    """Every route shows its agent's latest version; a service that stopped fails at once
    with its log's tail."""
    assert serve.proc is not None
    proc = serve.proc
    await eventually(
        lambda: proc.poll() is not None or shown.showing(keys, versions) == len(keys),
        timeout_s=600,
        what=f"{len(keys)} routes to show their cards",
    )
    if proc.poll() is not None:
        raise RuntimeError(f"serve stopped (exit {proc.returncode}):\n{serve.logs[-3000:]}")


async def run(workspace: Path, *, quick: bool) -> ScenarioResult:
    agents, changes = (200, 100) if quick else (1000, 300)
    counts = await measure(workspace, agents=agents, changes=changes, rate=20.0)
    result = ScenarioResult(
        "changecost",
        f"{agents} agents in groups of {PER_GROUP}, {changes} changes at 20 per second, each "
        f"to a different agent; serve's main thread counted under a tracer "
        f"({counts['edits']:.0f} edits sent).",
    )
    result.figures += [
        Figure("Python calls per change", counts["calls"], "calls"),
        Figure("bytecodes per change", counts["bytecodes"], "bytecodes"),
        Figure("C calls per change", counts["c_calls"], "calls"),
    ]
    return result


def _short(name: str) -> str:
    """A function's file without the installation's prefix."""
    for marker in ("site-packages/", "/taskcard/", "/lib/python3"):
        if marker in name:
            return name[name.index(marker) + len(marker) :]
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.changecost", description=__doc__)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--rate", type=float, default=20.0, help="changes per second")
    parser.add_argument("--mode", choices=["trace", "profile"], default="trace")
    parser.add_argument("--stats", type=Path, help="profile mode: where to keep the stats")
    parser.add_argument("--top", type=int, default=40, help="rows of the per-function tables")
    parser.add_argument(
        "--functions", type=Path, help="trace mode: keep each function's own counts (JSON)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="taskcard-changecost-") as folder:
        stats = args.stats or (Path(folder) / "changecost.prof")
        counts = asyncio.run(
            measure(
                Path(folder),
                agents=args.agents,
                changes=args.changes,
                rate=args.rate,
                mode=args.mode,
                stats_path=stats if args.mode == "profile" else None,
                functions_path=args.functions or Path(folder) / "functions.json",
            )
        )
        print(json.dumps({k: round(v, 1) for k, v in counts.items()}))
        if args.mode == "trace":
            functions = json.loads((args.functions or Path(folder) / "functions.json").read_text())
            print("functions by own bytecodes per change (calls per change):")
            ranked = sorted(functions.items(), key=lambda item: -item[1][1])[: args.top]
            for name, (calls, bytecodes) in ranked:
                print(
                    f"{bytecodes / args.changes:8.1f} {calls / args.changes:6.2f}  {_short(name)}"
                )
        if args.mode == "profile":
            report = pstats.Stats(str(stats))
            report.sort_stats("tottime").print_stats(args.top)
            report.sort_stats("ncalls").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
