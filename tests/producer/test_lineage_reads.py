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


@pytest.mark.parametrize("where", ["the file", "a folder on its path"])
def test_a_lineage_round_a_loop_of_links_names_the_link(tmp_path: Path, where: str) -> None:
    """`read_lineage` said "lineage.json: cannot be read (Too many levels of symbolic links)"
    and named no link; it says which link goes round the loop and where it points, in the
    words of every reader (`contract.link_loop`), from the Python API and `taskcard spawn`."""
    from taskcard.producers.reports import LineageError, read_lineage

    if where == "the file":
        workdir = tmp_path / "parent"
        workdir.mkdir()
        (workdir / "lineage.json").symlink_to("lineage.json")
        said = (
            f"{workdir / 'lineage.json'} is a symbolic link that goes round a loop of symbolic"
            " links (to lineage.json); fix the links"
        )
    else:
        (tmp_path / "a").symlink_to("b")
        (tmp_path / "b").symlink_to("a")
        workdir = tmp_path / "a" / "parent"
        said = (
            f"{workdir / 'lineage.json'} cannot be read: the symbolic link {tmp_path / 'a'} on"
            " its path goes round a loop of symbolic links (to b); fix the links"
        )
    with pytest.raises(LineageError) as raised:
        read_lineage(workdir)
    assert str(raised.value) == said
    assert raised.value.code == "unusable_file"
    if where == "the file":  # the command line reads the parent's lineage the same way
        child = tmp_path / "child"
        child.mkdir()
        code, stderr = _spawn(child, workdir)
        assert code == 2, stderr
        assert said in stderr, stderr


def test_a_parent_lineage_whose_read_fails_exits_1(tmp_path: Path) -> None:
    """The system failing a read (EIO: `/proc/self/mem` fails so at offset 0) is a failure,
    exit 1, as a failed write is; it exited 2, the code of input to mend."""
    parent, child = tmp_path / "parent", tmp_path / "child"
    parent.mkdir()
    child.mkdir()
    (parent / "lineage.json").symlink_to("/proc/self/mem")
    code, stderr = _spawn(child, parent)
    assert (code, stderr) == (
        1,
        f"taskcard spawn: {parent / 'lineage.json'}: cannot be read (Input/output error)\n",
    )
    assert not (child / "lineage.json").exists()
