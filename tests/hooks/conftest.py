"""Helpers for the agent-host hook tests: the real `taskcard` command and recorded payloads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
TASKCARD = str(Path(sys.executable).parent / "taskcard")


def payload(name: str, workdir: Path, **changes: Any) -> dict[str, Any]:
    """A recorded Claude Code payload with its placeholders pointed at `workdir`."""
    text = (FIXTURES / "claude_code" / name).read_text()
    text = text.replace("CWD", str(workdir))
    text = text.replace("TRANSCRIPT", str(workdir / "transcript.jsonl"))
    data: dict[str, Any] = json.loads(text)
    data.update(changes)
    return data


def run_taskcard(
    *args: str, stdin: bytes | str = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run(
        [TASKCARD, *args], input=data, capture_output=True, timeout=120, check=False, env=env
    )


def hook(data: dict[str, Any] | bytes, *extra: str) -> subprocess.CompletedProcess[bytes]:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return run_taskcard("hook", "claude-code", *extra, stdin=raw)


def events(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "logs" / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def kinds(workdir: Path) -> list[str]:
    return [event["kind"] for event in events(workdir)]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An agent's workdir: it has the task card's folder, so a hook writes into it by cwd."""
    path = tmp_path / "agent"
    (path / "taskcard").mkdir(parents=True)
    return path
