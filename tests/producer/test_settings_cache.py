"""`SettingsCache`: a running watch's settings, re-read only when a source file changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from taskcard.producers.task_card.contract import CardPaths
from taskcard.producers.task_card.settings import DEFAULT_MAX_BODY_CHARS, SettingsCache

HOUR_NS = 3600 * 10**9


def _document(workdir: Path, chars: int, *, age_ns: int = HOUR_NS) -> Path:
    path = workdir / "taskcard" / "taskcard.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"max_body_chars": chars}))
    mtime = path.stat().st_mtime_ns - age_ns
    os.utime(path, ns=(mtime, mtime))
    return path


def test_an_unchanged_old_document_is_not_read_again(workdir: Path) -> None:
    _document(workdir, 3000)
    cache = SettingsCache(CardPaths(workdir))
    first = cache.get()
    assert first.max_body_chars == 3000
    assert cache.get() is first  # reused: every read builds a new object


def test_a_fresh_document_is_never_kept(workdir: Path) -> None:
    _document(workdir, 3000, age_ns=0)
    cache = SettingsCache(CardPaths(workdir))
    assert cache.get() is not cache.get()


@pytest.mark.parametrize(
    "change",
    ["rewrite_same_size", "replace", "delete", "break", "fresh_in_place"],
)
def test_any_change_of_the_document_is_seen(workdir: Path, change: str) -> None:
    path = _document(workdir, 3000)
    cache = SettingsCache(CardPaths(workdir))
    assert cache.get().max_body_chars == 3000
    expected = 4000
    if change == "rewrite_same_size":
        _document(workdir, 4000)  # same size, in place, new mtime (an hour old, yet another)
        os.utime(path, ns=(path.stat().st_mtime_ns + 1, path.stat().st_mtime_ns + 1))
    elif change == "replace":
        tmp = path.with_name("new.json")
        tmp.write_text(json.dumps({"max_body_chars": 4000}))
        os.replace(tmp, path)
    elif change == "delete":
        path.unlink()
        expected = DEFAULT_MAX_BODY_CHARS
    elif change == "break":
        path.write_text("{not json")
        expected = DEFAULT_MAX_BODY_CHARS
    else:
        _document(workdir, 4000, age_ns=0)
    assert cache.get().max_body_chars == expected
    assert cache.get().max_body_chars == expected


def test_a_fresh_document_is_re_read_until_it_settles(workdir: Path) -> None:
    path = _document(workdir, 3000, age_ns=0)
    now = [path.stat().st_mtime_ns]
    cache = SettingsCache(CardPaths(workdir), clock_ns=lambda: now[0])
    assert cache.get().max_body_chars == 3000
    # Same size, same timestamps (an edit within the timestamp granularity): still seen.
    stat = path.stat()
    path.write_text(json.dumps({"max_body_chars": 5000}))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cache.get().max_body_chars == 5000


@pytest.mark.parametrize("planted", ["fifo", "folder"])
def test_a_document_swapped_for_a_non_file_while_cached_falls_back_to_defaults(
    workdir: Path, planted: str
) -> None:
    path = _document(workdir, 3000)
    cache = SettingsCache(CardPaths(workdir))
    assert cache.get().max_body_chars == 3000
    path.unlink()
    if planted == "fifo":
        os.mkfifo(path)  # opened for reading it would block the tick
    else:
        path.mkdir()
    assert cache.get().max_body_chars == DEFAULT_MAX_BODY_CHARS
    assert cache.get().max_body_chars == DEFAULT_MAX_BODY_CHARS
