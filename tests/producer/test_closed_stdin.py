"""Commands that read stdin, started with it closed (`<&-`, some supervisors and spawners);
the hooks and `inbox` started with stdout closed (`>&-`).

Python then has no `sys.stdin` at all, and every such command died with a traceback
(`'NoneType' object has no attribute 'buffer'`): `tool`, `report --payload -`, `mcp`, and the
hooks, which must never fail their agent (exit 0, problems in the workdir's log). Each now
reads a closed stdin as no input and says so as it says any other problem.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..inbox.conftest import acks, names, queue
from .conftest import CliHost

TASKCARD = str(Path(sys.executable).parent / "taskcard")


def closed_stdin(*args: str) -> subprocess.CompletedProcess[str]:
    """`taskcard ARGS` run by a shell with its stdin closed, as `taskcard ... <&-` is."""
    return subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" <&-', TASKCARD, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_tool_without_an_envelope_and_stdin_closed_is_a_usage_error(
    workdir: Path, cli: CliHost
) -> None:
    done = closed_stdin("tool", "--workdir", str(workdir), "--runtime-dir", str(cli.runtime_dir))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "failed" and result["code"] == "bad_envelope"
    assert result["message"].startswith("envelope: "), result
    assert "stdin" in result["message"], result
    assert cli.host_pid() is None  # nothing was started


def test_report_payload_from_a_closed_stdin_is_refused_and_nothing_recorded(
    workdir: Path,
) -> None:
    done = closed_stdin("report", "--workdir", str(workdir), "--ok", "--payload", "-")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("taskcard report: --payload: "), done.stderr
    assert "stdin" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (workdir / "reports" / "reports.jsonl").exists()


def test_mcp_with_stdin_closed_says_a_client_must_run_it(workdir: Path, cli: CliHost) -> None:
    done = closed_stdin("mcp", "--workdir", str(workdir), "--runtime-dir", str(cli.runtime_dir))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("taskcard mcp: "), done.stderr
    assert "stdin" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("host", ["claude-code", "codex"])
def test_a_hook_with_stdin_closed_exits_0_and_logs_it(workdir: Path, host: str) -> None:
    done = closed_stdin("hook", host, "--workdir", str(workdir))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    assert "HookInputError" in log and "Traceback" not in log, log
    assert not (workdir / "logs" / "events.jsonl").exists()


@pytest.mark.parametrize("host", ["claude-code", "codex"])
def test_a_hook_with_stdout_closed_still_records_and_exits_0(workdir: Path, host: str) -> None:
    """Python has no `sys.stdout` then either; the hook's flush of it died with exit 1."""
    payload = json.dumps({"hook_event_name": "UserPromptSubmit", "session_id": "s", "prompt": "x"})
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" >&-', TASKCARD, "hook", host, "--workdir", str(workdir)],
        input=payload,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = (workdir / "logs" / "events.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds == ["turn.start"], kinds


def test_inbox_with_stdout_closed_claims_nothing(workdir: Path) -> None:
    """The texts could not be shown, yet they were claimed and acknowledged as delivered: the
    chat said "delivered" for a "stop now" the agent never saw. Nothing is claimed now."""
    queue(workdir, "m1", "stop now")
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" >&-', TASKCARD, "inbox", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("taskcard inbox: ") and "stdout" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert names(workdir, "queued") == ["m1.json"]
    assert names(workdir, "taken") == []
    assert acks(workdir) == []
