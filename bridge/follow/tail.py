"""Following an append-only JSONL file by (inode, byte offset), across rotation and truncation.

Used for `.notification/system.jsonl` and `logs/events.jsonl` (see docs/architecture.md, "File
contracts"). Only complete lines are returned, every read is bounded, and every open goes
through `WorkdirFiles`, so a hostile file (a FIFO, a link out of the workdir) is refused, never
followed. Bytes only: what a line means is `bridge.track`'s business.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from typing import Final

from taskcard.bridge.follow.safe_read import StrPath, WorkdirFiles

TAIL_BYTES: Final = 256 * 1024
MAX_READ_BYTES: Final = 8 * 1024 * 1024

# (inode, size, mtime, ctime in ns). The ctime, which no writer can set back, tells an
# in-place rewrite of the same size whose mtime was put back (`cp -p`, `rsync -t --inplace`,
# `touch -r`): with the first three alone such a change was never seen.
FileSignature = tuple[int, int, int, int]


def signature(path: StrPath) -> FileSignature | None:
    """(inode, size, mtime, ctime in ns) of `path`, None when there is nothing there.

    One `lstat`, which is the answer for a regular file and for a missing one (most files
    looked at are one or the other, rescans included). A symlink is followed with a second
    look. One whose target is missing, or that cannot be followed at all (a loop), is
    something, not nothing: it keeps the link's own signature, so the caller looks at it
    through the safe reader, which refuses it and lists it in `taskcard status` (a link out
    of the workdir is a problem before its target exists).
    """
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            with contextlib.suppress(OSError):  # dangling, a loop: the link's own
                st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class Position:
    """Where the next read of a followed file starts."""

    inode: int
    offset: int


class LineFollower:
    """Follows one append-only JSONL file (and its `.1` rotation) by inode and byte offset.

    Only complete lines are returned: a line without its newline is still being written and
    is picked up by a later read. A new inode means the file was replaced or rotated: the rest
    of the old file is read from `<name>.1` when it is there, then the new file from its start.
    A file shorter than the offset was truncated and is read from its start.
    """

    # One per followed file, four per agent: slots, the path kept as text (a `Path` keeps a
    # list of its parts besides), and the rotation's path made when needed.
    __slots__ = ("_signed", "files", "path", "position", "signature", "skipped")

    def __init__(self, path: StrPath, files: WorkdirFiles) -> None:
        self.path = os.fspath(path)
        self.files = files
        self.position: Position | None = None
        self.signature: FileSignature | None = None
        self._signed = False
        # Bytes reads passed over unread since `take_skipped`: more than `MAX_READ_BYTES`
        # appended between two reads (a line that long, or a flood), of which only the last
        # `MAX_READ_BYTES` were read. A reader that must say what it lost takes them.
        self.skipped = 0

    @property
    def rotated(self) -> str:
        """`<name>.1`, where the rest of a rotated file is."""
        return self.path + ".1"

    def forget(self) -> None:
        """The next `unchanged` is False: the file is looked at again."""
        self.signature, self._signed = None, False

    def unchanged(self) -> bool:
        """Whether the file looks as at the last call (one `stat`); records the new look."""
        current = signature(self.path)
        if self._signed and current == self.signature:
            return True
        self.signature, self._signed = current, True
        return False

    def tail(self, *, end: int | None = None, limit: int = TAIL_BYTES) -> tuple[list[bytes], int]:
        """Complete lines in the last `limit` bytes before `end`, and the offset after them."""
        handle = self.files.open(self.path)
        if handle is None:
            return [], 0
        try:
            with handle:
                size = os.fstat(handle.fileno()).st_size if end is None else end
                start = max(0, size - limit)
                handle.seek(start)
                chunk = handle.read(size - start)
        except OSError:
            return [], 0
        last_newline = chunk.rfind(b"\n")
        if last_newline < 0:
            return [], start
        complete = chunk[: last_newline + 1]
        if start > 0:
            # The first line may be cut by the window; it is not trustworthy.
            first_newline = complete.find(b"\n")
            complete = complete[first_newline + 1 :]
        return complete.splitlines(), start + last_newline + 1

    def start_at_end(self, *, seen_missing: bool = False) -> list[bytes]:
        """Position at the end of the last complete line; return the tail before it.

        `seen_missing`: the caller's `unchanged` has just found no file (no signature), so
        the checked look is skipped (three checks per agent on a cold start, most of them of
        files that do not exist yet). Safe: the checked look refuses more than a plain
        `stat`, never less, so it would find nothing either; a file created in between is
        taken as created just after, which is what a missing file's first sight records.
        """
        if seen_missing:
            self.position = None
            return []
        st = self.files.stat(self.path)
        if st is None:
            self.position = None
            return []
        inode = st.st_ino
        lines, end = self.tail()
        self.position = Position(inode, end)
        return lines

    def take_skipped(self) -> int:
        """The bytes passed over unread since the last call (`skipped`), counted once: kept
        until taken, a refresh that read nothing (the file unchanged) said them again."""
        skipped, self.skipped = self.skipped, 0
        return skipped

    def read_new(self) -> list[bytes]:
        """Complete lines appended since the last read (all of a file seen for the first time)."""
        st = self.files.stat(self.path)
        lines: list[bytes] = []
        position = self.position
        if position is not None and (st is None or st.st_ino != position.inode):
            rotated_size = self._rotated_size(position.inode)
            if rotated_size is not None:
                lines += self._read_range(self.rotated, position, rotated_size)
                if st is None:
                    return lines
            elif st is None:
                return lines
            position = None
        if st is None:
            return lines
        if position is None or st.st_size < position.offset:
            position = Position(st.st_ino, 0)
        lines += self._read_range(self.path, position, st.st_size)
        self.position = position
        return lines

    def _rotated_size(self, inode: int) -> int | None:
        st = self.files.stat(self.rotated)
        if st is None:
            return None
        return st.st_size if st.st_ino == inode else None

    def _read_range(self, path: StrPath, position: Position, size: int) -> list[bytes]:
        """Lines between `position.offset` and `size`; advances `position` in place."""
        if size <= position.offset:
            return []
        start = position.offset
        if size - start > MAX_READ_BYTES:
            start = size - MAX_READ_BYTES
            self.skipped += start - position.offset
        handle = self.files.open(path)
        if handle is None:
            return []
        try:
            with handle:
                handle.seek(start)
                chunk = handle.read(size - start)
        except OSError:
            return []
        last_newline = chunk.rfind(b"\n")
        if last_newline < 0:
            return []
        complete = chunk[: last_newline + 1]
        if start > position.offset:
            complete = complete[complete.find(b"\n") + 1 :]
        position.offset = start + last_newline + 1
        self.position = position
        return complete.splitlines()
