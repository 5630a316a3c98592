"""Point 2: the renderer fence (process group, bounded output, stderr tail) and `classify`."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from taskcard.producers.task_card.contract import body_chars
from taskcard.producers.task_card.renderer import (
    RENDER_NICE_INCREMENT,
    PidWindow,
    ProcEntry,
    Rendered,
    RendererPathError,
    RenderFailure,
    RunOutcome,
    RunRequest,
    _snapshot,
    classify,
    kill_seen,
    pid_window,
    renderer_environment,
    resolve_renderer,
    run_renderer,
    stdout_limit_for,
)

from .conftest import pid_alive, wait_for, write_renderer


def outcome(**changes: object) -> RunOutcome:
    base: dict[str, object] = {
        "exit_code": 0,
        "timed_out": False,
        "cancelled": False,
        "stdout": b"# body\n",
        "stdout_overflow": False,
        "stderr_tail": b"",
        "spawn_error": None,
        "duration_s": 0.1,
    }
    base.update(changes)
    return RunOutcome(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("run", "code"),
    [
        (outcome(spawn_error="no such file"), "renderer_failed"),
        (outcome(timed_out=True, exit_code=None), "renderer_timeout"),
        (outcome(stdout_overflow=True, exit_code=None), "body_too_large"),
        (outcome(exit_code=2), "renderer_nonzero_exit"),
        (outcome(stdout=b"\xff\xfe"), "renderer_invalid_utf8"),
        (outcome(stdout=b"  \n\t"), "renderer_blank_output"),
        (outcome(stdout=b"x" * 101), "body_too_large"),
    ],
)
def test_classify_names_failures_from_typed_fields(run: RunOutcome, code: str) -> None:
    verdict = classify(run, max_body_chars=100, timeout_s=1)
    assert isinstance(verdict, RenderFailure)
    assert verdict.code == code


@pytest.mark.parametrize(
    ("exit_code", "said"),
    [
        (3, "the renderer exited with code 3"),
        (-9, "the renderer did not exit: it was ended by signal 9 (SIGKILL)"),
        (-11, "the renderer did not exit: it was ended by signal 11 (SIGSEGV)"),
        (-200, "the renderer did not exit: it was ended by signal 200 (unnamed)"),
    ],
)
def test_classify_names_the_signal_that_ended_a_renderer(exit_code: int, said: str) -> None:
    """A renderer killed by a signal (the out-of-memory killer's SIGKILL, a crash) was told
    as "exited with code -9", an exit code no program can return."""
    verdict = classify(outcome(exit_code=exit_code), max_body_chars=100, timeout_s=1)
    assert verdict == RenderFailure("renderer_nonzero_exit", said)


def test_classify_keeps_the_body_verbatim_and_counts_characters_not_bytes() -> None:
    body = "é" * 100 + "\n"
    assert classify(outcome(stdout=body.encode()), max_body_chars=101, timeout_s=1) == Rendered(
        body
    )


@pytest.mark.parametrize(
    ("stdout", "accepted"),
    [
        ("x" * 100, True),  # exactly the limit
        ("x" * 100 + "\n", True),  # what print() writes: the final newline ends the line
        ("x" * 100 + "\r\n", True),
        ("x" * 101, False),
        ("x" * 101 + "\n", False),
        ("x" * 100 + "\n\n", False),  # only one terminator is left out
        ("é" * 99 + "\n", True),  # characters, not bytes
        ("x" * 99 + "\n" + "y", False),  # an inner newline is content
    ],
)
def test_max_body_chars_is_exact_and_ignores_only_the_final_newline(
    stdout: str, accepted: bool
) -> None:
    verdict = classify(outcome(stdout=stdout.encode()), max_body_chars=100, timeout_s=1)
    if accepted:
        assert verdict == Rendered(stdout)  # published verbatim, newline included
    else:
        assert isinstance(verdict, RenderFailure) and verdict.code == "body_too_large"
    assert (body_chars(stdout) <= 100) is accepted


def request(workdir: Path, renderer: Path, timeout_s: float = 10, chars: int = 2000) -> RunRequest:
    return RunRequest(
        renderer=renderer,
        workdir=workdir,
        timeout_s=timeout_s,
        stdout_limit_bytes=stdout_limit_for(chars),
        env=renderer_environment({"PATH": "/usr/bin:/bin", "SECRET_TOKEN": "hunter2"}),
    )


def test_a_timeout_kills_the_renderer_and_the_child_it_spawned(workdir: Path) -> None:
    renderer = write_renderer(
        workdir,
        "slow.py",
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "open('pids', 'w').write(f'{os.getpid()} {child.pid}')\n"
        "time.sleep(300)\n",
    )
    run = run_renderer(request(workdir, renderer, timeout_s=2), threading.Event())
    assert run.timed_out
    assert classify(run, 2000, 2).code == "renderer_timeout"  # type: ignore[union-attr]
    parent, child = (int(x) for x in (workdir / "pids").read_text().split())
    wait_for(lambda: not pid_alive(parent) and not pid_alive(child), 30)


def test_a_renderer_printing_a_gigabyte_is_cut_off_with_bounded_memory(workdir: Path) -> None:
    renderer = write_renderer(
        workdir,
        "flood.py",
        "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
    )
    run = run_renderer(request(workdir, renderer, timeout_s=60, chars=2000), threading.Event())
    assert run.stdout_overflow
    assert len(run.stdout) <= stdout_limit_for(2000)
    assert classify(run, 2000, 60).code == "body_too_large"  # type: ignore[union-attr]


def test_stderr_tail_is_kept_bounded_and_the_environment_is_minimal(workdir: Path) -> None:
    renderer = write_renderer(
        workdir,
        "noisy.py",
        "import os, sys\nsys.stderr.write('e' * 100000 + 'THE END')\n"
        "print(os.environ.get('SECRET_TOKEN', 'no secret'), os.getcwd())\nsys.exit(1)\n",
    )
    run = run_renderer(request(workdir, renderer), threading.Event())
    assert run.exit_code == 1
    assert run.stderr_tail.endswith(b"THE END")
    assert len(run.stderr_tail) <= 4096
    assert run.stdout.decode().split() == ["no", "secret", str(workdir.resolve())]


def test_cancel_stops_a_running_renderer(workdir: Path) -> None:
    renderer = write_renderer(workdir, "sleepy.py", "import time\ntime.sleep(300)\n")
    cancel = threading.Event()
    cancel.set()
    run = run_renderer(request(workdir, renderer, timeout_s=60), cancel)
    assert run.cancelled


def test_renderer_paths_must_resolve_to_a_regular_file_inside_the_workdir(
    workdir: Path, tmp_path: Path
) -> None:
    inside = write_renderer(workdir, "r.py", "print(1)")
    assert resolve_renderer(workdir, "r.py") == inside.resolve()
    assert resolve_renderer(workdir, str(inside)) == inside.resolve()
    outside = tmp_path / "outside.py"
    outside.write_text("print(1)")
    (workdir / "link.py").symlink_to(outside)
    (workdir / "folder.py").mkdir()
    for bad, why in (
        ("link.py", "outside the workdir"),
        ("../outside.py", "outside the workdir"),
        ("folder.py", "not a regular file"),
        ("missing.py", "does not exist"),
    ):
        with pytest.raises(RendererPathError, match=why):
            resolve_renderer(workdir, bad)


# ----------------------------------------------------------------- the sweep's pid window


@pytest.mark.parametrize(
    ("leader", "forks", "cursor", "pid_max", "expected"),
    [
        # the usual case: a few pids allocated since the spawn
        (1000, (50, 60), (1012, 400), 32768, PidWindow(1000, 1012)),
        # nothing allocated since: the leader alone
        (1000, (50, 50), (1000, 400), 32768, PidWindow(1000, 1000)),
        # the counter wrapped once: the window is circular
        (32700, (50, 200), (420, 400), 32768, PidWindow(32700, 420)),
        # so many forks the counter may have gone all the way round: read everything
        (1000, (0, 16000), (1012, 400), 32768, None),
        # forks plus threads alive reach half the ring: read everything
        (1000, (0, 15900), (1012, 400), 32768, None),
        # a large pid_max leaves room for the same numbers
        (1000, (0, 16000), (1012, 400), 4194304, PidWindow(1000, 1012)),
        # anything unreadable or absurd: read everything
        (1000, (None, 60), (1012, 400), 32768, None),
        (1000, (50, None), (1012, 400), 32768, None),
        (1000, (50, 60), None, 32768, None),
        (1000, (50, 60), (1012, 400), None, None),
        (1000, (60, 50), (1012, 400), 32768, None),
        (40000, (50, 60), (1012, 400), 32768, None),
        (1000, (50, 60), (0, 400), 32768, None),
    ],
)
def test_pid_window(
    leader: int,
    forks: tuple[int | None, int | None],
    cursor: tuple[int, int] | None,
    pid_max: int | None,
    expected: PidWindow | None,
) -> None:
    assert pid_window(leader, forks[0], forks[1], cursor, pid_max) == expected


@pytest.mark.parametrize(
    ("window", "inside", "outside"),
    [
        (PidWindow(100, 200), [100, 150, 200], [99, 201, 5]),
        (PidWindow(32700, 420), [32700, 32767, 300, 420], [421, 32699, 1000]),
    ],
)
def test_pid_window_membership(window: PidWindow, inside: list[int], outside: list[int]) -> None:
    assert all(pid in window for pid in inside)
    assert not any(pid in window for pid in outside)


def test_a_probed_window_finds_processes_but_never_threads() -> None:
    """A thread of a live renderer must never look like an orphan child of the host."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert thread.native_id is not None
        low, high = sorted((thread.native_id, child.pid))
        if high - low <= 256:  # the probing path; past that /proc is listed (no threads)
            pids = {entry.pid for entry in _snapshot(None, PidWindow(low, high))}
            assert child.pid in pids
            assert thread.native_id not in pids
        listed = {entry.pid for entry in _snapshot(None, None)}
        assert child.pid in listed
        assert thread.native_id not in listed
    finally:
        stop.set()
        thread.join()
        child.kill()
        child.wait()


def test_renderers_run_at_a_lower_cpu_priority_than_the_host(workdir: Path) -> None:
    # The renice lands right after the spawn; the sleep keeps a loaded machine from racing it.
    renderer = write_renderer(
        workdir, "nice.py", "import os, time\ntime.sleep(0.3)\nprint(os.nice(0))\n"
    )
    mine = os.nice(0)
    run = run_renderer(request(workdir, renderer), threading.Event())
    assert run.exit_code == 0, run
    assert int(run.stdout) == min(19, mine + RENDER_NICE_INCREMENT)


def test_a_renderer_that_closes_its_pipes_and_lingers_is_killed_long_before_its_timeout(
    workdir: Path,
) -> None:
    renderer = write_renderer(
        workdir,
        "linger.py",
        "import os, time\nprint('# body', flush=True)\nos.close(1)\nos.close(2)\n"
        "open('pid', 'w').write(str(os.getpid()))\ntime.sleep(300)\n",
    )
    run = run_renderer(request(workdir, renderer, timeout_s=120), threading.Event())
    assert not run.timed_out
    assert run.stdout == b"# body\n"
    assert run.exit_code is not None and run.exit_code < 0  # killed, not waited for
    assert classify(run, 2000, 120).code == "renderer_nonzero_exit"  # type: ignore[union-attr]
    wait_for(lambda: not pid_alive(int((workdir / "pid").read_text())), 30)


def test_output_left_behind_by_an_exited_renderer_is_read_and_its_pipe_holder_killed(
    workdir: Path,
) -> None:
    renderer = write_renderer(
        workdir,
        "holder.py",
        "import os, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "open('child', 'w').write(str(child.pid))\n"
        "print('# body from a renderer whose child keeps the pipes')\n",
    )
    run = run_renderer(request(workdir, renderer, timeout_s=120), threading.Event())
    assert not run.timed_out
    assert run.exit_code == 0
    assert run.stdout == b"# body from a renderer whose child keeps the pipes\n"
    wait_for(lambda: not pid_alive(int((workdir / "child").read_text())), 30)


def test_stdin_is_empty_and_many_runs_leave_no_descriptor_behind(workdir: Path) -> None:
    renderer = write_renderer(
        workdir, "stdin.py", "import sys\nprint(repr(sys.stdin.read()) or 'x')\n"
    )
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        run = run_renderer(request(workdir, renderer), threading.Event())
        assert (run.exit_code, run.stdout) == (0, b"''\n")
    assert len(os.listdir("/proc/self/fd")) <= before + 1  # at most the shared /dev/null


@pytest.mark.parametrize(
    ("chars", "size"),
    [
        (2000, 1999),  # stdout fits the pipe: read without waking the loop, in pieces
        (100_000, 99_000),  # larger than a pipe: stdout is polled as it comes
    ],
)
def test_output_written_in_pieces_while_the_renderer_runs_arrives_whole(
    workdir: Path, chars: int, size: int
) -> None:
    renderer = write_renderer(
        workdir,
        "pieces.py",
        "import sys, time\n"
        f"size = {size}\n"
        "for start in range(0, size, 7000):\n"
        "    sys.stdout.write('x' * min(7000, size - start))\n"
        "    sys.stdout.flush()\n"
        "    time.sleep(0.02)\n"
        "sys.stderr.write('done')\n",
    )
    run = run_renderer(request(workdir, renderer, timeout_s=60, chars=chars), threading.Event())
    assert (run.exit_code, run.stdout_overflow, run.stderr_tail) == (0, False, b"done")
    assert classify(run, chars, 60) == Rendered("x" * size)


def test_a_renderer_flooding_stdout_and_never_exiting_is_cut_off_long_before_its_timeout(
    workdir: Path,
) -> None:
    renderer = write_renderer(
        workdir,
        "flood_and_stay.py",
        "import os, time\nos.write(1, b'x' * 20000)\ntime.sleep(300)\n",
    )
    run = run_renderer(request(workdir, renderer, timeout_s=120, chars=2000), threading.Event())
    assert run.stdout_overflow and not run.timed_out
    assert classify(run, 2000, 120).code == "body_too_large"  # type: ignore[union-attr]


@pytest.mark.parametrize("extra", [0, 1])
@pytest.mark.parametrize("pause_s", [0, 0.01])
def test_stdout_of_exactly_the_limit_passes_and_one_byte_more_is_an_overflow(
    workdir: Path, extra: int, pause_s: float
) -> None:
    # Written at once, or slowly in pieces while the run's loop wakes between them; the
    # renderer then stays, so only the byte count can end the run before its timeout.
    limit = stdout_limit_for(2000)
    renderer = write_renderer(
        workdir,
        "edge.py",
        "import os, time\n"
        f"data = b'a' * {limit + extra}\n"
        "for start in range(0, len(data), 1000):\n"
        "    os.write(1, data[start : start + 1000])\n"
        f"    time.sleep({pause_s})\n"
        "os.close(1)\n"
        "time.sleep(0.3 if len(data) == "
        f"{limit} else 300)\n",
    )
    run = run_renderer(request(workdir, renderer, timeout_s=120, chars=2000), threading.Event())
    assert not run.timed_out
    assert run.stdout == b"a" * limit
    assert run.stdout_overflow is bool(extra)
    assert (run.exit_code == 0) is not bool(extra)


def test_the_sweep_never_signals_a_process_that_took_a_doomed_pid() -> None:
    """A doomed process may exit and its pid go to an unrelated process between the sweep's
    look at /proc and its kill: the kill checks who holds the pid (its start time, through
    a pidfd) and leaves another process alone."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        seen = next(e for e in _snapshot(None) if e.pid == bystander.pid)
        assert seen.start is not None
        # What the sweep saw: the process that held this pid before, started earlier.
        earlier = ProcEntry(bystander.pid, seen.ppid, False, False, seen.start - 1)
        kill_seen(earlier)
        assert bystander.poll() is None and pid_alive(bystander.pid)
        kill_seen(seen)
        assert bystander.wait(timeout=60) == -9
    finally:
        bystander.kill()
        bystander.wait()
