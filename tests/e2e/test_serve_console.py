"""`taskcard serve` with no chat channel projects every agent's card to the terminal."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import STATE_FILE, SqliteStore
from tests.e2e.harness import (
    ROOT,
    ServeProcess,
    eventually,
    notify,
    publish,
    run_cli,
    set_status,
)


def write_config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = ".taskcard"\n'
        '[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
        '[[agents]]\nid = "reviewer"\nworkdir = "agents/reviewer"\n' + extra
    )
    return config


async def test_console_shows_cards_live_and_stops_cleanly(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    builder = tmp_path / "agents" / "builder"
    builder.mkdir(parents=True)
    # The reviewer's workdir does not exist yet: it appears while the service runs.
    with ServeProcess(config) as serve:
        await eventually(lambda: "serving 2 agents on 2 routes" in serve.logs, what="service start")
        publish(builder, "**compile** step 1 of 3")
        await eventually(lambda: "compile" in serve.output, what="first card on the console")
        publish(builder, "**tests** step 2 of 3")
        await eventually(lambda: "step 2 of 3" in serve.output, what="the change")
        reviewer = tmp_path / "agents" / "reviewer"
        reviewer.mkdir(parents=True)
        publish(reviewer, "reviewing PR 7")
        await eventually(lambda: "reviewing PR 7" in serve.output, what="a late workdir")
        set_status(builder, "inactive")
        await eventually(
            lambda: "stopped" in serve.output.split("step 2 of 3")[-1], what="the stopped note"
        )
        assert serve.terminate() == 0
    assert "Traceback" not in serve.logs


async def test_a_restart_prints_every_card_again_each_in_its_own_panel(tmp_path: Path) -> None:
    """The console's panel ids restarted at 1 while the last run's ids stayed stored: after a
    restart a changed card took the id another agent had stored ("message 2 is gone"), two
    routes shared one panel, and an unchanged card was not printed at all."""
    config = write_config(tmp_path)
    builder, reviewer = tmp_path / "agents" / "builder", tmp_path / "agents" / "reviewer"
    for workdir, body in ((builder, "building the kernel"), (reviewer, "reviewing PR 7")):
        workdir.mkdir(parents=True)
        publish(workdir, body)
    with ServeProcess(config) as first:
        await eventually(
            lambda: "building the kernel" in first.output and "reviewing PR 7" in first.output,
            what="both cards",
        )
        assert first.terminate() == 0
    publish(reviewer, "reviewing PR 8")  # changed while stopped; the builder's card is not
    with ServeProcess(config) as second:
        await eventually(
            lambda: "building the kernel" in second.output and "reviewing PR 8" in second.output,
            what="both cards after the restart",
        )
        await eventually(lambda: len(set(_console_ids(tmp_path))) == 2, what="two ids")
        assert second.terminate() == 0
    assert "is gone" not in second.logs


def _console_ids(tmp_path: Path) -> list[str]:
    """The message id each console route has stored."""
    store = SqliteStore(tmp_path / ".taskcard" / STATE_FILE, readonly=True)
    try:
        return [r.message_id or "" for r in store.residents() if r.route.startswith("console:")]
    finally:
        store.close()


def test_invalid_config_names_the_key_and_exits_2(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        '[telegram]\ntoken_env = 5\n[[telegram.routes]]\nchat_id = "x"\nagents = ["nobody"]\n',
    )
    result = run_cli("serve", "--config", str(config))
    assert result.returncode == 2
    assert "telegram.token_env" in result.stderr
    assert "telegram.routes[0].chat_id" in result.stderr


def test_missing_token_variable_is_named(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        '[telegram]\ntoken_env = "TC_TEST_NO_SUCH_TOKEN"\n'
        '[[telegram.routes]]\nchat_id = 5\nagents = ["*"]\n',
    )
    result = run_cli("serve", "--config", str(config))
    assert result.returncode == 2
    assert "TC_TEST_NO_SUCH_TOKEN" in result.stderr


async def test_a_second_service_on_the_same_state_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with ServeProcess(config) as first:
        await eventually(lambda: "serving 2 agents" in first.logs, what="first service")
        second = run_cli("serve", "--config", str(config))
        assert second.returncode == 3
        assert "already uses the state directory" in second.stderr
        assert first.proc is not None and first.proc.poll() is None
        assert first.terminate() == 0


def test_embedded_demo_runs_and_ends_cleanly() -> None:
    result = run_cli("demo", "--duration", "6")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Ctrl-C to stop" in out and "2 agents: tester, migrator" in out
    # Two different kinds of work, each with its own card and tools.
    assert "Run the 2.4 test suite" in out and "Migrate orders to the v3 schema" in out
    assert "pytest" in out and "pg_dump orders" in out
    assert "**" not in out  # the cards' Markdown is rendered, not printed as source
    # A clean stop says so last: the cards just stopped, which looked like a hang.
    assert out.rstrip().splitlines()[-1] == (
        "taskcard demo: stopped; its temporary folder is removed"
    ), out[-500:]


def test_a_demo_kept_in_a_folder_says_where_when_it_stops(tmp_path: Path) -> None:
    result = run_cli("demo", "--duration", "3", "--dir", str(tmp_path / "fleet"))
    assert result.returncode == 0, result.stderr
    last = result.stdout.rstrip().splitlines()[-1]
    assert last == f"taskcard demo: stopped; its fleet stays in {tmp_path / 'fleet'}", last
    assert (tmp_path / "fleet" / "agents" / "tester").is_dir()


@pytest.mark.parametrize("command", [["serve"], ["demo"]], ids=["serve", "demo"])
async def test_a_hangup_stops_the_demo_and_takes_its_folder_away(
    tmp_path: Path, command: list[str]
) -> None:
    """Closing the terminal that runs `make run` (`taskcard serve` on the embedded defaults)
    sends the demo a SIGHUP: `serve` ignored it (a SIGHUP only reloads a file, and the demo
    has none) and ran on in the background for good, drawing cards for nobody;
    `taskcard demo` was killed by it and left its temporary folder behind. Both stop as on
    Ctrl-C: exit 0, the demo's folder removed."""
    output = tmp_path / "terminal.txt"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with output.open("w") as terminal:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "taskcard.bridge.cli",
            *command,
            cwd=ROOT,
            env={**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"},
            stdout=terminal,
            stderr=asyncio.subprocess.PIPE,
        )
    try:
        await eventually(
            lambda: "Run the 2.4 test suite" in output.read_text(),
            timeout_s=120,
            what="the demo's cards",
        )
        assert [p.name for p in tmp.iterdir() if p.name.startswith("taskcard-demo-")]
        proc.send_signal(signal.SIGHUP)
        _, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stderr
    assert b"Traceback" not in stderr
    assert list(tmp.iterdir()) == []
    assert (
        output.read_text()
        .rstrip()
        .endswith("taskcard demo: stopped; its temporary folder is removed")
    )


@pytest.mark.parametrize("duration", ["0", "-1", "nan", "inf"])
def test_a_demo_duration_that_is_no_time_is_a_usage_error(duration: str) -> None:
    """`--duration -1` or `nan` used to start the demo and stop it at once with exit 0, as
    if it had run; it is refused naming the option and the range."""
    result = run_cli("demo", "--duration", duration)
    assert result.returncode == 2
    assert "--duration" in result.stderr and "out of range" in result.stderr
    assert "Ctrl-C to stop" not in result.stdout


@pytest.mark.parametrize("planted", ["dir", "agents"])
def test_a_demo_folder_that_cannot_hold_the_fleet_is_one_line_and_exit_2(
    tmp_path: Path, planted: str
) -> None:
    """`taskcard demo --dir FILE` (or a folder whose `agents` is a file) ended in a traceback
    from mkdir."""
    folder = tmp_path / "fleet"
    if planted == "dir":
        folder.write_text("not a folder\n")
    else:
        folder.mkdir()
        (folder / "agents").write_text("not a folder\n")
    result = run_cli("demo", "--dir", str(folder), "--duration", "5")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--dir {folder}" in lines[0], result.stderr
    assert "Ctrl-C to stop" not in result.stdout


THERE = "cannot keep the demo fleet there:"


@pytest.mark.parametrize("kind", ["named pipe", "file on its path", "file further up"])
def test_a_demo_folder_that_is_no_folder_is_said_as_what_it_is(tmp_path: Path, kind: str) -> None:
    """`demo --dir FIFO` was "it is a file", and `--dir FILE/x` "Not a directory (FILE/x/
    agents)", naming a folder below the file that nobody typed; each says what is in the
    way. One line, exit 2, nothing made."""
    (tmp_path / "notes.txt").write_text("mine\n")
    os.mkfifo(tmp_path / "pipe")
    folder, says = {
        "named pipe": (tmp_path / "pipe", "it is a named pipe, not a folder;"),
        "file on its path": (tmp_path / "notes.txt" / "fleet", "on its path is a file,"),
        "file further up": (tmp_path / "notes.txt" / "a" / "fleet", "on its path is a file,"),
    }[kind]
    if kind != "named pipe":
        says = f"{tmp_path / 'notes.txt'} {says} not a folder;"
    result = run_cli("demo", "--dir", str(folder), "--duration", "5")
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(f"taskcard demo: --dir {folder}: {THERE} {says}"), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "pipe"]


@pytest.mark.parametrize("kind", ["dangling link", "loop", "folder link to nowhere"])
def test_a_demo_folder_behind_a_broken_link_is_refused_naming_the_link(
    tmp_path: Path, kind: str
) -> None:
    """`taskcard demo --dir` naming a link in a loop ended in a traceback (`resolve`), and a
    link that leads nowhere was followed: the fleet was made wherever it pointed. Each is one
    line naming the link, exit 2, nothing made."""
    gone = tmp_path / "gone"
    folder = tmp_path / "fleet"
    if kind == "dangling link":
        folder.symlink_to(gone)
        says = (
            f"--dir {folder}: {THERE} is a symbolic link that leads nowhere (to {gone}, which"
            " does not exist);"
        )
    elif kind == "loop":
        folder.symlink_to("other")
        (tmp_path / "other").symlink_to("fleet")
        says = f"--dir {folder}: {THERE} goes round a loop of symbolic links;"
    else:
        (tmp_path / "up").symlink_to(gone)
        folder = tmp_path / "up" / "fleet"
        says = (
            f"--dir {folder}: {THERE} the symbolic link {tmp_path / 'up'} on its path leads"
            f" nowhere (to {gone}, which does not exist);"
        )
    result = run_cli("demo", "--dir", str(folder), "--duration", "5")
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(f"taskcard demo: {says}"), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not gone.exists()


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (" ", "argument --dir: is empty; give the folder to keep the demo fleet in, or leave"),
        ("~no-such-user-here/d", "argument --dir: ~no-such-user-here/d cannot be expanded"),
    ],
    ids=["blank", "unknown-user"],
)
def test_a_demo_folder_named_by_nothing_usable_is_a_usage_error(
    tmp_path: Path, given: str, says: str
) -> None:
    """A blank `--dir` (a script's `--dir "$DIR"` with spaces) made a folder of spaces in the
    current folder, and `~user` of no known user a folder named so. Usage errors now."""
    result = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "demo", "--dir", given, "--duration", "5"],
        cwd=tmp_path,  # where a folder of spaces was made
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(f"taskcard demo: {says}"), result.stderr
    assert os.listdir(tmp_path) == []


async def test_console_has_a_header_renders_markdown_and_shows_notices(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    builder = tmp_path / "agents" / "builder"
    builder.mkdir(parents=True)
    with ServeProcess(config) as serve:
        await eventually(lambda: "Ctrl-C to stop" in serve.output, what="the header")
        assert "2 agents: builder, reviewer" in serve.output
        assert "console: builder, reviewer" in serve.output
        publish(builder, "# Release\n\n- **compile** done\n- `tests` running")
        await eventually(lambda: "compile done" in serve.output, what="the rendered card")
        assert "**compile**" not in serve.output and "`tests`" not in serve.output
        notify(builder, "n1", "error", code="renderer_timeout")
        await eventually(lambda: "task card error" in serve.output, what="the notice")
        assert serve.terminate() == 0


async def test_a_cards_escape_sequences_do_not_reach_the_console(tmp_path: Path) -> None:
    """The console channel prints the card body to the operator's terminal: an escape
    sequence in it (clear the screen, set the title, write the clipboard with OSC 52) acted
    on that terminal. Controls in a body are taken out there, as in every chat."""
    config = write_config(tmp_path)
    builder = tmp_path / "agents" / "builder"
    builder.mkdir(parents=True)
    with ServeProcess(config) as serve:
        await eventually(lambda: "serving 2 agents" in serve.logs, what="service start")
        publish(
            builder,
            "**compile** hostile-marker\x1b[2J\x1b]52;c;ZWNobyBoaQ==\x07\r\nnext line\u009b31m",
        )
        await eventually(lambda: "hostile-marker" in serve.output, what="the card")
        assert serve.terminate() == 0
    shown = serve.output
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown, repr(shown)
    assert "hostile-marker[2J]52;c;ZWNobyBoaQ==" in shown and "next line31m" in shown


async def test_one_agent_is_counted_in_the_singular_in_the_header_and_the_start_line(
    tmp_path: Path,
) -> None:
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = ".taskcard"\n[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
    )
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    with ServeProcess(config) as serve:
        await eventually(lambda: "Ctrl-C to stop" in serve.output, what="the header")
        await eventually(lambda: "serving 1 agent on 1 route" in serve.logs, what="the start")
        assert "1 agent: builder" in serve.output, serve.output
        assert await serve.aterminate() == 0
    shown = serve.logs + serve.output
    assert "1 agents" not in shown and "1 routes" not in shown
