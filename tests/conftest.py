"""Shared test configuration. Area-specific fixtures live in each test folder's conftest."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import settings

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
