"""A workdir inside a loop of symbolic links is named as one by every inbox reader.

`peek` and `claim_all` (and the `inbox` tool behind them) raised the system's bare
`OSError: [Errno 40] Too many levels of symbolic links`, naming no link: every other reader
of a path says "the symbolic link L on its path goes round a loop of symbolic links (to T)"
(`contract.link_loop`). Now the Python API raises `WorkdirError` in those words, the command
line says them with exit 2 (a usage error, as for any unusable `--workdir`), and the MCP
server answers `workdir_gone` in them (tests/producer/test_mcp_tool_failure_codes.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from taskcard.producers.inbox import claim_all, claiming, peek
from taskcard.producers.inbox.claim import acknowledge, release
from taskcard.producers.task_card import WorkdirError


def looped(tmp_path: Path) -> tuple[Path, str]:
    """A workdir under a link that goes round a loop, and what every reader says of it."""
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    workdir = tmp_path / "a" / "agent"
    said = (
        f"{workdir} the symbolic link {tmp_path / 'a'} on its path goes round a loop of"
        " symbolic links (to b); fix the links"
    )
    return workdir, said


def test_the_python_api_names_the_link_of_the_loop(tmp_path: Path) -> None:
    workdir, said = looped(tmp_path)
    for read in (peek, lambda w: claim_all(w, "inbox-cli")):
        with pytest.raises(WorkdirError) as raised:
            read(workdir)
        assert str(raised.value).startswith(f"workdir: {said}"), raised.value
    with pytest.raises(WorkdirError), claiming(workdir, "inbox-cli"):
        pass
    # Settling after a claim records the problem, as for an inbox gone meanwhile.
    (problem,) = acknowledge(workdir, ["m1"], "inbox-cli")
    assert "goes round a loop of symbolic links" in problem, problem
    (problem,) = release(workdir, ["m1"])
    assert "goes round a loop of symbolic links" in problem, problem


@pytest.mark.parametrize("peeking", [True, False])
def test_the_command_line_names_the_link_with_exit_2(tmp_path: Path, peeking: bool) -> None:
    workdir, _ = looped(tmp_path)
    command = [sys.executable, "-m", "taskcard.bridge.cli", "inbox", "--workdir", str(workdir)]
    done = subprocess.run(
        [*command, *(["--peek"] if peeking else [])],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "the symbolic link" in done.stderr and "goes round a loop" in done.stderr, done
    assert "Traceback" not in done.stderr
