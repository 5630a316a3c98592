"""Fixtures shared by the end-to-end tests: one fresh fake Telegram and Feishu per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
