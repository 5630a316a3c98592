"""An agent whose file flaps between good and broken costs the log a bounded number of
lines, through `taskcard serve` with a config file and `taskcard status`.

Each flap was a WARNING (held back after the first by the log's repeat limiter) and an
INFO "is readable again" line (never held back: 109 in 20 s for one agent, probeE F4), so
the log said "readable again" over and over with no refusal between. The recovery lines are
held back like the warnings now: one of each kind per agent and file per minute, the next
one saying how many were held back."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.e2e.harness import ServeProcess, agents_lines, eventually, publish, run_cli

FLAPS = 6
BODY = "taskcard/taskcard.md"
# The repeat limiter's interval (`bridge.run.logs.REPEAT_INTERVAL_S`).
INTERVAL_S = 60


def problems(config: Path) -> list[str]:
    status = run_cli("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    agents = {a["agent"]: a for a in json.loads(status.stdout)["agents"]}
    return [p for p in agents["flap"]["problems"] if p.startswith(BODY)]


async def test_a_flapping_agent_costs_the_log_a_bounded_number_of_lines(tmp_path: Path) -> None:
    lines = agents_lines(tmp_path, ["flap", "good"])
    lines += ["[console]", "enabled = true"]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    workdir = tmp_path / "agents" / "flap"
    publish(workdir, "flap v1")
    started = time.monotonic()
    with ServeProcess(config, env={"TASKCARD_LOG_LEVEL": "INFO"}) as serve:
        await eventually(lambda: "channel console ready" in serve.logs, what="the start")
        body = workdir / BODY
        for flap in range(FLAPS):
            body.unlink()
            os.mkfifo(body)
            await eventually(lambda: problems(config), what=f"flap {flap} seen broken")
            publish(workdir, f"flap v{flap + 2}")
            await eventually(lambda: not problems(config), what=f"flap {flap} seen good")
        elapsed = time.monotonic() - started
        assert await serve.aterminate() == 0
    said = serve.logs.splitlines()
    again = [line for line in said if f"agent flap: {BODY} is readable again" in line]
    refused = [line for line in said if f"agent flap: {BODY} is a named pipe" in line]
    # One of each kind per interval: the first, then one per interval with its count.
    bound = 1 + int(elapsed // INTERVAL_S)
    assert 1 <= len(again) <= bound, (elapsed, again)
    assert 1 <= len(refused) <= bound, (elapsed, refused)
    assert "Traceback" not in serve.logs, serve.logs
