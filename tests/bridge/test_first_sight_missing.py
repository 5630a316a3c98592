"""First sight of a file that is not there: one plain look, and nothing of it is lost.

At a cold start most agents have no reports, acks or notifications yet; `start_at_end`
skips the checked look when its caller has just seen the file missing. These tests hold the
promise around that shortcut: a file that appears later is read from its start, and a file
that is there but refused (a link out of the workdir) still goes through the checked look.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskcard.bridge.follow.safe_read import StrPath, WorkdirFiles
from taskcard.bridge.follow.tail import LineFollower, signature


class CountingFiles(WorkdirFiles):
    """The real checks, counting the checked looks."""

    def __init__(self, agent_id: str, workdir: Path) -> None:
        super().__init__(agent_id, workdir)
        self.stats = 0

    def stat(self, path: StrPath) -> os.stat_result | None:
        self.stats += 1
        return super().stat(path)


def test_a_missing_file_seen_missing_is_not_looked_at_twice(tmp_path: Path) -> None:
    files = CountingFiles("a", tmp_path)
    follower = LineFollower(tmp_path / "reports.jsonl", files)
    assert follower.unchanged() is False
    assert follower.start_at_end(seen_missing=follower.signature is None) == []
    assert follower.position is None
    assert files.stats == 0


def test_a_file_appearing_after_a_missing_first_sight_is_read_from_its_start(
    tmp_path: Path,
) -> None:
    follower = LineFollower(tmp_path / "reports.jsonl", WorkdirFiles("a", tmp_path))
    follower.unchanged()
    follower.start_at_end(seen_missing=follower.signature is None)
    (tmp_path / "reports.jsonl").write_bytes(b'{"n": 1}\n{"n": 2}\n')
    assert follower.unchanged() is False
    assert follower.read_new() == [b'{"n": 1}', b'{"n": 2}']


def test_a_file_that_is_there_still_takes_the_checked_look(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b'{"secret": 1}\n')
    workdir = tmp_path / "agent"
    workdir.mkdir()
    (workdir / "reports.jsonl").symlink_to(outside)
    files = CountingFiles("a", workdir)
    follower = LineFollower(workdir / "reports.jsonl", files)
    follower.unchanged()
    assert follower.signature is not None, "a plain stat follows the link"
    assert follower.start_at_end(seen_missing=follower.signature is None) == []
    assert follower.position is None, "the checked look refused the link out of the workdir"
    assert files.stats == 1


def test_a_signature_is_one_plain_look_and_a_link_that_leads_nowhere_is_something(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A regular or missing file costs one `lstat`; a symlink is followed, and one that is
    dangling or loops keeps its own signature (so it is looked at, refused and listed)."""
    looks: list[str] = []
    real_lstat, real_stat = os.lstat, os.stat

    def counted(real: Callable[..., os.stat_result]) -> Callable[..., os.stat_result]:
        def look(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            looks.append(real.__name__)
            return real(path, *args, **kwargs)

        return look

    monkeypatch.setattr(os, "lstat", counted(real_lstat))
    monkeypatch.setattr(os, "stat", counted(real_stat))
    plain = tmp_path / "plain.jsonl"
    plain.write_text("x\n")
    info = real_stat(plain)
    assert signature(plain) == (
        info.st_ino,
        info.st_size,
        info.st_mtime_ns,
        info.st_ctime_ns,
    )
    assert signature(tmp_path / "missing.jsonl") is None
    assert looks == ["lstat", "lstat"]
    (tmp_path / "inside").symlink_to(plain)
    assert signature(tmp_path / "inside") == signature(plain)
    (tmp_path / "dangling").symlink_to(tmp_path.parent / "nowhere" / "events.jsonl")
    (tmp_path / "loop").symlink_to("loop")
    for name in ("dangling", "loop"):
        link = real_lstat(tmp_path / name)
        assert signature(tmp_path / name) == (
            link.st_ino,
            link.st_size,
            link.st_mtime_ns,
            link.st_ctime_ns,
        )
