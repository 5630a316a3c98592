"""A real `redis-server` for tests: on a free loopback port, in its own folder, stopped after.

Tests that need Redis take the session fixture `redis_url` (one server, each test on its own
key prefix) or start a private `RedisServer` when they restart it. Without the binary the
tests that need it fail with that advice; `make test` installs it first.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One `redis-server` process; `appendonly` makes every write survive a restart."""

    def __init__(self, folder: Path, *, appendonly: bool = False) -> None:
        self.folder = folder
        self.port = free_port()
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed (make test installs it)"
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.folder),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise AssertionError("redis-server did not start") from None
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: Redis writes what it holds, then exits
            self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def have_redis() -> bool:
    return shutil.which("redis-server") is not None


def private_redis(folder: Path, stack: ExitStack) -> RedisServer:
    """A Redis of one test's own (it may stop or restart it), persisting to `folder`, stopped
    when `stack` closes; the test fails (never skips) where redis-server is missing."""
    if not have_redis():
        pytest.fail("redis-server is not installed: run `make test`, which installs it")
    server = RedisServer(folder, appendonly=True).start()
    stack.callback(server.stop)
    return server
