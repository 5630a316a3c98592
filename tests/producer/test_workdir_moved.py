"""A workdir moved away under a running host: the host ends at once, and the moved folder's
card is served again by the next call there.

The host stopped the watch ("its workdir is gone") but stayed up for its idle grace, holding
the workdir lock that moved with the folder: every call on the moved folder started a host
that was refused, and was answered "no task card host answered" (exit 4) meanwhile, while
the card there still read `active`. Driven as an agent at a shell.
"""

from __future__ import annotations

from pathlib import Path

from .conftest import CliHost, pid_alive, wait_for, write_renderer


def _host_watching(cli: CliHost, workdir: Path) -> int:
    """A host with a long grace (only the workdir's going can end it within a test) running
    a watch in `workdir`; its pid."""
    assert cli.run("host", "--detach", "--idle-grace-s", "3600").returncode == 0
    write_renderer(workdir, "r.py", 'print("# build\\nstep 1")')
    started = cli.run("card", "start", "r.py", "--interval-s", "1")
    assert started.returncode == 0, started.stderr
    pid = cli.host_pid()
    assert pid is not None
    return pid


def _moved_card_resumes(moved: Path, runtime_dir: Path) -> None:
    """The next call on the moved folder gets a host of its own, which resumes its watch."""
    there = CliHost(moved, runtime_dir)
    try:
        inspected = there.run("card", "inspect", "tc_1")
        assert inspected.returncode == 0, inspected.stderr
        assert inspected.stdout.startswith("inspect: watching (watch tc_1)")
        assert (moved / "taskcard" / "status").read_text() == "active"
    finally:
        there.shutdown()


def test_a_host_whose_workdir_moved_ends_and_the_moved_card_resumes(
    cli: CliHost, workdir: Path, runtime_dir: Path
) -> None:
    pid = _host_watching(cli, workdir)
    moved = workdir.with_name(workdir.name + "-moved")
    workdir.rename(moved)

    wait_for(lambda: not pid_alive(pid), 120)
    _moved_card_resumes(moved, runtime_dir)


def test_a_host_whose_workdir_was_moved_and_made_again_ends_and_each_folder_is_served_apart(
    cli: CliHost, workdir: Path, runtime_dir: Path
) -> None:
    # `mv w w.old && mkdir w`: the path still reads as a folder, but not the one whose lock
    # the host holds. The host went on (its watch rendered on into the new folder), kept the
    # moved folder's lock and answered calls on the new folder for the moved one.
    pid = _host_watching(cli, workdir)
    moved = workdir.with_name(workdir.name + "-moved")
    workdir.rename(moved)
    workdir.mkdir()

    wait_for(lambda: not pid_alive(pid), 120)
    write_renderer(workdir, "r.py", 'print("# deploy\\nstep 1")')
    fresh = cli.run("card", "start", "r.py", "--interval-s", "1")
    assert fresh.returncode == 0, fresh.stderr
    assert cli.host_pid() not in (None, pid)
    _moved_card_resumes(moved, runtime_dir)
