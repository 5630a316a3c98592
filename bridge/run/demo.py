"""`taskcard demo`: the service on its embedded defaults, with a small simulated fleet.

It needs no credentials and nothing but this package: it creates two agent workdirs, each with
a renderer that reads a progress snapshot, starts a real `task_card` watch in each (through the
producer's Python API), feeds their activity logs like an agent host would, and runs the
projection service with the console channel until interrupted or `--duration` passes. On the
way out it removes both cards, as an agent would when its work is done.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bridge.config import parse_config
from bridge.run.serve_cli import serve, setup_logging
from producers.task_card.contract import CardPaths, append_jsonl_line, atomic_write, utc_now_iso

RENDERER = '''\
"""Demo renderer: a truthful card from the snapshot the (simulated) agent keeps."""
import json
from pathlib import Path

snapshot = json.loads(Path("progress.json").read_text())
done, total = snapshot["done"], snapshot["total"]
bar = "#" * done + "." * (total - done)
print(f"**{snapshot['goal']}**")
print()
print(f"- progress: `{bar}` {done}/{total} steps")
print(f"- current step: {snapshot['step']}")
print(f"- next gate: {snapshot['gate']}")
print(f"- blocker: {snapshot.get('blocker') or 'none'}")
'''

AGENTS: dict[str, dict[str, Any]] = {
    "builder": {"goal": "Build and test release 2.4", "total": 8, "gate": "all tests green"},
    "reviewer": {"goal": "Review the 2.4 pull requests", "total": 5, "gate": "approvals"},
}
STEPS = ["fetch sources", "compile", "unit tests", "lint", "package", "integration", "sign"]


def _event(workdir: Path, kind: str, **fields: Any) -> None:
    append_jsonl_line(CardPaths(workdir).events, {"ts": utc_now_iso(), "kind": kind, **fields})


def _snapshot(workdir: Path, agent: dict[str, Any], done: int) -> None:
    step = STEPS[done % len(STEPS)]
    data = {**agent, "done": min(done, agent["total"]), "step": step}
    atomic_write(workdir / "progress.json", json.dumps(data).encode())


async def _simulate(workdirs: dict[str, Path], stop: asyncio.Event) -> None:
    tick = 0
    for agent_id, workdir in workdirs.items():
        _event(workdir, "agent.start", pid=os.getpid())
        _event(workdir, "turn.start")
        _event(workdir, "text", text=f"{agent_id} picked up its task")
    while not stop.is_set():
        for agent_id, workdir in workdirs.items():
            agent = AGENTS[agent_id]
            call_id = f"c{tick}"
            name = STEPS[tick % len(STEPS)]
            _event(workdir, "tool.start", call_id=call_id, name=name)
            _event(workdir, "tool.end", call_id=call_id, ok=True, duration_s=1.5)
            _event(workdir, "usage", input_tokens=1200, output_tokens=300)
            _snapshot(workdir, agent, (tick // 2) % (agent["total"] + 1))
        tick += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=3.0)


@contextlib.contextmanager
def _fleet(root: Path) -> Iterator[dict[str, Path]]:
    from producers.task_card.capability import TaskCard

    workdirs = {agent_id: root / "agents" / agent_id for agent_id in AGENTS}
    cards = []
    try:
        for agent_id, workdir in workdirs.items():
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "card.py").write_text(RENDERER)
            _snapshot(workdir, AGENTS[agent_id], 0)
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
            "log_level": "WARNING",
        },
        base_dir=root,
        source="embedded demo configuration",
    )
    with _fleet(root) as workdirs:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
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
        root = Path(folder).resolve()
        root.mkdir(parents=True, exist_ok=True)
        return asyncio.run(_run(root, duration_s))
    with tempfile.TemporaryDirectory(prefix="taskcard-demo-") as tmp:
        return asyncio.run(_run(Path(tmp), duration_s))


def _demo(args: argparse.Namespace) -> int:
    return run_demo(args.dir, args.duration)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the service on embedded defaults: a simulated fleet on the console",
        description=(
            "Create two demo agents with real task card watches and project their cards to "
            "this terminal. No credentials needed. Ctrl-C stops it."
        ),
    )
    parser.add_argument("--dir", help="keep the demo fleet in this folder (default: temporary)")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.set_defaults(handler=_demo)
