"""`card start` (and the `task_card` tool over MCP) with a renderer path that names no Python
file: each refusal says what the name is and what to give instead.

A folder, a named pipe or a socket was "is not a regular file", leaving both to guess; a
name too long to look at, or one under a regular file (`notes.py/r.py`), was said not to
exist; one ending in `/` (`r.py/`, a folder's name) started a watch on the file. Driven
through the real command line and the SDK's stdio client, one host for both, stopped at the
end.

Every refusal of the renderer path is a usage error on the command line (exit 2, as a
`--workdir` that names no folder is), with `code: bad_renderer_path` in the result; it exited
1, as if the call had failed at its work.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.task_card.contract import quoted

from .conftest import STATIC_RENDERER, CliHost, envelope, write_renderer


def _refused_start(cli: CliHost, name: str) -> dict[str, Any]:
    """`card start NAME --json` refused for its renderer path: exit 2, the result parsed."""
    done = cli.run("card", "start", name, "--json")
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    result: dict[str, Any] = json.loads(done.stdout)
    assert (result["status"], result["code"]) == ("failed", "bad_renderer_path"), result
    return result


KINDS = ["folder", "fifo", "socket", "long", "under a file", "trailing slash", "slash dot"]


def _make(workdir: Path, kind: str) -> tuple[str, str]:
    """The renderer_path to give, and what the refusal says after it."""
    name = {
        "folder": "r_dir",
        "fifo": "r_fifo",
        "socket": "r_sock",
        "long": "z" * 5000,
        "under a file": "notes.py/r.py",
        "trailing slash": "r.py/",
        "slash dot": "r.py/.",
    }[kind]
    if kind in ("trailing slash", "slash dot"):
        # `r.py/` started a watch on the file `r.py`: `Path` drops the ending.
        write_renderer(workdir, "r.py", STATIC_RENDERER)
        ending = name[name.index("/") :]
        return name, (
            f"renderer_path: '{name}' ends in '{ending}', which names a folder; give the"
            " renderer's Python file without it"
        )
    if kind == "under a file":
        (workdir / "notes.py").write_text("# mine\n")
        return name, (
            "renderer_path: 'notes.py/r.py' goes through 'notes.py', a file, as if it were a"
            " folder; give the renderer's Python file"
        )
    if kind == "folder":
        (workdir / name).mkdir()
    elif kind == "fifo":
        os.mkfifo(workdir / name)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(name)  # relative: the workdir's own path may pass 107 bytes
    what = {"folder": "a folder", "fifo": "a named pipe", "socket": "a socket"}
    if kind == "long":
        return name, (
            f"renderer_path: {quoted(name)} cannot be used (File name too long); give the"
            " renderer's Python file, inside the workdir"
        )
    return name, (
        f"renderer_path: '{name}' is {what[kind]}, not a regular file; give the renderer's"
        " Python file"
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_a_renderer_path_that_is_no_file_says_what_it_is(
    workdir: Path, cli: CliHost, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)
    name, said = _make(workdir, kind)
    started = _refused_start(cli, name)
    assert started["message"] == said
    async with cli.mcp() as session:
        result = await session.call_tool("task_card", envelope("start", renderer_path=name))
    assert result.is_error and isinstance(result.structured_content, dict)
    assert result.structured_content["message"] == said
    write_renderer(workdir, "r.py", STATIC_RENDERER)  # the good path answers as before
    assert cli.json("card", "start", "r.py")["status"] == "watching"


LINKS = ["dangling", "folder link", "loop", "folder loop"]


def _broken(workdir: Path, kind: str) -> tuple[str, str]:
    """A renderer_path through a symbolic link that leads nowhere, and what the refusal says."""
    if kind == "dangling":
        (workdir / "r.py").symlink_to("gone.py")
        return "r.py", (
            "'r.py' is a symbolic link that leads nowhere (to gone.py, which does not exist);"
            " create what it points to, or give the renderer's Python file itself"
        )
    if kind == "folder link":
        (workdir / "cards").symlink_to("nowhere")
        return "cards/r.py", (
            "'cards/r.py' cannot be reached: the symbolic link cards on its path leads nowhere"
            " (to nowhere, which does not exist); create what it points to, or give the"
            " renderer's Python file itself"
        )
    if kind == "folder loop":  # named as the agent sees it, from the workdir
        (workdir / "cards").symlink_to("cards")
        return "cards/r.py", (
            "'cards/r.py' cannot be reached: the symbolic link cards on its path goes round a"
            " loop of symbolic links (to cards); fix the links, or give the renderer's Python"
            " file itself"
        )
    (workdir / "r.py").symlink_to("s.py")
    (workdir / "s.py").symlink_to("r.py")
    return "r.py", (
        "'r.py' is a symbolic link that goes round a loop of symbolic links (to s.py); fix the"
        " links, or give the renderer's Python file itself"
    )


@pytest.mark.parametrize("kind", LINKS)
async def test_a_renderer_path_through_a_broken_link_names_the_link(
    workdir: Path, cli: CliHost, kind: str
) -> None:
    """A renderer linked from elsewhere in the workdir whose file is gone (or a folder link
    leading nowhere, or a loop of links) was "does not exist (relative paths start at the
    workdir)" about a name the agent sees there: the refusal names the link and where it
    points, on the command line and over MCP alike, in the words of every path option
    (`contract.dangling_link`; the renderer said "is a symbolic link to 'T', which does not
    exist" of its own)."""
    name, said = _broken(workdir, kind)
    started = _refused_start(cli, name)
    assert started["message"].startswith(f"renderer_path: {said}"), started
    async with cli.mcp() as session:
        result = await session.call_tool("task_card", envelope("start", renderer_path=name))
    assert result.is_error and isinstance(result.structured_content, dict)
    assert result.structured_content["message"] == started["message"]


OUTSIDE = ["parent", "absolute", "link out", "missing"]


def _elsewhere(workdir: Path, tmp_path: Path, kind: str) -> tuple[str, str]:
    """A renderer_path that names a file outside the workdir, or none, and the refusal."""
    outside = tmp_path / "elsewhere.py"
    outside.write_text(STATIC_RENDERER)
    if kind == "missing":
        return "gone.py", (
            "renderer_path: 'gone.py' does not exist (relative paths start at the workdir)"
        )
    name = {"parent": "../elsewhere.py", "absolute": str(outside), "link out": "r.py"}[kind]
    if kind == "link out":
        (workdir / "r.py").symlink_to(outside)
    return name, (
        f"renderer_path: {quoted(name)} resolves outside the workdir; keep it inside {workdir}"
    )


@pytest.mark.parametrize("kind", OUTSIDE)
async def test_a_renderer_path_outside_the_workdir_or_missing_is_a_usage_error(
    workdir: Path, tmp_path: Path, cli: CliHost, kind: str
) -> None:
    name, said = _elsewhere(workdir, tmp_path, kind)
    started = _refused_start(cli, name)
    assert started["message"] == said
    told = cli.run("tool", json.dumps(envelope("start", renderer_path=name)))
    assert told.returncode == 2, (told.stdout, told.stderr)
    assert json.loads(told.stdout)["message"] == said
    async with cli.mcp() as session:
        result = await session.call_tool("task_card", envelope("start", renderer_path=name))
    assert result.is_error and isinstance(result.structured_content, dict)
    assert result.structured_content["message"] == said
    assert not (workdir / "taskcard" / "status").exists()  # no card was started


@pytest.mark.parametrize("kind", ["missing", "folder"])
async def test_a_start_refused_for_its_renderer_path_starts_no_host(
    workdir: Path, cli: CliHost, kind: str
) -> None:
    """The refusal is given before any host is started: one used to start, answer only this
    refusal and idle for its grace (120 s by default), a process left behind by a command
    that was refused. On the command line, `tool` and over MCP alike."""
    if kind == "folder":
        (workdir / "r_dir").mkdir()
    name = {"missing": "gone.py", "folder": "r_dir"}[kind]
    started = _refused_start(cli, name)
    summarized = {**envelope("start", renderer_path=name), "summarize": True}
    told = cli.run("tool", json.dumps(summarized))
    assert told.returncode == 2, (told.stdout, told.stderr)
    assert json.loads(told.stdout)["summary"] == f"start failed: {started['message']}"
    async with cli.mcp() as session:
        result = await session.call_tool("task_card", envelope("start", renderer_path=name))
    assert result.is_error and isinstance(result.structured_content, dict)
    assert result.structured_content["message"] == started["message"]
    assert cli.host_pid() is None
    assert not cli.paths.socket.exists() and not cli.paths.log.exists()


# `taskcard` with a fault in the file system under the renderer's name: `os.lstat` of a path
# ending in FAULTY raises the errno given as the first argument (no file system at hand
# fails on demand, FUSE aside). The rest of argv is the command line.
FAULTY = "faulty.py"
FAULT_INJECTED = f"""
import errno, os, sys
fault = getattr(errno, sys.argv.pop(1))
real_lstat = os.lstat
def lstat(path, *args, **kwargs):
    if os.fspath(path).endswith({FAULTY!r}):
        raise OSError(fault, os.strerror(fault), os.fspath(path))
    return real_lstat(path, *args, **kwargs)
os.lstat = lstat
from taskcard.bridge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _faulty_start(cli: CliHost, fault: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", FAULT_INJECTED, fault, *cli.command("card", "start")[3:]]
    command[command.index("start") + 1 : command.index("start") + 1] = [FAULTY, "--json"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_a_renderer_path_the_file_system_fails_on_is_a_failure_not_a_usage_error(
    workdir: Path, cli: CliHost
) -> None:
    """An I/O error looking at the renderer (EIO here; ENOMEM, ESTALE alike) says nothing of
    the name the caller gave: it was a usage error (exit 2, `bad_renderer_path`, "cannot be
    used"), telling them to mend an argument that was fine. Now it fails (exit 1,
    `renderer_failed`) with the system's words, the errno and the place."""
    write_renderer(workdir, FAULTY, STATIC_RENDERER)
    done = _faulty_start(cli, "EIO")
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    result = json.loads(done.stdout)
    assert (result["status"], result["code"]) == ("failed", "renderer_failed"), result
    assert result["message"] == (
        f"renderer_path: {quoted(FAULTY)} could not be looked at (Input/output error, EIO at"
        f" {quoted(str(workdir.resolve() / FAULTY))}); nothing is wrong with the name: call"
        " again, and if it keeps failing, check the file system that holds it"
    )
    assert cli.host_pid() is None  # and no host was started for it


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("EACCES", "Permission denied"),
        # A name the file system cannot hold (vfat, CIFS, 9p): it was an I/O failure, exit 1,
        # "nothing is wrong with the name: call again", which never helps.
        ("EINVAL", "Invalid argument"),
        ("EILSEQ", "Invalid or incomplete multibyte or wide character"),
    ],
)
def test_a_renderer_path_we_may_not_enter_or_name_stays_a_usage_error(
    workdir: Path, cli: CliHost, fault: str, words: str
) -> None:
    """EACCES on the way to the renderer is the caller's to mend (the path is theirs to choose,
    its folders theirs to open), and so is a name the file system refuses: still exit 2,
    `bad_renderer_path`, with the system's words."""
    write_renderer(workdir, FAULTY, STATIC_RENDERER)
    done = _faulty_start(cli, fault)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    result = json.loads(done.stdout)
    assert (result["status"], result["code"]) == ("failed", "bad_renderer_path"), result
    assert result["message"] == (
        f"renderer_path: {quoted(FAULTY)} cannot be used ({words}); give the"
        " renderer's Python file, inside the workdir"
    )
