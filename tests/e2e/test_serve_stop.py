"""Stopping `taskcard serve` whatever it is doing: SIGTERM (systemd's stop) and SIGINT
(Ctrl-C) give a clean stop and exit code 0 in every step of the start and of the wind-down,
not only once the service loop runs.

Each step is held open from outside, the way a slow machine or network holds it: a
configuration read from a named pipe whose writer has not written yet, a state file another
process keeps locked, a Redis that does not answer yet, a Bot API that answers `getMe` late.
The signal is sent while the service is in that step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import STATE_FILE, SqliteStore
from tests.e2e.harness import ServeProcess, eventually, publish, telegram_config
from tests.e2e.test_cluster import cluster_lines
from tests.fakes.telegram_api import FakeLimits, FakeTelegram, Window
from tests.redis_server import RedisServer

GROUP = -1001234567890
STOP_SIGNALS = [signal.SIGTERM, signal.SIGINT]


def _locked(state_dir: Path, pid: int) -> bool:
    """Whether the service holds its serve lock (the lock file names its pid): it runs its
    own code, past the imports and the configuration."""
    lock = state_dir / "serve.lock"
    return lock.exists() and lock.read_text() == str(pid)


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
async def test_a_stop_while_the_configuration_is_read_is_clean(
    tmp_path: Path, telegram: FakeTelegram, signum: signal.Signals
) -> None:
    """The configuration comes from a named pipe whose writer is slow: the service waits in
    the read. A stop then used to end it by the signal's default action (status -15, or a
    KeyboardInterrupt traceback and 130 for Ctrl-C)."""
    written = telegram_config(tmp_path, telegram.base_url, GROUP)
    fifo = tmp_path / "taskcard.fifo"
    os.mkfifo(fifo)
    with ServeProcess(fifo, env={"TC_TEST_TOKEN": telegram.token}) as serve:
        assert serve.proc is not None
        # Opening the write end returns once the service opened the read end; nothing is
        # written, so the service is inside its read of the configuration.
        pipe = await asyncio.get_running_loop().run_in_executor(None, fifo.open, "w")
        try:
            serve.proc.send_signal(signum)
            # Its own exit, not aterminate's SIGTERM: a second signal once the stop is under
            # way ends the process at once (`early_stop.force`), by design.
            await eventually(lambda: serve.proc is not None and serve.proc.poll() is not None)
            assert await serve.aterminate() == 0, serve.logs
        finally:
            pipe.close()
    assert "stopped (" + signum.name + ") before the service started" in serve.logs
    assert "Traceback" not in serve.logs
    assert not written.with_name(".taskcard").joinpath(STATE_FILE).exists()


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
async def test_a_stop_while_the_state_file_is_opened_is_clean(
    tmp_path: Path, telegram: FakeTelegram, signum: signal.Signals
) -> None:
    """Another process holds the state file's lock (a backup, `sqlite3` left open): the
    service waits in the open. The stop lets the open finish, then stops before serving: the
    store is closed, the lock released, nothing was sent."""
    config = telegram_config(tmp_path, telegram.base_url, GROUP)
    state_dir = tmp_path / ".taskcard"
    SqliteStore.in_dir(state_dir).close()
    holder = sqlite3.connect(state_dir / STATE_FILE, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token}) as serve:
            assert serve.proc is not None
            pid = serve.proc.pid
            await eventually(lambda: _locked(state_dir, pid), what="the service's lock")
            serve.proc.send_signal(signum)
            holder.execute("ROLLBACK")
            await eventually(lambda: serve.proc is not None and serve.proc.poll() is not None)
            assert await serve.aterminate() == 0, serve.logs
    finally:
        holder.close()
    assert f"stopped ({signum.name} during the start, before serving)" in serve.logs
    assert telegram.count("getMe") == 0
    assert telegram.bot_messages(GROUP) == []


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
async def test_a_stop_during_a_start_step_that_then_fails_exits_as_a_stop(
    tmp_path: Path, telegram: FakeTelegram, signum: signal.Signals
) -> None:
    """The state file stays locked by another process, so its open fails after the stop
    came: the stop's exit (0) and its line, not exit 2 (a configuration error, which the
    shipped unit never restarts), and no error telling the operator to start again."""
    config = telegram_config(tmp_path, telegram.base_url, GROUP)
    state_dir = tmp_path / ".taskcard"
    SqliteStore.in_dir(state_dir).close()
    holder = sqlite3.connect(state_dir / STATE_FILE, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token}) as serve:
            assert serve.proc is not None
            pid = serve.proc.pid
            await eventually(lambda: _locked(state_dir, pid), what="the service's lock")
            serve.proc.send_signal(signum)
            await eventually(lambda: serve.proc is not None and serve.proc.poll() is not None)
            assert await serve.aterminate() == 0, serve.logs
    finally:
        holder.close()
    assert f"stopped ({signum.name} during the start, before serving)" in serve.logs
    assert "Traceback" not in serve.logs
    assert telegram.count("getMe") == 0
    # A stop is said as a stop: no start error ("then start again"), nor a word of the
    # disk (a lock once read as a full disk said to free space).
    assert not any(line.startswith("taskcard:") for line in serve.logs.splitlines()), serve.logs
    assert "free space" not in serve.logs, serve.logs


@pytest.fixture
def frozen_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGCONT)
        server.stop()


async def test_a_stop_while_the_cluster_is_joined_is_clean(
    tmp_path: Path, telegram: FakeTelegram, frozen_redis: RedisServer, prefix: str
) -> None:
    """A Redis that answers late (frozen here, then let go): the instance waits in its
    first call. The stop lets the call finish, then stops before serving, and its bot claim
    is given back (a restart right after is not taken for another bot's instance)."""
    config = telegram_config(
        tmp_path, telegram.base_url, GROUP, extra=cluster_lines("late", prefix)
    )
    assert frozen_redis.proc is not None
    frozen_redis.proc.send_signal(signal.SIGSTOP)
    env = {"TC_TEST_TOKEN": telegram.token, "TC_REDIS_URL": frozen_redis.url}
    with ServeProcess(config, env=env) as serve:
        assert serve.proc is not None
        pid = serve.proc.pid
        await eventually(lambda: _locked(tmp_path / ".taskcard", pid), what="the lock")
        serve.proc.send_signal(signal.SIGTERM)
        frozen_redis.proc.send_signal(signal.SIGCONT)
        assert await serve.aterminate() == 0, serve.logs
    assert "stopped (SIGTERM during the start, before serving)" in serve.logs
    assert telegram.count("getMe") == 0


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
async def test_a_stop_while_the_bot_logs_in_is_clean(
    tmp_path: Path, telegram: FakeTelegram, signum: signal.Signals
) -> None:
    """`getMe` answered late: the stop does not wait for it."""
    config = telegram_config(tmp_path, telegram.base_url, GROUP)
    telegram.delay_answers("getMe", 60.0)
    with ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token}) as serve:
        assert serve.proc is not None
        await eventually(lambda: telegram.count("getMe"), what="the log-in")
        serve.proc.send_signal(signum)
        assert await serve.aterminate(timeout_s=30.0) == 0, serve.logs
    assert "taskcard.bridge.run.service: stopped" in serve.logs


async def test_a_stop_while_a_commands_answer_waits_sends_it_after_the_restart(
    tmp_path: Path,
) -> None:
    """The group's window is full, so the answer to `/taskcard 3` waits in its queue; the
    command's update is confirmed meanwhile. A stop then lost the answer for good: the next
    start neither had it nor fetched the command again. It is kept in the state until sent,
    and the next start sends it, once."""
    from tests.e2e.test_serve_telegram import setup, shown

    limits = FakeLimits(private_chat=Window(1, 1.0), group_chat=Window(2, 20.0), bot=Window(30, 1))
    group_limit = "[telegram.limits]\ngroup_chat = { max_calls = 2, period_s = 20.0 }"
    answer = "3 activity rows"
    async with FakeTelegram(limits=limits) as fake:
        serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])], limits=group_limit)
        workdir = tmp_path / "agents" / "builder"
        with serve:
            for body in ("v1", "v2"):  # a send and an edit: the window is full
                publish(workdir, body)
                await eventually(
                    lambda b=body: any(b in t for t in shown(fake, GROUP)), what=f"card {body}"
                )
            fake.inject_command(GROUP, "/taskcard 3")
            # A later poll's offset confirmed the command: the fake no longer holds it.
            await eventually(lambda: not fake.pending_updates, what="the command confirmed")
            assert not any(answer in t for t in shown(fake, GROUP)), "the answer still waits"
            assert await serve.aterminate() == 0, serve.logs
        restarted = ServeProcess(serve.config, env={"TC_TEST_TOKEN": fake.token})
        with restarted:
            await eventually(
                lambda: any(answer in t for t in shown(fake, GROUP)),
                timeout_s=90,
                what="the answer after the restart",
            )
            assert await restarted.aterminate() == 0, restarted.logs
        assert sum(answer in t for t in shown(fake, GROUP)) == 1
        assert fake.rate_limited == []


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
async def test_a_second_stop_signal_while_a_send_is_in_flight_changes_nothing(
    tmp_path: Path, telegram: FakeTelegram, signum: signal.Signals
) -> None:
    """Ctrl-C pressed again (or systemd's SIGTERM repeated) while the stop waits for a send
    in flight: the stop still waits for its answer, keeps the new message's id and exits 0,
    so the next start edits that message instead of posting another."""
    config = telegram_config(tmp_path, telegram.base_url, GROUP)
    workdir = tmp_path / "agents" / "builder"
    with ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token}) as serve:
        assert serve.proc is not None
        await eventually(lambda: telegram.waiting_pollers, what="the service polling")
        telegram.delay_answers("sendMessage", 3.0)  # posted at once, answered late
        publish(workdir, "before the stop")
        await eventually(lambda: telegram.bot_messages(GROUP), what="the card posted")
        serve.proc.send_signal(signum)
        serve.proc.send_signal(signum)
        assert await serve.aterminate() == 0, serve.logs
    assert "resident message 1 created" in serve.logs
    telegram.delay_answers("sendMessage", 0.0)
    publish(workdir, "after the restart")
    with ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token}) as again:
        await eventually(
            lambda: any("after the restart" in m.text for m in telegram.bot_messages(GROUP)),
            what="the card after the restart",
        )
        assert await again.aterminate() == 0, again.logs
    assert len(telegram.bot_messages(GROUP)) == 1


async def test_an_answer_kept_for_the_restart_that_was_edited_by_hand_holds_up_no_other(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """The answers a stop kept, one of them mangled by hand (its topic no id): the start
    leaves that one out with a warning and sends the other. It used to fail at every try
    with a traceback, at the head of the chat's queue, so the good answer never went out."""
    import json

    from tests.e2e.test_serve_telegram import setup, shown

    serve = setup(tmp_path, telegram, ["builder"], [(GROUP, ["builder"])])
    kept = {"channel": "telegram", "chat_id": str(GROUP), "thread_id": None, "text": "an answer"}
    kept |= {"payload": {"text": "an answer"}, "fingerprint": "f", "reply_to": None}
    state = SqliteStore.in_dir(tmp_path / ".taskcard")
    mangled = dict(kept, thread_id={"topic": 1}, text="mangled", payload={"text": "mangled"})
    state.set_cursor("replies:pending", json.dumps({"reply:a": mangled, "reply:b": kept}))
    state.close()
    with serve:
        await eventually(
            lambda: any("an answer" in t for t in shown(telegram, GROUP)), what="the good answer"
        )
        assert await serve.aterminate() == 0, serve.logs
    assert "Traceback" not in serve.logs
    assert "ignoring the unsent command reply reply:a" in serve.logs
    assert not any("mangled" in t for t in shown(telegram, GROUP))
