"""`taskcard report --payload PATH` reads a regular file, and refuses anything else at once.

A named pipe with no writer held the command for ever at its `open`; `/dev/zero` was read
up to the cap and refused as a payload too long; a socket was "No such device or address".
Each is now one line naming the option, what the name is, and the fix, before a byte is
read; a regular file over the limit is refused for its size without being read whole; a
`--payload -` whose stdin is never closed ends after a quiet while instead of never.
Driven as a person at a shell.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from taskcard.producers.reports.cli import PAYLOAD_STDIN_IDLE_S
from taskcard.producers.reports.store import MAX_PAYLOAD_BYTES

TASKCARD = str(Path(sys.executable).parent / "taskcard")


def _report(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TASKCARD, "report", "--workdir", str(workdir), "--ok", "--summary", "s", *args],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _socket(path: Path) -> Path:
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(path))
    return path  # the name stays after the socket is closed


MADE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "fifo": (_fifo, "a named pipe"),
    "folder": (_folder, "a folder"),
    "socket": (_socket, "a socket"),
}


@pytest.mark.parametrize("name", sorted(MADE))
def test_a_payload_that_is_no_regular_file_is_refused_at_once(
    workdir: Path, runtime_dir: Path, name: str
) -> None:
    make, kind = MADE[name]
    path = make(runtime_dir / name)  # the short folder: a socket's name is limited
    done = _report(workdir, "--payload", str(path))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"taskcard report: --payload: {path} is {kind}, not a regular file; write the payload"
        " to a file, or pipe it in with --payload -\n"
    )
    assert not (workdir / "reports").exists()


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused_rather_than_read(workdir: Path, device: str) -> None:
    done = _report(workdir, "--payload", device)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"taskcard report: --payload: {device} is a device, not a regular file; write the"
        " payload to a file, or pipe it in with --payload -\n"
    )
    assert not (workdir / "reports").exists()


def test_a_regular_file_over_the_limit_is_refused_for_its_size(workdir: Path) -> None:
    huge = workdir / "huge.txt"
    with huge.open("wb") as handle:
        handle.truncate(64 * MAX_PAYLOAD_BYTES)
    done = _report(workdir, "--payload", str(huge))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"taskcard report: --payload: over {MAX_PAYLOAD_BYTES} bytes;")


def test_a_regular_file_is_read_as_before(workdir: Path) -> None:
    (workdir / "notes.txt").write_text("all green\n")
    done = _report(workdir, "--payload", "notes.txt")
    assert done.returncode == 0, done.stderr
    assert (workdir / "reports" / "payloads" / "1.txt").read_text() == "all green\n"


def test_a_stdin_held_open_ends_the_read_with_a_refusal(workdir: Path) -> None:
    """A caller that runs the command with a pipe it never closes (as an agent host's tool
    runner does when nothing is piped in) held `--payload -` for ever."""
    with subprocess.Popen(
        [TASKCARD, "report", "--workdir", str(workdir), "--ok", "--summary", "s", "--payload", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdin is not None
        proc.stdin.write(b"half of it")
        proc.stdin.flush()
        try:
            proc.wait(timeout=PAYLOAD_STDIN_IDLE_S + 90)  # stdin stays open all along
        finally:
            proc.kill()
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
    assert (proc.returncode, out) == (2, b""), err
    assert err.decode() == (
        f"taskcard report: --payload: stdin stayed open {PAYLOAD_STDIN_IDLE_S:g} s without a byte"
        " and without its end; close it after the payload, or name a file\n"
    )
    assert not (workdir / "reports").exists()


def test_a_payload_over_the_limit_on_stdin_is_taken_whole_before_the_refusal(
    workdir: Path,
) -> None:
    """`producer | taskcard report --payload -` with more than the limit: only the limit and
    a byte were read, so the producer got a broken pipe and the pipeline failed (141 under
    `pipefail`) besides the refusal. The rest is read and dropped, then refused naming the
    limit. Driven as a shell pipeline, as an agent's tool call runs it."""
    script = (
        "set -o pipefail\n"
        f"head -c {16 * MAX_PAYLOAD_BYTES} /dev/zero | tr '\\0' a"
        f' | "$1" report --workdir "$2" --ok --summary s --payload -\n'
        'echo "${PIPESTATUS[*]}"\n'
    )
    done = subprocess.run(
        ["bash", "-c", script, "bash", TASKCARD, str(workdir)],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout == "0 0 2\n", done.stderr  # the writers ended well, the report with 2
    assert done.stderr == (
        f"taskcard report: --payload: over {MAX_PAYLOAD_BYTES} bytes; write the rest to a file"
        " in the workdir and name it in the payload\n"
    )
    assert not (workdir / "reports").exists()
