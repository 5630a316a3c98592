"""`WorkdirFiles`: only regular files inside the agent's resolved workdir are ever read."""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from taskcard.bridge.follow.safe_read import (
    WorkdirFiles,
    _read_fd,
    _read_up_to,
    file_kind,
    is_inside,
    is_normal_absolute,
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "agent"
    (path / "taskcard").mkdir(parents=True)
    return path


@pytest.fixture
def resolved(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path `os.path.realpath` resolves from now on, except the workdir itself (a
    refused read resolves the root again, by design): what the shortcuts must not need."""
    seen: list[str] = []
    real_realpath = os.path.realpath

    def counting(path: str, *args: object, **kwargs: bool) -> str:
        if os.fspath(path) != str(workdir):
            seen.append(os.fspath(path))
        return real_realpath(path, **kwargs)

    monkeypatch.setattr(os.path, "realpath", counting)
    return seen


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_dir(path: Path) -> None:
    path.mkdir()


def make_socket(path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()


def make_loop(path: Path) -> None:
    path.symlink_to(path.name)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (make_fifo, "named pipe"),
        (make_dir, "a folder"),
        (make_socket, "a socket"),
        (make_loop, "symlink"),
    ],
)
def test_non_regular_files_are_refused_without_blocking(
    workdir: Path, make: Callable[[Path], None], reason: str
) -> None:
    target = workdir / "taskcard" / "status"
    make(target)
    files = WorkdirFiles("a", workdir)
    assert files.read(target, limit=64) is None
    assert files.open(target) is None
    assert files.stat(target) is None
    assert reason in files.problems["taskcard/status"]
    if target.is_dir() and not target.is_symlink():
        target.rmdir()
    else:
        target.unlink()
    target.write_bytes(b"active")
    assert files.read(target, limit=64) == b"active"
    assert files.problems == {}


def test_missing_files_are_none_without_a_problem(workdir: Path) -> None:
    files = WorkdirFiles("a", workdir)
    assert files.read(workdir / "taskcard" / "status", limit=64) is None
    assert files.read(workdir / "nowhere" / "status", limit=64) is None
    assert WorkdirFiles("a", workdir / "gone").read(workdir / "gone" / "x", limit=1) is None
    assert files.problems == {}


def test_symlinks_inside_are_followed_and_out_are_refused(tmp_path: Path, workdir: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("SECRET")
    inside = workdir / "real.md"
    inside.write_text("inside")
    files = WorkdirFiles("a", workdir)
    (workdir / "taskcard" / "in.md").symlink_to(inside)
    (workdir / "taskcard" / "out.md").symlink_to(secret)
    (workdir / "taskcard" / "dotdot.md").symlink_to("../../secret")
    assert files.read(workdir / "taskcard" / "in.md", limit=100) == b"inside"
    for name in ("out.md", "dotdot.md"):
        assert files.read(workdir / "taskcard" / name, limit=100) is None
        assert "outside" in files.problems[f"taskcard/{name}"]
    # A contract folder symlinked out of the workdir counts as outside too.
    outside = tmp_path / "logs"
    outside.mkdir()
    (outside / "events.jsonl").write_text("{}\n")
    (workdir / "logs").symlink_to(outside)
    assert files.stat(workdir / "logs" / "events.jsonl") is None
    assert "outside" in files.problems["logs/events.jsonl"]


def test_a_plainly_missing_file_is_looked_for_without_resolving_it(
    tmp_path: Path, workdir: Path, resolved: list[str]
) -> None:
    """Most agents never write a ledger or a rotation: looking for one costs one `lstat`.
    Anything at the path (a dangling or outward symlink, a folder) still goes the long way
    and is judged as before, and so is a missing file behind an outward folder."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "there.json").write_text("{}")
    (workdir / "out").symlink_to(outside)
    (workdir / "dangling.json").symlink_to(tmp_path / "nothing")
    (workdir / "folder.json").mkdir()
    files = WorkdirFiles("a", workdir)
    files.stat(workdir / "taskcard" / "warm-up")  # the workdir's resolution is kept
    resolved.clear()
    assert files.stat(workdir / "ledger" / "long-task-ledger.json") is None
    assert files.stat(str(workdir / "taskcard" / "status.1")) is None
    assert resolved == [] and files.problems == {}
    assert files.stat(workdir / "out" / "absent.json") is None
    assert len(resolved) == 1
    assert files.stat(workdir / "out" / "there.json") is None
    assert files.stat(workdir / "dangling.json") is None
    assert files.stat(workdir / "folder.json") is None
    assert len(resolved) == 4
    assert "outside" in files.problems["out/absent.json"]
    assert "outside" in files.problems["out/there.json"]
    assert "outside" in files.problems["dangling.json"]
    assert "folder" in files.problems["folder.json"]
    # Lexically odd paths are never taken the short way.
    assert files.stat(f"{workdir}/taskcard/../ledger/x.json") is None
    assert len(resolved) == 5


def test_a_workdir_that_is_itself_a_symlink_is_resolved_first(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "taskcard").mkdir(parents=True)
    (real / "taskcard" / "status").write_bytes(b"active")
    (tmp_path / "link").symlink_to(real)
    files = WorkdirFiles("a", tmp_path / "link")
    assert files.read(tmp_path / "link" / "taskcard" / "status", limit=64) == b"active"


def test_the_kept_workdir_never_lets_a_read_escape_after_a_swap(tmp_path: Path) -> None:
    """The workdir is resolved once and kept: after the workdir (a symlink) is re-pointed,
    reads follow it as a fresh resolution would; after its contract folder is swapped for a
    symlink out, reads are refused; never is a file outside read."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "status").write_bytes(b"SECRET")
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, text in ((first, b"active"), (second, b"inactive")):
        (folder / "taskcard").mkdir(parents=True)
        (folder / "taskcard" / "status").write_bytes(text)
    link = tmp_path / "link"
    link.symlink_to(first)
    files = WorkdirFiles("a", link)
    status = link / "taskcard" / "status"
    assert files.read(status, limit=64) == b"active"

    link.unlink()
    link.symlink_to(second)  # the workdir moved: read where it is now
    assert files.read(status, limit=64) == b"inactive"
    assert files.problems == {}

    (second / "taskcard" / "status").unlink()
    (second / "taskcard").rmdir()
    (second / "taskcard").symlink_to(outside)  # a folder swapped for a symlink out
    assert files.read(status, limit=64) is None
    assert files.open(status) is None
    assert files.stat(status) is None
    assert "outside" in files.problems["taskcard/status"]


def test_a_plain_path_is_read_without_resolving_it_and_a_symlinked_one_is_checked(
    tmp_path: Path, workdir: Path, resolved: list[str]
) -> None:
    """A path that is its own real location is read without resolving each component; any
    symlink on it sends the read through the full check, which still refuses a way out."""
    (workdir / "taskcard" / "status").write_bytes(b"active")
    (tmp_path / "secret").write_bytes(b"SECRET")
    files = WorkdirFiles("a", workdir)
    assert files.read(workdir / "taskcard" / "status", limit=64) == b"active"
    resolved.clear()
    for _ in range(3):
        assert files.read(workdir / "taskcard" / "status", limit=64) == b"active"
    assert resolved == []
    (workdir / "out").symlink_to(tmp_path)
    assert files.read(workdir / "out" / "secret", limit=64) is None
    assert "outside" in files.problems["out/secret"]
    assert resolved  # the symlinked path took the full check
    (workdir / "taskcard" / "status").unlink()
    (workdir / "taskcard" / "status").symlink_to(tmp_path / "secret")
    assert files.read(workdir / "taskcard" / "status", limit=64) is None
    assert "outside" in files.problems["taskcard/status"]


def test_plain_and_missing_paths_are_judged_without_resolving_and_symlinks_still_refused(
    tmp_path: Path, workdir: Path, resolved: list[str]
) -> None:
    """`stat` of a plain file, and `stat` or `read` of a missing one under plain folders, are
    answered without resolving each component; a symlink on the way (to an existing folder
    out, or dangling) still takes the full check, which refuses it even when the file is
    missing there, exactly as before."""
    (workdir / "taskcard" / "status").write_bytes(b"active")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    files = WorkdirFiles("a", workdir)
    files.stat(workdir / "taskcard" / "status")  # the workdir is resolved once, and kept
    resolved.clear()
    status = files.stat(workdir / "taskcard" / "status")
    assert status is not None
    assert status.st_ino == os.lstat(workdir / "taskcard" / "status").st_ino
    for missing in (
        workdir / "taskcard" / "watch.json",
        workdir / "logs" / "events.jsonl",  # its folder is missing too
        workdir / "a" / "b" / "c",
    ):
        assert files.stat(missing) is None
        assert files.read(missing, limit=8) is None
    assert resolved == []
    assert files.problems == {}

    (workdir / "out").symlink_to(outside)  # a folder out of the workdir, file missing there
    (workdir / "dangling").symlink_to(tmp_path / "nothing")
    (workdir / "file").write_bytes(b"x")
    for name in ("out", "dangling"):
        assert files.stat(workdir / name / "events.jsonl") is None
        assert files.read(workdir / name / "events.jsonl", limit=8) is None
        assert "outside" in files.problems[f"{name}/events.jsonl"]
    assert files.stat(workdir / "file" / "below") is None  # a file on the way: refused
    assert "file/below" in files.problems
    assert resolved  # each of those took the full check
    (workdir / "taskcard" / "link").symlink_to(workdir / "taskcard" / "status")
    resolved.clear()
    assert files.stat(workdir / "taskcard" / "link") is not None  # inside: followed
    assert resolved


def test_a_device_is_never_opened(tmp_path: Path) -> None:
    # /dev is outside any workdir; a workdir of / shows the type check on its own.
    files = WorkdirFiles("a", Path("/"))
    assert files.read(Path("/dev/null"), limit=1) is None
    assert "a device" in files.problems["dev/null"]


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        (stat.S_IFIFO, "a named pipe"),
        (stat.S_IFDIR, "a folder"),
        (stat.S_IFSOCK, "a socket"),
        (stat.S_IFCHR, "a device"),
        (stat.S_IFBLK, "a device"),
        (stat.S_IFLNK, "a symlink that cannot be resolved"),
    ],
)
def test_file_kinds_are_named(mode: int, kind: str) -> None:
    assert file_kind(mode) == kind


@pytest.mark.parametrize(
    ("root", "path", "inside"),
    [
        ("/w/a", "/w/a", True),
        ("/w/a", "/w/a/taskcard/status", True),
        ("/w/a", "/w/ab/status", False),
        ("/w/a", "/w", False),
        ("/", "/etc/passwd", True),
    ],
)
def test_is_inside(root: str, path: str, inside: bool) -> None:
    assert is_inside(root, path) is inside


@pytest.mark.parametrize(
    "path",
    [
        "/w/a/taskcard/status",
        "/w/a/taskcard/",
        "/w/a//taskcard/status",
        "/w/a/./taskcard/status",
        "/w/a/../a/taskcard/status",
        "//w/a",
        "/",
        "taskcard/status",
        "./status",
        "",
    ],
)
def test_the_remembered_normal_path_test_answers_as_abspath_wherever_the_service_runs(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Remembered across calls, so its answer must not depend on the working folder: a
    relative path is never its own absolute form, wherever the service runs."""
    for folder in (tmp_path, Path("/")):
        monkeypatch.chdir(folder)
        assert is_normal_absolute(path) is (path == os.path.abspath(path))


@pytest.mark.parametrize("size", [0, 1, 9, 10, 11, 100])
def test_a_read_returns_at_most_the_limit_whatever_the_file_size(workdir: Path, size: int) -> None:
    """Reads ask for the file's size, not the limit; what they return is unchanged."""
    content = bytes(range(256))[:size] if size <= 256 else b""
    (workdir / "f").write_bytes(content)
    files = WorkdirFiles("a", workdir)
    assert files.read(workdir / "f", limit=10) == content[:10]
    assert files.read(workdir / "f", limit=512 * 1024) == content


def test_a_size_that_says_less_than_the_content_never_bounds_a_read() -> None:
    """The size is a hint, never a bound: a file that grew after its size was taken (here a
    pipe, whose size is always 0) is read on up to the limit."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"x" * 50)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as handle:
        assert _read_up_to(handle, 20) == b"x" * 20
        assert _read_up_to(handle, 100) == b"x" * 30
    read_end, write_end = os.pipe()
    os.write(write_end, b"y" * 50)
    os.close(write_end)
    try:
        assert _read_fd(read_end, 0, 20) == b"y" * 20
        assert _read_fd(read_end, 0, 100) == b"y" * 30
    finally:
        os.close(read_end)


class _FullCheckOnly(WorkdirFiles):
    """The reader with its shortcuts turned off: every path resolved component by component.
    The shortcuts promise the same answers, so this is what they are compared with."""

    __slots__ = ()

    def _stat_direct(self, path: str) -> None:
        return None

    def _open_direct(self, path: str) -> None:
        return None

    def _missing_direct(self, path: str) -> bool:
        return False


def _layout(name: str, card: Path, outside: Path) -> str:
    """Builds one hostile (or odd) `taskcard/` folder; returns the path text to read."""
    status = card / "status"
    if name == "plain":
        card.mkdir()
        status.write_bytes(b"inside")
    elif name == "folder symlinked out":
        card.symlink_to(outside)
    elif name == "folder symlinked out, file missing there":
        card.symlink_to(outside / "empty")
    elif name == "folder symlinked out, file missing below a folder there":
        card.symlink_to(outside)
        return str(card / "empty" / "status")  # its nearest existing folder is out
    elif name == "folder dangling":
        card.symlink_to(outside / "gone" / "deeper")
    elif name == "folder symlink loop":
        card.symlink_to(card.name)
    elif name == "folder is a file":
        card.write_bytes(b"x")
    elif name == "folder missing":
        pass
    elif name == "file dangling out":
        card.mkdir()
        status.symlink_to(outside / "gone")
    elif name == "file is a fifo":
        card.mkdir()
        os.mkfifo(status)
    elif name == "file is a folder":
        card.mkdir()
        status.mkdir()
    elif name in ("dot-dot", "trailing slash", "double slash"):
        card.mkdir()
        status.write_bytes(b"inside")
        return {
            "dot-dot": f"{card}/../{card.name}/status",
            "trailing slash": f"{status}/",
            "double slash": f"{card}//status",
        }[name]
    elif name == "odd bytes in the name":
        card.mkdir()
        status = card / os.fsdecode(b"st\xffatus")
        status.write_bytes(b"inside")
    else:
        raise AssertionError(name)
    return str(status)


@pytest.mark.parametrize(
    "name",
    [
        "plain",
        "folder symlinked out",
        "folder symlinked out, file missing there",
        "folder symlinked out, file missing below a folder there",
        "folder dangling",
        "folder symlink loop",
        "folder is a file",
        "folder missing",
        "file dangling out",
        "file is a fifo",
        "file is a folder",
        "dot-dot",
        "trailing slash",
        "double slash",
        "odd bytes in the name",
    ],
)
@pytest.mark.parametrize("workdir_name", ["agent", os.fsdecode(b"ag\xffent")])
def test_the_shortcuts_answer_what_the_full_check_answers(
    tmp_path: Path, name: str, workdir_name: str
) -> None:
    outside = tmp_path / "outside"
    (outside / "empty").mkdir(parents=True)
    (outside / "status").write_bytes(b"SECRET")
    workdir = tmp_path / workdir_name
    workdir.mkdir()
    path = _layout(name, workdir / "taskcard", outside)
    fast, full = WorkdirFiles("a", workdir), _FullCheckOnly("a", workdir)
    for files in (fast, full):
        files.stat(workdir / "nothing")  # the workdir resolved and kept, as in service
    fast_stat, full_stat = fast.stat(path), full.stat(path)
    assert (fast_stat is None) == (full_stat is None)
    if fast_stat is not None and full_stat is not None:
        assert (fast_stat.st_dev, fast_stat.st_ino) == (full_stat.st_dev, full_stat.st_ino)
    fast_bytes, full_bytes = fast.read(path, limit=64), full.read(path, limit=64)
    assert fast_bytes == full_bytes
    assert fast_bytes in (None, b"inside")
    assert fast.problems == full.problems


def test_a_workdir_deleted_and_recreated_or_swapped_is_judged_as_it_is_now(
    tmp_path: Path, workdir: Path
) -> None:
    """The kept resolved workdir after the folder went away: a new folder at the same place
    is read, a symlink put there instead takes the full check (as the full check alone)."""
    status = workdir / "taskcard" / "status"
    status.write_bytes(b"old")
    fast, full = WorkdirFiles("a", workdir), _FullCheckOnly("a", workdir)
    assert fast.read(status, limit=8) == full.read(status, limit=8) == b"old"
    moved = tmp_path / "moved"
    workdir.rename(moved)
    (workdir / "taskcard").mkdir(parents=True)
    status.write_bytes(b"new")
    assert fast.read(status, limit=8) == full.read(status, limit=8) == b"new"
    assert fast.stat(status) is not None and full.stat(status) is not None
    status.unlink()
    (workdir / "taskcard").rmdir()
    workdir.rmdir()
    workdir.symlink_to(moved)  # the old folder, now behind a symlink
    for files in (fast, full):
        assert files.stat(status) is not None
        assert files.read(status, limit=8) == b"old"
        assert files.stat(workdir / "taskcard" / "missing") is None
    assert fast.problems == full.problems == {}


def test_a_missing_file_is_looked_at_once_per_read(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`read` tries the direct open and, when it cannot answer, goes on to the checked one
    without trying the direct open again (a missing file is the usual case for reports,
    acknowledgements and the ledger, read on every change)."""
    files = WorkdirFiles("a", workdir)
    missing = str(workdir / "taskcard" / "reports.jsonl")
    files.stat(workdir / "taskcard" / "warm-up")  # the workdir's resolution is kept
    looked: list[str] = []
    real_lstat = os.lstat

    def counting(path: str, *args: object, **kwargs: object) -> os.stat_result:
        looked.append(os.fspath(path))
        return real_lstat(path)

    monkeypatch.setattr(os, "lstat", counting)
    assert files.read(missing, limit=64) is None
    assert looked.count(missing) == 1
    assert files.problems == {}


def test_a_signed_read_gives_the_status_of_the_very_file_it_read(
    tmp_path: Path, workdir: Path
) -> None:
    """`read_signed` answers what `read` answers, with the file's status from the descriptor
    read: on the plain path, on a symlink inside (the full check) and after a replacement."""
    body = workdir / "taskcard" / "taskcard.md"
    body.write_bytes(b"one")
    files = WorkdirFiles("a", workdir)

    def signature(info: os.stat_result) -> tuple[int, int, int]:
        return (info.st_ino, info.st_size, info.st_mtime_ns)

    signed = files.read_signed(body, limit=64)
    assert signed is not None and signed[0] == b"one"
    assert signature(signed[1]) == signature(os.stat(body))
    replacement = workdir / "taskcard" / "next"
    replacement.write_bytes(b"two!")
    replacement.replace(body)
    signed = files.read_signed(body, limit=64)
    assert signed is not None and signed[0] == b"two!"
    assert signature(signed[1]) == signature(os.stat(body))
    (workdir / "inside").symlink_to(workdir / "taskcard")
    signed = files.read_signed(workdir / "inside" / "taskcard.md", limit=2)
    assert signed is not None and signed[0] == b"tw"
    assert signature(signed[1]) == signature(os.stat(body))
    assert files.read_signed(workdir / "taskcard" / "missing", limit=64) is None
    (tmp_path / "secret").write_bytes(b"SECRET")
    (workdir / "out").symlink_to(tmp_path / "secret")
    assert files.read_signed(workdir / "out", limit=64) is None
    assert "outside" in files.problems["out"]


def test_a_file_refused_for_what_it_holds_is_named_once_on_either_path(
    tmp_path: Path, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file judged by its bytes (`read`'s `judge`: a status file holding "active\\n") is
    named once while it stays wrong, and cleared once right. Read through a symbolic link (the
    long way), the open cleared the problem before the bytes were judged: "readable again"
    and the refusal were logged at every read of it."""
    inside = workdir / "drafts"
    inside.mkdir()
    (workdir / "taskcard").mkdir(exist_ok=True)
    link = workdir / "taskcard" / "status"
    link.symlink_to(inside / "status")
    plain = workdir / "taskcard" / "plain"

    def judge(raw: bytes) -> str | None:
        return None if raw == b"active" else "holds something else"

    files = WorkdirFiles("a", workdir)
    with caplog.at_level(logging.INFO, logger="taskcard.bridge.follow.safe_read"):
        for path, target in ((link, inside / "status"), (plain, plain)):
            for text in (b"active\n", b" active", b"active\n"):
                target.write_bytes(text)
                assert files.read(path, limit=64, judge=judge) == text
            assert files.problems == {f"taskcard/{path.name}": "holds something else"}
            target.write_bytes(b"active")
            assert files.read(path, limit=64, judge=judge) == b"active"
            assert files.problems == {}
    said = [record.getMessage() for record in caplog.records]
    for name in ("status", "plain"):
        assert sum(f"taskcard/{name} holds" in line for line in said) == 1, said
        assert sum(f"taskcard/{name} is readable again" in line for line in said) == 1, said
