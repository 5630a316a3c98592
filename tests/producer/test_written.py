"""The host skips reading back files it wrote itself, and still sees anyone else's change."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.contract import read_regular
from taskcard.producers.task_card.written import WrittenFiles
from tests.producer.conftest import STATIC_RENDERER, envelope, write_renderer

MakeCard = Callable[..., TaskCard]


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name("other.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _in_place(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _delete(path: Path, data: bytes) -> None:
    path.unlink()


@pytest.mark.parametrize("change", [_replace, _in_place, _delete])
def test_a_change_by_anyone_else_is_seen_and_the_file_read_back(
    tmp_path: Path, change: Callable[[Path, bytes], None]
) -> None:
    path = tmp_path / "status"
    written = WrittenFiles()
    written.write(path, b"active\n")
    assert written.holds(path, b"active\n")
    assert not written.holds(path, b"inactive\n")
    change(path, b"something else, longer\n")
    assert not written.holds(path, b"active\n")
    if path.exists():
        assert written.holds(path, b"something else, longer\n")  # read back, not remembered


def test_an_unknown_file_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "body"
    path.write_bytes(b"hello")
    written = WrittenFiles()
    assert written.holds(path, b"hello")
    assert not written.holds(path, b"hell")
    assert not written.holds(tmp_path / "missing", b"")


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 70_000])
def test_read_regular_reads_whole_files_and_stops_at_the_limit(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    data = bytes(range(256)) * (size // 256 + 1)
    path.write_bytes(data[:size])
    assert read_regular(path, 1_000_000) == data[:size]
    assert read_regular(path, 100) == data[: min(size, 100)]


def test_a_body_replaced_behind_the_hosts_back_is_restored_by_the_next_refresh(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    assert card.call(envelope("start", renderer_path="r.py", interval_s=3600))["status"] == (
        "watching"
    )
    body = workdir / "taskcard" / "taskcard.md"
    status = workdir / "taskcard" / "status"
    published = body.read_bytes()
    _replace(body, b"planted")
    _in_place(status, b"inactive")
    result = card.call(envelope("retry", watch_id="tc_1"))
    assert result["status"] == "watching"
    assert body.read_bytes() == published
    assert status.read_bytes() == b"active"
