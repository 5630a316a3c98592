"""An OS error looking at the renderer during a tick fails that tick as `renderer_failed`,
with the system's words and the place, as the same error at `start` does.

`Path.is_file()` ran before the renderer path was resolved at each tick, and it raises every
errno it does not take for "no file" (EIO, ENAMETOOLONG, ...): the tick crashed and the watch
went to `error` as `watch_crash`, "the updater hit an internal error", naming nothing the
agent could look at. Driven as a user would: the host and `card` as processes; EIO comes
from a host whose `os.stat`/`os.lstat` fail for one name once a flag file exists (no file
system fails on demand, FUSE aside), ENAMETOOLONG from a real link whose target's name is
longer than any file system holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from taskcard.producers.task_card.contract import quoted

from .conftest import STATIC_RENDERER, CliHost, wait_for, write_renderer

FAULTY = "faulty.py"
# A host whose stat and lstat of a path ending in FAULTY raise the errno given as the first
# argument while `fault.flag` exists in the working folder (the workdir). The rest of argv
# is the command line.
FAULTY_HOST = f"""
import errno, os, sys
fault = getattr(errno, sys.argv.pop(1))
real_stat = os.stat
def flagged():
    try:
        return bool(real_stat("fault.flag"))
    except OSError:
        return False
def failing(real):
    def call(path, *args, **kwargs):
        if os.fspath(path).endswith({FAULTY!r}) and flagged():
            raise OSError(fault, os.strerror(fault), os.fspath(path))
        return real(path, *args, **kwargs)
    return call
os.stat, os.lstat = failing(os.stat), failing(os.lstat)
from taskcard.bridge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def failed_tick(cli: CliHost) -> dict[str, Any]:
    """The error of watch tc_1 once a tick failed."""
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["status"] == "error", 120)
    inspected = cli.json("card", "inspect", "tc_1")
    error: dict[str, Any] = inspected["error"]
    return error


def test_an_io_error_on_the_renderer_at_a_tick_is_a_failed_tick(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, FAULTY, STATIC_RENDERER)
    command = [sys.executable, "-c", FAULTY_HOST, "EIO", *cli.command("host")[3:]]
    host = subprocess.Popen(
        command, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: cli.host_pid() == host.pid, 60)
        started = cli.run("card", "start", FAULTY, "--interval-s", "1")
        assert started.returncode == 0, started.stdout + started.stderr
        (workdir / "fault.flag").write_text("")
        error = failed_tick(cli)
        assert error["code"] == "renderer_failed", error
        assert error["message"] == (
            f"renderer_path: {quoted(FAULTY)} could not be looked at (Input/output error, EIO"
            f" at {quoted(str(workdir.resolve() / FAULTY))}); nothing is wrong with the name:"
            " call again, and if it keeps failing, check the file system that holds it;"
            " the renderer was not run"
        )
        os.unlink(workdir / "fault.flag")  # the next tick recovers: the watch lives on
        wait_for(lambda: cli.json("card", "inspect", "tc_1")["status"] == "watching", 120)
    finally:
        cli.shutdown()
        host.kill()
        host.wait()


def test_a_name_too_long_behind_a_link_at_a_tick_is_a_failed_tick(
    workdir: Path, cli: CliHost
) -> None:
    (workdir / "sub").mkdir()
    write_renderer(workdir, "sub/r.py", STATIC_RENDERER)
    started = cli.run("card", "start", "sub/r.py", "--interval-s", "1")
    assert started.returncode == 0, started.stdout + started.stderr
    os.rename(workdir / "sub", workdir / "kept")
    os.symlink("x" * 300, workdir / "sub")  # no file system holds a 300-byte name
    error = failed_tick(cli)
    assert error["code"] == "renderer_failed", error
    assert error["message"] == (
        "renderer_path: 'sub/r.py' cannot be used (File name too long); give the renderer's"
        " Python file, inside the workdir; the renderer was not run"
    )
