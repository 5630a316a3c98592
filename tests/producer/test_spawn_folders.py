"""Which folder a spawn may record as a child: never one that closes a loop in the lineage,
never one inside the parent's contract folders.

Driven through every way an agent records a spawn: the `spawn` tool over MCP stdio (the real
client), `taskcard spawn`, and the Python API, with the child's folder spelt the hostile ways
(`..`, a trailing slash, a relative name, a symbolic link, a link to the parent's folder).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.reports import LineageError, read_lineage, spawn
from taskcard.producers.reports.contract import parse_lineage
from taskcard.producers.task_card.contract import quoted

from ..conftest import mcp_session
from .test_reports import TASKCARD

CONTRACT_DIRS = ("taskcard", ".notification", "logs", "reports", "inbox", "ledger")

Call = Callable[[str], Awaitable[dict[str, Any]]]


@asynccontextmanager
async def spawn_tool(workdir: Path, runtime_dir: Path) -> AsyncIterator[Call]:
    """The `spawn` tool of `taskcard mcp --workdir workdir`: a call with a child's folder
    returns the result (`is_error` as `failed`)."""
    async with mcp_session(workdir, runtime_dir, (TASKCARD,)) as session:

        async def call(child: str) -> dict[str, Any]:
            result = await session.call_tool(
                "spawn", {"child_workdir": child, "reason": "split the work"}
            )
            content = result.structured_content
            assert isinstance(content, dict), result
            return {**content, "failed": result.is_error}

        yield call


def cli_spawn(
    child: str, parent: str, parent_workdir: str, cwd: Path
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            TASKCARD, "spawn", "--workdir", child, "--parent", parent,
            "--reason", "split the work", "--parent-workdir", parent_workdir,
        ],
        cwd=cwd,
        capture_output=True,
        timeout=120,
        check=False,
    )  # fmt: skip


def refused_by_cli(done: subprocess.CompletedProcess[bytes], *words: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(b"taskcard spawn: --workdir: "), done.stderr
    for word in words:
        assert word.encode() in done.stderr, done.stderr
    assert b"Traceback" not in done.stderr


def refused_by_tool(result: dict[str, Any], *words: str) -> None:
    assert result["failed"], result
    assert result["message"].startswith("child_workdir: "), result
    for word in words:
        assert word in result["message"], result


async def test_a_spawn_that_would_close_a_loop_is_refused_at_any_depth(
    tmp_path: Path, runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b spawned by a, then a "spawned" by b was recorded when a had no lineage.json (a root):
    each folder named the other as its parent. The record now keeps the parent's folder, and
    a spawn whose child is already above its parent in the chain is refused, naming the
    child's field, the chain and the fix: two folders, three (a -> b -> c -> a), the child
    named any way. Siblings, nested children and a folder named like another agent are
    still recorded."""
    team = tmp_path / "team"
    a, b, c = team / "a", team / "b", team / "c"
    for folder in (a, b, c, a / "nested", team / "d", tmp_path / "elsewhere" / "a"):
        folder.mkdir(parents=True)
    (tmp_path / "alias").symlink_to(a)  # a through a link
    (b / "up").symlink_to(team)  # the team folder through a link in b
    rt = runtime_dir  # short: a socket's path under tmp_path can pass 107 bytes

    async with spawn_tool(a, rt) as from_a:
        first = await from_a("../b")
        assert not first["failed"], first
        assert (first["parent"], first["parent_workdir"], first["depth"]) == ("a", str(a), 1)
        # Siblings side by side and a nested child are fine.
        assert not (await from_a(str(team / "d") + "/"))["failed"]
        assert not (await from_a("nested"))["failed"]
    async with spawn_tool(b, rt) as from_b:
        for name in ("../a", "../a/", str(a), "up/a", "../b/../a", str(tmp_path / "alias")):
            refused_by_tool(
                await from_b(name), "is an ancestor of the parent", "a folder of its own"
            )
        assert not (await from_b("../c"))["failed"]
    assert read_lineage(a) is None

    # Depth 3: a -> b -> c, then a as c's child; the message shows the chain.
    async with spawn_tool(c, rt) as from_c:
        refused = await from_c("../a")
        refused_by_tool(refused, f"{str(a)!r} -> {str(b)!r} -> {str(c)!r}", "close a loop")
        # A folder named like another agent is another folder.
        assert not (await from_c(str(tmp_path / "elsewhere" / "a")))["failed"]

    # The command line: absolute, relative with `..` and a trailing slash, through links.
    refused_by_cli(cli_spawn(str(a), "b", str(b), tmp_path), "is an ancestor of the parent")
    refused_by_cli(cli_spawn("../a/", "c", "./", c), f"{str(a)!r} -> {str(b)!r} -> {str(c)!r}")
    refused_by_cli(cli_spawn("alias", "c", "team/b/up/c", tmp_path), "close a loop")
    # The Python API, with the folder as given (not resolved by a command line).
    for child in (a, tmp_path / "alias", b / "up" / "a", c / ".." / "a"):
        with pytest.raises(LineageError, match=r"^child: .* is an ancestor of the parent"):
            spawn(child, parent="c", reason="loop", parent_workdir=c)
    monkeypatch.chdir(team)  # relative names start at the current folder
    with pytest.raises(LineageError, match=r"^child: 'a' is an ancestor of the parent"):
        spawn("a/", parent="c", reason="loop", parent_workdir="./c/")  # type: ignore[arg-type]
    assert read_lineage(a) is None
    assert [read_lineage(x)["parent"] for x in (b, c)] == ["a", "b"]  # type: ignore[index]


async def test_a_child_inside_the_parents_contract_folders_is_refused(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """A child's workdir inside the parent's inbox/, reports/, ledger/, taskcard/, logs/ or
    .notification/ was recorded: the child's files mixed with the parent's, where the
    service writes the parent's inbox. Refused, naming the folder and the fix, however the
    child's folder is spelt; a folder of the same name elsewhere is fine."""
    parent = tmp_path / "planner"
    for name in CONTRACT_DIRS:
        (parent / name / "deep" / "child").mkdir(parents=True)
    (parent / "work" / "inbox" / "child").mkdir(parents=True)  # not the parent's inbox
    (tmp_path / "inbox" / "child").mkdir(parents=True)  # beside the parent
    (parent / "sneak").symlink_to(parent / "reports")
    (tmp_path / "me").symlink_to(parent)
    (tmp_path / "q").symlink_to(parent / "inbox")
    rt = runtime_dir  # short: a socket's path under tmp_path can pass 107 bytes

    async with spawn_tool(parent, rt) as tool:
        for name in CONTRACT_DIRS:
            for child in (f"{name}/deep/child", f"{name}/deep/child/", f"work/../{name}/deep"):
                refused_by_tool(
                    await tool(child), f"inside the parent's {name}/ folder", f"outside {name}/"
                )
        for child in ("sneak/deep", str(tmp_path / "me" / "ledger" / "deep"), "../q/deep"):
            refused_by_tool(await tool(child), "inside the parent's")
        # The contract folder itself is inside it too.
        refused_by_tool(await tool("inbox"), f"({str(parent / 'inbox')!r})")
        for child in ("work/inbox/child", "../inbox/child"):
            assert not (await tool(child))["failed"], child

    refused_by_cli(
        cli_spawn("me/inbox/deep/child/", "planner", "me", tmp_path),
        "inside the parent's inbox/ folder",
        f"({str(parent / 'inbox')!r})",
    )
    refused_by_cli(
        cli_spawn("../q/deep/../deep", "planner", ".", parent),
        "inside the parent's inbox/ folder",
    )
    for child in (parent / "taskcard" / "deep", tmp_path / "me" / "logs", parent / "sneak"):
        with pytest.raises(LineageError, match=r"^child: .* inside the parent's \w+/ folder"):
            spawn(child, parent="planner", reason="r", parent_workdir=tmp_path / "me")
    for name in CONTRACT_DIRS:
        assert not list((parent / name).rglob("lineage.json")), name
    assert read_lineage(parent / "work" / "inbox" / "child") is not None


def test_the_case_of_a_contract_folder_follows_the_file_system(tmp_path: Path) -> None:
    """`INBOX` is the parent's inbox where the file system ignores case (a child there is
    refused) and another folder where it does not (a child there is recorded): the folders
    are compared, not their names."""
    parent = tmp_path / "planner"
    (parent / "inbox").mkdir(parents=True)
    (parent / "INBOX" / "child").mkdir(parents=True, exist_ok=True)
    done = cli_spawn("INBOX/child", "planner", ".", parent)
    if (parent / "inbox").samefile(parent / "INBOX"):
        refused_by_cli(done, "inside the parent's inbox/ folder")
    else:
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["parent_workdir"] == str(parent)


def test_the_recorded_parent_folder_is_kept_on_a_retry(tmp_path: Path) -> None:
    """A retry naming the same parent is fine; one that leaves the parent's folder out (which
    would drop the link a later loop check walks) is refused naming parent_workdir, one that
    names another parent folder naming workdir (the child's folder is someone's already). A
    folder name that is not UTF-8 is recorded so it reads back."""
    a, b, child = tmp_path / "a", tmp_path / "b", tmp_path / "child"
    odd = Path(tmp_path.as_posix() + "/p\udcff")
    for folder in (a, b, child, odd):
        folder.mkdir()
    spawn(child, parent="a", reason="first", parent_workdir=a)
    spawn(child, parent="a", reason="again", parent_workdir=tmp_path / "b" / ".." / "a")
    done = subprocess.run(
        [TASKCARD, "spawn", "--workdir", str(child), "--parent", "a", "--reason", "again"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(b"taskcard spawn: --parent-workdir: "), done.stderr
    assert b"give it again as --parent-workdir" in done.stderr
    with pytest.raises(LineageError, match=r"^child: .* already recorded as the child of 'a' in"):
        spawn(child, parent="a", reason="moved", parent_workdir=b)
    assert json.loads((child / "lineage.json").read_text()) | {"created_at": None} == {
        "parent": "a",
        "parent_workdir": str(a),
        "reason": "again",
        "provider": None,
        "depth": 1,
        "created_at": None,
    }
    # The service reads the record as before (it does not read parent_workdir).
    seen = parse_lineage((child / "lineage.json").read_bytes())
    assert seen is not None and (seen.parent, seen.reason, seen.depth) == ("a", "again", 1)
    # Under a folder whose name is not UTF-8: the file stays UTF-8, the loop is still seen.
    spawn(b, parent="odd", reason="r", parent_workdir=odd)
    (b / "lineage.json").read_bytes().decode("utf-8")
    assert read_lineage(b)["parent_workdir"] == str(odd)  # type: ignore[index]
    with pytest.raises(LineageError, match="is an ancestor of the parent"):
        spawn(odd, parent="b", reason="loop", parent_workdir=b)


def test_a_hand_written_loop_above_the_parent_ends_the_walk(tmp_path: Path) -> None:
    """Records written by hand may loop among themselves or name odd folders; the walk up
    the chain stops there instead of running forever, and the spawn is recorded. A chain
    longer than spawns write is refused, naming the field, rather than walked without end."""
    a, b, child = tmp_path / "a", tmp_path / "b", tmp_path / "child"
    for folder in (a, b, child):
        folder.mkdir()
    for here, there in ((a, b), (b, a)):
        (here / "lineage.json").write_text(
            json.dumps(
                {"parent": there.name, "parent_workdir": str(there), "depth": 1, "reason": "r"}
            )
        )
    assert spawn(child, parent="a", reason="r", parent_workdir=a)["depth"] == 2
    (a / "lineage.json").write_text(
        json.dumps({"parent": "x", "parent_workdir": "relative/x", "depth": 1, "reason": "r"})
    )
    (child / "lineage.json").unlink()
    assert spawn(child, parent="a", reason="r", parent_workdir=a)["depth"] == 2

    # A chain of 1100 folders, each naming the next: refused, naming the last record read.
    links = [tmp_path / "chain" / str(n) for n in range(1100)]
    for here, there in zip(links, [*links[1:], None], strict=True):
        here.mkdir(parents=True)
        if there is not None:
            record = {"parent": there.name, "parent_workdir": str(there), "depth": 1, "reason": "r"}
            (here / "lineage.json").write_text(json.dumps(record))
    (tmp_path / "fresh").mkdir()
    done = cli_spawn(str(tmp_path / "fresh"), "0", str(links[0]), tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(b"taskcard spawn: --parent-workdir: "), done.stderr
    assert b"more than 1024 folders" in done.stderr and b"fix or remove" in done.stderr
    assert b"chain/1024/lineage.json" in done.stderr
    assert not (tmp_path / "fresh" / "lineage.json").exists()


def test_a_parent_folder_name_too_long_is_named_as_the_parent_s(tmp_path: Path) -> None:
    """A `--parent-workdir` longer than a path may be was refused as "cannot write
    lineage.json (File name too long)" of the child, with the advice to move what is in the
    way aside: the child's file was never the problem."""
    child = tmp_path / "child"
    child.mkdir()
    done = cli_spawn(str(child), "p", "z" * 5000, tmp_path)
    assert (done.returncode, done.stdout) == (2, b"")
    # The name is quoted cut to its first characters, so how much of it shows depends on
    # how long pytest's folder is: a longer base folder left no "zzz" in the line.
    named = quoted(str(tmp_path / ("z" * 5000)))
    assert done.stderr.decode() == (
        f"taskcard spawn: --parent-workdir: {named} cannot be used (File name too long); give the"
        " parent's working directory, or leave it out\n"
    )
    assert not (child / "lineage.json").exists()
