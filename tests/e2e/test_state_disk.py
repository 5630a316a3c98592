"""The state disk fails: a full disk at run time, and unusable state files at start.

The full disk is real: the state directory sits on a small tmpfs mounted for the test (root
only; skipped elsewhere) and a filler file takes the rest of it. Unusable files at start are
made the way they happen: garbage bytes, an empty file, a truncated database, another
program's database, a directory in the file's place, a read-only mount.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import SqliteStore
from tests.e2e.harness import ROOT, ServeProcess, eventually, publish, run_cli
from tests.e2e.test_serve_telegram import GROUP, agent_dir, setup, shown
from tests.fakes.telegram_api import FakeTelegram


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


def _umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / ".taskcard"
    if not _mount_tmpfs(where, "8m"):
        pytest.skip("needs root and tmpfs mounts to fill a real disk")
    try:
        yield where
    finally:
        _umount(where)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk` with one file; returns it (delete it to free space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 4096, 512, 1):  # down to the last byte
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError:
                    break
    finally:
        os.close(fd)
    return filler


def status_text(config: Path) -> str:
    result = run_cli("status", "--config", str(config))
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_a_full_state_disk_keeps_commands_working_and_loses_nothing(
    tmp_path: Path, fake: FakeTelegram, small_disk: Path
) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "card before the disk filled")
        await eventually(lambda: any("before the disk" in t for t in shown(fake, GROUP)))
        resident = fake.bot_messages(GROUP)[0].message_id
        filler = fill(small_disk)
        fake.inject_command(GROUP, "/taskcard 5")
        # Read and taken; its answer waits while its `unsure` mark cannot be written (on
        # Telegram an answer goes out at most once), unless SQLite finds room in its file.
        await eventually(
            lambda: (
                "did not take the reply's send" in serve.logs
                or any("5 activity rows" in t for t in shown(fake, GROUP))
            ),
            what="the answer held or sent",
        )
        await eventually(
            lambda: "STATE WRITES FAILING" in status_text(serve.config),
            what="the fault in taskcard status",
        )
        # The poller is still alive: a later command is read and answered too (once its
        # mark is written: SQLite may find room in its own file before the disk frees).
        fake.inject_command(GROUP, "/taskcard 7")
        filler.unlink()
        await eventually(
            lambda: "STATE WRITES FAILING" not in status_text(serve.config),
            timeout_s=90,
            what="the fault to clear once space returned",
        )
        await eventually(
            lambda: any("7 activity rows" in t for t in shown(fake, GROUP)),
            timeout_s=90,
            what="the answer once space returned",
        )
        fake.inject_command(GROUP, "/taskcard 2")
        await eventually(lambda: any("2 activity rows" in t for t in shown(fake, GROUP)))
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs
    db = sqlite3.connect(small_disk / "state.sqlite3")
    try:
        rows = db.execute("SELECT activity_rows FROM prefs").fetchall()
        (message_id,) = db.execute("SELECT message_id FROM residents").fetchone()
    finally:
        db.close()
    assert rows == [(2,)]
    assert message_id == str(resident), "the resident id committed before the fault is kept"
    assert len(fake.bot_messages(GROUP)) >= 1
    assert [m.message_id for m in fake.bot_messages(GROUP) if "card before" in m.text] == [resident]


def _console_config(tmp_path: Path) -> Path:
    (tmp_path / "agents" / "a").mkdir(parents=True, exist_ok=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = "state"\n[[agents]]\nid = "a"\nworkdir = "agents/a"\n'
        "[console]\nenabled = true\n"
    )
    return config


def _real_database(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE residents (route TEXT PRIMARY KEY, message_id TEXT)")
    for n in range(400):
        db.execute("INSERT INTO residents VALUES (?, ?)", (f"route-{n}" * 20, str(n)))
    db.commit()
    db.close()


def _garbage(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(8192))


def _empty(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def _truncated(path: Path) -> None:
    _real_database(path)
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 3)


def _foreign(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY)")
    db.commit()
    db.close()


def _directory(path: Path) -> None:
    path.mkdir(parents=True)


def _header_only(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"SQLite format 3\0" + b"\xff" * 84)


def _run(
    config: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """`taskcard ARGS --config FILE`; a service that starts anyway is stopped and fails."""
    command = [sys.executable, "-m", "taskcard.bridge.cli", *args, "--config", str(config)]
    environment = {**os.environ, **(env or {})}
    try:
        return subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=environment,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(args)}` started on an unusable state file instead of stopping")


@pytest.mark.parametrize(
    "spoil", [_garbage, _empty, _truncated, _foreign, _directory, _header_only]
)
def test_an_unusable_state_file_stops_serve_and_status_with_one_line(
    tmp_path: Path, spoil: object
) -> None:
    config = _console_config(tmp_path)
    state_file = tmp_path / "state" / "state.sqlite3"
    assert callable(spoil)
    spoil(state_file)
    before = state_file.read_bytes() if state_file.is_file() else None
    for args in (("serve",), ("serve", "--check"), ("status",)):
        result = _run(config, *args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (args, result.stderr)
        assert len(lines) == 1 and str(state_file) in lines[0], (args, result.stderr)
        assert "Traceback" not in result.stderr
    if before is not None:
        assert state_file.read_bytes() == before, "the damaged file is left for the operator"


@pytest.mark.parametrize("entry", ["serve.lock", "state.health"])
def test_a_folder_in_place_of_a_state_entry_stops_serve_naming_it(
    tmp_path: Path, entry: str
) -> None:
    """A folder where the lock file or the health file belongs stops `serve` with one line
    naming that entry, not only the state directory (which is a folder, as it should be)."""
    config = _console_config(tmp_path)
    (tmp_path / "state" / entry).mkdir(parents=True)
    result = _run(config, "serve")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "state" / entry) in lines[0], result.stderr


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_a_folder_in_place_of_sqlite_companion_is_named_not_the_database(
    tmp_path: Path, suffix: str
) -> None:
    """A folder where SQLite keeps its write-ahead log or shared memory made the good
    database read as damaged, with the advice to move it away (a second resident message
    in every chat); the line names the folder and the database is left as it was."""
    config = _console_config(tmp_path)
    state_file = tmp_path / "state" / "state.sqlite3"
    _real_database(state_file)
    before = state_file.read_bytes()
    companion = state_file.with_name(state_file.name + suffix)
    companion.mkdir()
    for args in (("serve",), ("serve", "--check"), ("status",)):
        result = _run(config, *args)
        assert result.returncode == 2, (args, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"taskcard: {companion} is not a regular file"), line
        assert "damaged" not in line and "start afresh" not in line
    assert state_file.read_bytes() == before


def _state_of(path: Path, *statements: str) -> None:
    """A state file as this version writes it, then changed by `statements` (SQL)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    SqliteStore.in_dir(path.parent).close()
    db = sqlite3.connect(path)
    for statement in statements:
        db.execute(statement)
    db.commit()
    db.close()


# States a newer version (or a hand edit) leaves: the tables are there, but not as read here;
# each with the commands that read what changed.
_STATUS = [("status",), ("status", "--json")]
_CHATS = [("chats",), ("chats", "--json")]
_UNFIT_STATES = {
    "a column dropped": (
        [
            "INSERT INTO residents (route, message_id) VALUES ('console:console::a', '7')",
            "ALTER TABLE residents DROP COLUMN fingerprint",
            "PRAGMA user_version = 9",
        ],
        _STATUS,
    ),
    "a table renamed": (["ALTER TABLE pauses RENAME TO pauses_v9"], _STATUS),
    # `chats` said "No command seen yet" on these: a newer layout read as an empty table.
    "the seen chats of another layout": (
        [
            "DROP TABLE seen_chats",
            "CREATE TABLE seen_chats (chat TEXT PRIMARY KEY, seen_at REAL, meta TEXT)",
            "INSERT INTO seen_chats VALUES ('telegram:-100', 1700000000, '{}')",
            "PRAGMA user_version = 9",
        ],
        _CHATS,
    ),
    "the seen chats' time renamed": (
        ["ALTER TABLE seen_chats RENAME COLUMN last_seen TO last_seen_ms"],
        _CHATS,
    ),
}


@pytest.mark.parametrize("change", list(_UNFIT_STATES))
def test_a_state_status_and_chats_cannot_read_is_one_line_naming_the_way_out(
    tmp_path: Path, change: str
) -> None:
    """A SQLite state with taskcard's tables that this version cannot read (a newer
    version's, one edited by hand) made `taskcard status` and `taskcard chats` end in a
    traceback (or a bare "no such table"); each now prints one line naming the file and what
    to do, exits 2, and leaves the file as it was."""
    config = _console_config(tmp_path)
    state_file = tmp_path / "state" / "state.sqlite3"
    statements, commands = _UNFIT_STATES[change]
    _state_of(state_file, *statements)
    before = state_file.read_bytes()
    for args in commands:
        result = _run(config, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"taskcard: {state_file} could not be read ("), (args, line)
        assert "version" in line and "restore it from a backup" in line, line
        assert result.stdout == "", (args, result.stdout)
    assert state_file.read_bytes() == before


@pytest.mark.parametrize("since", ["1e308", "-1e308", "NaN", "Infinity"])
def test_a_health_file_with_a_time_no_date_shows_is_read_as_no_fault(
    tmp_path: Path, since: str
) -> None:
    """The health file `serve` writes beside the state (the write fault it is in) read with a
    time no date can show (a damaged or hand-edited file) ended `taskcard status` in a
    traceback; it is read as no recorded fault, as other unreadable health files are."""
    config = _console_config(tmp_path)
    state_file = tmp_path / "state" / "state.sqlite3"
    _state_of(state_file)
    (state_file.parent / "state.health").write_text(
        f'{{"failing_since": {since}, "reason": "disk full", "waiting_writes": 3}}'
    )
    for args in (("status",), ("status", "--json")):
        result = _run(config, *args)
        assert result.returncode == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr and "disk full" not in result.stdout
        assert "console:console::a" in result.stdout


def test_a_state_file_locked_by_another_process_is_not_called_damaged(tmp_path: Path) -> None:
    """A healthy state file another process held locked (a sqlite3 shell in a transaction
    on a file in rollback-journal mode) was called damaged by `taskcard status`, `taskcard
    chats` and `serve --check`, with the advice to move it away (a second resident message in
    every chat); each now says it is locked and what to end."""
    config = _console_config(tmp_path)
    state_file = tmp_path / "state" / "state.sqlite3"
    _state_of(state_file)
    holder = sqlite3.connect(state_file, isolation_level=None)
    try:
        holder.execute("PRAGMA journal_mode = DELETE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("INSERT INTO pauses VALUES ('console:bot', 1)")
        for args in (("status",), ("chats", "--json"), ("serve", "--check")):
            result = _run(config, *args)
            assert result.returncode == 2, (args, result.stderr)
            (line,) = result.stderr.strip().splitlines()
            assert str(state_file) in line and "locked" in line, (args, line)
            assert "end that transaction or stop that process" in line, line
            assert "damaged" not in line and "start afresh" not in line, line
    finally:
        holder.close()


def test_a_read_only_state_disk_stops_serve_with_one_line(tmp_path: Path) -> None:
    config = _console_config(tmp_path)
    state_dir = tmp_path / "state"
    if not _mount_tmpfs(state_dir, "4m"):
        pytest.skip("needs root and tmpfs mounts to make a read-only disk")
    try:
        # A healthy state file from an earlier run, then the disk goes read-only.
        first = subprocess.Popen(
            [sys.executable, "-m", "taskcard.bridge.cli", "serve", "--config", str(config)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not (state_dir / "state.sqlite3").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        first.terminate()
        assert first.wait(timeout=60) == 0
        remount = subprocess.run(
            ["mount", "-o", "remount,ro", str(state_dir)], capture_output=True, check=False
        )
        if remount.returncode != 0:
            pytest.skip("cannot remount read-only here")
        for args in (("serve",), ("serve", "--check")):
            result = _run(config, *args)
            assert result.returncode == 2, result.stderr
            problems = [line for line in result.stderr.splitlines() if str(state_dir) in line]
            assert len(problems) == 1 and "read-only" in problems[0], result.stderr
            assert "Traceback" not in result.stderr
    finally:
        _umount(state_dir)


@pytest.mark.parametrize("name", ["state#1", "state?x=1", "state%41", "a%2Fb"])
async def test_a_state_dir_with_uri_characters_survives_restarts_and_status(
    tmp_path: Path, fake: FakeTelegram, name: str
) -> None:
    """`#`, `?` and `%41` in the state directory are path characters, never URI syntax."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    text = serve.config.read_text()
    assert 'state_dir = ".taskcard"' in text
    serve.config.write_text(text.replace('state_dir = ".taskcard"', f'state_dir = "{name}"'))
    check = _run(serve.config, "serve", "--check", env={"TC_TEST_TOKEN": fake.token})
    assert check.returncode == 0, check.stderr
    for version in ("v1", "v2"):  # the second start reopens the file the first one created
        with serve:
            publish(agent_dir(tmp_path, "builder"), f"card {version}")
            await eventually(lambda v=version: any(f"card {v}" in t for t in shown(fake, GROUP)),
                             what=f"card {version}")  # fmt: skip
            assert await serve.aterminate() == 0, serve.logs
        serve = ServeProcess(serve.config, env=serve.env)
    assert len(fake.bot_messages(GROUP)) == 1, "the restart edits the resident it remembered"
    status = _run(serve.config, "status")
    assert status.returncode == 0, status.stderr
    assert str(fake.bot_messages(GROUP)[0].message_id) in status.stdout
    strays = sorted(os.listdir(tmp_path))
    assert strays == sorted(["agents", name, "taskcard.toml"]), f"stray files: {strays}"


@pytest.mark.parametrize("what", ["file", "folder"])
async def test_a_state_deleted_while_serving_is_written_again(
    tmp_path: Path, fake: FakeTelegram, what: str
) -> None:
    """SQLite writes on to a state file deleted under it without a word, so everything went
    at stop and the restart posted a second resident message; a deleted lock file let a
    second service start on the same state. Both are made again, each with one log line."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    state_dir = tmp_path / ".taskcard"
    state_file = state_dir / "state.sqlite3"
    with serve:
        publish(workdir, "before the deletion")
        await eventually(lambda: any("before the deletion" in t for t in shown(fake, GROUP)))
        await eventually(lambda: "resident message: 1" in status_text(serve.config), what="the id")
        if what == "folder":
            shutil.rmtree(state_dir)
        else:
            for entry in state_dir.iterdir():
                if entry.name.startswith(state_file.name):
                    entry.unlink()
        publish(workdir, "after the deletion")
        await eventually(lambda: any("after the deletion" in t for t in shown(fake, GROUP)))
        await eventually(
            lambda: f"the state file {state_file} was deleted" in serve.logs, what="the restore"
        )
        if what == "folder":
            await eventually(lambda: "serve.lock was deleted" in serve.logs, what="the lock")
            # The token given, so the lock (made again) is what refuses it; the wait included.
            second = _run(serve.config, "serve", env=serve.env, timeout_s=180)
            assert second.returncode == 3, second.stderr
        assert await serve.aterminate() == 0, serve.logs
    assert "Traceback" not in serve.logs
    publish(workdir, "after the restart")
    with ServeProcess(serve.config, env=serve.env) as again:
        await eventually(lambda: any("after the restart" in t for t in shown(fake, GROUP)))
        assert await again.aterminate() == 0, again.logs
    assert len(fake.bot_messages(GROUP)) == 1, "the restart edits the resident it remembered"


async def test_a_state_file_locked_by_another_process_is_named_and_waited_out(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """Another process holding the state file in a write transaction (a sqlite3 shell left
    in `BEGIN`): the writes wait, the log said to free space or fix the disk, and each retry
    held the service's loop for SQLite's whole 5 s busy timeout. The line names the lock and
    what to do; once it ends, what waited is saved and a restart edits the same message."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "before the lock")
        await eventually(lambda: any("before the lock" in t for t in shown(fake, GROUP)))
        await eventually(lambda: "resident message: 1" in status_text(serve.config), what="id")
        holder = sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3", isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            publish(workdir, "while locked")
            await eventually(lambda: any("while locked" in t for t in shown(fake, GROUP)))
            await eventually(lambda: "database is locked" in serve.logs, what="the failure")
            assert "another process holds the file locked" in serve.logs, serve.logs
            assert "free space" not in serve.logs, serve.logs
        finally:
            holder.close()  # the transaction ends with it
        await eventually(lambda: "work again" in serve.logs, what="the writes saved")
        assert await serve.aterminate() == 0, serve.logs
    # The count and its noun agree: "1 waiting write", "2 waiting writes".
    agreeing = r"work again; (1 waiting write|(?!1 )[0-9]+ waiting writes) saved"
    assert re.search(agreeing, serve.logs), serve.logs
    publish(workdir, "after the restart")
    with ServeProcess(serve.config, env=serve.env) as again:
        await eventually(lambda: any("after the restart" in t for t in shown(fake, GROUP)))
        assert await again.aterminate() == 0, again.logs
    assert len(fake.bot_messages(GROUP)) == 1


async def test_a_state_disk_unmounted_while_serving_is_not_copied_under_the_mount(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The state directory's own file system unmounted (lazily) while serving is not a
    deleted state file: a copy would land on the disk under the mount point and be hidden
    when the mount comes back. The line says to mount it again; nothing is written there."""
    state_dir = tmp_path / ".taskcard"
    if not _mount_tmpfs(state_dir, "8m"):
        pytest.skip("needs root and tmpfs mounts")
    try:
        serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
        workdir = agent_dir(tmp_path, "builder")
        with serve:
            publish(workdir, "before the unmount")
            await eventually(lambda: any("before the unmount" in t for t in shown(fake, GROUP)))
            _umount(state_dir)
            publish(workdir, "after the unmount")
            await eventually(lambda: any("after the unmount" in t for t in shown(fake, GROUP)))
            await eventually(lambda: "unmounted?" in serve.logs, what="the line")
            assert await serve.aterminate() == 0, serve.logs
        assert not (state_dir / "state.sqlite3").exists(), "no copy under the mount point"
        assert "Traceback" not in serve.logs
    finally:
        _umount(state_dir)


async def test_a_state_file_overwritten_in_place_while_serving_is_said_at_once(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """Another state copied over the state file (`cp`, which keeps the file's inode) while
    serving: the service went on without a word, mixing its writes with the copy, and only
    the next start showed the damage. It now says so within a second, in one error line."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    state_file = tmp_path / ".taskcard" / "state.sqlite3"
    other = tmp_path / "other" / "state.sqlite3"
    SqliteStore.in_dir(other.parent).close()
    with serve:
        publish(workdir, "before the copy")
        await eventually(lambda: any("before the copy" in t for t in shown(fake, GROUP)))
        inode = state_file.stat().st_ino
        shutil.copyfile(other, state_file)  # opens the file and writes over it
        assert state_file.stat().st_ino == inode
        overwritten = f"the state file {state_file} was overwritten in place"
        await eventually(lambda: overwritten in serve.logs, what="the error line")
        assert await serve.aterminate() == 0, serve.logs
    assert serve.logs.count(overwritten) == 1
    assert "Traceback" not in serve.logs


async def test_a_state_file_locked_at_start_is_waited_for_and_then_served(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A state file another process held locked at start (an old instance still exiting)
    stopped the start after SQLite's 5 s with exit 2, which the shipped unit does not
    restart. The start now waits for the lock, with one warning naming the file and what to
    do, and serves once it is released."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    state_file = tmp_path / ".taskcard" / "state.sqlite3"
    SqliteStore.in_dir(state_file.parent).close()
    holder = sqlite3.connect(state_file, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with serve:
            await eventually(
                lambda: "waiting up to" in serve.logs, timeout_s=60, what="the warning"
            )
            assert serve.proc is not None and serve.proc.poll() is None, serve.logs
            holder.execute("ROLLBACK")
            publish(agent_dir(tmp_path, "builder"), "served after the lock")
            await eventually(
                lambda: any("served after the lock" in t for t in shown(fake, GROUP)),
                timeout_s=90,
                what="the card once the lock is released",
            )
            assert await serve.aterminate() == 0, serve.logs
    finally:
        holder.close()
    [line] = [line for line in serve.logs.splitlines() if "waiting up to" in line]
    assert str(state_file) in line and "another process holds the state file locked" in line
    assert "end that transaction or stop that process" in line
    assert not any(line.startswith("taskcard:") for line in serve.logs.splitlines()), serve.logs


async def test_a_serve_lock_held_by_an_instance_still_stopping_is_waited_for(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The instance a restart replaces holds the serve lock until its store is closed: a
    start meanwhile stopped at once with exit 3, which the shipped unit does not restart.
    It now waits for the lock, with one warning naming the holder, and serves once it is
    released (a service that keeps it is still refused after the wait)."""
    import fcntl

    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    state_dir = tmp_path / ".taskcard"
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / "serve.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, b"424242", 0)  # as an instance still stopping holds it
        with serve:
            await eventually(
                lambda: "waiting up to" in serve.logs, timeout_s=60, what="the warning"
            )
            assert serve.proc is not None and serve.proc.poll() is None, serve.logs
            os.close(fd)
            fd = -1
            publish(agent_dir(tmp_path, "builder"), "served after the old instance")
            await eventually(
                lambda: any("served after the old instance" in t for t in shown(fake, GROUP)),
                timeout_s=90,
                what="the card once the lock is released",
            )
            assert await serve.aterminate() == 0, serve.logs
    finally:
        if fd >= 0:
            os.close(fd)
    [line] = [line for line in serve.logs.splitlines() if "waiting up to" in line]
    assert "pid 424242" in line and str(state_dir) in line, line
    assert not any(line.startswith("taskcard:") for line in serve.logs.splitlines()), serve.logs


@pytest.mark.parametrize("held", ["serve lock", "state file"])
async def test_a_stop_while_a_lock_is_waited_for_is_a_stop_not_an_error(
    tmp_path: Path, fake: FakeTelegram, held: str
) -> None:
    """A SIGTERM while the start waited for a lock ended it with exit 0, but printed the
    error a failed start prints ("stop it first", "then start again") before the stop."""
    import fcntl

    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    state_dir = tmp_path / ".taskcard"
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = -1
    holder = None
    if held == "serve lock":
        fd = os.open(state_dir / "serve.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, b"424242", 0)
    else:
        SqliteStore.in_dir(state_dir).close()
        holder = sqlite3.connect(state_dir / "state.sqlite3", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
    try:
        with serve:
            await eventually(
                lambda: "waiting up to" in serve.logs, timeout_s=60, what="the warning"
            )
            assert await serve.aterminate() == 0, serve.logs
    finally:
        if fd >= 0:
            os.close(fd)
        if holder is not None:
            holder.close()
    lines = serve.logs.splitlines()
    assert not any(line.startswith("taskcard:") for line in lines), serve.logs
    assert any("stopped" in line for line in lines), serve.logs


def test_the_store_counts_its_waiting_writes_in_words_that_agree(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The lines said "1 waiting writes saved" and "1 state writes could not be saved". One
    write made while another process holds the file locked, saved once it is free; then one
    made while it is held again, still waiting when the store closes."""
    caplog.set_level(logging.INFO, logger="taskcard.bridge.store.sqlite")
    store = SqliteStore.in_dir(tmp_path)
    holder = sqlite3.connect(tmp_path / "state.sqlite3", isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        store.set_cursor("one", "1")
        holder.execute("ROLLBACK")
        assert store.retry_pending(force=True)
        holder.execute("BEGIN EXCLUSIVE")
        store.set_cursor("two", "2")
        store.close()
    finally:
        holder.close()
    assert "work again; 1 waiting write saved" in caplog.text
    assert "1 state write could not be saved to " in caplog.text
    again = SqliteStore.in_dir(tmp_path)
    try:
        assert (again.get_cursor("one"), again.get_cursor("two")) == ("1", None)
    finally:
        again.close()
