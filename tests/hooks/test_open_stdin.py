"""A hook whose host writes the payload but never closes stdin (a wrapper keeping its end of
the pipe open). The hook read to the end of stdin, so it waited until the host's timeout
killed it and the event was lost; now a whole JSON object followed by a short silence is the
payload, and a pipe left open with nothing on it ends the read after a few seconds."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .conftest import TASKCARD, kinds, payload
from .test_codex_hooks import codex_payload

# Far above the few seconds the hook waits: the host's own timeout is what this stands for.
EXIT_WITHIN_S = 60


@contextmanager
def started(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`taskcard hook ARGS` with a stdin this test keeps open until the end."""
    with subprocess.Popen(
        [TASKCARD, "hook", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as hook:
        try:
            yield hook
        finally:
            hook.kill()


@pytest.mark.parametrize("host", ["claude-code", "codex"])
def test_a_payload_on_a_stdin_left_open_is_handled_and_the_hook_exits(
    workdir: Path, host: str
) -> None:
    if host == "claude-code":
        data, args = payload("10_stop.json", workdir), ("claude-code",)
    else:
        data, args = codex_payload("06_stop.json", workdir), ("codex", "--only-in", str(workdir))
    with started(*args) as hook:
        assert hook.stdin is not None and hook.stdout is not None
        # Written in two pieces, the first ending as an object does, then left open.
        text = json.dumps(data).encode()
        hook.stdin.write(b'{"nested": {"a": 1}')
        hook.stdin.flush()
        hook.stdin.write(b", " + text[1:])
        hook.stdin.flush()
        assert hook.wait(timeout=EXIT_WITHIN_S) == 0
        assert hook.stdout.read() == b""
    assert "turn.end" in kinds(workdir)


@pytest.mark.parametrize("args", [("claude-code",), ("codex",)])
def test_a_stdin_left_open_and_empty_ends_the_hook_with_a_line_in_its_log(
    workdir: Path, args: tuple[str, ...]
) -> None:
    with started(*args, "--workdir", str(workdir)) as hook:
        assert hook.wait(timeout=EXIT_WITHIN_S) == 0
    assert kinds(workdir) == []
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    assert "no payload" in log, log


@pytest.mark.parametrize("args", [("claude-code",), ("codex",)])
def test_a_payload_no_more_input_can_mend_on_a_stdin_left_open_is_logged_not_json(
    workdir: Path, args: tuple[str, ...]
) -> None:
    """A trailing comma cannot be mended by more bytes: the hook takes what came once the
    pipe goes quiet, logs it as not JSON and exits 0, as it does on a closed pipe."""
    with started(*args, "--workdir", str(workdir)) as hook:
        assert hook.stdin is not None and hook.stdout is not None
        hook.stdin.write(b'{"hook_event_name": "Stop", "cwd": "%s",}\n' % bytes(workdir))
        hook.stdin.flush()
        assert hook.wait(timeout=EXIT_WITHIN_S) == 0
        assert hook.stdout.read() == b""
    assert kinds(workdir) == []
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    assert "payload is not JSON" in log, log
