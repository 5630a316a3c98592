"""A seeded property test of the agent-to-agent loop, driven over MCP stdio as agents drive it.

A parent spawns a child (`spawn`), the child reports (`report`) and keeps a long-task ledger
(`ledger`), the parent reads the child's reports with a cursor (`reports` with
`child_workdir`). Random sequences, seeded so a failure repeats, check what the contracts
promise whatever the order: reading with the last seq seen returns every report once, in
order, and nothing past the end; every accepted ledger event is one observation with the
next seq, a refused one none; a step's state follows docs/ledger.md ("first match wins:
BLOCKED, FAILED, DONE, RUNNING, PENDING"; a block ends with progress or completion on its
step or OWNER_RESUMED; a failure stands until the step moves again); only completion truth
completes a task, and the monitor stops exactly the completed ones.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from tests.conftest import mcp_session

STEPS = ("a", "b", "c")


async def call(session: ClientSession, tool: str, **arguments: Any) -> tuple[dict[str, Any], bool]:
    result = await session.call_tool(tool, arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    return json.loads(text), bool(result.is_error)


class Step:
    """What the docs say a step's state follows, from the events recorded on it (a tick)."""

    def __init__(self) -> None:
        self.progress = self.completed = self.failed = 0


class Task:
    def __init__(self) -> None:
        self.steps = {step: Step() for step in STEPS}
        self.block: tuple[str | None, bool] | None = None  # (step, failed) while active
        self.completed = False

    def state(self, name: str) -> str:
        step = self.steps[name]
        if self.block is not None and self.block == (name, False):
            return "BLOCKED"
        moved_since = max(step.progress, step.completed) > step.failed
        if (step.failed and not moved_since) or self.block == (name, True):
            return "FAILED"
        if step.completed:
            return "DONE"
        return "RUNNING" if step.progress else "PENDING"

    def end_block_on(self, name: str | None) -> None:
        if self.block is not None and (name is None or self.block[0] == name):
            self.block = None


def random_event(rng: random.Random) -> dict[str, Any]:
    step = rng.choice(STEPS)
    kind = rng.choice(["progress", "complete", "block", "resume", "finish"])
    if kind == "progress":
        return {"command": "checkpoint", "event_type": "STEP_PROGRESS", "step": step}
    if kind == "complete":
        return {"command": "checkpoint", "event_type": "STEP_COMPLETED", "step": step}
    if kind == "block":
        return {
            "command": "block",
            "kind": rng.choice(["TIMEOUT", "OTHER"]),
            "reason": "stuck",
            "step": step,
            "failed": rng.random() < 0.5,
        }
    if kind == "resume":
        return {"command": "checkpoint", "event_type": "OWNER_RESUMED"}
    return {"command": "checkpoint", "event_type": "TASK_COMPLETED", "note": "out/"}


def expect(task: Task, event: dict[str, Any], tick: int) -> None:
    step = event.get("step")
    if event["command"] == "block":
        assert step is not None
        if event["failed"]:
            task.steps[step].failed = tick
        task.block = (step, bool(event["failed"]))
    elif event["event_type"] == "STEP_PROGRESS":
        task.steps[step].progress = tick
        task.end_block_on(step)
    elif event["event_type"] == "STEP_COMPLETED":
        task.steps[step].completed = tick
        task.end_block_on(step)
    elif event["event_type"] == "OWNER_RESUMED":
        task.end_block_on(None)
    else:
        task.completed = True


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_orders_keep_the_contracts(
    seed: int, tmp_path: Path, runtime_dir: Path
) -> None:
    rng = random.Random(seed)
    parent, child = tmp_path / "planner", tmp_path / "worker"
    parent.mkdir()
    child.mkdir()
    async with (
        mcp_session(parent, runtime_dir) as lead,
        mcp_session(child, runtime_dir) as worker,
    ):
        spawned, error = await call(lead, "spawn", child_workdir="../worker", reason="split")
        assert not error, spawned
        task = Task()
        created, error = await call(
            worker, "ledger", command="init", task_id="t", purpose="p", steps=list(STEPS)
        )
        assert not error, created
        written = 0  # reports the child wrote
        cursor = 0  # the last seq the parent read
        observations = 0
        for tick in range(1, 41):
            roll = rng.random()
            if roll < 0.25:
                done, error = await call(
                    worker, "report", ok=rng.random() < 0.7, summary=f"r{tick}"
                )
                written += 1
                assert (error, done["seq"], done["channel"]) == (False, written, "mcp"), done
            elif roll < 0.45:
                after = rng.choice([cursor, cursor, written + rng.randint(0, 3)])
                read, error = await call(lead, "reports", child_workdir=str(child), after=after)
                assert not error, read
                if after >= written:
                    assert read["report"] is None, (after, written, read)
                else:
                    assert read["report"]["seq"] == after + 1, (after, read)
                    cursor = max(cursor, after + 1) if after == cursor else cursor
            else:
                event = random_event(rng)
                result, error = await call(worker, "ledger", task_id="t", **event)
                assert not error, (event, result)
                expect(task, event, tick)
                observations += 1
                shown, _ = await call(worker, "ledger", command="show", task_id="t")
                record = shown["record"]
                seqs = [o["seq"] for o in record["observations"]]
                assert seqs == list(range(1, observations + 1)), seqs
                states = {name: task.state(name) for name in STEPS}
                derived = record["derived"]
                assert derived["step_states"] == states, (seed, tick, event, derived)
                decided, _ = await call(worker, "ledger", command="supervise", task_id="t")
                [decision] = decided["decisions"]
                completed = derived["workflow"] == "COMPLETED"
                assert completed == (task.completed and not derived["inconsistencies"])
                assert (decision["action"] == "STOP_AND_DELETE") == completed, decision
        # The parent catches up with the cursor it keeps: every report once, in order.
        seen = []
        while True:
            read, error = await call(lead, "reports", child_workdir="../worker", after=cursor)
            assert not error, read
            if read["report"] is None:
                break
            seen.append(read["report"]["seq"])
            cursor = read["report"]["seq"]
        assert cursor == written and seen == sorted(set(seen)), (seen, written)
