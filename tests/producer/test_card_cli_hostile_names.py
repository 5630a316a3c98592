"""Folder names given to `taskcard card` that no folder can have, or that a terminal would act
on, through the real command line: a `--workdir` too long to open ended in a traceback; a
`--runtime-dir` of 100 KB came back whole, twice, in the refusal; and a runtime dir holding an
escape sequence was printed raw in the line that says another host holds the workdir."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import CliHost

LONG = "x" * 100_000


def one_short_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-2000:]
    (line,) = stderr.splitlines()
    assert len(line) < 1000, line[:300]
    return line


@pytest.mark.parametrize("name", [LONG, "/" + "a/" * 3000])
def test_a_workdir_too_long_to_open_is_a_usage_error_not_a_traceback(
    cli: CliHost, name: str
) -> None:
    for action in (["settings"], ["inspect", "tc_1"]):
        done = cli.run("card", *action, "--workdir", name)
        assert done.returncode == 2, done.stderr[-500:]
        line = one_short_line(done.stderr)
        assert line.startswith(f"taskcard card {action[0]}: argument --workdir: ")
        assert "characters) cannot be used (File name too long); pass the agent's working" in line


def test_a_runtime_dir_too_long_is_said_once_and_cut(workdir: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "taskcard.bridge.cli", "card", "inspect", "tc_1"),
            *("--workdir", str(workdir), "--runtime-dir", LONG),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    line = one_short_line(done.stderr)
    assert line.startswith("taskcard card inspect: runtime dir ")
    # Resolved from the current folder: longer than given, and said once; refused for the
    # socket path it cannot hold before anything is made.
    assert line.count("characters)") == 1 and "is too long for the hosts' sockets" in line


@pytest.fixture
def escaped_runtime_dir() -> Iterator[Path]:
    """A private runtime dir whose name holds an escape sequence (short: a socket path)."""
    path = Path(tempfile.mkdtemp(prefix="tc\x1b[2J"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_host_elsewhere_names_its_runtime_dir_without_raw_controls(
    workdir: Path, runtime_dir: Path, escaped_runtime_dir: Path
) -> None:
    first = CliHost(workdir, escaped_runtime_dir)
    second = CliHost(workdir, runtime_dir)
    try:
        first.start_host()  # its host holds the workdir
        done = second.run("card", "inspect", "tc_1")
        assert done.returncode == 3
        line = one_short_line(done.stderr)
        assert "\x1b" not in line
        assert f"runtime dir {str(escaped_runtime_dir)!r});" in line
        assert os.path.isdir(escaped_runtime_dir)
    finally:
        first.shutdown()
        second.shutdown()
