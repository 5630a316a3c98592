"""What the host itself last wrote to a contract file, so a tick need not read it back.

Every tick asks "is the new body different from the file?" and "is the status already
`active`?". Reading both files back cost two opens, two `fstat`s and two reads per tick.
The host wrote those bytes itself, so it keeps them, keyed by the stat of the written file
(device, inode, size, modification time, all unchanged by the rename that publishes it):
while one `stat` of the path still shows that key, the file still holds those bytes.

Anything else that touches the file changes the key: a replacement brings another inode, an
in-place write a new modification time (and usually size); a deleted file has no stat. Then
the file is read back, as before. The one change the key cannot see is an in-place rewrite
to the same size within the file system's timestamp granularity of our own write (a few
milliseconds at most); the body is the host's own file while a watch runs, and the next
different body replaces it anyway.
"""

from __future__ import annotations

import os
from pathlib import Path

from taskcard.producers.task_card.contract import atomic_write, read_bytes

_Key = tuple[int, int, int, int]


def _key(info: os.stat_result) -> _Key:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class WrittenFiles:
    """The bytes last written to each path, and the stat key proving they are still there."""

    def __init__(self) -> None:
        self._known: dict[Path, tuple[_Key, bytes]] = {}

    def holds(self, path: Path, data: bytes) -> bool:
        """Whether the file at `path` holds exactly `data` (read back only when unknown)."""
        known = self._known.get(path)
        if known is not None:
            try:
                current = _key(os.stat(path))
            except OSError:
                current = None
            if current == known[0]:
                return known[1] == data
            del self._known[path]
        return read_bytes(path, limit=len(data) + 1) == data

    def write(self, path: Path, data: bytes, *, durable: bool = True) -> None:
        """`atomic_write`, remembering what was written."""
        self._known.pop(path, None)
        info = atomic_write(path, data, durable=durable)
        self._known[path] = (_key(info), data)

    def forget(self, path: Path) -> None:
        self._known.pop(path, None)
