"""The monitor inside the per-workdir task card host: no cron needed.

The host runs in the foreground as its own process (as a supervisor would run it), with a
short check period so the test does not wait for the default.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ledger.conftest import notifications
from tests.ledger.test_cli import ok
from tests.producer.conftest import wait_for


@pytest.fixture
def host(workdir: Path, runtime_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "taskcard.bridge.cli", "host", "--workdir", str(workdir)]
    command += ["--runtime-dir", str(runtime_dir), "--ledger-check-s", "0.2"]
    command += ["--idle-grace-s", "300"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def test_the_host_nudges_an_idle_task(workdir: Path, host: subprocess.Popen[bytes]) -> None:
    ok(workdir, "init", "t", "--purpose", "p", "--nudge-after-sec", "0.5")
    ok(workdir, "checkpoint", "t", "--event-type", "STARTED")
    wait_for(lambda: any(n["source"] == "ledger.nudge" for n in notifications(workdir)))
    wake = next(n for n in notifications(workdir) if n["source"] == "ledger.nudge")
    assert wake["channel"] == "system" and wake["ref_id"] == "t"
    assert wake["extra"]["state"] == "NUDGE_MAIN_AGENT"
    assert host.poll() is None


def test_completion_retires_the_ledger_card(
    workdir: Path, runtime_dir: Path, host: subprocess.Popen[bytes]
) -> None:
    ok(workdir, "init", "t", "--purpose", "Ship it", "--steps", "build")
    command = [
        sys.executable,
        "-m",
        "taskcard.bridge.cli",
        "card",
        "start",
        "--json",
        "ledger_renderer.py",
    ]
    command += ["--workdir", str(workdir), "--runtime-dir", str(runtime_dir), "--interval-s", "60"]
    started = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(started.stdout)["status"] == "watching", started.stdout
    status = workdir / "taskcard" / "status"
    body = workdir / "taskcard" / "taskcard.md"
    assert status.read_bytes() == b"active" and "**Ship it**" in body.read_text()
    ok(workdir, "checkpoint", "t", "--event-type", "STEP_COMPLETED", "--step", "build")
    ok(workdir, "checkpoint", "t", "--event-type", "TASK_COMPLETED", "--note", "released")
    wait_for(lambda: status.read_bytes() == b"inactive")
    assert "state: COMPLETED" in body.read_text(), "a final render before the card stops"
    assert any(n["source"] == "ledger.completed" for n in notifications(workdir))
