"""A new state file appears whole or not at all.

`taskcard status` may run in the first instant of a first start, and a start may be killed
while it creates the file; neither may ever meet an empty or half-made database, which the
start-up check refuses (rightly: it cannot tell it from a damaged one).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import STATE_FILE, SqliteStore, StateFileError, check_state_file


def test_a_first_start_leaves_a_complete_file_and_no_temporary(tmp_path: Path) -> None:
    store = SqliteStore.in_dir(tmp_path)
    try:
        check_state_file(tmp_path / STATE_FILE)  # complete: the read-only check accepts it
    finally:
        store.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(STATE_FILE)) == [
        STATE_FILE
    ]


def test_a_creation_cut_short_leaves_no_state_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schema step fails (as a kill at that moment would stop it): no state file exists,
    so `status` sees "no state yet" and the next start is an ordinary first start."""
    real_connect = sqlite3.connect

    class Failing(sqlite3.Connection):
        def executescript(self, script: str) -> sqlite3.Cursor:
            raise sqlite3.OperationalError("disk I/O error")

    def connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        return real_connect(*args, **kwargs, factory=Failing)  # type: ignore[arg-type,misc]

    monkeypatch.setattr(sqlite3, "connect", connect)
    with pytest.raises(StateFileError):
        SqliteStore.in_dir(tmp_path)
    assert not (tmp_path / STATE_FILE).exists()
    monkeypatch.setattr(sqlite3, "connect", real_connect)

    store = SqliteStore.in_dir(tmp_path)  # the leftover temporary does not get in the way
    try:
        store.set_cursor("k", "v")
        assert store.get_cursor("k") == "v"
    finally:
        store.close()
