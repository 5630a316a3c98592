"""Running `taskcard serve` as a user would: a config file, a subprocess, the contract files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from taskcard.bridge.run.stackdump import TASKS_FOOTER
from taskcard.producers.task_card.contract import (
    CardPaths,
    append_jsonl_line,
    atomic_write,
    utc_now_iso,
)

ROOT = Path(__file__).resolve().parents[2]
# A service that does not stop in time is asked for its stacks (SIGUSR1) and given this long
# to print them; its failure message carries them and this much of the log before them.
DUMP_WAIT_S = 10.0
REPORT_LOG_LINES = 60
REPORT_STACK_LINES = 600


TOKEN_ENV = "TC_TEST_TOKEN"


# A rate-limit window far longer than any stop takes, however loaded the machine: a test
# that stops the service inside it knows the run did not act at its end.
LONG_WINDOW_S = 120
# The restarted run's `limits.max_pause_s` (`lift_long_pauses`): the stored long window is
# cut to this much from that run's start, and the run must keep to that much.
RESTART_CAP_S = 8


def lift_long_pauses(config: Path) -> float:
    """Before a restart: the next run caps every stored pause to `RESTART_CAP_S` from its
    start (`limits.max_pause_s`), so a test need not wait out `LONG_WINDOW_S`. Returns the
    time (`time.monotonic`, the fakes' clock) before which the capped pauses cannot end."""
    config.write_text(config.read_text() + f"\n[limits]\nmax_pause_s = {RESTART_CAP_S}\n")
    return time.monotonic() + RESTART_CAP_S


def agents_lines(tmp_path: Path, agents: Sequence[str]) -> list[str]:
    """The head of a config: the state folder and each agent, its workdir made under
    `tmp_path/agents`."""
    lines = ['state_dir = ".taskcard"']
    for agent in agents:
        (tmp_path / "agents" / agent).mkdir(parents=True, exist_ok=True)
        lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "agents/{agent}"']
    return lines


def telegram_config(
    tmp_path: Path,
    api_base_url: str,
    chat_id: int,
    agents: Sequence[str] = ("builder",),
    *,
    extra: Sequence[str] = (),
) -> Path:
    """`tmp_path/taskcard.toml` for the plainest fleet: each agent's workdir made under
    `tmp_path/agents`, one Telegram route to `chat_id` following them all, the bot token read
    from `TOKEN_ENV`, and `extra` lines (further sections) at the end."""
    lines = [
        *agents_lines(tmp_path, agents),
        "[telegram]",
        f'token_env = "{TOKEN_ENV}"',
        f'api_base_url = "{api_base_url}"',
        "poll_timeout_s = 1",
        "[[telegram.routes]]",
        f"chat_id = {chat_id}",
        "agents = [" + ", ".join(f'"{agent}"' for agent in agents) + "]",
        *extra,
    ]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def publish(workdir: Path, body: str, status: str = "active") -> None:
    """Publish a card exactly as the producer contract says: body first, then status."""
    paths = CardPaths(workdir)
    atomic_write(paths.body, body.encode())
    atomic_write(paths.status, status.encode())


def set_status(workdir: Path, status: str) -> None:
    atomic_write(CardPaths(workdir).status, status.encode())


def notify(workdir: Path, ident: str, state: str, *, code: str | None = None, **extra: Any) -> None:
    """Append a typed task card notification as the producer's notification port would."""
    source = {"limit": "task_card.limit"}.get(state, "task_card.error")
    record = {
        "id": ident,
        "source": source,
        "channel": "system",
        "ref_id": "tc_1",
        "priority": "high" if state == "error" else "normal",
        "header": "Task card",
        "body": "renderer said SECRET /home/agent/private/path",
        "extra": {"state": state, "watch_id": "tc_1", **({"code": code} if code else {}), **extra},
        "at": utc_now_iso(),
    }
    append_jsonl_line(CardPaths(workdir).notifications, record)


def activity(workdir: Path, kind: str, **fields: Any) -> None:
    append_jsonl_line(CardPaths(workdir).events, {"ts": utc_now_iso(), "kind": kind, **fields})


def run_cli(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run `taskcard ARGS...` to completion, as a user at a shell would."""
    return subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=os.environ,
    )


class ServeProcess:
    """`taskcard serve --config FILE` in a subprocess, its output captured line by line."""

    def __init__(
        self, config: Path, env: dict[str, str] | None = None, prefix: Sequence[str] = ()
    ) -> None:
        """`prefix`: a command that runs the service (it execs the rest of its arguments),
        such as a namespace the test sets limits in."""
        self.config = config
        self.prefix = list(prefix)
        self.env = {**os.environ, **(env or {})}
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._readers: list[threading.Thread] = []

    def start(self) -> ServeProcess:
        self.proc = subprocess.Popen(
            [
                *self.prefix,
                sys.executable,
                "-m",
                "taskcard.bridge.cli",
                "serve",
                "--config",
                str(self.config),
            ],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for stream, sink in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr)):
            reader = threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
            reader.start()
            self._readers.append(reader)
        return self

    @staticmethod
    def _pump(stream: Any, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    @property
    def output(self) -> str:
        return "".join(self.stdout)

    @property
    def logs(self) -> str:
        return "".join(self.stderr)

    def terminate(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            mark = self._ask_for_stacks()
            deadline = time.monotonic() + DUMP_WAIT_S
            while not self._stacks_arrived(mark) and time.monotonic() < deadline:
                time.sleep(0.05)
            raise AssertionError(self._hang_report(timeout_s, mark)) from None
        self._close()
        return code

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._close()

    async def aterminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then wait without blocking the loop (in-process fakes keep answering).

        The service lets requests in flight finish for up to 35 s on SIGTERM (a send is not
        cut short: its message id would be lost), so a loaded machine may need most of that;
        the default leaves room for it and still fails a service that hangs. A service
        still running then fails the test with its stacks (SIGUSR1) and its log's tail."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            await eventually(
                lambda: self.proc is not None and self.proc.poll() is not None,
                timeout_s=timeout_s,
                what="the service to exit after SIGTERM",
            )
        except AssertionError:
            mark = self._ask_for_stacks()
            with contextlib.suppress(AssertionError):  # report what there is
                await eventually(
                    lambda: self._stacks_arrived(mark), timeout_s=DUMP_WAIT_S, what="stacks"
                )
            raise AssertionError(self._hang_report(timeout_s, mark)) from None
        self._close()
        assert self.proc.returncode is not None
        return self.proc.returncode

    def _ask_for_stacks(self) -> int:
        """SIGUSR1: the service prints every thread's and task's stack to stderr (see
        `bridge.run.stackdump`). Returns where in stderr the dump starts."""
        assert self.proc is not None
        mark = len(self.stderr)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)
        return mark

    def _stacks_arrived(self, mark: int) -> bool:
        return any(TASKS_FOOTER in line for line in self.stderr[mark:]) or (
            self.proc is not None and self.proc.poll() is not None
        )

    def _hang_report(self, timeout_s: float, mark: int) -> str:
        """Why a stop failed, for the test's failure message: the process's stacks at the
        time (SIGUSR1) and the tail of its log before them."""
        assert self.proc is not None
        exited = self.proc.poll()
        head = (
            f"`taskcard serve` (pid {self.proc.pid}) did not exit within {timeout_s:g}s after"
            " SIGTERM" + ("" if exited is None else f" (it exited with {exited} since)")
        )
        log_tail = "".join(self.stderr[max(0, mark - REPORT_LOG_LINES) : mark])
        stacks = "".join(self.stderr[mark : mark + REPORT_STACK_LINES]) or "(no stacks came)\n"
        return (
            f"{head}\n--- the last {REPORT_LOG_LINES} log lines before SIGUSR1 ---\n{log_tail}"
            f"--- stacks (SIGUSR1) ---\n{stacks}"
        )

    def _close(self) -> None:
        for reader in self._readers:
            reader.join(timeout=10)
        assert self.proc is not None
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._close()


async def eventually(
    predicate: Callable[[], Any], *, timeout_s: float = 60.0, what: str = "condition"
) -> Any:
    """Poll `predicate` until it returns something truthy; fail with `what` after the timeout.
    60 s by default: the suite runs as two copies on a loaded 2-core machine, where a
    service's start or a reconnect took more than 30 s at times (a passing wait is not
    slower for it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def lineage_reaches_card(
    workdir: Path, parent: str, reason: str, card: str, texts: Callable[[], Iterable[str]]
) -> None:
    """Write `workdir`'s lineage.json (spawned by `parent` for `reason`) and wait until one of
    `texts()` shows its row on the card that also shows `card`."""
    lineage = {"parent": parent, "reason": reason, "depth": 1}
    atomic_write(workdir / "lineage.json", json.dumps(lineage).encode())
    row = f"spawned by {parent}: {reason}"
    await eventually(
        lambda: any(card in text and row in text for text in texts()),
        what=f"the lineage row on the card showing {card!r}",
    )


def placeholder_secrets(config: Path) -> dict[str, str]:
    """A value of the right form for every secret variable `config` names (its defaults
    included): the environment an operator runs `serve --check` in, secrets set."""
    from taskcard.bridge.config import load_config

    loaded = load_config(config)
    env: dict[str, str] = {}
    if loaded.telegram is not None:
        env[loaded.telegram.token_env] = "123456:placeholder-token"
    if loaded.feishu is not None:
        env[loaded.feishu.app_id_env] = "cli_placeholder"
        env[loaded.feishu.app_secret_env] = "placeholder-secret"
        env[loaded.feishu.webhook.verification_token_env] = "placeholder-verification"
        env[loaded.feishu.webhook.encrypt_key_env] = "placeholder-encrypt"
    if loaded.cluster.redis_url_env is not None:
        env[loaded.cluster.redis_url_env] = "redis://127.0.0.1:6379/0"
    return env
