"""What an operator's tools see of a running `taskcard serve`: metrics, health, status, chats.

The service runs as a subprocess with a config file, against the fake Telegram Bot API in the
test's loop; everything is read the way an operator reads it: HTTP requests to the metrics
listener, `taskcard status` and `taskcard chats` on the command line, and systemd's readiness
datagrams on a real unix socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from taskcard.bridge.run.runner import BIND_RETRY_S
from taskcard.bridge.store.sqlite import STATE_FILE, SqliteStore
from tests.e2e.harness import (
    ServeProcess,
    eventually,
    notify,
    publish,
    run_cli,
    telegram_config,
)
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram
from tests.redis_server import free_port

T = TypeVar("T")
GROUP = -1001234567890
UNROUTED = -1009876543210
FEISHU_CHAT = "oc_ops_group"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def write_config(tmp_path: Path, api_base_url: str, metrics_port: int | None) -> Path:
    metrics = [] if metrics_port is None else ["[metrics]", f'listen = "127.0.0.1:{metrics_port}"']
    return telegram_config(tmp_path, api_base_url, GROUP, extra=metrics)


def sample(metrics_text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, or None when it is absent."""
    for line in metrics_text.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


async def until(
    probe: Callable[[], Awaitable[T | None]], *, what: str, timeout_s: float = 60.0
) -> T:
    """Await `probe` until it returns a value; fail with `what` after a generous timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def get(url: str) -> httpx.Response | None:
    """A GET that answers None while the listener is not up yet."""
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            return await client.get(url)
    except httpx.TransportError:
        return None


@pytest.mark.skipif(not socket.has_ipv6, reason="needs IPv6")
async def test_an_ipv6_listener_logs_a_url_that_can_be_pasted(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """`listen = "[::1]:9464"` logged http://::1:9464/metrics, which no client takes."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = int(probe.getsockname()[1])
    except OSError:
        pytest.skip("no IPv6 loopback here")
    metrics = ["[metrics]", f'listen = "[::1]:{port}"']
    config = telegram_config(tmp_path, fake.base_url, GROUP, extra=metrics)
    with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
        await eventually(lambda: "metrics and health on" in serve.logs, what="the listener")
        url = re.search(r"metrics and health on (\S+),", serve.logs)
        assert url is not None and url.group(1) == f"http://[::1]:{port}/metrics"
        answer = await until(
            lambda: get(url.group(1).replace("/metrics", "/healthz")), what="/healthz"
        )
        assert answer.status_code in (200, 503)
        assert await serve.aterminate() == 0


async def test_metrics_count_deliveries_and_healthz_is_ok(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = write_config(tmp_path, fake.base_url, port)
    with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
        await until(lambda: _get_ok(serve, base + "/healthz"), what="a healthy service")
        before = await until(lambda: get(base + "/metrics"), what="/metrics")
        assert before.headers["content-type"].startswith("text/plain")
        assert sample(before.text, "taskcard_requests_total", operation="send") is None
        assert sample(before.text, "taskcard_agents_watched") == 1.0
        assert sample(before.text, "taskcard_channel_ready", channel="telegram") == 1.0

        publish(tmp_path / "agents" / "builder", "**compile** 1/3")
        await eventually(lambda: fake.bot_messages(GROUP), what="the card in the chat")
        after = await until(
            lambda: _metrics_with(base, "taskcard_requests_total", operation="send"),
            what="the send counted",
        )
        labels = {"channel": "telegram", "operation": "send", "outcome": "ok"}
        assert sample(after, "taskcard_requests_total", **labels) == 1.0
        delivered = sample(after, "taskcard_last_delivery_timestamp_seconds", channel="telegram")
        assert delivered is not None and abs(delivered - time.time()) < 3600
        assert sample(after, "taskcard_agents_faulted") == 0.0
        assert sample(after, "taskcard_active_pauses") == 0.0
        assert fake.token not in after

        healthz = await until(lambda: get(base + "/healthz"), what="/healthz")
        assert healthz.status_code == 200
        assert healthz.json() == {"status": "ok", "ready_channels": ["telegram"]}
        assert await serve.aterminate() == 0
    assert await get(base + "/healthz") is None, "the listener closes with the service"


async def test_healthz_is_503_with_a_reason_while_no_channel_is_ready(tmp_path: Path) -> None:
    port = free_port()
    unreachable = f"http://127.0.0.1:{free_port()}"  # nothing listens: Telegram keeps retrying
    config = write_config(tmp_path, unreachable, port)
    with ServeProcess(config, env={"TC_TEST_TOKEN": "123:not-a-real-token"}) as serve:
        healthz = await until(lambda: get(f"http://127.0.0.1:{port}/healthz"), what="/healthz")
        assert healthz.status_code == 503
        assert healthz.json()["status"] == "unavailable"
        assert "no channel ready" in healthz.json()["reason"]
        assert "not-a-real-token" not in healthz.text
        assert await serve.aterminate() == 0


async def test_status_says_whether_a_service_runs_on_the_state_dir(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    config = write_config(tmp_path, fake.base_url, None)
    with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
        assert serve.proc is not None
        pid = serve.proc.pid
        # Once it polls for commands the state file is set up (a bare new file is not yet).
        await eventually(lambda: fake.waiting_pollers, what="the service polling")
        text = await until(
            lambda: _status_containing(config, f"service: running (pid {pid})"),
            what="status to see the running service",
        )
        assert "not running" not in text
        report = json.loads(_cli_ok("status", "--config", str(config), "--json"))
        assert report["service"] == {"running": True, "pid": pid}  # a number, as in the text
        assert await serve.aterminate() == 0
    assert "service: not running" in _cli_ok("status", "--config", str(config))
    report = json.loads(_cli_ok("status", "--config", str(config), "--json"))
    assert report["service"] == {"running": False, "pid": None}


async def test_systemd_is_told_ready_and_stopping(tmp_path: Path, fake: FakeTelegram) -> None:
    config = write_config(tmp_path, fake.base_url, None)
    notify_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify_socket:
        notify_socket.bind(str(notify_path))
        notify_socket.setblocking(False)
        received: list[str] = []

        async def datagram(expected: str) -> bool | None:
            with contextlib.suppress(BlockingIOError):
                received.append(notify_socket.recv(4096).decode())
            return expected in received or None

        env = {"TC_TEST_TOKEN": fake.token, "NOTIFY_SOCKET": str(notify_path)}
        with ServeProcess(config, env=env) as serve:
            await until(lambda: datagram("READY=1"), what="READY=1 on the notify socket")
            assert "STOPPING=1" not in received
            assert await serve.aterminate() == 0
            await until(lambda: datagram("STOPPING=1"), what="STOPPING=1 on the notify socket")
        assert received.index("READY=1") < received.index("STOPPING=1")


async def test_chats_lists_chats_and_topics_commands_came_from(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    config = write_config(tmp_path, fake.base_url, None)
    assert "No command seen yet" in _cli_ok("chats", "--config", str(config))
    with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
        fake.inject_command(UNROUTED, "/taskcard")
        fake.inject_command(GROUP, "/taskcard", thread_id=7)
        rows = await until(lambda: _chats_json(config, 2), what="two chats in `taskcard chats`")
        assert await serve.aterminate() == 0
    by_chat = {(row["chat_id"], row["thread_id"]): row for row in rows}
    unrouted = by_chat[(str(UNROUTED), None)]
    assert unrouted["channel"] == "telegram"
    assert unrouted["title"] == f"Group {UNROUTED}"
    assert unrouted["routed"] is False
    assert by_chat[(str(GROUP), "7")]["routed"] is False  # the route is for the main chat
    table = _cli_ok("chats", "--config", str(config))
    header, *lines = table.splitlines()
    assert header.split()[:3] == ["CHANNEL", "CHAT", "ID"]
    unrouted_line = next(line for line in lines if str(UNROUTED) in line)
    assert f"Group {UNROUTED}" in unrouted_line and unrouted_line.rstrip().endswith("no")


async def _get_ok(serve: ServeProcess, url: str) -> bool | None:
    assert serve.proc is not None and serve.proc.poll() is None, serve.logs
    response = await get(url)
    return True if response is not None and response.status_code == 200 else None


async def _metrics_with(base: str, name: str, **labels: str) -> str | None:
    response = await get(base + "/metrics")
    if response is not None and sample(response.text, name, **labels):
        return response.text
    return None


async def _status_containing(config: Path, needle: str) -> str | None:
    text = _cli_ok("status", "--config", str(config))
    return text if needle in text else None


async def _chats_json(config: Path, count: int) -> list[dict[str, object]] | None:
    rows: list[dict[str, object]] = json.loads(_cli_ok("chats", "--config", str(config), "--json"))
    return rows if len(rows) >= count else None


def _cli_ok(*args: str) -> str:
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_each_refused_reload_says_what_it_refused(tmp_path: Path, fake: FakeTelegram) -> None:
    """SIGHUP twice within a minute, each time on a broken file: every problem is logged as
    part of its refusal (one JSON object each), never as a lone line whose refusal was held
    back as a repeat of the first one."""
    config = write_config(tmp_path, fake.base_url, None)
    good = config.read_text()
    env = {"TC_TEST_TOKEN": fake.token, "TASKCARD_LOG_FORMAT": "json"}
    with ServeProcess(config, env=env) as serve:
        assert serve.proc is not None
        await eventually(lambda: fake.waiting_pollers, what="the service polling")
        config.write_text(good + "broken = [\n")
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "TOML syntax error" in serve.logs, what="the first refusal")
        config.unlink()
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "no such file" in serve.logs, what="the second refusal")
        config.write_text(good)
        assert await serve.aterminate() == 0
    records = [json.loads(line) for line in serve.stderr if line.startswith("{")]
    for problem in ("TOML syntax error", "no such file"):
        (record,) = (r for r in records if problem in r["message"])
        assert record["message"].startswith("config reload refused:"), record
        assert record["level"] == "ERROR"


async def test_a_sighup_repeated_on_the_same_refusal_is_answered_each_time(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A second SIGHUP within a minute on a file refused for the same reason (still broken,
    still changing a key that needs a restart) was answered by nothing at all: the log's
    repeat limiter held the refusal back, so an operator who fixed something else read the
    silence as a reload that applied. Each SIGHUP now gets its refusal line."""
    config = write_config(tmp_path, fake.base_url, None)
    good = config.read_text()
    renamed = good.replace('token_env = "TC_TEST_TOKEN"', 'token_env = "TC_OTHER_TOKEN"')
    assert renamed != good
    env = {"TC_TEST_TOKEN": fake.token, "TC_OTHER_TOKEN": fake.token}
    with ServeProcess(config, env=env) as serve:
        assert serve.proc is not None
        await eventually(lambda: fake.waiting_pollers, what="the service polling")
        # The TOML problem is on the line below its refusal; the key's is on the refusal.
        for broken, said in (
            (good + "broken = [\n", "TOML syntax error"),
            (renamed, "config reload refused: telegram.token_env changed"),
        ):
            config.write_text(broken)
            for sent in (1, 2, 3):
                serve.proc.send_signal(signal.SIGHUP)
                await eventually(
                    lambda said=said, sent=sent: serve.logs.count(said) >= sent,
                    what=f"refusal {sent} ({said})",
                )
        config.write_text(good)
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the good reload")
        assert await serve.aterminate() == 0
    assert "suppressed" not in serve.logs, serve.logs


async def test_a_reload_of_a_config_given_as_a_named_pipe_is_refused_not_awaited(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A start may read its configuration from a named pipe once. A SIGHUP then opened the
    pipe again and waited, with the whole service, for a writer that never came: no card,
    no command, no stop. The reload is refused and the service carries on."""
    written = write_config(tmp_path, fake.base_url, None)
    fifo = tmp_path / "taskcard.fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with fifo.open("w") as pipe:  # waits for the service to open it
            pipe.write(written.read_text())

    feeder = asyncio.get_running_loop().run_in_executor(None, feed)
    with ServeProcess(fifo, env={"TC_TEST_TOKEN": fake.token}) as serve:
        assert serve.proc is not None
        await feeder
        await eventually(lambda: fake.waiting_pollers, what="the service polling")
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: "config reload refused" in serve.logs and "is a pipe" in serve.logs,
            what="the refused reload",
        )
        publish(tmp_path / "agents" / "builder", "after the refused reload")
        await eventually(
            lambda: any("after the refused reload" in m.text for m in fake.bot_messages(GROUP)),
            what="a card shown after the refusal",
        )
        assert await serve.aterminate() == 0, serve.logs


async def test_a_sighup_before_the_service_runs_does_not_end_it(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """`kill -HUP` right after a start (a deploy script reloading) used to end the process
    with SIGHUP's default action, and systemd does not restart a service a SIGHUP ended.
    The start is held while another process locks the state file, the signal is sent then,
    and the service still starts and reloads on a later SIGHUP."""
    config = write_config(tmp_path, fake.base_url, None)
    state_dir = tmp_path / ".taskcard"
    SqliteStore.in_dir(state_dir).close()
    holder = sqlite3.connect(state_dir / STATE_FILE, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
            assert serve.proc is not None
            # The lock file holds its pid once the process runs its own code.
            await eventually(
                lambda: (
                    (state_dir / "serve.lock").exists()
                    and (state_dir / "serve.lock").read_text() == str(serve.proc.pid)
                ),  # type: ignore[union-attr]
                what="the service taking its lock",
            )
            serve.proc.send_signal(signal.SIGHUP)
            holder.execute("ROLLBACK")
            await eventually(lambda: fake.waiting_pollers, what="the service polling")
            assert serve.proc.poll() is None, serve.logs
            serve.proc.send_signal(signal.SIGHUP)
            await eventually(lambda: "config reloaded" in serve.logs, what="the reload")
            assert await serve.aterminate() == 0
    finally:
        holder.close()


async def test_a_refused_reload_does_not_warn_that_nothing_is_served(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A configuration file emptied by mistake (`> taskcard.toml`) and reloaded: the reload
    is refused (the channel would go), yet a warning first said that nothing was served, as
    if the empty file had been applied. Only the refusal is logged; the cards go on."""
    config = write_config(tmp_path, fake.base_url, None)
    good = config.read_text()
    with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
        assert serve.proc is not None
        await eventually(lambda: fake.waiting_pollers, what="the service polling")
        config.write_text("")
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reload refused" in serve.logs, what="the refusal")
        config.write_text(good)
        publish(tmp_path / "agents" / "builder", "after the refused reload")
        await eventually(
            lambda: any("after the refused reload" in m.text for m in fake.bot_messages(GROUP)),
            what="a card shown after the refusal",
        )
        assert await serve.aterminate() == 0, serve.logs
    assert "nothing is served" not in serve.logs, serve.logs


async def test_a_notice_refused_for_a_revoked_token_is_sent_after_the_restart(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A notice refused because the bot token was revoked was marked failed for good, so the
    restart with a valid token never sent it (a card refused so is shown again). It now
    disables the channel, as a refused card does, and stays pending for the restart."""
    config = telegram_config(tmp_path, fake.base_url, GROUP)
    workdir = tmp_path / "agents" / "builder"
    token = fake.token
    ident = "task_card.error:tc_1:1:renderer_nonzero_exit"
    later = "task_card.error:tc_1:2:renderer_timeout"

    def recorded() -> int:
        with sqlite3.connect(tmp_path / ".taskcard" / STATE_FILE) as db:
            return int(db.execute("SELECT COUNT(*) FROM notices").fetchone()[0])

    def notices() -> list[str]:
        return [m.text for m in fake.bot_messages(GROUP) if "task card" in m.text.lower()]

    with ServeProcess(config, env={"TC_TEST_TOKEN": token}) as serve:
        publish(workdir, "step 1")
        await eventually(
            lambda: any("step 1" in m.text for m in fake.bot_messages(GROUP)), what="the card"
        )
        fake.token = "999:revoked"  # every request with the old token now answers 401
        notify(workdir, ident, "error")
        await eventually(lambda: "channel telegram disabled" in serve.logs, what="the line")
        # Recorded once the channel is disabled: kept for the restart, never sent meanwhile.
        notify(workdir, later, "error", code="renderer_timeout")
        await eventually(lambda: recorded() == 2, what="the second notice recorded")
        assert await serve.aterminate() == 0
    assert not notices()
    refused = [
        r.params.get("text", "")
        for r in fake.requests
        if r.method == "sendMessage" and r.status == 401
    ]
    assert not [text for text in refused if "renderer_timeout" in text], refused
    fake.token = token  # the same token is valid again (set anew)
    with ServeProcess(config, env={"TC_TEST_TOKEN": token}) as again:
        await eventually(lambda: len(notices()) == 2, what="the notices after the restart")
        assert await again.aterminate() == 0
    assert any("renderer_timeout" in text for text in notices()), notices()


@pytest.mark.parametrize("revoked", ["telegram", "feishu"])
async def test_credentials_revoked_while_serving_disable_that_channel_only(
    tmp_path: Path, fake: FakeTelegram, feishu: FakeFeishu, revoked: str
) -> None:
    """The bot token revoked while serving (BotFather's /revoke; on Feishu the app secret
    reset): each card change was sent and refused again (Feishu disabled each route on its
    own), the channel stayed `ready` for metrics and `/healthz`, and the log only said that a
    card was refused. The channel is now disabled with one line saying to set valid
    credentials and restart, as at start, while the other platform goes on."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    feishu_lines = [
        "[feishu]",
        'app_id_env = "TC_FS_APP_ID"',
        'app_secret_env = "TC_FS_APP_SECRET"',
        f'domain = "{feishu.base_url}"',
        'events = "none"',
        "[[feishu.routes]]",
        f'chat_id = "{FEISHU_CHAT}"',
        'agents = ["builder"]',
    ]
    config = telegram_config(
        tmp_path,
        fake.base_url,
        GROUP,
        extra=[*feishu_lines, "[metrics]", f'listen = "127.0.0.1:{port}"'],
    )
    env = {
        "TC_TEST_TOKEN": fake.token,
        "TC_FS_APP_ID": feishu.app_id,
        "TC_FS_APP_SECRET": feishu.app_secret,
    }
    workdir = tmp_path / "agents" / "builder"
    kept = "feishu" if revoked == "telegram" else "telegram"
    secrets = (fake.token, feishu.app_secret)

    def shows(platform: str, text: str) -> bool:
        if platform == "telegram":
            return any(text in m.text for m in fake.bot_messages(GROUP))
        return any(text in m.text for m in feishu.chat(FEISHU_CHAT))

    def sent(platform: str) -> int:
        if platform == "telegram":
            return fake.count("editMessageText") + fake.count("sendMessage")
        return len(feishu.requests_of("patch")) + len(feishu.requests_of("send"))

    with ServeProcess(config, env=env) as serve:
        publish(workdir, "step 1")
        await eventually(lambda: shows("telegram", "step 1"), what="the Telegram card")
        await eventually(lambda: shows("feishu", "step 1"), what="the Feishu card")
        if revoked == "telegram":
            fake.token = "999:revoked"  # every request with the old token now answers 401
        else:
            feishu.app_secret = "reset-in-the-console"
            feishu.revoke_tokens()  # the service's tenant token must be fetched again
        publish(workdir, "step 2")
        await eventually(lambda: f"channel {revoked} disabled" in serve.logs, what="the line")
        metrics = await until(
            lambda: _metrics_with(base, "taskcard_channel_ready", channel=kept),
            what="/metrics",
        )
        assert sample(metrics, "taskcard_channel_ready", channel=revoked) == 0.0
        refused = sent(revoked)
        publish(workdir, "step 3")
        await eventually(lambda: shows(kept, "step 3"), what=f"{kept} going on")
        assert sent(revoked) == refused, f"nothing more is sent to {revoked}"
        assert await serve.aterminate() == 0
    assert not any(secret in serve.logs for secret in secrets)
    (line,) = [line for line in serve.stderr if f"channel {revoked} disabled" in line]
    assert "restart" in line and "credentials" in line, line
    assert "disabled:" not in serve.logs.replace(f"channel {revoked} disabled:", ""), serve.logs


async def test_a_metrics_port_taken_stops_the_start_with_one_line_naming_it(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """Another process holds the metrics port: the service said "cannot listen on ...:
    [Errno 98] error while attempting to bind on address (...)" and exited 1, a runtime
    failure that systemd restarts into the same wall."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        config = write_config(tmp_path, fake.base_url, port)
        with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
            await eventually(
                lambda: serve.proc is not None and serve.proc.poll() is not None,
                timeout_s=BIND_RETRY_S + 60,
                what="the start given up once the port stayed taken",
            )
            assert serve.proc is not None
            code = serve.proc.returncode
    lines = [line for line in serve.logs.splitlines() if line.startswith("taskcard:")]
    assert code == 2, serve.logs
    assert len(lines) == 1, serve.logs
    for words in (f"127.0.0.1:{port}", "[metrics] listen", "already in use", "another port"):
        assert words in lines[0], lines[0]
    assert "Traceback" not in serve.logs and "Errno" not in lines[0]
    assert fake.token not in serve.logs


async def test_a_metrics_port_busy_for_a_moment_is_waited_for(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A port held only for a moment (a process still closing, a passing connection) ended
    the start with exit 2, which the shipped unit never restarts: the service now tries the
    port again for a while and serves once it is free."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        config = write_config(tmp_path, fake.base_url, port)
        with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
            await eventually(lambda: "the port is in use; trying again" in serve.logs)
            holder.close()
            answer = await until(
                lambda: get(f"http://127.0.0.1:{port}/healthz"), what="the listener"
            )
            assert answer.status_code in (200, 503)
            assert await serve.aterminate() == 0, serve.logs
    finally:
        holder.close()
    assert "Traceback" not in serve.logs and not any(
        line.startswith("taskcard:") for line in serve.logs.splitlines()
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_a_stop_while_a_busy_metrics_port_is_waited_for_is_clean(
    tmp_path: Path, fake: FakeTelegram, signum: signal.Signals
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        config = write_config(tmp_path, fake.base_url, port)
        with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
            await eventually(lambda: "the port is in use; trying again" in serve.logs)
            assert serve.proc is not None
            serve.proc.send_signal(signum)
            await eventually(lambda: serve.proc is not None and serve.proc.poll() is not None)
            assert await serve.aterminate() == 0, serve.logs
    assert f"stopped ({signum.name} during the start, before serving)" in serve.logs
    assert fake.bot_messages(GROUP) == []


async def test_with_json_logs_a_start_error_is_a_json_record(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The lines that stop the start (a taken port, an invalid configuration) were plain
    text even with `--log-format json`, the only lines of the log a shipper could not read."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        config = write_config(tmp_path, fake.base_url, port)
        env = {"TC_TEST_TOKEN": fake.token, "TASKCARD_LOG_FORMAT": "json"}
        with ServeProcess(config, env=env) as serve:
            await eventually(
                lambda: serve.proc is not None and serve.proc.poll() is not None,
                timeout_s=BIND_RETRY_S + 60,
                what="the start given up once the port stayed taken",
            )
            assert serve.proc is not None and serve.proc.returncode == 2
    records = [json.loads(line) for line in serve.logs.splitlines()]
    [error] = [r for r in records if r["level"] == "ERROR"]
    assert error["logger"] == "taskcard" and "[metrics] listen" in error["message"]
    config.write_text(config.read_text() + "[bogus]\n")
    result = run_cli("serve", "--config", str(config), "--log-format", "json")
    assert result.returncode == 2
    [problem] = [json.loads(line) for line in result.stderr.splitlines()]
    assert problem["level"] == "ERROR" and "bogus" in problem["message"], problem
