"""A spawn whose child's `lineage.json` the system refuses to write (here a folder stands at
its name), said one way on the three ways in. The Python API raised the system's bare
`OSError` (`IsADirectoryError`), with neither the project's error type, its code nor the
field; MCP said `child_workdir: cannot write ...`; the command line said `cannot write ...`
without a field. Now each raises or says `LineageError` with `code` `write_failed` and the
field as that way names the child's folder (`child:`, `child_workdir:`, `--workdir:`); the
error is still an `OSError` with the system's errno, so old callers' `except OSError` holds."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from taskcard.producers.reports import LineageError, spawn

from .conftest import CliHost


@pytest.fixture
def blocked(workdir: Path) -> Path:
    child = workdir / "child"
    (child / "lineage.json").mkdir(parents=True)
    return child


def _the_words(message: str, field: str, child: Path) -> None:
    path = child / "lineage.json"
    assert message.startswith(f"{field}: cannot write {path} (Is a directory); "), message
    assert message.endswith("move what is in the way aside or make it writable"), message


def test_python_raises_the_projects_error_still_an_oserror(workdir: Path, blocked: Path) -> None:
    with pytest.raises(LineageError) as refused:
        spawn(blocked, parent="agent", reason="lint", parent_workdir=workdir)
    error = refused.value
    assert error.code == "write_failed", error
    assert isinstance(error, OSError) and error.errno == errno.EISDIR, error
    _the_words(str(error), "child", blocked)
    assert (blocked / "lineage.json").is_dir()
    with pytest.raises(OSError):  # as an old caller catches it
        spawn(blocked, parent="agent", reason="lint", parent_workdir=workdir)


async def test_mcp_says_it_with_its_field_and_code(cli: CliHost, blocked: Path) -> None:
    async with cli.mcp() as session:
        result = await session.call_tool("spawn", {"child_workdir": "child", "reason": "lint"})
    content = result.structured_content
    assert result.is_error and isinstance(content, dict), result
    assert content["code"] == "write_failed", content
    _the_words(content["message"], "child_workdir", blocked)


def test_the_command_line_names_its_option_and_exits_1(blocked: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "spawn", "--workdir", str(blocked),
         "--parent", "agent", "--reason", "lint"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("taskcard spawn: "), done.stderr
    _the_words(done.stderr.removeprefix("taskcard spawn: ").rstrip("\n"), "--workdir", blocked)
    assert done.stderr.count("\n") == 1, done.stderr
