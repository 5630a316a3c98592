"""Fixtures for the ledger: a controllable clock and a ledger file in the workdir (the
workdir itself comes from tests/conftest.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.ledger.store import DEFAULT_LEDGER, Ledger

T0 = datetime(2026, 3, 1, 9, 0, 0, tzinfo=UTC)


class FakeClock:
    """Time that moves only when a test says so."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def notifications(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / ".notification" / "system.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(workdir: Path, clock: FakeClock) -> Ledger:
    return Ledger(workdir / DEFAULT_LEDGER, clock=clock)
