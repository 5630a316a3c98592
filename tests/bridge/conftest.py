"""Fixtures shared by the bridge's tests."""

from __future__ import annotations

import sqlite3

import pytest


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement run on a SQLite connection opened from now on."""
    ran: list[str] = []
    connect = sqlite3.connect

    def traced(*args: object, **kwargs: object) -> sqlite3.Connection:
        db = connect(*args, **kwargs)  # type: ignore[arg-type]
        db.set_trace_callback(ran.append)
        return db

    monkeypatch.setattr(sqlite3, "connect", traced)
    return ran
