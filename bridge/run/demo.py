"""`taskcard demo`: the service on its embedded defaults, with a small simulated fleet.

It needs no credentials and nothing but this package: it creates two agent workdirs (one agent
runs a test suite, the other migrates data, with their own phases, tool calls and token use),
each with its own renderer reading the agent's progress snapshot, starts a real `task_card`
watch in each (through the producer's Python API), feeds their activity logs like an agent
host would, and runs the projection service with the console channel until interrupted or
`--duration` passes. On the way out it removes both cards, as an agent would when its work is
done.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import math
import os
import signal
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from taskcard.bridge.config import parse_config
from taskcard.bridge.run.logs import choose, setup_logging
from taskcard.bridge.run.runner import EXIT_CONFIG, add_log_options, serve
from taskcard.bridge.run.terminal import printable
from taskcard.producers.task_card.contract import (
    CardPaths,
    append_jsonl_line,
    atomic_write,
    broken_link,
    dangling_link,
    expand_home,
    file_kind,
    file_on_path,
    utc_now_iso,
)
from taskcard.producers.task_card.number_args import decimal_number

# Each demo agent keeps a snapshot of its own work; its renderer turns that into its card.
TESTER_RENDERER = '''\
"""Demo renderer of the test runner: suites, counts, the failure being looked at."""
import json
from pathlib import Path

s = json.loads(Path("progress.json").read_text())
print(f"**{s['goal']}**")
print()
print("| suite | passed | failed |")
print("|---|---|---|")
for suite in s["suites"]:
    print(f"| {suite['name']} | {suite['passed']} | {suite['failed']} |")
print()
print(f"- phase: {s['phase']}")
if s.get("failure"):
    print(f"- looking at: `{s['failure']}`")
'''

MIGRATOR_RENDERER = '''\
"""Demo renderer of the data migration: rows copied, batches, the check that gates the switch."""
import json
from pathlib import Path

s = json.loads(Path("progress.json").read_text())
done, total = s["rows_done"], s["rows_total"]
width = 20
bar = "#" * (width * done // total) + "." * (width - width * done // total)
print(f"**{s['goal']}**")
print()
print(f"- phase: {s['phase']}")
print(f"- rows: `{bar}` {done:,} / {total:,}")
print(f"- batch: {s['batch']}")
print(f"- next gate: {s['gate']}")
'''

# One step of simulated work: the phase it belongs to, the tool it calls, how long the call
# takes, the tokens the turn spends on it, and how the agent's snapshot changes afterwards.
Step = tuple[str, str, float, tuple[int, int], dict[str, Any]]

TESTER_STEPS: list[Step] = [
    ("collect", "pytest --collect-only", 2.1, (1800, 120), {}),
    ("unit tests", "pytest tests/unit", 14.2, (900, 80), {"suite": ("unit", 412, 0)}),
    (
        "integration tests",
        "pytest tests/integration",
        31.5,
        (1100, 60),
        {"suite": ("integration", 86, 2)},
    ),
    (
        "triage",
        "read tests/integration/test_export.py",
        0.2,
        (5200, 640),
        {"failure": "test_export_utf16"},
    ),
    ("fix", "edit bridge/export.py", 0.3, (3400, 1900), {}),
    ("re-run failures", "pytest --lf", 6.8, (700, 90), {"suite": ("integration", 88, 0)}),
    ("coverage", "coverage report", 3.0, (600, 150), {"suite": ("coverage gate", 1, 0)}),
]
MIGRATOR_STEPS: list[Step] = [
    ("snapshot", "pg_dump orders", 42.0, (400, 60), {"gate": "snapshot restored in staging"}),
    ("schema", "alembic upgrade v3", 5.5, (2600, 700), {"gate": "schema diff empty"}),
    ("copy", "copy_batch 1-40", 18.0, (300, 40), {"rows": 40}),
    ("copy", "copy_batch 41-80", 17.2, (300, 40), {"rows": 80}),
    ("copy", "copy_batch 81-120", 19.4, (300, 40), {"rows": 120}),
    ("verify", "checksum orders v2 v3", 11.0, (1500, 420), {"gate": "checksums match"}),
    ("switch", "flip read path to v3", 0.8, (900, 300), {"gate": "error rate under 0.1%"}),
]
AGENTS: dict[str, dict[str, Any]] = {
    "tester": {
        "renderer": TESTER_RENDERER,
        "steps": TESTER_STEPS,
        "snapshot": {"goal": "Run the 2.4 test suite", "phase": "starting", "suites": []},
    },
    "migrator": {
        "renderer": MIGRATOR_RENDERER,
        "steps": MIGRATOR_STEPS,
        "snapshot": {
            "goal": "Migrate orders to the v3 schema",
            "phase": "starting",
            "rows_done": 0,
            "rows_total": 1_200_000,
            "batch": "none yet",
            "gate": "snapshot restored in staging",
        },
    },
}
BATCH_ROWS = 10_000
# Quiet by default: the cards on the terminal are the show, not the service's log.
DEMO_LOG_LEVEL: Final = "WARNING"


def _event(workdir: Path, kind: str, **fields: Any) -> None:
    append_jsonl_line(CardPaths(workdir).events, {"ts": utc_now_iso(), "kind": kind, **fields})


def _write_snapshot(workdir: Path, snapshot: dict[str, Any]) -> None:
    atomic_write(workdir / "progress.json", json.dumps(snapshot).encode())


def _advance(snapshot: dict[str, Any], phase: str, tool: str, change: dict[str, Any]) -> None:
    """The agent's own bookkeeping after a step: what its renderer will show."""
    snapshot["phase"] = phase
    if "suite" in change:
        name, passed, failed = change["suite"]
        suites = [s for s in snapshot["suites"] if s["name"] != name]
        snapshot["suites"] = [*suites, {"name": name, "passed": passed, "failed": failed}]
        if not failed:
            snapshot.pop("failure", None)
    if "failure" in change:
        snapshot["failure"] = change["failure"]
    if "rows" in change:
        snapshot["rows_done"] = min(change["rows"] * BATCH_ROWS, snapshot["rows_total"])
        snapshot["batch"] = tool.removeprefix("copy_batch ")
    if "gate" in change:
        snapshot["gate"] = change["gate"]


async def _simulate(workdirs: dict[str, Path], stop: asyncio.Event) -> None:
    """Each agent works through its own steps, turn after turn, like an agent host reports."""
    for agent_id, workdir in workdirs.items():
        _event(workdir, "agent.start", pid=os.getpid())
        _event(workdir, "turn.start")
        _event(workdir, "text", text=f"{agent_id} picked up its task")
    snapshots = {agent_id: copy.deepcopy(AGENTS[agent_id]["snapshot"]) for agent_id in workdirs}
    tick = 0
    while not stop.is_set():
        for agent_id, workdir in workdirs.items():
            agent = AGENTS[agent_id]
            steps: list[Step] = agent["steps"]
            phase, tool, duration_s, (tokens_in, tokens_out), change = steps[tick % len(steps)]
            call_id = f"c{tick}"
            _event(workdir, "tool.start", call_id=call_id, name=tool)
            _event(workdir, "tool.end", call_id=call_id, ok=True, duration_s=duration_s)
            _event(workdir, "usage", input_tokens=tokens_in, output_tokens=tokens_out)
            snapshot = snapshots[agent_id]
            _advance(snapshot, phase, tool, change)
            _write_snapshot(workdir, snapshot)
            if tick % len(steps) == len(steps) - 1:  # the work is done: a new turn starts over
                _event(workdir, "turn.end")
                _event(workdir, "turn.start")
                snapshots[agent_id] = copy.deepcopy(agent["snapshot"])
        tick += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=3.0)


@contextlib.contextmanager
def _fleet(root: Path) -> Iterator[dict[str, Path]]:
    from taskcard.producers.task_card.capability import TaskCard

    workdirs = {agent_id: root / "agents" / agent_id for agent_id in AGENTS}
    cards = []
    try:
        for agent_id, workdir in workdirs.items():
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "card.py").write_text(AGENTS[agent_id]["renderer"])
            _write_snapshot(workdir, AGENTS[agent_id]["snapshot"])
            card = TaskCard(workdir, runtime_dir=root / "run")
            cards.append(card)
            result = card.call(
                {
                    "action": "start",
                    "input": {"renderer_path": "card.py", "interval_s": 1},
                    "reasoning": "demo: show the fleet's progress",
                }
            )
            if result.get("status") != "watching":
                raise RuntimeError(f"demo watch for {agent_id} did not start: {result}")
        yield workdirs
    finally:
        for card in cards:
            card.call({"action": "remove", "input": {}, "reasoning": "demo finished"})
            card.close()


async def _run(root: Path, duration_s: float | None) -> int:
    config = parse_config(
        {
            "state_dir": "state",
            "agents": [{"id": a, "workdir": f"agents/{a}"} for a in AGENTS],
            "watch": {"debounce_ms": 50, "rescan_interval_s": 10},
            "log_level": DEMO_LOG_LEVEL,
        },
        base_dir=root,
        source="embedded demo configuration",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # A hangup (the terminal closed, the SSH session dropped) stops the demo as Ctrl-C does:
    # its cards are drawn on that terminal, so nobody is left to see them or to stop it.
    # `taskcard serve` ignores SIGHUP until it reloads a file, which the demo has none of, so
    # without this it ran on in the background for good; `taskcard demo` was killed by it,
    # leaving its temporary folder behind. Taken before the watches start, so a signal during
    # their start is a stop too.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)
    with _fleet(root) as workdirs:
        simulator = asyncio.create_task(_simulate(workdirs, stop))
        if duration_s is not None:
            loop.call_later(duration_s, stop.set)
        service = asyncio.create_task(serve(config, {}, stop=stop))
        try:
            code = await service
        finally:
            stop.set()
            await simulator
    return code


def run_demo(folder: str | None, duration_s: float | None) -> int:
    """The embedded defaults: a demo fleet in `folder` (or a temporary one) on the console."""
    setup_logging("WARNING")
    if folder:
        reason = _unusable_dir(Path(folder))
        if reason is None:
            root = Path(folder).resolve()
            try:
                (root / "agents").mkdir(parents=True, exist_ok=True)
            except OSError as error:  # a file there, a folder this user cannot write
                reason = (
                    f"{printable(str(error.filename))} is not a folder"
                    if isinstance(error, FileExistsError)
                    else f"{error.strerror} ({printable(str(error.filename))})"
                )
        if reason is not None:
            print(
                f"taskcard demo: --dir {printable(folder)}: cannot keep the demo fleet there:"
                f" {reason}; give a folder you can write, or leave --dir out for a temporary"
                " one",
                file=sys.stderr,
            )
            return EXIT_CONFIG
        code = asyncio.run(_run(root, duration_s))
        return _said_stopped(code, f"its fleet stays in {printable(str(root))}")
    with tempfile.TemporaryDirectory(prefix="taskcard-demo-") as tmp:
        code = asyncio.run(_run(Path(tmp), duration_s))
    return _said_stopped(code, "its temporary folder is removed")


def _said_stopped(code: int, kept: str) -> int:
    """`code`, after one last line on the demo's terminal when it stopped cleanly: the cards
    just stopped being drawn, and a clean stop looked like a hang (its log is at WARNING,
    so the service's own "stopped" is not shown)."""
    if code == 0:
        print(f"taskcard demo: stopped; {kept}", flush=True)
    return code


def _unusable_dir(folder: Path) -> str | None:
    """Why `--dir` names no folder the demo can make or use, before anything is made: a
    loop of symbolic links was a traceback (`resolve`), and a link that leads nowhere was
    followed, the fleet created wherever it pointed."""
    broken = broken_link(folder)
    if broken is None:
        try:
            mode = os.stat(folder).st_mode
        except OSError:
            mode = None
        if mode is not None and not stat.S_ISDIR(mode):
            # A named pipe (or a device) was "a file"; each is said as what `ls -l` shows.
            return f"it is {'a file' if stat.S_ISREG(mode) else file_kind(mode)}, not a folder"
        # A file further up was "Not a directory (DIR/agents)", about a name below it.
        above = file_on_path(folder)
        if above is not None:
            return f"{printable(str(above))} on its path is a file, not a folder"
        return None
    link, _, loop = broken
    if loop:
        which = "" if link == Path(os.path.abspath(folder)) else f"{printable(str(link))} "
        return f"{which}goes round a loop of symbolic links"
    return dangling_link(folder)


def demo_dir_arg(text: str) -> str:
    """`--dir` as an argparse `type=`: an empty or blank name is a usage error (it meant a
    temporary folder without a word, or a folder named by spaces), and `~` is expanded, as
    `--dir=~/demo` reaches the command unexpanded; `~name` of no known user is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "is empty; give the folder to keep the demo fleet in, or leave --dir out for a"
            " temporary one"
        )
    path = expand_home(text)
    if path is None:
        raise argparse.ArgumentTypeError(
            f"{printable(text)} cannot be expanded (no such user); give the full path"
        )
    return os.fspath(path)


def _demo(args: argparse.Namespace) -> int:
    choose(args.log_level, args.log_format)
    return run_demo(args.dir, args.duration)


MAX_DEMO_S = 7 * 86_400


def _duration_s(text: str) -> float:
    """`--duration`: a finite number of seconds from 0.1 to a week, else a usage error (a
    negative or `nan` duration used to end the demo at once, `inf` never)."""
    value = decimal_number(text, "a number of seconds")
    if not (math.isfinite(value) and 0.1 <= value <= MAX_DEMO_S):
        raise argparse.ArgumentTypeError(
            f"{text!r} is out of range; give 0.1 to {MAX_DEMO_S} seconds"
        )
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the service on embedded defaults: a simulated fleet on the console",
        description=(
            "Create two demo agents with real task card watches and project their cards to "
            "this terminal. No credentials needed. Ctrl-C (or closing the terminal) stops it."
        ),
    )
    parser.add_argument(
        "--dir",
        type=demo_dir_arg,
        help="keep the demo fleet in this folder (default: temporary)",
    )
    parser.add_argument(
        "--duration",
        type=_duration_s,
        help="stop after this many seconds (default: run until Ctrl-C)",
    )
    add_log_options(parser, level_default=DEMO_LOG_LEVEL)
    parser.set_defaults(handler=_demo)
