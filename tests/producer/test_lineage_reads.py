"""`taskcard spawn --parent-workdir`: the parent's lineage.json is read safely.

A named pipe there used to block the spawn forever, and a link to /dev/zero to read without
end; each is now refused at once with exit 2 and a message naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .test_reports import taskcard


def _spawn(child: Path, parent: Path) -> tuple[int, str]:
    done = taskcard(
        "spawn", "--workdir", str(child), "--parent", "p0", "--reason", "split",
        "--parent-workdir", str(parent),
    )  # fmt: skip
    return done.returncode, done.stderr.decode()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", "huge"])
def test_a_parent_lineage_that_is_not_a_small_regular_file_is_refused_naming_it(
    tmp_path: Path, kind: str
) -> None:
    parent, child = tmp_path / "parent", tmp_path / "child"
    parent.mkdir()
    child.mkdir()
    path = parent / "lineage.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_text(json.dumps({"depth": 1, "reason": "x" * 40_000}))
    code, stderr = _spawn(child, parent)
    assert code == 2, stderr
    assert str(path) in stderr and "Traceback" not in stderr
    expected = {
        "fifo": "named pipe",
        "dev-zero": "not a regular file",
        "folder": "not a regular file",
        "huge": "over 16384 bytes",
    }
    assert expected[kind] in stderr
    assert not (child / "lineage.json").exists()


def test_a_small_regular_parent_lineage_still_gives_the_depth(tmp_path: Path) -> None:
    parent, child = tmp_path / "parent", tmp_path / "child"
    parent.mkdir()
    child.mkdir()
    (parent / "lineage.json").write_text(json.dumps({"depth": 2, "parent": "root"}))
    assert _spawn(child, parent) == (0, "")
    assert json.loads((child / "lineage.json").read_text())["depth"] == 3
