"""Fixtures shared by the end-to-end tests: one fresh fake Telegram and Feishu per test, and for
the cluster tests a Redis key prefix of their own and a stack their instances stop with."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack

import pytest

from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu() as server:
        yield server


@pytest.fixture
def prefix() -> str:
    """A Redis key prefix no other test uses (the tests of a run share one Redis)."""
    return f"e2e-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def fleet() -> Iterator[ExitStack]:
    """The instances a cluster test starts, stopped when it ends."""
    with ExitStack() as stack:
        yield stack
