"""Shared test configuration and fixtures: an agent workdir, a short runtime dir, `taskcard
mcp` driven by the SDK's stdio client. Area-specific fixtures live in each test folder's
conftest."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import settings
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.stdio import get_default_environment

# The property tests draw the same examples on every run of `make test` (a gate that passes
# once passes again: a new random draw finding an old bug must not turn CI red on an unrelated
# change); `make explore` draws new ones, to look for bugs on purpose.
settings.register_profile("gate", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("TASKCARD_HYPOTHESIS_PROFILE", "gate"))


@pytest.fixture(scope="session", autouse=True)
def _close_lark_module_loop() -> Iterator[None]:
    """lark-oapi's long-connection module creates an event loop at import time and never
    closes it; close it at the end of the session so the interpreter exits without warnings."""
    yield
    module = sys.modules.get("lark_oapi.ws.client")
    loop = getattr(module, "loop", None)
    if loop is not None and not loop.is_running() and not loop.is_closed():
        loop.close()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Redis for the session, on a free loopback port, stopped at the end."""
    from tests.redis_server import RedisServer, have_redis

    if not have_redis():
        pytest.fail("redis-server is not installed: run `make test`, which installs it")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


# The first message a hand-written MCP client sends (`taskcard mcp` driven line by line).
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An agent's workdir, empty (the hooks' and the inbox's tests give theirs a card folder)."""
    path = tmp_path / "agent"
    path.mkdir()
    return path


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """A runtime dir for task card hosts, short on purpose: unix socket paths are limited to
    108 bytes (one under the test's own `tmp_path` is too long once pytest's numbered base
    folder has four digits)."""
    yield from _short_dir()


@pytest.fixture
def other_runtime_dir() -> Iterator[Path]:
    """A second runtime dir, short as `runtime_dir` is: another caller's environment."""
    yield from _short_dir()


def _short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tcrt"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# How the tests start `taskcard`: its package's entry point, run by this interpreter.
TASKCARD_MODULE = (sys.executable, "-m", "taskcard.bridge.cli")


# `taskcard` whose `os.open` of a path ending in one of NAMES fails with EIO (`failing_open`).
_FAILING_OPEN = """
import errno, os, sys
NAMES, READS_ONLY = {names!r}, {reads_only!r}
real_open = os.open
def failing(path, flags, *args, **kwargs):
    name = os.fspath(path)
    reading = flags & os.O_ACCMODE == os.O_RDONLY
    if isinstance(name, str) and name.endswith(NAMES) and (reading or not READS_ONLY):
        raise OSError(errno.EIO, os.strerror(errno.EIO), name)
    return real_open(path, flags, *args, **kwargs)
os.open = failing
from taskcard.bridge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def failing_open(*names: str, reads_only: bool = False) -> tuple[str, ...]:
    """`taskcard`, as `mcp_session` or a subprocess starts it, whose `os.open` of a path
    ending in one of `names` fails with EIO (only when opened for reading, with
    `reads_only`): the system failing, not our code. No file system fails on demand (FUSE
    aside), and `/proc/self/mem`, whose read fails so, is a link out of the workdir that the
    workdir's own files may not be."""
    code = _FAILING_OPEN.format(names=tuple(names), reads_only=reads_only)
    return (sys.executable, "-c", code)


def mcp_server(
    workdir: Path, runtime_dir: Path, taskcard: Sequence[str] = TASKCARD_MODULE
) -> StdioServerParameters:
    """`taskcard mcp` for `workdir`, as the MCP SDK's stdio client starts it (`taskcard`: the
    command line that runs it, up to the subcommand)."""
    command, *first = taskcard
    # The SDK starts the server with a few variables alone (HOME, PATH, ...): without the
    # suite's PYTHONPATH, a run from a git worktree served the checkout the venv was
    # installed from, not the code under test.
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else None
    return StdioServerParameters(
        command=command,
        args=[*first, "mcp", "--workdir", str(workdir), "--runtime-dir", str(runtime_dir)],
        env=None if env is None else {**get_default_environment(), **env},
    )


@contextlib.asynccontextmanager
async def mcp_session(
    workdir: Path, runtime_dir: Path, taskcard: Sequence[str] = TASKCARD_MODULE
) -> AsyncIterator[ClientSession]:
    """An initialized session of the SDK's real client with `taskcard mcp` over stdio; the
    server exits when the block ends."""
    server = mcp_server(workdir, runtime_dir, taskcard)
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session
