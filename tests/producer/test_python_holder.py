"""A workdir held by a program's own Python `TaskCard` (`with TaskCard(...)`), met by the
other ways of calling it: a `taskcard card` command, `taskcard mcp`, a second program's
`TaskCard`. The command waited 60 s for a host socket that such a program never opens and
exited 4 ("no host"); now each is refused at once, with exit 3 for the command, naming the
holding program's pid and script and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.runtime import HostAlreadyRunning

from .conftest import STATIC_RENDERER, CliHost, envelope, write_renderer

HOLDER = """
import sys
from taskcard.producers.task_card import TaskCard
with TaskCard(sys.argv[1], runtime_dir=sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder(workdir: Path, runtime_dir: Path, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A separate program holding the workdir through its own TaskCard until its stdin ends."""
    script = tmp_path / "my_agent.py"
    script.write_text(HOLDER)
    # The program's own arguments are not shown: a token given to it would be.
    command = [sys.executable, str(script), str(workdir), str(runtime_dir), "--token=s3cret"]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "held\n"
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=60)
    proc.stdout.close()


def _names_the_holder(message: str, holder: subprocess.Popen[str]) -> None:
    assert f"held by a Python program's TaskCard (pid {holder.pid}: " in message, message
    assert "my_agent.py)" in message and "s3cret" not in message, message
    assert "leave its `with TaskCard(...)` block" in message, message


def test_a_command_is_refused_at_once_with_exit_3_naming_the_program(
    workdir: Path, cli: CliHost, holder: subprocess.Popen[str]
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    # Well under the 60 s the command used to wait before it exited 4.
    done = cli.run("card", "start", "r.py", timeout_s=50)
    assert done.returncode == 3, done.stderr
    _names_the_holder(done.stderr, holder)
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_command_with_another_runtime_dir_is_told_the_same(
    workdir: Path, cli: CliHost, holder: subprocess.Popen[str], other_runtime_dir: Path
) -> None:
    elsewhere = CliHost(workdir, other_runtime_dir)
    done = elsewhere.run("card", "inspect", "tc_1", timeout_s=50)
    assert done.returncode == 3, done.stderr
    _names_the_holder(done.stderr, holder)


async def test_an_mcp_call_is_refused_naming_the_program(
    workdir: Path, cli: CliHost, holder: subprocess.Popen[str]
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    async with cli.mcp() as session:
        answer = await session.call_tool("task_card", envelope("start", renderer_path="r.py"))
    result = answer.structured_content
    assert result is not None and result["code"] == "workdir_held", result
    _names_the_holder(result["message"], holder)


def test_a_second_python_task_card_is_told_which_program_holds_it(
    workdir: Path, runtime_dir: Path, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(HostAlreadyRunning) as refused:
        TaskCard(workdir, runtime_dir=runtime_dir)
    _names_the_holder(str(refused.value), holder)


RELEASED_HOLDER = """
import os, sys, time
from taskcard.producers.task_card import TaskCard
workdir, runtime_dir, release = sys.argv[1:4]
with TaskCard(workdir, runtime_dir=runtime_dir):
    print("held", flush=True)
    while not os.path.exists(release):
        time.sleep(0.05)
"""


@pytest.mark.parametrize(
    ("form", "shown"),
    [
        ("script", "my_agent.py"),
        ("-c", "-c ..."),
        ("-c glued", "-c ..."),
        ("-Ic", "-c ..."),
        ("-m glued", "my_agent.py"),
        ("- (standard input)", " -"),
    ],
)
def test_the_holders_note_never_carries_its_code_or_arguments(
    workdir: Path, runtime_dir: Path, tmp_path: Path, form: str, shown: str
) -> None:
    """The note in the workdir names the program by the interpreter and what Python made of
    its program (the script's or module's path, `-c`, `-`). Read from the raw command line,
    an option glued to code (`-cimport ...`, `-Ic ...`) or to a module (`-mapp`) let the code
    and the program's arguments, a token among them, into the note and into every refusal."""
    script = tmp_path / "my_agent.py"
    script.write_text(RELEASED_HOLDER)
    release = tmp_path / "release"
    arguments = [str(workdir), str(runtime_dir), str(release), "--token=s3cret"]
    code = RELEASED_HOLDER.replace("TaskCard(", "TaskCard(  # k3y\n")  # a secret in the code
    stdin: str | None = None
    command = {
        "script": [sys.executable, str(script)],
        "-c": [sys.executable, "-c", code],
        "-c glued": [sys.executable, f"-c{code}"],
        "-Ic": [sys.executable, "-Ic", code],
        "-m glued": [sys.executable, "-mmy_agent"],
        "- (standard input)": [sys.executable, "-"],
    }[form]
    if form == "- (standard input)":
        stdin = code
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.Popen(
        [*command, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    if stdin is not None:
        proc.stdin.write(stdin)
    proc.stdin.close()
    try:
        assert proc.stdout.readline() == "held\n"
        notes = b"".join(
            path.read_bytes() for path in (workdir / ".taskcard-host").rglob("*") if path.is_file()
        ).decode(errors="replace")
        assert f'"pid": {proc.pid}' in notes, notes
        assert "s3cret" not in notes and "k3y" not in notes and "import" not in notes, notes
        assert shown in notes, notes
    finally:
        release.write_text("")
        proc.wait(timeout=60)
        proc.stdout.close()
