"""A disk that fills up in the middle of an appended line: the record is whole, or absent and
said so.

One `write` may take only part of a line (the kernel writes what fits, and refuses only the
next write): `taskcard report` printed the report and exited 0 while `reports.jsonl` held a
torn line, so the report was lost (the next `reports` skipped it as not JSON) after its
writer was told it was recorded; `taskcard activity` did the same to `logs/events.jsonl`.
Driven as a person at a shell, with the file size limit (`ulimit -f`) standing in for a
full disk.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

TASKCARD = str(Path(sys.executable).parent / "taskcard")


def _limit(size: int) -> Callable[[], None]:
    """For `preexec_fn`: files may grow to `size` bytes, as if the disk filled up there."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return apply


def _run(workdir: Path, *args: str, limit: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TASKCARD, *args],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=None if limit is None else _limit(limit),
    )


def test_a_report_the_disk_cuts_short_fails_and_leaves_no_torn_line(tmp_path: Path) -> None:
    for n in range(1, 4):
        assert (
            _run(tmp_path, "report", "--workdir", ".", "--ok", "--summary", f"r{n}").returncode == 0
        )
    path = tmp_path / "reports" / "reports.jsonl"
    before = path.read_bytes()

    cut = _run(
        tmp_path,
        "report",
        "--workdir",
        ".",
        "--ok",
        "--summary",
        "y" * 1500,
        limit=len(before) + 200,
    )

    assert cut.returncode == 1, cut.stdout
    assert cut.stdout == ""  # no report printed as recorded
    assert "File too large" in cut.stderr
    assert path.read_bytes() == before  # nothing torn left behind
    after = _run(tmp_path, "report", "--workdir", ".", "--ok", "--summary", "after")
    assert after.returncode == 0
    latest = _run(tmp_path, "reports", "--workdir", ".")
    assert latest.stderr == ""  # no line skipped as not JSON
    assert json.loads(latest.stdout)["report"]["summary"] == "after"
    assert [json.loads(line)["seq"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]


def test_an_activity_event_the_disk_cuts_short_fails_and_leaves_no_torn_line(
    tmp_path: Path,
) -> None:
    assert _run(tmp_path, "activity", "--workdir", ".", "text", "text=first").returncode == 0
    path = tmp_path / "logs" / "events.jsonl"
    before = path.read_bytes()

    cut = _run(
        tmp_path,
        "activity",
        "--workdir",
        ".",
        "text",
        "text=" + "y" * 1000,
        limit=len(before) + 100,
    )

    assert cut.returncode != 0
    assert "logs/events.jsonl" in cut.stderr
    assert path.read_bytes() == before
    assert _run(tmp_path, "activity", "--workdir", ".", "text", "text=later").returncode == 0
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert texts == ["first", "later"]


# Run as the `taskcard` command, with one hook on the write to `logs/events.jsonl`: just
# before it, another writer (a second `taskcard activity`, as a concurrent hook process is)
# appends its line, and then the disk fills up `CUT` bytes past the end, so our record is cut
# short right after theirs. The interleaving is driven, not timed.
_APPENDED_TO = """
import json, os, resource, subprocess, sys

target = os.path.realpath(os.environ["TARGET"])
real_write = os.write
hooked = False


def write(fd, data):
    global hooked
    if not hooked and os.path.realpath(f"/proc/self/fd/{fd}") == target:
        hooked = True
        other = subprocess.run(json.loads(os.environ["OTHER"]), check=False)
        assert other.returncode == 0
        size = os.fstat(fd).st_size + int(os.environ["CUT"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
    return real_write(fd, data)


os.write = write
from taskcard.bridge.cli import main

sys.argv = ["taskcard", *sys.argv[1:]]
sys.exit(main())
"""


def _activity_meets_another_writer(
    workdir: Path, ours: str, theirs: str
) -> subprocess.CompletedProcess[str]:
    other = [TASKCARD, "activity", "--workdir", str(workdir), "text", f"text={theirs}"]
    return subprocess.run(
        [sys.executable, "-c", _APPENDED_TO, "activity", "--workdir", ".", "text", f"text={ours}"],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            **os.environ,
            "TARGET": str(workdir / "logs" / "events.jsonl"),
            "OTHER": json.dumps(other),
            "CUT": "100",
        },
    )


def test_a_cut_short_event_leaves_the_shorter_line_another_writer_appended_meanwhile(
    tmp_path: Path,
) -> None:
    # The size taken before the write was the cut point: their whole line went with our part.
    assert _run(tmp_path, "activity", "--workdir", ".", "text", "text=first").returncode == 0
    path = tmp_path / "logs" / "events.jsonl"

    cut = _activity_meets_another_writer(tmp_path, "y" * 1000, "theirs")

    assert cut.returncode != 0
    assert "logs/events.jsonl" in cut.stderr
    assert path.read_bytes().endswith(b"\n")
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert texts == ["first", "theirs"]


def test_a_cut_short_event_is_cut_off_after_a_longer_line_another_writer_appended_meanwhile(
    tmp_path: Path,
) -> None:
    # Their line longer than our record put the file past `before + len(ours)`: no cut made,
    # and our torn part stayed for every reader to skip.
    assert _run(tmp_path, "activity", "--workdir", ".", "text", "text=first").returncode == 0
    path = tmp_path / "logs" / "events.jsonl"

    cut = _activity_meets_another_writer(tmp_path, "y" * 300, "z" * 2000)

    assert cut.returncode != 0
    assert "logs/events.jsonl" in cut.stderr
    assert path.read_bytes().endswith(b"\n")
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert texts == ["first", "z" * 2000]
    assert _run(tmp_path, "activity", "--workdir", ".", "text", "text=later").returncode == 0
    latest = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert latest == ["first", "z" * 2000, "later"]
