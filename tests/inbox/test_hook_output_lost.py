"""A hook whose output cannot reach its host hands the chat's texts to nobody: they stay queued.

The hook's stdout is the delivery. A hook started with stdout closed, or whose write fails
(the host's end of the pipe gone, a full disk), claimed the queued texts and acknowledged
them before writing: the chat read "delivered" and the agent never got them. Driven as the
host runs a hook: a subprocess with the payload on stdin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..hooks.conftest import FIXTURES, payload
from .conftest import acks, names, queue

TASKCARD = str(Path(sys.executable).parent / "taskcard")
LOG = "logs/taskcard-hook.log"


def _run(data: dict[str, Any], host: str, stdout: Any) -> int:
    done = subprocess.run(
        [TASKCARD, "hook", host],
        input=json.dumps(data).encode(),
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=120,
        check=False,
    )
    return done.returncode


def _broken_pipe() -> int:
    """The write end of a pipe whose reader is gone (the host stopped reading)."""
    read, write = os.pipe()
    os.close(read)
    return write


def _full_disk() -> int:
    """A file whose every write fails with ENOSPC, as on a full disk."""
    return os.open("/dev/full", os.O_WRONLY)


STDOUTS = {"a full disk": _full_disk, "a broken pipe": _broken_pipe}


def _payload(host: str, name: str, workdir: Path) -> dict[str, Any]:
    if host == "claude-code":
        return payload(name, workdir, transcript_path="")
    text = (FIXTURES / "codex_hooks" / name).read_text().replace("CWD", str(workdir))
    data: dict[str, Any] = json.loads(text)
    data["transcript_path"] = ""
    return data


@pytest.mark.parametrize("where", sorted(STDOUTS))
@pytest.mark.parametrize(
    ("host", "event"),
    [
        ("claude-code", "02_user_prompt_submit.json"),
        ("claude-code", "10_stop.json"),
        ("codex", "02_user_prompt_submit.json"),
        ("codex", "06_stop.json"),
    ],
)
def test_texts_whose_output_failed_stay_queued_for_the_next_hook(
    workdir: Path, where: str, host: str, event: str
) -> None:
    queue(workdir, "m1", "use the staging database")
    queue(workdir, "m2", "and tell me when done", queued_at="2026-01-01T00:01:00.000Z")
    target = STDOUTS[where]()
    try:
        assert _run(_payload(host, event, workdir), host, target) == 0  # never fails its agent
    finally:
        os.close(target)

    assert names(workdir, "queued") == ["m1.json", "m2.json"]
    assert names(workdir, "taken") == []
    assert acks(workdir) == []
    assert "went back to inbox/queued/" in (workdir / LOG).read_text()
    # The next hook whose output goes through delivers them, once.
    again = subprocess.run(
        [TASKCARD, "hook", host],
        input=json.dumps(_payload(host, "02_user_prompt_submit.json", workdir)).encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0
    context = json.loads(again.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "> use the staging database" in context
    assert "> and tell me when done" in context
    assert [ack["id"] for ack in acks(workdir)] == ["m1", "m2"]


def test_a_hook_started_with_stdout_closed_claims_nothing(workdir: Path) -> None:
    queue(workdir, "m1", "use the staging database")
    data = json.dumps(payload("04_post_tool_use.json", workdir)).encode()
    done = subprocess.run(
        ["sh", "-c", f'exec "{TASKCARD}" hook claude-code >&-'],
        input=data,
        stderr=subprocess.PIPE,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0
    assert names(workdir, "queued") == ["m1.json"]
    assert acks(workdir) == []
