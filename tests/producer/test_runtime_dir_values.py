"""What `TASKCARD_RUNTIME_DIR` and `--runtime-dir` may name, for every command that reaches
a host: one line naming the variable or the option and the fix (exit 2), never a folder of
spaces, a host among the agent's files, or a traceback in the host's log.

A blank variable was used as a folder named by spaces in the current folder (the same
`--runtime-dir` is a usage error); a folder inside the workdir was taken although the help
says "never inside the workdir"; one too long for a unix socket's path started a host that
died on `bind` with a traceback in its log while the caller said exit 4, "failed to start".
An empty variable still counts as unset. Driven as a person at a shell, and as an MCP
client starts `taskcard mcp` (it is refused before the handshake).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.runtime import (
    MAX_SOCKET_PATH_BYTES,
    RuntimeDirInvalid,
    default_runtime_dir,
)
from tests.conftest import mcp_server
from tests.producer.conftest import STATIC_RENDERER, CliHost, write_renderer

COMMANDS = [
    ["card", "start", "r.py"],
    ["card", "inspect", "tc_1"],
    ["tool", '{"action": "inspect", "input": {"watch_id": "tc_1"}, "reasoning": "r"}'],
    ["host"],
    ["mcp"],
    ["ledger", "supervise"],
]
IDS = [" ".join(command[:2]) for command in COMMANDS]


def _taskcard(
    workdir: Path, command: list[str], env: dict[str, str], *options: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", *command, *options],
        cwd=workdir,
        env={**{k: v for k, v in os.environ.items() if k != "TASKCARD_RUNTIME_DIR"}, **env},
        input="",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _prog(command: list[str]) -> str:
    return "taskcard " + " ".join(command[:2] if command[0] in ("card", "ledger") else command[:1])


def _refused(done: subprocess.CompletedProcess[str], command: list[str], message: str) -> None:
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"{_prog(command)}: {message}\n")


@pytest.mark.parametrize("blank", [" ", "   ", "\t"], ids=["space", "spaces", "tab"])
@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_a_blank_variable_is_refused_naming_it(
    workdir: Path, command: list[str], blank: str
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    done = _taskcard(workdir, command, {"TASKCARD_RUNTIME_DIR": blank})
    _refused(
        done,
        command,
        "TASKCARD_RUNTIME_DIR is blank; set it to a private directory for the hosts' sockets"
        " and locks, or unset it for the default",
    )
    assert sorted(os.listdir(workdir)) == ["r.py"]  # no folder of spaces, no host


def test_an_empty_variable_counts_as_unset(workdir: Path, runtime_dir: Path) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    env = {"TASKCARD_RUNTIME_DIR": "", "XDG_RUNTIME_DIR": str(runtime_dir)}
    host = CliHost(workdir, runtime_dir / "taskcard")
    try:
        done = _taskcard(workdir, ["card", "start", "r.py"], env)
        assert done.returncode == 0, done.stderr
        assert host.paths.socket.exists()
    finally:
        host.shutdown()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, Path(f"/tmp/taskcard-{os.getuid()}")),
        ({"TASKCARD_RUNTIME_DIR": ""}, Path(f"/tmp/taskcard-{os.getuid()}")),
        ({"TASKCARD_RUNTIME_DIR": "/r/t"}, Path("/r/t")),
        ({"TASKCARD_RUNTIME_DIR": "rt"}, Path("rt")),  # from the caller's folder: HostPaths
        ({"TASKCARD_RUNTIME_DIR": "~/rt"}, Path.home() / "rt"),
        ({"XDG_RUNTIME_DIR": "/run/user/7"}, Path("/run/user/7/taskcard")),
        # The XDG base directory specification: a relative value is ignored.
        ({"XDG_RUNTIME_DIR": "run"}, Path(f"/tmp/taskcard-{os.getuid()}")),
        ({"XDG_RUNTIME_DIR": "  "}, Path(f"/tmp/taskcard-{os.getuid()}")),
    ],
)
def test_the_default_folder_by_the_environment(env: dict[str, str], expected: Path) -> None:
    assert default_runtime_dir(env) == expected


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_a_runtime_dir_option_inside_the_workdir_is_refused(
    workdir: Path, command: list[str]
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    done = _taskcard(workdir, command, {}, "--runtime-dir", "rt")
    _refused(
        done,
        command,
        f"--runtime-dir: {workdir}/rt is inside the workdir {workdir}, among the agent's files;"
        " give --runtime-dir a private directory outside it, or leave it out for the default",
    )
    assert sorted(os.listdir(workdir)) == ["r.py"]


@pytest.mark.parametrize("where", [".", "sub/rt", "ABS"])
def test_a_variable_inside_the_workdir_is_refused(workdir: Path, where: str) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    named = str(workdir / "deep" / "rt") if where == "ABS" else where
    inside = workdir / "deep" / "rt" if where == "ABS" else (workdir / where).resolve()
    command = ["card", "start", "r.py"]
    done = _taskcard(workdir, command, {"TASKCARD_RUNTIME_DIR": named})
    _refused(
        done,
        command,
        f"TASKCARD_RUNTIME_DIR: {os.path.abspath(workdir / named)} is inside the workdir"
        f" {workdir}, among the agent's files; give TASKCARD_RUNTIME_DIR a private directory"
        " outside it, or unset it for the default",
    )
    assert not inside.exists() or inside == workdir
    assert sorted(os.listdir(workdir)) == ["r.py"]


def test_a_link_into_the_workdir_is_inside_it(workdir: Path, tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(workdir)
    command = ["card", "inspect", "tc_1"]
    done = _taskcard(workdir, command, {}, "--runtime-dir", str(tmp_path / "link" / "rt"))
    assert done.returncode == 2
    assert f"is inside the workdir {workdir}, among the agent's files" in done.stderr
    assert not (workdir / "rt").exists()


def test_a_folder_too_long_for_a_socket_is_refused_before_any_host(
    workdir: Path, runtime_dir: Path
) -> None:
    socket_name = len("/0123456789abcdef0123.sock")
    fits = MAX_SOCKET_PATH_BYTES - socket_name - len(str(runtime_dir)) - 1
    too_long = runtime_dir / ("x" * (fits + 1))
    command = ["card", "inspect", "tc_1"]
    done = _taskcard(workdir, command, {}, "--runtime-dir", str(too_long))
    _refused(
        done,
        command,
        f"runtime dir {too_long} is too long for the hosts' sockets (a socket's path in it takes"
        f" {MAX_SOCKET_PATH_BYTES + 1} bytes, a unix socket's at most {MAX_SOCKET_PATH_BYTES});"
        " set TASKCARD_RUNTIME_DIR (or --runtime-dir) to a shorter private directory",
    )
    assert not too_long.exists()
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    host = CliHost(workdir, runtime_dir / ("x" * fits))  # one byte shorter: a host answers
    try:
        done = _taskcard(
            workdir, ["card", "start", "r.py"], {}, "--runtime-dir", str(host.runtime_dir)
        )
        assert done.returncode == 0, done.stderr
        assert len(os.fsencode(host.paths.socket)) == MAX_SOCKET_PATH_BYTES
    finally:
        host.shutdown()


KINDS = [
    "file",
    "dangling link",
    "link to a dangling link",
    "file on its path",
    "file further up its path",
    "dangling link on its path",
    "loop on its path",
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_runtime_dir_that_is_no_folder_is_refused_naming_the_fix(
    workdir: Path, other_runtime_dir: Path, kind: str
) -> None:
    """The folder in the way is named as what it is: a file on the path, or a link on it
    that leads nowhere or round a loop, was "File exists" (or "Not a directory") about it.
    The folder is a short one of its own: under pytest's numbered base folder the deeper
    path's socket could pass the length limit, and that refusal would come first."""
    base = other_runtime_dir
    named = base / "rt"
    sub = named / ("sub/deeper" if kind == "file further up its path" else "sub")
    cannot = f"runtime dir {sub} cannot be created:"
    if kind == "file":
        named.write_text("")
        problem = f"runtime dir {named} is not a directory; refusing to use it."
    elif kind == "dangling link":
        named.symlink_to(base / "nowhere")
        problem = (
            f"runtime dir {named} is a symbolic link that leads nowhere (to"
            f" {base / 'nowhere'}, which does not exist); refusing to use it."
        )
    elif kind == "link to a dangling link":
        # `ls` shows `hop`: it was said not to exist.
        (base / "hop").symlink_to(base / "nowhere")
        named.symlink_to(base / "hop")
        problem = (
            f"runtime dir {named} is a symbolic link that leads nowhere (to"
            f" {base / 'hop'}, itself a symbolic link that leads nowhere); refusing to use it."
        )
    elif kind in ("file on its path", "file further up its path"):
        named.write_text("")
        problem = f"{cannot} {named} on its path is a file, not a folder; set"
    elif kind == "dangling link on its path":
        named.symlink_to(base / "nowhere")
        problem = (
            f"{cannot} the symbolic link {named} on its path leads nowhere (to"
            f" {base / 'nowhere'}, which does not exist); set"
        )
    else:
        named.symlink_to("rt")
        problem = (
            f"{cannot} the symbolic link {named} on its path goes round a loop of symbolic"
            " links (to rt); set"
        )
    if kind not in ("file", "dangling link", "link to a dangling link"):
        named = sub
    for env, options in (
        ({"TASKCARD_RUNTIME_DIR": str(named)}, ()),
        ({}, ("--runtime-dir", str(named))),
    ):
        for command in (["card", "inspect", "tc_1"], *READ_ONLY_CALLS):
            done = _taskcard(workdir, command, env, *options)
            assert (done.returncode, done.stdout) == (2, ""), (command, done.stderr)
            assert done.stderr.startswith(f"{_prog(command)}: {problem}"), done.stderr
            assert "TASKCARD_RUNTIME_DIR (or --runtime-dir)" in done.stderr
            assert len(done.stderr.splitlines()) == 1


# The calls no host answers: they only read files, yet a bad runtime folder a user chose is
# refused for them as for any call (they were answered through it).
READ_ONLY_CALLS = [
    ["card", "settings"],
    ["card", "manual"],
    ["tool", '{"action": "manual", "input": {}, "reasoning": "r"}'],
    ["tool", '{"action": "settings", "input": {}, "reasoning": "r"}'],
]


@pytest.mark.parametrize("command", READ_ONLY_CALLS, ids=" ".join)
def test_a_runtime_dir_others_may_enter_is_refused_for_the_calls_no_host_answers(
    workdir: Path, other_runtime_dir: Path, command: list[str]
) -> None:
    """A folder of mode 0755 is refused for `inspect`; `settings` and `manual` answered
    through it, though the guide says a folder given to them is checked as for any call.
    One that does not exist yet is not made for them, and passes."""
    loose = other_runtime_dir / "rt"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    for env, options in (
        ({"TASKCARD_RUNTIME_DIR": str(loose)}, ()),
        ({}, ("--runtime-dir", str(loose))),
    ):
        done = _taskcard(workdir, command, env, *options)
        _refused(
            done,
            command,
            f"runtime dir {loose} has mode 0755, looser than 0700; refusing to use it. Remove"
            " it if it is not yours, or set TASKCARD_RUNTIME_DIR (or --runtime-dir) to a"
            " private directory",
        )
    missing = other_runtime_dir / "later"
    done = _taskcard(workdir, command, {}, "--runtime-dir", str(missing))
    assert done.returncode == 0, done.stderr
    assert not missing.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder of mode 0500")
def test_an_unwritable_runtime_dir_is_refused_naming_the_fix(
    workdir: Path, runtime_dir: Path
) -> None:
    runtime_dir.chmod(0o500)
    try:
        done = _taskcard(
            workdir, ["card", "inspect", "tc_1"], {}, "--runtime-dir", str(runtime_dir)
        )
    finally:
        runtime_dir.chmod(0o700)
    _refused(
        done,
        ["card", "inspect"],
        f"runtime dir {runtime_dir} is not writable (mode 0500); chmod 700 it, or set"
        " TASKCARD_RUNTIME_DIR (or --runtime-dir) to a private directory you can write",
    )


@pytest.mark.parametrize("how", ["env", "option"])
def test_a_home_of_no_known_user_is_refused_naming_it(workdir: Path, how: str) -> None:
    named = "~no-such-user-here/rt"
    command = ["card", "inspect", "tc_1"]
    if how == "env":
        done = _taskcard(workdir, command, {"TASKCARD_RUNTIME_DIR": named})
        said = f"TASKCARD_RUNTIME_DIR={named} cannot be expanded; set it to the full path of"
    else:
        done = _taskcard(workdir, command, {}, "--runtime-dir", named)
        said = f"--runtime-dir: {named} cannot be expanded; give the full path of"
    _refused(done, command, f"{said} a private directory")


async def test_an_mcp_client_sees_the_server_refuse_a_blank_variable(
    workdir: Path, tmp_path: Path
) -> None:
    """The SDK's stdio client, as an agent host starts `taskcard mcp` with the variable in
    its config: the server says why on stderr and exits before the handshake, and the
    client's `initialize` fails at once instead of listing tools that all fail."""
    server = mcp_server(workdir, tmp_path / "unused")
    args = server.args[: server.args.index("--runtime-dir")]  # the variable alone chooses
    env = {**os.environ, "TASKCARD_RUNTIME_DIR": "  "}
    params = StdioServerParameters(command=server.command, args=args, env=env, cwd=workdir)
    with (tmp_path / "stderr").open("w+") as errlog:
        with pytest.raises(ExceptionGroup):  # the SDK's: its reader found the pipe closed
            with anyio.fail_after(60):
                async with (
                    stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
        errlog.seek(0)
        said = errlog.read()
    assert said == (
        "taskcard mcp: TASKCARD_RUNTIME_DIR is blank; set it to a private directory for the"
        " hosts' sockets and locks, or unset it for the default\n"
    )
    assert sorted(os.listdir(workdir)) == []


def test_a_runtime_dir_under_a_workdir_of_slash_is_taken(runtime_dir: Path) -> None:
    """Every folder is inside `/`: an agent working in `/` (a container's) had every
    `--runtime-dir` refused as inside its workdir, with no choice left but the default.
    The folder is one taskcard makes itself."""
    wanted = runtime_dir / "rt"
    done = _taskcard(Path("/"), ["card", "settings"], {}, "--runtime-dir", str(wanted))
    assert done.returncode == 0, done.stderr
    assert "inside the workdir" not in done.stderr


def test_a_cache_folder_under_a_home_the_agent_works_in_is_taken() -> None:
    """`TASKCARD_RUNTIME_DIR=~/.cache/taskcard` with an agent working in the home folder
    itself: the user's own folders, not the agent's files. (A short home under /tmp: a
    socket's path must fit 107 bytes.)"""
    home = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
    write_renderer(home, "r.py", STATIC_RENDERER)
    env = {"HOME": str(home), "TASKCARD_RUNTIME_DIR": "~/.cache/tc"}
    host = CliHost(home, home / ".cache" / "tc")
    try:
        done = _taskcard(home, ["card", "start", "r.py"], env)
        assert done.returncode == 0, done.stderr
        assert host.paths.socket.exists()
    finally:
        host.shutdown()
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("how", ["argument", "variable"])
def test_the_python_api_refuses_a_runtime_dir_inside_the_workdir_as_the_cli_does(
    workdir: Path, how: str
) -> None:
    """`TaskCard(workdir, runtime_dir=...)`, as an agent's own Python opens it: a folder
    inside the workdir was taken, the host's lock and socket among the agent's files, while
    every command refused it with exit 2. The same words, naming the argument or the
    variable, as the project's usual error type."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    inside = workdir / "rt"
    if how == "argument":
        named, environ = "runtime_dir", {"PATH": os.defpath}
        call: dict[str, Path] = {"runtime_dir": inside}
        default = "leave it out"
    else:
        named = "TASKCARD_RUNTIME_DIR"
        environ = {"PATH": os.defpath, named: str(inside)}
        call = {}
        default = "unset it"
    with pytest.raises(RuntimeDirInvalid) as refused:
        TaskCard(workdir, environ=environ, **call)
    assert str(refused.value) == (
        f"{named}: {inside} is inside the workdir {workdir}, among the agent's files; give"
        f" {named} a private directory outside it, or {default} for the default"
    )
    assert sorted(os.listdir(workdir)) == ["r.py"]  # no lock, no socket, no host folder
